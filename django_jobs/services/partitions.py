from __future__ import annotations

from datetime import datetime

from .. import engine
from .base import Service


class PartitionSweeper(Service):
    """Unblocks the next job of any partition whose unfinished jobs are all marked blocked (a
    race between enqueues and a finish, a cancel, a delete or a crash can leave one so). Leader
    only; runs every ``PROMOTE_INTERVAL``. The claim checks a partition's order itself, so this
    only decides how soon a partition's next job is seen, never whether order holds.

    Counts: ``unblocked`` (partitions whose next job became claimable).
    """

    name = "partition_sweeper"
    leader_only = True

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        batch = self.settings.SERVICE_BATCH_SIZE
        total = 0
        while True:
            n = engine.unblock_partitions(using=self.using, limit=batch)
            total += n
            if n < batch:
                return {"unblocked": total}

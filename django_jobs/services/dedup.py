from __future__ import annotations

from datetime import datetime

from .. import engine
from .base import Service


class DedupSweeper(Service):
    """Turns the stashed enqueue of a ``keep_last_if_active`` dedup key into its next job once the
    key's running job finished, and deletes expired dedup keys. Leader only; runs every
    ``PROMOTE_INTERVAL``.

    Counts: ``promoted`` (stashes made jobs; the worker wakes for them), ``expired`` (keys deleted).
    """

    name = "dedup_sweeper"
    leader_only = True

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        batch = self.settings.SERVICE_BATCH_SIZE
        counts = {"promoted": 0, "expired": 0}
        while True:
            n = engine.promote_dedup_stashes(using=self.using, limit=batch, backend=self.backend, now=now)
            counts["promoted"] += n
            if n < batch:
                break
        while True:
            n = engine.delete_expired_dedup_keys(using=self.using, limit=batch, backend=self.backend, now=now)
            counts["expired"] += n
            if n < batch:
                return counts

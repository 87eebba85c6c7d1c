from __future__ import annotations

from datetime import datetime, timedelta

from .. import engine
from .base import Service


class Rescuer(Service):
    """Returns active jobs whose lease expired to waiting (counting a stall), or fails them
    after more than MAX_STALLED stalls. Leader only."""

    name = "rescuer"
    leader_only = True

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        requeued = failed = 0
        while True:
            r, f = engine.rescue_stalled_jobs(
                using=self.using,
                max_stalled=self.settings.MAX_STALLED,
                limit=self.settings.SERVICE_BATCH_SIZE,
                backend=self.backend,
                now=now,
            )
            requeued += r
            failed += f
            if r + f < self.settings.SERVICE_BATCH_SIZE:
                return {"requeued": requeued, "failed": failed}


class Reaper(Service):
    """Removes ``Worker`` rows whose heartbeat stopped (three lease periods). Leader only."""

    name = "reaper"
    leader_only = True

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        removed = engine.remove_dead_workers(
            using=self.using,
            older_than=timedelta(seconds=3 * self.settings.LEASE_SECONDS),
            backend=self.backend,
            now=now,
        )
        return {"removed_workers": removed}

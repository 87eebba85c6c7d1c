from __future__ import annotations

from datetime import datetime, timedelta

from .. import engine
from ..signals import job_rescued, job_stalled, send_job_signal
from ..states import JobState
from .base import Service


class Rescuer(Service):
    """Returns active jobs whose lease expired to waiting (counting a stall), or fails them
    after more than MAX_STALLED stalls. Leader only."""

    name = "rescuer"
    leader_only = True

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        """Sends ``job_stalled`` for each job found and ``job_rescued`` for each put back."""
        requeued = failed = 0
        while True:
            rows = engine.rescue_stalled_jobs(
                using=self.using,
                max_stalled=self.settings.MAX_STALLED,
                limit=self.settings.SERVICE_BATCH_SIZE,
                backend=self.backend,
                now=now,
            )
            for row in rows:
                payload = {"job_id": str(row.id), "queue": row.queue}
                send_job_signal(job_stalled, row.backend, **payload, state=row.state)
                if row.state == JobState.WAITING:
                    requeued += 1
                    send_job_signal(job_rescued, row.backend, **payload)
                else:
                    failed += 1
            if len(rows) < self.settings.SERVICE_BATCH_SIZE:
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

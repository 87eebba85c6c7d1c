from __future__ import annotations

from datetime import datetime, timedelta

from .. import engine
from ..signals import job_cancelled, job_rescued, job_stalled, send_job_signal
from ..states import JobState
from .base import Service


class Rescuer(Service):
    """Returns active jobs whose lease expired to waiting (counting a stall), or fails them
    after more than MAX_STALLED stalls. Leader only."""

    name = "rescuer"
    leader_only = True

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        """Sends ``job_stalled`` for each job found, then ``job_rescued`` for each put back to
        waiting or ``job_cancelled`` for each that had been cancelled while it ran."""
        counts = {"requeued": 0, "failed": 0, "cancelled": 0}
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
                    counts["requeued"] += 1
                    send_job_signal(job_rescued, row.backend, **payload)
                elif row.state == JobState.CANCELLED:
                    counts["cancelled"] += 1
                    send_job_signal(job_cancelled, row.backend, **payload, was_running=True)
                else:
                    counts["failed"] += 1
            if len(rows) < self.settings.SERVICE_BATCH_SIZE:
                return counts


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

from __future__ import annotations

from datetime import datetime

from ..schedules import fire_due
from .base import Service


class Scheduler(Service):
    """Fires due schedule ticks. Runs on every worker, not only the leader: each tick is fired
    once anyway (compare-and-set plus a unique key), and a stopped leader must not stop the
    schedules."""

    name = "scheduler"
    leader_only = False

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        return fire_due(backend=self.backend, now=now, grace=self.settings.MISFIRE_GRACE)

from __future__ import annotations

from datetime import datetime

from .. import engine
from .base import Service


class Promoter(Service):
    """Moves due delayed jobs to waiting, in batches. Safe to run in every worker at once."""

    name = "promoter"
    leader_only = False

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        total = 0
        while True:
            n = engine.promote_due_jobs(
                using=self.using, limit=self.settings.SERVICE_BATCH_SIZE, backend=self.backend, now=now
            )
            total += n
            if n < self.settings.SERVICE_BATCH_SIZE:
                return {"promoted": total}

from __future__ import annotations

import logging
import random
import time
from datetime import datetime
from typing import Any, ClassVar

from ..conf import JobsSettings
from ..signals import service_ran

logger = logging.getLogger("django_jobs.services")


class Service:
    """A periodic maintenance job run inside workers.

    Subclasses set ``name``, ``leader_only`` and implement ``run_once(now=None) -> counts``.
    The worker calls :meth:`tick` often; the service runs when its jittered interval passed.
    Tests call ``run_once()`` directly.
    """

    name: ClassVar[str] = "service"
    leader_only: ClassVar[bool] = False

    def __init__(
        self, *, using: str, settings: JobsSettings, interval: float, worker_id: str = "", backend: str | None = None
    ):
        """``backend``: act only on jobs and workers of that TASKS alias (``None``: all)."""
        if interval <= 0:
            raise ValueError(f"{type(self).__name__}: interval must be > 0 seconds, got {interval!r}.")
        self.using = using
        self.settings = settings
        self.interval = interval
        self.worker_id = worker_id
        self.backend = backend
        self._next = 0.0

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        raise NotImplementedError

    def due(self, monotonic: float) -> bool:
        return monotonic >= self._next

    def tick(self, *, is_leader: bool) -> dict[str, Any] | None:
        """Run if due (and if leader, for leader-only services); return the counts or None."""
        now = time.monotonic()
        if not self.due(now) or (self.leader_only and not is_leader):
            return None
        # Jitter spreads the services of many workers so they do not run in lockstep.
        self._next = now + self.interval * random.uniform(0.8, 1.2)
        counts = self.run_once()
        if any(counts.values()):
            # An internal step: the job lines and the service_ran signal say what it meant.
            logger.debug("%s: %s", self.name, counts)
        for receiver, response in service_ran.send_robust(
            sender=type(self), service=self.name, counts=counts, worker_id=self.worker_id
        ):
            if isinstance(response, Exception):
                logger.error("service_ran receiver %r raised", receiver, exc_info=response)
        return counts

"""What a worker did: the counters :meth:`Worker.run() <django_jobs.worker.runner.Worker.run>`
returns and ``worker_stopped`` sends. The worker's threads count into one ``WorkerStats``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: ``Worker(on_outcome=...)``: ``(queue, kind, runtime_ms)`` of each stored outcome, ``kind`` one
#: of :data:`OUTCOME_KINDS`.
OutcomeObserver = Callable[[str, str, "int | None"], None]
#: What an attempt came to, as :class:`WorkerStats` counts it.
OUTCOME_KINDS = ("completed", "failed", "retried", "snoozed", "cancelled")


@dataclass
class WorkerStats:
    completed: int = 0
    failed: int = 0
    retried: int = 0
    snoozed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    started_at: float = field(default_factory=time.monotonic)
    stopped_at: float | None = None
    released: int = 0
    #: What the completer measured of the window in which finished jobs were still active
    #: (:class:`~django_jobs.worker.completer.OutcomeWindow`); runworker prints it at -v 2.
    outcome_window: str = ""

    def count(self, kind: str) -> None:
        """One more outcome of ``kind`` (one of :data:`OUTCOME_KINDS`)."""
        setattr(self, kind, getattr(self, kind) + 1)

    @property
    def processed(self) -> int:
        return self.completed + self.failed + self.retried + self.snoozed + self.cancelled

    @property
    def elapsed(self) -> float:
        return (self.stopped_at or time.monotonic()) - self.started_at

    @property
    def rate(self) -> float:
        return self.processed / self.elapsed if self.elapsed > 0 else 0.0

    def summary(self) -> str:
        return (
            f"{self.processed} jobs processed in {self.elapsed:.1f}s ({self.rate:.1f}/s): "
            f"{self.completed} completed, {self.failed} failed, {self.retried} retried"
            + "".join(
                f", {getattr(self, name)} {name.replace('_', ' ')}"
                for name in ("snoozed", "cancelled", "timed_out", "released")
                if getattr(self, name)
            )
        )

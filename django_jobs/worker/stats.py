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
        """Attempts whose outcome was written (a retried job counts once per attempt)."""
        return self.completed + self.failed + self.retried + self.snoozed + self.cancelled

    @property
    def finished(self) -> int:
        """Jobs that ended: completed, failed for good or cancelled."""
        return self.completed + self.failed + self.cancelled

    @property
    def elapsed(self) -> float:
        return (self.stopped_at or time.monotonic()) - self.started_at

    @property
    def rate(self) -> float:
        """Attempts per second."""
        return self.processed / self.elapsed if self.elapsed > 0 else 0.0

    def summary(self) -> str:
        """``5 jobs finished in 3.0s: 4 completed, 1 failed; 7 attempts (2.3/s), 2 retried``:
        jobs that ended, then every attempt (retries and snoozes run a job again). Cancelled,
        snoozed, timed out and released are added when not zero."""
        jobs = f"{self.completed} completed, {self.failed} failed" + (
            f", {self.cancelled} cancelled" if self.cancelled else ""
        )
        attempts = f"{self.retried} retried" + "".join(
            f", {getattr(self, name)} {name.replace('_', ' ')}"
            for name in ("snoozed", "timed_out")
            if getattr(self, name)
        )
        released = f"; {plural(self.released, 'job')} released" if self.released else ""
        return (
            f"{plural(self.finished, 'job')} finished in {self.elapsed:.1f}s: {jobs}; "
            f"{plural(self.processed, 'attempt')} ({self.rate:.1f}/s), {attempts}{released}"
        )


def plural(count: int, noun: str) -> str:
    """``1 job``, ``2 jobs``, ``0 jobs``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"

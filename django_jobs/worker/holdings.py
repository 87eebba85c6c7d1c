"""What a worker holds from its claims, each ledger behind its own lock.

* :class:`Leases`: the claim tokens whose jobs are not yet written or released. The producer
  adds a claim's, the completer's callback and the hand-back take them off, the maintainer
  renews only these.
* :class:`Attempts`: the attempts of the jobs this worker claimed, from the claim to the end of
  the attempt. The watchdog reads their deadlines; cancels reach them here (even before they
  start).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .executor import Attempt


class Leases:
    """The leases this worker holds: claim token -> its jobs not yet written or released. Only
    these are renewed."""

    def __init__(self) -> None:
        self._held: Counter[uuid.UUID] = Counter()
        self._held_lock = threading.Lock()

    def add(self, tokens: Iterable[uuid.UUID]) -> None:
        """Count the jobs of new claims: ``tokens`` holds each job's lease token."""
        with self._held_lock:
            self._held.update(tokens)

    def drop(self, tokens: list[uuid.UUID]) -> None:
        """Uncount jobs whose outcome is written or that were released: ``tokens`` holds each
        job's lease token; a claim with no job left is no longer renewed."""
        # Counted first (in C): a batch's outcomes share the few tokens of their claims, so the
        # counter is touched once per claim, not once per job.
        counts = Counter(tokens)
        with self._held_lock:
            for token, n in counts.items():
                left = self._held[token] - n
                if left <= 0:
                    self._held.pop(token, None)
                else:
                    self._held[token] = left

    def tokens(self) -> list[uuid.UUID]:
        with self._held_lock:
            return list(self._held)


class Attempts:
    """Attempts by job id, from the claim to the end of the attempt."""

    def __init__(self) -> None:
        self._attempts: dict[Any, Attempt] = {}
        self._attempts_lock = threading.Lock()

    def add(self, attempts: list[Attempt]) -> None:
        with self._attempts_lock:
            for attempt in attempts:
                self._attempts[attempt.job.id] = attempt

    def discard(self, *attempts: Attempt) -> None:
        """Forget these attempts (each unless its job has a newer one here)."""
        with self._attempts_lock:
            for a in attempts:
                if self._attempts.get(a.job.id) is a:
                    del self._attempts[a.job.id]

    def get(self, job_id: Any) -> Attempt | None:
        with self._attempts_lock:
            return self._attempts.get(job_id)

    def due(self, now: float) -> list[Attempt]:
        """The attempts of sync tasks run by threads that are past their deadline. (An async
        task's deadline is enforced by the thread waiting for it or by the event loop; a child
        process's thread kills the child.)"""
        with self._attempts_lock:
            return [
                a
                for a in self._attempts.values()
                if a.deadline is not None and now >= a.deadline and not a.in_child and a.future is None
            ]

    def __bool__(self) -> bool:
        with self._attempts_lock:
            return bool(self._attempts)

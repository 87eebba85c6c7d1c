"""``JobContext``: what a task with ``takes_context=True`` receives."""

from __future__ import annotations

from dataclasses import dataclass

from django.tasks import TaskContext


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):
    """Django's ``TaskContext`` plus the job's coordinates.

    ``attempt`` (from Django) is the number of this attempt, starting at 1.
    """

    job_id: str
    queue: str
    max_attempts: int

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

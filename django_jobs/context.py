"""``JobContext``: what a task with ``takes_context=True`` receives."""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, NoReturn

from django.tasks import TaskContext

from . import engine
from .conf import get_settings
from .exceptions import Fail, InvalidTaskArguments, Retry, Snooze
from .spec.payload import check_json


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):
    """Django's ``TaskContext`` plus the job's coordinates and the handler actions.

    ``attempt`` (from Django) is the number of this attempt, starting at 1.
    """

    job_id: str
    queue: str
    max_attempts: int
    #: The id of this job's parent when it runs as a child in a flow (flows fill it); else None.
    parent_id: str | None = None
    #: The job's partition (``.using(partition=...)``), or None.
    partition: str | None = None
    #: The lease this attempt runs under; writes made through the context are guarded on it.
    lease_token: uuid.UUID | None = field(default=None, repr=False)
    database: str = field(default="default", repr=False)
    # Threads of one attempt append their log lines one at a time, in the order they call log().
    _log_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # [checked at (monotonic), answer]: is_cancelled() asks the database at most twice a second.
    _cancel_seen: list = field(default_factory=lambda: [-1.0, False], repr=False, compare=False)
    #: The executor's record of this attempt (``worker.executor.Attempt``: deadline, async future).
    #: When a worker watches it, the worker sets its cancel flag on a NOTIFY or poll, so
    #: is_cancelled() needs no query.
    attempt_state: Any = field(default=None, repr=False, compare=False)

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def children_results(self) -> dict[str, Any]:
        """The return values of this job's finished children, by child id (a flow's parent)."""
        return self._children()["results"]

    def children_failures(self) -> dict[str, Any]:
        """The errors of children that failed without failing this job (failure_policy
        ``ignore`` or ``continue``; a ``remove``d dependency is not reported), by child id."""
        return self._children()["failures"]

    def _children(self) -> dict[str, dict[str, Any]]:
        return engine.children_values(using=self.database, parent_id=uuid.UUID(self.job_id))

    def fail(self, error_or_message: BaseException | str | None = None) -> NoReturn:
        """Fail the job for good now, whatever attempts remain."""
        raise Fail(error_or_message)

    def retry(self, error: BaseException | str | None = None, delay: float | None = None) -> NoReturn:
        """Give this attempt up; run again after ``delay`` seconds or the task's backoff. Counts an
        attempt (with none left, the job fails)."""
        raise Retry(error=error, delay=delay)

    def snooze(self, seconds: float) -> NoReturn:
        """Run again after ``seconds`` without counting this attempt."""
        raise Snooze(seconds)

    def is_cancelled(self) -> bool:
        """True once someone called ``django_jobs.cancel()`` on this running job (seen within
        a second). The attempt should then stop; it is recorded as ``cancelled``."""
        if self.attempt_state is not None and self.attempt_state.watched:
            return self.attempt_state.cancelled.is_set()
        checked, answer = self._cancel_seen
        if answer or self.lease_token is None:
            return answer
        now = time.monotonic()
        if now - checked >= 0.5:
            answer = engine.is_cancel_requested(using=self.database, job_id=uuid.UUID(self.job_id))
            self._cancel_seen[:] = [now, answer]
        return answer

    def log(self, message: Any) -> bool:
        """Append a line to the job's log (``JobLog``), in order. Lines beyond ``LOG_MAX_LINES``
        are dropped; returns False when the line was not stored."""
        if self.lease_token is None:
            return False
        conf = get_settings(self.task_result.backend)
        with self._log_lock:
            return engine.append_job_log(
                using=self.database,
                job_id=uuid.UUID(self.job_id),
                lease_token=self.lease_token,
                line=str(message)[: conf.LOG_MAX_LINE_CHARS],
                max_lines=conf.LOG_MAX_LINES,
            )

    def set_progress(self, value: Any) -> bool:
        """Store progress on the job now: a number 0-100 or a JSON object. Returns False when the
        job is no longer this attempt's (its outcome was recorded, or it was rescued meanwhile)."""
        if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
            raise InvalidTaskArguments(f"progress must be a number 0-100 or a dict; got {type(value).__name__}.")
        if isinstance(value, (int, float)) and not (math.isfinite(value) and 0 <= value <= 100):
            raise InvalidTaskArguments(f"progress must be between 0 and 100; got {value!r}.")
        check_json(value, "progress")
        if self.lease_token is None:  # not run by a worker (a bare TaskContext-like use)
            return False
        return engine.set_progress(
            using=self.database, job_id=uuid.UUID(self.job_id), lease_token=self.lease_token, value=value
        )


#: JobContext's fields in the order :func:`running_context` sets them.
_CONTEXT_FIELDS = (
    "task_result", "job_id", "queue", "max_attempts", "parent_id", "partition", "lease_token", "database",
    "_log_lock", "_cancel_seen", "attempt_state",
)  # fmt: skip


def slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Any, ...] | None:
    """The slot setter of each field of the slotted dataclass ``cls`` in ``names``, to build
    instances without its ``__init__``; None when its fields are not exactly ``names`` (a
    Django that added one): the caller then calls the dataclass."""
    if {f.name for f in dataclass_fields(cls)} != set(names):
        return None
    return tuple(getattr(cls, name).__set__ for name in names)


_SETTERS = slot_setters(JobContext, _CONTEXT_FIELDS)


def running_context(
    task_result: Any, job_id: str, queue: str, max_attempts: int, parent_id: str | None, partition: str | None,
    lease_token: uuid.UUID | None, database: str, attempt_state: Any,
) -> JobContext:  # fmt: skip
    """``JobContext(...)`` of an attempt the worker runs, built through its slots: the frozen
    dataclass's ``__init__`` sets each field with ``object.__setattr__``, which cost a no-op job
    more than a microsecond. Equal to what the dataclass builds (tested), which it falls back to
    for a JobContext with other fields."""
    if _SETTERS is None:
        return JobContext(
            task_result=task_result, job_id=job_id, queue=queue, max_attempts=max_attempts, parent_id=parent_id,
            partition=partition, lease_token=lease_token, database=database, attempt_state=attempt_state,
        )  # fmt: skip
    context = object.__new__(JobContext)
    for setter, value in zip(
        _SETTERS,
        (task_result, job_id, queue, max_attempts, parent_id, partition, lease_token, database, threading.Lock(),
         [-1.0, False], attempt_state),
        strict=True,
    ):  # fmt: skip
        setter(context, value)
    return context

"""The django-jobs task options (``@task(...)``, ``.using(...)``): their names, their validation,
and what a job of a task stores of them. Part of :mod:`django_jobs.spec` (no models): the backend
validates a task here, flows and schedules build a job's fields here.

The options are documented on :class:`django_jobs.backend.JobTask` and in
docs/reference/task-options.md.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from inspect import iscoroutinefunction
from typing import Any

from django.tasks import Task
from django.utils import timezone

from ..exceptions import (
    InvalidOptionType,
    InvalidRetention,
    InvalidTaskOptions,
    RunAfterOutOfRange,
)
from .backoff import backoff_path, validate_backoff
from .dedup import Dedup, check_key
from .retention import validate_policies
from .tracing import validate_trace_id

#: The options JobTask adds to Django's Task, settable in @task(...) and .using(...).
JOB_OPTIONS = (
    "max_attempts", "backoff", "timeout", "lifo", "dedup", "idempotency_key", "trace_id", "partition", "retention",
    "encrypt", "atomic",
)  # fmt: skip


def validate_option_types(task: Task) -> None:
    """Raise InvalidOptionType for a priority that is not a number or a run_after that is not a
    datetime (Django's own checks would fail on those with a bare TypeError or AttributeError)."""
    priority = task.priority
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise InvalidOptionType(
            f"priority must be an int from -100 to 100 (higher runs first); got {priority!r} "
            f"({_a(type(priority).__name__)}).{' Convert it with int(...).' if isinstance(priority, str) else ''}"
        )
    if isinstance(priority, float) and not (math.isfinite(priority) and priority.is_integer()):
        raise InvalidTaskOptions(f"priority must be a whole number between -100 and 100; got {priority!r}.")
    run_after = task.run_after
    if run_after is not None and not isinstance(run_after, datetime):
        hint = {
            "str": " Parse it first: datetime.fromisoformat(value), made aware if it has no offset.",
            "int": " For a delay, pass timedelta(seconds=...).",
            "float": " For a delay, pass timedelta(seconds=...).",
            "date": " Pass a datetime: datetime.combine(day, time(), tzinfo=...).",
        }.get(type(run_after).__name__, "")
        raise InvalidOptionType(
            f"run_after must be an aware datetime or a timedelta (a delay from now); got {run_after!r} "
            f"({_a(type(run_after).__name__)}).{hint}"
        )


def _a(name: str) -> str:
    """``name`` with its indefinite article: "a str", "an int"."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def max_run_after(setting: Any) -> timedelta | None:
    """The ``MAX_RUN_AFTER`` setting as a timedelta (None: no bound)."""
    if setting is None or isinstance(setting, timedelta):
        return setting
    return timedelta(seconds=setting)


def check_run_after_bound(run_after: datetime, bound: timedelta | None) -> None:
    """Raise RunAfterOutOfRange when ``run_after`` is more than ``bound`` ahead of now, or (with
    no bound) cannot be stored because it is past the year 9999 in UTC."""
    aware = timezone.is_aware(run_after)
    if bound is not None:
        now = datetime.now(UTC) if aware else timezone.now()  # naive only when USE_TZ is False
        if run_after - now > bound:
            raise run_after_too_far(f"run_after {run_after.isoformat()}", bound)
    elif aware:
        try:
            run_after.astimezone(UTC)
        except OverflowError:
            raise RunAfterOutOfRange(
                f"run_after {run_after.isoformat()} is past the year 9999 in UTC, the last a datetime can hold."
            ) from None


def run_after_too_far(what: str, bound: timedelta) -> RunAfterOutOfRange:
    if bound >= timedelta(days=365):
        allowed = f"{bound.days:,} days, about {bound.days / 365.25:.3g} years"
    elif bound >= timedelta(days=1):
        allowed = f"{bound.total_seconds() / 86400:g} days"
    else:
        allowed = f"{bound.total_seconds():g} seconds"
    return RunAfterOutOfRange(
        f"{what} is further ahead than MAX_RUN_AFTER allows ({allowed}); check it for a typo, or raise "
        "DJANGO_JOBS['MAX_RUN_AFTER'] (None lifts the bound)."
    )


def validate_job_options(task: Task) -> None:
    max_attempts = getattr(task, "max_attempts", None)
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
    ):
        raise InvalidTaskOptions(
            f"max_attempts must be an integer >= 1 (or None for the default); got {max_attempts!r}."
        )
    timeout = getattr(task, "timeout", None)
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout) or timeout <= 0
    ):
        raise InvalidTaskOptions(f"timeout must be a number of seconds > 0 (or None for no limit); got {timeout!r}.")
    backoff = getattr(task, "backoff", None)
    try:
        validate_backoff(backoff)
    except ValueError as exc:
        raise InvalidTaskOptions(str(exc)) from None
    if callable(backoff):
        backoff_path(backoff)
    lifo = getattr(task, "lifo", False)
    if not isinstance(lifo, bool):
        raise InvalidTaskOptions(f"lifo must be True or False; got {lifo!r}.")
    encrypt = getattr(task, "encrypt", False)
    if not isinstance(encrypt, bool):
        raise InvalidTaskOptions(
            f"encrypt must be True or False; got {encrypt!r}. Its keys are DJANGO_JOBS['ENCRYPTION_KEYS'] "
            "(docs/howto/encryption.md)."
        )
    atomic = getattr(task, "atomic", False)
    if atomic is not False:
        check_atomic(task, atomic)
    dedup = getattr(task, "dedup", None)
    if dedup is not None and not isinstance(dedup, Dedup):
        raise InvalidTaskOptions(
            f"dedup must be a django_jobs.Dedup, such as Dedup('user:42') or Dedup(key, ttl=60) (or None/False "
            f"for none); got {dedup!r}."
        )
    idempotency_key = getattr(task, "idempotency_key", None)
    if idempotency_key is not None:
        check_key(idempotency_key, "idempotency_key")
        if dedup is not None:
            raise InvalidTaskOptions(
                "A task cannot have both dedup and idempotency_key: an idempotency key names one job for as long "
                "as it exists, a dedup key only while its job is unfinished (or for its ttl). Pick one; "
                ".using(dedup=False) turns off a decorator's dedup."
            )
    trace_id = getattr(task, "trace_id", None)
    if trace_id is not None:
        validate_trace_id(trace_id)
    partition = getattr(task, "partition", None)
    if partition is not None and (
        not isinstance(partition, str) or not partition or len(partition) > 255 or "\x00" in partition
    ):
        raise InvalidTaskOptions(
            f"partition must be a string of 1-255 characters without NUL, such as 'customer-456' (or None for "
            f"no partition); got {partition!r}. Derive it from what must run in order, e.g. f'customer-{{id}}'."
        )

    retention = getattr(task, "retention", None)
    if retention is not None:
        try:
            validate_policies(retention, "retention")
        except InvalidRetention as exc:
            raise InvalidTaskOptions(str(exc)) from None


def check_atomic(task: Task, atomic: Any) -> None:
    """``atomic``: True or False, and True only for a plain ``def`` task."""
    if not isinstance(atomic, bool):
        raise InvalidTaskOptions(
            f"atomic must be True or False; got {atomic!r}. atomic=True runs the task and records its "
            "completion in one transaction on the jobs database (docs/howto/atomic-tasks.md)."
        )
    if atomic and iscoroutinefunction(task.func):
        raise InvalidTaskOptions(
            f"atomic=True needs a plain def task; {task.module_path} is an async def, and a transaction belongs "
            "to one thread while a coroutine's ORM calls run in others (sync_to_async), outside it. Make it a def "
            "task to run it atomically (docs/howto/atomic-tasks.md)."
        )


def check_using_retention(retention: Any) -> None:
    """``.using(retention=...)``: valid policies, ages only (a count limits a task's jobs)."""
    try:
        policies = validate_policies(retention, "retention")
    except InvalidRetention as exc:
        raise InvalidTaskOptions(str(exc)) from None
    if any(p.count is not None for p in policies.values()):
        raise InvalidTaskOptions(
            "A retention count limits how many of a task's (or queue's) finished jobs are kept, so it belongs on "
            "@task(retention=...) or in DJANGO_JOBS['RETENTION']; .using(retention=...) takes ages only."
        )


def retention_json(retention: dict[str, Any]) -> dict[str, Any]:
    """A task's validated retention as JSON for the job's options: ``{state: {"age", "count"}}``."""
    return {state: {"age": p.age, "count": p.count} for state, p in validate_policies(retention, "retention").items()}


def job_fields(task: Task, *, default_max_attempts: int) -> tuple[int, dict[str, Any]]:
    """``(max_attempts, options)`` stored on a job of ``task``; ``default_max_attempts``: the
    ``MAX_ATTEMPTS`` setting of the backend it is enqueued through."""
    max_attempts = getattr(task, "max_attempts", None) or default_max_attempts
    options: dict[str, Any] = {}
    backoff = getattr(task, "backoff", None)
    if callable(backoff):
        options["backoff_path"] = backoff_path(backoff)
    elif backoff is not None:
        options["backoff"] = list(backoff) if isinstance(backoff, tuple) else backoff
    timeout = getattr(task, "timeout", None)
    if timeout is not None:
        options["timeout"] = float(timeout)
    if task.run_after is not None:  # what get_result gives back as task.run_after
        options["run_after"] = task.run_after.isoformat()
    if getattr(task, "lifo", False):
        options["lifo"] = True
    if getattr(task, "encrypt", False):
        # The one flag that says the job's arguments, return value and tracebacks are stored
        # encrypted (spec.encryption); NewJob.for_task encrypts them.
        options["encrypt"] = True
    retention = getattr(task, "retention", None)
    if retention is not None:
        options["retention"] = retention_json(retention)
    if getattr(task, "atomic", False):
        # The worker runs the job and writes its completion in one transaction (worker.atomic).
        options["atomic"] = True
    return max_attempts, options


def stored_run_after(options: dict[str, Any] | None) -> datetime | None:
    """The ``run_after`` a job was enqueued with, kept in its options (None: not deferred)."""
    value = (options or {}).get("run_after")
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


__all__ = [
    "JOB_OPTIONS", "check_atomic", "check_run_after_bound", "check_using_retention", "job_fields", "max_run_after", "retention_json",
    "run_after_too_far", "stored_run_after", "validate_job_options", "validate_option_types",
]  # fmt: skip

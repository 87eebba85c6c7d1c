"""The options of :class:`~django_jobs.worker.runner.Worker`: their bounds and their checks.

A bad value raises :class:`InvalidWorkerOption` (``runworker`` reports it as a ``CommandError``)
when the worker is built, before it touches the database.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any

from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend
from django.utils.crypto import get_random_string

from ..backend import JobsBackend, validate_queue_name
from ..conf import JobsSettings
from ..exceptions import InvalidWorkerOption, JobsConfigurationError, JobsError
from ..queues import validate_queue_declarations
from ..schedules import InvalidSchedule, declaration_fields, declared_schedules

#: The default of Worker(prefetch=...) and runworker --prefetch, and its upper bound.
DEFAULT_PREFETCH = 8
MAX_PREFETCH = 100

ISOLATIONS = ("thread", "process")
#: Upper bounds of the worker's options (the runworker reference lists every bound). --sleep and
#: --grace are waits: a day is plenty, and much longer ones overflow thread waits' timeouts.
MAX_CONCURRENCY = 1000
MAX_WAIT_SECONDS = 86400
#: The length of a Worker row's id and of Job.worker_id.
MAX_WORKER_ID_LENGTH = 200


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{get_random_string(6)}"


def check_options(
    *,
    queues: list[str] | None,
    concurrency: int,
    backend: str,
    max_jobs: int | None,
    max_time: float | None,
    sleep: float | None,
    grace: float,
    worker_id: str | None,
    isolation: str,
    prefetch: int,
    on_outcome: Any = None,
) -> list[str] | None:
    """Check the options of ``Worker(...)`` as given; return the queues to take jobs from
    (``None``: all)."""
    try:
        backend_obj = task_backends[backend]
    except InvalidTaskBackend:
        raise InvalidWorkerOption(f"No task backend {backend!r} in TASKS.") from None
    if not isinstance(backend_obj, JobsBackend):
        raise InvalidWorkerOption(
            f"TASKS[{backend!r}] is {type(backend_obj).__name__}; runworker needs django_jobs.backend.JobsBackend."
        )
    if queues is not None and "*" in queues:
        queues = None
    for name in queues or ():
        try:
            validate_queue_name(name)
        except JobsError as exc:
            raise InvalidWorkerOption(str(exc)) from None
    if queues is not None and not queues:
        raise InvalidWorkerOption("queues must name at least one queue, or be None/'*' for all.")
    require_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
    require_int("prefetch", prefetch, 1, MAX_PREFETCH)
    if max_jobs is not None:
        require_int("max_jobs", max_jobs, 1, None)
    if max_time is not None:
        require_seconds("max_time", max_time, zero_ok=False, high=None)
    if sleep is not None:
        require_seconds("sleep", sleep, zero_ok=False, high=MAX_WAIT_SECONDS)
    require_seconds("grace", grace, zero_ok=True, high=MAX_WAIT_SECONDS)
    if worker_id is not None:
        require_worker_id(worker_id)
    if isolation not in ISOLATIONS:
        raise InvalidWorkerOption(f"isolation must be one of {', '.join(ISOLATIONS)}; got {isolation!r}.")
    if on_outcome is not None and not callable(on_outcome):
        raise InvalidWorkerOption(
            f"on_outcome must be a callable (queue, kind, runtime_ms) or None; got {on_outcome!r}."
        )
    return queues


def check_declarations(backend: str, settings: JobsSettings) -> None:
    """Check the SCHEDULES and QUEUES declared for ``backend``."""
    declared = declared_schedules(backend)
    if not isinstance(declared, dict):
        raise InvalidWorkerOption("SCHEDULES must be a dict of {name: declaration}.")
    for name, declaration in declared.items():
        try:
            declaration_fields(name, declaration)
        except InvalidSchedule as exc:
            raise InvalidWorkerOption(f"SCHEDULES: {exc}") from None
    try:
        validate_queue_declarations(settings.QUEUES)
    except JobsConfigurationError as exc:
        raise InvalidWorkerOption(str(exc)) from None


def require_int(name: str, value: Any, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        allowed = f"{low}..{high}" if high is not None else f">= {low}"
        raise InvalidWorkerOption(f"{name} must be an integer {allowed}; got {value!r}.")


def require_seconds(name: str, value: Any, *, zero_ok: bool, high: float | None) -> None:
    """A finite number of seconds from 0 (``zero_ok``) or above it, up to ``high``. NaN passes
    every comparison with a bound (a NaN poll interval made an idle worker spin), infinity
    overflows a thread wait, and an int too large for a float overflows the arithmetic."""
    try:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        ok = False
    if ok and (value < 0 or (value == 0 and not zero_ok) or (high is not None and value > high)):
        ok = False
    if not ok:
        allowed = (">= 0" if zero_ok else "> 0") + (f" and <= {high:g}" if high is not None else " and finite")
        raise InvalidWorkerOption(f"{name} must be a number of seconds {allowed}; got {value!r}.")


def require_worker_id(value: Any) -> None:
    """A worker id is stored in a varchar(200) and read in logs and the admin: 1-200 printable
    characters (no newline, tab or other control character), no whitespace at either end.
    ``None``, not an empty string, asks for a generated id."""
    if not isinstance(value, str):
        problem = f"must be a string, or None for a generated id; got {value!r}"
    elif not value.strip():
        problem = f"must not be empty or blank; leave it out (None) for a generated id; got {value!r}"
    elif len(value) > MAX_WORKER_ID_LENGTH:
        problem = f"must be at most {MAX_WORKER_ID_LENGTH} characters; got {len(value)}"
    elif value != value.strip():
        problem = f"must not start or end with whitespace; got {value!r}"
    elif not value.isprintable():
        problem = f"must be printable characters only, no control characters (newline, tab...); got {value!r}"
    else:
        return
    raise InvalidWorkerOption(f"worker_id {problem}.")

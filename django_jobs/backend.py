"""``JobsBackend``: Django's Tasks backend that stores jobs in the database.

TASKS = {"default": {"BACKEND": "django_jobs.backend.JobsBackend", "QUEUES": [], "OPTIONS": {}}}
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import re
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from asgiref.sync import sync_to_async
from django.core import checks
from django.db import transaction
from django.tasks import Task, TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TASK_REFRESH_ATTRS, TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.module_loading import import_string

from .backoff import validate_backoff
from .conf import get_settings
from .dedup import Dedup, check_key
from .exceptions import (
    ArgumentOutOfRange,
    ArgumentTooDeep,
    InvalidArgumentValue,
    InvalidOptionType,
    InvalidQueueName,
    InvalidTaskArguments,
    InvalidTaskOptions,
    PayloadTooLarge,
    RunAfterOutOfRange,
)
from .states import JobState, to_task_status
from .tracing import trace_id_for_new_job, validate_trace_id

logger = logging.getLogger("django_jobs.backend")

QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}\Z")  # \Z: "$" would let a final newline in

#: The options JobTask adds to Django's Task, settable in @task(...) and .using(...).
JOB_OPTIONS = (
    "max_attempts", "backoff", "timeout", "lifo", "dedup", "idempotency_key", "trace_id", "partition", "retention",
)  # fmt: skip


#: True while JobTask.using() copies a task (dataclasses.replace calls the class again).
_COPYING: contextvars.ContextVar[bool] = contextvars.ContextVar("django_jobs_copying_task", default=False)

#: True while :func:`task_for_job` rebuilds a stored job's task: its run_after was checked
#: against MAX_RUN_AFTER when it was enqueued, and a setting lowered since must not break reads.
_RESTORING: contextvars.ContextVar[bool] = contextvars.ContextVar("django_jobs_restoring_task", default=False)


#: Every task declared with our task class, by dotted path (the pruner's per-task count limits).
_DECLARED: dict[str, Any] = {}


def declared_tasks() -> list[Any]:
    """The django-jobs tasks declared (imported) in this process."""
    return list(_DECLARED.values())


class _JobTaskMeta(type):
    """Turns unknown ``@task(...)`` options into a TypeError that lists the allowed ones."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        allowed = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = set(kwargs) - allowed
        if unknown:
            raise TypeError(
                f"Unknown task option(s) {', '.join(sorted(unknown))}. django-jobs tasks accept: "
                f"{', '.join(sorted(allowed - {'func', 'run_after'}))} (and run_after in .using())."
            )
        task = super().__call__(*args, **kwargs)
        if not _COPYING.get():
            _DECLARED[task.module_path] = task
        if task.schedule is not None and not _COPYING.get():
            from .schedules import register_task_schedule

            register_task_schedule(task)
        return task


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTask(Task, metaclass=_JobTaskMeta):
    """Django's ``Task`` plus django-jobs options.

    ``max_attempts``: runs at most this many times (``None``: the ``MAX_ATTEMPTS`` setting, 1).
    ``backoff``: delay before a retry: seconds, a list of seconds per attempt (the last value
    is reused), or ``"exponential"`` (full jitter, ``BACKOFF_BASE``/``BACKOFF_CAP``);
    ``None`` uses the ``BACKOFF`` setting.
    ``timeout``: seconds an attempt may run; at the deadline it is recorded as failed with a
    ``JobTimeout`` error (retried if attempts remain). ``None``: no limit.
    ``lifo``: last in, first out: the job is claimed before the FIFO jobs of its priority,
    and among LIFO jobs the newest first. Priority still comes first.
    ``dedup``: a :class:`~django_jobs.Dedup`: an enqueue while its key is held returns the job
    holding it (``duplicate=True``); ``.using(dedup=False)`` turns a decorator's off.
    ``idempotency_key``: the queue keeps one job per key for as long as the job row exists; a
    second enqueue returns the first job (``duplicate=True``). Meant for ``.using()``.
    ``trace_id``: the job's pipeline id (default: the running job's, or a new one).
    ``partition``: a key such as ``"customer-456"``: the jobs of one (queue, partition) run one
    at a time, in enqueue order, on any worker; other partitions run in parallel.
    ``retention``: how long this task's finished jobs are kept, per state:
    ``{"completed": 0, "failed": {"age": 86400, "count": 100}}`` (seconds or timedelta, 0 deletes
    at once, None keeps forever); overrides ``DJANGO_JOBS["RETENTION"]`` (docs/howto/retention.md).
    ``schedule``: enqueue this task at every tick (``"*/5 * * * *"``, ``timedelta(minutes=5)``
    or a dict of schedule options); synced by each worker at start like ``SCHEDULES``.
    """

    max_attempts: int | None = None
    backoff: Any = None
    timeout: float | None = None
    lifo: bool = False
    dedup: Dedup | None = None
    idempotency_key: str | None = None
    trace_id: str | None = None
    partition: str | None = None
    retention: dict[str, Any] | None = None
    #: Run this task on a schedule: a cron expression, an interval (seconds or timedelta) or a
    #: dict of schedule options (docs/howto/schedules.md). Not a per-enqueue option.
    schedule: Any = None

    def using(self, *, priority=None, queue_name=None, run_after=None, backend=None, **options):  # type: ignore[override]
        """A copy of the task with other defaults; accepts the django-jobs options too."""
        unknown = set(options) - set(JOB_OPTIONS)
        if unknown:
            raise TypeError(
                f"Unknown option(s) for using(): {', '.join(sorted(unknown))}. Allowed: priority, "
                f"queue_name, run_after, backend, {', '.join(JOB_OPTIONS)}."
            )
        if options.get("retention") is not None:
            _check_using_retention(options["retention"])
        changes: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        if options.get("dedup") is False:  # off for this call, whatever the decorator said
            changes["dedup"] = None
        if isinstance(run_after, timedelta):
            # A delay: from now, the moment .using() is called (normally right before enqueue).
            if run_after < timedelta(0):
                raise InvalidTaskOptions(f"run_after as a timedelta must not be negative; got {run_after!r}.")
            bound = max_run_after(get_settings(backend or self.backend).MAX_RUN_AFTER)
            if bound is not None and run_after > bound:
                raise _run_after_too_far(f"run_after={run_after!r}", bound)
            try:
                run_after = timezone.now() + run_after
            except OverflowError:
                raise RunAfterOutOfRange(
                    f"run_after={run_after!r} from now is past the year 9999, the last a datetime can hold; check "
                    "it for a typo."
                ) from None
        for name, value in (
            ("priority", priority),
            ("queue_name", queue_name),
            ("run_after", run_after),
            ("backend", backend),
        ):
            if value is not None:
                changes[name] = value
        token = _COPYING.set(True)  # a copy is not a new declaration of the task's schedule
        try:
            return replace(self, **changes)
        finally:
            _COPYING.reset(token)

    def enqueue_many(self, items: Iterable[Any]) -> list[JobResult]:
        """Enqueue one job per item, atomically; see :meth:`JobsBackend.enqueue_many`."""
        return self._jobs_backend().enqueue_many(self, items)

    async def aenqueue_many(self, items: Iterable[Any]) -> list[JobResult]:
        """The async form of :meth:`enqueue_many`."""
        return await self._jobs_backend().aenqueue_many(self, items)

    def _jobs_backend(self) -> JobsBackend:
        backend = self.get_backend()
        if not isinstance(backend, JobsBackend):
            raise InvalidTask(
                f"enqueue_many needs a django-jobs JobsBackend; backend {self.backend!r} is a {type(backend).__name__}."
            )
        return backend


@dataclass(frozen=True, slots=True)
class JobCall:
    """The arguments of one job in :meth:`JobTask.enqueue_many`; made by :func:`call`."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def call(*args: Any, **kwargs: Any) -> JobCall:
    """``django_jobs.call(1, b=2)``: an ``enqueue_many`` item with positional and keyword arguments."""
    return JobCall(args, kwargs)


def _item_arguments(index: int, item: Any) -> tuple[Any, dict[str, Any]]:
    """``(args, kwargs)`` of one ``enqueue_many`` item."""
    if isinstance(item, (tuple, list)):
        return item, {}
    if isinstance(item, dict):
        return (), item
    if isinstance(item, JobCall):
        return item.args, item.kwargs
    name = type(item).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    raise InvalidTaskArguments(
        f"enqueue_many item {index} is {article} {name}; pass a tuple of positional args, a dict of keyword args, "
        "or django_jobs.call(*args, **kwargs)."
    )


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
            raise _run_after_too_far(f"run_after {run_after.isoformat()}", bound)
    elif aware:
        try:
            run_after.astimezone(UTC)
        except OverflowError:
            raise RunAfterOutOfRange(
                f"run_after {run_after.isoformat()} is past the year 9999 in UTC, the last a datetime can hold."
            ) from None


def _run_after_too_far(what: str, bound: timedelta) -> RunAfterOutOfRange:
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
        from .retention import InvalidRetention, validate_policies

        try:
            validate_policies(retention, "retention")
        except InvalidRetention as exc:
            raise InvalidTaskOptions(str(exc)) from None


def _check_using_retention(retention: Any) -> None:
    """``.using(retention=...)``: valid policies, ages only (a count limits a task's jobs)."""
    from .retention import InvalidRetention, validate_policies

    try:
        policies = validate_policies(retention, "retention")
    except InvalidRetention as exc:
        raise InvalidTaskOptions(str(exc)) from None
    if any(p.count is not None for p in policies.values()):
        raise InvalidTaskOptions(
            "A retention count limits how many of a task's (or queue's) finished jobs are kept, so it belongs on "
            "@task(retention=...) or in DJANGO_JOBS['RETENTION']; .using(retention=...) takes ages only."
        )


def _retention_json(retention: dict[str, Any]) -> dict[str, Any]:
    """A task's validated retention as JSON for the job's options: ``{state: {"age", "count"}}``."""
    from .retention import validate_policies

    return {state: {"age": p.age, "count": p.count} for state, p in validate_policies(retention, "retention").items()}


def backoff_path(backoff: Any) -> str:
    """The dotted path a worker imports a callable backoff from; it must be module-level."""
    path = f"{getattr(backoff, '__module__', '')}.{getattr(backoff, '__qualname__', '')}"
    try:
        found = import_string(path)
    except ImportError:
        found = None
    if found is not backoff:
        raise InvalidTaskOptions(
            f"A callable backoff must be a module-level function defined before the task (workers import it "
            f"by path); {backoff!r} is not importable as {path!r}."
        )
    return path


def validate_queue_name(name: Any) -> None:
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise InvalidQueueName(
            f"Invalid queue name {name!r}: use 1-100 characters of letters, digits, '_', '-', '.' "
            "and ':', starting with a letter or digit."
        )


#: How deep one task argument (a return value, progress) may nest lists and dicts: ``[[1]]`` is
#: 2 levels. Deeper values would exhaust Python's recursion limit in ``json`` (and in Django's
#: ``normalize_json``) somewhere between enqueue and the worker; ArgumentTooDeep says so first.
#: 30: MariaDB refuses JSON nested 32 levels (its JSON columns check ``JSON_VALID``), and an
#: argument sits one level down in the stored ``args`` list; one limit on every database, so a
#: task that enqueues on one enqueues on all.
MAX_JSON_DEPTH = 30


def check_json(value: Any, where: str) -> None:
    """Raise InvalidTaskArguments naming ``where`` unless ``value`` survives a JSON round trip
    unchanged: str, int, finite float, bool, None, and lists, tuples and dicts with string keys
    of those, at most :data:`MAX_JSON_DEPTH` levels deep."""
    _json_value(value, where, where, 1, normalize=False)


def normalize_argument(value: Any, where: str) -> Any:
    """``value`` as Django's ``normalize_json`` makes it (what Django's ``TaskResult`` does to
    ``args`` and ``kwargs``): bytes decoded from UTF-8, any other sequence a list, any mapping a
    dict, and a subclass of str, int or float (a StrEnum, an IntEnum) its plain value, as JSON
    stores it. Then checked as :func:`check_json` checks. So the value returned is what
    ``json.loads`` gives back from its JSON (fresh lists and dicts, plain leaves): exactly what
    the worker will get.

    One difference, on purpose: a mapping key must be a string (or UTF-8 bytes). Django keeps
    ``{1: "a"}`` as it is, but JSON stores ``{"1": "a"}``, so the task would be called with a
    different key than the caller gave; that raises InvalidTaskArguments instead.
    """
    return _json_value(value, where, where, 1, normalize=True)


def _json_value(value: Any, where: str, top: str, depth: int, *, normalize: bool) -> Any:
    """:func:`check_json` and :func:`normalize_argument`, in Django's order of cases. ``top``:
    the argument ``where`` is inside (the depth error names it, not a path 100 levels long)."""
    if isinstance(value, dict) or (normalize and isinstance(value, Mapping)):
        return _json_object(value, where, top, depth, normalize=normalize)
    if normalize and isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise InvalidArgumentValue(
                f"{where} is bytes that are not UTF-8, which Django's tasks decode to text; pass text, or "
                "base64-encode binary data (base64.b64encode(data).decode())."
            ) from None
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidArgumentValue(
                f"{where} contains a NUL character (\\x00), which PostgreSQL cannot store in JSON; remove it "
                "or pass the data base64-encoded."
            )
        # A subclass's text, as json writes it (str.__str__ ignores an overridden __str__).
        return value if type(value) is str else str.__str__(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        _check_int(value, where)
        return value if type(value) is int else int.__int__(value)  # json writes int.__repr__
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentValue(f"{where} is {value!r}; JSON has no NaN or infinity.")
        return value if type(value) is float else float.__float__(value)  # json writes float.__repr__
    if isinstance(value, (list, tuple)) or (normalize and isinstance(value, Sequence) and not isinstance(value, bytes)):
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(top)
        return [_json_value(item, f"{where}[{i}]", top, depth + 1, normalize=normalize) for i, item in enumerate(value)]
    _not_json(value, where)


def _json_object(value: Mapping[Any, Any], where: str, top: str, depth: int, *, normalize: bool) -> dict[str, Any]:
    if depth > MAX_JSON_DEPTH:
        raise _too_deep(top)
    result: dict[str, Any] = {}
    for key, item in value.items():
        if normalize and isinstance(key, bytes):
            key = _json_value(key, f"a key of {where}", top, depth, normalize=True)
        if not isinstance(key, str):
            raise InvalidTaskArguments(
                f"{where} has a {type(key).__name__} key {key!r}; JSON object keys must be strings."
            )
        key = _json_value(key, f"a key of {where}", top, depth, normalize=normalize)
        result[key] = _json_value(item, f"{where}[{key!r}]", top, depth + 1, normalize=normalize)
    return result


def _too_deep(top: str) -> ArgumentTooDeep:
    return ArgumentTooDeep(
        f"{top} nests lists and dicts deeper than {MAX_JSON_DEPTH} levels (MAX_JSON_DEPTH); flatten it, or "
        "store the structure elsewhere (a model, a file) and pass its key."
    )


def _check_int(value: int, where: str) -> None:
    """Raise ArgumentOutOfRange for an integer with more digits than Python converts to and from
    text (``sys.get_int_max_str_digits()``, 4,300 by default): json could not write it, and a
    worker could not read it back."""
    limit = sys.get_int_max_str_digits()
    if not limit or value.bit_length() < 3 * limit:  # 3 bits a digit at most: a cheap test first
        return
    magnitude = abs(int(value))
    digits = math.floor(magnitude.bit_length() * math.log10(2))  # exact, or one short
    digits += magnitude >= 10**digits
    if digits > limit:
        raise ArgumentOutOfRange(
            f"{where} is an integer of {digits} digits, more than the {limit} Python's JSON reads back; pass it "
            "as a string (str(value)) and convert it in the task."
        )


def _not_json(value: Any, where: str) -> NoReturn:
    hint = {
        "datetime": "pass .isoformat() and parse it in the task",
        "date": "pass .isoformat() and parse it in the task",
        "Decimal": "pass str(value)",
        "UUID": "pass str(value)",
        "set": "pass a sorted list",
        "frozenset": "pass a sorted list",
        "bytes": "pass base64 text or store the data and pass a key",
    }.get(type(value).__name__, "pass its primary key or a plain dict instead")
    raise InvalidTaskArguments(f"{where} is a {type(value).__name__}, which is not JSON; {hint}.")


#: ``json.dumps(value, ensure_ascii=False)`` without building an encoder per call (json.dumps
#: makes one whenever an option differs from its defaults).
_encode_json = json.JSONEncoder(ensure_ascii=False).encode


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _send_enqueued(sender: type, results: list[Any]) -> None:
    """``task_enqueued`` for each result of an ``enqueue_many``, on commit. A receiver that raises
    for one job is logged and does not keep the others' signals from being sent (as ``enqueue``'s
    one callback per job would behave)."""
    for result in results:
        try:
            task_enqueued.send(sender, task_result=result)
        except Exception:
            logger.exception("A task_enqueued receiver raised for job %s.", result.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult(TaskResult):
    """Django's ``TaskResult`` plus what django-jobs stores beside it: ``progress`` (set by a
    running task with ``context.set_progress``) and ``trace_id`` (the job's pipeline).

    ``duplicate``: this result comes from an enqueue that did not insert a job because a job
    held its dedup or idempotency key; it describes that job. Always False from ``get_result``.
    """

    progress: Any = None
    trace_id: str | None = None
    duplicate: bool = False

    def refresh(self) -> None:
        self._copy_from(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._copy_from(await self.task.get_backend().aget_result(self.id))

    def _copy_from(self, fresh: TaskResult) -> None:
        for attr in (*TASK_REFRESH_ATTRS, "progress", "args", "kwargs"):
            object.__setattr__(self, attr, getattr(fresh, attr, None))


class JobsBackend(BaseTaskBackend):
    """Stores each enqueued task as a ``Job`` row; ``manage.py runworker`` runs them."""

    task_class = JobTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)

    @property
    def settings(self):
        """The effective settings, read on each use (cached in conf) so overrides apply."""
        return get_settings(self.alias)

    @property
    def database(self) -> str:
        return self.settings.DATABASE

    # -- validation --------------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Django's checks and ours; also run when ``.using()`` makes a copy, so a bad option is
        refused there. A priority or run_after of the wrong type raises InvalidOptionType (a
        TypeError) before Django's checks would fail on it with a bare TypeError or
        AttributeError; a run_after further ahead than ``MAX_RUN_AFTER`` RunAfterOutOfRange."""
        validate_queue_name(task.queue_name)
        validate_option_types(task)
        super().validate_task(task)
        validate_job_options(task)
        if task.run_after is not None and not _RESTORING.get():
            check_run_after_bound(task.run_after, max_run_after(self.settings.MAX_RUN_AFTER))

    def _check_payload(self, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        args, kwargs, _, _ = self._payload(args, kwargs)
        return args, kwargs

    def _payload(self, args: Any, kwargs: Any, cap: int | None = None) -> tuple[list[Any], dict[str, Any], str, str]:
        """Validate one job's arguments; return them as the worker will read them back (what
        ``json.loads`` of their JSON gives: :func:`normalize_argument` makes exactly that, no
        decode needed), then the JSON of its args and of its kwargs.

        ``cap``: MAX_PAYLOAD_BYTES, when the caller has already read it (enqueue_many, per item).
        """
        if not isinstance(kwargs, dict):
            raise InvalidTaskArguments("kwargs must be a dict.")
        if not isinstance(args, (list, tuple)):
            args = list(args)
        # Normalised as Django's TaskResult normalises them (bytes decoded, sequences as lists).
        args = [normalize_argument(value, f"args[{i}]") for i, value in enumerate(args)]
        named = {}
        for key, value in kwargs.items():
            if isinstance(key, bytes):
                key = normalize_argument(key, "a keyword argument name")
            if not isinstance(key, str):
                raise InvalidTaskArguments(f"kwargs has a {type(key).__name__} key {key!r}; names must be strings.")
            key = normalize_argument(key, "a keyword argument name")
            named[key] = normalize_argument(value, f"kwargs[{key!r}]")
        # Most jobs have no args or no kwargs: their JSON needs no encoder.
        args_json = _encode_json(args) if args else "[]"
        kwargs_json = _encode_json(named) if named else "{}"
        try:
            size = _utf8_len(args_json) + _utf8_len(kwargs_json)
        except UnicodeEncodeError:
            raise InvalidArgumentValue(
                "The job's arguments contain a lone surrogate (such as '\\ud800'), which is not valid UTF-8 and "
                "PostgreSQL cannot store; pass valid text or the data base64-encoded."
            ) from None
        cap = self.settings.MAX_PAYLOAD_BYTES if cap is None else cap
        if size > cap:
            raise PayloadTooLarge(
                f"The job's arguments are {size} bytes of JSON, over MAX_PAYLOAD_BYTES={cap}; store "
                "large data elsewhere (a model, a file) and pass its key."
            )
        return args, named, args_json, kwargs_json

    def _job_fields(self, task: Task) -> tuple[int, dict[str, Any]]:
        """``(max_attempts, options)`` stored on a job of ``task``."""
        max_attempts = getattr(task, "max_attempts", None) or self.settings.MAX_ATTEMPTS
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
        retention = getattr(task, "retention", None)
        if retention is not None:
            options["retention"] = _retention_json(retention)
        return max_attempts, options

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the job in the caller's transaction; ``task_enqueued`` is sent on commit.

        With ``dedup`` or ``idempotency_key``, an enqueue whose key is held inserts nothing and
        returns the job holding it, ``duplicate=True`` (and sends no ``task_enqueued``).
        """
        self.validate_task(task)
        args, kwargs = self._check_payload(args, kwargs)
        max_attempts, options = self._job_fields(task)
        from . import engine  # models load lazily, so E001 can report a missing app

        trace_id = trace_id_for_new_job(getattr(task, "trace_id", None))
        fields = self._insert_fields(task, args, kwargs, max_attempts, options, trace_id)
        dedup = getattr(task, "dedup", None)
        idempotency_key = getattr(task, "idempotency_key", None)
        if dedup is not None:
            result, _ = self._enqueue_deduplicated(task, dedup, fields, notify_workers=True)
        elif idempotency_key is not None:
            job, created = engine.insert_job_once(**fields, idempotency_key=idempotency_key)
            result = self._result_from_job(job, _same_task(task, job), duplicate=not created)
        else:
            result = self._result_from_new_job(engine.insert_new_job(**fields), task)
        if not result.duplicate:
            transaction.on_commit(
                lambda: task_enqueued.send(type(self), task_result=result), using=self.database, robust=True
            )
        return result

    def _insert_fields(
        self,
        task: Task,
        args: list[Any],
        kwargs: dict[str, Any],
        max_attempts: int,
        options: dict[str, Any],
        trace_id: str,
    ) -> dict[str, Any]:
        """The keyword arguments of the engine's insert functions for one job of ``task``."""
        return {
            "using": self.database,
            "backend": self.alias,
            "task_path": task.module_path,
            "queue": task.queue_name,
            "priority": task.priority,
            "args": args,
            "kwargs": kwargs,
            "max_attempts": max_attempts,
            "options": options,
            "run_after": task.run_after,
            "lifo": bool(getattr(task, "lifo", False)),
            "trace_id": trace_id,
            "partition": getattr(task, "partition", None),
        }

    def _enqueue_deduplicated(
        self, task: Task, dedup: Dedup, fields: dict[str, Any], *, notify_workers: bool
    ) -> tuple[JobResult, bool]:
        """One enqueue through :func:`engine.enqueue_deduplicated` (``fields`` as insert_job takes
        them); its result, and whether a job became waiting (workers to wake)."""
        from . import engine

        done = engine.enqueue_deduplicated(
            **fields,
            key=dedup.key_for(fields["args"], fields["kwargs"]),
            ttl=dedup.ttl,
            extend=dedup.extend,
            replace=dedup.replace,
            keep_last_if_active=dedup.keep_last_if_active,
            notify_workers=notify_workers,
        )
        woke = done.job.state == JobState.WAITING and (done.created or "replaced" in done.changes)
        return self._result_from_job(done.job, _same_task(task, done.job), duplicate=not done.created), woke

    def enqueue_many(self, task: Task, items: Iterable[Any]) -> list[JobResult]:
        """Enqueue one job of ``task`` per item of ``items``; return their results in that order.

        An item is a tuple or list (positional arguments), a dict (keyword arguments) or
        ``django_jobs.call(*args, **kwargs)`` (both). The jobs are inserted in the caller's
        transaction and atomically as a whole (a savepoint inside the caller's transaction): an
        invalid item raises, naming its index, and no job of the call is stored, even those of
        chunks already written. ``items`` is read lazily, :data:`engine.INSERT_CHUNK` items per
        multi-row INSERT, so a generator of any length never has all its SQL in memory; the
        results (one small ``JobResult`` each, sharing ``task``) are what grows.

        Validates ``task`` once; each item's arguments as ``enqueue`` does (the same exception
        class, its message prefixed ``enqueue_many item {i}: ``). Wakes the workers of the queue
        once (PostgreSQL NOTIFY, on commit). ``task_enqueued`` is sent for each job, in order,
        on commit, from one ``on_commit`` callback.

        All the jobs of one call share one trace id. With ``dedup``, the items go through the
        dedup path one at a time (its key computed from each item's arguments when the key is a
        callable), slower than the multi-row INSERT; each result says whether it is a
        ``duplicate``, and ``task_enqueued`` is sent for the new jobs only. An
        ``idempotency_key`` raises InvalidTaskOptions: one key cannot name many jobs.
        """
        from . import engine  # models load lazily, so E001 can report a missing app

        self.validate_task(task)
        if getattr(task, "idempotency_key", None) is not None:
            raise InvalidTaskOptions(
                "enqueue_many cannot take an idempotency_key: one idempotency key cannot name many jobs. Enqueue "
                "each job with its own key (task.using(idempotency_key=...).enqueue(...)), or give each item a "
                "dedup key computed from its arguments: dedup=Dedup(lambda args, kwargs: f'order:{args[0]}')."
            )
        max_attempts, options = self._job_fields(task)
        lifo = bool(getattr(task, "lifo", False))
        using, cap = self.database, self.settings.MAX_PAYLOAD_BYTES
        trace_id = trace_id_for_new_job(getattr(task, "trace_id", None))
        dedup = getattr(task, "dedup", None)
        if dedup is not None:
            return self._enqueue_many_deduplicated(task, dedup, items, max_attempts, options, trace_id)
        # The state and seq from this process's clock, taken once so every chunk agrees;
        # enqueued_at from the database's (insert_jobs) on PostgreSQL.
        now = timezone.now()
        delayed = task.run_after is not None and task.run_after > now
        status = to_task_status(JobState.DELAYED if delayed else JobState.WAITING)
        enqueued_at: list[Any] = []  # the first chunk's (the same for every chunk: one transaction)
        results: list[JobResult] = []
        # JSON of the current chunk only; dropped once it is written.
        rows: list[tuple[str, str]] = []
        payloads: list[tuple[list[Any], dict[str, Any]]] = []  # (args, kwargs) per job

        def write_chunk() -> None:
            inserted = engine.insert_jobs(
                using=using,
                rows=rows,
                backend=self.alias,
                task_path=task.module_path,
                queue=task.queue_name,
                priority=task.priority,
                max_attempts=max_attempts,
                options=options,
                run_after=task.run_after,
                lifo=lifo,
                now=now,
                database_clock=True,
                position=len(results),
                trace_id=trace_id,
                partition=getattr(task, "partition", None),
            )
            if not enqueued_at:
                enqueued_at.append(inserted.enqueued_at)
            for job_id, (args, kwargs) in zip(inserted.ids, payloads, strict=True):
                results.append(
                    JobResult(
                        task=task,
                        id=str(job_id),
                        status=status,
                        enqueued_at=enqueued_at[0],
                        started_at=None,
                        last_attempted_at=None,
                        finished_at=None,
                        args=args,
                        kwargs=kwargs,
                        backend=self.alias,
                        errors=[],
                        worker_ids=[],
                        trace_id=trace_id,
                    )
                )
            rows.clear()
            payloads.clear()

        with transaction.atomic(using=using):
            for index, item in enumerate(items):
                args, kwargs = _item_arguments(index, item)
                try:
                    args, kwargs, args_json, kwargs_json = self._payload(args, kwargs, cap)
                except InvalidTaskArguments as exc:
                    raise type(exc)(f"enqueue_many item {index}: {exc}") from None
                rows.append((args_json, kwargs_json))
                payloads.append((args, kwargs))
                if len(rows) == engine.INSERT_CHUNK:
                    write_chunk()
            if rows:
                write_chunk()
            if results:
                if not delayed:
                    engine.notify(using, [task.queue_name])
                # One callback for the whole call, not one per job as enqueue registers: a closure
                # and an on_commit entry per job would grow with the batch as the results do.
                transaction.on_commit(lambda: _send_enqueued(type(self), results), using=using, robust=True)
        return results

    def _enqueue_many_deduplicated(
        self,
        task: Task,
        dedup: Dedup,
        items: Iterable[Any],
        max_attempts: int,
        options: dict[str, Any],
        trace_id: str,
    ) -> list[JobResult]:
        """:meth:`enqueue_many` with ``dedup``: one dedup enqueue per item, in one atomic block."""
        from . import engine

        using, cap = self.database, self.settings.MAX_PAYLOAD_BYTES
        results: list[JobResult] = []
        wake = False
        with transaction.atomic(using=using):
            for index, item in enumerate(items):
                args, kwargs = _item_arguments(index, item)
                try:
                    stored_args, stored_kwargs, _, _ = self._payload(args, kwargs, cap)
                except InvalidTaskArguments as exc:
                    raise type(exc)(f"enqueue_many item {index}: {exc}") from None
                fields = self._insert_fields(task, stored_args, stored_kwargs, max_attempts, options, trace_id)
                try:
                    result, woke = self._enqueue_deduplicated(task, dedup, fields, notify_workers=False)
                except InvalidTaskOptions as exc:
                    raise InvalidTaskOptions(f"enqueue_many item {index}: {exc}") from None
                results.append(result)
                wake = wake or woke
            if wake:
                engine.notify(using, [task.queue_name])
            created = [r for r in results if not r.duplicate]
            if created:
                transaction.on_commit(lambda: _send_enqueued(type(self), created), using=using, robust=True)
        return results

    async def aenqueue_many(self, task: Task, items: Iterable[Any]) -> list[JobResult]:
        """The async form of :meth:`enqueue_many` (in a thread, as Django's ``aenqueue`` does)."""
        return await sync_to_async(self.enqueue_many, thread_sensitive=True)(task, items)

    # -- results -----------------------------------------------------------------------------

    def get_result(self, result_id: Any) -> TaskResult:
        from .models import Job

        try:
            job_id = uuid.UUID(str(result_id))
        except (ValueError, TypeError, AttributeError):
            raise TaskResultDoesNotExist(f"No job with id {result_id!r} (not a job id).") from None
        try:
            job = Job.objects.using(self.database).get(id=job_id, backend=self.alias)
        except Job.DoesNotExist:
            raise TaskResultDoesNotExist(f"No job with id {result_id!r}.") from None
        return self._result_from_job(job)

    def _result_from_job(self, job: Any, task: Task | None = None, *, duplicate: bool = False) -> TaskResult:
        if task is None:
            task = task_for_job(job.task_path, job.backend, job.queue, job.priority, stored_run_after(job.options))
        result = JobResult(
            task=task,
            id=str(job.id),
            status=to_task_status(job.state),
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            last_attempted_at=job.last_attempted_at,
            finished_at=job.finished_at,
            args=job.args,
            kwargs=job.kwargs,
            backend=self.alias,
            errors=[
                TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"]) for e in job.errors
            ],
            worker_ids=list(job.worker_ids),
            progress=job.progress,
            trace_id=job.trace_id,
            duplicate=duplicate,
        )
        object.__setattr__(result, "_return_value", job.return_value)
        return result

    def _result_from_new_job(self, job: Any, task: Task) -> JobResult:
        """The result of a job of ``task`` just inserted (an ``engine.NewJob``), as
        :meth:`_result_from_job` reads it from its ``Job``: not started, no error, no progress."""
        return JobResult(
            task=task,
            id=str(job.id),
            status=to_task_status(job.state),
            enqueued_at=job.enqueued_at,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=job.args,
            kwargs=job.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
            trace_id=job.trace_id,
        )

    # -- checks ------------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from .checks import check_backend

        return check_backend(self)


def _same_task(task: Task, job: Any) -> Task | None:
    """``task`` when ``job`` is one of its jobs (a duplicate may be another task's job)."""
    return task if job.task_path == task.module_path else None


def task_for_job(path: str, backend: str, queue: str, priority: int, run_after: datetime | None = None) -> Task:
    """The Task a job row describes: its function, with the backend, queue, priority and
    run_after it was enqueued with (which may differ from the decorator's). ``run_after``: from
    :func:`stored_run_after`; a value that no longer validates (USE_TZ changed since) is left out."""
    task = resolve_task(path)
    if task.backend != backend or task.queue_name != queue or task.priority != priority:
        task = task.using(backend=backend, queue_name=queue, priority=priority)
    if run_after is not None:
        token = _RESTORING.set(True)  # checked against MAX_RUN_AFTER when it was enqueued
        try:
            task = task.using(run_after=run_after)
        except InvalidTask:
            logger.warning("The stored run_after %s of a %s job no longer validates; left out.", run_after, path)
        finally:
            _RESTORING.reset(token)
    return task


def stored_run_after(options: dict[str, Any] | None) -> datetime | None:
    """The ``run_after`` a job was enqueued with, kept in its options (None: not deferred)."""
    value = (options or {}).get("run_after")
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def resolve_task(path: str) -> Task:
    """The Task instance a job's path names; TaskNotFound when there is none."""
    from .exceptions import TaskNotFound

    try:
        obj = import_string(path)
    except ImportError as exc:
        raise TaskNotFound(f"Task path {path!r} does not resolve: {exc}. Was it renamed or removed?") from None
    if not isinstance(obj, Task):
        raise TaskNotFound(f"{path!r} is a {type(obj).__name__}, not a Task; only @task functions run.")
    return obj


__all__ = ["JobCall", "JobResult", "JobTask", "JobsBackend", "call", "resolve_task", "task_for_job"]

"""``JobsBackend``: Django's Tasks backend that stores jobs in the database.

TASKS = {"default": {"BACKEND": "django_jobs.backend.JobsBackend", "QUEUES": [], "OPTIONS": {}}}

Thin over :mod:`django_jobs.spec` (what a task's options and a job's arguments may be) and
:mod:`django_jobs.engine` (the insert). Django imports this module from ``TASKS`` before anything
says ``django_jobs`` is in ``INSTALLED_APPS``, and importing the models then raises instead of
letting check E001 say so: this module imports only what loads no model at its top, and the
engine, the models and the checks (which reach the models) on first use, in the methods that
need them. Those deferred imports are the only ones here, and none of them dodges a cycle.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError
from django.tasks import Task, TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TASK_REFRESH_ATTRS, TaskError, TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from .conf import get_settings
from .dispatch import ENQUEUED
from .exceptions import InvalidTaskArguments, InvalidTaskOptions, RunAfterOutOfRange
from .spec.backoff import backoff_path
from .spec.dedup import Dedup
from .spec.encryption import (
    decrypt_arguments,
    decrypt_errors,
    decrypt_json,
    encrypt_arguments,
    hash_key,
    is_encrypted,
)
from .spec.newjob import NewJob
from .spec.options import (
    JOB_OPTIONS,
    check_run_after_bound,
    check_using_retention,
    job_fields,
    max_run_after,
    run_after_too_far,
    stored_run_after,
    validate_job_options,
    validate_option_types,
)
from .spec.payload import MAX_JSON_DEPTH, check_json, check_payload, encode_payload, normalize_argument
from .spec.queues import QUEUE_NAME_RE, validate_queue_name
from .spec.schedules import register_task_schedule
from .spec.tasks import declare, declared_tasks, resolve_task
from .spec.tracing import trace_id_for_new_job
from .states import JobState, to_task_status

logger = logging.getLogger("django_jobs.backend")


#: True while JobTask.using() copies a task (dataclasses.replace calls the class again).
_COPYING: contextvars.ContextVar[bool] = contextvars.ContextVar("django_jobs_copying_task", default=False)

#: True while :func:`task_for_job` rebuilds a stored job's task: its run_after was checked
#: against MAX_RUN_AFTER when it was enqueued, and a setting lowered since must not break reads.
_RESTORING: contextvars.ContextVar[bool] = contextvars.ContextVar("django_jobs_restoring_task", default=False)

#: True while the backend builds the results of jobs it has just inserted: their arguments were
#: normalised by check_payload / encode_payload, and TaskResult.__post_init__ would walk them
#: again (two normalize_json calls per job, a sixth of enqueue_many's CPU).
_NORMALIZED: contextvars.ContextVar[bool] = contextvars.ContextVar("django_jobs_normalized_args", default=False)

#: ``(id(task), backend alias)`` -> ``(task, settings, PlainJob or None)``: see JobsBackend._plain.
_PLAIN: dict[tuple[int, str], tuple[Any, Any, Any]] = {}
_PLAIN_MAX = 512
_READY = TaskResultStatus.READY
#: django_jobs.engine once :func:`_load_engine` imported it: enqueue() reads it without an import
#: statement, whose look-up was a few µs of a one-job enqueue.
_ENGINE: Any = None


def _load_engine() -> Any:
    global _ENGINE
    from . import engine  # on first use: see the module's docstring (E001)

    _ENGINE = engine
    return engine


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
            declare(task)
        if task.schedule is not None and not _COPYING.get():
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
    ``encrypt``: store the job's arguments, return value and error tracebacks encrypted with
    ``DJANGO_JOBS["ENCRYPTION_KEYS"]``, and its dedup or idempotency key hashed
    (docs/howto/encryption.md); ``get_result()`` and the task see the plain values.
    ``atomic``: the worker runs the task inside a transaction on the jobs database and records
    the job's completion as that transaction's last statement, so the task's ORM writes, the
    jobs it enqueues and the messages it publishes commit with its completion, exactly once
    (docs/howto/atomic-tasks.md). A plain ``def`` task only.
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
    encrypt: bool = False
    atomic: bool = False
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
            check_using_retention(options["retention"])
        changes: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        if options.get("dedup") is False:  # off for this call, whatever the decorator said
            changes["dedup"] = None
        if isinstance(run_after, timedelta):
            # A delay: from now, the moment .using() is called (normally right before enqueue).
            if run_after < timedelta(0):
                raise InvalidTaskOptions(f"run_after as a timedelta must not be negative; got {run_after!r}.")
            bound = max_run_after(get_settings(backend or self.backend).MAX_RUN_AFTER)
            if bound is not None and run_after > bound:
                raise run_after_too_far(f"run_after={run_after!r}", bound)
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


def _refuse_manual_transaction(conn: Any) -> None:
    """Raise TransactionManagementError, before anything is inserted, when ``conn`` is in manual
    transaction management (autocommit off) outside ``transaction.atomic()``: ``task_enqueued``
    is sent on commit, which Django's ``on_commit`` refuses to promise there, and raising only
    after the insert would leave a job in the open transaction of an ``enqueue()`` that failed."""
    # Connected, Django keeps ``autocommit`` current; get_autocommit() would connect first.
    if not (conn.autocommit if conn.connection is not None else conn.get_autocommit()):
        raise TransactionManagementError(
            "enqueue() cannot run in manual transaction management (autocommit off, outside "
            "transaction.atomic()): its task_enqueued signal is sent when the job commits, which Django "
            "cannot schedule there. Enqueue inside transaction.atomic(), or with autocommit on."
        )


def _send_enqueued(sender: type, results: list[Any]) -> None:
    """``task_enqueued`` for each result of an ``enqueue_many``, on commit. A receiver that raises
    is logged and does not keep the other receivers, or the other jobs' signals, from being sent
    (as ``enqueue`` sends it).

    The receivers are looked up once for the batch (``ENQUEUED.live``), not once per job as
    ``Signal.send`` does (a quarter of enqueue_many's CPU went to that lookup); each job still
    reaches every receiver, in order. When ``live`` says to go through ``send_robust`` (an async
    receiver, a Django whose signal internals differ), each job goes through ``ENQUEUED.send``.
    """
    receivers = ENQUEUED.live(sender)
    for result in results:
        if receivers is None:
            ENQUEUED.send(sender, result)
            continue
        for receiver in receivers:
            try:
                receiver(signal=task_enqueued, sender=sender, task_result=result)
            except Exception as err:  # noqa: BLE001 - logged as send_robust would; the others still run
                ENQUEUED.failed(receiver, result, err)


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

    def __post_init__(self) -> None:
        if not _NORMALIZED.get():
            TaskResult.__post_init__(self)  # not super(): a slots dataclass is a new class

    def refresh(self) -> None:
        self._copy_from(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._copy_from(await self.task.get_backend().aget_result(self.id))

    def _copy_from(self, fresh: TaskResult) -> None:
        for attr in (*TASK_REFRESH_ATTRS, "progress", "args", "kwargs"):
            object.__setattr__(self, attr, getattr(fresh, attr, None))


def _new_result(
    task: Task,
    backend: str,
    job_id: uuid.UUID | str,
    status: Any,
    enqueued_at: datetime | None,
    args: list[Any],
    kwargs: dict[str, Any],
    trace_id: str | None,
) -> JobResult:
    """The result of a job just inserted: not started, no error, no progress. Call it with
    ``_NORMALIZED`` set: ``args`` and ``kwargs`` are what check_payload / encode_payload
    returned, already normalised, and TaskResult's __post_init__ need not walk them again."""
    return JobResult(
        task=task,
        id=str(job_id),
        status=status,
        enqueued_at=enqueued_at,
        started_at=None,
        last_attempted_at=None,
        finished_at=None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=[],
        trace_id=trace_id,
    )


#: The fields :func:`_batch_results` sets, which must be every field of JobResult.
_BATCH_FIELDS = frozenset({
    "task", "id", "status", "enqueued_at", "started_at", "last_attempted_at", "finished_at", "args", "kwargs",
    "backend", "errors", "worker_ids", "_return_value", "progress", "trace_id", "duplicate",
})  # fmt: skip


@functools.cache
def _result_slots() -> dict[str, Any] | None:
    """The slot setter of each JobResult field, by name; None when its fields are not the ones
    :func:`_batch_results` and :func:`_waiting_result` know (a Django that adds one)."""
    if {f.name for f in fields(JobResult)} != _BATCH_FIELDS:
        return None
    return {name: getattr(JobResult, name).__set__ for name in _BATCH_FIELDS}


def _waiting_result(
    task: Task, backend: str, job_id: str, enqueued_at: datetime | None, args: list[Any], kwargs: dict[str, Any],
    trace_id: str | None,
) -> JobResult:  # fmt: skip
    """:func:`_new_result` of a job just inserted waiting, built through the slots as
    :func:`_batch_results` builds a chunk's (``args`` and ``kwargs`` already normalised)."""
    setters = _waiting_setters()
    if setters is None:
        token = _NORMALIZED.set(True)
        try:
            return _new_result(task, backend, job_id, _READY, enqueued_at, args, kwargs, trace_id)
        finally:
            _NORMALIZED.reset(token)
    # One call per field, unrolled (a zip loop over them cost 2.0 µs against 1.2).
    (task_, id_, status, enqueued, started, last, finished, args_, kwargs_, backend_, errors, workers, value,
     progress, trace, duplicate) = setters  # fmt: skip
    result = object.__new__(JobResult)
    task_(result, task)
    id_(result, job_id)
    status(result, _READY)
    enqueued(result, enqueued_at)
    started(result, None)
    last(result, None)
    finished(result, None)
    args_(result, args)
    kwargs_(result, kwargs)
    backend_(result, backend)
    errors(result, [])
    workers(result, [])
    value(result, None)
    progress(result, None)
    trace(result, trace_id)
    duplicate(result, False)
    return result


#: The fields in the order :func:`_waiting_result` gives their values.
_WAITING_ORDER = (
    "task", "id", "status", "enqueued_at", "started_at", "last_attempted_at", "finished_at", "args", "kwargs",
    "backend", "errors", "worker_ids", "_return_value", "progress", "trace_id", "duplicate",
)  # fmt: skip


@functools.cache
def _waiting_setters() -> tuple[Any, ...] | None:
    """The slot setters of :data:`_WAITING_ORDER`; None as :func:`_result_slots` is."""
    slots = _result_slots()
    return None if slots is None else tuple(slots[name] for name in _WAITING_ORDER)


def _batch_results(task: Task, backend: str, status: Any, enqueued_at: datetime | None, trace_id: str | None) -> Any:
    """A function ``(id text, args, kwargs) -> JobResult`` building the results of a chunk of
    new jobs, equal to what :func:`_new_result` returns for each.

    The jobs of one ``enqueue_many`` share every field but their id and arguments, and a frozen
    dataclass's ``__init__`` (a guarded ``setattr`` per field) was a third of the call's CPU:
    here each field is stored through its slot, the shared ones from one list. When JobResult's
    fields are not the ones this knows (a Django that adds one), it falls back to
    :func:`_new_result`.
    """
    if _result_slots() is None:

        def slow(job_id: str, args: list[Any], kwargs: dict[str, Any]) -> JobResult:
            token = _NORMALIZED.set(True)
            try:
                return _new_result(task, backend, job_id, status, enqueued_at, args, kwargs, trace_id)
            finally:
                _NORMALIZED.reset(token)

        return slow
    shared = {
        "task": task, "status": status, "enqueued_at": enqueued_at, "started_at": None, "last_attempted_at": None,
        "finished_at": None, "backend": backend, "_return_value": None, "progress": None, "trace_id": trace_id,
        "duplicate": False,
    }  # fmt: skip
    slots = _result_slots()
    assert slots is not None
    fixed = [(slots[name], value) for name, value in shared.items()]
    set_id, set_args, set_kwargs, set_errors, set_workers = (
        slots[name] for name in ("id", "args", "kwargs", "errors", "worker_ids")
    )
    new = object.__new__

    def make(job_id: str, args: list[Any], kwargs: dict[str, Any]) -> JobResult:
        result = new(JobResult)
        for setter, value in fixed:
            setter(result, value)
        set_id(result, job_id)
        set_args(result, args)
        set_kwargs(result, kwargs)
        set_errors(result, [])
        set_workers(result, [])
        return result

    return make


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

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the job in the caller's transaction; ``task_enqueued`` is sent on commit.

        With ``dedup`` or ``idempotency_key``, an enqueue whose key is held inserts nothing and
        returns the job holding it, ``duplicate=True`` (and sends no ``task_enqueued``).
        """
        plain = self._plain(task)
        if plain is not None:
            result = self._enqueue_plain(task, plain, args, kwargs)
            if result is not None:
                return result
        return self._enqueue(task, args, kwargs)

    def _plain(self, task: Task) -> Any:
        """The ``engine.PlainJob`` of ``task`` when its jobs take the plain insert (no run_after,
        partition, dedup or idempotency key, on a database where that insert serves); else None.

        Validated and made once per task object and settings, not once per job: a task is
        frozen, and the settings object changes with the settings (override_settings included).
        ``.using()`` makes a new object, so it is validated on its first enqueue as before."""
        settings = self.settings
        key = (id(task), self.alias)
        cached = _PLAIN.get(key)
        if cached is not None and cached[0] is task and cached[1] is settings:
            return cached[2]
        from . import engine  # on first use: see the module's docstring (E001)

        self.validate_task(task)
        plain = None
        if (
            task.run_after is None
            and getattr(task, "dedup", None) is None
            and getattr(task, "idempotency_key", None) is None
            and getattr(task, "partition", None) is None
        ):
            max_attempts, options = job_fields(task, default_max_attempts=settings.MAX_ATTEMPTS)
            if "encrypt" not in options:  # an encrypted job's arguments are stored encrypted: the general path
                plain = engine.plain_job(
                    using=self.database,
                    backend=self.alias,
                    queue=task.queue_name,
                    task_path=task.module_path,
                    priority=task.priority,
                    max_attempts=max_attempts,
                    options=options,
                    lifo=bool(getattr(task, "lifo", False)),
                    trace_id=getattr(task, "trace_id", None),
                )
        if len(_PLAIN) >= _PLAIN_MAX:  # tasks made per call by .using(): keep the cache small
            _PLAIN.clear()
        _PLAIN[key] = (task, settings, plain)
        return plain

    def _enqueue_plain(self, task: Task, plain: Any, args: Any, kwargs: Any) -> TaskResult | None:
        """:meth:`enqueue` of a job of a plain task (:meth:`_plain`); None when its queue has a
        size limit (nothing inserted: :meth:`_enqueue` admits it under the queue's lock)."""
        engine = _ENGINE or _load_engine()  # on first use: see the module's docstring (E001)

        args, kwargs, args_json, kwargs_json = encode_payload(args, kwargs, cap=self.settings.MAX_PAYLOAD_BYTES)
        conn = connections[plain.using]
        in_transaction = conn.in_atomic_block
        if not in_transaction:
            _refuse_manual_transaction(conn)
        inserted = engine.insert_plain_job(plain, conn, args_json, kwargs_json)
        if inserted is None:
            return None
        job_id, enqueued_at, trace_id = inserted
        result = _waiting_result(task, self.alias, job_id, enqueued_at, args, kwargs, trace_id)
        sender = type(self)
        if in_transaction:
            transaction.on_commit(lambda: ENQUEUED.send(sender, result), using=plain.using, robust=True)
        else:
            # Committed already: what on_commit(robust=True) would do now, minus its look-ups.
            ENQUEUED.send(sender, result)
        return result

    def _enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """:meth:`enqueue` of any job: a run_after, partition, dedup or idempotency key, a size
        limited queue, a database without the plain insert."""
        from . import engine  # on first use: see the module's docstring (E001)

        self.validate_task(task)
        args, kwargs = check_payload(args, kwargs, cap=self.settings.MAX_PAYLOAD_BYTES)
        max_attempts, options = job_fields(task, default_max_attempts=self.settings.MAX_ATTEMPTS)
        conn = connections[self.database]
        if not conn.in_atomic_block:
            _refuse_manual_transaction(conn)

        job = NewJob.for_task(
            task,
            backend=self.alias,
            args=args,
            kwargs=kwargs,
            max_attempts=max_attempts,
            options=options,
            trace_id=getattr(task, "trace_id", None),  # None: the insert gives the running job's, or the job's id
        )
        dedup = getattr(task, "dedup", None)
        idempotency_key = getattr(task, "idempotency_key", None)
        encrypted = "encrypt" in options
        if dedup is not None:
            result, _ = self._enqueue_deduplicated(task, dedup, job, notify_workers=True, plain=(args, kwargs))
        elif idempotency_key is not None:
            if encrypted:  # the key may quote the arguments: only its hash is stored
                idempotency_key = hash_key(idempotency_key)
            found, created = engine.insert_job_once(job, using=self.database, idempotency_key=idempotency_key)
            result = self._result_from_job(found, _same_task(task, found), duplicate=not created)
        else:
            row = engine.insert_new_job(job, using=self.database)
            result = self._result_from_new_job(row, task, plain=(args, kwargs) if encrypted else None)
        if not result.duplicate:
            transaction.on_commit(lambda: ENQUEUED.send(type(self), result), using=self.database, robust=True)
        return result

    def _enqueue_deduplicated(
        self, task: Task, dedup: Dedup, job: NewJob, *, notify_workers: bool, plain: tuple[list[Any], dict[str, Any]]
    ) -> tuple[JobResult, bool]:
        """One enqueue of ``job`` through :func:`engine.enqueue_deduplicated`; its result, and
        whether a job became waiting (workers to wake). ``plain``: the job's arguments before
        encryption, which a callable key is computed from; an encrypted job stores its key's hash."""
        from . import engine  # on first use: see the module's docstring (E001)

        key = dedup.key_for(*plain)
        if "encrypt" in job.options:
            key = hash_key(key)
        done = engine.enqueue_deduplicated(
            job,
            using=self.database,
            key=key,
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
        from . import engine  # on first use: see the module's docstring (E001)

        self.validate_task(task)
        if getattr(task, "idempotency_key", None) is not None:
            raise InvalidTaskOptions(
                "enqueue_many cannot take an idempotency_key: one idempotency key cannot name many jobs. Enqueue "
                "each job with its own key (task.using(idempotency_key=...).enqueue(...)), or give each item a "
                "dedup key computed from its arguments: dedup=Dedup(lambda args, kwargs: f'order:{args[0]}')."
            )
        max_attempts, options = job_fields(task, default_max_attempts=self.settings.MAX_ATTEMPTS)
        using, cap = self.database, self.settings.MAX_PAYLOAD_BYTES
        trace_id = trace_id_for_new_job(getattr(task, "trace_id", None))
        encrypted = "encrypt" in options
        # What every job of the call shares; each one's arguments are its item's. (Encrypted, its
        # empty arguments are encrypted too: no key configured raises here, before any insert.)
        shared = NewJob.for_task(
            task, backend=self.alias, args=[], kwargs={}, max_attempts=max_attempts, options=options, trace_id=trace_id
        )
        dedup = getattr(task, "dedup", None)
        if dedup is not None:
            return self._enqueue_many_deduplicated(task, dedup, items, shared)
        # The state and seq from this process's clock, taken once so every chunk agrees;
        # enqueued_at from the database's (insert_jobs) on PostgreSQL.
        now = timezone.now()
        delayed = task.run_after is not None and task.run_after > now
        status = to_task_status(JobState.DELAYED if delayed else JobState.WAITING)
        first: list[Any] = []  # the first chunk's InsertedJobs: its enqueued_at is every chunk's
        makers: list[Any] = []  # the chunks' result builder (_batch_results), made after the first
        results: list[JobResult] = []
        # JSON of the current chunk only; dropped once it is written.
        rows: list[tuple[str, str]] = []
        payloads: list[tuple[list[Any], dict[str, Any]]] = []  # (args, kwargs) per job

        def write_chunk() -> None:
            inserted = engine.insert_jobs(
                shared, using=using, rows=rows, now=now, database_clock=True, position=len(results),
                after=first[0] if first else None,
            )  # fmt: skip
            if not first:
                first.append(inserted)
            if not makers:  # every chunk's jobs share first[0].enqueued_at
                makers.append(_batch_results(task, self.alias, status, first[0].enqueued_at, trace_id))
            # The arguments are what encode_payload returned, already normalised.
            results.extend(map(makers[0], inserted.texts, *zip(*payloads, strict=True)))
            rows.clear()
            payloads.clear()

        # Pipelined where the driver can: a chunk runs in the database while the next is built.
        with transaction.atomic(using=using), engine.pipelined(using):
            for index, item in enumerate(items):
                args, kwargs = _item_arguments(index, item)
                try:
                    args, kwargs, args_json, kwargs_json = encode_payload(args, kwargs, cap=cap)
                except InvalidTaskArguments as exc:
                    raise type(exc)(f"enqueue_many item {index}: {exc}") from None
                if encrypted:  # checked (and the size cap applied) on the plain JSON, stored encrypted
                    args_json, kwargs_json = map(_json_text, encrypt_arguments(args, kwargs))
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
        self, task: Task, dedup: Dedup, items: Iterable[Any], shared: NewJob
    ) -> list[JobResult]:
        """:meth:`enqueue_many` with ``dedup``: one dedup enqueue per item (``shared`` with the
        item's arguments), in one atomic block."""
        from . import engine  # on first use: see the module's docstring (E001)

        using, cap = self.database, self.settings.MAX_PAYLOAD_BYTES
        results: list[JobResult] = []
        wake = False
        # Pipelined where the driver can: a chunk runs in the database while the next is built.
        with transaction.atomic(using=using), engine.pipelined(using):
            for index, item in enumerate(items):
                args, kwargs = _item_arguments(index, item)
                try:
                    stored_args, stored_kwargs = check_payload(args, kwargs, cap=cap)
                except InvalidTaskArguments as exc:
                    raise type(exc)(f"enqueue_many item {index}: {exc}") from None
                plain = (stored_args, stored_kwargs)
                if "encrypt" in shared.options:
                    stored_args, stored_kwargs = encrypt_arguments(stored_args, stored_kwargs)  # type: ignore[assignment]
                job = replace(shared, args=stored_args, kwargs=stored_kwargs)
                try:
                    result, woke = self._enqueue_deduplicated(task, dedup, job, notify_workers=False, plain=plain)
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
        from .models import Job  # on first use: see the module's docstring (E001)

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
        args, kwargs, errors, return_value = job.args, job.kwargs, job.errors, job.return_value
        if job.options.get("encrypt"):  # stored encrypted: the caller gets the plain values
            args, kwargs, errors, return_value = _decrypted(args, kwargs, errors, return_value)
        result = JobResult(
            task=task,
            id=str(job.id),
            status=to_task_status(job.state),
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            last_attempted_at=job.last_attempted_at,
            finished_at=job.finished_at,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[
                TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"]) for e in errors
            ],
            worker_ids=list(job.worker_ids),
            progress=job.progress,
            trace_id=job.trace_id,
            duplicate=duplicate,
        )
        object.__setattr__(result, "_return_value", return_value)
        return result

    def _result_from_new_job(
        self, job: Any, task: Task, *, plain: tuple[list[Any], dict[str, Any]] | None = None
    ) -> JobResult:
        """The result of a job of ``task`` just inserted (an ``engine.NewRow``), as
        :meth:`_result_from_job` reads it from its ``Job``: not started, no error, no progress.
        ``plain``: the arguments of an encrypted job (its row holds their envelopes)."""
        token = _NORMALIZED.set(True)  # the arguments check_payload returned
        args, kwargs = plain if plain is not None else (job.args, job.kwargs)
        try:
            status = to_task_status(job.state)
            return _new_result(task, self.alias, job.id, status, job.enqueued_at, args, kwargs, job.trace_id)
        finally:
            _NORMALIZED.reset(token)

    # -- checks ------------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        missing = check_app_installed(self.alias)
        if missing:
            return missing  # the checks below would import the models, which cannot load
        from .checks import check_backend  # on first use: see the module's docstring (E001)

        return check_backend(self)


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _decrypted(args: Any, kwargs: Any, errors: Any, return_value: Any) -> tuple[Any, Any, Any, Any]:
    """An encrypted job's stored arguments, errors and return value, decrypted (DecryptionFailed
    when no configured key can)."""
    args, kwargs = decrypt_arguments(args, kwargs)
    if is_encrypted(return_value):  # None until it completed
        return_value = decrypt_json(return_value)
    return args, kwargs, decrypt_errors(errors), return_value


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


def check_app_installed(alias: str) -> list[checks.CheckMessage]:
    """E001: the backend ``alias`` is configured but ``django_jobs`` is not in ``INSTALLED_APPS``.

    Here rather than in :mod:`django_jobs.checks`, which imports the drivers and so the models:
    without the app they raise, so this check must run, and answer, without them."""
    if apps.is_installed("django_jobs"):
        return []
    return [
        checks.Error(
            f"TASKS[{alias!r}] uses django_jobs.backend.JobsBackend but 'django_jobs' is not in INSTALLED_APPS.",
            hint="Add 'django_jobs' to INSTALLED_APPS and run `manage.py migrate`.",
            id="django_jobs.E001",
        )
    ]


# Names defined in django_jobs.spec and imported from here before it existed.
__all__ = [
    "JOB_OPTIONS", "MAX_JSON_DEPTH", "QUEUE_NAME_RE", "JobCall", "JobResult", "JobTask", "JobsBackend", "backoff_path",
    "call", "check_app_installed", "check_json", "check_run_after_bound", "declared_tasks", "max_run_after",
    "normalize_argument", "resolve_task", "stored_run_after", "task_for_job", "validate_job_options",
    "validate_option_types", "validate_queue_name",
]  # fmt: skip

"""``JobsBackend``: Django's Tasks backend that stores jobs in the database.

TASKS = {"default": {"BACKEND": "django_jobs.backend.JobsBackend", "QUEUES": [], "OPTIONS": {}}}
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

from django.core import checks
from django.db import transaction
from django.tasks import Task, TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TASK_REFRESH_ATTRS, TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.module_loading import import_string

from .backoff import validate_backoff
from .conf import get_settings
from .exceptions import InvalidQueueName, InvalidTaskArguments, InvalidTaskOptions, PayloadTooLarge
from .states import to_task_status

QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}$")

#: The options JobTask adds to Django's Task, settable in @task(...) and .using(...).
JOB_OPTIONS = ("max_attempts", "backoff")


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
        return super().__call__(*args, **kwargs)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTask(Task, metaclass=_JobTaskMeta):
    """Django's ``Task`` plus django-jobs options.

    ``max_attempts``: runs at most this many times (``None``: the ``MAX_ATTEMPTS`` setting, 1).
    ``backoff``: delay before a retry: seconds, a list of seconds per attempt (the last value
    is reused), or ``"exponential"`` (full jitter, ``BACKOFF_BASE``/``BACKOFF_CAP``);
    ``None`` uses the ``BACKOFF`` setting.
    """

    max_attempts: int | None = None
    backoff: Any = None

    def using(self, *, priority=None, queue_name=None, run_after=None, backend=None, **options):  # type: ignore[override]
        """A copy of the task with other defaults; accepts the django-jobs options too."""
        unknown = set(options) - set(JOB_OPTIONS)
        if unknown:
            raise TypeError(
                f"Unknown option(s) for using(): {', '.join(sorted(unknown))}. Allowed: priority, "
                f"queue_name, run_after, backend, {', '.join(JOB_OPTIONS)}."
            )
        changes: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        if isinstance(run_after, timedelta):
            # A delay: from now, the moment .using() is called (normally right before enqueue).
            if run_after < timedelta(0):
                raise InvalidTaskOptions(f"run_after as a timedelta must not be negative; got {run_after!r}.")
            run_after = timezone.now() + run_after
        for name, value in (
            ("priority", priority),
            ("queue_name", queue_name),
            ("run_after", run_after),
            ("backend", backend),
        ):
            if value is not None:
                changes[name] = value
        return replace(self, **changes)


def validate_job_options(task: Task) -> None:
    max_attempts = getattr(task, "max_attempts", None)
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
    ):
        raise InvalidTaskOptions(
            f"max_attempts must be an integer >= 1 (or None for the default); got {max_attempts!r}."
        )
    backoff = getattr(task, "backoff", None)
    try:
        validate_backoff(backoff)
    except ValueError as exc:
        raise InvalidTaskOptions(str(exc)) from None
    if callable(backoff):
        backoff_path(backoff)


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


def check_json(value: Any, where: str) -> None:
    """Raise InvalidTaskArguments naming ``where`` unless ``value`` survives a JSON round trip."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidTaskArguments(
                f"{where} contains a NUL character (\\x00), which PostgreSQL cannot store in JSON; remove it "
                "or pass the data base64-encoded."
            )
        return
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidTaskArguments(f"{where} is {value!r}; JSON has no NaN or infinity.")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidTaskArguments(
                    f"{where} has a {type(key).__name__} key {key!r}; JSON object keys must be strings."
                )
            check_json(key, f"a key of {where}")
            check_json(item, f"{where}[{key!r}]")
        return
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


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult(TaskResult):
    """Django's ``TaskResult`` plus what django-jobs stores beside it: ``progress`` (set by a
    running task with ``context.set_progress``)."""

    progress: Any = None

    def refresh(self) -> None:
        self._copy_from(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._copy_from(await self.task.get_backend().aget_result(self.id))

    def _copy_from(self, fresh: TaskResult) -> None:
        for attr in (*TASK_REFRESH_ATTRS, "progress"):
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
        validate_queue_name(task.queue_name)
        super().validate_task(task)
        validate_job_options(task)

    def _check_payload(self, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        if not isinstance(kwargs, dict):
            raise InvalidTaskArguments("kwargs must be a dict.")
        args = list(args)
        for i, value in enumerate(args):
            check_json(value, f"args[{i}]")
        for key, value in kwargs.items():
            check_json(key, "a keyword argument name")
            check_json(value, f"kwargs[{key!r}]")
        size = len(json.dumps(args, ensure_ascii=False).encode()) + len(json.dumps(kwargs, ensure_ascii=False).encode())
        cap = self.settings.MAX_PAYLOAD_BYTES
        if size > cap:
            raise PayloadTooLarge(
                f"The job's arguments are {size} bytes of JSON, over MAX_PAYLOAD_BYTES={cap}; store "
                "large data elsewhere (a model, a file) and pass its key."
            )
        # A real round trip: what the worker will see is exactly what was stored.
        return json.loads(json.dumps(args)), json.loads(json.dumps(kwargs))

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the job in the caller's transaction; ``task_enqueued`` is sent on commit."""
        self.validate_task(task)
        args, kwargs = self._check_payload(args, kwargs)
        max_attempts = getattr(task, "max_attempts", None) or self.settings.MAX_ATTEMPTS
        options: dict[str, Any] = {}
        backoff = getattr(task, "backoff", None)
        if callable(backoff):
            options["backoff_path"] = backoff_path(backoff)
        elif backoff is not None:
            options["backoff"] = list(backoff) if isinstance(backoff, tuple) else backoff
        from . import engine  # models load lazily, so E001 can report a missing app

        job = engine.insert_job(
            using=self.database,
            backend=self.alias,
            task_path=task.module_path,
            queue=task.queue_name,
            priority=task.priority,
            args=args,
            kwargs=kwargs,
            max_attempts=max_attempts,
            options=options,
            run_after=task.run_after,
        )
        result = self._result_from_job(job, task)
        transaction.on_commit(
            lambda: task_enqueued.send(type(self), task_result=result), using=self.database, robust=True
        )
        return result

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

    def _result_from_job(self, job: Any, task: Task | None = None) -> TaskResult:
        if task is None:
            task = task_for_job(job.task_path, job.backend, job.queue, job.priority)
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
        )
        object.__setattr__(result, "_return_value", job.return_value)
        return result

    # -- checks ------------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from .checks import check_backend

        return check_backend(self)


def task_for_job(path: str, backend: str, queue: str, priority: int) -> Task:
    """The Task a job row describes: its function, with the backend, queue and priority it was
    enqueued with (which may differ from the decorator's)."""
    task = resolve_task(path)
    if task.backend != backend or task.queue_name != queue or task.priority != priority:
        task = task.using(backend=backend, queue_name=queue, priority=priority)
    return task


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


__all__ = ["JobResult", "JobTask", "JobsBackend", "resolve_task", "task_for_job"]

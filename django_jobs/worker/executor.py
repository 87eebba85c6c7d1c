"""One job's pipeline: resolve the task -> build the context -> call it -> classify the outcome.

The executor never writes to the database; it returns an :class:`~django_jobs.engine.Outcome`
that the completer writes in a batch. ``task_started`` and ``task_finished`` are sent from here
(``task_finished`` for a failure inside the ``except`` block, so log receivers see the traceback).
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from collections.abc import Callable
from datetime import timedelta
from inspect import iscoroutinefunction
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.module_loading import import_string

from ..backend import JobsBackend, check_json, task_for_job
from ..backoff import compute_backoff
from ..conf import get_settings
from ..context import JobContext
from ..engine import ClaimedJob, Outcome
from ..exceptions import Fail, InvalidTaskArguments, NonJSONReturnValue, Retry, Snooze, TaskNotFound
from ..states import JobState

logger = logging.getLogger("django_jobs.worker")


def error_record(exc: BaseException, attempt: int) -> dict[str, Any]:
    cls = type(exc)
    return {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        "traceback": "".join(traceback.format_exception(exc)),
        "attempt": attempt,
        "at": timezone.now().isoformat(),
    }


class Executor:
    """Runs claimed jobs. One instance per worker; thread-safe (no mutable shared state but
    the task cache, whose races are harmless)."""

    def __init__(self, *, worker_id: str, loop_getter: Callable[[], asyncio.AbstractEventLoop]):
        self.worker_id = worker_id
        self._loop_getter = loop_getter
        self._tasks: dict[tuple[str, str, str, int], Task] = {}

    def _task_for(self, job: ClaimedJob) -> Task:
        key = (job.task_path, job.backend, job.queue, job.priority)
        task = self._tasks.get(key)
        if task is None:
            task = task_for_job(job.task_path, job.backend, job.queue, job.priority)
            self._tasks[key] = task
        return task

    def _result(
        self, job: ClaimedJob, task: Task, status: TaskResultStatus, errors: list[dict[str, Any]]
    ) -> TaskResult:
        return TaskResult(
            task=task,
            id=str(job.id),
            status=status,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            last_attempted_at=job.last_attempted_at,
            finished_at=None,
            args=job.args,
            kwargs=job.kwargs,
            backend=job.backend,
            errors=[
                TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"]) for e in errors
            ],
            worker_ids=list(job.worker_ids),
        )

    def execute(self, job: ClaimedJob) -> Outcome:
        """Run one attempt of ``job`` and say what it came to. Never raises but for
        KeyboardInterrupt; a task's SystemExit is recorded like any other error."""
        try:
            task = self._task_for(job)
        except TaskNotFound as exc:
            logger.error("Job %s failed: %s", job.id, exc)
            return Outcome(
                job_id=job.id, lease_token=job.lease_token, state=JobState.FAILED, error=error_record(exc, job.attempts)
            )
        backend_cls = _backend_class(job.backend)
        result = self._result(job, task, TaskResultStatus.RUNNING, job.errors)
        _send(task_started, backend_cls, result)
        try:
            value = self._call(task, job, result)
            try:
                check_json(value, "the return value")
                value_json = json.dumps(value, allow_nan=False)
            except InvalidTaskArguments as exc:
                raise NonJSONReturnValue(f"{task.module_path} returned a value that is not JSON: {exc}") from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a task's failure (SystemExit too) is recorded
            outcome = self._failure(job, exc)
            errors = [*job.errors, outcome.error] if outcome.error is not None else job.errors
            status = TaskResultStatus.FAILED if outcome.state == JobState.FAILED else TaskResultStatus.READY
            done = self._result(job, task, status, errors)
            object.__setattr__(done, "finished_at", timezone.now() if status == TaskResultStatus.FAILED else None)
            _send(task_finished, backend_cls, done)
            return outcome
        done = self._result(job, task, TaskResultStatus.SUCCESSFUL, job.errors)
        object.__setattr__(done, "finished_at", timezone.now())
        object.__setattr__(done, "_return_value", value)
        _send(task_finished, backend_cls, done)
        return Outcome(
            job_id=job.id, lease_token=job.lease_token, state=JobState.COMPLETED, return_value_json=value_json
        )

    def _call(self, task: Task, job: ClaimedJob, result: TaskResult) -> Any:
        args = list(job.args)
        if task.takes_context:
            context = JobContext(
                task_result=result,
                job_id=str(job.id),
                queue=job.queue,
                max_attempts=job.max_attempts,
                lease_token=job.lease_token,
                database=get_settings(job.backend).DATABASE,
            )
            args.insert(0, context)
        if iscoroutinefunction(task.func):
            # Async tasks share the worker's event loop; this thread holds the job's slot.
            future = asyncio.run_coroutine_threadsafe(task.func(*args, **job.kwargs), self._loop_getter())
            return future.result()
        return task.func(*args, **job.kwargs)

    def _failure(self, job: ClaimedJob, exc: BaseException) -> Outcome:
        """Classify an attempt that raised: Snooze, Fail, Retry, or any other error."""
        ids = {"job_id": job.id, "lease_token": job.lease_token}
        if isinstance(exc, Snooze):
            # Not a failed attempt: the attempt (and its worker id) are taken back.
            logger.info("Job %s snoozed for %.2fs", job.id, exc.seconds)
            return Outcome(**ids, state=JobState.DELAYED, uncount_attempt=True,
                           available_at=timezone.now() + timedelta(seconds=exc.seconds))  # fmt: skip
        recorded = exc.error if isinstance(exc, (Fail, Retry)) and exc.error is not None else exc
        error = error_record(recorded, job.attempts)
        if isinstance(exc, Fail):
            logger.info("Job %s failed by the task on attempt %d: %s", job.id, job.attempts, exc)
            return Outcome(**ids, state=JobState.FAILED, error=error)
        if job.attempts >= job.max_attempts:
            logger.info("Job %s failed for good on attempt %d/%d: %r", job.id, job.attempts, job.max_attempts, exc)
            return Outcome(**ids, state=JobState.FAILED, error=error)
        if isinstance(exc, Retry) and exc.delay is not None:
            delay: float | None = float(exc.delay)
        else:
            delay = self._backoff(job, recorded)
        if delay is None:
            logger.info("Job %s: its backoff stopped the retries after attempt %d.", job.id, job.attempts)
            return Outcome(**ids, state=JobState.FAILED, error=error)
        logger.info(
            "Job %s attempt %d/%d failed (%r); retrying in %.2fs", job.id, job.attempts, job.max_attempts, exc, delay
        )
        if delay <= 0:
            return Outcome(**ids, state=JobState.WAITING, error=error, available_at=timezone.now())
        return Outcome(**ids, state=JobState.DELAYED, error=error,
                       available_at=timezone.now() + timedelta(seconds=delay))  # fmt: skip

    def _backoff(self, job: ClaimedJob, exc: BaseException) -> float | None:
        """Seconds before the next attempt, or None when a callable backoff stops retrying."""
        conf = get_settings(job.backend)
        path = job.options.get("backoff_path")
        backoff = job.options.get("backoff", conf.BACKOFF)
        if path is None and not callable(backoff):
            return compute_backoff(backoff, job.attempts, base=conf.BACKOFF_BASE, cap=conf.BACKOFF_CAP)
        try:
            fn = import_string(path) if path is not None else backoff  # a task's, or the BACKOFF setting's
            delay = fn(job.attempts, exc)
        except Exception:  # noqa: BLE001 - a broken backoff must not lose the job: stop retrying
            logger.exception("Backoff %s raised for job %s; not retrying.", path or backoff, job.id)
            return None
        if delay is None:
            return None
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            logger.error("Backoff %s returned %r for job %s (want seconds >= 0 or None); not retrying.",
                         path or backoff, delay, job.id)  # fmt: skip
            return None
        return float(delay)


def _send(signal: Any, sender: type, task_result: TaskResult) -> None:
    """Send a task signal; a receiver that raises is logged, never fails or repeats the job."""
    for receiver, response in signal.send_robust(sender=sender, task_result=task_result):
        if isinstance(response, Exception):
            logger.error("Signal receiver %r raised for job %s", receiver, task_result.id, exc_info=response)


_backend_classes: dict[str, type] = {}


def _backend_class(alias: str) -> type:
    cls = _backend_classes.get(alias)
    if cls is None:
        from django.tasks import task_backends

        try:
            cls = type(task_backends[alias])
        except Exception:  # noqa: BLE001 - the alias vanished from settings; still send signals
            cls = JobsBackend
        _backend_classes[alias] = cls
    return cls

"""One job's pipeline: resolve the task -> build the context -> call it -> classify the outcome.

The executor never writes to the database; it returns an :class:`~django_jobs.engine.Outcome`
that the completer writes in a batch (an ``atomic=True`` job's completion is written in the
task's own transaction instead, by :mod:`.atomic`). ``task_started`` is sent from here before the task runs;
``task_finished`` once the outcome is stored (:meth:`Executor.send_finished`, called by whoever
wrote it), so a receiver that reads the result back sees the final status.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from inspect import iscoroutinefunction
from typing import Any, NamedTuple

from django.tasks import Task, TaskResult, TaskResultStatus, task_backends
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.module_loading import import_string

from ..backend import JobsBackend, check_json, stored_run_after, task_for_job
from ..backoff import compute_backoff
from ..conf import get_settings
from ..context import JobContext, running_context, slot_setters
from ..dispatch import TaskSignal
from ..engine import ClaimedJob, Outcome
from ..exceptions import (
    DecryptionFailed,
    Fail,
    InvalidTaskArguments,
    JobCancelled,
    JobsConfigurationError,
    JobsError,
    JobTimeout,
    NonJSONReturnValue,
    Retry,
    Snooze,
    TaskNotFound,
)
from ..spec.encryption import decrypt_arguments, decrypt_errors, decrypt_json, encrypt_error, encrypt_json, is_encrypted
from ..spec.tracing import enter_trace, leave_trace
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


class CancelFlag:
    """Whether an attempt was cancelled: ``threading.Event``'s ``set()`` and ``is_set()``, which
    is all an attempt uses of it, without the Condition an Event builds (one per claimed job;
    nobody waits on this flag)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


#: Guards :meth:`Attempt.settle` of every attempt: held for a test-and-set, so one lock serves
#: them all rather than a lock built per claimed job.
_SETTLE_LOCK = threading.Lock()


class Attempt:
    """One running attempt of a job, shared by the thread running it and the worker watching it.

    Exactly one party records the attempt's outcome: the thread that ran it, or the worker when
    it gives the attempt up (timeout, cancel in a child process). :meth:`settle` hands out that
    right once; whoever loses drops its outcome.
    """

    __slots__ = (
        "job", "timeout", "deadline", "started", "cancelled", "future", "in_child", "watched", "_settled",
    )  # fmt: skip

    def __init__(self, job: ClaimedJob, *, timeout: float | None = None, watched: bool = False, in_child: bool = False):
        self.job = job
        self.timeout = timeout
        #: Monotonic time the attempt must end by; set by :meth:`start` (None: not started, or
        #: no timeout).
        self.deadline: float | None = None
        #: Monotonic time the attempt started (None: not yet): its run time is measured from here.
        self.started: float | None = None
        #: Set when the job is cancelled (before or while it runs); ``context.is_cancelled()``
        #: reads it.
        self.cancelled = CancelFlag()
        #: An async task's future, or its handle on the worker's event loop, so a cancel or
        #: timeout can cancel the coroutine (anything with a thread-safe ``cancel()``).
        self.future: concurrent.futures.Future | Any | None = None
        #: Run by a child process (``--isolation process``), which the worker kills instead.
        self.in_child = in_child
        #: A worker delivers cancels to ``cancelled``; otherwise the context asks the database.
        self.watched = watched
        self._settled = False

    def start(self) -> None:
        """The attempt starts now: its timeout and its run time run from here."""
        if self.started is None:
            self.started = time.monotonic()
        if self.timeout:
            self.deadline = time.monotonic() + self.timeout

    def settle(self) -> bool:
        """Claim the right to record this attempt's outcome; True for the first caller only."""
        with _SETTLE_LOCK:
            if self._settled:
                return False
            self._settled = True
            return True

    @property
    def settled(self) -> bool:
        """Whether the right to record the outcome was taken (read it only on the thread that
        may take it)."""
        return self._settled

    def cancel(self) -> None:
        """The job was cancelled: tell the task, and cancel it outright when it is a coroutine."""
        self.cancelled.set()
        future = self.future
        if future is not None:
            future.cancel()

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


class Begun(NamedTuple):
    """An attempt :meth:`Executor.begin` started: its task, and the context to call it with."""

    task: Task
    context: JobContext


def event_loop_thread(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A getter of one event loop, started on first use in a daemon thread, for async tasks."""
    lock = threading.Lock()
    holder: list[asyncio.AbstractEventLoop] = []

    def get() -> asyncio.AbstractEventLoop:
        with lock:
            if not holder:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=name, daemon=True).start()
                holder.append(loop)
            return holder[0]

    get.loop = holder  # type: ignore[attr-defined] - for whoever must stop it
    return get


def job_timeout(job: ClaimedJob) -> float | None:
    timeout = job.options.get("timeout")
    return float(timeout) if timeout else None


#: TaskResult's fields, in the order :func:`_task_result` stores them.
_RESULT_FIELDS = (
    "task", "id", "status", "enqueued_at", "started_at", "last_attempted_at", "args", "kwargs", "backend", "errors",
    "worker_ids", "finished_at", "_return_value",
)  # fmt: skip


_SETTERS = slot_setters(TaskResult, _RESULT_FIELDS)


def _task_result(
    task: Task, job_id: str, status: TaskResultStatus, enqueued_at: Any, started_at: Any, last_attempted_at: Any,
    args: list[Any], kwargs: dict[str, Any], backend: str, errors: list[TaskError], worker_ids: list[str],
) -> TaskResult:  # fmt: skip
    """``TaskResult(...)`` of a claimed job, unfinished, built through its slots: the dataclass's
    ``__init__`` (a guarded setattr per field) and ``__post_init__`` (``normalize_json`` of the
    arguments, which came from JSON already) were a tenth of a no-op job's worker CPU. Equal to
    what the dataclass builds (tested), which it falls back to for a TaskResult with other fields."""
    if _SETTERS is None:
        return TaskResult(
            task=task, id=job_id, status=status, enqueued_at=enqueued_at, started_at=started_at,
            last_attempted_at=last_attempted_at, finished_at=None, args=args, kwargs=kwargs, backend=backend,
            errors=errors, worker_ids=worker_ids,
        )  # fmt: skip
    result = object.__new__(TaskResult)
    for setter, value in zip(
        _SETTERS,
        (task, job_id, status, enqueued_at, started_at, last_attempted_at, args, kwargs, backend, errors, worker_ids,
         None, None),
        strict=True,
    ):  # fmt: skip
        setter(result, value)
    return result


class Executor:
    """Runs claimed jobs. One instance per worker; thread-safe (no mutable shared state but
    the task and middleware caches, whose races are harmless)."""

    def __init__(
        self,
        *,
        worker_id: str,
        loop_getter: Callable[[], asyncio.AbstractEventLoop] | None = None,
        run_async: Callable[[Any, Attempt], Any] | None = None,
    ):
        self.worker_id = worker_id
        self._loop_getter = loop_getter
        #: How a coroutine is run; default: on the worker's event loop thread (the test kit runs
        #: it from the calling thread instead).
        self._run_async = run_async
        self._tasks: dict[tuple[str, str, str, int], Task] = {}
        self._chains: dict[tuple[str, Any], Callable[[JobContext], Any]] = {}
        # The TaskResult each running attempt was started with, by id() of its ClaimedJob (kept
        # in the value, so the id cannot be reused meanwhile): task_finished sends that same
        # result, finished, as Django's backends do, rather than building a second one.
        self._started: dict[int, tuple[ClaimedJob, TaskResult]] = {}
        self._async_funcs: dict[Any, bool] = {}
        self._on_loop: dict[tuple[str, str], bool] = {}

    def _task_for(self, job: ClaimedJob) -> Task:
        run_after = stored_run_after(job.options)
        if run_after is not None:
            # Not cached: nearly every deferred job has its own time.
            return task_for_job(job.task_path, job.backend, job.queue, job.priority, run_after)
        key = (job.task_path, job.backend, job.queue, job.priority)
        task = self._tasks.get(key)
        if task is None:
            task = task_for_job(job.task_path, job.backend, job.queue, job.priority)
            self._tasks[key] = task
        return task

    def chain_for(self, backend: str) -> Callable[[JobContext], Any]:
        """The ``MIDDLEWARE`` of ``backend`` wrapped around the task call, built once (outermost
        first, like Django's). Raises JobsConfigurationError for a path that does not import or a
        factory that does not return a callable."""
        paths = get_settings(backend).MIDDLEWARE
        key = (backend, tuple(paths) if isinstance(paths, (list, tuple)) else paths)
        chain = self._chains.get(key)  # keyed on the paths too: tests override the setting
        if chain is None:
            chain = build_middleware_chain(paths, self._invoke)
            self._chains[key] = chain
        return chain

    def _result(
        self, job: ClaimedJob, task: Task, status: TaskResultStatus, errors: list[dict[str, Any]]
    ) -> TaskResult:
        return _task_result(
            task,
            str(job.id),
            status,
            job.enqueued_at,
            job.started_at,
            job.last_attempted_at,
            job.args,
            job.kwargs,
            job.backend,
            [_task_error(e) for e in errors] if errors else [],
            list(job.worker_ids),
        )

    def execute(self, job: ClaimedJob, attempt: Attempt) -> Outcome | None:
        """Run one attempt of ``job`` and say what it came to. Never raises but for
        KeyboardInterrupt; a task's SystemExit is recorded like any other error.

        Returns None when the worker gave the attempt up meanwhile (see :meth:`give_up`): its
        late outcome is dropped and logged. The outcome carries the attempt's run time.
        """
        return with_runtime(attempt, self._execute(job, attempt))

    def _execute(self, job: ClaimedJob, attempt: Attempt) -> Outcome | None:
        begun = self.begin(job, attempt)
        if not isinstance(begun, Begun):
            return begun
        # Jobs the task enqueues inherit its trace id (middleware sees it too). Not a `with`
        # block: a generator context manager per job was a tenth of the executor's own CPU.
        token = enter_trace(job.trace_id)
        try:
            try:
                value = self.chain_for(job.backend)(begun.context)
            finally:
                leave_trace(token)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a task's failure (SystemExit too) is recorded
            return self.conclude(job, attempt, begun.task, exc=exc)
        return self.conclude(job, attempt, begun.task, value=value)

    def begin(self, job: ClaimedJob, attempt: Attempt) -> Begun | Outcome | None:
        """Start an attempt: resolve its task, send ``task_started`` and build its context.
        Returns the :class:`Begun` attempt to call, or its outcome when it ends here (cancelled
        before it started, a task that does not resolve; None when that outcome was recorded
        by someone else). Call it from a thread without a running event loop: receivers of
        ``task_started`` may use the ORM."""
        if attempt.deadline is None:
            attempt.start()
        if attempt.cancelled.is_set():
            # Cancelled after the claim, before it started: do not run it at all.
            return self.give_up(attempt, JobCancelled(f"Job {job.id} was cancelled before it started."))
        try:
            task = self._task_for(job)
        except TaskNotFound as exc:
            logger.debug("Job %s failed: %s", job.id, exc)  # its outcome line says so (outcome_log)
            if not attempt.settle():
                return None
            return outcome_for(job, state=JobState.FAILED, error=error_record(exc, job.attempts))
        if job.options.get("encrypt"):
            try:
                open_encrypted(job)
            except (DecryptionFailed, JobsConfigurationError) as exc:
                # A key missing here: the job fails (retry it once the keys are right), the worker goes on.
                logger.debug("Job %s failed: %s", job.id, exc)
                if not attempt.settle():
                    return None
                return outcome_for(job, state=JobState.FAILED, error=error_record(exc, job.attempts))
        backend_cls = backend_class(job.backend)
        result = self._result(job, task, TaskResultStatus.RUNNING, job.errors)
        self._started[id(job)] = (job, result)
        _send(task_started, backend_cls, result)
        try:
            context = running_context(
                result,
                result.id,  # str(job.id)
                job.queue,
                job.max_attempts,
                str(job.parent_id) if job.parent_id is not None else None,
                getattr(job, "partition_key", None),
                job.lease_token,
                get_settings(job.backend).DATABASE,
                attempt,
            )
        except Exception as exc:  # noqa: BLE001 - recorded on the job, like a task's error
            return self.conclude(job, attempt, task, exc=exc)
        return Begun(task, context)

    def conclude(
        self, job: ClaimedJob, attempt: Attempt, task: Task, *, value: Any = None, exc: BaseException | None = None
    ) -> Outcome | None:
        """The outcome of an attempt that returned ``value`` or raised ``exc``: completed with a
        JSON return value, or classified (:meth:`_failure`). None when the worker gave the
        attempt up meanwhile (its late outcome is logged and dropped)."""
        if exc is None:
            try:
                if value is None:  # most tasks return nothing
                    value_json = "null"
                else:
                    try:
                        check_json(value, "the return value")
                    except InvalidTaskArguments as bad:
                        raise NonJSONReturnValue(
                            f"{task.module_path} returned a value that is not JSON: {bad}"
                        ) from None
                    if job.options.get("encrypt"):
                        value = encrypt_json(value)
                    value_json = _JSON_ENCODER.encode(value)
            except Exception as bad:  # noqa: BLE001 - NonJSONReturnValue, or what the encoder raised
                exc = bad
        if exc is not None:
            if not attempt.settle():
                return self._late(job, f"failed with {exc!r}")
            return self.failure(job, exc)
        if not attempt.settle():
            return self._late(job, "completed")
        return outcome_for(job, state=JobState.COMPLETED, return_value_json=value_json)

    def give_up(self, attempt: Attempt, exc: JobsError) -> Outcome | None:
        """Record ``attempt`` as failed with ``exc`` (a timeout, or a cancel or death in a child
        process) unless its own outcome was recorded first; None then."""
        return with_runtime(attempt, self._give_up(attempt, exc))

    def _give_up(self, attempt: Attempt, exc: JobsError) -> Outcome | None:
        if not attempt.settle():
            return None
        return self.failure(attempt.job, exc)

    def send_finished(self, outcome: Outcome, state: str) -> None:
        """Send ``task_finished`` for ``outcome``, which was just stored as ``state``: call it after
        the commit, so a receiver reading the result back (``get_result()``, ``refresh()``) sees
        what the signal says. The result carries the stored values: the normalised return value
        (a returned tuple arrives as a list) and the database's ``finished_at``. For an attempt
        that raised, it is sent while that exception is being handled, as Django's backends do,
        so receivers (Django's own log receiver among them) see it in ``sys.exc_info()``.
        """
        job = outcome.job
        if job is None:
            return  # an outcome built outside the executor (tests): no task result to report
        status = _STATUS_OF.get(state, TaskResultStatus.READY)
        started = self._started.pop(id(job), None)
        if started is not None:
            done = started[1]
            object.__setattr__(done, "status", status)
            if outcome.error is not None:
                done.errors.append(_task_error(outcome.error))
        else:  # run in a child process (--isolation process), or given up before it started
            try:
                task = self._task_for(job)
            except Exception:  # noqa: BLE001 - TaskNotFound, or a stored queue the task no longer accepts
                # Nothing to build a TaskResult from; the outcome itself is recorded on the job.
                logger.debug("No task_finished for job %s: its task does not resolve.", job.id, exc_info=True)
                return
            if job.options.get("encrypt"):
                try:
                    open_encrypted(job)  # the child process decrypted its own copy
                except (DecryptionFailed, JobsConfigurationError):
                    logger.debug("No task_finished for job %s: its arguments do not decrypt.", job.id, exc_info=True)
                    return
            errors = [*job.errors, outcome.error] if outcome.error is not None else job.errors
            done = self._result(job, task, status, errors)
        if outcome.uncount_attempt:
            object.__setattr__(done, "worker_ids", done.worker_ids[:-1])  # a snooze takes its attempt back
        object.__setattr__(done, "finished_at", outcome.finished_at)
        value_json = outcome.return_value_json
        if state == JobState.COMPLETED and value_json is not None and value_json != "null":  # None: as it is
            value = json.loads(value_json)
            if job.options.get("encrypt") and is_encrypted(value):
                value = decrypt_json(value)
            object.__setattr__(done, "_return_value", value)
        sender = backend_class(job.backend)
        exc = outcome.exc
        if exc is None:
            _send(task_finished, sender, done)
            return
        try:
            raise exc
        except BaseException:  # noqa: BLE001 - re-raised only so receivers see it in exc_info
            _send(task_finished, sender, done)

    def _late(self, job: ClaimedJob, what: str) -> None:
        logger.warning(
            "Job %s %s after the worker had given it up (timed out); this late outcome is discarded.", job.id, what
        )
        # The give-up's task_finished may have been sent already; if not, it builds its own result.
        self._started.pop(id(job), None)
        return None

    def forget(self, outcome: Outcome) -> None:
        """``outcome`` was not stored (its lease was lost): no task_finished will be sent for it;
        drop the result it was started with."""
        if outcome.job is not None:
            self._started.pop(id(outcome.job), None)

    def _is_async(self, func: Any) -> bool:
        """``iscoroutinefunction(func)``, asked once per function (inspect's answer is dear)."""
        answer = self._async_funcs.get(func)
        if answer is None:
            answer = self._async_funcs[func] = iscoroutinefunction(func)
        return answer

    def runs_on_loop(self, job: ClaimedJob) -> bool:
        """Whether an attempt of ``job`` can run as a task on the worker's event loop, holding no
        thread: its task is an ``async def`` and its backend has no ``MIDDLEWARE`` (a middleware
        is a plain function around ``call_next``, which needs a thread to block in)."""
        if get_settings(job.backend).MIDDLEWARE:
            return False
        key = (job.task_path, job.backend)
        answer = self._on_loop.get(key)  # asked for every claimed job: a dict look-up
        if answer is None:
            try:
                task = self._task_for(job)
            except Exception:  # noqa: BLE001 - TaskNotFound and the like: the thread path records it
                return False
            answer = self._on_loop[key] = self._is_async(task.func)
        return answer

    def coroutine_for(self, context: JobContext) -> Any:
        """The coroutine of an ``async def`` task's attempt, not yet started (raises TypeError for
        arguments the function does not take)."""
        result = context.task_result
        args = [context, *result.args] if result.task.takes_context else result.args
        return result.task.func(*args, **result.kwargs)

    def _invoke(self, context: JobContext) -> Any:
        """The innermost handler of the middleware chain: call the task."""
        result = context.task_result
        task = result.task
        attempt: Attempt = context.attempt_state
        args = [context, *result.args] if task.takes_context else result.args
        if not self._is_async(task.func):
            return task.func(*args, **result.kwargs)
        if self._run_async is not None:
            return self._run_async(task.func(*args, **result.kwargs), attempt)
        # Async tasks share the worker's event loop; this thread holds the job's slot and waits.
        # run_coroutine_threadsafe copies this thread's contextvars into the task, so what a
        # middleware sets (a tenant, a trace span) is seen by the coroutine.
        assert self._loop_getter is not None, "an Executor without run_async needs a loop_getter"
        future = asyncio.run_coroutine_threadsafe(task.func(*args, **result.kwargs), self._loop_getter())
        attempt.future = future
        if attempt.cancelled.is_set():
            future.cancel()
        try:
            return future.result(timeout=attempt.remaining())
        except TimeoutError:
            if future.done():
                raise  # the coroutine's own TimeoutError
            future.cancel()
            raise JobTimeout(
                f"{task.module_path} ran longer than its timeout of {attempt.timeout:g}s; the coroutine was cancelled."
            ) from None
        except concurrent.futures.CancelledError:
            raise JobCancelled(
                f"Job {context.job_id} was cancelled while it ran; the coroutine was cancelled."
            ) from None

    def failure(self, job: ClaimedJob, exc: BaseException) -> Outcome:
        """Classify an attempt that raised: Snooze, Fail, Retry, or any other error. The caller
        holds the right to record the attempt (:meth:`Attempt.settle`)."""
        ids = {
            "job_id": job.id,
            "lease_token": job.lease_token,
            "queue": job.queue,
            "attempt": job.attempts,
            "has_parent": job.parent_id is not None,
            "retention": job.options.get("retention"),
            "job": job,
            "exc": exc,
        }
        # The lines here are DEBUG: the worker logs each outcome once it is stored (outcome_log).
        if isinstance(exc, Snooze):
            # Not a failed attempt: the attempt (and its worker id) are taken back.
            logger.debug("Job %s snoozed for %.2fs", job.id, exc.seconds)
            return Outcome(**ids, state=JobState.DELAYED, uncount_attempt=True,
                           available_at=timezone.now() + timedelta(seconds=exc.seconds))  # fmt: skip
        recorded = exc.error if isinstance(exc, (Fail, Retry)) and exc.error is not None else exc
        error = error_record(recorded, job.attempts)
        if job.options.get("encrypt") and type(job.args) is list:  # opened, so the keys work here
            error = encrypt_error(error)  # the message may quote the arguments
        if isinstance(exc, Fail):
            logger.debug("Job %s failed by the task on attempt %d: %s", job.id, job.attempts, exc)
            return Outcome(**ids, state=JobState.FAILED, error=error)
        if job.attempts >= job.max_attempts:
            logger.debug("Job %s failed for good on attempt %d/%d: %r", job.id, job.attempts, job.max_attempts, exc)
            return Outcome(**ids, state=JobState.FAILED, error=error)
        if isinstance(exc, Retry) and exc.delay is not None:
            delay: float | None = float(exc.delay)
        else:
            delay = self._backoff(job, recorded)
        if delay is None:
            logger.debug("Job %s: its backoff stopped the retries after attempt %d.", job.id, job.attempts)
            return Outcome(**ids, state=JobState.FAILED, error=error)
        logger.debug(
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


#: Django's status of a job stored in each state (a job cancelled while it ran is FAILED to Django).
_STATUS_OF = {
    JobState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}


#: json.dumps(value, allow_nan=False) builds this encoder on every call.
_JSON_ENCODER = json.JSONEncoder(allow_nan=False)


def _task_error(error: dict[str, Any]) -> TaskError:
    traceback = error["traceback"]
    if is_encrypted(traceback):  # an encrypted job's (a plain traceback is text)
        traceback = decrypt_json(traceback)
    return TaskError(exception_class_path=error["exception_class_path"], traceback=traceback)


def open_encrypted(job: ClaimedJob) -> None:
    """Decrypt an encrypted job's arguments and earlier errors in place, once: the task, the
    middleware and the signals see the plain values; its outcome is encrypted again
    (return value, traceback). Raises DecryptionFailed, or a JobsConfigurationError when no key
    (or no cryptography) is configured."""
    if type(job.args) is dict:  # still the envelope: arguments are a list once decrypted
        args, kwargs = decrypt_arguments(job.args, job.kwargs)
        job.errors = decrypt_errors(job.errors)
        job.args, job.kwargs = args, kwargs


_SIGNALS = {task_started: TaskSignal(task_started), task_finished: TaskSignal(task_finished)}


def _send(signal: Any, sender: type, task_result: TaskResult) -> None:
    """Send a task signal; a receiver that raises is logged, never fails or repeats the job."""
    _SIGNALS[signal].send(sender, task_result)


def with_runtime(attempt: Attempt, outcome: Outcome | None) -> Outcome | None:
    """``outcome`` with the attempt's run time (the Metric and event ``runtime_ms``)."""
    if outcome is not None and attempt.started is not None and outcome.runtime_ms is None:
        outcome.runtime_ms = round((time.monotonic() - attempt.started) * 1000)
    return outcome


def outcome_for(job: ClaimedJob, **fields: Any) -> Outcome:
    """An Outcome of ``job``'s current attempt (the fields every outcome carries, plus ``fields``)."""
    return Outcome(
        job_id=job.id,
        lease_token=job.lease_token,
        queue=job.queue,
        attempt=job.attempts,
        has_parent=job.parent_id is not None,
        retention=job.options.get("retention"),
        job=job,
        **fields,
    )


def build_middleware_chain(paths: Any, innermost: Callable[[JobContext], Any]) -> Callable[[JobContext], Any]:
    """Wrap ``innermost`` in the middleware factories named by ``paths``, the first outermost.

    A middleware is Django-style: ``factory(call_next) -> handler``, and ``handler(context)``
    returns the task's return value or raises; ``context`` is the attempt's JobContext.
    """
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)):
        raise JobsConfigurationError(f"MIDDLEWARE must be a list of dotted paths; got {paths!r}.")
    handler = innermost
    for path in reversed(paths):
        if not isinstance(path, str):
            raise JobsConfigurationError(f"MIDDLEWARE entries are dotted paths (strings); got {path!r}.")
        try:
            factory = import_string(path)
        except ImportError as exc:
            raise JobsConfigurationError(f"MIDDLEWARE entry {path!r} does not import: {exc}") from None
        if not callable(factory):
            raise JobsConfigurationError(f"MIDDLEWARE entry {path!r} is not callable; it must be a factory.")
        try:
            handler = factory(handler)
        except Exception as exc:
            raise JobsConfigurationError(
                f"MIDDLEWARE entry {path!r} raised while being set up: {type(exc).__name__}: {exc}"
            ) from exc
        if not callable(handler):
            raise JobsConfigurationError(
                f"MIDDLEWARE entry {path!r} returned {handler!r}; a middleware factory must return a callable "
                "handler(context)."
            )
    return handler


_backend_classes: dict[str, type] = {}


def backend_class(alias: str) -> type:
    cls = _backend_classes.get(alias)
    if cls is None:
        try:
            cls = type(task_backends[alias])
        except Exception:  # noqa: BLE001 - the alias vanished from settings; still send signals
            cls = JobsBackend
        _backend_classes[alias] = cls
    return cls

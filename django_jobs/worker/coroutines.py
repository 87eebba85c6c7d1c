"""Attempts of ``async def`` tasks run as tasks on the worker's event loop, holding no thread.

An executor thread that waits for a coroutine only holds a slot: 100 concurrent I/O-bound
coroutine jobs would park 100 threads and pay a thread hand-off per job. So the producer hands
the attempts of ``async def`` tasks whose backend has no ``MIDDLEWARE`` here
(:meth:`Executor.runs_on_loop <.executor.Executor.runs_on_loop>`), and each runs as an
``asyncio`` task on the worker's one event loop thread. The slot accounting is the producer's
as for any job: an attempt counts from its claim until :meth:`Producer.finish` takes its
outcome to the completer.

The edges stay on a plain thread: :meth:`LoopRunner.start` runs on the producer thread, where
``task_started`` is sent and the context built (receivers may use the ORM, which Django refuses
inside a running event loop); ``task_finished`` is sent by the completer after the commit, as
for every job. On the loop run only the coroutine and the classification of what it came to.

A timeout or a cancel cancels the coroutine and records the attempt at once (``JobTimeout``,
``JobCancelled``); :class:`.executor.Attempt` hands out the right to record it once, so the
coroutine's own end, when it comes, is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from .. import engine
from ..exceptions import JobCancelled, JobTimeout
from ..spec.tracing import context_running
from ..states import JobState
from .executor import Attempt, Begun, Executor, error_record, outcome_for

logger = logging.getLogger("django_jobs.worker")

#: Begun attempts go to the loop in chunks of this many: each hand-off wakes the loop (a write
#: to its self-pipe), but the first coroutines of a large claim should not wait for the last
#: ones' task_started.
START_CHUNK = 8


class LoopTask:
    """An attempt's handle on the event loop (``Attempt.future``): ``cancel()`` may be called
    from any thread (the listener's or the maintainer's cancels)."""

    __slots__ = ("attempt", "context", "runner", "task", "task_ref", "timer")

    def __init__(self, runner: LoopRunner, attempt: Attempt):
        self.runner = runner
        self.attempt = attempt
        # What Executor.begin returned (producer thread): the task and the attempt's context.
        self.task_ref: Any = None
        self.context: Any = None
        self.task: asyncio.Task | None = None  # its asyncio task, once started on the loop
        self.timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        self.runner.loop.call_soon_threadsafe(self.runner.cancelled, self)


class LoopRunner:
    """Runs the attempts of ``async def`` tasks on the event loop that ``loop_getter`` returns.
    ``finish(attempt, outcome)`` takes each attempt's outcome, None when another party recorded
    it (on the loop thread, or on the producer thread for an attempt that ended before it
    started); it must be thread-safe."""

    def __init__(
        self,
        *,
        executor: Executor,
        loop_getter: Callable[[], asyncio.AbstractEventLoop],
        finish: Callable[[Attempt, engine.Outcome | None], None],
    ):
        self._executor = executor
        self._loop_getter = loop_getter
        self._finish = finish
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: set[LoopTask] = set()  # started on the loop, not ended (loop thread only)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = self._loop_getter()
        return loop

    def start(self, attempts: list[Attempt]) -> None:
        """Begin ``attempts`` (producer thread: ``task_started``, the context) and start their
        coroutines on the loop, all in one hand-off."""
        begun: list[LoopTask] = []
        for attempt in attempts:
            handle = LoopTask(self, attempt)
            # Set before the attempt starts its clock: the watchdog leaves attempts with a
            # future alone (their deadline is the loop's to enforce), and cancels reach it.
            attempt.future = handle
            try:
                result = self._executor.begin(attempt.job, attempt)
            except Exception as exc:  # noqa: BLE001 - not the task's error: ours; fail the job
                self._finish(attempt, self._internal_failure(attempt, exc))
                continue
            if not isinstance(result, Begun):
                self._finish(attempt, result)
                continue
            handle.task_ref, handle.context = result
            begun.append(handle)
            if len(begun) == START_CHUNK:
                self.loop.call_soon_threadsafe(self._run, begun)
                begun = []
        if begun:
            self.loop.call_soon_threadsafe(self._run, begun)

    # -- on the loop thread -----------------------------------------------------------------------

    def _run(self, handles: list[LoopTask]) -> None:
        loop = self.loop
        for handle in handles:
            attempt = handle.attempt
            job = attempt.job
            if attempt.cancelled.is_set():
                self._finish(attempt, self._executor.give_up(attempt, JobCancelled(
                    f"Job {job.id} was cancelled before it started.")))  # fmt: skip
                continue
            try:
                coroutine = self._executor.coroutine_for(handle.context)
            except Exception as exc:  # noqa: BLE001 - arguments the function does not take: the task's error
                self._finish(attempt, self._executor.conclude(job, attempt, handle.task_ref, exc=exc))
                continue
            # Jobs the coroutine enqueues inherit its trace id.
            task = loop.create_task(coroutine, context=context_running(job.trace_id))
            handle.task = task
            self._running.add(handle)
            remaining = attempt.remaining()
            if remaining is not None:
                handle.timer = loop.call_later(remaining, self._expired, handle)
            task.add_done_callback(lambda _task, handle=handle: self._done(handle))

    def _done(self, handle: LoopTask) -> None:
        """The coroutine ended: record what it came to, unless the attempt was given up."""
        attempt = handle.attempt
        if handle.timer is not None:
            handle.timer.cancel()
        task = handle.task
        assert task is not None
        self._running.discard(handle)
        try:
            self._record(handle, task)
        finally:
            # The attempt and its handle point at each other: cut the cycle, so both are freed
            # by reference counting rather than by a later cyclic collection (a worker's peak
            # memory grew by the attempts of a few thousand jobs). Only now: while an attempt
            # has a future, the watchdog leaves it alone, and it is no longer watched only once
            # its outcome went to the producer.
            attempt.future = None
            handle.task = handle.timer = None

    def _record(self, handle: LoopTask, task: asyncio.Task) -> None:
        attempt = handle.attempt
        if task.cancelled():
            # Given up (a timeout, a cancel: on this thread), its outcome recorded: nothing more
            # to say. Otherwise the coroutine cancelled itself, an error like any other.
            if not attempt.settled:
                self._finish(attempt, self._executor.conclude(
                    attempt.job, attempt, handle.task_ref, exc=asyncio.CancelledError()))  # fmt: skip
            return
        exc = task.exception()
        try:
            if exc is None:
                outcome = self._executor.conclude(attempt.job, attempt, handle.task_ref, value=task.result())
            else:
                outcome = self._executor.conclude(attempt.job, attempt, handle.task_ref, exc=exc)
        except Exception as bug:  # noqa: BLE001 - not the task's error: ours; fail the job
            outcome = self._internal_failure(attempt, bug)
        if outcome is not None:
            self._finish(attempt, outcome)

    def _expired(self, handle: LoopTask) -> None:
        """The attempt ran past its timeout: cancel the coroutine and record the attempt now."""
        attempt = handle.attempt
        if handle.task is not None:
            handle.task.cancel()
        outcome = self._executor.give_up(attempt, JobTimeout(
            f"{attempt.job.task_path} ran longer than its timeout of {attempt.timeout:g}s; "
            "the coroutine was cancelled."))  # fmt: skip
        if outcome is not None:
            self._finish(attempt, outcome)

    def cancelled(self, handle: LoopTask) -> None:
        """The job was cancelled while it ran (or waits to start on the loop): cancel the
        coroutine and record the attempt now. Before it started, :meth:`_run` records it."""
        if handle.task is None:
            return
        handle.task.cancel()
        attempt = handle.attempt
        outcome = self._executor.give_up(attempt, JobCancelled(
            f"Job {attempt.job.id} was cancelled while it ran; the coroutine was cancelled."))  # fmt: skip
        if outcome is not None:
            self._finish(attempt, outcome)

    def cancel_running(self, timeout: float = 2.0) -> int:
        """Shutdown, once the grace period is over: cancel the coroutines still running, whose
        jobs the worker then releases (their outcomes are not recorded). How many were
        cancelled. Waits up to ``timeout`` for the loop to do it."""
        loop = self._loop
        if loop is None:
            return 0
        cancelled: list[int] = []
        done = threading.Event()

        def cancel_all() -> None:
            n = 0
            for handle in list(self._running):
                if handle.task is not None and handle.attempt.settle():  # so no outcome follows
                    handle.task.cancel()
                    n += 1
            cancelled.append(n)
            done.set()

        loop.call_soon_threadsafe(cancel_all)
        done.wait(timeout)
        return cancelled[0] if cancelled else 0

    def _internal_failure(self, attempt: Attempt, exc: BaseException) -> engine.Outcome | None:
        # Fail the job rather than release it, which would run it into the same bug forever.
        logger.error("Running job %s failed inside django-jobs; failing the job.", attempt.job.id, exc_info=exc)
        if not attempt.settle():
            return None
        return outcome_for(attempt.job, state=JobState.FAILED, error=error_record(exc, attempt.job.attempts))

"""The watchdog: timeouts and cancels of the attempts this worker runs.

A Python thread cannot be killed. The watchdog thread gives up an attempt of a sync task that
runs past its timeout: it records the attempt as failed, frees its slot and starts a new
executor thread; the old one runs on and its late outcome is discarded. Cancels (from the
listener's NOTIFY, or from the maintainer's poll) reach an attempt here, even before it starts:
threads see ``is_cancelled()``, coroutines are cancelled, child processes killed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import engine
from ..exceptions import JobTimeout, WorkerCrashed
from .executor import Attempt, Executor
from .holdings import Attempts
from .producer import Producer
from .stats import WorkerStats

logger = logging.getLogger("django_jobs.worker")


class Watchdog:
    """Watches ``attempts`` until ``done`` is set. A timed-out attempt's outcome goes through
    ``producer.finish``, and ``spawn_executor`` starts the thread that takes its slot. A failure
    of the watchdog itself is handed to ``on_crash``: without it no timeout holds."""

    def __init__(
        self,
        *,
        using: str,
        worker_id: str,
        attempts: Attempts,
        producer: Producer,
        executor: Executor,
        stats: WorkerStats,
        spawn_executor: Callable[[], None],
        done: threading.Event,
        on_crash: Callable[[WorkerCrashed], None],
    ):
        self.using = using
        self.worker_id = worker_id
        self._attempts = attempts
        self._producer = producer
        self._executor = executor
        self.stats = stats
        self._spawn_executor = spawn_executor
        self._done = done
        self._on_crash = on_crash

    def run(self) -> None:
        """The watchdog thread: give up attempts of sync tasks run by threads that are past their
        deadline. (An async task's deadline is enforced by the thread waiting for it or by the
        event loop; a child process's thread kills the child.)"""
        while not self._done.wait(0.05):
            now = time.monotonic()
            # Also here, not only at the producer's waits: the producer may be held in a slow
            # claim or a database outage while claimed jobs wait behind a long one.
            self._producer.spread()
            due = self._attempts.due(now)
            for attempt in due:
                try:
                    self._time_out(attempt)
                except Exception as exc:  # noqa: BLE001 - without the watchdog no timeout holds: stop
                    crash = WorkerCrashed(f"The watchdog failed ({type(exc).__name__}: {exc}); stopping.")
                    logger.exception("Worker %s: the watchdog failed; stopping the worker.", self.worker_id)
                    self._on_crash(crash)
                    return

    def _time_out(self, attempt: Attempt) -> None:
        job = attempt.job
        error = JobTimeout(
            f"{job.task_path} ran longer than its timeout of {attempt.timeout:g}s. Its thread cannot be "
            "stopped and was left running; whatever it returns later is discarded."
        )
        outcome = self._executor.give_up(attempt, error)
        if outcome is None:
            return  # it finished at the same moment: its own outcome stands
        self._attempts.discard(attempt)
        self.stats.timed_out += 1
        logger.warning(
            "Job %s ran past its timeout of %gs: recorded as %s. Its thread cannot be stopped and "
            "runs on; a new thread takes its slot (use --isolation process to kill such jobs).",
            job.id,
            attempt.timeout,
            outcome.state,
        )
        self._producer.finish(outcome)  # first: the outcome must be recorded whatever happens next
        self._spawn_executor()

    def on_cancel(self, job_id: Any) -> None:
        """A running job of ours was cancelled: tell its attempt (threads see is_cancelled(),
        coroutines are cancelled, child processes killed)."""
        attempt = self._attempts.get(job_id)  # None: another worker's job, or already ended
        if attempt is not None and not attempt.cancelled.is_set():
            logger.debug("Job %s was cancelled while running.", job_id)
            attempt.cancel()

    def poll_cancels(self) -> None:
        """Ask the database for cancels of the jobs this worker runs (the maintainer calls it
        when no NOTIFY tells it)."""
        if self._attempts:
            for job_id in engine.cancel_requested_ids(using=self.using, worker_id=self.worker_id):
                self.on_cancel(job_id)

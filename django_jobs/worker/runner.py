"""The worker: a Python object first; ``manage.py runworker`` only parses options and calls it.

Threads of one worker process:

* the **producer** (the thread calling :meth:`Worker.run`) claims as many jobs as there are
  free slots and hands them to the executor threads, a claim at a time (see
  :mod:`.producer`); when nothing is ready it sleeps until a NOTIFY, a freed slot, or the
  jittered poll interval;
* ``concurrency`` **executor** threads each run one job at a time; ``async def`` tasks run as
  tasks on one event loop thread instead, holding no thread (:mod:`.coroutines`), unless the
  backend has middleware, which needs a thread to block in: then the executor thread waits;
* the **completer** writes outcomes in batches, guarded on each job's lease (:mod:`.completer`);
* the **maintainer** renews leases and the heartbeat, looks for cancelled running jobs, and runs
  the services (promoter, rescuer, reaper, dedup sweeper, partition sweeper, scheduler, pruner;
  :mod:`.maintainer`);
* the **watchdog** gives up attempts that run past their timeout: it records them as failed,
  frees their slot and starts a new executor thread (a Python thread cannot be killed; the old
  one runs on and its late outcome is discarded; :mod:`.watchdog`);
* on PostgreSQL, the **listener** holds a dedicated connection that LISTENs for new jobs and
  for cancels of running ones (:mod:`.listener`).

With ``isolation="process"`` each executor thread runs its jobs in a child process instead
(:mod:`django_jobs.worker.isolation`), which is killed at the job's deadline or cancel.

This module keeps the :class:`Worker` facade: its options, the threads, signals, shutdown and
the statistics; the collaborators above each hold their own state.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, close_old_connections, connections

from .. import engine
from ..conf import get_settings
from ..db import is_transient
from ..drivers import driver
from ..exceptions import JobsConfigurationError, WorkerCrashed
from ..signals import job_cancelled, job_retried, job_snoozed, send_job_signal, worker_started, worker_stopped
from ..states import JobState
from .atomic import execute_atomic
from .completer import Completer
from .consumer import Consumer, select_subscribers
from .coroutines import LoopRunner
from .executor import Attempt, Executor, error_record, event_loop_thread, outcome_for, with_runtime
from .holdings import Attempts, Leases
from .isolation import ChildProcess, Children
from .listener import CHANNEL_RE, Listener
from .log_lines import batched as batched_lines
from .maintainer import Maintainer
from .options import (
    DEFAULT_PREFETCH,
    MAX_WAIT_SECONDS,
    InvalidWorkerOption,
    check_declarations,
    check_options,
    default_worker_id,
    require_seconds,
)
from .outcome_log import log_outcome
from .producer import Producer
from .stats import OutcomeObserver, WorkerStats
from .stop_signals import StopRequests, install_stop_handler, signal_relay
from .trouble import close_connection, crashed, db_trouble
from .watchdog import Watchdog

# What runworker, the tests and users import from here; the options and the stats have modules of their own.
__all__ = ["DEFAULT_PREFETCH", "MAX_WAIT_SECONDS", "InvalidWorkerOption", "Worker", "WorkerStats"]

logger = logging.getLogger("django_jobs.worker")


class Worker:
    """Runs jobs from the database until stopped.

    ``queues``: names to take jobs from (``None`` or ``["*"]``: all). ``concurrency``: jobs at
    once (threads). ``stop_when_empty``: stop once no waiting, delayed or active job is left in
    those queues. ``max_jobs``/``max_time``: stop after that many jobs/seconds. ``sleep``: idle
    poll interval (default ``POLL_INTERVAL``). ``grace``: seconds running jobs get to finish on
    shutdown before they are released back to waiting. ``handle_signals``: install SIGTERM/SIGINT
    handlers (only possible from the main thread). ``isolation``: ``"thread"`` (default) runs
    jobs in this process's threads; ``"process"`` runs each slot's jobs in a child process that
    is killed at a job's timeout or cancel. ``topics``: the topics whose subscribers this worker
    runs (bus mode, :mod:`.consumer`): None or ``["*"]`` all the subscribers declared in the
    installed apps' ``subscribers`` modules, ``[]`` none. ``on_outcome``: called as ``on_outcome(queue, kind,
    runtime_ms)`` on the completer thread for each outcome the database stored, ``kind`` being
    ``completed``, ``failed``, ``retried``, ``snoozed`` or ``cancelled`` and ``runtime_ms`` the
    attempt's run time (None when not measured); it must be cheap and must not raise (what it
    raises is logged). ``runworker --metrics-port`` counts through it.
    """

    def __init__(
        self,
        *,
        queues: list[str] | None = None,
        concurrency: int = 1,
        backend: str = "default",
        stop_when_empty: bool = False,
        max_jobs: int | None = None,
        max_time: float | None = None,
        sleep: float | None = None,
        grace: float = 30.0,
        worker_id: str | None = None,
        handle_signals: bool = False,
        isolation: str = "thread",
        prefetch: int = DEFAULT_PREFETCH,
        on_outcome: OutcomeObserver | None = None,
        topics: list[str] | None = None,
    ):
        queues = check_options(
            queues=queues,
            concurrency=concurrency,
            backend=backend,
            max_jobs=max_jobs,
            max_time=max_time,
            sleep=sleep,
            grace=grace,
            worker_id=worker_id,
            isolation=isolation,
            prefetch=prefetch,
            on_outcome=on_outcome,
        )

        self.backend = backend
        self.settings = get_settings(backend)
        self.using = self.settings.DATABASE
        self.queues = sorted(set(queues)) if queues else None
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.stop_when_empty = stop_when_empty
        self.max_jobs = max_jobs
        self.max_time = max_time
        if sleep is None:  # the system check lets an infinite POLL_INTERVAL through
            require_seconds("POLL_INTERVAL", self.settings.POLL_INTERVAL, zero_ok=False, high=MAX_WAIT_SECONDS)
        self.sleep = sleep or self.settings.POLL_INTERVAL
        self.grace = float(grace)
        self.worker_id = default_worker_id() if worker_id is None else worker_id
        channel = get_settings().NOTIFY_CHANNEL
        if not isinstance(channel, str) or not CHANNEL_RE.match(channel):
            raise InvalidWorkerOption(f"NOTIFY_CHANNEL must be a lower-case SQL identifier; got {channel!r}.")
        self.handle_signals = handle_signals
        self.isolation = isolation
        if isolation == "process" and connections[self.using].vendor == "sqlite":
            name = str(connections[self.using].settings_dict.get("NAME", ""))
            if name in ("", ":memory:") or "mode=memory" in name:
                raise InvalidWorkerOption("isolation='process' needs a database file; an in-memory SQLite is private.")
        self.stats = WorkerStats()
        self._on_outcome = on_outcome

        self._stopping = threading.Event()
        # Set only after the grace period: leases must keep being renewed while jobs finish.
        self._maintenance_done = threading.Event()
        self._wake = threading.Event()
        self._event_loop = event_loop_thread("jobs-asyncio")
        self._executor = Executor(worker_id=self.worker_id, loop_getter=self._event_loop)
        try:
            self._executor.chain_for(backend)  # a broken MIDDLEWARE fails here, not job by job
        except JobsConfigurationError as exc:
            raise InvalidWorkerOption(str(exc)) from None
        check_declarations(backend, self.settings)
        # What the worker holds from its claims: the leases the maintainer renews, and the
        # attempts whose deadlines the watchdog reads and which cancels reach.
        self._leases = Leases()
        self._attempts = Attempts()
        # Children of --isolation process, so shutdown can stop those still running jobs.
        self._children = Children(worker_id=self.worker_id, executor=self._executor, stats=self.stats)
        self._listener: Listener | None = None
        # Async def tasks without middleware run as tasks on the event loop, holding no thread
        # (see .coroutines); in a child process (--isolation process) every job takes its slot.
        self._loop_runner: LoopRunner | None = None
        if isolation == "thread":
            self._loop_runner = LoopRunner(
                executor=self._executor, loop_getter=self._event_loop, finish=self._finish_on_loop
            )
        self._completer = Completer(using=self.using, stopping=self._stopping, on_written=self._on_written)
        self._producer = Producer(
            using=self.using,
            backend=backend,
            settings=self.settings,
            worker_id=self.worker_id,
            queues=self.queues,
            concurrency=concurrency,
            prefetch=prefetch,
            isolation=isolation,
            stop_when_empty=stop_when_empty,
            max_jobs=max_jobs,
            max_time=max_time,
            sleep=self.sleep,
            stopping=self._stopping,
            wake=self._wake,
            completer=self._completer,
            executor=self._executor,
            attempts=self._attempts,
            leases=self._leases,
            stats=self.stats,
            loop_runner=self._loop_runner,
        )
        self._watchdog = Watchdog(
            using=self.using,
            worker_id=self.worker_id,
            attempts=self._attempts,
            producer=self._producer,
            executor=self._executor,
            stats=self.stats,
            spawn_executor=self._spawn_executor,
            done=self._maintenance_done,
            on_crash=self._crashed_with,
        )
        self._maintainer = Maintainer(
            using=self.using,
            backend=backend,
            settings=self.settings,
            worker_id=self.worker_id,
            queues=self.queues,
            concurrency=concurrency,
            leases=self._leases,
            stopping=self._stopping,
            wake=self._wake,
            done=self._maintenance_done,
            poll_cancels=self._watchdog.poll_cancels,
            listening=self._listening,
            on_crash=self._crashed_with,
        )
        # Bus mode: the subscribers' threads (worker/consumer.py), none without subscribers.
        subscribers = select_subscribers(topics) if topics != [] else []
        self._consumer = (
            Consumer(
                using=self.using,
                subscribers=subscribers,
                worker_id=self.worker_id,
                stopping=self._stopping,
                sleep=self.sleep,
            )
            if subscribers
            else None
        )
        self._threads: list[threading.Thread] = []
        self._executor_threads: list[threading.Thread] = []
        self._crash: WorkerCrashed | None = None

    # -- public ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop (thread-safe): stop claiming, finish or release running jobs."""
        self._stopping.set()
        self._wake.set()
        self._producer.interrupt()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> WorkerStats:
        """Run until stopped; return the statistics. Blocks the calling thread."""
        if self.handle_signals:
            self._install_signal_handlers()
        self.stats.started_at = time.monotonic()  # not a new WorkerStats: the collaborators count into this one
        self._retry_db(self._maintainer.register)
        self._retry_db(self._maintainer.sync_schedules)
        logger.info(
            "Worker %s started: queues=%s concurrency=%d",
            self.worker_id,
            ",".join(self.queues or ["*"]),
            self.concurrency,
        )
        _send_robust(
            worker_started, type(self), worker_id=self.worker_id, queues=self.queues, concurrency=self.concurrency
        )
        self._start_threads()
        try:
            self._producer.run()
        finally:
            self._shutdown()
        if self._crash is not None:
            raise self._crash
        _send_robust(worker_stopped, type(self), worker_id=self.worker_id, stats=self.stats)
        return self.stats

    @property
    def _inflight(self) -> int:
        """Jobs claimed and not finished (the producer's count; tests wait for it to be 0)."""
        return self._producer.inflight

    def _crashed_with(self, crash: WorkerCrashed) -> None:
        """A thread met an error that must stop the worker: stop, and make run() raise ``crash``."""
        self._crash = crash
        self.stop()

    def _listening(self) -> bool:
        """Whether the listener holds a live LISTEN (so NOTIFY brings cancels)."""
        return self._listener is not None and self._listener.connected.is_set()

    def _retry_db(self, fn: Callable[[], Any]) -> Any:
        failures = 0
        while True:
            try:
                return fn()
            except DatabaseError as exc:
                if not is_transient(exc):
                    raise crashed("registering the worker", exc) from exc
                failures += 1
                if self._stopping.is_set() and failures > 3:
                    raise
                db_trouble(
                    "database call", exc, failures, worker_id=self.worker_id, using=self.using, stopping=self._stopping
                )

    # -- executors --------------------------------------------------------------------------------

    def _execute_loop(self) -> None:
        child: ChildProcess | None = None
        try:
            while True:
                attempt = self._producer.next_attempt()
                if attempt is None:
                    return
                job = attempt.job
                t0 = time.perf_counter()
                outcome: engine.Outcome | None = None
                try:
                    if attempt.in_child:
                        outcome, child = self._children.run(attempt, child, self._producer.claimed_total)
                    elif "atomic" in job.options:  # the task and its completion in one transaction
                        outcome = execute_atomic(self._executor, job, attempt)
                    else:
                        outcome = self._executor.execute(job, attempt)
                except BaseException as exc:  # noqa: BLE001 - not the task's error (those are outcomes): ours
                    # Fail the job rather than release it, which would run it into the same bug forever.
                    logger.exception("Running job %s failed inside django-jobs; failing the job.", job.id)
                    outcome = None
                    if attempt.settle():
                        outcome = outcome_for(job, state=JobState.FAILED, error=error_record(exc, job.attempts))
                finally:
                    took = time.perf_counter() - t0
                    self._producer.ran(took)
                    # Connection housekeeping after each job, as Django does at a request's end:
                    # the next job must not inherit a connection this one left in a transaction,
                    # broken, or past CONN_MAX_AGE (about a microsecond when there is none).
                    close_old_connections()
                    self._attempts.discard(attempt)
                if outcome is None:
                    if attempt.in_child:
                        continue  # shutting down: the job is released, its child killed
                    # The watchdog gave this attempt up, recorded it, freed its slot and started
                    # a new executor thread in this one's place.
                    return
                self._producer.finish(outcome)
        finally:
            if child is not None:
                child.close()

    def _finish_on_loop(self, attempt: Attempt, outcome: engine.Outcome | None) -> None:
        """An attempt run on the event loop ended with ``outcome`` (None: whoever recorded it
        freed its slot already)."""
        if outcome is None:
            return
        if attempt.started is not None:
            self._producer.ran(time.monotonic() - attempt.started)
        self._attempts.discard(attempt)
        self._producer.finish(with_runtime(attempt, outcome))

    def _on_written(self, outcomes: list[engine.Outcome], written: dict[Any, str]) -> None:
        """Count what was stored and send the job signals, ``task_finished`` first (completer
        thread, after the commit). Also called for the outcomes of atomic jobs, which their own
        transaction wrote (:mod:`.atomic`)."""
        self._leases.drop([o.lease_token for o in outcomes])
        with batched_lines():  # the batch's log lines in one write (runworker's handler)
            for o in outcomes:
                state = written.get(o.job_id)
                if state is None:
                    self._executor.forget(o)  # another actor won the job (a rescue, a cancel)
                    continue
                try:
                    self._signal_written(o, state)
                except Exception:  # noqa: BLE001 - the completer must go on writing outcomes
                    logger.exception("Worker %s: sending the signals of job %s failed.", self.worker_id, o.job_id)
        if written:
            # A job that finished or went back to wait may let another start (its partition's
            # next one, one more of a limited queue): claim again rather than sleep out the poll.
            self._wake.set()

    def _signal_written(self, o: engine.Outcome, state: str) -> None:
        """Count and log one stored outcome and send its signals, ``task_finished`` first."""
        if state == JobState.COMPLETED:
            kind = "completed"
        elif state == JobState.FAILED:
            kind = "failed"
        elif state == JobState.CANCELLED:
            kind = "cancelled"
        elif o.uncount_attempt:
            kind = "snoozed"
        else:
            kind = "retried"
        self.stats.count(kind)
        if self._on_outcome is not None:
            self._on_outcome(o.queue, kind, o.runtime_ms)
        log_outcome(o, state)
        self._executor.send_finished(o, state)
        if state in (JobState.COMPLETED, JobState.FAILED):
            return
        payload = {"job_id": str(o.job_id), "queue": o.queue}
        if state == JobState.CANCELLED:
            send_job_signal(job_cancelled, self.backend, **payload, was_running=True)
        elif o.uncount_attempt:
            send_job_signal(job_snoozed, self.backend, **payload, attempt=o.attempt, run_at=o.available_at)
        else:
            send_job_signal(
                job_retried, self.backend, **payload, attempt=o.attempt, run_at=o.available_at, error=o.error
            )

    # -- lifecycle --------------------------------------------------------------------------------

    def _start_threads(self) -> None:
        def spawn(target: Callable[[], None], name: str) -> None:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

        for _ in range(self.concurrency):
            self._spawn_executor()
        self._completer.start()
        spawn(self._maintainer.run, "jobs-maintainer")
        spawn(self._watchdog.run, "jobs-watchdog")
        if self._consumer is not None:
            self._consumer.start()
        if driver(self.using).LISTEN_NOTIFY:  # elsewhere workers poll (POLL_INTERVAL)
            self._listener = Listener(
                using=self.using,
                channel=get_settings().NOTIFY_CHANNEL,
                queues=self.queues,
                wake=self._wake,
                stopping=self._stopping,
                on_cancel=self._watchdog.on_cancel,
            )
            self._listener.start()
            self._threads.append(self._listener)

    def _spawn_executor(self) -> None:
        t = threading.Thread(target=self._execute_loop, name=f"jobs-exec-{len(self._executor_threads)}", daemon=True)
        t.start()
        self._executor_threads.append(t)

    def _shutdown(self) -> None:
        self.stop()
        deadline = time.monotonic() + self.grace
        # Jobs claimed but not started are not run: the release below hands them back.
        still_running = self._producer.drain(deadline)
        if self._consumer is not None:
            self._consumer.join(deadline)  # a batch still running past it is redelivered after its lease
        if still_running:
            logger.warning(
                "Worker %s: %d job(s) still running after the %.0fs grace period; releasing them.",
                self.worker_id,
                still_running,
                self.grace,
            )
        if still_running and self.isolation == "process":
            # Stop the children still running jobs before those jobs are released, so no job
            # runs here and on another worker at once.
            self._children.kill_all()
        if still_running and self._loop_runner is not None:
            # Likewise the coroutines on the event loop: cancelled as their jobs are released
            # (their finally blocks run while the worker winds down). A thread cannot be
            # stopped; a coroutine can.
            self._loop_runner.cancel_running()
        # Jobs claimed but not started yet are not run: the release below hands them back.
        self._producer.end_executors()
        # Outcomes first, so finished jobs are recorded, then release whatever still runs.
        self._completer.close(timeout=max(5.0, deadline - time.monotonic()))
        self.stats.released += self._release_all()
        # Claimed but never started jobs (queued for an executor) are covered by the release too.
        self._maintenance_done.set()
        for t in self._threads:
            t.join(timeout=2.0)
        try:
            engine.unregister_worker(using=self.using, worker_id=self.worker_id)
        except DatabaseError:
            logger.warning("Worker %s could not remove its row; the reaper will.", self.worker_id)
        for loop in self._event_loop.loop:  # type: ignore[attr-defined]
            loop.call_soon_threadsafe(loop.stop)
        self.stats.stopped_at = time.monotonic()
        self.stats.outcome_window = self._completer.window.summary()
        close_connection(self.using)
        # The summary is run()'s to return (runworker prints it once, on stdout), not to log too.
        logger.info("Worker %s stopped.", self.worker_id)

    def _release_all(self) -> int:
        """Hand every job still ours back (shutdown). A release whose answer is lost may have
        committed; repeating it is harmless, so it is tried again on a new connection."""
        for attempt in range(3):
            try:
                return engine.release_jobs(using=self.using, worker_id=self.worker_id)
            except DatabaseError as exc:
                if attempt == 2 or not is_transient(exc):
                    logger.error(
                        "Worker %s could not release its jobs (%s: %s); their leases will expire and they will "
                        "run again.",
                        self.worker_id,
                        type(exc).__name__,
                        str(exc).strip(),
                    )
                    return 0
                close_connection(self.using)
                time.sleep(0.05 * 2**attempt)
        return 0

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: the first stop request stops the worker gracefully, a second one
        (a signal more than REPEAT_WINDOW after the first; a closer one repeats the first)
        exits at once. The handler does only that sorting; a thread logs and calls stop(), see
        :mod:`.stop_signals` for why."""
        requests = StopRequests()

        def handler(signum: int, frame: Any) -> None:
            request = requests.count()
            if request == 1:
                relay.send(signum)
            elif request > 1:
                # Leave now; leases hand the running jobs to other workers.
                os.write(2, b"django_jobs: second signal, exiting at once.\n")
                os._exit(1)

        relay = signal_relay(self._on_stop_signal)
        install_stop_handler(handler)

    def _on_stop_signal(self, signum: int) -> None:
        """A first SIGTERM/SIGINT (on the jobs-signals thread): log it and stop gracefully."""
        logger.warning(
            "Worker %s: %s received, shutting down (grace %.0fs; send again to exit at once).",
            self.worker_id,
            signal.Signals(signum).name,
            self.grace,
        )
        self.stop()


def _send_robust(signal: Any, sender: type, **kwargs: Any) -> None:
    for receiver, response in signal.send_robust(sender=sender, **kwargs):
        if isinstance(response, Exception):
            logger.error("Signal receiver %r raised", receiver, exc_info=response)

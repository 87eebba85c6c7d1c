"""The worker: a Python object first; ``manage.py runworker`` only parses options and calls it.

Threads of one worker process:

* the **producer** (the thread calling :meth:`Worker.run`) claims as many jobs as there are
  free slots and hands them to the executor threads, a claim at a time (see SPREAD_AFTER); when
  nothing is ready it sleeps until a NOTIFY, a freed slot, or the jittered poll interval;
* ``concurrency`` **executor** threads each run one job at a time (async tasks run on a shared
  event loop thread while the executor thread holds their slot);
* the **completer** writes outcomes in batches, guarded on each job's lease;
* the **maintainer** renews leases and the heartbeat, looks for cancelled running jobs, and runs
  the services (promoter, rescuer, reaper, dedup sweeper, partition sweeper, scheduler);
* the **watchdog** gives up attempts that run past their timeout: it records them as failed,
  frees their slot and starts a new executor thread (a Python thread cannot be killed; the old
  one runs on and its late outcome is discarded);
* on PostgreSQL, the **listener** holds a dedicated connection that LISTENs for new jobs and
  for cancels of running ones.

With ``isolation="process"`` each executor thread runs its jobs in a child process instead
(:mod:`django_jobs.worker.isolation`), which is killed at the job's deadline or cancel.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, close_old_connections, connections

from .. import engine
from ..conf import get_settings
from ..db import is_transient
from ..exceptions import ChildProcessDied, JobCancelled, JobsConfigurationError, JobTimeout, WorkerCrashed
from ..queues import sync_queues
from ..schedules import declared_schedules, sync_schedules
from ..services import DedupSweeper, PartitionSweeper, Promoter, Pruner, Reaper, Rescuer, Scheduler
from ..signals import job_cancelled, job_retried, job_snoozed, send_job_signal, worker_started, worker_stopped
from ..states import JobState
from .completer import Completer
from .executor import Attempt, Executor, error_record, event_loop_thread, outcome_for
from .holdings import Attempts, Leases
from .isolation import ChildProcess
from .listener import CHANNEL_RE, Listener
from .options import (
    DEFAULT_PREFETCH,
    MAX_WAIT_SECONDS,
    InvalidWorkerOption,
    check_declarations,
    check_options,
    default_worker_id,
    require_seconds,
)
from .producer import Producer
from .stats import WorkerStats
from .stop_signals import StopRequests, install_stop_handler, signal_relay
from .trouble import close_connection, crashed, db_trouble

# What runworker, the tests and users import from here; the options and the stats have modules of their own.
__all__ = ["DEFAULT_PREFETCH", "MAX_WAIT_SECONDS", "InvalidWorkerOption", "Worker", "WorkerStats"]

logger = logging.getLogger("django_jobs.worker")
job_logger = logging.getLogger("django_jobs.worker.jobs")

#: How often a worker asks the database for cancels of its running jobs when no NOTIFY tells it
#: (SQLite, or PostgreSQL while the listener reconnects).
CANCEL_POLL_INTERVAL = 0.5


class Worker:
    """Runs jobs from the database until stopped.

    ``queues``: names to take jobs from (``None`` or ``["*"]``: all). ``concurrency``: jobs at
    once (threads). ``stop_when_empty``: stop once no waiting, delayed or active job is left in
    those queues. ``max_jobs``/``max_time``: stop after that many jobs/seconds. ``sleep``: idle
    poll interval (default ``POLL_INTERVAL``). ``grace``: seconds running jobs get to finish on
    shutdown before they are released back to waiting. ``handle_signals``: install SIGTERM/SIGINT
    handlers (only possible from the main thread). ``isolation``: ``"thread"`` (default) runs
    jobs in this process's threads; ``"process"`` runs each slot's jobs in a child process that
    is killed at a job's timeout or cancel.
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
        self._children: set[ChildProcess] = set()
        self._children_lock = threading.Lock()
        self._killing_children = threading.Event()
        self._listener: Listener | None = None
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
        self._retry_db(self._register)
        self._retry_db(self._sync_schedules)
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

    # -- registration ------------------------------------------------------------------------------

    def _sync_schedules(self) -> None:
        # Always, even with no QUEUES: a queue removed from it gets its declared limits back to none.
        changed = sync_queues(using=self.using, declared=self.settings.QUEUES)
        if changed:
            logger.info("Worker %s applied DJANGO_JOBS['QUEUES'] to %d queue(s).", self.worker_id, changed)
        if declared_schedules(self.backend):
            counts = sync_schedules(self.backend)
            if any(counts.values()):
                logger.info("Worker %s synced schedules: %s", self.worker_id, counts)

    def _register(self) -> None:
        engine.register_worker(
            using=self.using,
            worker_id=self.worker_id,
            backend=self.backend,
            queues=self.queues,
            concurrency=self.concurrency,
            pid=os.getpid(),
        )

    def _db_trouble(self, what: str, exc: Exception, failures: int) -> None:
        db_trouble(what, exc, failures, worker_id=self.worker_id, using=self.using, stopping=self._stopping)

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
                self._db_trouble("database call", exc, failures)

    # -- executors --------------------------------------------------------------------------------

    def _execute_loop(self) -> None:
        verbose = job_logger.isEnabledFor(logging.INFO)
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
                        outcome, child = self._run_in_child(attempt, child)
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
                if verbose:
                    job_logger.info(
                        "%s %s %s attempt %d/%d in %.1f ms",
                        job.id,
                        job.task_path,
                        outcome.state,
                        job.attempts,
                        job.max_attempts,
                        took * 1000,
                    )
                self._producer.finish(outcome)
        finally:
            if child is not None:
                child.close()

    def _run_in_child(
        self, attempt: Attempt, child: ChildProcess | None
    ) -> tuple[engine.Outcome | None, ChildProcess | None]:
        """Run ``attempt`` in this slot's child process (started or replaced as needed); kill
        the child at the deadline or on cancel. Returns the outcome and the child to reuse."""
        job = attempt.job
        if attempt.cancelled.is_set():  # cancelled after the claim: do not start it
            return self._executor.give_up(
                attempt, JobCancelled(f"Job {job.id} was cancelled before it started.")
            ), child
        if child is None or not child.alive:
            if child is not None:
                self._forget_child(child)
                child.kill()
            try:
                child = ChildProcess(worker_id=self.worker_id, index=self._producer.claimed_total)
            except (RuntimeError, OSError) as exc:
                logger.error("Worker %s: %s", self.worker_id, exc)
                return self._executor.give_up(
                    attempt, ChildProcessDied(f"A job child process failed to start: {exc}")
                ), None
            with self._children_lock:
                self._children.add(child)
        attempt.start()  # after the child's start-up, which does not count against the job's time
        try:
            child.conn.send(job)
        except (OSError, ValueError) as exc:
            child.kill()
            return self._executor.give_up(
                attempt, ChildProcessDied(f"Could not hand the job to its child: {exc}")
            ), None
        while True:
            if self._killing_children.is_set():
                # Shutting down after the grace period: the child is killed and the job released.
                return None, None
            try:
                if child.conn.poll(0.05):
                    outcome = child.conn.recv()
                    if outcome is not None:
                        outcome.job = job  # not pickled: task_finished is sent from here
                    return (outcome if attempt.settle() else None), child
            except (EOFError, OSError, ValueError):  # the child died, or shutdown closed the pipe
                if self._killing_children.is_set():
                    return None, None
                break
            if attempt.cancelled.is_set():
                child.kill()
                logger.info("Job %s was cancelled; killed its child process.", job.id)
                return self._executor.give_up(attempt, JobCancelled(f"Job {job.id} was cancelled while it ran; its "
                                                                    "child process was killed.")), None  # fmt: skip
            if attempt.deadline is not None and time.monotonic() >= attempt.deadline:
                child.kill()
                self.stats.timed_out += 1
                logger.warning("Job %s ran past its timeout of %gs; killed its child process.", job.id, attempt.timeout)
                return self._executor.give_up(attempt, JobTimeout(
                    f"{job.task_path} ran longer than its timeout of {attempt.timeout:g}s; its child process was "
                    "killed.")), None  # fmt: skip
            if not child.alive:
                if child.conn.poll(0):
                    continue  # it answered, then exited: read the answer
                break
        self._forget_child(child)
        child.process.join(2)  # the pipe closes a moment before the process can be reaped
        code = child.process.exitcode
        child.kill()
        logger.error("The child process running job %s died (exit code %s).", job.id, code)
        return self._executor.give_up(attempt, ChildProcessDied(
            f"The child process running {job.task_path} died (exit code {code}) before it answered; "
            "the code it ran crashed the interpreter or was killed.")), None  # fmt: skip

    def _forget_child(self, child: ChildProcess) -> None:
        with self._children_lock:
            self._children.discard(child)

    def _watch(self) -> None:
        """The watchdog: give up attempts of sync tasks run by threads that are past their
        deadline. (An async task's thread enforces its own deadline; a child process's thread
        kills the child.)"""
        while not self._maintenance_done.wait(0.05):
            now = time.monotonic()
            # Also here, not only at the producer's waits: the producer may be held in a slow
            # claim or a database outage while claimed jobs wait behind a long one.
            self._producer.spread()
            due = self._attempts.due(now)
            for attempt in due:
                try:
                    self._time_out(attempt)
                except Exception as exc:  # noqa: BLE001 - without the watchdog no timeout holds: stop
                    self._crash = WorkerCrashed(f"The watchdog failed ({type(exc).__name__}: {exc}); stopping.")
                    logger.exception("Worker %s: the watchdog failed; stopping the worker.", self.worker_id)
                    self.stop()
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

    def _on_cancel(self, job_id: Any) -> None:
        """A running job of ours was cancelled: tell its attempt (threads see is_cancelled(),
        coroutines are cancelled, child processes killed)."""
        attempt = self._attempts.get(job_id)  # None: another worker's job, or already ended
        if attempt is not None and not attempt.cancelled.is_set():
            logger.info("Job %s was cancelled while running.", job_id)
            attempt.cancel()

    def _on_written(self, outcomes: list[engine.Outcome], written: dict[Any, str]) -> None:
        """Count what was stored and send the job signals, ``task_finished`` first (completer
        thread, after the commit)."""
        self._leases.drop([o.lease_token for o in outcomes])
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
        """Count one stored outcome and send its signals, ``task_finished`` first."""
        if state == JobState.COMPLETED:
            self.stats.completed += 1
        elif state == JobState.FAILED:
            self.stats.failed += 1
        elif state == JobState.CANCELLED:
            self.stats.cancelled += 1
        elif o.uncount_attempt:
            self.stats.snoozed += 1
        else:
            self.stats.retried += 1
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

    # -- maintenance ------------------------------------------------------------------------------

    def _maintain(self) -> None:
        s = self.settings
        renew_every = s.LEASE_SECONDS / 3
        next_renew = time.monotonic() + renew_every
        common: dict[str, Any] = {
            "using": self.using,
            "settings": s,
            "worker_id": self.worker_id,
            "backend": self.backend,
        }
        services = [
            Promoter(**common, interval=s.PROMOTE_INTERVAL),
            Rescuer(**common, interval=s.RESCUE_INTERVAL),
            Reaper(**common, interval=max(s.RESCUE_INTERVAL, s.LEASE_SECONDS)),
            DedupSweeper(**common, interval=s.PROMOTE_INTERVAL),
            PartitionSweeper(**common, interval=s.PROMOTE_INTERVAL),
            Scheduler(**common, interval=s.PROMOTE_INTERVAL),
            Pruner(**common, interval=s.PRUNE_INTERVAL),
        ]
        is_leader = False
        next_leader_check = 0.0
        next_cancel_poll = 0.0
        failures = 0
        while not self._maintenance_done.wait(0.1):
            try:
                now = time.monotonic()
                if now >= next_cancel_poll:
                    self._poll_cancels()
                    listening = self._listener is not None and self._listener.connected.is_set()
                    # With a live LISTEN, NOTIFY brings cancels; the poll is then only a safety net.
                    next_cancel_poll = now + (renew_every if listening else CANCEL_POLL_INTERVAL)
                if now >= next_renew:
                    engine.renew_leases(
                        using=self.using, lease_tokens=self._leases.tokens(), lease_seconds=s.LEASE_SECONDS
                    )
                    if not engine.heartbeat_worker(using=self.using, worker_id=self.worker_id):
                        self._register()  # the reaper took us for dead; come back
                    next_renew = now + renew_every
                if now >= next_leader_check:
                    leader = engine.leader_id(
                        using=self.using, backend=self.backend, alive_within=timedelta(seconds=s.LEASE_SECONDS)
                    )
                    is_leader = leader == self.worker_id
                    next_leader_check = now + min(s.RESCUE_INTERVAL, renew_every)
                for service in services:
                    if self._stopping.is_set():  # draining: keep renewing leases, start no new work
                        break
                    counts = service.tick(is_leader=is_leader)
                    if counts and counts.get("promoted") or (counts and counts.get("requeued")):
                        self._wake.set()
                failures = 0
            except DatabaseError as exc:
                if not is_transient(exc):
                    # Without lease renewals our jobs would be rescued under us: stop the worker.
                    self._crash = crashed("maintenance", exc)
                    logger.error("Worker %s: %s", self.worker_id, self._crash)
                    self.stop()
                    break
                failures += 1
                self._db_trouble("maintenance", exc, failures)
            except Exception:  # noqa: BLE001 - a bug or a receiver's error must not stop lease renewal
                failures += 1
                logger.exception("Worker %s: maintenance step failed; retrying.", self.worker_id)
                self._stopping.wait(min(5.0, 0.05 * 2 ** min(failures, 6)))
        close_connection(self.using)

    def _poll_cancels(self) -> None:
        if self._attempts:
            for job_id in engine.cancel_requested_ids(using=self.using, worker_id=self.worker_id):
                self._on_cancel(job_id)

    # -- lifecycle --------------------------------------------------------------------------------

    def _start_threads(self) -> None:
        def spawn(target: Callable[[], None], name: str) -> None:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

        for _ in range(self.concurrency):
            self._spawn_executor()
        self._completer.start()
        spawn(self._maintain, "jobs-maintainer")
        spawn(self._watch, "jobs-watchdog")
        if connections[self.using].vendor == "postgresql":
            self._listener = Listener(
                using=self.using,
                channel=get_settings().NOTIFY_CHANNEL,
                queues=self.queues,
                wake=self._wake,
                stopping=self._stopping,
                on_cancel=self._on_cancel,
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
            self._killing_children.set()
            with self._children_lock:
                children = list(self._children)
            for child in children:
                child.kill()
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
        logger.info("Worker %s stopped: %s", self.worker_id, self.stats.summary())

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

"""The worker: a Python object first; ``manage.py runworker`` only parses options and calls it.

Threads of one worker process:

* the **producer** (the thread calling :meth:`Worker.run`) claims as many jobs as there are
  free slots and hands them to the executor threads; when nothing is ready it sleeps until a
  NOTIFY, a freed slot, or the jittered poll interval;
* ``concurrency`` **executor** threads each run one job at a time (async tasks run on a shared
  event loop thread while the executor thread holds their slot);
* the **completer** writes outcomes in batches, guarded on each job's lease;
* the **maintainer** renews leases and the heartbeat and runs the services (promoter, rescuer,
  reaper);
* on PostgreSQL, the **listener** holds a dedicated connection that LISTENs for new jobs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, close_old_connections, connections
from django.utils.crypto import get_random_string

from .. import engine
from ..conf import get_settings
from ..db import is_transient
from ..exceptions import JobsError, WorkerCrashed
from ..models import Job
from ..services import Promoter, Reaper, Rescuer
from ..signals import worker_started, worker_stopped
from ..states import JobState
from .completer import Completer
from .executor import Executor, error_record
from .listener import CHANNEL_RE, Listener

logger = logging.getLogger("django_jobs.worker")
job_logger = logging.getLogger("django_jobs.worker.jobs")

#: While the queue has a backlog, the producer waits up to this long for running jobs to finish
#: before it claims, so one claim (a round trip and a commit, about a millisecond) fills several
#: slots instead of one each; short jobs finish within it, long ones barely notice it.
CLAIM_LINGER = 0.002


class InvalidWorkerOption(JobsError, ValueError):
    """A worker option has an invalid value."""


@dataclass
class WorkerStats:
    completed: int = 0
    failed: int = 0
    retried: int = 0
    started_at: float = field(default_factory=time.monotonic)
    stopped_at: float | None = None
    released: int = 0

    @property
    def processed(self) -> int:
        return self.completed + self.failed + self.retried

    @property
    def elapsed(self) -> float:
        return (self.stopped_at or time.monotonic()) - self.started_at

    @property
    def rate(self) -> float:
        return self.processed / self.elapsed if self.elapsed > 0 else 0.0

    def summary(self) -> str:
        return (
            f"{self.processed} jobs processed in {self.elapsed:.1f}s ({self.rate:.1f}/s): "
            f"{self.completed} completed, {self.failed} failed, {self.retried} retried"
            + (f", {self.released} released" if self.released else "")
        )


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{get_random_string(6)}"


class Worker:
    """Runs jobs from the database until stopped.

    ``queues``: names to take jobs from (``None`` or ``["*"]``: all). ``concurrency``: jobs at
    once (threads). ``stop_when_empty``: stop once no waiting, delayed or active job is left in
    those queues. ``max_jobs``/``max_time``: stop after that many jobs/seconds. ``sleep``: idle
    poll interval (default ``POLL_INTERVAL``). ``grace``: seconds running jobs get to finish on
    shutdown before they are released back to waiting. ``handle_signals``: install SIGTERM/SIGINT
    handlers (only possible from the main thread).
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
    ):
        from django.tasks import task_backends
        from django.tasks.exceptions import InvalidTaskBackend

        from ..backend import JobsBackend, validate_queue_name

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
        _require_int("concurrency", concurrency, 1, 1000)
        if max_jobs is not None:
            _require_int("max_jobs", max_jobs, 1, None)
        for name, value in (("max_time", max_time), ("sleep", sleep)):
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise InvalidWorkerOption(f"{name} must be a number of seconds > 0; got {value!r}.")
        if not isinstance(grace, (int, float)) or grace < 0:
            raise InvalidWorkerOption(f"grace must be a number of seconds >= 0; got {grace!r}.")

        self.backend = backend
        self.settings = get_settings(backend)
        self.using = self.settings.DATABASE
        self.queues = sorted(set(queues)) if queues else None
        self.concurrency = concurrency
        self.stop_when_empty = stop_when_empty
        self.max_jobs = max_jobs
        self.max_time = max_time
        self.sleep = sleep or self.settings.POLL_INTERVAL
        self.grace = float(grace)
        self.worker_id = worker_id or default_worker_id()
        if len(self.worker_id) > 200:
            raise InvalidWorkerOption("worker_id must be at most 200 characters.")
        channel = get_settings().NOTIFY_CHANNEL
        if not isinstance(channel, str) or not CHANNEL_RE.match(channel):
            raise InvalidWorkerOption(f"NOTIFY_CHANNEL must be a lower-case SQL identifier; got {channel!r}.")
        self.handle_signals = handle_signals
        self.stats = WorkerStats()

        self._stopping = threading.Event()
        # Set only after the grace period: leases must keep being renewed while jobs finish.
        self._maintenance_done = threading.Event()
        self._wake = threading.Event()
        self._slots = threading.Condition()
        self._inflight = 0
        self._claimed_total = 0
        self._jobs: queue.SimpleQueue[engine.ClaimedJob | None] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        self._executor = Executor(worker_id=self.worker_id, loop_getter=self._event_loop)
        self._completer = Completer(using=self.using, stopping=self._stopping, on_written=self._on_written)
        self._threads: list[threading.Thread] = []
        self._signals_seen = 0
        self._crash: WorkerCrashed | None = None
        self._first_signal_at = 0.0

    # -- public ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop (thread-safe): stop claiming, finish or release running jobs."""
        self._stopping.set()
        self._wake.set()
        with self._slots:
            self._slots.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> WorkerStats:
        """Run until stopped; return the statistics. Blocks the calling thread."""
        if self.handle_signals:
            self._install_signal_handlers()
        self.stats = WorkerStats()
        self._retry_db(self._register)
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
            self._produce()
        finally:
            self._shutdown()
        if self._crash is not None:
            raise self._crash
        _send_robust(worker_stopped, type(self), worker_id=self.worker_id, stats=self.stats)
        return self.stats

    # -- producer -------------------------------------------------------------------------------

    def _produce(self) -> None:
        deadline = time.monotonic() + self.max_time if self.max_time else None
        failures = 0
        backlog = False  # the last claim filled every free slot: more jobs are probably ready
        while not self._stopping.is_set():
            if deadline and time.monotonic() >= deadline:
                logger.info("Worker %s: --max-time reached.", self.worker_id)
                break
            with self._slots:
                while self._inflight >= self.concurrency and not self._stopping.is_set():
                    self._slots.wait(timeout=1.0)
                linger_until = time.monotonic() + CLAIM_LINGER
                while backlog and self._inflight and not self._stopping.is_set():
                    remaining = linger_until - time.monotonic()
                    if remaining <= 0:
                        break
                    self._slots.wait(remaining)
                free = self.concurrency - self._inflight
            if self._stopping.is_set():
                break
            if self.max_jobs is not None:
                free = min(free, self.max_jobs - self._claimed_total)
                if free <= 0:
                    self._wait_idle_then_stop()
                    break
            # Clear before claiming: a NOTIFY that lands during the claim keeps us awake.
            self._wake.clear()
            try:
                jobs = engine.claim_jobs(
                    using=self.using,
                    queues=self.queues,
                    limit=free,
                    worker_id=self.worker_id,
                    lease_seconds=self.settings.LEASE_SECONDS,
                    backend=self.backend,
                )
                failures = 0
            except DatabaseError as exc:
                if not is_transient(exc):
                    # Not a dropped connection or a busy database: retrying would spin forever.
                    raise _crashed("claiming jobs", exc) from exc
                failures += 1
                self._db_trouble("claim", exc, failures)
                continue
            if jobs:
                with self._slots:
                    self._inflight += len(jobs)
                self._claimed_total += len(jobs)
                for job in jobs:
                    self._jobs.put(job)
                backlog = len(jobs) == free
                if backlog:
                    continue
            backlog = False
            if self.stop_when_empty and self._nothing_left():
                logger.info("Worker %s: queues are empty, stopping.", self.worker_id)
                break
            if not jobs:
                self._wake.wait(timeout=self.sleep * random.uniform(0.75, 1.25))

    def _register(self) -> None:
        engine.register_worker(
            using=self.using,
            worker_id=self.worker_id,
            backend=self.backend,
            queues=self.queues,
            concurrency=self.concurrency,
            pid=os.getpid(),
        )

    def _nothing_left(self) -> bool:
        with self._slots:
            if self._inflight:
                return False
        if self._completer.pending():
            return False
        try:
            qs = Job.objects.using(self.using).filter(
                backend=self.backend, state__in=[JobState.WAITING, JobState.DELAYED, JobState.ACTIVE]
            )
            if self.queues:
                qs = qs.filter(queue__in=self.queues)
            return not qs.exists()
        except DatabaseError as exc:
            if not is_transient(exc):
                raise _crashed("checking for remaining jobs", exc) from exc
            self._db_trouble("emptiness check", exc, 1)
            return False

    def _wait_idle_then_stop(self) -> None:
        with self._slots:
            while self._inflight and not self._stopping.is_set():
                self._slots.wait(timeout=0.5)
        logger.info("Worker %s: --max-jobs reached.", self.worker_id)

    def _db_trouble(self, what: str, exc: Exception, failures: int) -> None:
        logger.warning(
            "Worker %s: %s failed (%s: %s); retrying.",
            self.worker_id,
            what,
            type(exc).__name__,
            str(exc).strip().splitlines()[0] if str(exc).strip() else "",
        )
        _close_connection(self.using)
        delay = min(5.0, 0.05 * (2 ** min(failures, 8))) * random.uniform(0.5, 1.0)
        self._stopping.wait(delay)

    def _retry_db(self, fn: Callable[[], Any]) -> Any:
        failures = 0
        while True:
            try:
                return fn()
            except DatabaseError as exc:
                if not is_transient(exc):
                    raise _crashed("registering the worker", exc) from exc
                failures += 1
                if self._stopping.is_set() and failures > 3:
                    raise
                self._db_trouble("database call", exc, failures)

    # -- executors --------------------------------------------------------------------------------

    def _execute_loop(self) -> None:
        verbose = job_logger.isEnabledFor(logging.INFO)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            close_old_connections()
            t0 = time.perf_counter()
            try:
                outcome = self._executor.execute(job)
            except BaseException as exc:  # noqa: BLE001 - not the task's error (those are outcomes): ours
                # Fail the job rather than release it, which would run it into the same bug forever.
                logger.exception("Running job %s failed inside django-jobs; failing the job.", job.id)
                outcome = engine.Outcome(
                    job_id=job.id,
                    lease_token=job.lease_token,
                    state=JobState.FAILED,
                    error=error_record(exc, job.attempts),
                )
            finally:
                close_old_connections()
            if verbose:
                job_logger.info(
                    "%s %s %s attempt %d/%d in %.1f ms",
                    job.id,
                    job.task_path,
                    outcome.state,
                    job.attempts,
                    job.max_attempts,
                    (time.perf_counter() - t0) * 1000,
                )
            self._completer.submit(outcome)
            with self._slots:
                self._inflight -= 1
                # Only the producer waits on _slots: for a first free slot, or (lingering, shutting
                # down, --max-jobs) for all of them. Waking it for each job would cost a thread
                # switch per job.
                if self._inflight == self.concurrency - 1 or not self._inflight:
                    self._slots.notify()

    def _on_written(self, outcomes: list[engine.Outcome], written: set[Any]) -> None:
        for o in outcomes:
            if o.job_id not in written:
                continue
            if o.state == JobState.COMPLETED:
                self.stats.completed += 1
            elif o.state == JobState.FAILED:
                self.stats.failed += 1
            else:
                self.stats.retried += 1

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="jobs-asyncio", daemon=True)
                t.start()
                self._loop = loop
            return self._loop

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
        ]
        is_leader = False
        next_leader_check = 0.0
        failures = 0
        while not self._maintenance_done.wait(0.1):
            try:
                now = time.monotonic()
                if now >= next_renew:
                    engine.renew_leases(using=self.using, worker_id=self.worker_id, lease_seconds=s.LEASE_SECONDS)
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
                    self._crash = _crashed("maintenance", exc)
                    logger.error("Worker %s: %s", self.worker_id, self._crash)
                    self.stop()
                    break
                failures += 1
                self._db_trouble("maintenance", exc, failures)
        _close_connection(self.using)

    # -- lifecycle --------------------------------------------------------------------------------

    def _start_threads(self) -> None:
        def spawn(target: Callable[[], None], name: str) -> None:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

        self._executor_threads = []
        for i in range(self.concurrency):
            t = threading.Thread(target=self._execute_loop, name=f"jobs-exec-{i}", daemon=True)
            t.start()
            self._executor_threads.append(t)
        self._completer.start()
        spawn(self._maintain, "jobs-maintainer")
        if connections[self.using].vendor == "postgresql":
            self._listener = Listener(
                using=self.using,
                channel=get_settings().NOTIFY_CHANNEL,
                queues=self.queues,
                wake=self._wake,
                stopping=self._stopping,
            )
            self._listener.start()
            self._threads.append(self._listener)

    def _shutdown(self) -> None:
        self.stop()
        deadline = time.monotonic() + self.grace
        with self._slots:
            while self._inflight and time.monotonic() < deadline:
                self._slots.wait(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            still_running = self._inflight
        if still_running:
            logger.warning(
                "Worker %s: %d job(s) still running after the %.0fs grace period; releasing them.",
                self.worker_id,
                still_running,
                self.grace,
            )
        # Jobs claimed but not started yet are not run: the release below hands them back.
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        for _ in self._executor_threads:
            self._jobs.put(None)
        # Outcomes first, so finished jobs are recorded, then release whatever still runs.
        self._completer.close(timeout=max(5.0, deadline - time.monotonic()))
        try:
            self.stats.released = engine.release_jobs(using=self.using, worker_id=self.worker_id)
        except DatabaseError:
            logger.exception("Worker %s could not release its jobs; their leases will expire.", self.worker_id)
        # Claimed but never started jobs (queued for an executor) are covered by the release too.
        self._maintenance_done.set()
        for t in self._threads:
            t.join(timeout=2.0)
        try:
            engine.unregister_worker(using=self.using, worker_id=self.worker_id)
        except DatabaseError:
            logger.warning("Worker %s could not remove its row; the reaper will.", self.worker_id)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self.stats.stopped_at = time.monotonic()
        _close_connection(self.using)
        logger.info("Worker %s stopped: %s", self.worker_id, self.stats.summary())

    def _install_signal_handlers(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            self._signals_seen += 1
            now = time.monotonic()
            if self._signals_seen == 1:
                self._first_signal_at = now
            # A second signal within a second is the same request arriving twice (a terminal's
            # Ctrl-C reaches both the supervisor, which forwards it, and this process).
            elif now - self._first_signal_at > 1.0:
                # Second signal: leave now; leases hand the running jobs to other workers.
                os.write(2, b"django_jobs: second signal, exiting at once.\n")
                os._exit(1)
            logger.warning(
                "Worker %s: %s received, shutting down (grace %.0fs; send again to exit at once).",
                self.worker_id,
                signal.Signals(signum).name,
                self.grace,
            )
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def _require_int(name: str, value: Any, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        allowed = f"{low}..{high}" if high is not None else f">= {low}"
        raise InvalidWorkerOption(f"{name} must be an integer {allowed}; got {value!r}.")


def _crashed(what: str, exc: BaseException) -> WorkerCrashed:
    return WorkerCrashed(
        f"{what[:1].upper()}{what[1:]} failed with {type(exc).__name__}: {str(exc).strip()}. Retrying cannot fix this; is the "
        "database migrated (`manage.py migrate`) and reachable with these settings?"
    )


def _send_robust(signal: Any, sender: type, **kwargs: Any) -> None:
    for receiver, response in signal.send_robust(sender=sender, **kwargs):
        if isinstance(response, Exception):
            logger.error("Signal receiver %r raised", receiver, exc_info=response)


def _close_connection(using: str) -> None:
    try:
        connections[using].close()
    except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is dropped anyway
        logger.debug("closing a broken connection failed", exc_info=True)

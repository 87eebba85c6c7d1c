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
import math
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, close_old_connections, connections
from django.utils.crypto import get_random_string

from .. import engine
from ..conf import get_settings
from ..db import is_transient
from ..exceptions import (
    ChildProcessDied,
    InvalidWorkerOption,
    JobCancelled,
    JobsConfigurationError,
    JobsError,
    JobTimeout,
    WorkerCrashed,
)
from ..models import Job
from ..services import DedupSweeper, PartitionSweeper, Promoter, Pruner, Reaper, Rescuer, Scheduler
from ..signals import job_cancelled, job_retried, job_snoozed, send_job_signal, worker_started, worker_stopped
from ..states import JobState
from .completer import Completer
from .executor import Attempt, Executor, error_record, event_loop_thread, job_timeout, outcome_for
from .isolation import ChildProcess
from .listener import CHANNEL_RE, Listener
from .stop_signals import StopRequests, install_stop_handler, signal_relay

logger = logging.getLogger("django_jobs.worker")
job_logger = logging.getLogger("django_jobs.worker.jobs")

#: While the queue has a backlog, the producer waits up to this long for running jobs to finish
#: before it claims, so one claim (a round trip and a commit, about a millisecond) fills several
#: slots instead of one each; short jobs finish within it, long ones barely notice it.
CLAIM_LINGER = 0.002
#: A claim's jobs are handed to one idle executor thread, which runs them one after another:
#: waking a thread per job cost as much CPU as running a short job. Jobs still waiting for an
#: executor this long after the last one was taken (the thread is stuck in a longer job) are
#: spread over the idle threads, so a long job delays the jobs claimed with it by this much at
#: most, and ``concurrency`` long jobs still run at once.
SPREAD_AFTER = 0.002
#: A worker holds up to ``concurrency * prefetch`` claimed jobs (running and waiting for a
#: thread) while its jobs run shorter than this on average, so one claim feeds several rounds of
#: short jobs (a claim costs a round trip and a commit); with longer jobs it claims only for free
#: threads. See Worker(prefetch=...).
SHORT_JOB = 0.005
#: Claimed jobs that waited this long for a thread while every thread was busy (the jobs turned
#: out long) are handed back to the queue for other workers, and prefetching pauses until
#: ``concurrency`` more jobs have ended.
PREFETCH_HOLD = 0.1
#: The default of Worker(prefetch=...) and runworker --prefetch, and its upper bound.
DEFAULT_PREFETCH = 8
MAX_PREFETCH = 100
#: Jobs per statement when prefetched jobs are handed back (SQLite's limit on parameters).
RELEASE_CHUNK = 400
#: Most outcomes waiting for the completer before the producer stops claiming (see _produce). A
#: healthy drain of no-op jobs with -c 8 and prefetch keeps up to about 250 finished jobs
#: waiting for or in the completer's statement (docs/benchmarks.md), so it may touch this bound
#: for a moment; after a reconnect it keeps the window from growing with each claim.
OUTCOME_BACKLOG = 200
#: Seconds between reads of which queues have a concurrency or rate limit (see _claim_gated).
GATED_REFRESH = 1.0

#: How often a worker asks the database for cancels of its running jobs when no NOTIFY tells it
#: (SQLite, or PostgreSQL while the listener reconnects).
CANCEL_POLL_INTERVAL = 0.5

ISOLATIONS = ("thread", "process")
#: Upper bounds of the worker's options (the runworker reference lists every bound). --sleep and
#: --grace are waits: a day is plenty, and much longer ones overflow thread waits' timeouts.
MAX_CONCURRENCY = 1000
MAX_WAIT_SECONDS = 86400
#: The length of a Worker row's id and of Job.worker_id.
MAX_WORKER_ID_LENGTH = 200


@dataclass
class WorkerStats:
    completed: int = 0
    failed: int = 0
    retried: int = 0
    snoozed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    started_at: float = field(default_factory=time.monotonic)
    stopped_at: float | None = None
    released: int = 0
    #: What the completer measured of the window in which finished jobs were still active
    #: (:class:`~django_jobs.worker.completer.OutcomeWindow`); runworker prints it at -v 2.
    outcome_window: str = ""

    @property
    def processed(self) -> int:
        return self.completed + self.failed + self.retried + self.snoozed + self.cancelled

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
            + "".join(
                f", {getattr(self, name)} {name.replace('_', ' ')}"
                for name in ("snoozed", "cancelled", "timed_out", "released")
                if getattr(self, name)
            )
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
        _require_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
        _require_int("prefetch", prefetch, 1, MAX_PREFETCH)
        if max_jobs is not None:
            _require_int("max_jobs", max_jobs, 1, None)
        if max_time is not None:
            _require_seconds("max_time", max_time, zero_ok=False, high=None)
        if sleep is not None:
            _require_seconds("sleep", sleep, zero_ok=False, high=MAX_WAIT_SECONDS)
        _require_seconds("grace", grace, zero_ok=True, high=MAX_WAIT_SECONDS)
        if worker_id is not None:
            _require_worker_id(worker_id)
        if isolation not in ISOLATIONS:
            raise InvalidWorkerOption(f"isolation must be one of {', '.join(ISOLATIONS)}; got {isolation!r}.")

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
            _require_seconds("POLL_INTERVAL", self.settings.POLL_INTERVAL, zero_ok=False, high=MAX_WAIT_SECONDS)
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
        self._gated: list[str] = []
        self._gated_checked_at = float("-inf")
        self._claim_rounds = 0
        # _slots (the producer waits on it) and _work (idle executor threads wait on it) share
        # one lock, which also guards the counters and the ready list below.
        lock = threading.RLock()
        self._slots = threading.Condition(lock)
        self._work = threading.Condition(lock)
        self._inflight = 0  # claimed and not finished: waiting in _ready or running
        # _finish wakes the producer once _inflight is down to this (what it waits for).
        self._want = concurrency - 1
        # Moving average of how long a job took on an executor thread (None: none ran yet): the
        # producer prefetches while it is under SHORT_JOB.
        self._run_avg: float | None = None
        # Attempts taken out of _ready after PREFETCH_HOLD, for the producer to hand back; after
        # that, no prefetching until this many more jobs have ended (threads came free).
        self._stale: list[Attempt] = []
        self._prefetch_paused = 0
        self._claimed_total = 0
        # Attempts claimed and not yet taken by an executor thread, oldest first; _ready_moved is
        # when the list last gained its first attempt or lost one to a thread (see SPREAD_AFTER).
        self._ready: deque[Attempt] = deque()
        self._ready_moved = 0.0
        self._idle = 0  # executor threads waiting on _work
        self._executors_done = False  # shutdown: executor threads end once idle
        # The leases this worker holds: claim token -> its jobs not yet written or released.
        # Only these are renewed. Tokens of claims whose answer was lost (it may have committed)
        # are in _lost_claims until their jobs are handed back.
        self._held: Counter[uuid.UUID] = Counter()
        self._held_lock = threading.Lock()
        self._lost_claims: set[uuid.UUID] = set()
        self._event_loop = event_loop_thread("jobs-asyncio")
        self._executor = Executor(worker_id=self.worker_id, loop_getter=self._event_loop)
        try:
            self._executor.chain_for(backend)  # a broken MIDDLEWARE fails here, not job by job
        except JobsConfigurationError as exc:
            raise InvalidWorkerOption(str(exc)) from None
        from ..schedules import InvalidSchedule, declaration_fields, declared_schedules

        declared = declared_schedules(backend)
        if not isinstance(declared, dict):
            raise InvalidWorkerOption("SCHEDULES must be a dict of {name: declaration}.")
        for name, declaration in declared.items():
            try:
                declaration_fields(name, declaration)
            except InvalidSchedule as exc:
                raise InvalidWorkerOption(f"SCHEDULES: {exc}") from None
        from ..queues import validate_queue_declarations

        try:
            validate_queue_declarations(self.settings.QUEUES)
        except JobsConfigurationError as exc:
            raise InvalidWorkerOption(str(exc)) from None
        # Attempts of the jobs this worker claimed, from the claim to the end of the attempt: the
        # watchdog reads their deadlines, cancels reach them here (even before they start).
        self._attempts: dict[Any, Attempt] = {}
        self._attempts_lock = threading.Lock()
        # Children of --isolation process, so shutdown can stop those still running jobs.
        self._children: set[ChildProcess] = set()
        self._children_lock = threading.Lock()
        self._killing_children = threading.Event()
        self._listener: Listener | None = None
        self._completer = Completer(using=self.using, stopping=self._stopping, on_written=self._on_written)
        self._threads: list[threading.Thread] = []
        self._crash: WorkerCrashed | None = None

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
                cap = self._cap()
                while self._inflight >= cap and not self._stale and not self._stopping.is_set():
                    self._wait_slots(1.0, cap - 1)
                    cap = self._cap()
                # After a claim that filled every slot, wait a little for running jobs to end
                # (all of them; while prefetching, those beyond one per thread) and claim once.
                linger_until = time.monotonic() + CLAIM_LINGER
                low = self.concurrency if cap > self.concurrency else 0
                while backlog and self._inflight > low and not self._stale and not self._stopping.is_set():
                    remaining = linger_until - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wait_slots(remaining, low)
                free = max(0, cap - self._inflight)
            if self._stopping.is_set():
                break
            # Finished jobs stay active until the completer writes their outcome: while it is
            # behind (a reconnect, a slow database) claim nothing more, so that window holds at
            # most OUTCOME_BACKLOG jobs (plus one claim's) rather than growing with each claim.
            if not self._completer.wait_below(OUTCOME_BACKLOG, timeout=1.0):
                continue
            if self.max_jobs is not None:
                left = self.max_jobs - self._claimed_total
                if left <= 0 and not self._stale:
                    if self._wait_idle_then_stop():
                        break
                    continue  # prefetched jobs went back to the queue: claim in their place
                free = min(free, left)
            # Clear before claiming: a NOTIFY that lands during the claim keeps us awake.
            self._wake.clear()
            wake_in: float | None = None
            try:
                if self._stale:
                    self._hand_back_stale()
                    failures = 0
                    continue
                if self._lost_claims:
                    self._release_lost_claims()  # first: their jobs may be the next to run
                if not free:
                    continue  # the cap fell since the wait above (the jobs got longer)
                jobs, gated, wake_in = self._claim(free)
                failures = 0
            except DatabaseError as exc:
                if not is_transient(exc):
                    # Not a dropped connection or a busy database: retrying would spin forever.
                    raise _crashed("claiming jobs", exc) from exc
                failures += 1
                self._db_trouble("claim", exc, failures)
                continue
            if jobs or gated:
                claimed = gated + jobs
                with self._held_lock:
                    self._held.update(job.lease_token for job in claimed)
                in_child = self.isolation == "process"
                attempts = [Attempt(job, timeout=job_timeout(job), watched=True, in_child=in_child) for job in claimed]
                with self._attempts_lock:
                    for attempt in attempts:
                        self._attempts[attempt.job.id] = attempt
                with self._slots:
                    self._claimed_total += len(claimed)
                    self._inflight += len(claimed)
                    if not self._ready:
                        self._ready_moved = time.monotonic()
                    # A limited queue's jobs go first, so they hold its limit only until a
                    # thread is free (see _claim).
                    self._ready.extendleft(reversed(attempts[: len(gated)]))
                    self._ready.extend(attempts[len(gated) :])
                    # One thread for the whole claim; the others only if its jobs turn out long.
                    self._work.notify()
                jobs = claimed
                backlog = len(jobs) == free
                if backlog:
                    continue
            backlog = False
            if self.stop_when_empty and self._nothing_left():
                logger.info("Worker %s: queues are empty, stopping.", self.worker_id)
                break
            if not jobs and not self._stale:
                timeout = self.sleep * random.uniform(0.75, 1.25)
                if wake_in is not None:  # a rate limit frees a start then
                    timeout = min(timeout, max(wake_in, 0.001))
                with self._slots:
                    timeout = self._until_spread(timeout)
                self._wake.wait(timeout=timeout)
                with self._slots:
                    self._spread()

    def _cap(self) -> int:
        """How many claimed jobs the worker may hold now (see SHORT_JOB)."""
        avg = self._run_avg
        if avg is not None and avg < SHORT_JOB and not self._prefetch_paused:
            return self.concurrency * self.prefetch
        return self.concurrency

    def _until_spread(self, timeout: float) -> float:
        """``timeout``, cut short to when the attempts waiting in _ready are due to be spread
        over idle executor threads (see SPREAD_AFTER), or handed back when no thread is idle
        (see PREFETCH_HOLD). Called with _slots held."""
        if not self._ready:
            return timeout
        wait = SPREAD_AFTER if self._idle else PREFETCH_HOLD
        return min(timeout, max(0.0, self._ready_moved + wait - time.monotonic()))

    def _spread(self) -> None:
        """Wake idle executor threads for the attempts that waited SPREAD_AFTER in _ready: the
        thread running their claim is stuck in a longer job. With no thread idle, attempts that
        waited PREFETCH_HOLD go to _stale, for the producer to hand back. Called with _slots held."""
        if not self._ready:
            return
        now = time.monotonic()
        if self._idle:
            if now - self._ready_moved >= SPREAD_AFTER:
                self._work.notify(min(len(self._ready), self._idle))
                # Counted as a move: the woken threads count as idle until they run, and the
                # producer must not spin on waits cut to nothing meanwhile.
                self._ready_moved = now
        elif now - self._ready_moved >= PREFETCH_HOLD:
            self._stale += self._ready
            self._inflight -= len(self._ready)
            self._claimed_total -= len(self._ready)
            self._ready.clear()
            self._prefetch_paused = self.concurrency  # until that many jobs have ended
            self._slots.notify()
            self._wake.set()

    def _wait_slots(self, timeout: float, want: int) -> None:
        """Wait up to ``timeout`` for running jobs to end until ``want`` are left (with _slots
        held), spreading the attempts left waiting for an executor meanwhile: every wait of the
        producer is a wait of this."""
        self._want = want
        self._slots.wait(self._until_spread(timeout))
        self._spread()

    def _hand_back_stale(self) -> None:
        """Release the claimed jobs that waited too long for a thread (producer thread), each
        only under the lease it was claimed with; one cancelled meanwhile ends as cancelled
        through the completer, as it would have on a thread. Raises DatabaseError (the jobs
        stay in _stale, to be tried again)."""
        with self._slots:
            stale = list(self._stale)
        cancelled = [a for a in stale if a.cancelled.is_set()]
        waiting = [a for a in stale if not a.cancelled.is_set()]
        released = 0
        for i in range(0, len(waiting), RELEASE_CHUNK):
            part = waiting[i : i + RELEASE_CHUNK]
            released += engine.release_jobs(
                using=self.using,
                worker_id=self.worker_id,
                job_ids=[a.job.id for a in part],
                lease_tokens={a.job.lease_token for a in part},
            )
        with self._slots:
            done = {id(a) for a in stale}
            self._stale = [a for a in self._stale if id(a) not in done]
        with self._attempts_lock:
            for a in stale:
                if self._attempts.get(a.job.id) is a:
                    del self._attempts[a.job.id]
        with self._held_lock:
            self._held.subtract(a.job.lease_token for a in waiting)
            for token in {a.job.lease_token for a in waiting}:
                if self._held[token] <= 0:
                    del self._held[token]
        with self._slots:
            self.stats.released += released
        for a in cancelled:
            a.start()
            outcome = self._executor.give_up(a, JobCancelled(f"Job {a.job.id} was cancelled before it started."))
            if outcome is not None:
                self._completer.submit(outcome)  # its slot was freed when it went stale
        logger.info(
            "Worker %s: handed %d claimed job(s) back; they waited %gs for a thread behind longer jobs.",
            self.worker_id,
            released,
            PREFETCH_HOLD,
        )

    def _claim(self, free: int) -> tuple[list[Any], list[Any], float | None]:
        """Claim up to ``free`` jobs: from the queues without limits (one statement) and from the
        limited ones (each under its lock, at most ``concurrency`` per round), the limited ones
        first every other round so a busy unlimited queue cannot starve them. Returns both
        lists: the caller queues the limited ones' jobs ahead of the others. Jobs already
        claimed are kept when the second step meets a transient database error (it is retried
        next round)."""

        def fast(n: int) -> tuple[list[Any], float | None]:
            token = self._new_claim_token()
            jobs = engine.claim_jobs(
                using=self.using,
                queues=self.queues,
                limit=n,
                worker_id=self.worker_id,
                lease_seconds=self.settings.LEASE_SECONDS,
                backend=self.backend,
                lease_token=token,
            )
            self._lost_claims.discard(token)
            return jobs, None

        steps = [self._claim_gated, fast] if self._claim_rounds % 2 else [fast, self._claim_gated]
        self._claim_rounds += 1
        jobs: list[Any] = []
        gated: list[Any] = []
        wake: float | None = None
        for step in steps:
            n = free - len(jobs) - len(gated) if step is fast else min(self.concurrency, free - len(jobs))
            if n <= 0:
                continue
            try:
                got, wake_in = step(n)
            except DatabaseError as exc:
                self._keep_claimed(jobs + gated, exc)
                break
            (jobs if step is fast else gated).extend(got)
            if wake_in is not None:
                wake = wake_in
        return jobs, gated, wake

    def _keep_claimed(self, jobs: list[Any], exc: DatabaseError) -> None:
        """A claim failed after earlier claims of this round took ``jobs``: keep those (the
        failed claim is retried next round) when the error is transient; raise otherwise."""
        if not jobs or not is_transient(exc):
            raise exc
        logger.warning("Worker %s: a claim failed (%s); keeping the %d job(s) claimed.",
                       self.worker_id, exc, len(jobs))  # fmt: skip

    def _claim_gated(self, free: int) -> tuple[list[Any], float | None]:
        """Claim from this worker's queues that have a concurrency or rate limit (each under its
        lock, in a random order so no queue starves); the jobs and the soonest rate-limit wake."""
        now = time.monotonic()
        if now >= self._gated_checked_at + GATED_REFRESH:
            # A newly limited queue is skipped by claim_jobs at once (exactness lives in SQL);
            # this list only says which queues to claim through their lock, so it may be stale.
            self._gated = engine.gated_queues(using=self.using, queues=self.queues)
            self._gated_checked_at = now
        jobs: list[Any] = []
        wake: float | None = None
        for name in random.sample(self._gated, len(self._gated)):
            if free <= 0:
                break
            token = self._new_claim_token()
            try:
                claimed, wake_in = engine.claim_gated_jobs(
                    using=self.using,
                    queue=name,
                    limit=free,
                    worker_id=self.worker_id,
                    lease_seconds=self.settings.LEASE_SECONDS,
                    backend=self.backend,
                    lease_token=token,
                )
            except DatabaseError as exc:
                self._keep_claimed(jobs, exc)  # what the other queues' claims took is ours to run
                break
            self._lost_claims.discard(token)
            jobs += claimed
            free -= len(claimed)
            if wake_in is not None:
                wake = wake_in if wake is None else min(wake, wake_in)
        return jobs, wake

    def _new_claim_token(self) -> uuid.UUID:
        """A lease token for the next claim, counted as lost until the claim's answer arrives: a
        claim can commit and then lose its answer with the connection, and its rows must then be
        handed back (see _release_lost_claims), not left active under a worker that never runs
        them."""
        token = uuid.uuid4()
        self._lost_claims.add(token)
        return token

    def _release_lost_claims(self) -> None:
        """Hand back the jobs of claims whose answer was lost (producer thread). Repeating it is
        harmless, so a release whose own answer is lost is simply tried again."""
        tokens = set(self._lost_claims)
        released = engine.release_jobs(using=self.using, worker_id=self.worker_id, lease_tokens=tokens)
        self._lost_claims -= tokens
        if released:
            logger.warning(
                "Worker %s: a claim committed but its answer was lost; handed its %d job(s) back to waiting.",
                self.worker_id,
                released,
            )

    def _held_tokens(self) -> list[uuid.UUID]:
        with self._held_lock:
            return list(self._held)

    def _sync_schedules(self) -> None:
        from ..queues import sync_queues
        from ..schedules import declared_schedules, sync_schedules

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

    def _wait_idle_then_stop(self) -> bool:
        """--max-jobs: wait for the claimed jobs to end; False when some went back to the queue
        instead (see PREFETCH_HOLD), so others are to be claimed in their place."""
        with self._slots:
            while self._inflight and not self._stale and not self._stopping.is_set():
                self._wait_slots(0.5, 0)
            if self._stale:
                return False
        logger.info("Worker %s: --max-jobs reached.", self.worker_id)
        return True

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

    def _next_attempt(self) -> Attempt | None:
        """The next claimed attempt for this executor thread, waiting while there is none; None
        once the worker shuts down."""
        with self._slots:
            while not self._ready:
                if self._executors_done:
                    return None
                self._idle += 1
                try:
                    self._work.wait()
                finally:
                    self._idle -= 1
            self._ready_moved = time.monotonic()
            return self._ready.popleft()

    def _execute_loop(self) -> None:
        verbose = job_logger.isEnabledFor(logging.INFO)
        child: ChildProcess | None = None
        try:
            while True:
                attempt = self._next_attempt()
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
                    avg = self._run_avg
                    self._run_avg = took if avg is None else avg + (took - avg) * 0.2
                    # Connection housekeeping after each job, as Django does at a request's end:
                    # the next job must not inherit a connection this one left in a transaction,
                    # broken, or past CONN_MAX_AGE (about a microsecond when there is none).
                    close_old_connections()
                    with self._attempts_lock:
                        if self._attempts.get(job.id) is attempt:
                            del self._attempts[job.id]
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
                self._finish(outcome)
        finally:
            if child is not None:
                child.close()

    def _finish(self, outcome: engine.Outcome) -> None:
        """Hand an attempt's outcome to the completer and free its slot."""
        self._completer.submit(outcome)
        with self._slots:
            self._inflight -= 1
            if self._prefetch_paused:
                self._prefetch_paused -= 1
            # Only the producer waits on _slots, for _inflight to come down to _want: waking it
            # for each job would cost a thread switch per job.
            if self._inflight <= self._want:
                self._slots.notify()

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
                child = ChildProcess(worker_id=self.worker_id, index=self._claimed_total)
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
            with self._slots:
                # Also here, not only at the producer's waits: the producer may be held in a
                # slow claim or a database outage while claimed jobs wait behind a long one.
                self._spread()
            with self._attempts_lock:
                due = [
                    a
                    for a in self._attempts.values()
                    if a.deadline is not None and now >= a.deadline and not a.in_child and a.future is None
                ]
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
        with self._attempts_lock:
            if self._attempts.get(job.id) is attempt:
                del self._attempts[job.id]
        with self._slots:
            self.stats.timed_out += 1
        logger.warning(
            "Job %s ran past its timeout of %gs: recorded as %s. Its thread cannot be stopped and "
            "runs on; a new thread takes its slot (use --isolation process to kill such jobs).",
            job.id,
            attempt.timeout,
            outcome.state,
        )
        self._finish(outcome)  # first: the outcome must be recorded whatever happens next
        self._spawn_executor()

    def _on_cancel(self, job_id: Any) -> None:
        """A running job of ours was cancelled: tell its attempt (threads see is_cancelled(),
        coroutines are cancelled, child processes killed)."""
        with self._attempts_lock:
            attempt = self._attempts.get(job_id)  # None: another worker's job, or already ended
        if attempt is not None and not attempt.cancelled.is_set():
            logger.info("Job %s was cancelled while running.", job_id)
            attempt.cancel()

    def _on_written(self, outcomes: list[engine.Outcome], written: dict[Any, str]) -> None:
        """Count what was stored and send the job signals, ``task_finished`` first (completer
        thread, after the commit)."""
        with self._held_lock:
            self._held.subtract(o.lease_token for o in outcomes)
            for token in {o.lease_token for o in outcomes}:
                if self._held[token] <= 0:
                    del self._held[token]
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
                        using=self.using, lease_tokens=self._held_tokens(), lease_seconds=s.LEASE_SECONDS
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
                    self._crash = _crashed("maintenance", exc)
                    logger.error("Worker %s: %s", self.worker_id, self._crash)
                    self.stop()
                    break
                failures += 1
                self._db_trouble("maintenance", exc, failures)
            except Exception:  # noqa: BLE001 - a bug or a receiver's error must not stop lease renewal
                failures += 1
                logger.exception("Worker %s: maintenance step failed; retrying.", self.worker_id)
                self._stopping.wait(min(5.0, 0.05 * 2 ** min(failures, 6)))
        _close_connection(self.using)

    def _poll_cancels(self) -> None:
        with self._attempts_lock:
            running = bool(self._attempts)
        if running:
            for job_id in engine.cancel_requested_ids(using=self.using, worker_id=self.worker_id):
                self._on_cancel(job_id)

    # -- lifecycle --------------------------------------------------------------------------------

    def _start_threads(self) -> None:
        def spawn(target: Callable[[], None], name: str) -> None:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

        self._executor_threads = []
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
        with self._slots:
            # Jobs claimed but not started are not run: the release below hands them back.
            self._inflight -= len(self._ready)
            self._ready.clear()
            while self._inflight and time.monotonic() < deadline:
                self._wait_slots(min(0.2, max(0.0, deadline - time.monotonic())), 0)
            still_running = self._inflight
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
        with self._slots:
            self._ready.clear()
            self._executors_done = True  # threads given up by the watchdog end on their own
            self._work.notify_all()
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
        _close_connection(self.using)
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
                _close_connection(self.using)
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


def _require_int(name: str, value: Any, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        allowed = f"{low}..{high}" if high is not None else f">= {low}"
        raise InvalidWorkerOption(f"{name} must be an integer {allowed}; got {value!r}.")


def _require_seconds(name: str, value: Any, *, zero_ok: bool, high: float | None) -> None:
    """A finite number of seconds from 0 (``zero_ok``) or above it, up to ``high``. NaN passes
    every comparison with a bound (a NaN poll interval made an idle worker spin), infinity
    overflows a thread wait, and an int too large for a float overflows the arithmetic."""
    try:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        ok = False
    if ok and (value < 0 or (value == 0 and not zero_ok) or (high is not None and value > high)):
        ok = False
    if not ok:
        allowed = (">= 0" if zero_ok else "> 0") + (f" and <= {high:g}" if high is not None else " and finite")
        raise InvalidWorkerOption(f"{name} must be a number of seconds {allowed}; got {value!r}.")


def _require_worker_id(value: Any) -> None:
    """A worker id is stored in a varchar(200) and read in logs and the admin: 1-200 printable
    characters (no newline, tab or other control character), no whitespace at either end.
    ``None``, not an empty string, asks for a generated id."""
    if not isinstance(value, str):
        problem = f"must be a string, or None for a generated id; got {value!r}"
    elif not value.strip():
        problem = f"must not be empty or blank; leave it out (None) for a generated id; got {value!r}"
    elif len(value) > MAX_WORKER_ID_LENGTH:
        problem = f"must be at most {MAX_WORKER_ID_LENGTH} characters; got {len(value)}"
    elif value != value.strip():
        problem = f"must not start or end with whitespace; got {value!r}"
    elif not value.isprintable():
        problem = f"must be printable characters only, no control characters (newline, tab...); got {value!r}"
    else:
        return
    raise InvalidWorkerOption(f"worker_id {problem}.")


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

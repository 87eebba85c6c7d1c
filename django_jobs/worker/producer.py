"""The producer, on the thread that calls :meth:`Worker.run() <.runner.Worker.run>`.

It claims as many jobs as there are free slots (more while jobs are short: see SHORT_JOB; in
smaller claims while they run long: see LONG_CLAIM) and hands them to the executor threads, a
claim at a time (see SPREAD_AFTER); when nothing is ready it sleeps until a NOTIFY, a freed slot,
or the jittered poll interval. It hands back prefetched jobs that waited too long for a thread
(see PREFETCH_HOLD) and the jobs of claims whose answer was lost.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import deque
from typing import Any

from django.db import DatabaseError

from .. import engine
from ..conf import JobsSettings
from ..db import is_transient
from ..exceptions import JobCancelled
from ..models import Job
from ..states import JobState
from .completer import Completer
from .coroutines import LoopRunner
from .executor import Attempt, Executor, job_timeout
from .holdings import Attempts, Leases
from .stats import WorkerStats
from .trouble import crashed, db_trouble

logger = logging.getLogger("django_jobs.worker")

#: While the queue has a backlog and its jobs are short (see SHORT_JOB), the producer waits up to
#: this long for running jobs to finish before it claims, so one claim (a round trip and a commit,
#: about a millisecond) fills several slots instead of one each. Not while jobs run long: they do
#: not end within it, except in lockstep (see LONG_CLAIM), which the wait would keep.
CLAIM_LINGER = 0.002
#: While jobs run long (SHORT_JOB or more on average, or none has ended yet), one claim takes half
#: of the free slots, at least LONG_CLAIM of them, and the producer claims again at once while
#: slots are free. A claim of every free slot starts its jobs together; jobs of one length then
#: end together, and all their slots wait for the next claim (a commit of the whole batch's rows:
#: 5 ms for 100), claim after claim. Halving splits slots that came free together over claims a
#: claim's time apart, so the jobs drift apart and a slot waits about one small claim.
#: ``await asyncio.sleep()`` jobs at ``-c 100``: 3,490 → 4,270 jobs/s at 20 ms, 7,060 → 8,860
#: at 5 ms (docs/benchmarks.md).
LONG_CLAIM = 8
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
#: Jobs per statement when prefetched jobs are handed back (SQLite's limit on parameters).
RELEASE_CHUNK = 400
#: Most outcomes waiting for the completer before the producer stops claiming (see run). A
#: healthy drain of no-op jobs with -c 8 and prefetch keeps up to about 250 finished jobs
#: waiting for or in the completer's statement (docs/benchmarks.md), so it may touch this bound
#: for a moment; after a reconnect it keeps the window from growing with each claim.
OUTCOME_BACKLOG = 200
#: Seconds between reads of which queues have a concurrency or rate limit (see _claim_gated).
GATED_REFRESH = 1.0


class Producer:
    """Claims jobs for ``concurrency`` executor threads, which take them with
    :meth:`next_attempt` and give their slot back with :meth:`finish`; keeps ``attempts`` and
    ``leases`` up to date with what it claims and hands back."""

    def __init__(
        self,
        *,
        using: str,
        backend: str,
        settings: JobsSettings,
        worker_id: str,
        queues: list[str] | None,
        concurrency: int,
        prefetch: int,
        isolation: str,
        stop_when_empty: bool,
        max_jobs: int | None,
        max_time: float | None,
        sleep: float,
        stopping: threading.Event,
        wake: threading.Event,
        completer: Completer,
        executor: Executor,
        attempts: Attempts,
        leases: Leases,
        stats: WorkerStats,
        loop_runner: LoopRunner | None = None,
    ):
        self.using = using
        self.backend = backend
        self.settings = settings
        self.worker_id = worker_id
        self.queues = queues
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.isolation = isolation
        self.stop_when_empty = stop_when_empty
        self.max_jobs = max_jobs
        self.max_time = max_time
        self.sleep = sleep
        self._stopping = stopping
        self._wake = wake
        self._completer = completer
        self._executor = executor
        self._attempts = attempts
        self._held = leases
        self.stats = stats
        #: Runs the attempts of async def tasks on the event loop (None: every job takes a thread).
        self._loop_runner = loop_runner
        # Set once an attempt ran on the loop: from then on the worker claims only for free
        # slots (no prefetch), since an attempt on the loop starts at once, not when a thread is
        # free, and concurrency must bound the jobs running at once.
        self._loop_seen = False

        self._gated: list[str] = []
        self._gated_checked_at = float("-inf")
        self._claim_rounds = 0
        # _slots (the producer waits on it) and _work (idle executor threads wait on it) share
        # one lock, which also guards the counters and the ready list below.
        lock = threading.RLock()
        self._slots = threading.Condition(lock)
        self._work = threading.Condition(lock)
        # Held directly on the per-job paths (next_attempt, finish): a Condition's `with` is two
        # Python calls around the lock's.
        self._lock = lock
        self._inflight = 0  # claimed and not finished: waiting in _ready or running
        # finish() wakes the producer once _inflight is down to this (what it waits for).
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
        # Tokens of claims whose answer was lost (it may have committed) are in _lost_claims
        # until their jobs are handed back; they are not in the leases, so not renewed.
        self._lost_claims: set[uuid.UUID] = set()

    @property
    def inflight(self) -> int:
        """Jobs claimed and not finished: waiting for an executor thread or running."""
        return self._inflight

    @property
    def claimed_total(self) -> int:
        return self._claimed_total

    def interrupt(self) -> None:
        """Wake the producer from a wait for slots (the worker is stopping)."""
        with self._slots:
            self._slots.notify_all()

    def run(self) -> None:
        """Claim and hand out jobs until the worker stops, --max-time or --max-jobs is reached,
        or, with --stop-when-empty, no job is left in the queues."""
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
                short = self._short()
                # After a claim that filled every slot, while jobs are short, wait a little for
                # running jobs to end (all of them; while prefetching, those beyond one per
                # thread) and claim once.
                linger_until = time.monotonic() + CLAIM_LINGER
                low = self.concurrency if cap > self.concurrency else 0
                while backlog and short and self._inflight > low and not self._stale and not self._stopping.is_set():
                    remaining = linger_until - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wait_slots(remaining, low)
                free = max(0, cap - self._inflight)
                if not short:
                    free = min(free, max(LONG_CLAIM, free // 2))
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
                    raise crashed("claiming jobs", exc) from exc
                failures += 1
                self._db_trouble("claim", exc, failures)
                continue
            if jobs or gated:
                claimed = gated + jobs
                self._held.add(job.lease_token for job in claimed)
                in_child = self.isolation == "process"
                attempts = [Attempt(job, timeout=job_timeout(job), watched=True, in_child=in_child) for job in claimed]
                self._attempts.add(attempts)
                on_loop = self._for_loop(attempts)
                with self._slots:
                    self._claimed_total += len(claimed)
                    self._inflight += len(claimed)
                    first, rest = attempts[: len(gated)], attempts[len(gated) :]
                    if on_loop:
                        first = [a for a in first if id(a) not in on_loop]
                        rest = [a for a in rest if id(a) not in on_loop]
                    if first or rest:
                        if not self._ready:
                            self._ready_moved = time.monotonic()
                        # A limited queue's jobs go first, so they hold its limit only until a
                        # thread is free (see _claim).
                        self._ready.extendleft(reversed(first))
                        self._ready.extend(rest)
                        # While jobs are short, one thread for the whole claim; the others only if
                        # its jobs turn out long. While they run long, a thread for each at once.
                        self._work.notify(1 if short else len(first) + len(rest))
                if on_loop:
                    assert self._loop_runner is not None
                    self._loop_runner.start([a for a in attempts if id(a) in on_loop])
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

    def _for_loop(self, attempts: list[Attempt]) -> set[int]:
        """The ids of the ``attempts`` that run on the event loop rather than on a thread."""
        if self._loop_runner is None:
            return set()
        ids = {id(a) for a in attempts if self._executor.runs_on_loop(a.job)}
        if ids:
            self._loop_seen = True
        return ids

    def _cap(self) -> int:
        """How many claimed jobs the worker may hold now (see SHORT_JOB)."""
        if self._loop_seen:
            return self.concurrency
        if self._short() and not self._prefetch_paused:
            return self.concurrency * self.prefetch
        return self.concurrency

    def _short(self) -> bool:
        """Whether the jobs run short: under SHORT_JOB on average (see ran)."""
        avg = self._run_avg
        return avg is not None and avg < SHORT_JOB

    def _until_spread(self, timeout: float) -> float:
        """``timeout``, cut short to when the attempts waiting in _ready are due to be spread
        over idle executor threads (see SPREAD_AFTER), or handed back when no thread is idle
        (see PREFETCH_HOLD). Called with _slots held."""
        if not self._ready:
            return timeout
        wait = SPREAD_AFTER if self._idle else PREFETCH_HOLD
        return min(timeout, max(0.0, self._ready_moved + wait - time.monotonic()))

    def spread(self) -> None:
        """:meth:`_spread` from another thread (the watchdog)."""
        with self._slots:
            self._spread()

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
        self._attempts.discard(*stale)
        self._held.drop([a.job.lease_token for a in waiting])
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
                raise crashed("checking for remaining jobs", exc) from exc
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
        db_trouble(what, exc, failures, worker_id=self.worker_id, using=self.using, stopping=self._stopping)

    # -- the executor threads' side -------------------------------------------------------------

    def next_attempt(self) -> Attempt | None:
        """The next claimed attempt for this executor thread, waiting while there is none; None
        once the worker shuts down."""
        with self._lock:
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

    def ran(self, took: float) -> None:
        """A job took ``took`` seconds on an executor thread, or on the event loop from its start
        to its end (see SHORT_JOB)."""
        avg = self._run_avg
        self._run_avg = took if avg is None else avg + (took - avg) * 0.2

    def finish(self, outcome: engine.Outcome) -> None:
        """Hand an attempt's outcome to the completer and free its slot."""
        self._completer.submit(outcome)
        with self._lock:
            self._inflight -= 1
            if self._prefetch_paused:
                self._prefetch_paused -= 1
            # Only the producer waits on _slots, for _inflight to come down to _want: waking it
            # for each job would cost a thread switch per job.
            if self._inflight <= self._want:
                self._slots.notify()

    # -- shutdown ---------------------------------------------------------------------------------

    def drain(self, deadline: float) -> int:
        """Drop the jobs no thread has started and wait until ``deadline`` (monotonic) for the
        running ones to end (shutdown); how many still run."""
        with self._slots:
            self._inflight -= len(self._ready)
            self._ready.clear()
            while self._inflight and time.monotonic() < deadline:
                self._wait_slots(min(0.2, max(0.0, deadline - time.monotonic())), 0)
            return self._inflight

    def end_executors(self) -> None:
        """Let the executor threads end once idle (shutdown)."""
        # Jobs claimed but not started yet are not run: the release below hands them back.
        with self._slots:
            self._ready.clear()
            self._executors_done = True  # threads given up by the watchdog end on their own
            self._work.notify_all()

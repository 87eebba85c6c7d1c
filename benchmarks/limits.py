#!/usr/bin/env python
"""Queue limits, partitions and backpressure of django-jobs against a real PostgreSQL, as counts.

Each figure runs real ``manage.py runworker`` subprocesses on its own database (see
``benchmarks/throughput.py`` for the set-up) and counts what happened, from the job rows and
from what the jobs themselves recorded (``benchmarks.tasks.probe``: a start and an end line per
attempt, appended to a file per worker process, so recording costs two small writes and no
database round trip):

1. ``partitions``: 3 worker processes (``runworker -c 4``) drain 50 partitions x 200 jobs
   (enqueued with one ``enqueue_many`` per partition, so partition-major); the jobs with
   ``seq % 10 == 3`` fail their first attempt (max_attempts=2, backoff 0) and so sit out a retry
   while their partition waits. Counts: jobs completed, lost, started before their predecessor
   finished, attempts overlapping within a partition; wall time.
   ``partitions_kill``: the same with a 5 s lease, one worker SIGKILLed once 30% of the jobs
   completed; also counts the jobs rescued (re-run after the kill).
2. ``rate``: a queue limited to 20 starts/s, 2,000 no-op jobs, 3 worker processes: the most
   starts (``Job.last_attempted_at``) in any 1 s window (an exact sweep) and the time from the
   first start to the last against the ideal ``(2000 / 20 - 1) s``. Takes about 100 s.
3. ``concurrency``: ``set_concurrency(3)``, 300 jobs of 20 ms, 3 processes x 4 threads: the
   most jobs running at once, from the jobs' own start/end times and from sampling the active
   rows every few ms; wall time.
4. ``queuefull``: ``set_max_size(1000)``; 8 processes each try to enqueue 1,000 jobs as fast as
   they can while 2 workers drain; a sampler counts the unfinished jobs every 10 ms. Counts:
   accepted, QueueFull, most unfinished seen (<= 1000), accepted == completed.
5. ``partition_drain``: 10,000 partitions x 10 no-op jobs drained by ``runworker -p 2 -c 8
   --stop-when-empty``, enqueued partition-major (p0j0..p0j9, p1j0, ...: one ``enqueue_many``
   per partition) and round-robin (p0j0, p1j0, ..., p0j1, ...: one ``enqueue()`` each), against
   the same 100,000 jobs without partitions; rate = count / (max(finished_at) -
   min(started_at)), median of ``--runs``. ``--explain`` prints
   EXPLAIN ANALYZE of the claim statement (``engine.claim_jobs``) on each prefilled table.

``--only name[,name]`` picks figures, ``--quick`` shrinks them (a smoke run), ``--runs N`` sets the
runs of the figures reported as a median (``partition_drain``, ``concurrency``). Uses its own
database, ``JOBS_BENCH_DB`` (default ``jobs_bench_limits``; dropped and re-created). Prints a
table; writes each figure's section of ``docs/benchmarks-limits.md`` on a full run, or with
``--write``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Not throughput.py's database: the two may run at the same time.
os.environ.setdefault("JOBS_BENCH_DB", "jobs_bench_limits")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks import throughput as tp  # noqa: E402 - after the environment it reads

DOCS = ROOT / "docs" / "benchmarks-limits.md"
NAMES = ("partitions", "partitions_kill", "rate", "concurrency", "queuefull", "partition_drain")


@dataclass
class Sizes:
    partitions: int = 50
    per_partition: int = 200
    rate_jobs: int = 2_000
    rate_limit: int = 20
    concurrency_jobs: int = 300
    concurrency_limit: int = 3
    job_seconds: float = 0.02
    max_size: int = 1_000
    enqueuers: int = 8
    per_enqueuer: int = 1_000
    drain_partitions: int = 10_000
    drain_per_partition: int = 10


QUICK = Sizes(
    partitions=10,
    per_partition=40,
    rate_jobs=200,
    concurrency_jobs=60,
    max_size=200,
    enqueuers=4,
    per_enqueuer=300,
    drain_partitions=1_000,
)


def fail(message: str) -> None:
    print(f"benchmarks/limits.py: {message}", file=sys.stderr)
    sys.exit(2)


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def truncate() -> None:
    from django.db import connection

    tp.truncate()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_jobs_jobstart")


def scalar(sql: str, params: list | None = None) -> Any:
    return tp.scalar(sql, params)[0]


def unfinished_sql() -> str:
    from django_jobs.engine import UNFINISHED_SQL

    return f"state IN {UNFINISHED_SQL}"


# -- worker subprocesses ------------------------------------------------------------------------


class Workers:
    """``count`` separate ``runworker *args`` processes (each its own worker, as on separate
    hosts), with ``env`` added to the benchmark's worker environment."""

    def __init__(self, count: int, args: list[str], env: dict[str, str] | None = None):
        self.args = args
        self.logs = [tempfile.TemporaryFile("w+") for _ in range(count)]
        full_env = {**tp.worker_env(), **(env or {})}
        self.procs = [
            subprocess.Popen(
                tp.worker_command(*args), cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
            for log in self.logs
        ]
        self.killed: set[int] = set()

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.pid not in self.killed and proc.poll() is not None and proc.returncode != 0:
                self.stop()
                fail(f"runworker {' '.join(self.args)} exited with {proc.returncode}:\n{tp.log_tail(log)}")

    def kill(self, index: int) -> int:
        proc = self.procs[index]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.killed.add(proc.pid)
        return proc.pid

    def wait(self, timeout: float) -> None:
        """Until every process exited (``--stop-when-empty``); fail on an error or ``timeout``."""
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs):
            self.check_alive()
            if time.monotonic() > deadline:
                tails = "\n".join(tp.log_tail(log) for log in self.logs)
                self.stop()
                fail(f"runworker {' '.join(self.args)} did not finish within {timeout:.0f}s:\n{tails}")
            time.sleep(0.05)
        self.check_alive()
        self.close()

    def stop(self) -> None:
        tp.stop_processes(self.procs)
        self.close()

    def close(self) -> None:
        for log in self.logs:
            if not log.closed:
                log.close()


def wait_for(condition: Any, timeout: float, what: str, workers: Workers | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if workers is not None:
            workers.check_alive()
        if time.monotonic() > deadline:
            if workers is not None:
                workers.stop()
            fail(f"{what} did not happen within {timeout:.0f}s.")
        time.sleep(0.02)


class Sampler(threading.Thread):
    """Runs ``sql`` (one integer) on its own connection every ``interval`` s; keeps the max."""

    def __init__(self, sql: str, interval: float):
        super().__init__(daemon=True)
        self.sql, self.interval = sql, interval
        self.max = 0
        self.samples = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        try:
            with tp.connect_raw(tp.DB_NAME, autocommit=True) as conn:
                while not self._stop.is_set():
                    value = conn.execute(self.sql).fetchone()[0]
                    self.max = max(self.max, value)
                    self.samples += 1
                    self._stop.wait(self.interval)
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.error = exc

    def finish(self) -> Sampler:
        self._stop.set()
        self.join()
        if self.error is not None:
            fail(f"the sampler failed: {self.error!r}")
        return self


# -- what the jobs recorded ---------------------------------------------------------------------


@dataclass
class Attempt:
    partition: str
    seq: int
    attempt: int
    pid: int
    start: float
    end: float | None = None
    outcome: str | None = None


def read_attempts(directory: str) -> list[Attempt]:
    """The attempts ``benchmarks.tasks.probe`` recorded: a start line, then (unless the process
    died first) an end line, in each process's own file."""
    attempts: list[Attempt] = []
    for path in sorted(Path(directory).glob("*.tsv")):
        open_: dict[tuple[str, int, int], Attempt] = {}
        for line in path.read_text().splitlines():
            kind, partition, seq, attempt, at, pid, *rest = line.split("\t")
            key = (partition, int(seq), int(attempt))
            if kind == "S":
                open_[key] = Attempt(partition, int(seq), int(attempt), int(pid), float(at))
                attempts.append(open_[key])
            else:
                a = open_.pop(key)
                a.end, a.outcome = float(at), rest[0]
    return attempts


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end at the same instant as a start comes first)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


# -- 1. partitions ------------------------------------------------------------------------------


@dataclass
class PartitionResult:
    expected: int
    completed: int
    lost: int
    early: int
    overlaps: int
    failed_jobs: int
    expected_failures: int
    wall: float
    span: float
    rescued: int = 0
    reran: int = 0
    twice: int = 0
    killed_active: int = 0


def measure_partitions(sizes: Sizes, *, kill: bool) -> PartitionResult:
    from django.db import connection

    from benchmarks.tasks import probe

    truncate()
    queue, n = "parts", sizes.partitions * sizes.per_partition
    out = tempfile.mkdtemp(prefix="jobs-limits-")
    try:
        for p in range(sizes.partitions):
            probe.using(queue_name=queue, partition=f"p{p}").enqueue_many(
                (out, f"p{p}", s, 10) for s in range(sizes.per_partition)
            )
        # A 5 s lease (renewed every 5/3 s) and a rescuer every second when one worker is killed.
        env = {"JOBS_BENCH_LEASE_SECONDS": "5", "JOBS_BENCH_RESCUE_INTERVAL": "1"} if kill else {}
        started = time.monotonic()
        workers = Workers(3, ["-c", "4", "-q", queue, "--stop-when-empty"], env)
        killed_pid, kill_time, killed_active = None, None, 0
        if kill:
            completed = f"SELECT count(*) FROM django_jobs_job WHERE queue = '{queue}' AND state = 'completed'"
            wait_for(lambda: scalar(completed) >= n * 0.3, max(120.0, n / 20), "30% of the jobs completing", workers)
            # Kill a worker while it holds claimed jobs (polled; it may finish them meanwhile).
            holding = (
                "SELECT w.pid, count(*) FROM django_jobs_job j JOIN django_jobs_worker w ON w.id = j.worker_id "
                "WHERE j.state = 'active' AND j.queue = %s GROUP BY w.pid ORDER BY 2 DESC"
            )
            pids = {p.pid: i for i, p in enumerate(workers.procs)}
            deadline = time.monotonic() + 10
            while True:
                with connection.cursor() as cursor:
                    cursor.execute(holding, [queue])
                    busy = [r[0] for r in cursor.fetchall() if r[0] in pids]
                if busy or time.monotonic() > deadline:
                    break
            index = pids[busy[0]] if busy else 0
            killed_pid = workers.procs[index].pid
            kill_time = time.time()
            workers.kill(index)
            killed_active = scalar(
                "SELECT count(*) FROM django_jobs_job j JOIN django_jobs_worker w ON w.id = j.worker_id "
                "WHERE w.pid = %s AND j.state = 'active'",
                [killed_pid],
            )
            note(f"    killed worker pid {killed_pid}; it held {killed_active} active job(s)")
        workers.wait(timeout=max(300.0, n / 20))
        wall = time.monotonic() - started
        attempts = read_attempts(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT partition_key, (args->>2)::int, state, stalled_count FROM django_jobs_job WHERE queue = %s",
            [queue],
        )
        rows = cursor.fetchall()
    span = float(
        scalar(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM django_jobs_job WHERE queue = %s",
            [queue],
        )
        or 0
    )
    by_job: dict[tuple[str, int], list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_job[(a.partition, a.seq)].append(a)
    ok_end = {
        key: max(a.end for a in runs if a.outcome == "ok" and a.end is not None)
        for key, runs in by_job.items()
        if any(a.outcome == "ok" for a in runs)
    }
    completed = sum(1 for r in rows if r[2] == "completed")
    lost = (n - len(rows)) + sum(1 for r in rows if r[2] != "completed" or (r[0], r[1]) not in ok_end)
    # A job's first start must come after the end of its predecessor's successful attempt.
    early = 0
    for partition, seq, _, _ in rows:
        if seq == 0 or (partition, seq) not in by_job:
            continue
        first = min(a.start for a in by_job[(partition, seq)])
        before = ok_end.get((partition, seq - 1))
        if before is None or first < before:
            early += 1
    # Attempts of one partition must not overlap; an attempt the kill cut short ran until then.
    overlaps = 0
    by_partition: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a in attempts:
        end = a.end if a.end is not None else (kill_time if a.pid == killed_pid else float("inf"))
        by_partition[a.partition].append((a.start, end))
    for intervals in by_partition.values():
        intervals.sort()
        latest = float("-inf")
        for start, end in intervals:
            if start < latest:
                overlaps += 1
            latest = max(latest, end)
    # The killed worker's attempts run again elsewhere under the same attempt number (a rescue
    # does not count the interrupted attempt).
    reran = 0
    for runs in by_job.values():
        cut = {a.attempt for a in runs if a.pid == killed_pid}
        if any(a.attempt in cut and a.pid != killed_pid for a in runs):
            reran += 1
    return PartitionResult(
        expected=n,
        completed=completed,
        lost=lost,
        early=early,
        overlaps=overlaps,
        failed_jobs=len({(a.partition, a.seq) for a in attempts if a.outcome == "fail"}),
        expected_failures=sum(1 for _, s, _, _ in rows if s % 10 == 3),
        wall=wall,
        span=span,
        rescued=sum(1 for r in rows if r[3] > 0),
        reran=reran,
        twice=sum(1 for runs in by_job.values() if sum(1 for a in runs if a.outcome == "ok") > 1),
        killed_active=killed_active,
    )


# -- 2. rate limit ------------------------------------------------------------------------------


@dataclass
class RateResult:
    jobs: int
    max_in_window: int
    total: float
    ideal: float


def sliding_max(times: list[float], window: float) -> int:
    """Most of the sorted ``times`` in any window ``(t - window, t]`` (the limit's window)."""
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def measure_rate(sizes: Sizes) -> RateResult:
    import django_jobs
    from benchmarks.tasks import noop

    truncate()
    queue, n, limit = "rated", sizes.rate_jobs, sizes.rate_limit
    django_jobs.queue(queue).set_rate_limit(limit, 1.0)
    noop.using(queue_name=queue).enqueue_many(() for _ in range(n))
    Workers(3, ["-c", "4", "-q", queue, "--stop-when-empty"]).wait(timeout=n / limit * 2 + 120)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM last_attempted_at), state FROM django_jobs_job WHERE queue = %s "
            "ORDER BY last_attempted_at",
            [queue],
        )
        rows = cursor.fetchall()
    done = sum(1 for r in rows if r[1] == "completed")
    if done != n:
        fail(f"rate: expected {n} completed jobs, found {done}.")
    times = [float(r[0]) for r in rows]
    return RateResult(jobs=n, max_in_window=sliding_max(times, 1.0), total=times[-1] - times[0], ideal=n / limit - 1)


# -- 3. concurrency -----------------------------------------------------------------------------


@dataclass
class ConcurrencyResult:
    recorded_max: int
    sampled_max: int
    samples: int
    span: float
    ideal: float


def measure_concurrency(sizes: Sizes) -> ConcurrencyResult:
    import django_jobs
    from benchmarks.tasks import probe

    truncate()
    queue, n = "conc", sizes.concurrency_jobs
    django_jobs.queue(queue).set_concurrency(sizes.concurrency_limit)
    out = tempfile.mkdtemp(prefix="jobs-limits-")
    try:
        probe.using(queue_name=queue).enqueue_many((out, None, i, 0, sizes.job_seconds) for i in range(n))
        sampler = Sampler(f"SELECT count(*) FROM django_jobs_job WHERE queue = '{queue}' AND state = 'active'", 0.003)
        sampler.start()
        Workers(3, ["-c", "4", "-q", queue, "--stop-when-empty"]).wait(timeout=max(120.0, n * sizes.job_seconds * 5))
        sampler.finish()
        attempts = read_attempts(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    ok = [a for a in attempts if a.outcome == "ok" and a.end is not None]
    done = scalar("SELECT count(*) FROM django_jobs_job WHERE queue = %s AND state = 'completed'", [queue])
    if done != n or len(ok) != n:
        fail(f"concurrency: expected {n} completed jobs, found {done} ({len(ok)} recorded).")
    span = float(
        scalar(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM django_jobs_job WHERE queue = %s",
            [queue],
        )
    )
    return ConcurrencyResult(
        recorded_max=max_overlap([(a.start, a.end) for a in ok]),  # type: ignore[misc]
        sampled_max=sampler.max,
        samples=sampler.samples,
        span=span,
        ideal=n * sizes.job_seconds / sizes.concurrency_limit,
    )


# -- 4. queue full ------------------------------------------------------------------------------


@dataclass
class QueueFullResult:
    tried: int
    accepted: int
    refused: int
    max_unfinished: int
    samples: int
    stored: int
    completed: int
    limit: int
    enqueue_seconds: float


def enqueuer(queue: str, n: int, seconds: float, start: Any, results: Any) -> None:
    """A separate process: try ``n`` enqueues of ``nap(seconds)`` as fast as possible; report
    (accepted, refused, time taken)."""
    import django

    django.setup()
    from django.db import connection

    from benchmarks.tasks import nap
    from django_jobs import QueueFull

    task = nap.using(queue_name=queue)
    connection.ensure_connection()
    start.wait()
    accepted = refused = 0
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            task.enqueue(seconds)
            accepted += 1
        except QueueFull:
            refused += 1
    results.put((accepted, refused, time.perf_counter() - t0))


def measure_queuefull(sizes: Sizes) -> QueueFullResult:
    import django_jobs

    truncate()
    queue, limit = "bounded", sizes.max_size
    django_jobs.queue(queue).set_max_size(limit)
    # 2 workers of 2 threads, jobs of 20 ms: at most 200 jobs/s drained, less than the enqueuers
    # offer, so the queue fills up and stays full while they enqueue.
    workers = Workers(2, ["-c", "2", "-q", queue])
    wait_for(lambda: scalar("SELECT count(*) FROM django_jobs_worker") >= 2, 60, "2 workers registering", workers)
    sampler = Sampler(f"SELECT count(*) FROM django_jobs_job WHERE queue = '{queue}' AND {unfinished_sql()}", 0.01)
    sampler.start()
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=enqueuer, args=(queue, sizes.per_enqueuer, sizes.job_seconds, start, results))
        for _ in range(sizes.enqueuers)
    ]
    for p in procs:
        p.start()
    time.sleep(2.0)  # each connects and imports before the start, so they enqueue at once
    start.set()
    outcomes = []
    for _ in procs:
        try:
            outcomes.append(results.get(timeout=600))
        except Exception:  # noqa: BLE001 - queue.Empty: a child died
            workers.stop()
            fail(f"queuefull: an enqueuer did not report; exit codes {[p.exitcode for p in procs]}.")
    for p in procs:
        p.join(30)
    remaining = f"SELECT count(*) FROM django_jobs_job WHERE queue = '{queue}' AND {unfinished_sql()}"
    wait_for(lambda: scalar(remaining) == 0, 300, "the workers draining the queue", workers)
    sampler.finish()
    workers.stop()
    return QueueFullResult(
        tried=sizes.enqueuers * sizes.per_enqueuer,
        accepted=sum(o[0] for o in outcomes),
        refused=sum(o[1] for o in outcomes),
        max_unfinished=sampler.max,
        samples=sampler.samples,
        stored=scalar("SELECT count(*) FROM django_jobs_job WHERE queue = %s", [queue]),
        completed=scalar("SELECT count(*) FROM django_jobs_job WHERE queue = %s AND state = 'completed'", [queue]),
        limit=limit,
        enqueue_seconds=max(o[2] for o in outcomes),
    )


# -- 5. partitioned drain -----------------------------------------------------------------------

DRAIN_KINDS = ("unpartitioned", "partition-major", "round-robin")


def prefill(partitions: int, per_partition: int, order: str) -> None:
    """Enqueue ``partitions * per_partition`` no-op jobs through the public API in one
    transaction, then ANALYZE the job table (as autovacuum would after such an insert).

    ``unpartitioned``: one ``enqueue_many``; ``partition-major``: one ``enqueue_many`` per
    partition (p0j0..p0j9, p1j0, ...); ``round-robin``: one ``enqueue()`` per job, partition by
    partition within each round (p0j0, p1j0, ..., p0j1, ...)."""
    from django.db import connection, transaction

    from benchmarks.tasks import noop

    with transaction.atomic():
        if order == "unpartitioned":
            noop.enqueue_many(() for _ in range(partitions * per_partition))
        elif order == "partition-major":
            for p in range(partitions):
                noop.using(partition=f"p{p}").enqueue_many(() for _ in range(per_partition))
        else:
            tasks = [noop.using(partition=f"p{p}") for p in range(partitions)]
            for _ in range(per_partition):
                for task in tasks:
                    task.enqueue()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_jobs_job")


def explain_claim(limit: int = 8) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the statement ``engine.claim_jobs`` sends for a worker of
    all queues claiming ``limit`` jobs (it runs, and is rolled back)."""
    from django.db import connection, transaction

    from django_jobs import engine

    plans: list[str] = []

    def explain(execute: Any, sql: str, params: Any, many: bool, context: dict) -> Any:
        if sql.lstrip().upper().startswith("UPDATE DJANGO_JOBS_JOB SET STATE = 'ACTIVE'") and not plans:
            execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params, many, context)
            plans.append("\n".join(r[0] for r in context["cursor"].fetchall()))
            plans.append(sql % tuple(repr(p) for p in params))
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(explain):
        engine.claim_jobs(using="default", queues=None, limit=limit, worker_id="explain", lease_seconds=30.0)
        transaction.set_rollback(True)
    if not plans:
        return "(no claim statement seen)"
    return f"{plans[0]}\n\nSQL:\n{plans[1]}"


def measure_partition_drain(sizes: Sizes, kind: str, *, explain: bool) -> float:
    n = sizes.drain_partitions * sizes.drain_per_partition
    truncate()
    t0 = time.perf_counter()
    prefill(sizes.drain_partitions, sizes.drain_per_partition, kind)
    note(f"  {kind}: {n:,} jobs enqueued in {time.perf_counter() - t0:.1f}s")
    if explain:
        note(f"  EXPLAIN ANALYZE of the claim (limit 8), {kind}, {n:,} waiting jobs:\n{explain_claim()}\n")
    tp.run_worker_until_exit(["-p", "2", "-c", "8", "--stop-when-empty"], timeout=max(300.0, n / 20))
    return tp.db_rate(n)


# -- report -------------------------------------------------------------------------------------


class Row(tp.Row):
    """throughput.py's row; a count has no unit."""

    def cells(self) -> list[str]:
        cells = super().cells()
        cells[1] = cells[1].rstrip()
        return cells


def exact(target: int) -> tuple[str, Any]:
    return f"= {target:,}", lambda v: v == target


def rows_for(name: str, results: dict[str, Any], sizes: Sizes) -> list[Row]:
    rows: list[Row] = []
    if name in ("partitions", "partitions_kill"):
        runs: list[PartitionResult] = results[name]
        r = runs[0]
        label = f"{name}: " if name == "partitions" else "partitions, 1 worker killed: "
        rows.append(Row(label + "jobs completed", [x.completed for x in runs], "", *exact(r.expected)))
        rows.append(Row(label + "jobs lost", [x.lost for x in runs], "", *exact(0)))
        rows.append(Row(label + "started before predecessor finished", [x.early for x in runs], "", *exact(0)))
        rows.append(Row(label + "overlaps within a partition", [x.overlaps for x in runs], "", *exact(0)))
        rows.append(
            Row(
                label + "jobs whose first attempt failed",
                [x.failed_jobs for x in runs],
                "",
                *exact(r.expected_failures),
            )
        )
        if name == "partitions_kill":
            rows.append(Row(label + "jobs rescued (re-run after the kill)", [x.rescued for x in runs], ""))
            rows.append(Row(label + "  of which had started in the killed worker", [x.reran for x in runs], ""))
            rows.append(Row(label + "  ran to the end twice (outcome lost in the kill)", [x.twice for x in runs], ""))
        rows.append(Row(label + "wall time (start-up included)", [x.wall for x in runs], "s", digits=1))
        rows.append(Row(label + "first start to last finish", [x.span for x in runs], "s", digits=1))
    elif name == "rate":
        runs_r: list[RateResult] = results[name]
        rows.append(
            Row(
                f"rate {sizes.rate_limit}/s: most starts in any 1 s window",
                [x.max_in_window for x in runs_r],
                "",
                f"<= {sizes.rate_limit}",
                lambda v: v <= sizes.rate_limit,
            )
        )
        ideal = runs_r[0].ideal
        rows.append(
            Row("rate: first start to last start", [x.total for x in runs_r], "s", f"ideal {ideal:.0f}", digits=1)
        )
        rows.append(
            Row("rate: that / ideal", [x.total / x.ideal for x in runs_r], "", "<= 1.10", lambda v: v <= 1.10, 3)
        )
    elif name == "concurrency":
        runs_c: list[ConcurrencyResult] = results[name]
        limit = sizes.concurrency_limit
        rows.append(
            Row("concurrency 3: most running, from the jobs", [x.recorded_max for x in runs_c], "", *exact(limit))
        )
        rows.append(
            Row(
                "concurrency 3: most active rows sampled",
                [x.sampled_max for x in runs_c],
                "",
                f"<= {limit}",
                lambda v: v <= limit,
            )
        )
        rows.append(Row("concurrency: first start to last finish", [x.span for x in runs_c], "s", digits=2))
        rows.append(
            Row("concurrency: that / ideal (jobs x 20 ms / 3)", [x.span / x.ideal for x in runs_c], "", digits=2)
        )
    elif name == "queuefull":
        runs_q: list[QueueFullResult] = results[name]
        q = runs_q[0]
        rows.append(Row(f"queuefull: enqueues tried ({sizes.enqueuers} processes)", [x.tried for x in runs_q], ""))
        rows.append(Row("queuefull: accepted", [x.accepted for x in runs_q], ""))
        rows.append(Row("queuefull: QueueFull raised", [x.refused for x in runs_q], "", "> 0", lambda v: v > 0))
        rows.append(
            Row("queuefull: accepted + QueueFull", [x.accepted + x.refused for x in runs_q], "", *exact(q.tried))
        )
        rows.append(
            Row(
                "queuefull: most unfinished sampled",
                [x.max_unfinished for x in runs_q],
                "",
                f"<= {q.limit:,}",
                lambda v: v <= q.limit,
            )
        )
        rows.append(
            Row("queuefull: enqueue calls/s, all processes", [x.tried / x.enqueue_seconds for x in runs_q], "/s")
        )
        rows.append(Row("queuefull: completed at the end", [x.completed for x in runs_q], "", *exact(q.accepted)))
        rows.append(Row("queuefull: rows stored", [x.stored for x in runs_q], "", *exact(q.accepted)))
    elif name == "partition_drain":
        rates: dict[str, list[float]] = results[name]
        base = statistics.median(rates["unpartitioned"])
        rows.append(Row("drain, no partition", rates["unpartitioned"], "jobs/s"))
        for kind in DRAIN_KINDS[1:]:
            rows.append(Row(f"drain, partitions, {kind}", rates[kind], "jobs/s"))
            rows.append(
                Row(
                    f"  {kind} / no partition",
                    [r / base for r in rates[kind]],
                    "",
                    ">= 0.50",
                    lambda v: v >= 0.5,
                    2,
                )
            )
    return rows


DESCRIPTIONS = {
    "partitions": """3 `runworker -c 4` processes drain {partitions} partitions x {per_partition} jobs
({jobs:,}; one `enqueue_many` per partition). The jobs with `seq % 10 == 3` fail their first attempt
(max_attempts=2, backoff 0) and block their partition until the retry. Each attempt appends a start
and an end line (time.time(), pid) to its process's file; a job is **lost** unless its row is
completed and an attempt of it ended well; **started before predecessor finished** compares a
job's first start with the end of its predecessor's successful attempt; **overlaps** counts
attempts of one partition that began before an earlier-started one ended.""",
    "partitions_kill": """The same run with `LEASE_SECONDS = 5` and `RESCUE_INTERVAL = 1`; once 30% of the jobs
completed, one worker is SIGKILLed. Its attempts cut short count as running until the kill.
**Rescued** jobs are rows with `stalled_count > 0` (claimed by the killed worker and run again
elsewhere); "started in the killed worker" is how many of them got as far as the job's code.""",
    "rate": """`queue("rated").set_rate_limit({rate_limit}, 1.0)`, {rate_jobs:,} no-op jobs, 3 `runworker -c 4`
processes. From the rows' `last_attempted_at` (the claim's database time): the most starts in any
window `(t - 1 s, t]` (exact sweep), and first start to last start against the ideal
`({rate_jobs} / {rate_limit} - 1) s` (the first window starts {rate_limit} at once).""",
    "concurrency": """`queue("conc").set_concurrency({concurrency_limit})`, {concurrency_jobs} jobs sleeping
{job_ms:.0f} ms, 3 `runworker -c 4` processes. The most jobs running at once, from the jobs' own start
and end times (a sweep), and from counting the queue's `active` rows every 3 ms on another
connection. Ideal time: jobs x {job_ms:.0f} ms / {concurrency_limit}.""",
    "queuefull": """`queue("bounded").set_max_size({max_size})`; 2 `runworker -c 2` processes drain it (jobs
sleeping {job_ms:.0f} ms, so at most {drain_cap} jobs/s) while {enqueuers} processes each call
`nap.enqueue({job_seconds})` {per_enqueuer:,} times as fast as they can, counting `QueueFull`. A
thread counts the queue's unfinished rows every 10 ms on its own connection.""",
    "partition_drain": """{drain_jobs:,} no-op jobs enqueued beforehand through the API in one transaction
(no partition: one `enqueue_many`; partition-major: one `enqueue_many` per partition, p0j0..p0j{last},
p1j0, ...; round-robin: one `enqueue()` per job, p0j0, p1j0, ..., p0j1, ...; {drain_partitions:,}
partitions x {drain_per_partition} jobs), then drained by `runworker -p 2 -c 8 --stop-when-empty`;
rate = completed / (max(`finished_at`) - min(`started_at`)).""",
}


def section_markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- generated by benchmarks/limits.py: {name} begin -->",
        f"<!-- generated by benchmarks/limits.py: {name} end -->",
    )


def write_docs(sections: dict[str, str]) -> None:
    """Replace (or add) the generated section of each figure measured, keeping the rest."""
    text = DOCS.read_text() if DOCS.exists() else None
    if text is None:
        text = """# Benchmarks: queue limits, partitions and backpressure

Results as counts, from `benchmarks/limits.py` (real `runworker` processes on PostgreSQL).

## Run it

```
.venv/bin/python benchmarks/limits.py                      # everything (20 minutes or more)
.venv/bin/python benchmarks/limits.py --quick              # smaller counts, a smoke run (prints only)
.venv/bin/python benchmarks/limits.py --only rate,queuefull --write
```

It uses its own database, `jobs_bench_limits` (`JOBS_BENCH_DB`), dropped and re-created on each run,
on the server named by `PGHOST`/`PGPORT`/`PGUSER`/`PGPASSWORD`. `JOBS_BENCH_NOTE` adds a sentence
to the machine note.
"""
    for name in NAMES:
        if name in sections:
            text = tp.splice_section(text, name, sections[name], list(NAMES), section_markers)
    DOCS.parent.mkdir(exist_ok=True)
    DOCS.write_text(text)


def section(name: str, rows: list[tp.Row], sizes: Sizes, runs: int, machine: str) -> str:
    title = {
        "partitions": "Partitions: order and exclusion",
        "partitions_kill": "Partitions with a worker killed",
        "rate": "Rate limit",
        "concurrency": "Concurrency limit",
        "queuefull": "Backpressure (max_size)",
        "partition_drain": "Draining partitioned jobs",
    }[name]
    fmt = {
        **sizes.__dict__,
        "jobs": sizes.partitions * sizes.per_partition,
        "job_ms": sizes.job_seconds * 1000,
        "drain_jobs": sizes.drain_partitions * sizes.drain_per_partition,
        "last": sizes.drain_per_partition - 1,
        "drain_cap": round(4 / sizes.job_seconds),
    }
    median = f" Each figure is the median of {runs} runs, the runs listed beside it." if name in MEDIAN else ""
    return f"""## {title}

Measured {dt.date.today().isoformat()} with `benchmarks/limits.py --only {name}`.{median}
Machine: {machine}

{tp.markdown_table(rows)}

{DESCRIPTIONS[name].format(**fmt)}"""


#: The figures measured ``--runs`` times (a median); the others once.
MEDIAN = ("partition_drain", "concurrency")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts: a smoke run (prints only)")
    parser.add_argument("--runs", type=int, default=3, help="runs of partition_drain and concurrency (median)")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks-limits.md even with --quick")
    parser.add_argument("--only", default="", help=f"comma-separated subset: {','.join(NAMES)}")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of the claim (partition_drain)")
    opts = parser.parse_args()
    sizes = QUICK if opts.quick else Sizes()
    only = [s.strip() for s in opts.only.split(",") if s.strip()]
    unknown = set(only) - set(NAMES)
    if unknown:
        fail(f"unknown --only name(s) {sorted(unknown)}; choose from {', '.join(NAMES)}.")
    wanted = [n for n in NAMES if not only or n in only]

    pg_version = tp.ensure_database()
    tp.setup_django()
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for name in wanted:
        runs = opts.runs if name in MEDIAN else 1
        for run in range(1, runs + 1):
            note(f"{name} run {run}/{runs}")
            if name in ("partitions", "partitions_kill"):
                r = measure_partitions(sizes, kill=name == "partitions_kill")
                results.setdefault(name, []).append(r)
                note(
                    f"  completed {r.completed:,}/{r.expected:,}, lost {r.lost}, early {r.early}, "
                    f"overlaps {r.overlaps}, failed once {r.failed_jobs}, rescued {r.rescued}, "
                    f"wall {r.wall:.1f}s"
                )
            elif name == "rate":
                rr = measure_rate(sizes)
                results.setdefault(name, []).append(rr)
                note(f"  max {rr.max_in_window} in 1 s; {rr.total:.2f}s for ideal {rr.ideal:.0f}s")
            elif name == "concurrency":
                rc = measure_concurrency(sizes)
                results.setdefault(name, []).append(rc)
                note(
                    f"  max running {rc.recorded_max} (jobs), {rc.sampled_max} (sampled {rc.samples}x); "
                    f"{rc.span:.2f}s for ideal {rc.ideal:.2f}s"
                )
            elif name == "queuefull":
                rq = measure_queuefull(sizes)
                results.setdefault(name, []).append(rq)
                note(
                    f"  accepted {rq.accepted:,}, QueueFull {rq.refused:,}, max unfinished {rq.max_unfinished} "
                    f"(sampled {rq.samples}x), completed {rq.completed:,}, enqueue took {rq.enqueue_seconds:.1f}s"
                )
            elif name == "partition_drain":
                rates = results.setdefault(name, {k: [] for k in DRAIN_KINDS})
                for kind in DRAIN_KINDS:
                    rates[kind].append(measure_partition_drain(sizes, kind, explain=opts.explain and run == 1))
                    note(f"  {kind}: {rates[kind][-1]:,.0f} jobs/s")
    truncate()
    load_after = os.getloadavg()

    machine = tp.machine_note(pg_version, load_before, load_after)
    all_rows: list[tp.Row] = []
    sections = {}
    for name in wanted:
        rows = rows_for(name, results, sizes)
        all_rows += rows
        sections[name] = section(name, rows, sizes, opts.runs, machine)
    print()
    print(tp.text_table(all_rows))
    print()
    print(machine)
    if opts.write or not opts.quick and not only:
        write_docs(sections)
        print(f"Wrote {DOCS.relative_to(ROOT)}.")


if __name__ == "__main__":
    main()

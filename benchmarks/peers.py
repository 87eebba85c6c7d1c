#!/usr/bin/env python
"""django-jobs side by side with pgqueuer on the same PostgreSQL (``make bench-peers``).

pgqueuer is installed, pinned, into a benchmark-only virtualenv (``.bench-venv/peers``; reused
when it already holds that version) and driven through ``benchmarks/pgqueuer_side.py``; it is
never a dependency of the package. Each system has its own database (``bench_peers_dj``,
``bench_peers_pgq``; dropped and re-created), emptied before every measurement. Each repeat
(``--runs``, default 3) runs every scenario for both, django-jobs first in the odd repeats and
pgqueuer first in the even ones, each measurement right after a ``CHECKPOINT`` (see
:func:`checkpoint`), and the table gives the median of each and their ratio (django-jobs /
pgqueuer):

1. enqueue, one job per transaction, from one process (``noop.enqueue()`` in autocommit;
   pgqueuer's ``Queries.enqueue("noop", None)``), after a warm-up; and a raw psycopg
   ``INSERT`` + commit loop on a small job-like table, the ceiling for one job per commit;
2. bulk enqueue of 10,000 in one transaction (``noop.enqueue_many``; pgqueuer's list form of
   ``Queries.enqueue``, one statement);
3. drain of 20,000 waiting no-op jobs by 1 and by 4 worker processes, each process
   ``manage.py runworker -c 8 --stop-when-empty``, or a pgqueuer ``QueueManager`` in drain mode
   (``batch_size`` 10 and no ``max_concurrent_tasks``: its defaults; asyncpg and uvloop, as
   ``pgq run`` runs it), started behind a lock on the job table so that all begin together
   once their start-up is done (see :func:`run_group`). The rate comes from each system's own
   rows: completed / (last finish - first claim), database clock. CPU per job: the worker
   processes' user + system time and that of the PostgreSQL backends serving the benchmark
   database (``/proc/<pid>/stat`` sampled every 50 ms), from the release to the last finish,
   divided by the jobs;
4. pickup latency at 20 jobs/s with one idle worker (``-c 8``; pgqueuer's defaults): claim time
   minus enqueue time of each job, database clock (django-jobs: ``started_at - enqueued_at``;
   pgqueuer: its log's ``picked`` minus ``queued`` rows);
5. I/O-bound: 10,000 jobs that each wait 20 ms (``time.sleep``; ``asyncio.sleep``) at
   concurrency 100 (``runworker -c 100``; ``max_concurrent_tasks=100``, with the blocking sleep
   through ``asyncio.to_thread`` on a 100-thread default executor): jobs/s and the worker's peak
   RSS (VmHWM).

Once, after the timed runs: the writes of one plain job's life (single enqueue, claim, outcome)
read from the WAL (``pg_walinspect``): heap rows and index entries per table and index, for both
systems, with the indexes of django-jobs' job table and their predicates. Prints a text table
and one JSON line; ``--write`` puts the table in docs/benchmarks.md ("Side by side with
pgqueuer"). ``--quick``: small counts, one run, a smoke test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DJ_DB = os.environ.get("JOBS_PEERS_DJ_DB", "bench_peers_dj")
PGQ_DB = os.environ.get("JOBS_PEERS_PGQ_DB", "bench_peers_pgq")
# benchmarks/settings.py names its database from this; the worker subprocesses inherit it.
os.environ["JOBS_BENCH_DB"] = DJ_DB
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"

from benchmarks.throughput import (  # noqa: E402 - the environment above comes first
    PG,
    Peaks,
    connect_raw,
    create_database,
    log_tail,
    percentile,
    process_tree,
    splice_section,
    stop_processes,
    worker_command,
)
from benchmarks.throughput import text_table as tp_text_table  # noqa: E402

PGQ_VERSION = "1.6.0"
VENV = ROOT / ".bench-venv" / "peers"
VENV_PYTHON = VENV / "bin" / "python"
SIDE = ROOT / "benchmarks" / "pgqueuer_side.py"
DOCS = ROOT / "docs" / "benchmarks.md"
NOOP = "benchmarks.tasks.noop"
RAW_TABLE = "bench_peers_raw"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sizes:
    enqueue: int = 3_000
    #: Single enqueues per system and repeat, in this many rounds of ``enqueue / rounds``, the
    #: two systems alternating round by round: the machine's speed drifts within a minute.
    enqueue_rounds: int = 3
    bulk: int = 10_000
    #: Timed bulk calls per system and repeat, the two systems alternating call by call, each
    #: on emptied tables after a CHECKPOINT; the repeat's figure is their median (one call of
    #: ~0.15 s is at the mercy of a hiccup).
    bulk_calls: int = 5
    drain: int = 20_000
    latency_seconds: float = 15.0
    latency_interval: float = 0.05
    io: int = 10_000
    io_sleep: float = 0.02
    io_concurrency: int = 100
    index_jobs: int = 2_000


QUICK = Sizes(
    enqueue=300, enqueue_rounds=1, bulk=2_000, bulk_calls=1, drain=2_000, latency_seconds=3.0, io=1_000, index_jobs=300
)
PARTS = ("enqueue", "bulk", "drain", "latency", "io", "index")


def fail(message: str) -> None:
    print(f"benchmarks/peers.py: {message}", file=sys.stderr)
    sys.exit(2)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- pgqueuer's virtualenv and side -------------------------------------------------------------


def ensure_venv() -> str:
    """The pgqueuer version in ``.bench-venv/peers``; creates the virtualenv and installs the
    pinned version with pip (the index pip is configured with) unless it is already there."""
    probe = "import importlib.metadata as m, asyncpg, uvloop, pgqueuer; print(m.version('pgqueuer'))"
    if VENV_PYTHON.exists():
        found = subprocess.run([VENV_PYTHON, "-c", probe], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip() == PGQ_VERSION:
            return PGQ_VERSION
    say(f"installing pgqueuer {PGQ_VERSION} into {VENV} (benchmark only) ...")
    if not VENV_PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    done = subprocess.run(
        [VENV_PYTHON, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"pgqueuer[asyncpg]=={PGQ_VERSION}"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        fail(f"could not install pgqueuer {PGQ_VERSION} into {VENV}:\n{done.stderr[-2000:]}")
    return PGQ_VERSION


def pg_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(PGHOST=PG["host"], PGPORT=str(PG["port"]), PGUSER=PG["user"], PGPASSWORD=PG["password"])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def side_command(*args: str) -> list[str]:
    return [str(VENV_PYTHON), str(SIDE), "--db", PGQ_DB, *args]


def side(*args: str, timeout: float = 600) -> dict:
    """Run ``pgqueuer_side.py *args`` to its end; its JSON answer."""
    done = subprocess.run(side_command(*args), capture_output=True, text=True, env=pg_env(), timeout=timeout)
    if done.returncode != 0:
        fail(f"pgqueuer_side.py {' '.join(args)} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if "error" in answer:
        fail(f"pgqueuer_side.py {' '.join(args)}: {answer['error']}")
    return answer


# -- database helpers -----------------------------------------------------------------------------


class Raw:
    """One autocommit psycopg connection per database, kept for the whole run."""

    conns: dict[str, Any] = {}

    @classmethod
    def get(cls, db: str) -> Any:
        if db not in cls.conns or cls.conns[db].closed:
            cls.conns[db] = connect_raw(db, autocommit=True)
        return cls.conns[db]

    @classmethod
    def rows(cls, db: str, sql: str, params: list | None = None) -> list[tuple]:
        return cls.get(db).execute(sql, params or []).fetchall()

    @classmethod
    def backend_pids(cls) -> set[int]:
        """This process's backends (these connections and Django's), left out of the CPU sums."""
        from django.db import connection

        pids = {conn.info.backend_pid for conn in cls.conns.values() if not conn.closed}
        if connection.connection is not None and not connection.connection.closed:
            pids.add(connection.connection.info.backend_pid)
        return pids


def setting(name: str) -> str:
    return Raw.rows(DJ_DB, f"SHOW {name}")[0][0]


def analyze(db: str) -> None:
    Raw.get(db).execute("ANALYZE")


_checkpoints = [True]  # False once the server refused one (not a superuser): then measured without


def checkpoint() -> None:
    """A CHECKPOINT before each measurement, so that none runs while the server checkpoints.

    The benchmark writes hundreds of MB of WAL per repeat, so PostgreSQL starts a checkpoint
    every minute or two (``checkpoint starting: wal`` in its log) at a moment nothing chooses:
    the system measured then pays for the checkpoint's writes and for a full-page image in the
    WAL on the first change of every page, and the other system does not. After a CHECKPOINT,
    each measurement (its reset and prefill included) starts with the same clean slate, the
    pages it creates need no full-page image, and the next checkpoint is hundreds of MB away."""
    if not _checkpoints[0]:
        return
    try:
        Raw.get(DJ_DB).execute("CHECKPOINT")
    except Exception as exc:  # noqa: BLE001 - not allowed (pg_checkpoint role, superuser): say so once
        _checkpoints[0] = False
        say(f"  CHECKPOINT refused ({type(exc).__name__}: {exc}); measuring without one before each scenario")


@dataclass
class Finished:
    count: int
    first_claim: dt.datetime | None
    last_finish: dt.datetime | None

    @property
    def span(self) -> float | None:
        if self.first_claim is None or self.last_finish is None:
            return None
        return (self.last_finish - self.first_claim).total_seconds()


def dj_job_tables() -> list[tuple[str, str, str, str, str, str | None]]:
    """(table, id, enqueued_at, started_at, finished_at, state or None) of every django_jobs
    model that holds jobs (fields ``enqueued_at``, ``started_at``, ``finished_at``): read from
    the models, so the measurement follows the engine's tables as they are when it runs."""
    from django.apps import apps

    found = []
    for model in apps.get_app_config("django_jobs").get_models():
        names = {f.name: f.column for f in model._meta.concrete_fields}
        if {"enqueued_at", "started_at", "finished_at"} <= names.keys():
            found.append(
                (
                    model._meta.db_table,
                    model._meta.pk.column,
                    names["enqueued_at"],
                    names["started_at"],
                    names["finished_at"],
                    names.get("state"),
                )
            )
    if not found:
        fail("no django_jobs model with enqueued_at, started_at and finished_at fields: cannot read the drain.")
    return found


def dj_reset() -> None:
    """Empty every table of the django_jobs app (CASCADE covers the ones that reference them)."""
    from django.apps import apps
    from django.db import connection

    existing = set(connection.introspection.table_names())
    tables = sorted(
        {
            m._meta.db_table
            for m in apps.get_app_config("django_jobs").get_models(include_auto_created=True)
            if m._meta.managed and not m._meta.proxy and m._meta.db_table in existing
        }
    )
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(connection.ops.quote_name(t) for t in tables)} CASCADE")


def dj_finished() -> Finished:
    """Completed jobs, first claim and last finish over the job tables."""
    parts = []
    for table, pk, _enq, started, finished, state in dj_job_tables():
        where = f"{finished} IS NOT NULL" + (f" AND {state} = 'completed'" if state else "")
        parts.append(f"SELECT {pk}::text AS id, {started} AS s, {finished} AS f FROM {table} WHERE {where}")
    return Finished(
        *Raw.rows(DJ_DB, f"SELECT count(DISTINCT id), min(s), max(f) FROM ({' UNION ALL '.join(parts)}) j")[0]
    )


def dj_latencies(since: dt.datetime) -> list[float]:
    parts = [
        f"SELECT EXTRACT(EPOCH FROM {started} - {enq}) * 1000 FROM {table} WHERE {enq} >= %s AND {started} IS NOT NULL"
        for table, _pk, enq, started, _fin, _state in dj_job_tables()
    ]
    return sorted(float(r[0]) for r in Raw.rows(DJ_DB, " UNION ALL ".join(parts), [since] * len(parts)))


def pgq_reset() -> None:
    Raw.get(PGQ_DB).execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics RESTART IDENTITY")


def pgq_finished() -> Finished:
    """Completed jobs, first claim and last finish, from pgqueuer's log."""
    return Finished(
        *Raw.rows(
            PGQ_DB,
            "SELECT count(*) FILTER (WHERE status = 'successful'), min(created) FILTER (WHERE status = 'picked'), "
            "max(created) FILTER (WHERE status = 'successful') FROM pgqueuer_log",
        )[0]
    )


def pgq_latencies(since: dt.datetime) -> list[float]:
    rows = Raw.rows(
        PGQ_DB,
        "SELECT EXTRACT(EPOCH FROM p.created - q.created) * 1000 FROM pgqueuer_log q "
        "JOIN pgqueuer_log p ON p.job_id = q.job_id AND p.status = 'picked' "
        "WHERE q.status = 'queued' AND q.created >= %s",
        [since],
    )
    return sorted(float(r[0]) for r in rows)


def db_now(db: str) -> dt.datetime:
    return Raw.rows(db, "SELECT now()")[0][0]


def wait_for(condition: Callable[[], bool], timeout: float, what: str, logs: list[Any]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            fail(f"{what} did not happen within {timeout:.0f}s:\n" + "\n".join(log_tail(log) for log in logs))
        time.sleep(0.05)


# -- processes and CPU ----------------------------------------------------------------------------


def proc_cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` (all its threads), in clock ticks; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


class BackendCpu:
    """CPU of the PostgreSQL backends serving one database, from ``/proc``: every child of the
    postmaster whose command line names the database, sampled; a backend seen at the start
    counts from its value then, a later one from zero. The CPU a backend spends between the last
    sample and its exit is missed (at most one interval, while its worker shuts down)."""

    def __init__(self, db: str, exclude: set[int]) -> None:
        self.db = db
        self.exclude = exclude
        self.postmaster = postmaster_pid()
        self.base: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.ours: dict[int, bool] = {}
        self.sample(baseline=True)

    def backends(self) -> list[int]:
        if self.postmaster is None:
            return []
        pids = []
        for pid in process_tree(self.postmaster)[1:]:
            if pid in self.exclude:
                continue
            if pid not in self.ours:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                self.ours[pid] = f" {self.db} " in f" {cmdline} "
            if self.ours[pid]:
                pids.append(pid)
        return pids

    def sample(self, baseline: bool = False) -> None:
        for pid in self.backends():
            ticks = proc_cpu_ticks(pid)
            if ticks is None:
                continue
            if pid not in self.base:
                self.base[pid] = ticks if baseline else 0
            self.last[pid] = ticks

    @property
    def seconds(self) -> float:
        return sum(self.last[p] - self.base[p] for p in self.last) / CLK_TCK


def postmaster_pid() -> int | None:
    """The local server's postmaster (first line of ``postmaster.pid`` in its data directory)."""
    try:
        data = Raw.rows(DJ_DB, "SHOW data_directory")[0][0]
        with open(Path(data) / "postmaster.pid") as fh:
            pid = int(fh.readline())
        return pid if os.path.exists(f"/proc/{pid}") else None
    except (OSError, ValueError, IndexError):
        return None


class WorkerCpu:
    """CPU of worker process trees from ``/proc``, the last value seen of each process kept, so
    a process that has exited still counts what it used up to the sample before its exit."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.last: dict[int, int] = {}

    def sample(self) -> int:
        for root in self.roots:
            for pid in process_tree(root):
                ticks = proc_cpu_ticks(pid)
                if ticks is not None:
                    self.last[pid] = ticks
        return sum(self.last.values())


@dataclass
class GroupRun:
    wall: float  # from the gate's opening (or the start) to the last exit
    # (time.time(), worker CPU seconds, database backend CPU seconds) every 50 ms, both CPU
    # figures counted from the gate's opening (or the start)
    series: list[tuple[float, float, float]]
    peak_kib: int  # largest VmHWM of one worker process
    pg_measured: bool

    def cpu_until(self, when: dt.datetime | None) -> tuple[float, float | None]:
        """(worker, backend) CPU seconds from the start to the first sample at or after ``when``
        (the last finish, database clock: the same machine's), so exits are not counted."""
        t = when.timestamp() if when is not None else float("inf")
        at = next((s for s in self.series if s[0] >= t), self.series[-1])
        return at[1], (at[2] if self.pg_measured else None)


def run_group(
    commands: list[list[str]], env: dict[str, str], db: str, timeout: float, gate: list[str] | None = None
) -> GroupRun:
    """Start ``commands`` together and wait for all to exit (each must exit 0).

    With ``gate`` (tables), the harness holds an ACCESS EXCLUSIVE lock on those tables while
    the workers start: each runs its start-up (imports, connections, LISTEN) and blocks on its
    first statement on them. Once every worker is blocked (one lock waiter per process, and no
    worker used CPU for 0.3 s), the CPU counters are read and the lock released, so all
    workers start on the jobs at once and their start-up is not counted. Samples the workers'
    and the database backends' CPU from then on, and the workers' peak RSS."""
    logs = [tempfile.TemporaryFile("w+") for _ in commands]
    holder = None
    if gate:
        holder = connect_raw(db)
        holder.execute(f"LOCK TABLE {', '.join(gate)} IN ACCESS EXCLUSIVE MODE")
    started = time.monotonic()
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        for cmd, log in zip(commands, logs, strict=True)
    ]
    peaks = [Peaks(p.pid) for p in procs]
    workers = WorkerCpu([p.pid for p in procs])

    def check(deadline: float) -> None:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() not in (None, 0):
                fail(f"{' '.join(proc.args)} exited with {proc.returncode}:\n{log_tail(log)}")
        if time.monotonic() > deadline:
            stop_processes(procs)
            fail(f"{' '.join(commands[0])} did not finish within {timeout:.0f}s:\n{log_tail(logs[0])}")

    try:
        if holder is not None:
            # Wait until every worker is blocked on the gate, idle (its start-up done).
            last, quiet_since = -1, time.monotonic()
            while True:
                check(started + 120)
                ticks = workers.sample()
                if ticks != last:
                    last, quiet_since = ticks, time.monotonic()
                waiting = Raw.rows(
                    db,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                    [db],
                )[0][0]
                quiet = time.monotonic() - quiet_since
                if waiting >= len(procs) and quiet >= 0.3:
                    break
                if quiet >= 3.0:
                    say(f"  (gate: {waiting} lock waiters for {len(procs)} workers; opened after 3 s without CPU use)")
                    break
                time.sleep(0.1)
        start_ticks = workers.sample()
        backends = BackendCpu(db, Raw.backend_pids() | ({holder.info.backend_pid} if holder else set()))
        opened = time.monotonic()
        if holder is not None:
            holder.commit()
            holder.close()
            holder = None
        series = []
        while True:
            running = any(p.poll() is None for p in procs)
            for peak in peaks:
                peak.sample()
            backends.sample()
            series.append((time.time(), (workers.sample() - start_ticks) / CLK_TCK, backends.seconds))
            if not running:
                break
            check(started + timeout)
            time.sleep(0.05)
        wall = time.monotonic() - opened
        check(started + timeout)
    finally:
        if holder is not None:
            holder.close()
        for log in logs:
            log.close()
    return GroupRun(
        wall=wall,
        series=series,
        peak_kib=max(max(p.workers) for p in peaks),
        pg_measured=backends.postmaster is not None,
    )


def dj_env() -> dict[str, str]:
    env = pg_env()
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    env["JOBS_BENCH_DB"] = DJ_DB
    return env


def dj_worker(concurrency: int, *extra: str) -> list[str]:
    return worker_command("-c", str(concurrency), *extra)


def pgq_worker(opts: argparse.Namespace, *extra: str) -> list[str]:
    args = ["worker", "--batch-size", str(opts.pgq_batch_size), "--max-tasks", str(opts.pgq_max_tasks)]
    return side_command(*args, *extra)


# -- the systems ----------------------------------------------------------------------------------


@dataclass
class Drain:
    rate: float
    cpu_us: float  # worker CPU per job, start-up excluded
    pg_us: float | None  # PostgreSQL backend CPU per job
    peak_kib: int


class DjangoJobs:
    key = "dj"
    name = "django-jobs"
    db = DJ_DB

    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts

    def reset(self) -> None:
        dj_reset()

    def enqueue(self, n: int) -> float:
        from benchmarks.tasks import noop

        self.reset()
        for _ in range(50):  # warm up: connection, imports, cached SQL
            noop.enqueue()
        self.reset()
        t0 = time.perf_counter()
        for _ in range(n):
            noop.enqueue()
        return n / (time.perf_counter() - t0)

    def bulk(self, n: int) -> float:
        from django.db import transaction

        from benchmarks.tasks import noop

        self.reset()
        with transaction.atomic():
            noop.enqueue_many(() for _ in range(1_000))  # warm up
        self.reset()
        checkpoint()
        t0 = time.perf_counter()
        with transaction.atomic():
            results = noop.enqueue_many(() for _ in range(n))
        elapsed = time.perf_counter() - t0
        if len(results) != n:
            fail(f"enqueue_many returned {len(results)} results for {n} items")
        return n / elapsed

    def prefill(self, n: int, kind: str) -> None:
        from django.db import transaction

        from benchmarks import peer_tasks
        from benchmarks.tasks import noop

        self.reset()
        task, item = (noop, ()) if kind == "noop" else (getattr(peer_tasks, kind), (self.opts.sizes.io_sleep,))
        left = n
        while left:
            k = min(left, 10_000)
            with transaction.atomic():
                task.enqueue_many(item for _ in range(k))
            left -= k
        analyze(DJ_DB)

    def finished(self) -> Finished:
        return dj_finished()

    def gate(self) -> list[str]:
        return [t[0] for t in dj_job_tables()]

    def worker(self, concurrency: int, drain: bool) -> list[str]:
        return dj_worker(concurrency, *(["--stop-when-empty"] if drain else []))

    def env(self) -> dict[str, str]:
        return dj_env()

    def latencies(self, since: dt.datetime) -> list[float]:
        return dj_latencies(since)

    def enqueue_one(self) -> None:
        from benchmarks.tasks import noop

        noop.enqueue()

    def pace(self, seconds: float, interval: float) -> int:
        from benchmarks.tasks import noop

        n = int(seconds / interval)
        t0 = time.monotonic()
        for i in range(n):
            pause = t0 + i * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            noop.enqueue()
        return n


class Pgqueuer:
    key = "pgq"
    name = "pgqueuer"
    db = PGQ_DB

    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts

    def reset(self) -> None:
        pgq_reset()

    def enqueue(self, n: int) -> float:
        self.reset()
        return side("enqueue", str(n))["rate"]

    def bulk(self, n: int) -> float:
        self.reset()
        return side("bulk", str(n), *(["--checkpoint"] if _checkpoints[0] else []))["rate"]

    def prefill(self, n: int, kind: str) -> None:
        self.reset()
        payload = [] if kind == "noop" else ["--payload", repr(self.opts.sizes.io_sleep)]
        side("prefill", str(n), "--entrypoint", kind, *payload)
        analyze(PGQ_DB)

    def finished(self) -> Finished:
        return pgq_finished()

    def gate(self) -> list[str]:
        return ["pgqueuer"]

    def worker(self, concurrency: int, drain: bool) -> list[str]:
        extra = ["--drain"] if drain else []
        if concurrency > 8:  # the I/O-bound runs: cap and threads at the concurrency
            extra += ["--max-tasks", str(concurrency), "--threads", str(concurrency)]
        return pgq_worker(self.opts, *extra)

    def env(self) -> dict[str, str]:
        return pg_env()

    def latencies(self, since: dt.datetime) -> list[float]:
        return pgq_latencies(since)

    def enqueue_one(self) -> None:
        side("prefill", "1")

    def pace(self, seconds: float, interval: float) -> int:
        return side("pace", "--seconds", str(seconds), "--interval", str(interval))["enqueued"]


System = DjangoJobs | Pgqueuer


# -- the scenarios --------------------------------------------------------------------------------


def raw_enqueue(n: int) -> float:
    """The ceiling of one job per transaction: psycopg, no framework, one INSERT + commit each."""
    conn = Raw.get(DJ_DB)
    conn.execute(f"TRUNCATE {RAW_TABLE}")
    sql = (
        f"INSERT INTO {RAW_TABLE} (queue, task_path, args, kwargs, state, priority, enqueued_at, available_at) "
        "VALUES (%s, %s, %s::jsonb, %s::jsonb, 'waiting', 0, now(), now())"
    )
    params = ["default", NOOP, "[]", "{}"]
    for _ in range(50):
        conn.execute(sql, params)
    t0 = time.perf_counter()
    for _ in range(n):
        conn.execute(sql, params)
    return n / (time.perf_counter() - t0)


def drain(system: System, n: int, processes: int) -> Drain:
    system.prefill(n, "noop")
    run = run_group(
        [system.worker(8, drain=True) for _ in range(processes)],
        system.env(),
        system.db,
        max(120, n / 50),
        gate=system.gate(),
    )
    done = system.finished()
    if done.count != n or not done.span:
        fail(f"{system.name}: expected {n} completed jobs after the drain, found {done.count}")
    cpu, pg_cpu = run.cpu_until(done.last_finish)
    return Drain(
        rate=n / done.span,
        cpu_us=cpu / n * 1e6,
        pg_us=pg_cpu / n * 1e6 if pg_cpu is not None else None,
        peak_kib=run.peak_kib,
    )


def io_bound(system: System, sizes: Sizes, kind: str) -> Drain:
    system.prefill(sizes.io, kind)
    run = run_group(
        [system.worker(sizes.io_concurrency, drain=True)],
        system.env(),
        system.db,
        max(120, sizes.io / 20),
        gate=system.gate(),
    )
    done = system.finished()
    if done.count != sizes.io or not done.span:
        fail(f"{system.name}: expected {sizes.io} completed {kind} jobs, found {done.count}")
    cpu, _ = run.cpu_until(done.last_finish)
    return Drain(rate=done.count / done.span, cpu_us=cpu / done.count * 1e6, pg_us=None, peak_kib=run.peak_kib)


def latency(system: System, seconds: float, interval: float) -> tuple[float, float, float]:
    """p50/p95/p99 of claim minus enqueue (ms) while one job is enqueued every ``interval``."""
    system.reset()
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        system.worker(8, drain=False), cwd=ROOT, env=system.env(), stdout=log, stderr=subprocess.STDOUT, text=True
    )
    try:
        # Ready when a first job has gone through: connected, listening, idle again after it.
        system.enqueue_one()
        wait_for(lambda: system.finished().count >= 1 or proc.poll() is not None, 60, "the first job", [log])
        if proc.poll() is not None:
            fail(f"the {system.name} latency worker exited:\n{log_tail(log)}")
        time.sleep(1.0)
        since = db_now(system.db)
        n = system.pace(seconds, interval)
        wait_for(lambda: system.finished().count >= n + 1, 60, f"{system.name} finishing the paced jobs", [log])
    finally:
        stop_processes([proc])
        log.close()
    ms = system.latencies(since)
    if len(ms) != n:
        fail(f"{system.name}: {len(ms)} latencies for {n} paced jobs")
    return percentile(ms, 50), percentile(ms, 95), percentile(ms, 99)


# -- what one plain job writes -------------------------------------------------------------------

WAL_COUNTS = r"""
WITH rec AS (
    SELECT resource_manager AS rm, record_type AS kind, description AS descr,
           record_length - fpi_length AS bytes,
           substring(block_ref FROM 'rel \d+/\d+/(\d+)')::oid AS node
    FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)
    WHERE block_ref ~ ('rel \d+/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/')
)
SELECT coalesce(c.relname, 'oid ' || rec.node::text), coalesce(c.relkind::text, '?'),
       coalesce(t.relname, c.relname, ''),
       count(*) FILTER (WHERE rm = 'Heap' AND kind LIKE 'INSERT%%'),
       coalesce(sum(substring(descr FROM '(\d+) tuples')::int) FILTER (WHERE rm = 'Heap2' AND kind LIKE 'MULTI_INSERT%%'), 0),
       count(*) FILTER (WHERE rm = 'Heap' AND kind LIKE 'UPDATE%%'),
       count(*) FILTER (WHERE rm = 'Heap' AND kind LIKE 'HOT_UPDATE%%'),
       count(*) FILTER (WHERE rm = 'Heap' AND kind LIKE 'DELETE%%'),
       count(*) FILTER (WHERE rm = 'Heap' AND kind LIKE 'LOCK%%'),
       count(*) FILTER (WHERE rm = 'Btree' AND (kind IN ('INSERT_LEAF', 'INSERT_POST')
                        OR (kind IN ('SPLIT_L', 'SPLIT_R') AND descr LIKE 'level 0%%'))),
       sum(bytes)
FROM rec
LEFT JOIN pg_class c ON c.relfilenode = rec.node AND c.relfilenode <> 0
LEFT JOIN pg_index i ON i.indexrelid = c.oid
LEFT JOIN pg_class t ON t.oid = i.indrelid
GROUP BY 1, 2, 3
"""


@dataclass
class RelWrites:
    """Writes to one relation over a window, from its WAL records (full-page images excluded)."""

    name: str
    kind: str  # pg_class.relkind: r table, i index, S sequence, t toast
    table: str  # the table of an index; the relation itself otherwise
    inserts: int = 0
    updates: int = 0
    hot_updates: int = 0
    deletes: int = 0
    locks: int = 0
    index_entries: int = 0
    wal_bytes: int = 0


def wal_lsn(db: str) -> str:
    """The flushed end of the WAL: pg_walinspect reads no further, and every commit before now
    has flushed its records."""
    return Raw.rows(db, "SELECT pg_current_wal_flush_lsn()::text")[0][0]


def wal_writes(db: str, start: str, end: str) -> dict[str, RelWrites]:
    out = {}
    for name, kind, table, ins, multi, upd, hot, dele, locks, entries, wbytes in Raw.rows(db, WAL_COUNTS, [start, end]):
        out[name] = RelWrites(name, kind, table, ins + multi, upd, hot, dele, locks, entries, int(wbytes or 0))
    return out


@dataclass
class JobWrites:
    """What ``jobs`` plain jobs wrote in their enqueue (one per transaction) and their drain."""

    jobs: int
    enqueue: dict[str, RelWrites]
    drain: dict[str, RelWrites]


def job_writes(system: System, n: int) -> JobWrites | None:
    """Enqueue ``n`` jobs one per transaction, then drain them with one worker (``-c 8``),
    reading the WAL between. None without pg_walinspect."""
    try:
        Raw.get(system.db).execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except Exception as exc:  # noqa: BLE001 - any refusal means: not measurable here
        say(f"  pg_walinspect is not available ({type(exc).__name__}: {exc}); index entries from pg_indexes only")
        return None
    system.reset()
    start = wal_lsn(system.db)
    if isinstance(system, DjangoJobs):
        for _ in range(n):
            system.enqueue_one()
    else:
        side("enqueue", str(n), "--warmup", "0")
    middle = wal_lsn(system.db)
    run_group([system.worker(8, drain=True)], system.env(), system.db, timeout=max(120, n / 20))
    end = wal_lsn(system.db)
    count = system.finished().count
    if count != n:
        fail(f"{system.name}: expected {n} completed jobs in the WAL pass, found {count}")
    return JobWrites(n, wal_writes(system.db, start, middle), wal_writes(system.db, middle, end))


def job_table_indexes() -> list[tuple[str, str, str | None]]:
    """(table, index, predicate or None) of django-jobs' job tables, from pg_indexes."""
    tables = [t[0] for t in dj_job_tables()]
    rows = Raw.rows(
        DJ_DB,
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s) ORDER BY 1, 2",
        [tables],
    )
    return [(t, i, d.split(" WHERE ", 1)[1] if " WHERE " in d else None) for t, i, d in rows]


# -- the table ------------------------------------------------------------------------------------


@dataclass
class Row:
    metric: str
    unit: str
    dj: list[float] = field(default_factory=list)
    pgq: list[float] = field(default_factory=list)
    digits: int = 0
    load: list[float] = field(default_factory=list)
    ratio: bool = True

    @staticmethod
    def med(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    def fmt(self, value: float | None) -> str:
        return "—" if value is None else f"{value:,.{self.digits}f}"

    def cell(self, values: list[float]) -> str:
        if not values:
            return "—"
        runs = " / ".join(self.fmt(v) for v in values)
        return f"{self.fmt(self.med(values))} ({runs})" if len(values) > 1 else self.fmt(values[0])

    @property
    def quotient(self) -> float | None:
        a, b = self.med(self.dj), self.med(self.pgq)
        return a / b if self.ratio and a is not None and b else None

    @property
    def paired(self) -> float | None:
        """The median of each repeat's own ratio: the two systems of one repeat ran minutes apart,
        alternating, so a repeat's ratio sees the same machine; the medians of the two columns
        may come from different repeats."""
        pairs = [a / b for a, b in zip(self.dj, self.pgq, strict=False) if b] if self.ratio else []
        return statistics.median(pairs) if len(pairs) > 1 else None

    def cells(self) -> list[str]:
        q, p = self.quotient, self.paired
        load = f"{min(self.load):.1f}–{max(self.load):.1f}" if self.load else ""
        return [
            f"{self.metric} ({self.unit})",
            self.cell(self.dj),
            self.cell(self.pgq),
            "" if q is None else f"{q:.2f}",
            "" if p is None else f"{p:.2f}",
            load,
        ]

    def as_json(self) -> dict:
        return {
            "metric": self.metric,
            "unit": self.unit,
            "django_jobs": self.dj,
            "pgqueuer": self.pgq,
            "django_jobs_median": self.med(self.dj),
            "pgqueuer_median": self.med(self.pgq),
            "ratio": self.quotient,
            "ratio_of_repeats": self.paired,
            "load_1min": self.load,
        }


HEADER = [
    "scenario",
    "django-jobs: median (runs)",
    "pgqueuer: median (runs)",
    "ratio dj/pgq",
    "median of the repeats' ratios",
    "load 1-min",
]


def text_table(rows: list[Row]) -> str:
    return tp_text_table(rows, HEADER)


def markdown_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    for r in rows:
        cells = r.cells()
        if cells[0].startswith("  "):  # a row that details the one above it
            cells[0] = "· " + cells[0].strip()
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def writes_summary(label: str, w: JobWrites, tables: set[str] | None = None) -> tuple[str, dict]:
    """Per-job writes of one system (``tables``: count only these tables and their indexes)."""

    def keep(r: RelWrites) -> bool:
        return r.kind in ("r", "i") and (tables is None or r.table in tables)

    per: dict[str, Any] = {}
    lines = [f"{label}: per plain job ({w.jobs:,} jobs; enqueue one per transaction + drain, `-c 8`)"]
    for phase, rels in (("enqueue", w.enqueue), ("drain", w.drain)):
        heap = [r for r in rels.values() if r.kind == "r" and keep(r)]
        idx = [r for r in rels.values() if r.kind == "i" and keep(r)]
        entries = sum(r.index_entries for r in idx) / w.jobs
        # All of the database's WAL (sequences and TOAST too), or that of the chosen tables.
        wal = sum(r.wal_bytes for r in rels.values() if tables is None or keep(r)) / w.jobs
        rows_written = {
            r.name: {
                "inserts": r.inserts / w.jobs,
                "updates": r.updates / w.jobs,
                "hot_updates": r.hot_updates / w.jobs,
                "deletes": r.deletes / w.jobs,
                "locks": r.locks / w.jobs,
            }
            for r in sorted(heap, key=lambda r: r.name)
            if max(r.inserts, r.updates, r.hot_updates, r.deletes, r.locks) / w.jobs >= 0.005
        }
        by_index = {r.name: r.index_entries / w.jobs for r in sorted(idx, key=lambda r: -r.index_entries)}
        per[phase] = {"index_entries": entries, "wal_bytes": wal, "tables": rows_written, "indexes": by_index}
        tab = "; ".join(
            f"{name} " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in counts.items() if v >= 0.005)
            for name, counts in rows_written.items()
        )
        idx_text = ", ".join(f"{name} {v:.2f}" for name, v in by_index.items() if v >= 0.005)
        lines.append(f"  {phase}: {entries:.2f} index entries, {wal:,.0f} WAL bytes (no full-page images)")
        lines.append(f"    rows: {tab or '—'}")
        lines.append(f"    index entries: {idx_text or '—'}")
    per["index_entries_total"] = per["enqueue"]["index_entries"] + per["drain"]["index_entries"]
    per["wal_bytes_total"] = per["enqueue"]["wal_bytes"] + per["drain"]["wal_bytes"]
    lines.append(
        f"  total: {per['index_entries_total']:.2f} index entries, {per['wal_bytes_total']:,.0f} WAL bytes per job"
    )
    return "\n".join(lines), per


def machine_note(pg_version: str, loads: tuple[float, float], autovacuum: str, pgq: str, opts) -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}, PostgreSQL {pg_version} on "
        f"{PG['host']}:{PG['port']} (same machine), autovacuum {autovacuum}, synchronous_commit "
        f"{setting('synchronous_commit')}. pgqueuer {pgq} with asyncpg and uvloop, one QueueManager per process, "
        f"batch_size {opts.pgq_batch_size}, max_concurrent_tasks "
        f"{opts.pgq_max_tasks or 'none'} (100 in the I/O-bound runs). Load average (1 min) at start / end: "
        f"{loads[0]:.2f} / {loads[1]:.2f}."
        + (f" {os.environ['JOBS_BENCH_NOTE']}" if os.environ.get("JOBS_BENCH_NOTE") else "")
    )


def markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- generated by benchmarks/peers.py ({name}): begin -->",
        f"<!-- generated by benchmarks/peers.py ({name}): end -->",
    )


def write_docs(table: str, note: str, writes_text: str, indexes_text: str, sizes: Sizes, runs: int) -> None:
    body = f"""## Side by side with pgqueuer

Measured {dt.date.today().isoformat()} with `make bench-peers` (`benchmarks/peers.py`): the same
scenarios for both systems in one sitting, in each of {runs} repeats, the first system of each
scenario alternating between repeats (django-jobs first in the odd ones), each measurement right
after a `CHECKPOINT` (so that no measurement pays for a checkpoint the other escapes); each cell
is the median, the repeats in brackets; the ratio is django-jobs / pgqueuer (above 1
is better for django-jobs in rates, worse in CPU, latency and memory), of the two medians, and
next to it the median of the repeats' own ratios (the two systems of a repeat ran a minute or
so apart, so its ratio compares them on the same machine; the two medians may come from
different repeats). "load 1-min" is the
range of the machine's load average at the start of the measurements of that row.

Machine: {note}

{table}

What differs between the two, by design of each (keep it in mind when reading the ratios):
pgqueuer's jobs are coroutines on one event loop with one asyncpg connection per worker
(binary protocol, statements prepared by the driver) under uvloop, and with no
`max_concurrent_tasks` (its default) a worker keeps taking batches with no cap on the jobs it
holds; django-jobs runs jobs on `-c` threads through Django's psycopg connections and claims
no more than its free slots. pgqueuer deletes a finished job from its
queue table and keeps its history as three rows of its log (queued, picked, successful) with
no per-job events or metrics; it folds the log into its statistics table every 30 s, so a
drain shorter than that does not pay for it here. django-jobs keeps the finished row in its
job table, writes three events per job and a per-minute metric in the same transactions.

How each figure is taken (the system's tables are emptied before every measurement):

- **enqueue**: {sizes.enqueue:,} jobs from one process, one job and one transaction each:
  `noop.enqueue()` in autocommit; pgqueuer's `Queries.enqueue("noop", None)`. Each repeat
  sends them in {sizes.enqueue_rounds} rounds of {sizes.enqueue // sizes.enqueue_rounds:,} per
  system (a fresh process for pgqueuer, 50 to warm up before each round, each round on emptied
  tables after a `CHECKPOINT`), the two systems alternating round by round; the rate is all
  the jobs over all the rounds' time.
  The **raw loop** is psycopg alone, `INSERT` + commit of one row of a 9-column job-like table
  with one partial index: what one commit costs on this disk. It runs a round of the same size
  in every round, between the two systems, and its rate is taken as theirs (all its rows over
  all its rounds' time), so the shares compare the same minutes.
- **bulk enqueue**: {sizes.bulk:,} jobs in one transaction, timed to the end of the commit:
  `noop.enqueue_many(...)` in `transaction.atomic()`; pgqueuer's list form of `Queries.enqueue`
  (one statement). Each repeat times {sizes.bulk_calls} such calls per system, the two systems
  alternating call by call (a fresh process for each of pgqueuer's; a warm-up of 1,000 before
  each call, then the tables emptied and a `CHECKPOINT`), and takes their median.
- **drain**: {sizes.drain:,} waiting no-op jobs inserted beforehand; then 1 or 4 separate
  worker processes, each `manage.py runworker -c 8 --stop-when-empty` or one pgqueuer
  `QueueManager` in drain mode. The workers start while the harness holds a lock on the job
  table: each finishes its start-up and blocks on its first statement there; when all are
  blocked and idle the lock is released, so they begin together. Rate: completed / (last
  finish - first claim), from each system's rows (django-jobs `started_at`/`finished_at`;
  pgqueuer's log, `picked` and `successful`). **Worker CPU per job**: user + system time of the
  worker processes from the release to the last finish (`/proc`, sampled every 50 ms), so
  start-up and exit are not counted. **PostgreSQL CPU per job**: the same window for the
  backends serving the benchmark database (background processes such as the WAL writer are
  not counted).
- **pickup latency**: one idle worker (`-c 8`; pgqueuer's defaults), one job enqueued every
  {sizes.latency_interval * 1000:.0f} ms for {sizes.latency_seconds:.0f} s; claim time minus
  enqueue time, both from the database clock.
- **I/O-bound**: {sizes.io:,} jobs that each wait {sizes.io_sleep * 1000:.0f} ms, one worker
  process at concurrency {sizes.io_concurrency} (`runworker -c {sizes.io_concurrency}`;
  `max_concurrent_tasks={sizes.io_concurrency}`); pgqueuer runs only `async def` entrypoints, so
  its `time.sleep` job is `await asyncio.to_thread(time.sleep, ...)` on a default executor of
  {sizes.io_concurrency} threads. Peak RSS: VmHWM of the worker process.

What one plain job writes (from the WAL, `pg_walinspect`; single enqueues, then one worker
draining them):

```
{writes_text}
```

Indexes of django-jobs' job table:

```
{indexes_text}
```

Run it: `make bench-peers` (full run, writes this section; it starts PostgreSQL if needed and
installs pgqueuer {PGQ_VERSION} into `.bench-venv/peers` on first use);
`.venv/bin/python benchmarks/peers.py --quick` (small counts, one repeat, prints only);
`--only drain,latency` for a subset; `--pgq-batch-size` and `--pgq-max-tasks` to try other
pgqueuer settings. The databases (`bench_peers_dj`, `bench_peers_pgq`; `JOBS_PEERS_DJ_DB`,
`JOBS_PEERS_PGQ_DB`) are dropped and re-created on each run.
"""
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    begin, end = markers("peers")
    if begin in text and end in text:  # rewritten where it stands
        DOCS.write_text(splice_section(text, "peers", body, ["peers"], markers))
    else:  # a new section goes last, after the hand-written notes on django-jobs alone
        DOCS.write_text(f"{text.rstrip()}\n\n{begin}\n{body.rstrip()}\n{end}\n")


# -- main -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts, one run: a smoke test")
    parser.add_argument("--runs", type=int, default=None, help="repeats (median reported); default 3, 1 with --quick")
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {','.join(PARTS)}")
    parser.add_argument("--io-jobs", type=int, default=None, help="jobs per I/O-bound run; default 10,000")
    parser.add_argument("--pgq-batch-size", type=int, default=10, help="pgqueuer's batch_size; default 10 (its own)")
    parser.add_argument(
        "--pgq-max-tasks", type=int, default=0, help="pgqueuer's max_concurrent_tasks for the drains; 0: none (its own)"
    )
    opts = parser.parse_args()
    sizes = QUICK if opts.quick else Sizes()
    if opts.io_jobs:
        sizes = replace(sizes, io=opts.io_jobs)
    opts.sizes = sizes
    runs = opts.runs or (1 if opts.quick else 3)
    only = {s.strip() for s in opts.only.split(",") if s.strip()}
    if only - set(PARTS):
        parser.error(f"--only takes {', '.join(PARTS)}")
    wanted = lambda name: not only or name in only  # noqa: E731

    pgq_version = ensure_venv()
    pg_version = create_database(DJ_DB)[0]
    create_database(PGQ_DB)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    Raw.get(DJ_DB).execute(
        f"CREATE TABLE {RAW_TABLE} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), queue text NOT NULL, "
        "task_path text NOT NULL, args jsonb NOT NULL, kwargs jsonb NOT NULL, state text NOT NULL, "
        "priority smallint NOT NULL, enqueued_at timestamptz NOT NULL, available_at timestamptz NOT NULL)"
    )
    Raw.get(DJ_DB).execute(
        f"CREATE INDEX {RAW_TABLE}_ready ON {RAW_TABLE} (priority DESC, available_at) WHERE state = 'waiting'"
    )
    side("install")
    from django.db import connection

    connection.ensure_connection()
    Raw.get(DJ_DB)
    Raw.get(PGQ_DB)
    autovacuum = setting("autovacuum")
    say(f"pgqueuer {pgq_version}; PostgreSQL {pg_version}; autovacuum {autovacuum}")

    systems: list[System] = [DjangoJobs(opts), Pgqueuer(opts)]
    rows = {
        "enqueue": Row("enqueue, 1 job per transaction", "jobs/s"),
        "raw": Row("  raw psycopg INSERT + commit loop, same sitting", "jobs/s", ratio=False),
        "raw_share": Row("  enqueue / raw loop", "share", digits=2, ratio=False),
        "bulk": Row(f"bulk enqueue of {sizes.bulk:,}", "jobs/s"),
        "drain1": Row(f"drain {sizes.drain:,} no-op, 1 process", "jobs/s"),
        "drain4": Row(f"drain {sizes.drain:,} no-op, 4 processes", "jobs/s"),
        "cpu1": Row("  worker CPU per job, 1 process", "µs"),
        "cpu4": Row("  worker CPU per job, 4 processes", "µs"),
        "pg1": Row("  PostgreSQL CPU per job, 1 process", "µs"),
        "pg4": Row("  PostgreSQL CPU per job, 4 processes", "µs"),
        "rss1": Row("  peak RSS per worker, 1 process", "MiB", digits=1),
        "p50": Row("pickup latency p50 at 20 jobs/s", "ms", digits=1),
        "p95": Row("pickup latency p95", "ms", digits=1),
        "p99": Row("pickup latency p99", "ms", digits=1),
        "io_sync": Row(f"I/O-bound {sizes.io:,} × {sizes.io_sleep * 1000:.0f} ms time.sleep, c=100", "jobs/s"),
        "io_sync_rss": Row("  peak RSS of the worker", "MiB", digits=1),
        "io_async": Row(f"I/O-bound {sizes.io:,} × {sizes.io_sleep * 1000:.0f} ms asyncio.sleep, c=100", "jobs/s"),
        "io_async_rss": Row("  peak RSS of the worker", "MiB", digits=1),
    }

    def put(key: str, system: System, value: float | None) -> None:
        if value is not None:
            getattr(rows[key], system.key).append(value)

    loads_start = os.getloadavg()
    for run in range(1, runs + 1):
        say(f"run {run}/{runs} (load {os.getloadavg()[0]:.2f})")
        # Each repeat alternates which system goes first, in every scenario.
        order = systems if run % 2 else systems[::-1]
        if wanted("enqueue"):
            rows["enqueue"].load.append(os.getloadavg()[0])
            each = sizes.enqueue // sizes.enqueue_rounds
            seconds = {system.key: 0.0 for system in systems}
            raw_seconds = 0.0
            for i in range(sizes.enqueue_rounds):
                # The raw loop takes its turn in every round, between the two systems, so each
                # share compares moments of the same minute (the commit's speed drifts).
                for turn, system in enumerate(order if i % 2 == 0 else order[::-1]):
                    checkpoint()
                    seconds[system.key] += each / system.enqueue(each)
                    if turn == 0:
                        checkpoint()
                        raw_seconds += each / raw_enqueue(each)
            for system in order:
                put("enqueue", system, each * sizes.enqueue_rounds / seconds[system.key])
                say(f"  {system.name}: enqueue {getattr(rows['enqueue'], system.key)[-1]:,.0f}/s")
            raw = each * sizes.enqueue_rounds / raw_seconds
            rows["raw"].dj.append(raw)  # one ceiling for both: the same disk, the same commit
            rows["raw"].pgq.append(raw)
            rows["raw_share"].dj.append(rows["enqueue"].dj[-1] / raw)
            rows["raw_share"].pgq.append(rows["enqueue"].pgq[-1] / raw)
            say(f"  raw INSERT + commit {raw:,.0f}/s")
        if wanted("bulk"):
            rows["bulk"].load.append(os.getloadavg()[0])
            calls: dict[str, list[float]] = {system.key: [] for system in systems}
            for i in range(sizes.bulk_calls):
                for system in order if i % 2 == 0 else order[::-1]:
                    calls[system.key].append(system.bulk(sizes.bulk))
            for system in order:
                put("bulk", system, statistics.median(calls[system.key]))
                say(
                    f"  {system.name}: bulk {getattr(rows['bulk'], system.key)[-1]:,.0f}/s "
                    f"(calls {' / '.join(f'{r:,.0f}' for r in calls[system.key])})"
                )
        for processes, suffix in ((1, "1"), (4, "4")):
            for system in order:
                if not wanted("drain"):
                    continue
                checkpoint()
                rows[f"drain{suffix}"].load.append(os.getloadavg()[0])
                d = drain(system, sizes.drain, processes)
                put(f"drain{suffix}", system, d.rate)
                put(f"cpu{suffix}", system, d.cpu_us)
                put(f"pg{suffix}", system, d.pg_us)
                if processes == 1:
                    put("rss1", system, d.peak_kib / 1024)
                pg = f"{d.pg_us:,.0f}" if d.pg_us is not None else "?"
                say(
                    f"  {system.name}: drain x{processes} {d.rate:,.0f}/s, worker {d.cpu_us:,.0f} µs/job, "
                    f"PostgreSQL {pg} µs/job"
                )
        for system in order:
            if wanted("latency"):
                checkpoint()
                rows["p50"].load.append(os.getloadavg()[0])
                p50, p95, p99 = latency(system, sizes.latency_seconds, sizes.latency_interval)
                put("p50", system, p50)
                put("p95", system, p95)
                put("p99", system, p99)
                say(f"  {system.name}: pickup p50/p95/p99 {p50:.1f}/{p95:.1f}/{p99:.1f} ms")
        for kind, key in (("sleep_sync", "io_sync"), ("sleep_async", "io_async")):
            for system in order:
                if not wanted("io"):
                    continue
                checkpoint()
                rows[key].load.append(os.getloadavg()[0])
                d = io_bound(system, sizes, kind)
                put(key, system, d.rate)
                put(f"{key}_rss", system, d.peak_kib / 1024)
                say(f"  {system.name}: {kind} {d.rate:,.0f}/s, peak RSS {d.peak_kib / 1024:.1f} MiB")

    writes: dict[str, JobWrites | None] = {}
    if wanted("index"):
        say("what one plain job writes (WAL) ...")
        for system in systems:
            writes[system.key] = job_writes(system, sizes.index_jobs)
    for system in systems:
        system.reset()
    loads_end = os.getloadavg()

    table_rows = [r for r in rows.values() if r.dj or r.pgq]
    note = machine_note(pg_version, (loads_start[0], loads_end[0]), autovacuum, pgq_version, opts)
    indexes = job_table_indexes()
    partial = [i for i in indexes if i[2]]
    indexes_text = (
        f"{len(indexes)} indexes on {', '.join(sorted({i[0] for i in indexes}))}, {len(partial)} partial:\n"
        + "\n".join(f"  {name}" + (f"  WHERE {pred}" if pred else "") for _t, name, pred in indexes)
    )
    writes_parts, writes_json = [], {}
    if writes.get("dj"):
        text, per = writes_summary("django-jobs", writes["dj"])
        job_text, job_per = writes_summary(
            "django-jobs, job table(s) only", writes["dj"], {t[0] for t in dj_job_tables()}
        )
        writes_parts += [text, job_text]
        writes_json["django_jobs"] = per
        writes_json["django_jobs_job_tables"] = job_per
    if writes.get("pgq"):
        text, per = writes_summary("pgqueuer", writes["pgq"])
        writes_parts.append(text)
        writes_json["pgqueuer"] = per
    writes_text = "\n".join(writes_parts) or "(not measured)"

    print()
    print(text_table(table_rows))
    print()
    print(note)
    print()
    print(writes_text)
    print()
    print(indexes_text)
    print()
    print(
        json.dumps(
            {
                "benchmark": "peers",
                "date": dt.date.today().isoformat(),
                "runs": runs,
                "sizes": sizes.__dict__,
                "pgqueuer": pgq_version,
                "postgresql": pg_version,
                "autovacuum": autovacuum,
                "load_1min_start_end": [loads_start[0], loads_end[0]],
                "rows": [r.as_json() for r in table_rows],
                "writes_per_job": writes_json,
                "job_table_indexes": [{"table": t, "index": i, "predicate": p} for t, i, p in indexes],
            },
            ensure_ascii=False,
        )
    )
    if opts.write:
        write_docs(markdown_table(table_rows), note, writes_text, indexes_text, sizes, runs)
        print(f"Wrote {DOCS.relative_to(ROOT)}.")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Throughput and latency of django-jobs against a real PostgreSQL (``make bench``).

Measures, each as the median of ``--runs`` runs (default 3), truncating the job table before
every run:

1. enqueue rate: ``noop.enqueue()`` one job per transaction (autocommit), from this process;
2. bulk drain of pre-enqueued no-op jobs by ``manage.py runworker -p 1 -c 8 --stop-when-empty``
   and ``-p 2 -c 8``, run as real subprocesses; the rate comes from the database's own
   timestamps: ``count / (max(finished_at) - min(started_at))``; the peak RSS (VmHWM) of the
   worker processes is sampled from ``/proc`` while they run;
3. enqueue-to-start latency (``started_at - enqueued_at``) p50/p95/p99 with one idle worker
   (``-c 8``, LISTEN/NOTIFY active) while one job is enqueued every 50 ms;
4. a ceiling: a raw psycopg loop (no Django) claiming batches of 100 with ``FOR UPDATE SKIP
   LOCKED`` on the same table and completing them, with one connection and with 2 processes;
5. bulk enqueue: ``noop.enqueue_many(generator)`` of 100,000 jobs in one transaction (commit and
   the ``task_enqueued`` signals included), on PostgreSQL and on SQLite, each run in a fresh
   process so its peak RSS growth (``ru_maxrss`` after minus before) is the call's alone.
   ``--only enqueue_many`` runs just this part.

It uses its own database (``JOBS_BENCH_DB``, default ``jobs_bench``; dropped and re-created) on the
server named by ``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD`` (default 127.0.0.1:5432, postgres).
Prints a table and writes it to ``docs/benchmarks.md`` (not with ``--quick``, a smaller smoke run,
unless ``--write`` is given).
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import platform
import resource
import signal
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
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

PG = {
    "host": os.environ.get("PGHOST", "127.0.0.1"),
    "port": int(os.environ.get("PGPORT", "5432")),
    "user": os.environ.get("PGUSER", "postgres"),
    "password": os.environ.get("PGPASSWORD", ""),
}
DB_NAME = os.environ.get("JOBS_BENCH_DB", "jobs_bench")
TASK_PATH = "benchmarks.tasks.noop"
DOCS = ROOT / "docs" / "benchmarks.md"


@dataclass
class Sizes:
    enqueue: int = 3_000
    drain: int = 20_000
    latency_seconds: float = 15.0
    latency_interval: float = 0.05
    ceiling: int = 20_000
    enqueue_many: int = 100_000
    isolation: int = 5_000


QUICK = Sizes(enqueue=500, drain=3_000, latency_seconds=4.0, ceiling=5_000, enqueue_many=10_000, isolation=1_000)


def fail(message: str) -> None:
    print(f"benchmarks/throughput.py: {message}", file=sys.stderr)
    sys.exit(2)


# -- database set-up ----------------------------------------------------------------------------


def connect_raw(dbname: str, **kwargs):  # noqa: ANN201 - psycopg is imported lazily
    import psycopg

    return psycopg.connect(dbname=dbname, connect_timeout=5, **PG, **kwargs)


def ensure_database() -> str:
    """Fail clearly unless PostgreSQL answers; (re)create the benchmark database."""
    return create_database(DB_NAME)[0]


def create_database(name: str, *, reuse: bool = False) -> tuple[str, bool]:
    """(server version, whether the database was kept): drop and create ``name`` (a fresh
    database each time, so the schema is exactly what the migrations say now) unless ``reuse``
    and it exists. Fails clearly unless PostgreSQL answers."""
    try:
        import psycopg
    except ImportError:
        fail("psycopg 3 is not installed; `pip install 'django-db-jobs[postgres]'` (make venv does).")
    try:
        with connect_raw("postgres", autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None
            if reuse and exists:
                return version, True
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(
            f"PostgreSQL is not reachable at {PG['host']}:{PG['port']} as {PG['user']!r}: {first}\n"
            "Start it (`make bench` runs scripts/ensure_postgres.sh first) or point PGHOST/PGPORT/"
            "PGUSER/PGPASSWORD at a server you may create a database on."
        )
    return version, False


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        # The tables that reference the jobs (logs, flow dependencies, dedup keys): PostgreSQL
        # truncates them together or not at all. CASCADE covers tables added later.
        cursor.execute(
            "TRUNCATE django_jobs_joblog, django_jobs_dependency, django_jobs_dedup, django_jobs_dedup_next, "
            "django_jobs_job, django_jobs_worker, django_jobs_schedule, django_jobs_queuestate CASCADE"
        )


def prefill(n: int) -> None:
    """Insert ``n`` waiting no-op jobs as enqueue would (a few multi-row inserts), then ANALYZE."""
    from django.db import connection
    from django.utils import timezone

    from django_jobs.engine import ready_seq
    from django_jobs.models import Job

    now = timezone.now()
    Job.objects.bulk_create(
        (
            Job(
                backend="default",
                queue="default",
                task_path=TASK_PATH,
                args=[],
                kwargs={},
                max_attempts=1,
                options={},
                state="waiting",
                available_at=now,
                seq=ready_seq(now),
                enqueued_at=now,
            )
            for _ in range(n)
        ),
        batch_size=2_000,
    )
    with connection.cursor() as cursor:  # MariaDB/MySQL (benchmarks/mysql_figures.py) say ANALYZE TABLE
        cursor.execute(f"ANALYZE {'TABLE ' if connection.vendor == 'mysql' else ''}django_jobs_job")


def scalar(sql: str, params: list | None = None):  # noqa: ANN201
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()


def db_rate(expected: int) -> float:
    """Jobs/s from the rows: completed count / (max(finished_at) - min(started_at))."""
    count, span = scalar(
        "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) "
        "FROM django_jobs_job WHERE state = 'completed'"
    )
    if count != expected:
        left = scalar("SELECT count(*) FROM django_jobs_job WHERE state <> 'completed'")[0]
        fail(f"expected {expected} completed jobs, found {count} ({left} in other states).")
    return count / float(span)


# -- worker subprocesses ------------------------------------------------------------------------


def worker_command(*args: str) -> list[str]:
    # -v 0: warnings and errors only; they go to a log file shown if the worker fails.
    return [sys.executable, "-m", "django", "runworker", "--settings=benchmarks.settings", "-v", "0", *args]


def start_worker(args: list[str], log: Any) -> subprocess.Popen:
    return subprocess.Popen(
        worker_command(*args), cwd=ROOT, env=worker_env(), stdout=log, stderr=subprocess.STDOUT, text=True
    )


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process still running (a worker's graceful stop), then wait for each; kill
    one that has not exited after 60 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def log_tail(log: Any) -> str:
    log.seek(0)
    return "".join(log.readlines()[-20:])


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    env["JOBS_BENCH_DB"] = DB_NAME
    return env


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except OSError:
            continue
    return pids


def vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Peaks:
    """Peak RSS (VmHWM, KiB) of every process of a worker's tree, sampled while it runs."""

    root: int
    by_pid: dict[int, int] = field(default_factory=dict)

    def sample(self) -> None:
        for pid in process_tree(self.root):
            hwm = vm_hwm_kib(pid)
            if hwm is not None:
                self.by_pid[pid] = max(hwm, self.by_pid.get(pid, 0))

    @property
    def workers(self) -> list[int]:
        """Peaks of the processes that run jobs: the forked children, or the root alone."""
        children = [v for p, v in self.by_pid.items() if p != self.root]
        return children or [self.by_pid.get(self.root, 0)]


def run_worker_until_exit(args: list[str], timeout: float) -> tuple[Peaks, float, float]:
    """Run ``runworker *args`` to its end; return its RSS peaks, wall time and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = start_worker(args, log)
        peaks = Peaks(proc.pid)
        while proc.poll() is None:
            peaks.sample()
            if time.monotonic() - started > timeout:
                proc.kill()
                proc.wait()
                fail(f"runworker {' '.join(args)} did not finish within {timeout:.0f}s:\n{log_tail(log)}")
            time.sleep(0.05)
        if proc.returncode != 0:
            fail(f"runworker {' '.join(args)} exited with {proc.returncode}:\n{log_tail(log)}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return peaks, time.monotonic() - started, cpu


# -- the measurements ---------------------------------------------------------------------------


def measure_enqueue(n: int) -> float:
    from benchmarks.tasks import noop

    truncate()
    for _ in range(50):  # warm up: connection, imports, caches
        noop.enqueue()
    truncate()
    t0 = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    elapsed = time.perf_counter() - t0
    return n / elapsed


@dataclass
class DrainResult:
    rate: float
    wall_rate: float
    cpu_us_per_job: float
    worker_peak_kib: int
    total_peak_kib: int


def measure_drain(n: int, processes: int, *extra: str, concurrency: int = 8) -> DrainResult:
    truncate()
    prefill(n)
    peaks, wall, cpu = run_worker_until_exit(
        ["-p", str(processes), "-c", str(concurrency), "--stop-when-empty", *extra], timeout=max(120.0, n / 50)
    )
    return DrainResult(
        rate=db_rate(n),
        wall_rate=n / wall,
        cpu_us_per_job=cpu / n * 1e6,
        worker_peak_kib=max(peaks.workers),
        total_peak_kib=sum(peaks.by_pid.values()),
    )


def measure_latency(seconds: float, interval: float) -> tuple[float, float, float]:
    from benchmarks.tasks import noop

    truncate()
    log = tempfile.TemporaryFile("w+")
    proc = start_worker(["-c", "8"], log)
    try:
        # Idle and listening: the worker registered and its LISTEN connection is up.
        deadline = time.monotonic() + 30
        while True:
            workers = scalar("SELECT count(*) FROM django_jobs_worker")[0]
            listening = scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN %%'"
            )[0]
            if workers and listening:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                fail(f"the latency worker did not start (or never LISTENed) within 30s:\n{log_tail(log)}")
            time.sleep(0.05)
        time.sleep(1.0)
        n = int(seconds / interval)
        t0 = time.monotonic()
        for i in range(n):
            pause = t0 + i * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            noop.enqueue()
        deadline = time.monotonic() + 30
        while scalar("SELECT count(*) FROM django_jobs_job WHERE state = 'completed'")[0] < n:
            if time.monotonic() > deadline:
                fail(f"the latency worker did not finish its jobs within 30s:\n{log_tail(log)}")
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM started_at - enqueued_at) * 1000 FROM django_jobs_job")
        ms = sorted(float(r[0]) for r in cursor.fetchall())
    return percentile(ms, 50), percentile(ms, 95), percentile(ms, 99)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    k = max(0, min(len(sorted_values) - 1, int(round(p / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


CEILING_CLAIM = (
    "UPDATE django_jobs_job SET state = 'active', attempts = attempts + 1, lease_token = gen_random_uuid(), "
    "lease_expires_at = now() + interval '30 seconds', worker_id = %s, "
    "started_at = COALESCE(started_at, now()), last_attempted_at = now() "
    "WHERE id IN (SELECT id FROM django_jobs_job WHERE state = 'waiting' "
    "ORDER BY priority DESC, seq, id LIMIT 100 FOR UPDATE SKIP LOCKED) AND state = 'waiting' "
    "RETURNING id, lease_token"
)
CEILING_COMPLETE = (
    "UPDATE django_jobs_job SET state = 'completed', finished_at = now(), lease_token = NULL, "
    "lease_expires_at = NULL WHERE id = ANY(%s) AND state = 'active'"
)


def ceiling_loop(name: str, start: object | None = None) -> int:
    """Claim 100 / complete 100 until the table is empty (one connection, autocommit)."""
    done = 0
    with connect_raw(DB_NAME, autocommit=True) as conn:
        conn.execute("SELECT 1")
        if start is not None:
            start.wait()  # type: ignore[attr-defined]
        while True:
            rows = conn.execute(CEILING_CLAIM, [name]).fetchall()
            if not rows:
                # Another process may still hold rows locked; stop only when none is waiting.
                if not conn.execute("SELECT 1 FROM django_jobs_job WHERE state = 'waiting' LIMIT 1").fetchone():
                    return done
                continue
            conn.execute(CEILING_COMPLETE, [[r[0] for r in rows]])
            done += len(rows)


def measure_ceiling(n: int, processes: int) -> float:
    truncate()
    prefill(n)
    if processes == 1:
        ceiling_loop("raw-0")
    else:
        ctx = multiprocessing.get_context("spawn")
        start = ctx.Event()
        procs = [ctx.Process(target=ceiling_loop, args=(f"raw-{i}", start)) for i in range(processes)]
        for p in procs:
            p.start()
        time.sleep(1.0)  # let each connect
        start.set()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                fail(f"a ceiling process exited with {p.exitcode}.")
    return db_rate(n)


@dataclass
class BulkResult:
    rate: float
    rss_growth_kib: int


def own_peak_rss_kib() -> int:
    """This process's peak RSS in KiB: ``ru_maxrss``, as it would be if Linux did not carry the
    parent's peak into a spawned child (it keeps the maximum across execve, so a child of a
    large parent starts with the parent's figure and growth below it would not show). VmHWM is
    the same high-water mark for this process image alone; ``ru_maxrss`` where /proc is missing."""
    hwm = vm_hwm_kib(os.getpid())
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def enqueue_many_child(n: int, result_queue: Any) -> None:
    """In a fresh process (so ``ru_maxrss`` starts at this process's own start-up): enqueue ``n``
    jobs with one ``enqueue_many`` in one transaction; report the rate and the peak RSS growth."""
    import gc

    import django

    django.setup()
    from django.db import connection, transaction

    from benchmarks.tasks import noop

    noop.enqueue_many(() for _ in range(1_000))  # warm up: connection, imports, cached SQL
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_jobs_job")
    gc.collect()
    before = own_peak_rss_kib()
    t0 = time.perf_counter()
    with transaction.atomic():
        results = noop.enqueue_many(() for _ in range(n))
    elapsed = time.perf_counter() - t0
    after = own_peak_rss_kib()
    stored = scalar("SELECT count(*) FROM django_jobs_job")[0]
    if stored != n or len(results) != n:
        result_queue.put(f"expected {n} jobs, found {stored} rows and {len(results)} results")
        return
    result_queue.put((n / elapsed, after - before))


def measure_enqueue_many(n: int, vendor: str) -> BulkResult:
    """One run of :func:`enqueue_many_child` on ``vendor`` (``postgresql``: the benchmark database,
    truncated; ``sqlite``: a fresh migrated file in a temporary directory)."""
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        saved = {k: os.environ.get(k) for k in ("JOBS_BENCH_VENDOR", "JOBS_BENCH_SQLITE")}
        try:
            if vendor == "sqlite":
                # The spawned child reads its settings from these (benchmarks/settings.py).
                os.environ["JOBS_BENCH_VENDOR"] = "sqlite"
                os.environ["JOBS_BENCH_SQLITE"] = str(Path(tmp) / "bench.sqlite3")
                subprocess.run(
                    [sys.executable, "-m", "django", "migrate", "-v", "0", "--settings=benchmarks.settings"],
                    cwd=ROOT,
                    env=worker_env(),
                    check=True,
                )
            result_queue = ctx.Queue()
            proc = ctx.Process(target=enqueue_many_child, args=(n, result_queue))
            proc.start()
            outcome = result_queue.get(timeout=max(300.0, n / 200))
            proc.join(30)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    if isinstance(outcome, str):
        fail(f"enqueue_many on {vendor}: {outcome}")
    rate, growth = outcome
    return BulkResult(rate=rate, rss_growth_kib=growth)


# -- report -------------------------------------------------------------------------------------


@dataclass
class Row:
    metric: str
    runs: list[float]
    unit: str
    target: str = "—"
    check: Callable[[float], bool] | None = None
    digits: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def met(self) -> str:
        if self.check is None:
            return "—"
        return "yes" if self.check(self.median) else "NO"

    def fmt(self, value: float) -> str:
        return f"{value:,.{self.digits}f}"

    def cells(self) -> list[str]:
        return [
            self.metric,
            f"{self.fmt(self.median)} {self.unit}",
            " / ".join(self.fmt(v) for v in self.runs),
            self.target,
            self.met,
        ]


HEADER = ["metric", "median", "runs", "target", "met?"]


def text_table(rows: list[Any], header: list[str] = HEADER) -> str:
    """``rows`` (anything with ``cells()``) under ``header``, in aligned columns."""
    cells = [header] + [r.cells() for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = []
    for i, c in enumerate(cells):
        lines.append("  ".join(v.ljust(widths[j]) for j, v in enumerate(c)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def machine_note(pg_version: str, load_before: tuple[float, ...], load_after: tuple[float, ...]) -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, PostgreSQL {pg_version} on {PG['host']}:{PG['port']} "
        f"(same machine). Load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}."
        + (f" {os.environ['JOBS_BENCH_NOTE']}" if os.environ.get("JOBS_BENCH_NOTE") else "")
    )


BEGIN = "<!-- generated by benchmarks/throughput.py: begin -->"
END = "<!-- generated by benchmarks/throughput.py: end -->"


def splice_section(text: str, name: str, body: str, names: list[str], markers: Callable[[str], tuple[str, str]]) -> str:
    """``text`` (a docs page) with its generated section ``name`` (between ``markers(name)``)
    replaced by ``body``; a new section goes before the next one of ``names`` present (so the
    sections keep that order), else before "## Run it", else at the end."""
    begin, end = markers(name)
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    if later := [m for m in names[names.index(name) + 1 :] if markers(m)[0] in text]:
        head, rest = text.split(markers(later[0])[0], 1)
        return f"{head}{block}\n\n{markers(later[0])[0]}{rest}"
    if "\n## Run it" in text:
        head, rest = text.split("\n## Run it", 1)
        return f"{head}\n{block}\n\n## Run it{rest}"
    return f"{text.rstrip()}\n\n{block}\n"


def write_docs(table: str, note: str, sizes: Sizes, runs: int) -> None:
    """Write the generated part of docs/benchmarks.md, keeping the hand-written text around it."""
    today = dt.date.today().isoformat()
    generated = f"""{BEGIN}
Measured {today} with `make bench` (`benchmarks/throughput.py`); each figure is the median of
{runs} runs, the runs listed beside it.

Machine: {note}

{table}

What is measured (the job table is truncated before every run):

- **enqueue**: `noop.enqueue()` {sizes.enqueue:,} times from one process in autocommit, one job
  (and one transaction) per call, after a warm-up.
- **drain**: {sizes.drain:,} waiting no-op jobs inserted beforehand, then
  `manage.py runworker -p N -c 8 --stop-when-empty` run as a subprocess. The rate comes from the
  rows: completed jobs / (max(`finished_at`) - min(`started_at`)), so process start-up is not
  counted (the wall-clock rows include it). **Worker CPU per job** is the user + system CPU
  time of the whole `runworker` process tree (start-up included) divided by the jobs. **Peak
  RSS** is the largest VmHWM of one process that runs jobs (with `-p 2` the forked children;
  "all processes" adds the supervisor), sampled from `/proc` every 50 ms.
- **pickup latency**: one idle `runworker -c 8` LISTENing; one job enqueued every
  {sizes.latency_interval * 1000:.0f} ms for {sizes.latency_seconds:.0f} s; `started_at - enqueued_at` of
  each row (both clocks are this machine's).
- **raw ceiling**: no Django: one psycopg connection (or 2 processes, one connection each) loops
  `UPDATE ... WHERE id IN (SELECT ... ORDER BY priority DESC, seq, id LIMIT 100 FOR UPDATE
  SKIP LOCKED) RETURNING id`, then one `UPDATE` marking those rows completed, over
  {sizes.ceiling:,} waiting rows of the same table; rate measured like the drain.
- **enqueue_many**: `noop.enqueue_many(() for _ in range({sizes.enqueue_many:,}))` inside one
  `transaction.atomic()`, timed to the end of the commit (which sends the {sizes.enqueue_many:,}
  `task_enqueued` signals), after a warm-up, in a fresh process per run; on this PostgreSQL and
  on a SQLite file on local disk. **Peak RSS growth** is that process's peak RSS after the call
  minus before it (VmHWM: `ru_maxrss` of the process image alone), with the results still
  referenced.
{END}"""
    if DOCS.exists() and BEGIN in (text := DOCS.read_text()) and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + generated + rest.split(END, 1)[1]
    else:
        text = f"""# Benchmarks

{generated}

## Run it

```
make bench                                          # starts PostgreSQL if needed; full run
.venv/bin/python benchmarks/throughput.py --quick   # smaller counts, a smoke run (prints only)
```

The benchmark uses its own database, `jobs_bench` (`JOBS_BENCH_DB`), dropped and re-created
on each run, on the server named by `PGHOST`/`PGPORT`/`PGUSER`/`PGPASSWORD` (default
`127.0.0.1:5432`, `postgres`). `JOBS_BENCH_NOTE` adds a sentence to the machine note.
"""
    DOCS.parent.mkdir(exist_ok=True)
    DOCS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts: a smoke run (prints only)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median reported); default 3")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md even with --quick")
    parser.add_argument(
        "--only", default="", help="comma-separated subset: enqueue,drain,latency,ceiling,enqueue_many,isolation"
    )
    parser.add_argument(
        "--enqueue-many-jobs", type=int, default=None, help="jobs per enqueue_many run; default 100,000"
    )
    opts = parser.parse_args()
    sizes = QUICK if opts.quick else Sizes()
    if opts.enqueue_many_jobs:
        sizes = replace(sizes, enqueue_many=opts.enqueue_many_jobs)
    only = {s.strip() for s in opts.only.split(",") if s.strip()}
    wanted = lambda name: not only or name in only  # noqa: E731

    pg_version = ensure_database()
    setup_django()
    load_before = os.getloadavg()

    enqueue, drain1, drain2, lat, ceil1, ceil2 = [], [], [], [], [], []
    bulk_pg: list[BulkResult] = []
    bulk_sqlite: list[BulkResult] = []
    iso_thread: list[DrainResult] = []
    iso_process: list[DrainResult] = []
    for run in range(1, opts.runs + 1):
        print(f"run {run}/{opts.runs}", file=sys.stderr)
        if wanted("enqueue"):
            enqueue.append(measure_enqueue(sizes.enqueue))
            print(f"  enqueue {enqueue[-1]:,.0f}/s", file=sys.stderr)
        if wanted("ceiling"):
            ceil1.append(measure_ceiling(sizes.ceiling, 1))
            ceil2.append(measure_ceiling(sizes.ceiling, 2))
            print(f"  ceiling {ceil1[-1]:,.0f}/s, 2 processes {ceil2[-1]:,.0f}/s", file=sys.stderr)
        if wanted("drain"):
            drain1.append(measure_drain(sizes.drain, 1))
            drain2.append(measure_drain(sizes.drain, 2))
            print(f"  drain -p 1 {drain1[-1].rate:,.0f}/s, -p 2 {drain2[-1].rate:,.0f}/s", file=sys.stderr)
        if wanted("latency"):
            lat.append(measure_latency(sizes.latency_seconds, sizes.latency_interval))
            print("  pickup p50/p95/p99 {:.1f}/{:.1f}/{:.1f} ms".format(*lat[-1]), file=sys.stderr)
        if wanted("isolation"):
            # The cost of --isolation process: a pipe round trip per job and a child per slot.
            iso_thread.append(measure_drain(sizes.isolation, 1, concurrency=2))
            iso_process.append(measure_drain(sizes.isolation, 1, "--isolation", "process", concurrency=2))
            print(
                f"  -c 2 threads {iso_thread[-1].rate:,.0f}/s, -c 2 --isolation process {iso_process[-1].rate:,.0f}/s",
                file=sys.stderr,
            )
        if wanted("enqueue_many"):
            for vendor, runs in (("postgresql", bulk_pg), ("sqlite", bulk_sqlite)):
                runs.append(measure_enqueue_many(sizes.enqueue_many, vendor))
                print(
                    f"  enqueue_many {sizes.enqueue_many:,} on {vendor}: {runs[-1].rate:,.0f}/s, "
                    f"peak RSS +{runs[-1].rss_growth_kib / 1024:.1f} MiB",
                    file=sys.stderr,
                )
    truncate()
    load_after = os.getloadavg()

    rows: list[Row] = []
    if enqueue:
        rows.append(Row("enqueue, 1 job/transaction", enqueue, "jobs/s", ">= 1,000", lambda v: v >= 1000))
    ceiling = statistics.median(ceil1) if ceil1 else None
    if drain1:
        rows.append(Row("drain -p 1 -c 8", [d.rate for d in drain1], "jobs/s"))
        target = ">= 5,000" + (f" and >= {ceiling / 4:,.0f} (ceiling/4)" if ceiling else "")
        rows.append(
            Row(
                "drain -p 2 -c 8",
                [d.rate for d in drain2],
                "jobs/s",
                target,
                lambda v: v >= 5000 and (ceiling is None or v >= ceiling / 4),
            )
        )
        rows.append(Row("drain -p 1, wall clock incl. start-up", [d.wall_rate for d in drain1], "jobs/s"))
        rows.append(Row("drain -p 2, wall clock incl. start-up", [d.wall_rate for d in drain2], "jobs/s"))
        rows.append(Row("worker CPU per job, -p 1", [d.cpu_us_per_job for d in drain1], "µs"))
        rows.append(Row("worker CPU per job, -p 2", [d.cpu_us_per_job for d in drain2], "µs"))
        rows.append(Row("peak RSS, -p 1 worker", [d.worker_peak_kib / 1024 for d in drain1], "MiB", "stated", digits=1))
        rows.append(
            Row("peak RSS, -p 2 per worker", [d.worker_peak_kib / 1024 for d in drain2], "MiB", "stated", digits=1)
        )
        rows.append(
            Row(
                "peak RSS, -p 2 all processes",
                [d.total_peak_kib / 1024 for d in drain2],
                "MiB",
                "stated",
                digits=1,
            )
        )
    if lat:
        rows.append(Row("pickup latency p50", [x[0] for x in lat], "ms", "<= 10", lambda v: v <= 10, 1))
        rows.append(Row("pickup latency p95", [x[1] for x in lat], "ms", digits=1))
        rows.append(Row("pickup latency p99", [x[2] for x in lat], "ms", "<= 50", lambda v: v <= 50, 1))
    if ceil1:
        rows.append(Row("raw ceiling, 1 connection", ceil1, "jobs/s"))
        rows.append(Row("raw ceiling, 2 processes", ceil2, "jobs/s"))
    if iso_thread:
        rows.append(Row("drain -p 1 -c 2, threads", [d.rate for d in iso_thread], "jobs/s"))
        rows.append(Row("drain -p 1 -c 2, --isolation process", [d.rate for d in iso_process], "jobs/s"))
        rows.append(Row("  wall clock incl. children's start-up", [d.wall_rate for d in iso_process], "jobs/s"))
        rows.append(
            Row(
                "  peak RSS, worker + 2 children",
                [d.total_peak_kib / 1024 for d in iso_process],
                "MiB",
                "stated",
                digits=1,
            )
        )
    for name, bulk in (("PostgreSQL", bulk_pg), ("SQLite", bulk_sqlite)):
        if bulk:
            label = f"enqueue_many {sizes.enqueue_many:,}, {name}"
            rows.append(Row(f"{label}", [b.rate for b in bulk], "jobs/s"))
            rows.append(
                Row(f"{label}, peak RSS growth", [b.rss_growth_kib / 1024 for b in bulk], "MiB", "stated", digits=1)
            )

    note = machine_note(pg_version, load_before, load_after)
    print()
    print(text_table(rows))
    print()
    print(note)
    if (not opts.quick or opts.write) and not only:
        write_docs(markdown_table(rows), note, sizes, opts.runs)
        print(f"Wrote {DOCS.relative_to(ROOT)}.")


if __name__ == "__main__":
    main()

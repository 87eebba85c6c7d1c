#!/usr/bin/env python
"""django-jobs on a SQLite file database with one worker process (``make bench-sqlite``).

SQLite has one writer at a time, so django-jobs supports one worker process on it (``-p 1``,
any ``-c``); these are its figures. Each measurement gets a fresh database file in a temporary
directory on local disk (WAL, ``benchmarks/settings.py`` with ``JOBS_BENCH_VENDOR=sqlite``),
migrated with ``manage.py migrate``, and runs in a fresh process; each figure is the median of
``--runs`` runs (default 3):

1. enqueue: ``noop.enqueue()`` one job per transaction (autocommit), after a warm-up;
2. bulk enqueue: ``noop.enqueue_many(...)`` of 10,000 jobs in one ``transaction.atomic()``,
   timed to the end of the commit, after a warm-up;
3. drain of 20,000 waiting no-op jobs by one ``manage.py runworker -c 8 --stop-when-empty``
   subprocess: rate = completed / (max(finished_at) - min(started_at)) from the rows, the
   wall-clock rate (start-up included), the worker's CPU per job (``RUSAGE_CHILDREN``, start-up
   included) and its peak RSS (VmHWM sampled from ``/proc``);
4. pickup latency: one idle ``runworker -c 8`` (no NOTIFY on SQLite: it polls every
   ``POLL_INTERVAL``, jittered), one job enqueued every 50 ms for 10 s; p50/p95/p99 of
   ``started_at - enqueued_at``.

Prints a table and one JSON line; ``--write`` replaces its section of ``docs/benchmarks.md``.
``--quick``: small counts, one run.

The measurements are shared with ``benchmarks/mysql_figures.py`` (MariaDB/MySQL, ``make
bench-mysql``): what differs from one database to another is a :class:`Vendor`, SQLite's here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import platform
import queue
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# benchmarks/settings.py reads these; main() sets JOBS_BENCH_VENDOR, the vendor's fresh database
# (JOBS_BENCH_SQLITE: the file) is set per measurement, and the spawned measuring process and its
# worker subprocesses inherit them all.
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"

from benchmarks.throughput import (  # noqa: E402 - the environment above comes first
    log_tail,
    percentile,
    prefill,
    run_worker_until_exit,
    splice_section,
    start_worker,
    stop_processes,
    text_table,
    worker_env,
)

DOCS = ROOT / "docs" / "benchmarks.md"


@dataclass
class Sizes:
    enqueue: int = 3_000
    bulk: int = 10_000
    drain: int = 20_000
    latency_seconds: float = 10.0
    latency_interval: float = 0.05


QUICK = Sizes(enqueue=300, bulk=2_000, drain=2_000, latency_seconds=3.0)


def fail(message: str) -> None:
    print(f"{Path(sys.argv[0]).name}: {message}", file=sys.stderr)
    sys.exit(2)


# -- what differs from one database to another ----------------------------------------------------


class Vendor:
    """SQLite's side of the figures; ``benchmarks/mysql_figures.py`` subclasses it for
    MariaDB/MySQL. An instance is pickled into each measuring process (for :meth:`facts`)."""

    name = "sqlite"  # JOBS_BENCH_VENDOR, and the JSON line's "benchmark"
    script = "benchmarks/sqlite_figures.py"
    make_target = "bench-sqlite"
    #: The drains measured, by worker processes: SQLite takes one writer at a time.
    drain_processes: tuple[int, ...] = (1,)

    @contextlib.contextmanager
    def fresh_database(self) -> Iterator[None]:
        """An empty database for one measurement, which ``benchmarks/settings.py`` points at
        (not migrated yet); removed afterwards. Here a file in a temporary directory."""
        with tempfile.TemporaryDirectory(prefix="jobs-sqlite-bench-") as tmp:
            os.environ["JOBS_BENCH_SQLITE"] = str(Path(tmp) / "bench.sqlite3")
            yield

    def drain_args(self, processes: int) -> list[str]:
        """``runworker``'s arguments for a drain by ``processes`` processes (always 1 here)."""
        return ["-c", "8", "--stop-when-empty"]

    def server_process(self) -> tuple[int, str] | None:
        """The database server's process on this machine (pid, name), whose CPU time a drain
        measures too; SQLite has none."""
        return None

    def facts(self) -> dict[str, Any]:
        """In a measuring process (Django set up): the settings of the connection that the
        figures depend on."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            journal_mode = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous")
            synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(cursor.fetchone()[0], "?")
        return {"sqlite": sqlite3.sqlite_version, "journal_mode": journal_mode, "synchronous": synchronous}

    def describe(self, facts: dict[str, Any]) -> str:
        """The database, for the machine note."""
        tmp = tempfile.gettempdir()
        return (
            f"SQLite {sqlite3.sqlite_version}; the database file in {tmp} ({file_system(tmp)}), journal_mode "
            f"{facts.get('journal_mode', '?')}, synchronous {facts.get('synchronous', '?')}"
        )

    def brand(self, facts: dict[str, Any]) -> str:
        return "SQLite"

    def heading(self, facts: dict[str, Any]) -> str:
        return "SQLite, one worker process"

    def intro(self, facts: dict[str, Any]) -> str:
        """The section's first sentences, up to "Measured ..."."""
        return "SQLite takes one writer at a time, so django-jobs runs one worker process on it (`-p 1`, any\n`-c`)."

    def setup(self, facts: dict[str, Any]) -> str:
        """What each measurement starts from, after "What is measured: "."""
        return (
            "each measurement gets a fresh SQLite file in a temporary directory on local\n"
            "disk (WAL; `benchmarks/settings.py` with `JOBS_BENCH_VENDOR=sqlite`), migrated, and runs in a\n"
            "fresh process."
        )


SQLITE = Vendor()


# -- a fresh database and process per measurement -----------------------------------------------


def in_fresh_database(
    vendor: Vendor, measure: Callable[..., dict[str, Any]], *args: Any, timeout: float
) -> dict[str, Any]:
    """``measure(*args)`` in a spawned process with Django set up on a new, migrated database
    (``vendor.fresh_database()``, removed afterwards); its figures, plus ``vendor.facts()`` (as
    ``facts``) and the worker's ``POLL_INTERVAL``."""
    ctx = multiprocessing.get_context("spawn")
    with vendor.fresh_database():
        migrate = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0", "--settings=benchmarks.settings"],
            cwd=ROOT,
            env=worker_env(),
            capture_output=True,
            text=True,
        )
        if migrate.returncode != 0:
            fail(f"manage.py migrate exited with {migrate.returncode}:\n{migrate.stdout}{migrate.stderr}")
        results = ctx.Queue()
        proc = ctx.Process(target=measuring_child, args=(vendor, measure, args, results))
        proc.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                outcome = results.get(timeout=0.5)
                break
            except queue.Empty:
                if proc.exitcode is not None:
                    fail(f"{measure.__name__} exited with {proc.exitcode} without a result.")
                if time.monotonic() > deadline:
                    proc.kill()
                    fail(f"{measure.__name__} did not finish within {timeout:.0f}s.")
        proc.join(30)
    if isinstance(outcome, str):
        fail(f"{measure.__name__}: {outcome}")
    return outcome


def measuring_child(vendor: Vendor, measure: Callable[..., dict[str, Any]], args: tuple, results: Any) -> None:
    """The spawned process: Django on this measurement's database, then ``measure(*args)``."""
    try:
        import django

        django.setup()
        from django_jobs.conf import get_settings

        figures = measure(*args)
        figures["facts"] = vendor.facts()
        figures["poll_interval"] = get_settings().POLL_INTERVAL
        results.put(figures)
    except SystemExit:  # fail() has printed why
        results.put("failed (the message above says why)")
    except Exception:  # noqa: BLE001 - reported to the parent, which stops with it
        results.put(traceback.format_exc())


def empty_tables() -> None:
    """Delete every django-jobs row (the warm-up's), as ``manage.py flush`` would: in one
    transaction, the foreign keys deferred (SQLite) or unchecked meanwhile (MariaDB/MySQL)."""
    from django.core.management.color import no_style
    from django.db import connection

    tables = [t for t in connection.introspection.table_names() if t.startswith("django_jobs_")]
    connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables))


def completed_count() -> int:
    from django_jobs.models import Job

    return Job.objects.filter(state="completed").count()


# -- the measurements (each in its own process, see in_fresh_database) ----------------------------


def measure_enqueue(n: int) -> dict[str, Any]:
    from benchmarks.tasks import noop

    for _ in range(50):  # warm up: connection, imports, cached SQL
        noop.enqueue()
    empty_tables()
    t0 = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    elapsed = time.perf_counter() - t0
    return {"rate": n / elapsed}


def measure_bulk(n: int) -> dict[str, Any]:
    from django.db import transaction

    from benchmarks.tasks import noop
    from django_jobs.models import Job

    noop.enqueue_many(() for _ in range(1_000))  # warm up
    empty_tables()
    t0 = time.perf_counter()
    with transaction.atomic():
        results = noop.enqueue_many(() for _ in range(n))
    elapsed = time.perf_counter() - t0
    stored = Job.objects.count()
    if stored != n or len(results) != n:
        fail(f"expected {n} jobs, found {stored} rows and {len(results)} results.")
    return {"rate": n / elapsed}


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (all its threads), from ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # from field 3 on: the name may hold spaces
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def measure_drain(n: int, args: list[str], server_pid: int | None = None) -> dict[str, Any]:
    """``runworker *args`` drains ``n`` waiting jobs; with ``server_pid``, the CPU time the
    database server's process spent meanwhile, per job, too."""
    from django.db.models import Count, Max, Min

    from django_jobs.models import Job

    prefill(n)
    server_before = process_cpu_seconds(server_pid) if server_pid else None
    peaks, wall, cpu = run_worker_until_exit(args, timeout=max(120.0, n / 50))
    server_after = process_cpu_seconds(server_pid) if server_pid else None
    done = Job.objects.filter(state="completed").aggregate(
        count=Count("id"), first=Min("started_at"), last=Max("finished_at")
    )
    if done["count"] != n:
        left = Job.objects.exclude(state="completed").count()
        fail(f"expected {n} completed jobs, found {done['count']} ({left} in other states).")
    by_worker = Job.objects.order_by().values("worker_id").annotate(n=Count("id")).values_list("n", flat=True)
    return {
        "jobs_by_worker": sorted(by_worker, reverse=True),
        "rate": n / (done["last"] - done["first"]).total_seconds(),
        "wall_rate": n / wall,
        "cpu_us_per_job": cpu / n * 1e6,
        "peak_kib": max(peaks.workers),
        "server_cpu_us_per_job": (
            (server_after - server_before) / n * 1e6 if server_before is not None and server_after is not None else None
        ),
    }


def measure_latency(seconds: float, interval: float) -> dict[str, Any]:
    from benchmarks.tasks import noop
    from django_jobs.models import Job, Worker

    n = int(seconds / interval)
    with tempfile.TemporaryFile("w+") as log:
        proc = start_worker(["-c", "8"], log)
        try:
            # Idle: registered, and then a second so its start-up is over.
            deadline = time.monotonic() + 30
            while not Worker.objects.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    fail(f"the latency worker did not start within 30s:\n{log_tail(log)}")
                time.sleep(0.05)
            time.sleep(1.0)
            t0 = time.monotonic()
            for i in range(n):
                pause = t0 + i * interval - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                noop.enqueue()
            deadline = time.monotonic() + 30
            while completed_count() < n:
                if proc.poll() is not None or time.monotonic() > deadline:
                    fail(f"the latency worker did not finish its {n} jobs within 30s:\n{log_tail(log)}")
                time.sleep(0.05)
        finally:
            stop_processes([proc])
    ms = sorted(
        (started - enqueued).total_seconds() * 1000
        for started, enqueued in Job.objects.values_list("started_at", "enqueued_at")
    )
    return {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "p99": percentile(ms, 99), "jobs": n}


# -- report ---------------------------------------------------------------------------------------


@dataclass
class Row:
    metric: str
    unit: str
    runs: list[float] = field(default_factory=list)
    digits: int = 0
    group: str = ""  # which drain a row belongs to, when there are several (the JSON line says)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def fmt(self, value: float) -> str:
        return f"{value:,.{self.digits}f}"

    def cells(self) -> list[str]:
        return [f"{self.metric} ({self.unit})", self.fmt(self.median), " / ".join(self.fmt(v) for v in self.runs)]

    def as_json(self) -> dict[str, Any]:
        figures = {"metric": self.metric, "unit": self.unit, "median": self.median, "runs": self.runs}
        return {"group": self.group, **figures} if self.group else figures


HEADER = ["scenario", "median", "runs"]


class DrainRows:
    """The rows of the drain by ``processes`` worker processes; ``server`` names the database
    server's process when its CPU time is measured too."""

    def __init__(self, n: int, processes: int, server: str | None, group: str = "") -> None:
        self.processes = processes
        self.rate = Row(f"drain {n:,} no-op, {processes} process{'es' if processes != 1 else ''} -c 8", "jobs/s")
        self.wall = Row("· drain, wall clock incl. start-up", "jobs/s")
        self.cpu = Row("· worker CPU per job, start-up incl.", "µs")
        self.server_cpu = Row(f"· {server} CPU per job, start-up incl.", "µs") if server else None
        worker = "the worker" if processes == 1 else "the largest worker process"
        self.rss = Row(f"· peak RSS of {worker}", "MiB", digits=1)
        for row in self.rows:
            row.group = group

    @property
    def rows(self) -> list[Row]:
        return [r for r in (self.rate, self.wall, self.cpu, self.server_cpu, self.rss) if r is not None]

    def add(self, figures: dict[str, Any]) -> str:
        """One run's figures added; a line for the progress report."""
        self.rate.runs.append(figures["rate"])
        self.wall.runs.append(figures["wall_rate"])
        self.cpu.runs.append(figures["cpu_us_per_job"])
        self.rss.runs.append(figures["peak_kib"] / 1024)
        server = ""
        if self.server_cpu is not None:
            if figures["server_cpu_us_per_job"] is None:
                fail("the database server's process went away during the drain.")
            self.server_cpu.runs.append(figures["server_cpu_us_per_job"])
            server = f", server {figures['server_cpu_us_per_job']:,.0f} µs CPU/job"
        return (
            f"drain -p {self.processes} {figures['rate']:,.0f}/s, {figures['cpu_us_per_job']:,.0f} µs CPU/job"
            f"{server}, peak RSS {figures['peak_kib'] / 1024:.1f} MiB; jobs by worker process "
            + "/".join(f"{n:,}" for n in figures["jobs_by_worker"])
        )


def markdown_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "| " + " | ".join("---" for _ in HEADER) + " |"]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def file_system(path: str) -> str:
    """The type of the file system ``path`` is on (the longest mount point above it)."""
    best, kind = "", "unknown file system"
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                mount, fstype = line.split()[1:3]
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                    best, kind = mount, fstype
    except OSError:
        pass
    return kind


def machine_note(vendor: Vendor, facts: dict[str, Any], loads: tuple[float, float]) -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}, {vendor.describe(facts)}. Load average (1 min) at start / end: "
        f"{loads[0]:.2f} / {loads[1]:.2f}."
        + (f" {os.environ['JOBS_BENCH_NOTE']}" if os.environ.get("JOBS_BENCH_NOTE") else "")
    )


def docs_body(
    vendor: Vendor,
    table: str,
    note: str,
    sizes: Sizes,
    runs: int,
    facts: dict[str, Any],
    server: str | None,
    poll_interval: float,
) -> str:
    """The vendor's section of docs/benchmarks.md, its markers aside."""
    first, *others = vendor.drain_processes
    more = "".join(f",\n  and in a measurement of its own `{' '.join(vendor.drain_args(p))}`" for p in others)
    forked, largest = "", ""
    if max(vendor.drain_processes) > 1:
        forked = " and of the worker processes\n  it forks"
        largest = f" (with `-p {max(vendor.drain_processes)}`, the largest worker process's)"
    server_cpu = ""
    if server:
        server_cpu = f"""
  **{server} CPU per job** is the user + system CPU time of the `{server}` process (all its
  threads, from `/proc/<pid>/stat`) over the same run, divided by the jobs: every client of
  the server counts, so it means something only on an otherwise idle server."""
    return f"""## {vendor.heading(facts)}

{vendor.intro(facts)} Measured {dt.date.today().isoformat()} with `make {vendor.make_target}` (`{vendor.script}`);
each figure is the median of {runs} run{"s" if runs != 1 else ""}, the runs listed beside it.

Machine: {note}

{table}

What is measured: {vendor.setup(facts)}

- **enqueue**: `noop.enqueue()` {sizes.enqueue:,} times from one process in autocommit, one job
  (and one transaction) per call, after a warm-up of 50.
- **bulk enqueue**: `noop.enqueue_many(() for _ in range({sizes.bulk}))` inside one
  `transaction.atomic()`, timed to the end of the commit, after a warm-up of 1,000.
- **drain**: {sizes.drain:,} waiting no-op jobs inserted beforehand, then one
  `manage.py runworker {" ".join(vendor.drain_args(first))}` subprocess{more}. The rate comes from the rows:
  completed jobs / (max(`finished_at`) - min(`started_at`)), so start-up is not counted (the
  wall-clock row includes it). **Worker CPU per job** is the user + system CPU time of the
  `runworker` process{forked} (start-up included, from `RUSAGE_CHILDREN`) divided by the jobs; **peak
  RSS** is its VmHWM{largest}, sampled from `/proc` every 50 ms.{server_cpu}
- **pickup latency**: one idle `runworker -c 8`, then one job enqueued every
  {sizes.latency_interval * 1000:.0f} ms for {sizes.latency_seconds:.0f} s; `started_at - enqueued_at` of each row (both
  clocks are this machine's). {vendor.brand(facts)} has no NOTIFY, so an idle worker learns of a new job only
  when it polls, every `POLL_INTERVAL` ({poll_interval:g} s here, jittered ±25 %): a job waits
  for the next poll, up to 1.25 intervals, not the milliseconds of PostgreSQL's LISTEN/NOTIFY.
"""


def write_docs(vendor: Vendor, body: str) -> None:
    """Replace the vendor's generated section of docs/benchmarks.md, or add it after the others."""
    begin = f"<!-- generated by {vendor.script}: begin -->"
    end = f"<!-- generated by {vendor.script}: end -->"
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    if begin in text and end in text:  # rewritten where it stands
        text = splice_section(text, vendor.name, body, [vendor.name], lambda _name: (begin, end))
    else:  # a new section goes last, after the others
        text = f"{text.rstrip()}\n\n{begin}\n{body.rstrip()}\n{end}\n"
    DOCS.write_text(text)


# -- main -----------------------------------------------------------------------------------------


def main(vendor: Vendor = SQLITE, description: str | None = None) -> None:
    parser = argparse.ArgumentParser(description=(description or __doc__).splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="runs per figure (median reported); default 3")
    parser.add_argument("--quick", action="store_true", help="small counts and one run: a smoke run")
    parser.add_argument("--write", action="store_true", help="replace this benchmark's section of docs/benchmarks.md")
    opts = parser.parse_args()
    sizes = QUICK if opts.quick else Sizes()
    runs = opts.runs or (1 if opts.quick else 3)
    if runs < 1:
        fail("--runs must be at least 1.")
    os.environ["JOBS_BENCH_VENDOR"] = vendor.name

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    server = vendor.server_process()
    server_pid, server_name = server if server else (None, None)
    enqueue = Row("enqueue, 1 job per transaction", "jobs/s")
    bulk = Row(f"bulk enqueue of {sizes.bulk:,} in one transaction", "jobs/s")
    several = len(vendor.drain_processes) > 1
    drains = [
        DrainRows(sizes.drain, p, server_name, f"drain -p {p}" if several else "") for p in vendor.drain_processes
    ]
    p50 = Row(f"pickup latency p50 at {1 / sizes.latency_interval:.0f} jobs/s", "ms", digits=1)
    p95 = Row("pickup latency p95", "ms", digits=1)
    p99 = Row("pickup latency p99", "ms", digits=1)
    rows = [enqueue, bulk, *(row for drain in drains for row in drain.rows), p50, p95, p99]

    loads_start = os.getloadavg()
    facts: dict[str, Any] = {}
    poll_interval = 1.0
    for run in range(1, runs + 1):
        say(f"run {run}/{runs}")
        e = in_fresh_database(vendor, measure_enqueue, sizes.enqueue, timeout=max(120.0, sizes.enqueue / 20))
        enqueue.runs.append(e["rate"])
        say(f"  enqueue {e['rate']:,.0f}/s")
        b = in_fresh_database(vendor, measure_bulk, sizes.bulk, timeout=max(120.0, sizes.bulk / 200))
        bulk.runs.append(b["rate"])
        say(f"  bulk enqueue {b['rate']:,.0f}/s")
        for drain in drains:
            args = vendor.drain_args(drain.processes)
            d = in_fresh_database(
                vendor, measure_drain, sizes.drain, args, server_pid, timeout=max(180.0, sizes.drain / 40)
            )
            say(f"  {drain.add(d)}")
        lat = in_fresh_database(
            vendor, measure_latency, sizes.latency_seconds, sizes.latency_interval, timeout=sizes.latency_seconds + 120
        )
        p50.runs.append(lat["p50"])
        p95.runs.append(lat["p95"])
        p99.runs.append(lat["p99"])
        say(f"  pickup p50/p95/p99 {lat['p50']:.1f}/{lat['p95']:.1f}/{lat['p99']:.1f} ms")
        facts, poll_interval = lat["facts"], lat["poll_interval"]
    loads_end = os.getloadavg()

    note = machine_note(vendor, facts, (loads_start[0], loads_end[0]))
    print()
    print(text_table(rows, HEADER))
    print()
    print(note)
    print()
    print(
        json.dumps(
            {
                "benchmark": vendor.name,
                "date": dt.date.today().isoformat(),
                "runs": runs,
                "sizes": asdict(sizes),
                **facts,
                **({"server_process": server_name} if server_name else {}),
                "poll_interval": poll_interval,
                "load_1min_start_end": [loads_start[0], loads_end[0]],
                "rows": [r.as_json() for r in rows],
            },
            ensure_ascii=False,
        )
    )
    if opts.write:
        body = docs_body(vendor, markdown_table(rows), note, sizes, runs, facts, server_name, poll_interval)
        write_docs(vendor, body)
        print(f"Wrote {DOCS.relative_to(ROOT)}.")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""The operations console under a large history, and the pruner under a steady load, against a
real PostgreSQL.

1. **admin** (the default): a database seeded with SQL (``INSERT ... SELECT FROM
   generate_series``) with 1,000,000 finished jobs (94% completed, 5% failed, 1% cancelled,
   finished over the last 24 hours, 5 queues, 9 task paths), 10,000 waiting, 2,000 delayed and 40
   active jobs, the Metric rows those finished jobs make (per queue and minute), 10,000 events
   per queue, 4 workers and 3 QueueState rows; then ``VACUUM ANALYZE``. Django's test client,
   logged in as a superuser (``force_login``), in this process, loads each admin page once to
   warm up and then ``--runs`` times (default 5): median and p95 (nearest rank) of the wall time
   of ``client.get()`` (the view, its queries and the template rendering). One more load under
   ``CaptureQueriesContext`` counts the SQL queries and names the slowest. The queues overview
   and the first page of the jobs list must each answer in under 300 ms (median); the other
   pages are informative. ``--explain`` prints EXPLAIN ANALYZE of each page's slowest query (it is
   printed anyway for a page over 300 ms). ``--reuse`` keeps a database seeded before with the
   same sizes (quick re-runs while the pages change).

2. **pruner** (``--pruner [--minutes 10] [--rate 200]``): a fresh database; 2 ``runworker -c 4``
   processes with ``RETENTION = {"completed": 30, "failed": 30}`` seconds and
   ``PRUNE_INTERVAL = 2``; one process enqueues ``benchmarks.tasks.noop`` at a steady rate for
   ``--minutes`` (``--batch`` jobs, default 10, per ``enqueue_many`` and transaction, on a fixed
   schedule: 200 jobs/s is one batch every 50 ms; one job per transaction does not keep up with
   200/s on a loaded 2-core machine). Every 5 s the job table's rows
   are counted (the most seen is reported); every minute: rows (exact count), unfinished rows,
   the age of the oldest finished row, ``pg_total_relation_size`` and ``pg_relation_size`` of
   ``django_jobs_job``, ``n_live_tup``, ``n_dead_tup`` and the autovacuum count from
   ``pg_stat_user_tables``, the event table's rows and size, jobs enqueued and completed so far
   (completed: the sum of ``Metric.completed``, written in the statement that completes the
   jobs). Then the enqueuer stops, the workers finish the backlog, and the accounting must
   balance: enqueued = completed + failed (Metric) with nothing unfinished, so no job was deleted
   before it finished or ran twice; finally the table must empty once the retention has passed.
   The verdict: the rows stay near ``rate x (retention + prune interval)`` and their growth over
   the second half of the run is a small fraction of the enqueue rate (it would be 1.0 without
   pruning).

Each part uses its own database, ``JOBS_BENCH_DB`` (default ``jobs_bench_console`` and
``jobs_bench_pruner``; dropped and re-created), on the server named by ``PGHOST``/``PGPORT``/
``PGUSER``/``PGPASSWORD``. Prints tables; writes its section of ``docs/benchmarks-console.md`` on
a full run (default sizes; ``--pruner`` with at least 10 minutes) or with ``--write``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.console_settings")

from benchmarks import throughput as tp  # noqa: E402 - after the environment it reads

DOCS = ROOT / "docs" / "benchmarks-console.md"
SETTINGS = "benchmarks.console_settings"
TARGET_MS = 300.0

#: Queues and the task paths of their jobs (the seed picks one of the 9 pairs per job).
TASKS = (
    ("default", "shop.tasks.send_welcome_email"),
    ("default", "shop.tasks.refresh_cache"),
    ("emails", "shop.emails.send_receipt"),
    ("emails", "shop.emails.send_digest"),
    ("reports", "shop.reports.generate_invoice"),
    ("reports", "shop.reports.export_csv"),
    ("webhooks", "shop.hooks.deliver_webhook"),
    ("billing", "shop.billing.charge_card"),
    ("billing", "shop.billing.sync_stripe"),
)
QUEUES = sorted({q for q, _ in TASKS})


def fail(message: str) -> None:
    print(f"benchmarks/console.py: {message}", file=sys.stderr)
    sys.exit(2)


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- database set-up ----------------------------------------------------------------------------


def setup_django(db_name: str) -> None:
    """Django on ``db_name`` (benchmarks/console_settings.py), migrated."""
    import django
    from django.core.management import call_command

    os.environ["JOBS_BENCH_DB"] = db_name
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    django.setup()
    call_command("migrate", verbosity=0)


def execute(sql: str, params: list | None = None) -> int:
    """Run ``sql``; with ``params``, a literal ``%`` is written ``%%``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def scalar(sql: str, params: list | None = None) -> Any:
    return tp.scalar(sql, params)[0]


# -- part 1: seeding ----------------------------------------------------------------------------


@dataclass
class Seed:
    finished: int = 1_000_000
    waiting: int = 10_000
    delayed: int = 2_000
    active: int = 40
    events_per_queue: int = 10_000
    workers: int = 4


# A UUIDv7 for a moment, as django_jobs.uuid7 makes them: 48 bits of Unix milliseconds, the
# version, random bits. The jobs list pages by the primary key, so ids must follow time.
UUID7_FUNCTION = """
CREATE OR REPLACE FUNCTION pg_temp.bench_uuid7(ts timestamptz) RETURNS uuid AS $$
  SELECT (lpad(to_hex(floor(extract(epoch FROM ts) * 1000)::bigint), 12, '0')
          || '7' || substr(md5(random()::text), 1, 3)
          || substr('89ab', 1 + floor(random() * 4)::int, 1)
          || substr(md5(random()::text), 1, 15))::uuid
$$ LANGUAGE sql VOLATILE
"""

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/django_jobs/worker/executor.py", line 212, in run\n    result = func(*args, **kwargs)\n'
    '  File "/app/shop/tasks.py", line 88, in charge_card\n    response = client.post(url, json=payload)\n'
    '  File "/app/venv/lib/python3.13/site-packages/httpx/_client.py", line 1144, in post\n'
    "    return self.request(...)\n"
    "httpx.ConnectTimeout: timed out"
)


def seed(sizes: Seed) -> dict[str, Any]:
    """Fill the job tables (see the module docstring); return what the pages are loaded with."""
    from django.contrib.auth import get_user_model

    queues = "(ARRAY[" + ", ".join(f"'{q}'" for q, _ in TASKS) + "])"
    paths = "(ARRAY[" + ", ".join(f"'{p}'" for _, p in TASKS) + "])"
    execute(UUID7_FUNCTION)
    started = time.monotonic()
    # Finished jobs in time order (as they were inserted in production): job i was enqueued
    # i/N of the way through the last 24 hours; it ran for 10 ms to about 2 s.
    execute(
        f"""
        INSERT INTO django_jobs_job (
            id, backend, queue, task_path, args, kwargs, state, priority, available_at, seq, options,
            attempts, max_attempts, stalled_count, return_value, errors, worker_ids, worker_id,
            enqueued_at, started_at, last_attempted_at, finished_at, purge_at, trace_id,
            pending_children, blocked)
        SELECT id, 'default', {queues}[k + 1], {paths}[k + 1], jsonb_build_array(i, 'customer-' || (i %% 5000)),
            '{{}}'::jsonb, state, CASE WHEN i %% 50 = 0 THEN 10 ELSE 0 END, enq,
            (extract(epoch FROM enq) * 1000000)::bigint, '{{}}'::jsonb,
            CASE WHEN state = 'failed' THEN 3 WHEN state = 'cancelled' THEN 0 WHEN r2 < 0.03 THEN 2 ELSE 1 END,
            CASE WHEN state = 'failed' OR r2 < 0.03 THEN 3 ELSE 1 END, 0,
            CASE WHEN state = 'completed' THEN jsonb_build_object('ok', true, 'n', i %% 97) END,
            CASE WHEN state = 'failed' THEN (
                SELECT jsonb_agg(jsonb_build_object(
                    'exception_class_path', 'httpx.ConnectTimeout', 'traceback', %s::text,
                    'attempt', a, 'at', fin))
                FROM generate_series(1, 3) a)
            ELSE '[]'::jsonb END,
            CASE WHEN state = 'cancelled' THEN '[]'::jsonb
                 ELSE jsonb_build_array('web-' || (i %% 4) || '-' || (4000 + i %% 4) || '-1f2e3d') END,
            NULL, enq, CASE WHEN state <> 'cancelled' THEN st END, CASE WHEN state <> 'cancelled' THEN st END,
            fin, fin + interval '7 days', replace(id::text, '-', ''), 0, false
        FROM (
            SELECT i, k, r2, enq, st, st + (0.01 + 2 * r3 * r3) * interval '1 second' AS fin,
                pg_temp.bench_uuid7(enq) AS id,
                CASE WHEN r1 < 0.94 THEN 'completed' WHEN r1 < 0.99 THEN 'failed' ELSE 'cancelled' END AS state
            FROM (
                SELECT i, floor(random() * {len(TASKS)})::int AS k, random() AS r1, random() AS r2,
                    random() AS r3, enq, enq + random() * interval '1 second' AS st
                FROM (
                    SELECT i, now() - interval '24 hours' + (i::float8 / %s) * interval '24 hours'
                        - interval '10 seconds' AS enq
                    FROM generate_series(1, %s) i
                ) g
            ) r
        ) s
        """,
        [TRACEBACK, sizes.finished, sizes.finished],
    )
    note(f"  {sizes.finished:,} finished jobs inserted in {time.monotonic() - started:.0f}s")
    # The backlog: waiting jobs enqueued over the last 10 minutes, delayed ones due in the next
    # hour, and a few running ones.
    execute(
        f"""
        INSERT INTO django_jobs_job (
            id, backend, queue, task_path, args, kwargs, state, priority, available_at, seq, options,
            attempts, max_attempts, stalled_count, errors, worker_ids, enqueued_at, trace_id,
            pending_children, blocked)
        SELECT id, 'default', {queues}[k + 1], {paths}[k + 1], jsonb_build_array(i), '{{}}'::jsonb, state, 0,
            avail, (extract(epoch FROM avail) * 1000000)::bigint, '{{}}'::jsonb, 0, 1, 0, '[]'::jsonb,
            '[]'::jsonb, enq, replace(id::text, '-', ''), 0, false
        FROM (
            SELECT i, k, enq, state, pg_temp.bench_uuid7(enq) AS id,
                CASE WHEN state = 'delayed' THEN now() + random() * interval '1 hour' ELSE enq END AS avail
            FROM (
                SELECT i, floor(random() * {len(TASKS)})::int AS k,
                    now() - interval '10 minutes' + (i::float8 / %s) * interval '10 minutes' AS enq,
                    CASE WHEN i %% (%s / %s) = 0 THEN 'delayed' ELSE 'waiting' END AS state
                FROM generate_series(1, %s) i
            ) g
        ) s
        """,
        [
            sizes.waiting + sizes.delayed,
            sizes.waiting + sizes.delayed,
            sizes.delayed,
            sizes.waiting + sizes.delayed,
        ],
    )
    execute(
        f"""
        INSERT INTO django_jobs_job (
            id, backend, queue, task_path, args, kwargs, state, priority, available_at, seq, options,
            attempts, max_attempts, stalled_count, errors, worker_ids, worker_id, lease_token, lease_expires_at,
            enqueued_at, started_at, last_attempted_at, trace_id, pending_children, blocked)
        SELECT id, 'default', {queues}[k + 1], {paths}[k + 1], jsonb_build_array(i), '{{}}'::jsonb, 'active', 0,
            enq, (extract(epoch FROM enq) * 1000000)::bigint, '{{}}'::jsonb, 1, 1, 0, '[]'::jsonb,
            jsonb_build_array('web-' || (i %% %s) || '-' || (4000 + i %% %s) || '-1f2e3d'),
            'web-' || (i %% %s) || '-' || (4000 + i %% %s) || '-1f2e3d', gen_random_uuid(),
            now() + interval '25 seconds', enq, now() - interval '3 seconds', now() - interval '3 seconds',
            replace(id::text, '-', ''), 0, false
        FROM (
            SELECT i, floor(random() * {len(TASKS)})::int AS k, now() - interval '1 minute' AS enq,
                pg_temp.bench_uuid7(now() - interval '1 minute') AS id
            FROM generate_series(1, %s) i
        ) g
        """,
        [sizes.workers] * 4 + [sizes.active],
    )
    # The Metric rows those finished jobs would have written: one per queue and minute.
    execute(
        """
        INSERT INTO django_jobs_metric (queue, minute, completed, failed, retried, runtime_ms)
        SELECT queue, date_trunc('minute', finished_at, 'UTC'), count(*) FILTER (WHERE state = 'completed'),
            count(*) FILTER (WHERE state = 'failed'), count(*) FILTER (WHERE attempts = 2),
            COALESCE(round(sum(extract(epoch FROM finished_at - last_attempted_at) * 1000)
                FILTER (WHERE state IN ('completed', 'failed'))), 0)::bigint
        FROM django_jobs_job WHERE state IN ('completed', 'failed', 'cancelled')
        GROUP BY 1, 2
        """
    )
    # Events: the newest of each queue (what EVENTS_MAX_PER_QUEUE keeps), over the last hour.
    kinds = "(ARRAY['enqueued', 'active', 'completed', 'enqueued', 'active', 'failed', 'retried', 'completed'])"
    execute(
        f"""
        INSERT INTO django_jobs_event (txid, queue, job_id, kind, data, created_at)
        SELECT 1000000 + n, q, CASE WHEN n %% 500 = 0 THEN NULL ELSE gen_random_uuid() END, {kinds}[1 + n %% 8],
            jsonb_build_object('attempt', 1, 'worker', 'web-1-4001-1f2e3d'),
            now() - interval '1 hour' + (n::float8 / %s) * interval '1 hour'
        FROM unnest(%s::text[]) q, generate_series(1, %s) n
        ORDER BY n, q
        """,
        [sizes.events_per_queue, QUEUES, sizes.events_per_queue],
    )
    execute(
        """
        INSERT INTO django_jobs_worker (id, backend, hostname, pid, queues, concurrency, started_at, heartbeat_at)
        SELECT 'web-' || w || '-' || (4000 + w) || '-1f2e3d', 'default', 'web-' || w, 4000 + w, '["*"]', 8,
            now() - interval '2 hours', now() - interval '2 seconds'
        FROM generate_series(0, %s - 1) w
        """,
        [sizes.workers],
    )
    execute(
        """
        INSERT INTO django_jobs_queuestate (name, paused, concurrency_limit, rate_limit, rate_window_seconds,
            max_size, declared, updated_at) VALUES
            ('reports', true, NULL, NULL, NULL, NULL, '{}', now()),
            ('billing', false, 4, 10, 1.0, NULL, '{}', now()),
            ('emails', false, NULL, NULL, NULL, 100000, '{}', now())
        """
    )
    detail = seed_detail_job()
    User = get_user_model()
    User.objects.filter(username="bench").delete()
    User.objects.create_superuser("bench", "bench@example.com", None)
    execute("CREATE TABLE IF NOT EXISTS bench_console_seed (sizes text, detail_job uuid, seeded_at timestamptz)")
    execute("INSERT INTO bench_console_seed VALUES (%s, %s, now())", [repr(sizes), detail])
    note(f"  seeded in {time.monotonic() - started:.0f}s; VACUUM ANALYZE ...")
    execute("VACUUM ANALYZE")
    note(f"  done in {time.monotonic() - started:.0f}s")
    return {"detail_job": detail}


def seed_detail_job() -> str:
    """The job whose page is loaded: the newest failed job, given 200 log lines, 12 events and 5
    other jobs of its trace."""
    job_id, trace, queue = tp.scalar(
        "SELECT id, trace_id, queue FROM django_jobs_job WHERE state = 'failed' ORDER BY id DESC LIMIT 1"
    )
    execute(
        """
        INSERT INTO django_jobs_joblog (job_id, idx, line, created_at)
        SELECT %s, n, 'step ' || n || ': charged customer ' || (n * 37 %% 1000) || ', waiting for the gateway',
            now() - interval '1 minute' + n * interval '100 milliseconds'
        FROM generate_series(0, 199) n
        """,
        [job_id],
    )
    kinds = ["enqueued", "active", "failed", "retried", "active", "failed", "retried", "active", "failed"]
    for n, kind in enumerate(kinds + ["progress", "progress", "progress"]):
        execute(
            "INSERT INTO django_jobs_event (txid, queue, job_id, kind, data, created_at) "
            "VALUES (%s, %s, %s, %s, %s, now() - interval '1 minute' + %s * interval '1 second')",
            [2_000_000 + n, queue, job_id, kind, '{"attempt": 1, "error": "httpx.ConnectTimeout"}', n],
        )
    execute(
        """
        INSERT INTO django_jobs_job (
            id, backend, queue, task_path, args, kwargs, state, priority, available_at, seq, options,
            attempts, max_attempts, stalled_count, errors, worker_ids, enqueued_at, started_at, finished_at,
            purge_at, trace_id, pending_children, blocked)
        SELECT pg_temp.bench_uuid7(now() - n * interval '1 second'), 'default', 'emails',
            'shop.emails.send_receipt', '[]', '{}', 'completed', 0, now(), 0, '{}', 1, 1, 0, '[]', '[]', now(),
            now(), now(), now() + interval '7 days', %s, 0, false
        FROM generate_series(1, 5) n
        """,
        [trace],
    )
    return str(job_id)


def seeded(sizes: Seed) -> str | None:
    """The detail job of an earlier seed with these sizes, or None."""
    if not scalar("SELECT to_regclass('bench_console_seed') IS NOT NULL"):
        return None
    row = tp.scalar("SELECT sizes, detail_job FROM bench_console_seed ORDER BY seeded_at DESC LIMIT 1")
    return str(row[1]) if row and row[0] == repr(sizes) else None


# -- part 1: timing -----------------------------------------------------------------------------


@dataclass
class PageResult:
    name: str
    url: str
    target: bool
    times_ms: list[float]
    status: int
    queries: int = 0
    query_ms: float = 0.0
    slowest_ms: float = 0.0
    slowest_sql: str = ""
    explain: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p95(self) -> float:
        return tp.percentile(sorted(self.times_ms), 95)

    @property
    def met(self) -> str:
        if not self.target:
            return "—"
        return "yes" if self.median < TARGET_MS else "NO"


def pages(detail_job: str) -> list[tuple[str, str, bool]]:
    """(name, URL, whether the 300 ms target applies)."""
    jobs = "/admin/django_jobs/job/"
    return [
        ("queues overview", "/admin/django_jobs/queuestate/", True),
        ("jobs list, first page", jobs, True),
        ("jobs list, state=failed", jobs + "?state=failed", False),
        ("jobs list, state=cancelled (1%)", jobs + "?state=cancelled", False),
        ("jobs list, queue=emails", jobs + "?queue=emails", False),
        ("jobs list, queue=reports & state=failed", jobs + "?queue=reports&state=failed", False),
        ("jobs list, search task path", jobs + "?q=generate_invoice", False),
        ("jobs list, search with no match", jobs + "?q=no_such_task", False),
        ("jobs list, page 50", jobs + "?p=50", False),
        ("job page (failed, 200 log lines)", f"{jobs}{detail_job}/change/", False),
        ("queue page (emails)", "/admin/django_jobs/queuestate/emails/dashboard/", False),
    ]


def measure_page(client: Any, name: str, url: str, target: bool, runs: int) -> PageResult:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)  # warm-up: imports, template compilation, caches
    if response.status_code != 200:
        return PageResult(name, url, target, [float("nan")], response.status_code)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        if response.status_code != 200:
            fail(f"{url} answered {response.status_code}")
    timings: list[float] = []

    def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            timings.append((time.perf_counter() - t0) * 1000)

    # The debug cursor gives each query's SQL with its parameters (Django's own "time" is rounded
    # to the millisecond); the wrapper times it to the microsecond.
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(timed):
        client.get(url)
    sqls = [q["sql"] for q in captured.captured_queries]
    if len(sqls) != len(timings):
        timings = [float(q["time"]) * 1000 for q in captured.captured_queries]
    queries = list(zip(timings, sqls, strict=True))
    slowest = max(queries, default=(0.0, ""))
    return PageResult(
        name,
        url,
        target,
        times,
        200,
        queries=len(queries),
        query_ms=sum(ms for ms, _ in queries),
        slowest_ms=slowest[0],
        slowest_sql=slowest[1],
    )


def explain(sql: str) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


def run_admin(opts: argparse.Namespace) -> None:
    sizes = Seed(finished=opts.finished, waiting=opts.waiting)
    db = os.environ.get("JOBS_BENCH_DB", "jobs_bench_console")
    pg_version, kept = tp.create_database(db, reuse=opts.reuse)
    setup_django(db)
    detail = seeded(sizes) if kept else None
    if detail is None:
        if kept:
            note(f"{db} holds no seed of these sizes: re-creating it")
            tp.create_database(db)
            from django.db import connection

            connection.close()
            from django.core.management import call_command

            call_command("migrate", verbosity=0)
        note(f"seeding {db}: {sizes}")
        detail = seed(sizes)["detail_job"]
    else:
        note(f"reusing the seed in {db}")
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    counts = dict(fetch_all("SELECT state, count(*) FROM django_jobs_job GROUP BY state"))
    note("jobs by state: " + ", ".join(f"{s} {n:,}" for s, n in sorted(counts.items())))
    load_before = os.getloadavg()
    results = []
    for name, url, target in pages(detail):
        r = measure_page(client, name, url, target, opts.runs)
        if r.status != 200:
            note(f"  {name}: {url} answered {r.status}; skipped")
            continue
        if opts.explain or (r.target and r.median >= TARGET_MS) or r.slowest_ms >= TARGET_MS:
            r.explain = explain(r.slowest_sql)
        results.append(r)
        note(
            f"  {name}: median {r.median:.1f} ms, p95 {r.p95:.1f} ms; {r.queries} queries "
            f"({r.query_ms:.1f} ms), slowest {r.slowest_ms:.1f} ms"
        )
    load_after = os.getloadavg()
    machine = tp.machine_note(pg_version, load_before, load_after)
    table = admin_table(results)
    print()
    print(text_table(*table))
    print()
    for r in results:
        print(f"{r.name}: slowest of {r.queries} queries, {r.slowest_ms:.1f} ms:\n  {shorten(r.slowest_sql, 700)}")
        if r.explain:
            print("  EXPLAIN ANALYZE:\n" + "\n".join("    " + line for line in r.explain.splitlines()))
    print()
    print(machine)
    if opts.write or sizes == Seed():
        write_section("admin", admin_section(results, sizes, counts, opts.runs, machine))
        print(f"Wrote {DOCS.relative_to(ROOT)}.")


def fetch_all(sql: str, params: list | None = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall()


def admin_table(results: list[PageResult]) -> tuple[list[str], list[list[str]]]:
    header = ["page", "median", "p95", "runs (ms)", "queries", "slowest query", "target", "met?"]
    rows = [
        [
            r.name,
            f"{r.median:,.1f} ms",
            f"{r.p95:,.1f} ms",
            " / ".join(f"{t:.0f}" for t in r.times_ms),
            str(r.queries),
            f"{r.slowest_ms:.1f} ms",
            f"< {TARGET_MS:.0f} ms" if r.target else "—",
            r.met,
        ]
        for r in results
    ]
    return header, rows


def text_table(header: list[str], rows: list[list[str]]) -> str:
    cells = [header, *rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = []
    for i, c in enumerate(cells):
        lines.append("  ".join(v.ljust(widths[j]) for j, v in enumerate(c)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def admin_section(results: list[PageResult], sizes: Seed, counts: dict[str, int], runs: int, machine: str) -> str:
    slow = "\n".join(
        f"- **{r.name}** (`{r.url}`): {r.queries} queries, {r.query_ms:.1f} ms in all; slowest "
        f"{r.slowest_ms:.1f} ms: `{shorten(r.slowest_sql, 300)}`"
        for r in results
    )
    explained = "\n\n".join(
        f"EXPLAIN ANALYZE of the slowest query of **{r.name}**:\n\n```\n{r.explain}\n```" for r in results if r.explain
    )
    state_counts = f"{sum(counts.values()):,} jobs (" + ", ".join(f"{s} {n:,}" for s, n in sorted(counts.items())) + ")"
    return f"""## Admin pages with a million finished jobs

Measured {dt.date.today().isoformat()} with `benchmarks/console.py`: median and p95 (nearest rank: of
{runs} loads, the {"slowest" if runs < 20 else "95th percentile"}) of {runs} loads after one warm-up, Django's test client in the same process (no HTTP server), logged in as a
superuser; the database connection stays open between loads (as with `CONN_MAX_AGE` or a pool).
Machine: {machine}

{markdown_table(*admin_table(results))}

The database: {state_counts}, the finished ones over the last 24 hours in time order (ids
UUIDv7), 5 queues, 9 task paths, 3 tracebacks per failed job; the Metric rows of those finished jobs
(one per queue and minute), {sizes.events_per_queue:,} events per queue, {sizes.workers} workers,
3 QueueState rows; `VACUUM ANALYZE` after seeding. Times are `client.get()` wall time: the view,
its queries and the template rendering. Queries are counted on one more load
(`CaptureQueriesContext`):

{slow}
{("" if not explained else chr(10) + explained + chr(10))}"""


def compact(sql: str) -> str:
    """``sql`` on one line, a long column list of its first SELECT shown as ``<n columns>``."""
    sql = " ".join(sql.split())
    head, sep, rest = sql.partition(" FROM ")
    if sep and head.startswith("SELECT ") and len(head) > 160 and "(" not in head:
        return f"SELECT <{head.count(',') + 1} columns> FROM {rest}"
    return sql


def shorten(sql: str, n: int) -> str:
    sql = compact(sql)
    return sql if len(sql) <= n else sql[: n - 3] + "..."


# -- part 2: the pruner under load --------------------------------------------------------------


def enqueue_steadily(rate: float, batch: int, seconds: float, counter: Any, lag: Any, stop: Any) -> None:
    """In its own process: ``batch`` no-op jobs in one ``enqueue_many`` (one transaction) on a
    fixed schedule, batch ``i`` at ``start + i * batch / rate``, for ``seconds``; ``counter``
    holds the jobs enqueued so far and ``lag`` the most seconds the schedule ran behind."""
    import django

    django.setup()
    from benchmarks.tasks import noop

    noop.enqueue()  # connect and warm up before the clock starts
    counter.value = n = 1
    start = time.monotonic()
    i = 0
    while not stop.is_set() and i * batch / rate < seconds and time.monotonic() - start < seconds:
        pause = start + i * batch / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            lag.value = max(lag.value, -pause)
        noop.enqueue_many(() for _ in range(batch))
        i += 1
        n += batch
        counter.value = n


@dataclass
class Sample:
    at: float
    enqueued: int
    completed: int
    failed: int
    rows: int
    unfinished: int
    oldest_finished_s: float | None
    total_bytes: int
    heap_bytes: int
    live: int
    dead: int
    autovacuums: int
    event_rows: int
    event_bytes: int


SAMPLE_SQL = """
SELECT
    (SELECT count(*) FROM django_jobs_job),
    (SELECT count(*) FROM django_jobs_job WHERE state IN ('waiting', 'delayed', 'active', 'waiting-children')),
    (SELECT EXTRACT(EPOCH FROM now() - min(finished_at)) FROM django_jobs_job
        WHERE state IN ('completed', 'failed', 'cancelled')),
    pg_total_relation_size('django_jobs_job'), pg_relation_size('django_jobs_job'),
    s.n_live_tup, s.n_dead_tup, s.autovacuum_count + s.vacuum_count,
    (SELECT count(*) FROM django_jobs_event), pg_total_relation_size('django_jobs_event'),
    (SELECT COALESCE(sum(completed), 0) FROM django_jobs_metric),
    (SELECT COALESCE(sum(failed), 0) FROM django_jobs_metric)
FROM pg_stat_user_tables s WHERE s.relname = 'django_jobs_job'
"""


def take_sample(conn: Any, started: float, enqueued: int) -> Sample:
    # pg_stat_user_tables lags the backends by up to a second: ask for a fresh snapshot.
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(SAMPLE_SQL).fetchone()
    rows, unfinished, oldest, total, heap, live, dead, vacuums, ev_rows, ev_bytes, completed, failed = row
    return Sample(
        at=time.monotonic() - started,
        enqueued=enqueued,
        completed=int(completed),
        failed=int(failed),
        rows=rows,
        unfinished=unfinished,
        oldest_finished_s=float(oldest) if oldest is not None else None,
        total_bytes=total,
        heap_bytes=heap,
        live=live,
        dead=dead,
        autovacuums=vacuums,
        event_rows=ev_rows,
        event_bytes=ev_bytes,
    )


class Vacuumer(threading.Thread):
    """In place of autovacuum when the server runs without it: ``VACUUM`` (not FULL) of the job
    and event tables every ``every`` seconds, the first after ``first`` seconds, on its own
    connection. Keeps each run's duration."""

    def __init__(self, db: str, every: float, first: float):
        super().__init__(daemon=True)
        self.db, self.every, self.first = db, every, first
        self.durations: list[float] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        try:
            with tp.connect_raw(self.db, autocommit=True) as conn:
                wait = self.first
                while not self._stop.wait(wait):
                    t0 = time.monotonic()
                    conn.execute("VACUUM django_jobs_job, django_jobs_event")
                    self.durations.append(time.monotonic() - t0)
                    wait = max(0.0, self.every - (time.monotonic() - t0))
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.error = exc

    def finish(self) -> None:
        self._stop.set()
        self.join()
        if self.error is not None:
            fail(f"the vacuum thread failed: {self.error!r}")


class Workers:
    """``count`` ``runworker`` processes on the benchmark database with ``env`` added."""

    def __init__(self, count: int, args: list[str], env: dict[str, str]):
        self.logs = [tempfile.TemporaryFile("w+") for _ in range(count)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "django", "runworker", f"--settings={SETTINGS}", "-v", "0", *args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for log in self.logs
        ]

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                tail = tp.log_tail(log)
                self.stop()
                fail(f"a runworker process exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        tp.stop_processes(self.procs)
        for log in self.logs:
            if not log.closed:
                log.close()


@dataclass
class PrunerResult:
    samples: list[Sample]
    most_rows: int
    fine_samples: int
    enqueued: int
    max_lag: float
    drained: Sample
    emptied_after: float | None
    final_rows: int
    settings: dict[str, Any] = field(default_factory=dict)


def run_pruner(opts: argparse.Namespace) -> None:
    db = os.environ.get("JOBS_BENCH_DB", "jobs_bench_pruner")
    pg_version, _ = tp.create_database(db)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "JOBS_BENCH_DB": db,
        "JOBS_BENCH_RETENTION": str(opts.retention),
        "JOBS_BENCH_PRUNE_INTERVAL": str(opts.prune_interval),
    }
    os.environ.update(env)  # this process and the enqueuer it spawns: the same settings
    setup_django(db)
    from django.conf import settings

    from django_jobs.conf import get_settings

    jobs_settings = get_settings()
    autovacuum = dict(
        fetch_all(
            "SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name IN ('autovacuum', "
            "'autovacuum_naptime', "
            "'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_threshold', 'autovacuum_vacuum_cost_limit', "
            "'autovacuum_vacuum_cost_delay')"
        )
    )
    if opts.vacuum_every is None:
        # Autovacuum's default cadence (autovacuum_naptime) when the server has it off.
        opts.vacuum_every = 0.0 if autovacuum["autovacuum"] == "on" else 60.0
    load_before = os.getloadavg()
    seconds = opts.minutes * 60
    note(
        f"pruner: {opts.minutes:g} min at {opts.rate:g} jobs/s ({opts.batch} per enqueue_many) into {db}; "
        f"RETENTION {settings.DJANGO_JOBS['RETENTION']}, PRUNE_INTERVAL {jobs_settings.PRUNE_INTERVAL:g}, "
        f"2 x runworker -c {opts.concurrency}; VACUUM every {opts.vacuum_every:g} s (0: none)"
    )
    workers = Workers(2, ["-c", str(opts.concurrency)], env)
    ctx = multiprocessing.get_context("spawn")
    counter, lag, stop = ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Event()
    enqueuer = None
    vacuumer = Vacuumer(db, opts.vacuum_every, first=opts.vacuum_every / 2) if opts.vacuum_every else None
    try:
        with tp.connect_raw(db, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while conn.execute("SELECT count(*) FROM django_jobs_worker").fetchone()[0] < 2:
                workers.check_alive()
                if time.monotonic() > deadline:
                    fail("the workers did not register within 60s")
                time.sleep(0.1)
            enqueuer = ctx.Process(target=enqueue_steadily, args=(opts.rate, opts.batch, seconds, counter, lag, stop))
            enqueuer.start()
            while counter.value == 0:
                if not enqueuer.is_alive():
                    fail(f"the enqueuer exited with {enqueuer.exitcode} before enqueuing")
                time.sleep(0.05)
            started = time.monotonic()
            if vacuumer is not None:
                vacuumer.start()
            samples = [take_sample(conn, started, counter.value)]
            most_rows, fine = samples[0].rows, 0
            next_minute = 60.0
            note(format_sample_header())
            note(format_sample(samples[0]))
            while True:
                time.sleep(min(5.0, max(0.0, started + next_minute - time.monotonic())))
                workers.check_alive()
                if enqueuer.exitcode not in (None, 0):
                    fail(f"the enqueuer exited with {enqueuer.exitcode}")
                most_rows = max(most_rows, conn.execute("SELECT count(*) FROM django_jobs_job").fetchone()[0])
                fine += 1
                if time.monotonic() - started >= next_minute - 0.01:
                    samples.append(take_sample(conn, started, counter.value))
                    note(format_sample(samples[-1]))
                    next_minute += 60.0
                    if next_minute > seconds + 0.01:
                        break
            enqueuer.join(timeout=30)
            if enqueuer.is_alive() or enqueuer.exitcode != 0:
                fail(f"the enqueuer did not end cleanly (exit code {enqueuer.exitcode})")
            enqueued = counter.value
            # The backlog finishes; then nothing may be missing: enqueued = completed + failed.
            deadline = time.monotonic() + 120
            unfinished_sql = (
                "SELECT count(*) FROM django_jobs_job "
                "WHERE state IN ('waiting', 'delayed', 'active', 'waiting-children')"
            )
            while conn.execute(unfinished_sql).fetchone()[0]:
                workers.check_alive()
                if time.monotonic() > deadline:
                    fail("the workers did not finish the backlog within 120s")
                time.sleep(0.1)
            drained = take_sample(conn, started, enqueued)
            # Once the retention has passed, the pruner must have deleted every finished job.
            t0 = time.monotonic()
            limit = opts.retention + 4 * opts.prune_interval + 30
            emptied_after = None
            while time.monotonic() - t0 < limit:
                workers.check_alive()
                if conn.execute("SELECT count(*) FROM django_jobs_job").fetchone()[0] == 0:
                    emptied_after = time.monotonic() - t0
                    break
                time.sleep(0.5)
            final_rows = conn.execute("SELECT count(*) FROM django_jobs_job").fetchone()[0]
    finally:
        if vacuumer is not None and vacuumer.is_alive():
            vacuumer.finish()
        stop.set()
        if enqueuer is not None and enqueuer.is_alive():
            enqueuer.join(timeout=10)
            if enqueuer.is_alive():
                enqueuer.terminate()
        workers.stop()
    load_after = os.getloadavg()
    result = PrunerResult(
        samples=samples,
        most_rows=most_rows,
        fine_samples=fine,
        enqueued=enqueued,
        max_lag=lag.value,
        drained=drained,
        emptied_after=emptied_after,
        final_rows=final_rows,
        settings={"autovacuum": autovacuum, "vacuums": vacuumer.durations if vacuumer else []},
    )
    verdict = pruner_verdict(result, opts)
    machine = tp.machine_note(pg_version, load_before, load_after)
    print()
    print(text_table(*sample_table(samples)))
    print()
    print(text_table(*verdict_table(verdict)))
    print()
    print("verdict: " + ", ".join(f"{g} {'yes' if ok else 'NO'}" for g, ok in verdicts(verdict).items()))
    print(machine)
    print("autovacuum: " + ", ".join(f"{k} {v}" for k, v in sorted(autovacuum.items())))
    if opts.write or opts.minutes >= 10:
        write_section("pruner", pruner_section(result, verdict, opts, machine))
        print(f"Wrote {DOCS.relative_to(ROOT)}.")


def format_sample_header() -> str:
    return "  " + "  ".join(h for h in sample_table([])[0])


def format_sample(s: Sample) -> str:
    return "  " + "  ".join(sample_cells(s))


def sample_cells(s: Sample) -> list[str]:
    mib = 1024 * 1024
    return [
        f"{s.at / 60:.0f}",
        f"{s.enqueued:,}",
        f"{s.completed:,}",
        f"{s.rows:,}",
        f"{s.unfinished:,}",
        "–" if s.oldest_finished_s is None else f"{max(s.oldest_finished_s, 0.0):.0f} s",
        f"{s.total_bytes / mib:.1f}",
        f"{s.heap_bytes / mib:.1f}",
        f"{s.live:,}",
        f"{s.dead:,}",
        str(s.autovacuums),
        f"{s.event_rows:,}",
        f"{s.event_bytes / mib:.1f}",
    ]


def sample_table(samples: list[Sample]) -> tuple[list[str], list[list[str]]]:
    header = [
        "minute",
        "enqueued",
        "completed",
        "job rows",
        "unfinished",
        "oldest finished",
        "job table+indexes MiB",
        "heap MiB",
        "n_live_tup",
        "n_dead_tup",
        "vacuums",
        "event rows",
        "events MiB",
    ]
    return header, [sample_cells(s) for s in samples]


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


@dataclass
class Check:
    name: str
    value: str
    target: str
    ok: bool | None
    #: "jobs" (the job table stays bounded), "events", "accounting" or "" (informative).
    group: str = ""


def pruner_verdict(r: PrunerResult, opts: argparse.Namespace) -> list[Check]:
    from django_jobs.conf import get_settings

    half = [s for s in r.samples if s.at >= r.samples[-1].at / 2]
    first_half = r.samples[: len(r.samples) - len(half)]
    growth = slope([(s.at, s.rows) for s in half]) / opts.rate
    event_growth = slope([(s.at, s.event_rows) for s in half]) / opts.rate
    bound = opts.rate * (opts.retention + 2 * opts.prune_interval + 10)
    # Each no-op job writes 3 events (enqueued, active, completed); the pruner keeps the newest
    # EVENTS_MAX_PER_QUEUE of the queue and trims the rest on its next run.
    keep = get_settings().EVENTS_MAX_PER_QUEUE
    event_bound = keep + 3 * opts.rate * (opts.prune_interval + 1)
    mid, last, d = half[0], r.samples[-1], r.drained
    achieved = (last.enqueued - r.samples[0].enqueued) / last.at if last.at else 0.0
    vacuums = r.settings["vacuums"]
    return [
        Check(
            "enqueue rate achieved", f"{achieved:,.1f} jobs/s", f"{opts.rate:g}", abs(achieved / opts.rate - 1) < 0.02
        ),
        Check("enqueuer most behind schedule", f"{r.max_lag * 1000:,.0f} ms", "—", None),
        Check(
            f"most job rows (counted every 5 s, {r.fine_samples} counts)",
            f"{r.most_rows:,}",
            f"<= {bound:,.0f} = rate x (retention + 2 x interval + 10 s)",
            r.most_rows <= bound,
            "jobs",
        ),
        Check(
            "job rows at the end of the run",
            f"{last.rows:,}",
            f"~ {opts.rate * (opts.retention + opts.prune_interval):,.0f} = rate x (retention + interval)",
            last.rows <= bound,
            "jobs",
        ),
        Check(
            "growth of job rows over the second half / enqueue rate",
            f"{growth:+.4f}",
            "|x| < 0.02 (1.0 without pruning)",
            abs(growth) < 0.02,
            "jobs",
        ),
        Check(
            "job table + indexes: end / half-way",
            f"{last.total_bytes / mid.total_bytes:.2f} ({last.total_bytes / 2**20:.1f} / "
            f"{mid.total_bytes / 2**20:.1f} MiB)",
            "<= 1.25",
            last.total_bytes <= 1.25 * mid.total_bytes,
            "jobs",
        ),
        Check(
            "most n_dead_tup: second half / first half",
            f"{max(s.dead for s in half):,} / {max([s.dead for s in first_half] or [0]):,}",
            "—",
            None,
        ),
        Check(
            "VACUUM runs by the benchmark (in place of autovacuum)",
            f"{len(vacuums)}" + (f", longest {max(vacuums) * 1000:,.0f} ms" if vacuums else ""),
            f"every {opts.vacuum_every:g} s" if opts.vacuum_every else "none",
            None,
        ),
        Check(
            "event rows at the end of the run",
            f"{last.event_rows:,}",
            f"<= {event_bound:,.0f} = EVENTS_MAX_PER_QUEUE + 3 x rate x (interval + 1 s)",
            last.event_rows <= event_bound,
            "events",
        ),
        Check(
            "growth of event rows over the second half / enqueue rate",
            f"{event_growth:+.4f}",
            "|x| < 0.02 (3.0 without trimming)",
            abs(event_growth) < 0.02,
            "events",
        ),
        Check("jobs enqueued", f"{r.enqueued:,}", "—", None),
        Check(
            "completed + failed (Metric sums), backlog finished",
            f"{d.completed:,} + {d.failed:,}",
            f"= {r.enqueued:,}",
            d.completed + d.failed == r.enqueued,
            "accounting",
        ),
        Check("jobs failed", f"{d.failed:,}", "= 0", d.failed == 0, "accounting"),
        Check(
            "unfinished rows after the backlog finished", f"{d.unfinished:,}", "= 0", d.unfinished == 0, "accounting"
        ),
        Check("pruned by then (enqueued - rows)", f"{r.enqueued - d.rows:,}", "—", None),
        Check(
            "job rows once the retention passed",
            f"{r.final_rows:,}"
            + (f" (empty {r.emptied_after:.0f} s after the backlog)" if r.emptied_after is not None else ""),
            "= 0",
            r.final_rows == 0,
            "accounting",
        ),
    ]


def verdicts(checks: list[Check]) -> dict[str, bool]:
    return {g: all(c.ok for c in checks if c.group == g) for g in ("jobs", "events", "accounting")}


def verdict_table(checks: list[Check]) -> tuple[list[str], list[list[str]]]:
    return ["check", "value", "target", "met?"], [
        [c.name, c.value, c.target, "—" if c.ok is None else ("yes" if c.ok else "NO")] for c in checks
    ]


def pruner_section(r: PrunerResult, checks: list[Check], opts: argparse.Namespace, machine: str) -> str:
    v = verdicts(checks)
    vacuum = (
        f"The server runs with `autovacuum = off`, so the benchmark runs `VACUUM django_jobs_job, "
        f"django_jobs_event` every {opts.vacuum_every:g} s (autovacuum's default naptime) in its place."
        if opts.vacuum_every and r.settings["autovacuum"].get("autovacuum") != "on"
        else f"The benchmark runs `VACUUM` of the job and event tables every {opts.vacuum_every:g} s."
        if opts.vacuum_every
        else "No VACUUM is run by the benchmark: only autovacuum (when the server has it on)."
    )
    autovacuum = ", ".join(f"`{k}` {v}" for k, v in sorted(r.settings["autovacuum"].items()))
    return f"""## The pruner under a steady load

Measured {dt.date.today().isoformat()} with
`benchmarks/console.py --pruner --minutes {opts.minutes:g} --rate {opts.rate:g}`.
Machine: {machine}
PostgreSQL autovacuum settings: {autovacuum}.

{vacuum}

Verdict: the job table {"**stays bounded**" if v["jobs"] else "**does NOT stay bounded**"}; the event table
{"**stays bounded**" if v["events"] else "**does NOT stay bounded**"}; the accounting
{"**balances** (no job lost or run twice)" if v["accounting"] else "**does NOT balance**"}.

{markdown_table(*verdict_table(checks))}

Each minute (minute 0: when the enqueuer started):

{markdown_table(*sample_table(r.samples))}

2 `runworker -c {opts.concurrency}` processes with `DJANGO_JOBS = {{"RETENTION": {{"completed": {opts.retention:g},
"failed": {opts.retention:g}}}, "PRUNE_INTERVAL": {opts.prune_interval:g}}}` (events on, `EVENTS_MAX_PER_QUEUE`
10,000, `PRUNE_BATCH_SIZE` 1,000); one process enqueues `benchmarks.tasks.noop` {opts.rate:g} times a
second for {opts.minutes:g} minutes, on a fixed schedule: {opts.batch} jobs per `enqueue_many` (one
transaction) every {opts.batch / opts.rate * 1000:.0f} ms. **job rows** is
an exact `count(*)`; **oldest finished** is the age of the oldest completed row (retention {opts.retention:g} s
plus up to one prune interval); sizes are `pg_total_relation_size` (heap, indexes, TOAST) and
`pg_relation_size` (heap) of `django_jobs_job`; `n_live_tup`, `n_dead_tup` and the vacuum count
(autovacuum + vacuum) come from `pg_stat_user_tables`; **completed** is the sum of
`Metric.completed`, written by the statement that completes the jobs. After the run the enqueuer
stops, the workers finish the backlog, and the accounting is checked: every enqueued job is
counted once as completed or failed and none is unfinished, so none was deleted before it
finished; then the table must empty once the retention passed. **Growth / enqueue rate** is the
least-squares slope of the row count over the second half of the run divided by the enqueue rate:
without pruning it is 1.0."""


# -- docs ---------------------------------------------------------------------------------------

NAMES = ("admin", "pruner")


def markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- generated by benchmarks/console.py: {name} begin -->",
        f"<!-- generated by benchmarks/console.py: {name} end -->",
    )


def write_section(name: str, body: str) -> None:
    """Replace (or add, in NAMES order) the generated section ``name``, keeping the rest."""
    text = DOCS.read_text() if DOCS.exists() else None
    if text is None:
        text = """# Benchmarks: the operations console and the pruner

From `benchmarks/console.py`, on PostgreSQL: how fast the admin pages answer over a large
history, and whether the pruner keeps the job table bounded under a steady load.

## Run it

```
.venv/bin/python benchmarks/console.py                         # admin pages (seeding 1M jobs takes a minute)
.venv/bin/python benchmarks/console.py --reuse --explain       # again on the same seed, with query plans
.venv/bin/python benchmarks/console.py --pruner                # the pruner, 10 minutes at 200 jobs/s
.venv/bin/python benchmarks/console.py --pruner --minutes 2    # a quick run (prints only; --write to keep it)
```

The admin part uses the database `jobs_bench_console`, the pruner part `jobs_bench_pruner`
(`JOBS_BENCH_DB` names another), dropped and re-created on each run (`--reuse` keeps a seeded
one), on the server named by `PGHOST`/`PGPORT`/`PGUSER`/`PGPASSWORD`. `JOBS_BENCH_NOTE` adds a
sentence to the machine note. When the server runs without autovacuum, `--pruner` runs `VACUUM`
of the job and event tables every 60 s in its place (`--vacuum-every SECONDS`, 0 for none).
"""
    text = tp.splice_section(text, name, body, NAMES, markers)
    DOCS.parent.mkdir(exist_ok=True)
    DOCS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pruner", action="store_true", help="part 2: the pruner under a steady enqueue rate")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks-console.md on any run")
    admin = parser.add_argument_group("admin pages (the default)")
    admin.add_argument("--runs", type=int, default=5, help="timed loads per page after one warm-up; default 5")
    admin.add_argument("--finished", type=int, default=Seed.finished, help="finished jobs; default 1,000,000")
    admin.add_argument("--waiting", type=int, default=Seed.waiting, help="waiting jobs; default 10,000")
    admin.add_argument("--reuse", action="store_true", help="keep the database if it holds a seed of these sizes")
    admin.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of every page's slowest query")
    pruner = parser.add_argument_group("pruner")
    pruner.add_argument("--minutes", type=float, default=10, help="minutes of steady enqueueing; default 10")
    pruner.add_argument("--rate", type=float, default=200, help="jobs enqueued per second; default 200")
    pruner.add_argument(
        "--batch", type=int, default=10, help="jobs per enqueue_many (one transaction); default 10, every 50 ms"
    )
    pruner.add_argument("--retention", type=float, default=30, help="seconds finished jobs are kept; default 30")
    pruner.add_argument("--prune-interval", type=float, default=2, help="PRUNE_INTERVAL seconds; default 2")
    pruner.add_argument(
        "--vacuum-every",
        type=float,
        default=None,
        help="run VACUUM on the job and event tables every so many seconds (0: never); default 60 when the "
        "server's autovacuum is off, else 0",
    )
    pruner.add_argument("--concurrency", type=int, default=4, help="threads per worker process; default 4")
    opts = parser.parse_args()
    if opts.pruner:
        if opts.minutes < 1 or opts.rate <= 0:
            fail("--minutes must be >= 1 and --rate > 0.")
        os.environ.setdefault("JOBS_BENCH_DB", "jobs_bench_pruner")
        run_pruner(opts)
    else:
        os.environ.setdefault("JOBS_BENCH_DB", "jobs_bench_console")
        run_admin(opts)


if __name__ == "__main__":
    main()

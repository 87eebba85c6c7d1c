#!/usr/bin/env python
"""What one ``enqueue()`` costs PostgreSQL, statement by statement: the server CPU of the plain
insert in the shapes and schemas it had and could have, measured side by side.

psycopg alone runs the plain insert (``plain_insert_sql``, prepared, autocommit: one statement
and one commit per job) in blocks of ``--block`` calls, the variants in a new random order each
round, and reads the backend's CPU time from ``/proc/<pid>/schedstat`` (nanoseconds) around each
block. Interleaving keeps the machine's drift (checkpoints, neighbours) out of the differences.

Variants, each on a database of its own (``bench_insert_<schema>``, re-created and migrated):

* ``shipped``: the statement and schema of this build (a queue known to have no size limit);
* ``size-limit probe``: the statement with the queue's size-limit guard, as
  ``SIZE_LIMITS_REFRESH = 0`` sends it (and every enqueue did before engine.size_limits);
* ``parent foreign key``: the schema with migration 0020 reversed (``parent_id``'s deferred
  foreign key, checked at every commit);
* ``table checks``: the schema with migrations 0020 and 0019 reversed (the seven table CHECKs,
  and the foreign key);
* ``events join``: the events NOTIFY as a join (``event_notify``), as before the select list;
* ``no events NOTIFY``, ``no event row``: what those two cost (the event log's contracts: not
  options, a yardstick);
* ``no feature indexes``: the schema without the job table's indexes a plain job makes no entry
  in (flows, delays, partitions, retention, dedup and schedules: opened, their predicates
  checked, at every insert); ``primary key only``: without the ready and trace indexes too;
  ``row alone``: that schema, and the statement without its event and NOTIFYs. What the
  features and the claim's indexes cost a plain insert: a yardstick, not an option;
* ``raw INSERT``: ``benchmarks/peers.py``'s raw loop, one row of a 9-column job-like table with a
  random UUID key and a partial ready index: the Goal's yardstick.

    .venv/bin/python benchmarks/enqueue_server_cpu.py --rounds 40

Prints server CPU and wall time per call for each. Autovacuum as the machine has it.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCHEMAS = {
    "head": None,
    "fk": "0019_checks_as_domains",
    "checks": "0018_unfinished_parts",
    "plainidx": "drop:features",
    "pkonly": "drop:all",
}
#: The job table's indexes a plain job enters besides its primary key.
ENTERED = ("django_jobs_ready_idx", "django_jobs_ready_queue_idx", "django_jobs_trace_idx")
RAW_TABLE = "bench_insert_raw"


def database(schema: str) -> str:
    return f"bench_insert_{schema}"


def conninfo(db: str) -> str:
    return (
        f"host={os.environ.get('PGHOST', '127.0.0.1')} port={os.environ.get('PGPORT', '5432')} "
        f"user={os.environ.get('PGUSER', 'postgres')} dbname={db}"
    )


def prepare(schema: str, target: str | None) -> None:
    """A fresh database migrated to the head, then back to ``target`` when given (a migration's
    name), or without the job table's secondary indexes (``drop:all``) or those a plain job makes
    no entry in (``drop:features``)."""
    import psycopg

    db = database(schema)
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.execute(f"CREATE DATABASE {db}")
    env = {**os.environ, "JOBS_BENCH_DB": db, "DJANGO_SETTINGS_MODULE": "benchmarks.settings", "PYTHONPATH": str(ROOT)}
    manage = [sys.executable, "-m", "django", "migrate", "-v0"]
    subprocess.run(manage, env=env, check=True, cwd=ROOT)
    if target and target.startswith("drop:"):
        with psycopg.connect(conninfo(db), autocommit=True) as conn:
            names = [
                row[0]
                for row in conn.execute(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'django_jobs_job' AND indexname <> "
                    "'django_jobs_job_pkey'"
                )
            ]
            for name in names:
                if target == "drop:all" or name not in ENTERED:
                    conn.execute(f"DROP INDEX {name}")
    elif target:
        subprocess.run([*manage, "django_jobs", target], env=env, check=True, cwd=ROOT)


def statements() -> dict[str, tuple[str, str | None]]:
    """``{variant: (schema, SQL)}``; SQL None is the raw INSERT."""
    from django_jobs.drivers.inserts import plain_insert_sql
    from django_jobs.drivers.pg_sql import event_notify

    shipped = plain_insert_sql("default", "django_jobs", "django_jobs_events", False)
    tail = ", pg_notify(E'django_jobs_events', '') FROM new_job"
    if not shipped.endswith(tail):
        raise SystemExit("plain_insert_sql's statement changed: update this benchmark's variants")
    joined = shipped[: -len(tail)] + f" FROM new_job, {event_notify('new_job')}".replace("%s", "E'django_jobs_events'")
    event = shipped[shipped.index(", ev AS (") : shipped.rindex(" SELECT ")]
    wake = ", pg_notify(E'django_jobs', new_job.queue)"
    if wake not in shipped:
        raise SystemExit("plain_insert_sql's statement changed: update this benchmark's variants")
    row_alone = shipped[: -len(tail)].replace(event, "").replace(wake, "") + " FROM new_job"
    return {
        "shipped": ("head", shipped),
        "size-limit probe": ("head", plain_insert_sql("default", "django_jobs", "django_jobs_events", True)),
        "parent foreign key": ("fk", shipped),
        "table checks": ("checks", shipped),
        "events join": ("head", joined),
        "no events NOTIFY": ("head", shipped[: -len(tail)] + " FROM new_job"),
        "no event row": ("head", shipped.replace(event, "")),
        "no feature indexes": ("plainidx", shipped),
        "primary key only": ("pkonly", shipped),
        "row alone": ("pkonly", row_alone),
        "raw INSERT": ("head", None),
    }


def params(guarded: bool) -> list:
    from django_jobs.uuid7 import uuid7

    now = datetime.now(UTC)
    job_id = uuid7()
    seq = int(now.timestamp() * 1_000_000)
    values = [job_id, "default", "benchmarks.tasks.noop", "[]", "{}", 0, now, "{}", 1, seq, str(job_id)]
    return [*values, "default"] if guarded else values


#: benchmarks/peers.py's raw loop: its table and its statement.
RAW_DDL = (
    f"CREATE TABLE IF NOT EXISTS {RAW_TABLE} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), queue text NOT NULL, "
    "task_path text NOT NULL, args jsonb NOT NULL, kwargs jsonb NOT NULL, state text NOT NULL, "
    "priority smallint NOT NULL, enqueued_at timestamptz NOT NULL, available_at timestamptz NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS {RAW_TABLE}_ready ON {RAW_TABLE} (priority DESC, available_at) "
    "WHERE state = 'waiting'",
)
RAW = (
    f"INSERT INTO {RAW_TABLE} (queue, task_path, args, kwargs, state, priority, enqueued_at, available_at) "
    "VALUES (%s, %s, %s::jsonb, %s::jsonb, 'waiting', 0, now(), now())"
)
RAW_PARAMS = ["default", "benchmarks.tasks.noop", "[]", "{}"]


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=100, help="calls per variant per round")
    opts = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    for schema, target in SCHEMAS.items():
        prepare(schema, target)
    os.environ["JOBS_BENCH_DB"] = database("head")
    import django

    django.setup()
    import psycopg

    variants = statements()
    conns, pids, cursors = {}, {}, {}
    for name, (schema, sql) in variants.items():
        conn = psycopg.connect(conninfo(database(schema)), autocommit=True, prepare_threshold=0)
        if sql is None:
            for ddl in RAW_DDL:
                conn.execute(ddl)
        conns[name] = conn
        pids[name] = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        cursors[name] = conn.cursor()

    def call(name: str) -> None:
        sql = variants[name][1]
        cursor = cursors[name]
        if sql is None:
            cursor.execute(RAW, RAW_PARAMS)
        else:
            cursor.execute(sql, params("django_jobs_queuestate" in sql))
            cursor.fetchone()

    for name in variants:  # warm up: prepared statements, caches
        for _ in range(30):
            call(name)
    totals = {name: [0, 0.0, 0] for name in variants}
    for _ in range(opts.rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:
            pid = pids[name]
            cpu0, t0 = cpu_ns(pid), time.perf_counter()
            for _ in range(opts.block):
                call(name)
            totals[name][0] += cpu_ns(pid) - cpu0
            totals[name][1] += time.perf_counter() - t0
            totals[name][2] += opts.block
    with psycopg.connect(conninfo(database("head"))) as conn:
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
    print(f"{opts.rounds} rounds of {opts.block} calls per variant, interleaved; autovacuum {autovacuum}")
    base_ns, base_wall, base_n = totals["shipped"]
    print(f"{'variant':<20} {'server CPU/call':>16} {'wall/call':>10} {'vs shipped (CPU / wall)':>24}")
    for name, (ns, wall, n) in totals.items():
        cpu, per_call = ns / n / 1000, wall / n * 1e6
        diff = f"{cpu - base_ns / base_n / 1000:+.1f} / {per_call - base_wall / base_n * 1e6:+.1f} us"
        print(f"{name:<20} {cpu:>13.1f} us {per_call:>7.1f} us {diff:>24}")
    for conn in conns.values():
        conn.close()
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        for schema in SCHEMAS:
            admin.execute(f"DROP DATABASE IF EXISTS {database(schema)}")


if __name__ == "__main__":
    main()

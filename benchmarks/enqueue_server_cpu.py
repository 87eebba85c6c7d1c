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
* ``raw INSERT``: one row of a 9-column table with its primary key, the floor.

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

SCHEMAS = {"head": None, "fk": "0019_checks_as_domains", "checks": "0018_unfinished_parts"}
RAW_TABLE = "bench_insert_raw"


def database(schema: str) -> str:
    return f"bench_insert_{schema}"


def conninfo(db: str) -> str:
    return (
        f"host={os.environ.get('PGHOST', '127.0.0.1')} port={os.environ.get('PGPORT', '5432')} "
        f"user={os.environ.get('PGUSER', 'postgres')} dbname={db}"
    )


def prepare(schema: str, target: str | None) -> None:
    """A fresh database migrated to the head, then back to ``target`` when given."""
    import psycopg

    db = database(schema)
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.execute(f"CREATE DATABASE {db}")
    env = {**os.environ, "JOBS_BENCH_DB": db, "DJANGO_SETTINGS_MODULE": "benchmarks.settings", "PYTHONPATH": str(ROOT)}
    manage = [sys.executable, "-m", "django", "migrate", "-v0"]
    subprocess.run(manage, env=env, check=True, cwd=ROOT)
    if target:
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
    event = shipped[shipped.index(", ev AS (") : shipped.index(" SELECT new_job.enqueued_at")]
    return {
        "shipped": ("head", shipped),
        "size-limit probe": ("head", plain_insert_sql("default", "django_jobs", "django_jobs_events", True)),
        "parent foreign key": ("fk", shipped),
        "table checks": ("checks", shipped),
        "events join": ("head", joined),
        "no events NOTIFY": ("head", shipped[: -len(tail)] + " FROM new_job"),
        "no event row": ("head", shipped.replace(event, "")),
        "raw INSERT": ("head", None),
    }


def params(guarded: bool) -> list:
    from django_jobs.uuid7 import uuid7

    now = datetime.now(UTC)
    job_id = uuid7()
    seq = int(now.timestamp() * 1_000_000)
    values = [job_id, "default", "benchmarks.tasks.noop", "[]", "{}", 0, now, "{}", 1, seq, str(job_id)]
    return [*values, "default"] if guarded else values


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
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {RAW_TABLE} (id bigserial PRIMARY KEY, queue text, task_path text, "
                "args jsonb, kwargs jsonb, state text, priority int, enqueued_at timestamptz, available_at timestamptz)"
            )
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
    print(f"{'variant':<20} {'server CPU/call':>16} {'wall/call':>10}")
    for name, (ns, wall, n) in totals.items():
        print(f"{name:<20} {ns / n / 1000:>13.1f} us {wall / n * 1e6:>7.1f} us")
    for conn in conns.values():
        conn.close()


if __name__ == "__main__":
    main()

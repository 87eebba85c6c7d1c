#!/usr/bin/env python
"""What bounds a one-job ``enqueue()``'s share of the raw INSERT + commit loop: the same call in
the builds it could have, each against the raw loop, interleaved in short blocks.

The Goal of issue 13 asks a one-job enqueue to reach 0.7 of ``benchmarks/peers.py``'s raw loop
(psycopg alone, one INSERT + commit). This measures how far each part of the call moves that
share: one process per variant, each with its own settings and database, run in turn in blocks
of ``--block`` calls, in a new random order each round, so the host's drift falls on all of
them alike. Each block reads the client's CPU (``time.process_time``, user and system) and its
backend's (``/proc/<pid>/schedstat``).

* ``raw loop``: ``peers.py``'s raw loop (``enqueue_server_cpu.RAW``);
* ``statement alone``: psycopg's cursor sending the plain insert this build prepares
  (``plain_insert_sql``: the row, its ``enqueued`` event, the NOTIFYs), no Django;
* ``enqueue()``: ``noop.enqueue()`` as shipped, in autocommit;
* ``enqueue(), EVENTS off``: the same with ``DJANGO_JOBS["EVENTS"] = False`` (no event row, no
  events NOTIFY): the event log's cost, a yardstick (it is on by default and a contract);
* ``enqueue(), EVENTS off, no feature indexes``: that, on a schema without the job table's
  indexes a plain job makes no entry in (``enqueue_server_cpu``'s ``drop:features``);
* ``pgqueuer``: pgqueuer's ``Queries.enqueue("noop", None)`` (``pgqueuer_side.py serve``, in
  ``peers.py``'s benchmark-only virtualenv, installed on first use), on a database of its own.

    .venv/bin/python benchmarks/enqueue_share.py --rounds 30

Prints, per variant: calls/s, its share of the raw loop, and client and server CPU per call.
Autovacuum as the machine has it (printed). Drops its databases at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.enqueue_server_cpu import (  # noqa: E402
    RAW,
    RAW_DDL,
    RAW_PARAMS,
    SCHEMAS,
    conninfo,
    cpu_ns,
    database,
    params,
    prepare,
)

#: variant: (mode, schema of its database (None: pgqueuer's own, PGQ_DB), events)
VARIANTS = {
    "raw loop": ("raw", "head", True),
    "statement alone": ("statement", "head", True),
    "enqueue()": ("enqueue", "head", True),
    "enqueue(), EVENTS off": ("enqueue", "head", False),
    "enqueue(), EVENTS off, no feature indexes": ("enqueue", "plainidx", False),
    "pgqueuer": ("pgqueuer", None, True),
}
PGQ_DB = "bench_share_pgqueuer"


def child(mode: str) -> None:
    """One variant: after a warm-up, run the number of calls read from stdin, answer with the
    block's wall time, client CPU and backend CPU as a JSON line; until stdin closes."""
    import django

    django.setup()
    import psycopg
    from django.db import connection

    if mode == "enqueue":
        from benchmarks.tasks import noop

        noop.enqueue()  # connects
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        call = noop.enqueue
    else:
        from django_jobs.drivers.inserts import plain_insert_sql

        conn = psycopg.connect(conninfo(os.environ["JOBS_BENCH_DB"]), autocommit=True, prepare_threshold=0)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        cursor = conn.cursor()
        if mode == "raw":
            for ddl in RAW_DDL:
                conn.execute(ddl)

            def call() -> None:
                cursor.execute(RAW, RAW_PARAMS)

        else:
            sql = plain_insert_sql("default", "django_jobs", "django_jobs_events", False)

            def call() -> None:
                cursor.execute(sql, params(False))
                cursor.fetchone()

    for _ in range(200):
        call()
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        server0, client0, t0 = cpu_ns(pid), time.process_time(), time.perf_counter()
        for _ in range(n):
            call()
        wall, client, server = time.perf_counter() - t0, time.process_time() - client0, cpu_ns(pid) - server0
        print(json.dumps([wall, client, server / 1e9]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=200, help="calls per variant per round")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    if opts.child:
        child(opts.child)
        return
    schemas = {schema for _, schema, _ in VARIANTS.values() if schema is not None}
    for schema in schemas:
        prepare(schema, SCHEMAS[schema])
    import psycopg

    from benchmarks import peers  # sets JOBS_BENCH_DB in this process: each child gets its own below

    peers.ensure_venv()
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {PGQ_DB}")
        admin.execute(f"CREATE DATABASE {PGQ_DB}")
    pgq = [str(peers.VENV_PYTHON), str(peers.SIDE), "--db", PGQ_DB]
    subprocess.run([*pgq, "install"], check=True, stdout=subprocess.DEVNULL)
    procs = {}
    for name, (mode, schema, events) in VARIANTS.items():
        env = {**os.environ, "JOBS_BENCH_DB": database(schema) if schema else PGQ_DB, "PYTHONPATH": str(ROOT)}
        if not events:
            env["JOBS_BENCH_EVENTS"] = "0"
        procs[name] = subprocess.Popen(
            [*pgq, "serve"] if schema is None else [sys.executable, __file__, "--child", mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
    for proc in procs.values():
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("a variant's process did not start; see its error above")
    totals = {name: [0.0, 0.0, 0.0, 0] for name in VARIANTS}
    for _ in range(opts.rounds):
        order = list(VARIANTS)
        random.shuffle(order)
        for name in order:
            proc = procs[name]
            proc.stdin.write(f"{opts.block}\n")
            proc.stdin.flush()
            answer = proc.stdout.readline()
            if not answer:
                raise SystemExit(f"the process of {name!r} ended; see its error above")
            wall, client, server = json.loads(answer)
            total = totals[name]
            total[0] += wall
            total[1] += client
            total[2] += server
            total[3] += opts.block
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    with psycopg.connect(conninfo(database("head"))) as conn:
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
    print(f"{opts.rounds} rounds of {opts.block} calls per variant, interleaved; autovacuum {autovacuum}")
    raw_wall, _, _, raw_n = totals["raw loop"]
    raw_rate = raw_n / raw_wall
    print(f"{'variant':<42} {'calls/s':>8} {'share':>6} {'wall/call':>10} {'client CPU':>11} {'server CPU':>11}")
    for name, (wall, client, server, n) in totals.items():
        print(
            f"{name:<42} {n / wall:>8,.0f} {n / wall / raw_rate:>6.2f} {wall / n * 1e6:>7.1f} us "
            f"{client / n * 1e6:>8.1f} us {server / n * 1e6:>8.1f} us"
        )
    with psycopg.connect(conninfo("postgres"), autocommit=True) as admin:
        for db in [*map(database, schemas), PGQ_DB]:
            admin.execute(f"DROP DATABASE IF EXISTS {db}")


if __name__ == "__main__":
    main()

"""The pgqueuer half of ``benchmarks/peers.py``; runs inside the benchmark-only virtualenv
(``.bench-venv/peers``), never in the project's. It imports neither Django nor django_jobs.

Each subcommand does one thing against the database named by ``--db`` on the server of
``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD`` and prints one JSON object on stdout:

* ``install``: pgqueuer's schema (its ``Queries.install``), unless it is there already;
* ``enqueue N``: ``N`` single enqueues, one job (and one transaction) each, after ``--warmup``;
* ``serve``: single enqueues in blocks on demand (``benchmarks/enqueue_share.py``): prints
  ``ready`` after a warm-up, then for each number ``N`` read from stdin runs ``N`` enqueues and
  prints ``[wall, client CPU, backend CPU]`` in seconds as a JSON line, until stdin closes;
* ``bulk N``: one batch enqueue of ``N`` jobs (one statement, one transaction), after a warm-up,
  on emptied tables (``--checkpoint``: after a CHECKPOINT);
* ``prefill N``: ``N`` waiting jobs in batches of 10,000 (set-up, not timed);
* ``pace``: one job every ``--interval`` seconds for ``--seconds``, for the pickup latency;
* ``worker``: a ``QueueManager`` with the entrypoints ``noop``, ``sleep_async`` and
  ``sleep_sync``, as ``pgq run`` would run it (uvloop, one asyncpg connection), in drain mode
  (exits once the queue is empty) or continuous mode (until SIGTERM/SIGINT).

The jobs' payload is ``None`` or, for the sleep entrypoints, the seconds to wait as text.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import signal
import sys
import time

import asyncpg
import uvloop
from pgqueuer import types
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries


async def connect(db: str) -> asyncpg.Connection:
    return await asyncpg.connect(
        host=os.environ.get("PGHOST", "127.0.0.1"),
        port=int(os.environ.get("PGPORT", "5432")),
        user=os.environ.get("PGUSER", "postgres"),
        password=os.environ.get("PGPASSWORD", "") or None,
        database=db,
    )


async def queries_for(db: str) -> Queries:
    return Queries(AsyncpgDriver(await connect(db)))


async def install(opts: argparse.Namespace) -> dict:
    q = await queries_for(opts.db)
    if await q.schema_is_installed():
        return {"installed": False}
    await q.install()
    return {"installed": True}


async def enqueue(opts: argparse.Namespace) -> dict:
    q = await queries_for(opts.db)
    for _ in range(opts.warmup):  # warm up: connection, prepared statements
        await q.enqueue("noop", None)
    t0 = time.perf_counter()
    for _ in range(opts.n):
        await q.enqueue("noop", None)
    return {"rate": opts.n / (time.perf_counter() - t0)}


def cpu_ns(pid: int) -> int:
    """The CPU time process ``pid`` has used, in nanoseconds."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


async def serve(opts: argparse.Namespace) -> None:
    conn = await connect(opts.db)
    q = Queries(AsyncpgDriver(conn))
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    for _ in range(200):
        await q.enqueue("noop", None)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        server0 = cpu_ns(pid)
        client0, t0 = time.process_time(), time.perf_counter()
        for _ in range(int(line)):
            await q.enqueue("noop", None)
        wall, client, server = time.perf_counter() - t0, time.process_time() - client0, cpu_ns(pid) - server0
        print(json.dumps([wall, client, server / 1e9]), flush=True)


async def bulk(opts: argparse.Namespace) -> dict:
    conn = await connect(opts.db)
    q = Queries(AsyncpgDriver(conn))
    await q.enqueue(["noop"] * 1_000, [None] * 1_000, [0] * 1_000)  # warm up
    # As peers.py does for django-jobs after its warm-up: empty tables, a fresh checkpoint.
    await conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
    if opts.checkpoint:
        await conn.execute("CHECKPOINT")
    t0 = time.perf_counter()
    ids = await q.enqueue(["noop"] * opts.n, [None] * opts.n, [0] * opts.n)
    elapsed = time.perf_counter() - t0
    if len(ids) != opts.n:
        return {"error": f"expected {opts.n} ids, got {len(ids)}"}
    return {"rate": opts.n / elapsed}


async def prefill(opts: argparse.Namespace) -> dict:
    q = await queries_for(opts.db)
    payload = opts.payload.encode() if opts.payload else None
    left = opts.n
    while left:
        k = min(left, 10_000)
        await q.enqueue([opts.entrypoint] * k, [payload] * k, [0] * k)
        left -= k
    return {"enqueued": opts.n}


async def pace(opts: argparse.Namespace) -> dict:
    q = await queries_for(opts.db)
    n = int(opts.seconds / opts.interval)
    t0 = time.monotonic()
    for i in range(n):
        pause = t0 + i * opts.interval - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        await q.enqueue("noop", None)
    return {"enqueued": n}


async def worker(opts: argparse.Namespace) -> dict:
    if opts.threads:
        # What asyncio.to_thread runs on: the loop's default executor (min(32, cores + 4)
        # threads unless set), sized here to the concurrency so blocking jobs are not capped.
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(opts.threads))
    qm = QueueManager(await queries_for(opts.db))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    @qm.entrypoint("sleep_async")
    async def sleep_async(job: Job) -> None:
        await asyncio.sleep(float(job.payload or b"0"))

    @qm.entrypoint("sleep_sync")
    async def sleep_sync(job: Job) -> None:
        # pgqueuer 1.x runs async entrypoints only; its documented way to run blocking code.
        await asyncio.to_thread(time.sleep, float(job.payload or b"0"))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, qm.shutdown.set)
    await qm.run(
        batch_size=opts.batch_size,
        mode=types.QueueExecutionMode.drain if opts.drain else types.QueueExecutionMode.continuous,
        max_concurrent_tasks=opts.max_tasks or None,
    )
    return {"stopped": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install")
    p = sub.add_parser("enqueue")
    p.add_argument("n", type=int)
    p.add_argument("--warmup", type=int, default=50, help="enqueues before the timed ones")
    sub.add_parser("serve")
    p = sub.add_parser("bulk")
    p.add_argument("n", type=int)
    p.add_argument("--checkpoint", action="store_true", help="a CHECKPOINT before each call")
    p = sub.add_parser("prefill")
    p.add_argument("n", type=int)
    p.add_argument("--entrypoint", default="noop")
    p.add_argument("--payload", default="")
    p = sub.add_parser("pace")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--interval", type=float, required=True)
    p = sub.add_parser("worker")
    p.add_argument("--batch-size", type=int, default=10, help="QueueManager.run's batch_size (its default: 10)")
    p.add_argument("--max-tasks", type=int, default=0, help="max_concurrent_tasks; 0: none (its default)")
    p.add_argument("--threads", type=int, default=0, help="the default executor's threads; 0: asyncio's default")
    p.add_argument("--drain", action="store_true", help="exit once the queue is empty")
    opts = parser.parse_args()
    command = {
        "install": install,
        "enqueue": enqueue,
        "serve": serve,
        "bulk": bulk,
        "prefill": prefill,
        "pace": pace,
        "worker": worker,
    }[opts.command]
    result = uvloop.run(command(opts))
    if result is None:  # serve answered as it went
        return
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

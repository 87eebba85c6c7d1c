"""One process of the dedup and idempotency concurrency tests (tests/contract/test_dedup.py,
tests/test_idempotency_trace.py). Run as ``python -m tests.dedup_load MODE INDEX DIR [ARGS]``
with the environment of ``tests.conftest.subprocess_env``.

The process sets Django up, writes ``DIR/ready-INDEX``, waits for ``DIR/go`` (so all processes
start together), does its enqueues, and writes ``DIR/result-INDEX.json``: how many enqueues
made a new job, how many were duplicates, the errors, and the seconds it took.

Modes:

* ``dedup N KEYS``: N enqueues of ``refresh`` with ``Dedup(key)`` over KEYS keys;
* ``once KEY``: one enqueue with ``Dedup(KEY)``, after writing ``DIR/calling-INDEX``;
* ``hold KEY``: in a transaction, one enqueue with ``Dedup(KEY)``, write ``DIR/held``, wait for
  ``DIR/rollback``, roll back (no ``go`` needed);
* ``idem KEY``: one enqueue with ``idempotency_key=KEY``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.001)


def main(mode: str, index: int, directory: Path, *rest: str) -> None:
    import django

    django.setup()
    from django.db import connection, transaction

    from django_jobs import Dedup
    from tests.tasks_dedup import refresh

    connection.ensure_connection()
    counts = {"new": 0, "duplicate": 0, "errors": 0, "messages": []}

    def record(call) -> None:
        try:
            result = call()
        except Exception as exc:  # noqa: BLE001 - counted and reported to the test
            counts["errors"] += 1
            counts["messages"].append(f"{type(exc).__name__}: {exc}")
        else:
            counts["duplicate" if result.duplicate else "new"] += 1

    if mode == "hold":
        with transaction.atomic():
            record(lambda: refresh.using(dedup=Dedup(rest[0])).enqueue(index))
            (directory / "held").touch()
            wait_for(directory / "rollback")
            transaction.set_rollback(True)
        (directory / f"result-{index}.json").write_text(json.dumps({**counts, "elapsed": 0.0}))
        return
    (directory / f"ready-{index}").touch()
    wait_for(directory / "go")
    started = time.perf_counter()
    if mode == "dedup":
        n, keys = int(rest[0]), int(rest[1])
        tasks = [refresh.using(dedup=Dedup(f"key-{k}")) for k in range(keys)]
        for i in range(n):
            # Each process walks the keys from its own offset, so they collide on every key.
            record(lambda i=i: tasks[(i + index * 13) % keys].enqueue(index, i))
    elif mode == "once":
        (directory / f"calling-{index}").touch()
        record(lambda: refresh.using(dedup=Dedup(rest[0])).enqueue(index))
    elif mode == "idem":
        record(lambda: refresh.using(idempotency_key=rest[0]).enqueue(index))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    elapsed = time.perf_counter() - started
    (directory / f"result-{index}.json").write_text(json.dumps({**counts, "elapsed": elapsed}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), *sys.argv[4:])

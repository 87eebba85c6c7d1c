"""The subscribers of benchmarks/bus_chaos.py: topic ``chaos``, groups ``audit`` (``atomic=True``),
``billing`` and ``email``, batches of ``JOBS_BUS_CHAOS_BATCH`` (10) with
``JOBS_BUS_CHAOS_THREADS`` (4) threads per group and process.

Each handler records, in its process's file of the probe directory (``JOBS_BUS_CHAOS_PROBE``),
one write of an O_APPEND file each: ``B`` when a batch starts (group, partition, first and last
position, attempt, time.time(), pid), ``M`` for each message it handled, ``E`` when it returns;
and it writes one :class:`~benchmarks.bus_chaos_app.models.Write` row per message through the
ORM (for ``audit`` inside the transaction that moves the cursor).

Traps: the chaos script arms one by creating ``<probe>/traps/armed-<kind>-<i>-<group>``. The
first handler of that group on a first delivery (attempt 1) to rename it to
``sprung-<kind>-<i>-<group>-<pid>`` (a rename has one winner) handles the first half of its batch,
records ``T`` and writes ``ready-<kind>-<i>`` (its pid and batch), then waits for ``<probe>/traps/go-<kind>-<i>`` (up to ``TRAP_WAIT`` seconds)
before handling the rest: the script SIGKILLs (kind ``kill``) or SIGSTOPs (kind ``stop``) it
while it is in the middle of the batch.
"""

from __future__ import annotations

import os
import time

import django_jobs
from benchmarks.bus_chaos_app import ATOMIC_GROUP, GROUPS, PROBE_ENV, TOPIC
from benchmarks.bus_chaos_app.models import Write
from benchmarks.tasks import _append

BATCH = int(os.environ.get("JOBS_BUS_CHAOS_BATCH", "10"))
THREADS = int(os.environ.get("JOBS_BUS_CHAOS_THREADS", "4"))
#: Seconds a trapped handler waits for its go file (a SIGKILLed one never gets it).
TRAP_WAIT = 300.0


def _spring(traps: str, group: str) -> str | None:
    """Claim an armed trap for ``group``: its name (``<kind>-<i>``), or None."""
    suffix = f"-{group}"
    for name in os.listdir(traps):
        if name.startswith("armed-") and name.endswith(suffix):
            try:
                os.rename(os.path.join(traps, name), os.path.join(traps, f"sprung-{name[6:]}-{os.getpid()}"))
            except FileNotFoundError:
                continue  # another handler won it
            return name[6 : -len(suffix)]
    return None


def _write(messages, context, group: str, probe: str) -> None:
    pid = os.getpid()
    Write.objects.bulk_create(
        Write(
            group=group, partition=context.partition, position=m.position, n=m.payload["n"], pid=pid,
            attempt=context.attempt,
        )
        for m in messages
    )  # fmt: skip
    now = time.time()
    _append(
        probe,
        "".join(
            f"M\t{group}\t{context.partition}\t{m.position}\t{m.payload['n']}\t{now:.6f}\t{pid}\n" for m in messages
        ),
    )


def handle(messages, context, group: str) -> None:
    probe = os.environ[PROBE_ENV]
    pid = os.getpid()
    head = f"{group}\t{context.partition}\t{messages[0].position}\t{messages[-1].position}\t{context.attempt}"
    _append(probe, f"B\t{head}\t{time.time():.6f}\t{pid}\n")
    traps = os.path.join(probe, "traps")
    trap = _spring(traps, group) if context.attempt == 1 and len(messages) > 1 else None
    if trap is None:
        _write(messages, context, group, probe)
    else:
        half = len(messages) // 2
        _write(messages[:half], context, group, probe)
        _append(probe, f"T\t{trap}\t{head}\t{time.time():.6f}\t{pid}\n")
        ready = os.path.join(traps, f"ready-{trap}")
        with open(f"{ready}.tmp", "w") as fh:
            fh.write(f"{pid}\t{head}\n")
        os.rename(f"{ready}.tmp", ready)  # whole when the script sees it; it acts on it now
        go = os.path.join(traps, f"go-{trap}")
        deadline = time.monotonic() + TRAP_WAIT
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        _write(messages[half:], context, group, probe)
    _append(probe, f"E\t{head}\t{time.time():.6f}\t{pid}\n")


def _subscribe(group: str, atomic: bool) -> None:
    def handler(messages, context):
        handle(messages if isinstance(messages, list) else [messages], context, group)

    handler.__name__ = handler.__qualname__ = f"chaos_{group}"
    django_jobs.subscriber(
        TOPIC, group=group, batch=BATCH, concurrency=THREADS, max_attempts=3, backoff=0, atomic=atomic,
        start_from="beginning",
    )(handler)  # fmt: skip


for _group in GROUPS:
    _subscribe(_group, _group == ATOMIC_GROUP)

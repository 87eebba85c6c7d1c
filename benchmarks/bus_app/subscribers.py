"""Subscribers of benchmarks/bus.py: ``bench1`` has one group, ``bench3`` three; their handlers
do nothing. ``benchlat``'s handler appends each message's publish-to-handler latency (seconds,
on this host's clock) to ``$JOBS_BENCH_BUS_PROBE/<pid>.txt``."""

from __future__ import annotations

import os
import time

import django_jobs

BATCH = int(os.environ.get("JOBS_BENCH_BUS_BATCH", "10"))
CONCURRENCY = int(os.environ.get("JOBS_BENCH_BUS_THREADS", "4"))


def _nothing(messages, context):
    return None


django_jobs.subscriber("bench1", group="g1", batch=BATCH, concurrency=CONCURRENCY, start_from="beginning")(_nothing)
for _group in ("g1", "g2", "g3"):
    django_jobs.subscriber("bench3", group=_group, batch=BATCH, concurrency=CONCURRENCY, start_from="beginning")(
        _nothing
    )


@django_jobs.subscriber("benchlat", group="g1", batch=BATCH, concurrency=CONCURRENCY, start_from="beginning")
def latency(messages, context):
    now = time.time()
    lines = "".join(f"{now - m.created_at.timestamp():.6f}\n" for m in messages)
    path = os.path.join(os.environ["JOBS_BENCH_BUS_PROBE"], f"{os.getpid()}.txt")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)

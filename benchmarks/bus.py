#!/usr/bin/env python
"""Bus mode on a real PostgreSQL: publish and consume rates, end-to-end latency, lag.

Measured, on its own database ``jobs_bench_bus`` (dropped and re-created):

- **publish, one per transaction**: ``--publishes`` messages (default 2,000), each
  ``topic.publish()`` in its own transaction, over ``--partitions`` partitions (default 100);
- **publish_many**: ``--many`` messages (default 20,000) in calls of 1,000;
- **consume, 1 group / 3 groups**: ``--consume`` messages (default 20,000) over the partitions,
  published in one transaction once ``--workers`` ``runworker`` processes (default 2, each with
  4 threads per group, batches of 10; ``JOBS_BENCH_BUS_THREADS``, ``JOBS_BENCH_BUS_BATCH``) are
  registered; timed from that commit until every group's lag is 0. Deliveries per second count
  a message once per group;
- **end to end**: with the workers running, ``--rate`` messages/s (default 200) for
  ``--seconds`` (default 10), one per transaction; each handler records publish-to-handler time
  (the message's ``created_at``, PostgreSQL's clock, to the handler's ``time.time()``, one host);
  p50/p99/max, the publish rate reached (one publish per transaction may fall short of
  ``--rate`` on a loaded machine), and the largest lag sampled every 0.5 s (bounded: the
  workers keep up).

Each figure is printed with the machine's 1-minute load average as its measurement started
(``os.getloadavg``): on a shared machine the load says how much to trust it. Prints a table and,
last, one JSON line. ``--only consume_1_group,consume_3_groups`` runs some of the measurements
(``SCENARIOS``), e.g. to compare the consume path of two versions run by run. ``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD`` pick the
server; see benchmarks/settings.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("JOBS_BENCH_DB", "jobs_bench_bus")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks import throughput as tp  # noqa: E402 - after the environment it reads

#: The measurements, in the order they run (``--only`` picks some).
SCENARIOS = ("publish_per_tx", "publish_many", "consume_1_group", "consume_3_groups", "end_to_end")


def lag(topic: str) -> int:
    return int(
        tp.scalar(
            "SELECT COALESCE(SUM(p.last_position - c.position), 0) FROM django_jobs_group_cursor c "
            "JOIN django_jobs_topic_partition p ON p.id = c.partition_id WHERE c.topic = %s",
            [topic],
        )[0]
    )


def groups_ready(topic: str, groups: int) -> bool:
    return int(tp.scalar("SELECT COUNT(*) FROM django_jobs_consumer_group WHERE topic = %s", [topic])[0]) >= groups


def wait_for(condition, timeout: float, what: str, procs: list[subprocess.Popen]) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        for p in procs:
            if p.poll() is not None:
                tp.fail(f"a worker exited with {p.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            tp.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def start_workers(n: int, topic: str, probe: str) -> list[subprocess.Popen]:
    env = {**tp.worker_env(), "JOBS_BENCH_BUS": "1", "JOBS_BENCH_BUS_PROBE": probe}
    return [
        subprocess.Popen(
            tp.worker_command("-q", "no-jobs", "--topics", topic, "--sleep", "0.2", "--grace", "5"),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def publish_one_per_transaction(n: int, partitions: int) -> float:
    import django_jobs

    t = django_jobs.topic("pub1")
    start = time.perf_counter()
    for i in range(n):
        t.publish({"i": i}, partition=f"p{i % partitions}")
    return n / (time.perf_counter() - start)


def publish_many(n: int, partitions: int, topic: str = "pubmany") -> float:
    import django_jobs

    t = django_jobs.topic(topic)
    start = time.perf_counter()
    for chunk in range(0, n, 1000):
        t.publish_many(
            [{"payload": {"i": i}, "partition": f"p{i % partitions}"} for i in range(chunk, min(n, chunk + 1000))]
        )
    return n / (time.perf_counter() - start)


def consume(topic: str, groups: int, n: int, partitions: int, workers: int, probe: str) -> tuple[float, float]:
    """(seconds, deliveries per second) from the commit of ``n`` messages to a lag of 0."""
    procs = start_workers(workers, topic, probe)
    try:
        wait_for(lambda: groups_ready(topic, groups), 120, f"{topic}'s groups to register", procs)
        from django.db import transaction

        import django_jobs

        t = django_jobs.topic(topic)
        with transaction.atomic():
            for chunk in range(0, n, 1000):
                t.publish_many(
                    [
                        {"payload": {"i": i}, "partition": f"p{i % partitions}"}
                        for i in range(chunk, min(n, chunk + 1000))
                    ]
                )
        start = time.perf_counter()
        wait_for(lambda: lag(topic) == 0, 600, f"{topic} to be consumed", procs)
        took = time.perf_counter() - start
    finally:
        tp.stop_processes(procs)
    return took, n * groups / took


def end_to_end(rate: float, seconds: float, partitions: int, workers: int, probe: str) -> dict[str, float]:
    import django_jobs

    procs = start_workers(workers, "benchlat", probe)
    try:
        wait_for(lambda: groups_ready("benchlat", 1), 120, "benchlat's group to register", procs)
        t = django_jobs.topic("benchlat")
        max_lag = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal max_lag
            from django.db import connection

            while not stop.wait(0.5):
                max_lag = max(max_lag, lag("benchlat"))
            connection.close()

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        total = int(rate * seconds)
        start = time.monotonic()
        for i in range(total):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t.publish({"i": i}, partition=f"p{i % partitions}")
        published_in = time.monotonic() - start
        wait_for(lambda: lag("benchlat") == 0, 120, "benchlat to be consumed", procs)
        stop.set()
        sampler.join()
    finally:
        tp.stop_processes(procs)
    latencies = sorted(float(x) for f in Path(probe).glob("*.txt") for x in f.read_text().split())
    if len(latencies) < total:
        tp.fail(f"only {len(latencies)} of {total} latencies recorded")
    q = statistics.quantiles(latencies, n=100)
    return {
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "max_ms": latencies[-1] * 1000,
        "max_lag": max_lag,
        # The rate the publisher reached: on a loaded machine one publish per transaction may
        # not keep up with --rate, and the latencies are those of the rate reached.
        "e2e_published_msg_s": total / published_in,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=2000)
    parser.add_argument("--many", type=int, default=20000)
    parser.add_argument("--consume", type=int, default=20000)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"Comma-separated scenarios to run, of {', '.join(SCENARIOS)} (default: all).",
    )
    opts = parser.parse_args()
    only = [name.strip() for name in opts.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(SCENARIOS))
    if unknown or not only:
        parser.error(f"--only: unknown scenario(s) {', '.join(unknown) or '(none given)'}; of {', '.join(SCENARIOS)}")

    version = tp.ensure_database()
    tp.setup_django()
    results: dict[str, float] = {}
    # The machine's 1-minute load average as each measurement starts: other work on the machine
    # (a test suite) shows in the figures, so each is reported with it.
    load: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as probe:
        if "publish_per_tx" in only:
            load["publish_per_tx"] = os.getloadavg()[0]
            results["publish_per_tx_msg_s"] = publish_one_per_transaction(opts.publishes, opts.partitions)
        if "publish_many" in only:
            load["publish_many"] = os.getloadavg()[0]
            results["publish_many_msg_s"] = publish_many(opts.many, opts.partitions)
        if "consume_1_group" in only:
            load["consume_1_group"] = os.getloadavg()[0]
            took, rate = consume("bench1", 1, opts.consume, opts.partitions, opts.workers, probe)
            results["consume_1_group_s"], results["consume_1_group_deliveries_s"] = took, rate
        if "consume_3_groups" in only:
            load["consume_3_groups"] = os.getloadavg()[0]
            took, rate = consume("bench3", 3, opts.consume, opts.partitions, opts.workers, probe)
            results["consume_3_groups_s"], results["consume_3_groups_deliveries_s"] = took, rate
        if "end_to_end" in only:
            load["end_to_end"] = os.getloadavg()[0]
            results.update(end_to_end(opts.rate, opts.seconds, opts.partitions, opts.workers, probe))
    print(f"PostgreSQL {version}, {os.cpu_count()} CPUs, {opts.workers} worker processes, {opts.partitions} partitions")
    rows = []
    if "publish_per_tx_msg_s" in results:
        rows.append(("publish, one per transaction", f"{results['publish_per_tx_msg_s']:,.0f} msg/s", "publish_per_tx"))
    if "publish_many_msg_s" in results:
        rows.append(("publish_many (1,000 per call)", f"{results['publish_many_msg_s']:,.0f} msg/s", "publish_many"))
    for key, groups in (("consume_1_group", "1 group"), ("consume_3_groups", "3 groups")):
        if f"{key}_s" in results:
            rows.append(
                (
                    f"consume {opts.consume:,}, {groups}",
                    f"{results[f'{key}_deliveries_s']:,.0f} deliveries/s ({results[f'{key}_s']:.1f} s)",
                    key,
                )
            )
    if "p50_ms" in results:
        rows += [
            (
                f"end to end at {opts.rate:.0f} msg/s ({results['e2e_published_msg_s']:.0f} reached)",
                f"p50 {results['p50_ms']:.1f} ms, p99 {results['p99_ms']:.1f} ms, max {results['max_ms']:.1f} ms",
                "end_to_end",
            ),
            ("largest lag sampled", f"{results['max_lag']:.0f} messages", "end_to_end"),
        ]
    for name, value, when in rows:
        print(f"  {name:<34} {value:<44} load {load[when]:.1f}")
    print(
        json.dumps({**{k: round(v, 2) for k, v in results.items()}, "load": {k: round(v, 2) for k, v in load.items()}})
    )


if __name__ == "__main__":
    main()

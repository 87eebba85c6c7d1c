#!/usr/bin/env python
"""Pay for what you use, measured: a plain queue on the shipped build against the same code with
the features' probes taken out of a plain job's path (``benchmarks/stripped.py``).

Each repeat runs both builds, alternating which goes first: single enqueue (``--enqueue`` jobs,
one per transaction) and a drain of ``--drain`` no-op jobs by one ``runworker -c 8`` process,
with the worker's and PostgreSQL's CPU per job. Prints the medians and what the features cost
the plain job (shipped / stripped - 1). Same database and harness as ``benchmarks/peers.py``
(``bench_peers_dj``, dropped and re-created).

    .venv/bin/python benchmarks/plain_ab.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402 - sets the environment the Django side reads

BUILDS = ("shipped", "stripped")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--enqueue", type=int, default=2_000)
    parser.add_argument("--drain", type=int, default=20_000)
    opts = parser.parse_args()
    opts.sizes = peers.Sizes()

    peers.create_database(peers.DJ_DB)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from benchmarks import stripped

    system = peers.DjangoJobs(opts)
    figures: dict[str, dict[str, list[float]]] = {b: {"enqueue": [], "drain": [], "cpu": [], "pg": []} for b in BUILDS}
    for run in range(opts.runs):
        order = BUILDS if run % 2 == 0 else BUILDS[::-1]
        for build in order:
            os.environ["JOBS_BENCH_STRIPPED"] = "1" if build == "stripped" else "0"
            if build == "stripped":
                stripped.apply()
            try:
                figures[build]["enqueue"].append(system.enqueue(opts.enqueue))
            finally:
                stripped.undo()
            result = peers.drain(system, opts.drain, 1)
            figures[build]["drain"].append(result.rate)
            figures[build]["cpu"].append(result.cpu_us)
            figures[build]["pg"].append(result.pg_us or 0.0)
            f = figures[build]
            peers.say(
                f"run {run + 1} {build}: enqueue {f['enqueue'][-1]:,.0f}/s, drain {f['drain'][-1]:,.0f}/s, "
                f"worker {f['cpu'][-1]:.0f} us/job, PostgreSQL {f['pg'][-1]:.0f} us/job"
            )
    print(f"median of {opts.runs} alternating runs; cost = shipped / stripped - 1 (rates: stripped / shipped - 1)")
    for key, label, unit, higher in (
        ("enqueue", "enqueue, 1 job per transaction", "jobs/s", True),
        ("drain", "drain, 1 process -c 8", "jobs/s", True),
        ("cpu", "worker CPU per job", "us", False),
        ("pg", "PostgreSQL CPU per job", "us", False),
    ):
        a, b = (statistics.median(figures[x][key]) for x in BUILDS)
        cost = (b / a - 1) if higher else (a / b - 1)
        print(f"  {label:32} shipped {a:10,.0f} {unit:6} stripped {b:10,.0f} {unit:6} cost {cost:+.1%}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""A chaos run against a real PostgreSQL: are jobs lost, stuck or run twice, and are the outcomes
written reported as they were written, while connections drop, answers go missing after the
server committed and workers die?

The run:

- ``--jobs`` (default 20,000) jobs of ``benchmarks.chaos.step``, enqueued from this process at
  ``--rate`` jobs/s (default 100; 0: all before the workers start) in waves of half a second,
  once the workers have registered, straight to PostgreSQL (the enqueues are not faulted). ``--partitioned`` of them (default 10 %)
  run in ``--partitions`` partitions (default 50), in chains of ``--chain`` consecutive jobs
  (default 5) of one partition, so partition order and the unblocking of a partition's next job
  are exercised under the faults. Each job sleeps 0 to ``2 x --job-ms`` ms (mean ``--job-ms``,
  default 50), so a worker holds some running jobs when it is killed.
- Every execution records itself: a start line and an end line (job key, job id, attempt, time,
  pid) appended to its worker process's file in a probe directory, and every ``task_finished``
  the worker sends (job id, status, pid): one ``write`` of an ``O_APPEND`` file each, no database
  round trip.
- ``--workers`` ``manage.py runworker -c 8`` processes (default 2, ``--concurrency``), each
  connected through ``tests/faultproxy.py`` (SSL off, ``application_name`` ``chaos-worker``),
  with a ``--lease`` of 5 s and a rescuer every second, so a job whose worker died is rescued
  within the run. The worker ids are ``chaos-1``, ``chaos-2``, ... in start order.
- The chaos loop, for the whole run, every 1 to 2 s (``--min-interval``, ``--max-interval``):
  cuts every proxied connection (``kill_connections()``); arms one trap that drops the answer to
  a statement the server then commits, rotating the claim, the outcome batch and the
  ``pg_notify`` wake-up after an outcome batch freed a partition's next job (the patterns of
  tests/test_lost_answers.py; a trap still waiting for its statement is not armed twice); every
  ``--terminate-every`` cycles (default 3), half-way through the cycle, ``pg_terminate_backend``
  on the workers' backends; every ``--kill-every`` cycles (default 10) SIGKILLs the worker
  holding the most active jobs and starts a replacement. Each fault is logged with its time in
  ``chaos.tsv`` of the run directory, to read beside the worker logs.

When every job has finished (or at ``--timeout``, default the enqueueing time plus 300 s; the
chaos then stops and the workers get a quiet minute to recover), the workers are stopped with
SIGTERM (once each has registered, so none is signalled mid-start-up) and the run is judged from
the job rows, the probe files and the worker logs:

- **lost**: not completed (failed, with the error's class, or still unfinished: **stuck**), or
  completed in the database without any execution having run to its end, or with another
  return value than its own key;
- **ran to its end more than once**: re-runs explained by a SIGKILL (the job ran in a killed
  worker and was rescued) or by a lease that expired while its worker lived (rescued, and that
  worker's outcome was dropped), and **unexplained** ones (a job never rescued that ran to its
  end twice);
- **reported**: each completed job must have exactly one ``task_finished`` (none is acceptable
  only when the worker that wrote the outcome was SIGKILLed right after its commit), none for a
  job that did not complete; the "Dropped the ... outcome" warnings of all workers, split into
  those for a job that was rescued (its outcome really was refused) and the rest; each worker
  stopped by SIGTERM: its stop summary's completed count against its ``task_finished`` and the
  rows it completed;
- **partition order**: a partition's job must not start before the previous job of its
  partition finished (its ``finished_at``); for the jobs enqueued before their predecessor
  finished, the hand-over (predecessor's ``finished_at`` to the job's first start) is reported,
  max, p99 and the three slowest, each saying whether the worker that completed the predecessor
  was SIGKILLed (then the next job waits for the leader's PartitionSweeper, or, when the leader
  was the one killed, for a new leader);
- the longest a job stayed ``active`` past its lease's expiry and the most unfinished jobs at
  once (sampled every 0.5 s); pickup latency p50/p99/max (``enqueued_at`` to the ``started_at``
  of the attempt that completed the job, so a rescued job's wait is in it);
- the chaos counts: cycles, connections cut, traps armed and fired per statement, backends
  terminated, SIGKILLs, unexpected worker exits; elapsed time.

Prints a table and, last, one JSON line. Exits 1 when a job was lost, stuck, ran twice without
explanation or was misreported (the run directory with the worker logs and probe files is then
kept and named). Uses its own database, ``JOBS_BENCH_DB`` (default ``jobs_bench_chaos``; dropped
and re-created), on the server named by ``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Not the other benchmarks' databases: they may run at the same time.
os.environ.setdefault("JOBS_BENCH_DB", "jobs_bench_chaos")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from django.db import connection  # noqa: E402 - after the environment it reads
from django.tasks import task  # noqa: E402
from django.tasks.signals import task_finished  # noqa: E402

from benchmarks import throughput as tp  # noqa: E402
from benchmarks.tasks import _append  # noqa: E402
from django_jobs.states import UNFINISHED_STATES  # noqa: E402
from tests.faultproxy import FaultProxy, Trap  # noqa: E402 - a plain module, no test machinery

#: The environment variable naming the probe directory in the workers.
PROBE_ENV = "JOBS_CHAOS_PROBE"
TASK_PATH = "benchmarks.chaos.step"
APP_NAME = "chaos-worker"

#: The statements whose answers the traps drop (their text in django_jobs/engine.py, as in
#: tests/test_lost_answers.py).
TRAPS = {
    "claim": b"SET state = 'active'",  # claim_jobs
    "outcomes": b"lease_token = v.token",  # record_outcomes
    "notify": b"SELECT pg_notify(",  # notify(): the wake-up after an outcome batch freed a partition
}

SUMMARY = re.compile(
    r"(\d+) jobs? finished in [\d.]+s: (\d+) completed, (\d+) failed[^;]*; \d+ attempts? \([\d.]+/s\), (\d+) retried"
)
DROPPED = re.compile(r"Dropped the (\w+) outcome of job ([0-9a-f-]{36})")
SWEPT = re.compile(r"partition_sweeper: \{'unblocked': (\d+)\}")


# -- the job and its probe (imported by the workers) ---------------------------------------------


@task(takes_context=True)
def step(context, out: str, n: int, partition: str | None, sleep_ms: int) -> int:
    """Job ``n`` of the chaos run: records ``S`` before and ``E`` after sleeping ``sleep_ms``
    (key, job id, attempt, time.time(), pid) in ``out/<pid>.tsv``; returns ``n``."""
    head = f"{n}\t{context.task_result.id}\t{context.attempt}"
    _append(out, f"S\t{head}\t{time.time():.6f}\t{os.getpid()}\n")
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    _append(out, f"E\t{head}\t{time.time():.6f}\t{os.getpid()}\n")
    return n


def _record_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    if task_result.task.module_path == TASK_PATH:
        _append(
            os.environ[PROBE_ENV],
            f"F\t{task_result.id}\t{task_result.status}\t{time.time():.6f}\t{os.getpid()}\n",
        )


if os.environ.get(PROBE_ENV):
    # A worker records each task_finished it sends (connected when the worker imports this
    # module to run its first job, before that job's signal).
    task_finished.connect(_record_finished, dispatch_uid="benchmarks.chaos.record_finished")


# -- the orchestrator ---------------------------------------------------------------------------


def fail(message: str) -> None:
    print(f"benchmarks/chaos.py: {message}", file=sys.stderr)
    sys.exit(2)


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Plan:
    jobs: int
    partitioned: float
    partitions: int
    chain: int
    job_ms: int

    def partition_of(self, n: int) -> str | None:
        """Job ``n``'s partition: in each block of ``chain / partitioned`` jobs the first
        ``chain`` are one partition's chain; the blocks go round the partitions."""
        if self.partitioned <= 0:
            return None
        block = max(self.chain, round(self.chain / self.partitioned))
        return f"p{(n // block) % self.partitions}" if n % block < self.chain else None

    def sleep_ms(self, n: int) -> int:
        return (n * 37) % (2 * self.job_ms + 1) if self.job_ms else 0


class Enqueuer(threading.Thread):
    """Enqueues the plan's jobs at ``rate`` jobs/s (0: at once) in waves of half a second: the
    plain jobs of a wave in one ``enqueue_many``, each partition chain in one more."""

    def __init__(self, job: Any, plan: Plan, out: str, rate: float):
        super().__init__(name="chaos-enqueuer", daemon=True)
        self.job, self.plan, self.out, self.rate = job, plan, out, rate
        self.enqueued = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        wave = max(1, round(self.rate / 2)) if self.rate else 2_000
        started = time.monotonic()
        try:
            for first in range(0, self.plan.jobs, wave):
                if self.rate:
                    pause = started + first / self.rate - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                self.enqueue(range(first, min(first + wave, self.plan.jobs)))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
        finally:
            connection.close()

    def enqueue(self, keys: range) -> None:
        groups: dict[str | None, list[int]] = defaultdict(list)
        for n in keys:
            groups[self.plan.partition_of(n)].append(n)
        for partition, ns in groups.items():
            task_ = self.job.using(partition=partition) if partition else self.job
            task_.enqueue_many((self.out, n, partition, self.plan.sleep_ms(n)) for n in ns)
            self.enqueued += len(ns)


@dataclass
class WorkerProc:
    worker_id: str
    proc: subprocess.Popen
    log_path: Path
    killed: bool = False
    stopped: bool = False  # by our SIGTERM at the end
    exit_code: int | None = None


class Fleet:
    """The ``runworker`` processes, through the proxy; replaced when killed or when they exit."""

    def __init__(self, args: list[str], env: dict[str, str], logs: Path):
        self.args, self.env, self.logs = args, env, logs
        self.workers: list[WorkerProc] = []
        self.unexpected: list[WorkerProc] = []

    def start(self) -> WorkerProc:
        worker_id = f"chaos-{len(self.workers) + 1}"
        log_path = self.logs / f"{worker_id}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                tp.worker_command(*self.args, "--worker-id", worker_id),
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
        worker = WorkerProc(worker_id, proc, log_path)
        self.workers.append(worker)
        return worker

    @property
    def alive(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.proc.poll() is None]

    def kill(self, worker: WorkerProc) -> None:
        worker.killed = True
        worker.proc.kill()  # SIGKILL
        worker.exit_code = worker.proc.wait()

    def replace_exited(self) -> None:
        """A worker that exited on its own (a crash) is a finding: keep it, start another."""
        for w in self.workers:
            if not w.killed and w.exit_code is None and w.proc.poll() is not None:
                w.exit_code = w.proc.returncode
                self.unexpected.append(w)
                note(f"  worker {w.worker_id} exited with {w.exit_code} on its own:\n{tail(w.log_path)}")
                self.start()

    def registered(self) -> bool:
        """Every live worker has its Worker row, so its signal handlers are in place (a SIGTERM
        during a worker's start-up would end the process before it can stop gracefully)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT id FROM django_jobs_worker")
            rows = {r[0] for r in cursor.fetchall()}
        return all(w.worker_id in rows for w in self.alive)

    def stop(self) -> None:
        deadline = time.monotonic() + 60
        while not self.registered() and time.monotonic() < deadline:
            time.sleep(0.1)
        running = self.alive
        tp.stop_processes([w.proc for w in running])
        for w in running:
            w.stopped, w.exit_code = True, w.proc.returncode


def tail(path: Path, lines: int = 15) -> str:
    return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])


@dataclass
class Chaos:
    #: Where each fault is logged (time.time(), what), to read beside the worker logs.
    timeline: Path
    cycles: int = 0
    proxy_cuts: int = 0
    connections_cut: int = 0
    terminations: int = 0
    backends_terminated: int = 0
    sigkills: int = 0
    armed: Counter = field(default_factory=Counter)
    traps: list[tuple[str, Trap]] = field(default_factory=list)
    kills: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), worker id)

    def pending(self, name: str) -> bool:
        return any(n == name and t.fired < t.count for n, t in self.traps)

    def log(self, what: str) -> None:
        with open(self.timeline, "a") as fh:
            fh.write(f"{time.strftime('%H:%M:%S')}.{int(time.time() % 1 * 1000):03d}\t{what}\n")


@dataclass
class Watch:
    """Sampled while the run goes: the longest a job stayed active past its lease's expiry."""

    longest_overdue: float = 0.0
    most_unfinished: int = 0
    samples: int = 0
    completed: int = 0
    unfinished: int = 0

    def sample(self) -> None:
        completed, unfinished, overdue = tp.scalar(
            "SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = ANY(%s)), "
            "COALESCE(EXTRACT(EPOCH FROM max(now() - lease_expires_at) FILTER (WHERE state = 'active')), 0) "
            "FROM django_jobs_job",
            [list(UNFINISHED_STATES)],
        )
        self.completed, self.unfinished = completed, unfinished
        self.most_unfinished = max(self.most_unfinished, unfinished)
        self.longest_overdue = max(self.longest_overdue, float(overdue))
        self.samples += 1


def source_state() -> str:
    """The commit the workers run (read-only git), "+changes" when django_jobs/ differs from it:
    a replacement worker imports the code as it is on disk when it starts."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip() if out.returncode == 0 else "?"

    return git("rev-parse", "--short", "HEAD") + (
        "+changes" if git("status", "--porcelain", "--", "django_jobs") else ""
    )


def terminate_worker_backends() -> int:
    with tp.connect_raw(tp.DB_NAME, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            [tp.DB_NAME, APP_NAME],
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


def holding_most(fleet: Fleet) -> WorkerProc | None:
    """The live worker holding the most active jobs (a kill then strands the most)."""
    alive = {w.worker_id: w for w in fleet.alive}
    if not alive:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT worker_id, count(*) FROM django_jobs_job WHERE state = 'active' GROUP BY worker_id ORDER BY 2 DESC"
        )
        for worker_id, _ in cursor.fetchall():
            if worker_id in alive:
                return alive[worker_id]
    return random.choice(list(alive.values()))


def chaos_cycle(i: int, opts: argparse.Namespace, proxy: FaultProxy, fleet: Fleet, chaos: Chaos) -> None:
    """The faults at the start of cycle ``i``: a SIGKILL when due, the cut, one trap."""
    if opts.kill_every and i % opts.kill_every == opts.kill_every // 2:
        victim = holding_most(fleet)
        if victim is not None:
            fleet.kill(victim)
            chaos.sigkills += 1
            chaos.kills.append((time.time(), victim.worker_id))
            chaos.log(f"SIGKILL {victim.worker_id} (pid {victim.proc.pid}); started {fleet.start().worker_id}")
    cut = proxy.kill_connections()
    chaos.connections_cut += cut
    chaos.proxy_cuts += 1
    name = list(TRAPS)[i % len(TRAPS)]
    armed = not chaos.pending(name)
    if armed:
        chaos.traps.append((name, proxy.arm(TRAPS[name])))
        chaos.armed[name] += 1
    chaos.log(f"cycle {i}: cut {cut} connection(s)" + (f"; armed the {name} trap" if armed else ""))
    chaos.cycles += 1


def run_chaos(
    opts: argparse.Namespace, proxy: FaultProxy, fleet: Fleet, enqueuer: Enqueuer, chaos: Chaos, watch: Watch
) -> bool:
    """Faults until every job finished (True) or ``--timeout`` (False)."""
    started = time.monotonic()
    last_note = started
    i = 0
    while True:
        chaos_cycle(i, opts, proxy, fleet, chaos)
        cycle = random.uniform(opts.min_interval, opts.max_interval)
        end, half = time.monotonic() + cycle, time.monotonic() + cycle / 2
        terminate = opts.terminate_every and i % opts.terminate_every == opts.terminate_every - 1
        while (now := time.monotonic()) < end:
            if terminate and now >= half:
                terminated = terminate_worker_backends()
                chaos.backends_terminated += terminated
                chaos.terminations += 1
                chaos.log(f"pg_terminate_backend: {terminated} backend(s)")
                terminate = False
            all_enqueued = not enqueuer.is_alive() and enqueuer.enqueued == opts.jobs  # before the count
            watch.sample()
            fleet.replace_exited()
            if enqueuer.error is not None:
                fleet.stop()
                fail(f"enqueueing failed: {enqueuer.error!r}")
            if all_enqueued and watch.unfinished == 0:
                return True
            if now - started > opts.timeout:
                return False
            if now - last_note > 10:
                last_note = now
                note(
                    f"  {now - started:5.0f}s enqueued {enqueuer.enqueued:,} completed {watch.completed:,} "
                    f"unfinished {watch.unfinished:,}; cuts {chaos.proxy_cuts}, traps fired "
                    f"{sum(t.fired for _, t in chaos.traps)}, sigkills {chaos.sigkills}"
                )
            time.sleep(min(0.5, max(0.0, end - time.monotonic())))
        i += 1


# -- the verdict --------------------------------------------------------------------------------


@dataclass
class Execution:
    n: int
    job_id: str
    attempt: int
    pid: int
    start: float
    end: float | None = None


def read_probe(directory: Path) -> tuple[list[Execution], list[tuple[str, str, int]]]:
    """The executions (a start line, then unless the process died an end line) and the
    ``task_finished`` records (job id, status, pid) in the probe files."""
    executions: list[Execution] = []
    finished: list[tuple[str, str, int]] = []
    for path in sorted(directory.glob("*.tsv")):
        running: dict[str, list[Execution]] = defaultdict(list)
        for line in path.read_text().splitlines():
            kind, *rest = line.split("\t")
            if kind == "F":
                job_id, status, _, pid = rest
                finished.append((job_id, status, int(pid)))
            elif kind == "S":
                n, job_id, attempt, at, pid = rest
                e = Execution(int(n), job_id, int(attempt), int(pid), float(at))
                running[job_id].append(e)
                executions.append(e)
            else:
                n, job_id, attempt, at, pid = rest
                running[job_id].pop(0).end = float(at)
    return executions, finished


@dataclass
class Row:
    n: int
    job_id: str
    partition: str | None
    state: str
    stalled: int
    worker_id: str | None
    return_value: str | None  # as JSON text
    error_class: str | None
    enqueued_at: float
    finished_at: float | None


def job_rows() -> list[Row]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (args->>1)::int, id::text, partition_key, state, stalled_count, worker_id, return_value::text, "
            "errors->-1->>'exception_class_path', EXTRACT(EPOCH FROM enqueued_at), "
            "EXTRACT(EPOCH FROM finished_at) FROM django_jobs_job WHERE task_path = %s",
            [TASK_PATH],
        )
        return [
            Row(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], float(r[8]), float(r[9]) if r[9] else None)
            for r in cursor.fetchall()
        ]


def judge(
    plan: Plan, fleet: Fleet, run_dir: Path, proxy: FaultProxy, chaos: Chaos, watch: Watch
) -> tuple[dict[str, Any], list[str]]:
    """The figures of the run, and the problems found (each with its evidence)."""
    rows = job_rows()
    executions, finished = read_probe(run_dir / "probe")
    by_n = {r.n: r for r in rows}
    by_id = {r.job_id: r for r in rows}
    pid_of = {w.worker_id: w.proc.pid for w in fleet.workers}
    killed_pids = {w.proc.pid for w in fleet.workers if w.killed}
    logs = {w.worker_id: w.log_path.read_text(errors="replace") for w in fleet.workers}
    problems: list[str] = []

    states = Counter(r.state for r in rows)
    missing = sorted(set(range(plan.jobs)) - set(by_n))
    stuck = [r for r in rows if r.state in UNFINISHED_STATES]
    failed = [r for r in rows if r.state == "failed"]
    ends: dict[int, list[Execution]] = defaultdict(list)
    starts: dict[int, list[Execution]] = defaultdict(list)
    for e in executions:
        starts[e.n].append(e)
        if e.end is not None:
            ends[e.n].append(e)
    completed = [r for r in rows if r.state == "completed"]
    never_ran = [r for r in completed if not ends[r.n]]
    wrong_value = [r for r in completed if r.return_value != json.dumps(r.n)]
    lost = len(missing) + len(stuck) + len(failed) + len(never_ran) + len(wrong_value)
    if missing:
        problems.append(f"{len(missing)} enqueued job(s) have no row: keys {missing[:10]}")
    for label, found in (
        ("still unfinished (stuck)", stuck),
        ("failed", failed),
        ("completed without any execution ending", never_ran),
        ("completed with another return value than their key", wrong_value),
    ):
        if found:
            problems.append(f"{len(found)} job(s) {label}: " + "; ".join(describe(r, starts, ends) for r in found[:10]))

    # Executions that ran to their end more than once.
    twice = {n: es for n, es in ends.items() if len(es) > 1 and n in by_n}  # a missing row is reported above
    after_kill = {n for n, es in twice.items() if by_n[n].stalled and any(e.pid in killed_pids for e in es)}
    after_expiry = {n for n in twice if by_n[n].stalled and n not in after_kill}
    unexplained = sorted(set(twice) - after_kill - after_expiry)
    if unexplained:
        problems.append(
            f"{len(unexplained)} job(s) ran to their end more than once without being rescued: "
            + "; ".join(describe(by_n[n], starts, ends) for n in unexplained[:10])
        )
    # Starts without an end in a worker that was not killed: an execution vanished.
    vanished = [e for e in executions if e.end is None and e.pid not in killed_pids]
    if vanished:
        problems.append(
            f"{len(vanished)} execution(s) started and never ended in a worker that was not killed: "
            + "; ".join(f"key {e.n} job {e.job_id} pid {e.pid}" for e in vanished[:10])
        )

    # task_finished: once per completed job, never for one that did not complete.
    signals = Counter(job_id for job_id, status, _ in finished if status == "SUCCESSFUL")
    other_signals = [(j, s, p) for j, s, p in finished if s != "SUCCESSFUL"]
    unsignalled = [r for r in completed if signals[r.job_id] == 0]
    writer_killed = [r for r in unsignalled if pid_of.get(r.worker_id or "") in killed_pids]
    unsignalled_alive = [r for r in unsignalled if r not in writer_killed]
    signalled_twice = [r for r in completed if signals[r.job_id] > 1]
    signalled_not_completed = [j for j in signals if j not in by_id or by_id[j].state != "completed"]
    for label, found in (
        ("completed but task_finished never sent by their (live) worker", unsignalled_alive),
        ("with task_finished sent more than once", signalled_twice),
    ):
        if found:
            problems.append(f"{len(found)} job(s) {label}: " + "; ".join(describe(r, starts, ends) for r in found[:10]))
    if signalled_not_completed:
        problems.append(f"task_finished SUCCESSFUL for {len(signalled_not_completed)} job(s) not completed")
    if other_signals:
        problems.append(f"{len(other_signals)} task_finished with another status: {other_signals[:10]}")

    # "Dropped the ... outcome" warnings: fine for a job that was rescued meanwhile.
    dropped = [(wid, m.group(1), m.group(2), line) for wid, log in logs.items() for line in log.splitlines()
               if (m := DROPPED.search(line))]  # fmt: skip
    dropped_unexplained = [d for d in dropped if d[2] not in by_id or not by_id[d[2]].stalled]
    if dropped_unexplained:
        problems.append(
            f"{len(dropped_unexplained)} outcome(s) reported dropped for a job that was never rescued:\n    "
            + "\n    ".join(
                f"{wid}: {line.strip()}  [{describe(by_id[j], starts, ends)}]" if j in by_id else line
                for wid, _, j, line in dropped_unexplained[:10]
            )  # fmt: skip
        )

    # Stop summaries of the workers stopped by SIGTERM against their signals and rows.
    db_by_worker = Counter(r.worker_id for r in completed)
    signals_by_pid = Counter(p for _, s, p in finished if s == "SUCCESSFUL")
    per_worker = []
    for w in fleet.workers:
        found = SUMMARY.findall(logs[w.worker_id])
        summary = tuple(int(x) for x in found[-1]) if found else None
        entry = {
            "worker": w.worker_id,
            "end": "SIGKILL" if w.killed else "SIGTERM" if w.stopped else f"exited {w.exit_code}",
            "summary_completed": summary[1] if summary else None,
            "task_finished": signals_by_pid[w.proc.pid],
            "db_completed": db_by_worker[w.worker_id],
        }
        per_worker.append(entry)
        if w.stopped and w.exit_code != 0:
            problems.append(f"worker {w.worker_id} exited with {w.exit_code} after SIGTERM:\n{tail(w.log_path)}")
        if w.stopped and (summary is None or not summary[1] == entry["task_finished"] == entry["db_completed"]):
            problems.append(f"worker {w.worker_id}: stop summary {summary} against {entry}")
        if w.killed and entry["task_finished"] > entry["db_completed"]:
            problems.append(f"killed worker {w.worker_id} reported more completions than it wrote: {entry}")
    for w in fleet.unexpected:
        problems.append(f"worker {w.worker_id} exited with {w.exit_code} on its own:\n{tail(w.log_path)}")

    # Partition order: no job starts before its predecessor's finish is committed.
    by_partition: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.partition:
            by_partition[r.partition].append(r)
    early: list[tuple[Row, Row, float]] = []
    handovers: list[tuple[float, Row, Row]] = []
    for jobs in by_partition.values():
        jobs.sort(key=lambda r: r.n)
        for before, after in zip(jobs, jobs[1:], strict=False):
            if not starts[after.n] or before.finished_at is None:
                continue
            first = min(e.start for e in starts[after.n])
            if first < before.finished_at:
                early.append((before, after, before.finished_at - first))
            elif after.enqueued_at < before.finished_at:  # it waited for its predecessor
                handovers.append((first - before.finished_at, before, after))
    if early:
        problems.append(
            f"{len(early)} partition job(s) started before their predecessor finished: "
            + "; ".join(
                f"key {a.n} started {gap:.3f}s before key {b.n} ({b.partition}) finished" for b, a, gap in early[:10]
            )
        )
    handovers.sort(key=lambda h: -h[0])
    # A worker SIGKILLed (or cut off) between an outcome's commit and the freeing of its
    # partition's next job leaves that job to the leader's PartitionSweeper; when the leader is
    # the one killed, a new leader takes over once its heartbeat is LEASE_SECONDS old.
    slowest = [
        {
            "partition": b.partition,
            "keys": [b.n, a.n],
            "seconds": round(gap, 3),
            "predecessor_written_by": b.worker_id,
            "that_worker_was_sigkilled": pid_of.get(b.worker_id or "") in killed_pids,
            "sigkilled_meanwhile": [
                w for t, w in chaos.kills if (b.finished_at or 0) - 1 <= t <= (b.finished_at or 0) + gap
            ],
        }
        for gap, b, a in handovers[:3]
    ]

    cuts = proxy.cuts
    fired = Counter(name for name, t in chaos.traps for _ in range(t.fired))
    rescued_lines = sum(log.count("Rescued stalled job") for log in logs.values())
    swept = sum(int(n) for log in logs.values() for n in SWEPT.findall(log))
    handed_back = sum(log.count("a claim committed but its answer was lost") for log in logs.values())
    figures = {
        "jobs": plan.jobs,
        "partitioned_jobs": sum(1 for r in rows if r.partition),
        "completed": states["completed"],
        "lost": lost,
        "failed": len(failed),
        "stuck": len(stuck),
        "missing_rows": len(missing),
        "completed_without_execution": len(never_ran),
        "wrong_return_value": len(wrong_value),
        "executions_started": len(executions),
        "executions_ended": sum(len(es) for es in ends.values()),
        "ran_to_end_more_than_once": len(twice),
        "rerun_after_sigkill": len(after_kill),
        "rerun_after_lease_expiry": len(after_expiry),
        "rerun_unexplained": len(unexplained),
        "vanished_executions": len(vanished),
        "executions_cut_by_sigkill": sum(1 for e in executions if e.end is None and e.pid in killed_pids),
        "rescued_jobs": sum(1 for r in rows if r.stalled),
        "rescue_log_lines": rescued_lines,
        "lost_claims_handed_back": handed_back,
        # Logged at INFO: the freeing of a partition's next job (after an outcome batch) and the
        # NOTIFY after it that failed, and what the leader's PartitionSweeper freed instead.
        "partition_unblock_failed": sum(log.count("Freeing the next jobs of") for log in logs.values()),
        "partition_notify_failed": sum(log.count("Waking the workers of") for log in logs.values()),
        "sweeper_unblocked": swept,
        "task_finished_exactly_once": sum(1 for r in completed if signals[r.job_id] == 1),
        "task_finished_missing_writer_killed": len(writer_killed),
        "task_finished_missing_unexplained": len(unsignalled_alive),
        "task_finished_twice": len(signalled_twice),
        "dropped_outcome_lines": len(dropped),
        "dropped_after_rescue": len(dropped) - len(dropped_unexplained),
        "dropped_unexplained": len(dropped_unexplained),
        "workers": per_worker,
        "partition_order_violations": len(early),
        "partition_handover_max_s": round(handovers[0][0] if handovers else 0.0, 3),
        "partition_handover_p99_s": round(percentile([h[0] for h in handovers], 99), 3),
        "partition_handover_slowest": slowest,
        "longest_expired_lease_s": round(watch.longest_overdue, 2),
        "most_unfinished": watch.most_unfinished,
        "pickup_p50_p99_max_s": pickup_latency(),
        "chaos_cycles": chaos.cycles,
        "proxy_cuts": chaos.proxy_cuts,
        "connections_cut": chaos.connections_cut,
        "connections_accepted": proxy.connections,
        "traps_armed": dict(chaos.armed),
        "traps_fired": dict(fired),
        "trap_cuts_in_failed_transaction": sum(1 for c in cuts if c.error_seen),
        # Rows answering the trapped statements: the jobs a lost claim took, the outcomes a lost
        # batch wrote.
        "trapped_rows": dict(sum((Counter({name_of(c.pattern): c.rows}) for c in cuts), Counter())),
        "pg_terminate_rounds": chaos.terminations,
        "backends_terminated": chaos.backends_terminated,
        "sigkills": chaos.sigkills,
        "unexpected_worker_exits": len(fleet.unexpected),
    }
    return figures, problems


def pickup_latency() -> list[float]:
    """p50, p99 and max of enqueue -> start of the attempt that completed the job (a rescued or
    handed-back job's wait included), seconds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY s), max(s) FROM "
            "(SELECT EXTRACT(EPOCH FROM started_at - enqueued_at) AS s FROM django_jobs_job WHERE task_path = %s) t",
            [TASK_PATH],
        )
        (p50, p99), most = cursor.fetchone()
    return [round(float(v or 0), 3) for v in (p50, p99, most)]


def name_of(pattern: bytes) -> str:
    return next(name for name, p in TRAPS.items() if p == pattern)


def describe(r: Row, starts: dict[int, list[Execution]], ends: dict[int, list[Execution]]) -> str:
    runs = ", ".join(
        f"pid {e.pid} attempt {e.attempt} {'ended' if e.end is not None else 'cut'}" for e in starts.get(r.n, [])
    )
    return (
        f"key {r.n} job {r.job_id} {r.state}{f' ({r.error_class})' if r.error_class else ''} "
        f"partition {r.partition} stalled {r.stalled} worker {r.worker_id}; runs: [{runs}]"
    )


def percentile(values: list[float], p: float) -> float:
    return tp.percentile(sorted(values), p) if values else 0.0


TABLE = [
    ("jobs enqueued", "jobs"),
    ("  of them in partitions", "partitioned_jobs"),
    ("completed", "completed"),
    ("lost (not completed, or completed wrongly)", "lost"),
    ("  failed", "failed"),
    ("  stuck (unfinished at the end)", "stuck"),
    ("ran to the end more than once", "ran_to_end_more_than_once"),
    ("  re-run after a SIGKILL", "rerun_after_sigkill"),
    ("  re-run after a lease expired", "rerun_after_lease_expiry"),
    ("  unexplained", "rerun_unexplained"),
    ("executions cut short by a SIGKILL", "executions_cut_by_sigkill"),
    ("jobs rescued (lease expired)", "rescued_jobs"),
    ("lost claims handed back (log lines)", "lost_claims_handed_back"),
    ("partition unblock / its NOTIFY failed", ("partition_unblock_failed", "partition_notify_failed")),
    ("  next jobs freed by the sweeper instead", "sweeper_unblocked"),
    ("task_finished exactly once", "task_finished_exactly_once"),
    ("  missing, writer SIGKILLed", "task_finished_missing_writer_killed"),
    ("  missing otherwise", "task_finished_missing_unexplained"),
    ("  more than once", "task_finished_twice"),
    ('"Dropped the ... outcome" lines', "dropped_outcome_lines"),
    ("  for a rescued job", "dropped_after_rescue"),
    ("  unexplained", "dropped_unexplained"),
    ("partition order violations", "partition_order_violations"),
    ("partition hand-over, max / p99 (s)", ("partition_handover_max_s", "partition_handover_p99_s")),
    ("longest active past its lease (s)", "longest_expired_lease_s"),
    ("pickup p50 / p99 / max (s)", "pickup_p50_p99_max_s"),
    ("most unfinished jobs at once", "most_unfinished"),
    ("chaos cycles", "chaos_cycles"),
    ("proxy cuts / connections cut", ("proxy_cuts", "connections_cut")),
    ("traps armed", "traps_armed"),
    ("traps fired", "traps_fired"),
    ("rows in the trapped answers", "trapped_rows"),
    ("pg_terminate rounds / backends", ("pg_terminate_rounds", "backends_terminated")),
    ("SIGKILLs (each worker replaced)", "sigkills"),
    ("unexpected worker exits", "unexpected_worker_exits"),
    ("elapsed (s)", "elapsed_s"),
    ("completed per second", "rate"),
]


def show(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:,}" for k, v in sorted(value.items())) or "none"
    if isinstance(value, list):
        return " / ".join(show(v) for v in value)
    return f"{value:,}" if isinstance(value, (int, float)) else str(value)


def text_table(figures: dict[str, Any]) -> str:
    cells = [
        (label, " / ".join(show(figures[k]) for k in key) if isinstance(key, tuple) else show(figures[key]))
        for label, key in TABLE
    ]
    width = max(len(label) for label, _ in cells)
    lines = [f"{label.ljust(width)}  {value}" for label, value in cells]
    lines.append("")
    lines.append("worker     end       summary completed  task_finished  rows completed")
    for w in figures["workers"]:
        lines.append(
            f"{w['worker']:<10} {w['end']:<9} {show(w['summary_completed']):>17}  {w['task_finished']:>13,}  "
            f"{w['db_completed']:>14,}"
        )
    if figures["partition_handover_slowest"]:
        lines.append("")
        lines.append("slowest partition hand-overs (predecessor finished -> next job started):")
        for h in figures["partition_handover_slowest"]:
            killed = ", that worker was SIGKILLed" if h["that_worker_was_sigkilled"] else ""
            meanwhile = (
                f"; SIGKILLed meanwhile: {', '.join(h['sigkilled_meanwhile'])}" if h["sigkilled_meanwhile"] else ""
            )
            lines.append(
                f"  {h['seconds']:.3f}s {h['partition']} keys {h['keys'][0]} -> {h['keys'][1]} "
                f"(predecessor completed by {h['predecessor_written_by']}{killed}{meanwhile})"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs to enqueue; default 20,000")
    parser.add_argument("--rate", type=float, default=100.0, help="jobs enqueued per second (0: all at once)")
    parser.add_argument("--workers", type=int, default=2, help="runworker processes; default 2")
    parser.add_argument("--concurrency", type=int, default=8, help="runworker -c; default 8")
    parser.add_argument("--partitioned", type=float, default=0.10, help="share of jobs in partitions; 0.10")
    parser.add_argument("--partitions", type=int, default=50, help="partitions; default 50")
    parser.add_argument("--chain", type=int, default=5, help="consecutive jobs of one partition; default 5")
    parser.add_argument("--job-ms", type=int, default=50, help="mean sleep of a job (0 to twice this); 50")
    parser.add_argument("--lease", type=float, default=5.0, help="LEASE_SECONDS of the workers; default 5")
    parser.add_argument("--min-interval", type=float, default=1.0, help="shortest chaos cycle (s); 1")
    parser.add_argument("--max-interval", type=float, default=2.0, help="longest chaos cycle (s); 2")
    parser.add_argument("--terminate-every", type=int, default=3, help="pg_terminate_backend every N cycles")
    parser.add_argument("--kill-every", type=int, default=10, help="SIGKILL a worker every N cycles (0: never)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds of chaos at most")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the chaos loop")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs, probe files)")
    opts = parser.parse_args()
    if opts.timeout is None:
        opts.timeout = (opts.jobs / opts.rate if opts.rate else 0) + 300
    if opts.seed is not None:
        random.seed(opts.seed)
    plan = Plan(opts.jobs, opts.partitioned, opts.partitions, opts.chain, opts.job_ms)

    pg_version = tp.create_database(tp.DB_NAME)[0]
    tp.setup_django()
    run_dir = Path(tempfile.mkdtemp(prefix="jobs-chaos-"))
    (run_dir / "probe").mkdir()
    (run_dir / "logs").mkdir()
    proxy = FaultProxy(upstream=(tp.PG["host"], tp.PG["port"])).start()
    env = {
        **tp.worker_env(),
        "PGHOST": proxy.host,
        "PGPORT": str(proxy.port),
        "PGSSLMODE": "disable",  # the proxy reads the protocol in clear
        "PGAPPNAME": APP_NAME,  # pg_terminate_backend picks the workers' backends by it
        "JOBS_BENCH_LEASE_SECONDS": str(opts.lease),
        "JOBS_BENCH_RESCUE_INTERVAL": "1",
        PROBE_ENV: str(run_dir / "probe"),
    }
    # -v 1: the INFO lines say what the services did (the sweeper freeing a partition).
    fleet = Fleet(["-c", str(opts.concurrency), "-v", "1"], env, run_dir / "logs")
    chaos, watch = Chaos(run_dir / "chaos.tsv"), Watch()
    # The task under its importable path: this file runs as __main__, the workers import it.
    from benchmarks.chaos import step as job

    enqueuer = Enqueuer(job, plan, str(run_dir / "probe"), opts.rate)
    note(
        f"chaos run: {opts.jobs:,} jobs at {opts.rate:g}/s, {opts.workers} x runworker -c {opts.concurrency} through "
        f"the fault proxy (port {proxy.port}), lease {opts.lease:g}s; run directory {run_dir}"
    )
    load_before, source_before = os.getloadavg(), source_state()
    if not opts.rate:
        enqueuer.run()  # everything before the workers start
    for _ in range(opts.workers):
        fleet.start()
    # The clock starts once the workers are up: their start-up is not the faults' doing.
    deadline = time.monotonic() + 120
    while not fleet.registered():
        fleet.replace_exited()
        if time.monotonic() > deadline:
            fleet.stop()
            fail(f"the workers did not register within 120 s:\n{tail(fleet.workers[0].log_path)}")
        time.sleep(0.1)
    started = time.monotonic()
    if opts.rate:
        enqueuer.start()
    try:
        done = run_chaos(opts, proxy, fleet, enqueuer, chaos, watch)
        proxy.disarm()
        elapsed = time.monotonic() - started
        if not done:
            # Give the workers a quiet minute: what is still unfinished after it is stuck.
            note(f"  timeout after {elapsed:.0f}s with {watch.unfinished:,} unfinished; chaos stopped")
            deadline = time.monotonic() + max(60.0, 4 * opts.lease)
            while time.monotonic() < deadline and (enqueuer.is_alive() or watch.unfinished):
                time.sleep(0.5)
                watch.sample()
                fleet.replace_exited()
        fleet.stop()
    finally:
        for w in fleet.alive:
            w.proc.kill()
        proxy.stop()
    figures, problems = judge(plan, fleet, run_dir, proxy, chaos, watch)
    figures["finished_under_chaos"] = done
    figures["elapsed_s"] = round(elapsed, 1)
    figures["rate"] = round(figures["completed"] / elapsed, 1)
    figures["postgresql"] = pg_version
    source_after = source_state()
    figures["code"] = source_before if source_after == source_before else f"{source_before} -> {source_after}"
    figures["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    connection.close()

    report("chaos", text_table(figures), figures, problems, run_dir, keep=opts.keep)


def report(name: str, table: str, figures: dict[str, Any], problems: list[str], run_dir: Path, *, keep: bool) -> None:
    """Print a chaos run's table, its problems (keeping the run directory for them) and its
    JSON line, and exit 1 if there were problems; shared with benchmarks/bus_chaos.py."""
    print()
    print(table)
    print()
    if problems:
        print(f"PROBLEMS ({len(problems)}); worker logs and probe files kept in {run_dir}:")
        for p in problems:
            print(f"- {p}")
    elif keep:
        print(f"No problems found; run directory kept in {run_dir}.")
    else:
        print("No problems found.")
        shutil.rmtree(run_dir, ignore_errors=True)
    print(json.dumps({"benchmark": name, **figures}, default=str))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

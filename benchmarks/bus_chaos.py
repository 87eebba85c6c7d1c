#!/usr/bin/env python
"""Bus mode's chaos run (issue 16): does every consumer group see every message, in order per
partition, exactly once for an ``atomic=True`` handler, while workers are SIGKILLed mid-batch
and SIGSTOPped past their lease?

The run, on its own database (``JOBS_BENCH_DB``, default ``jobs_bus_chaos``; dropped and
re-created) on PostgreSQL (``PGHOST``/``PGPORT``/``PGUSER``/``PGPASSWORD``) or, with
``--db mysql``, MariaDB/MySQL (``MYSQL_HOST``/``MYSQL_TCP_PORT``/``MYSQL_USER``/``MYSQL_PWD``,
default 127.0.0.1:3306, root, no password):

- topic ``chaos`` with ``--partitions`` (100) x ``--messages`` (100) messages, published in
  publish order per partition with ``publish_many`` (payload ``n``, the message's rank in its
  partition), all before the workers start (``--rate 0``, the default) or at ``--rate``
  messages/s while they run; its lease is ``--lease`` seconds (5);
- three groups (benchmarks/bus_chaos_app/subscribers.py): ``audit`` with ``atomic=True``,
  ``billing`` and ``email``; batches of ``--batch`` (10), ``--threads`` (4) threads per group
  and process. Every delivery is recorded by the handler in its process's probe file (batch
  begun, each message handled, batch ended) and as one ``Write`` row per message through the ORM
  (``audit``'s rows commit with its cursor's move, the others' as written);
- ``--workers`` (2) ``manage.py runworker --topics chaos`` processes (ids ``chaos-1``, ...);
- traps, armed one after the other once the run is ``--trap-at`` (a random fraction between
  0.1 and 0.5 by default, from ``--seed``) through its deliveries: ``--kills`` (1) SIGKILLs and
  ``--stops`` (1) SIGSTOPs, aimed at the groups in turn (kills from ``audit``, stops from
  ``billing``). A trap is sprung by the first handler of its group to claim it on a first
  delivery: it handles half of its batch, says so, and waits; the script then SIGKILLs its
  process (and starts a replacement, as benchmarks/chaos.py does), or SIGSTOPs it, waits until
  another worker has taken the batch over (the lease expired), and SIGCONTs it: its late
  acknowledgement must be refused.

When every cursor has reached its partition's end (or at ``--timeout``, 600 s), the workers are
stopped with SIGTERM and the run is judged from the database (messages, cursors, dead letters,
the handlers' ``Write`` rows), the probe files and the worker logs:

- **every group saw every message**, in the probe and in the ``Write`` rows;
- **order**: per (group, partition), the deliveries in the order they began must each start at
  the cursor the previous acknowledged delivery left (so no message is handled before the one
  before it was acknowledged), and begin after it ended; a delivery that starts where the
  previous one started is a **redelivery**, allowed only when the previous one ran in a worker
  SIGKILLed or SIGSTOPped during it (its cause is counted); within a delivery, the positions
  in order and the payloads in publish order;
- **the traps landed**: each killed worker was in the middle of its trapped batch (some of its
  messages handled, not all, no end) and the batch went to another worker; each stopped worker's
  batch was taken over by another worker no sooner than its lease can have run out (two thirds
  of it less the renewer's 0.5 s: the renewer renews once a third ran), it then finished the
  handler and its acknowledgement was refused (its log says so). For each stop the table gives
  how long after the lease's latest expiry the takeover came, and how many batches of the group
  were begun meanwhile of partitions that had waited longer for their turn (the longest-waiting
  first) and of the others;
- **exactly once**: ``audit`` has one ``Write`` row per message, written by the delivery that was
  acknowledged (a killed or refused delivery's rows rolled back);
- nothing dead-lettered, every cursor at its partition's end with no lease, no retry, not
  blocked; lag 0 for every group; no worker lost a lease except to a stop or a kill, no worker
  exited on its own, each exited 0 on SIGTERM.

Prints a table and, last, one JSON line; "No problems found." or the problems, and then exits 1
(the run directory with the worker logs and probe files is kept and named; ``--keep`` keeps it
anyway).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
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
# The database is chosen before Django's settings are read (benchmarks/settings.py reads it).
_pre = argparse.ArgumentParser(add_help=False)
_pre.add_argument("--db", choices=["postgresql", "mysql"], default="postgresql")
if _pre.parse_known_args()[0].db == "mysql":
    os.environ["JOBS_BENCH_VENDOR"] = "mysql"
os.environ.setdefault("JOBS_BENCH_DB", "jobs_bus_chaos")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
os.environ["JOBS_BENCH_BUS_CHAOS"] = "1"

from django.db import connection  # noqa: E402 - after the environment it reads

from benchmarks import throughput as tp  # noqa: E402
from benchmarks.bus_chaos_app import ATOMIC_GROUP, GROUPS, PROBE_ENV, TOPIC  # noqa: E402
from benchmarks.chaos import Fleet, note, report, source_state, tail  # noqa: E402

REFUSED = "the acknowledgement was refused"
REFUSED_LINE = re.compile(
    rf"Topic {TOPIC} group (\S+) partition '([^']*)': the lease of positions (\d+)-(\d+) was lost; {REFUSED}"
)
LOST_WHILE_RUNNING = "was lost while its batch ran"


def fail(message: str) -> None:
    print(f"benchmarks/bus_chaos.py: {message}", file=sys.stderr)
    sys.exit(2)


# -- the database -------------------------------------------------------------------------------


def create_database(vendor: str) -> str:
    """Drop and create the run's database; the server's version."""
    if vendor == "postgresql":
        return "PostgreSQL " + tp.create_database(tp.DB_NAME)[0]
    from benchmarks.mysql_figures import server_cursor

    with server_cursor() as cursor:
        cursor.execute("SELECT VERSION()")
        version = cursor.fetchone()[0]
        cursor.execute(f"DROP DATABASE IF EXISTS `{tp.DB_NAME}`")
        cursor.execute(f"CREATE DATABASE `{tp.DB_NAME}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    return f"MariaDB/MySQL {version}"


def consumed() -> tuple[int, int]:
    """(messages consumed summed over the groups' cursors, cursors)."""
    total, cursors = tp.scalar(
        "SELECT COALESCE(SUM(position), 0), COUNT(*) FROM django_jobs_group_cursor WHERE topic = %s", [TOPIC]
    )
    return int(total), int(cursors)


def groups_registered() -> int:
    return int(tp.scalar("SELECT COUNT(*) FROM django_jobs_consumer_group WHERE topic = %s", [TOPIC])[0])


class Publisher(threading.Thread):
    """Publishes the run's messages in publish order per partition: message ``i`` of a round goes
    to partition ``i % partitions`` with ``n`` its rank there; ``publish_many`` of at most 500,
    at ``rate`` messages/s (0: at once)."""

    def __init__(self, partitions: int, messages: int, rate: float):
        super().__init__(name="bus-chaos-publisher", daemon=True)
        self.partitions, self.messages, self.rate = partitions, messages, rate
        self.published = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        import django_jobs

        topic = django_jobs.topic(TOPIC)
        total = self.partitions * self.messages
        chunk = 500 if not self.rate else max(1, min(500, round(self.rate / 4)))
        started = time.monotonic()
        try:
            for first in range(0, total, chunk):
                if self.rate:
                    pause = started + first / self.rate - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                topic.publish_many(
                    [
                        {"payload": {"n": i // self.partitions}, "partition": f"p{i % self.partitions}"}
                        for i in range(first, min(first + chunk, total))
                    ]
                )
                self.published = min(first + chunk, total)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
        finally:
            connection.close()


# -- the traps ----------------------------------------------------------------------------------


@dataclass
class Trap:
    kind: str  # "kill" or "stop"
    index: int
    group: str
    at: float  # the fraction of the deliveries after which it is armed
    pid: int | None = None
    worker_id: str | None = None
    partition: str | None = None
    first: int | None = None
    last: int | None = None
    attempt: int | None = None
    signalled_at: float | None = None  # time.time() of the SIGKILL / SIGSTOP
    resumed_at: float | None = None  # time.time() of the SIGCONT
    taken_over_by: int | None = None  # the pid the stopped worker's batch went to
    held_at_resume: set[tuple[str, str, int]] = field(default_factory=set)  # see held_by()
    replacement: str | None = None
    failure: str | None = None

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"


def plan_traps(opts: argparse.Namespace) -> list[Trap]:
    kills = [Trap("kill", i, GROUPS[i % len(GROUPS)], 0.0) for i in range(opts.kills)]
    stops = [Trap("stop", i, GROUPS[(i + 1) % len(GROUPS)], 0.0) for i in range(opts.stops)]
    traps = [t for pair in zip(kills, stops, strict=False) for t in pair]
    traps += kills[len(stops) :] + stops[len(kills) :]
    at = opts.trap_at if opts.trap_at is not None else random.uniform(0.1, 0.5)
    for t in traps:
        t.at = at
    return traps


def wait_file(path: Path, timeout: float, fleet: Fleet) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        fleet.replace_exited()
        time.sleep(0.02)
    return None


def redelivered_elsewhere(probe: Path, trap: Trap) -> int | None:
    """The pid of another worker that began the trapped batch's delivery again, if any."""
    head = f"B\t{trap.group}\t{trap.partition}\t{trap.first}\t"
    for path in probe.glob("*.tsv"):
        if path.stem == str(trap.pid):
            continue
        if any(line.startswith(head) for line in path.read_text().splitlines()):
            return int(path.stem)
    return None


def spring(trap: Trap, fleet: Fleet, probe: Path, lease: float, timeline: Path) -> None:
    """Arm ``trap``, wait for a handler to be in the middle of a batch with it, and signal that
    worker (see the module's doc). A trap that could not be carried out says why in ``failure``."""
    traps = probe / "traps"
    (traps / f"armed-{trap.name}-{trap.group}").touch()
    ready = wait_file(traps / f"ready-{trap.name}", 120, fleet)
    if ready is None:
        trap.failure = "no handler took it within 120 s"
        (traps / f"armed-{trap.name}-{trap.group}").unlink(missing_ok=True)
        return
    pid, group, partition, first, last, attempt = ready.split()
    trap.pid, trap.partition, trap.first, trap.last, trap.attempt = (
        int(pid),
        partition,
        int(first),
        int(last),
        int(attempt),
    )
    worker = next((w for w in fleet.alive if w.proc.pid == trap.pid), None)
    if worker is None:
        trap.failure = f"sprung by pid {pid}, not a live worker of the run"
        return
    trap.worker_id = worker.worker_id
    if trap.kind == "kill":
        trap.signalled_at = time.time()
        fleet.kill(worker)
        trap.replacement = fleet.start().worker_id
        log(timeline, f"SIGKILL {worker.worker_id} (pid {pid}) in {group} {partition} {first}-{last}; "
                      f"started {trap.replacement}")  # fmt: skip
        return
    trap.signalled_at = time.time()
    os.kill(trap.pid, signal.SIGSTOP)
    # kill() returns before a multi-threaded process has stopped (its threads stop when the one
    # the signal was queued to next runs): the handler must not see the go file before then.
    os.waitpid(trap.pid, os.WUNTRACED)
    log(timeline, f"SIGSTOP {worker.worker_id} (pid {pid}) in {group} {partition} {first}-{last}")
    (traps / f"go-{trap.name}").touch()  # seen once it runs again
    deadline = time.monotonic() + 3 * lease + 60
    try:
        while (taker := redelivered_elsewhere(probe, trap)) is None and time.monotonic() < deadline:
            fleet.replace_exited()
            time.sleep(0.05)
    finally:
        # What the stopped worker held when it resumed: a batch it then begins that is not
        # among these was taken after it resumed (see judge()).
        trap.held_at_resume = held_by(worker.worker_id)
        trap.resumed_at = time.time()
        os.kill(trap.pid, signal.SIGCONT)
    trap.taken_over_by = taker
    log(timeline, f"SIGCONT {worker.worker_id} (pid {pid}) after {trap.resumed_at - trap.signalled_at:.1f}s; "
                  f"batch taken over by pid {taker}")  # fmt: skip
    if taker is None:
        trap.failure = f"no other worker took the stopped batch over within {3 * lease + 60:.0f} s"
        return
    # Its late acknowledgement, before the next trap (which might pick this worker again).
    refusal = f"partition '{trap.partition}': the lease of positions {trap.first}-{trap.last} was lost; {REFUSED}"
    deadline = time.monotonic() + 60
    while refusal not in worker.log_path.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.05)


def held_by(worker_id: str) -> set[tuple[str, str, int]]:
    """(group, partition, cursor) of the batches whose lease ``worker_id`` holds (live or not)."""
    from django_jobs.models import GroupCursor

    return set(
        GroupCursor.objects.filter(topic=TOPIC, leased_by=worker_id, lease_token__isnull=False).values_list(
            "group_name", "partition__name", "position"
        )
    )


def log(timeline: Path, what: str) -> None:
    with open(timeline, "a") as fh:
        fh.write(f"{time.strftime('%H:%M:%S')}.{int(time.time() % 1 * 1000):03d}\t{what}\n")


# -- the verdict --------------------------------------------------------------------------------


@dataclass
class Delivery:
    group: str
    partition: str
    start: int  # the cursor it was taken at (its first position less one)
    end: int  # its last position
    attempt: int
    pid: int
    began: float
    ended: float | None = None
    handled: list[tuple[int, int]] = field(default_factory=list)  # (position, payload n)
    trap: str | None = None
    acknowledged: bool = False
    cause: str | None = None  # of this delivery being a redelivery: "kill" or "stop"


def read_probe(probe: Path) -> list[Delivery]:
    deliveries: list[Delivery] = []
    for path in sorted(probe.glob("*.tsv")):
        open_: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
        for line in path.read_text().splitlines():
            kind, *rest = line.split("\t")
            if kind == "B":
                group, partition, first, last, attempt, at, pid = rest
                d = Delivery(group, partition, int(first) - 1, int(last), int(attempt), int(pid), float(at))
                open_[group, partition].append(d)
                deliveries.append(d)
            elif kind == "M":
                group, partition, position, n, _, _ = rest
                open_[group, partition][-1].handled.append((int(position), int(n)))
            elif kind == "T":
                name, group, partition, *_ = rest
                open_[group, partition][-1].trap = name
            elif kind == "E":
                group, partition, first, _, _, at, _ = rest
                d = next(d for d in open_[group, partition] if d.start == int(first) - 1)
                d.ended = float(at)
                open_[group, partition].remove(d)
    return deliveries


def last_stop(stops: list[Trap], *, before: float) -> Trap | None:
    """The last of a worker's stops that began before ``before`` (a redelivery's start)."""
    earlier = [t for t in stops if (t.signalled_at or 0) < before]
    return max(earlier, key=lambda t: t.signalled_at or 0) if earlier else None


def stop_takeover(trap: Trap, deliveries: list[Delivery], lease: float) -> dict[str, Any] | None:
    """When a stopped worker's batch was taken over, and what the group's takers did from the
    latest its lease can have run out (the SIGSTOP plus the lease) until then: the batches they
    began of partitions that had waited longer for their turn (last taken before the stopped
    batch was) and of the others. A takeover after a lease's expiry that comes only once the
    partitions waiting longer had theirs is the group's order (the longest-waiting first), not a
    slow takeover."""
    stopped = next(
        (d for d in deliveries if d.pid == trap.pid and d.trap == trap.name and d.partition == trap.partition), None
    )
    if stopped is None or trap.signalled_at is None:
        return None
    again = [
        d
        for d in deliveries
        if (d.group, d.partition, d.start) == (stopped.group, stopped.partition, stopped.start)
        and d.pid != trap.pid
        and d.began > trap.signalled_at
    ]
    if not again:
        return None
    taken = min(d.began for d in again)
    expiry = trap.signalled_at + lease
    previous: dict[str, float] = {}  # partition -> when it was last taken
    longer = shorter = 0
    for d in sorted((d for d in deliveries if d.group == stopped.group), key=lambda d: d.began):
        if expiry <= d.began < taken and d.pid != trap.pid:
            if previous.get(d.partition, 0.0) < stopped.began:
                longer += 1
            else:
                shorter += 1
        previous[d.partition] = d.began
    return {"after_stop_s": round(taken - trap.signalled_at, 1), "after_expiry_s": round(taken - expiry, 1),
            "waiting_longer": longer, "waiting_less": shorter}  # fmt: skip


def judge(opts: argparse.Namespace, fleet: Fleet, traps: list[Trap], run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    import django_jobs
    from benchmarks.bus_chaos_app.models import Write
    from django_jobs.models import DeadLetter, GroupCursor, Message

    problems: list[str] = []
    parts, per = opts.partitions, opts.messages
    expected = {(f"p{p}", pos) for p in range(parts) for pos in range(1, per + 1)}
    killed = {t.pid: t for t in traps if t.kind == "kill" and t.signalled_at}
    stopped: dict[int, list[Trap]] = defaultdict(list)  # a worker may be stopped more than once
    for t in traps:
        if t.kind == "stop" and t.signalled_at and t.resumed_at:
            stopped[t.pid or 0].append(t)
    logs = {w.proc.pid: w.log_path.read_text(errors="replace") for w in fleet.workers}

    # The messages as stored: every one, each partition's positions 1..N in publish order.
    stored = list(Message.objects.filter(topic=TOPIC).values_list("partition__name", "position", "payload"))
    if {(p, pos) for p, pos, _ in stored} != expected or len(stored) != len(expected):
        problems.append(f"{len(stored)} messages stored, {len(expected)} published (or not positions 1..N)")
    out_of_order = [(p, pos, pl["n"]) for p, pos, pl in stored if pl["n"] != pos - 1]
    if out_of_order:
        problems.append(f"{len(out_of_order)} message(s) whose position is not their publish order: {out_of_order[:5]}")

    deliveries = read_probe(run_dir / "probe")
    by_key: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_key[d.group, d.partition].append(d)

    # Order per (group, partition): each delivery starts at the cursor the last acknowledged
    # one left, after it ended; a repeat of a batch only after its worker was killed or stopped.
    violations: list[str] = []
    unexplained: list[str] = []
    stale: list[str] = []
    for (group, partition), ds in sorted(by_key.items()):
        # In the order the engine handed them out: by cursor, then attempt (a takeover counts
        # one). A stopped worker may write its "began" line after the takeover's.
        ds.sort(key=lambda d: (d.start, d.attempt, d.began))
        current: Delivery | None = None
        for d in ds:
            positions = [pos for pos, _ in d.handled]
            if positions != list(range(d.start + 1, d.start + 1 + len(positions))) or len(positions) > d.end - d.start:
                violations.append(f"{group} {partition}: delivery {d.start + 1}-{d.end} handled positions {positions}")
            if any(n != pos - 1 for pos, n in d.handled):
                violations.append(f"{group} {partition}: a payload out of publish order in {d.start + 1}-{d.end}")
            if current is None:
                if d.start != 0:
                    violations.append(f"{group} {partition}: first delivery starts at {d.start + 1}")
            elif d.start == current.end:
                if current.ended is None or current.ended > d.began:
                    violations.append(
                        f"{group} {partition}: {d.start + 1}-{d.end} (pid {d.pid}) began before "
                        f"{current.start + 1}-{current.end} (pid {current.pid}) ended"
                    )
                current.acknowledged = True
            elif d.start == current.start:
                if current.pid in killed and current.began < (killed[current.pid].signalled_at or 0):
                    d.cause = "kill"
                elif stop := last_stop(stopped.get(current.pid, []), before=d.began):
                    resumed = stop.resumed_at or 0.0
                    if (
                        current.began < resumed  # its handler was stopped
                        or d.began < resumed  # taken over during the stop: it was taken before
                        or (group, partition, current.start) in stop.held_at_resume  # held, expired
                    ):
                        d.cause = "stop"
                    elif d.began - resumed < opts.lease:
                        # Taken by the stopped worker after it resumed (it held no lease on it
                        # then), and taken over by another worker sooner than a lease written
                        # after the resume could expire: the lease it was handed had expired
                        # before its take wrote it (the take read its clock before the stop).
                        d.cause = "stale"
                        stale.append(
                            f"{group} {partition}: {current.start + 1}-{current.end} taken by the resumed pid "
                            f"{current.pid} after its SIGCONT and taken over by pid {d.pid} "
                            f"{d.began - resumed:.2f}s after the SIGCONT (lease {opts.lease:g}s)"
                        )
                    else:
                        unexplained.append(
                            f"{group} {partition}: {d.start + 1}-{d.end} taken over by pid {d.pid} "
                            f"{d.began - resumed:.1f}s after pid {current.pid} resumed and took it"
                        )
                else:
                    unexplained.append(
                        f"{group} {partition}: {d.start + 1}-{d.end} delivered again to pid {d.pid} (attempt "
                        f"{d.attempt}) after pid {current.pid}, neither killed nor stopped meanwhile"
                    )
            else:
                violations.append(
                    f"{group} {partition}: {d.start + 1}-{d.end} (pid {d.pid}) followed "
                    f"{current.start + 1}-{current.end} (pid {current.pid})"
                )
            current = d
        if current is not None and current.end == per and current.ended is not None:
            current.acknowledged = True
    if violations:
        problems.append(f"{len(violations)} order violation(s): " + "; ".join(violations[:10]))
    if stale:
        problems.append(
            f"{len(stale)} batch(es) handed out to a worker under a lease that had already expired (its take "
            "straddled its SIGSTOP; tests/test_bus_stale_lease.py), so two workers could run one batch at once: "
            + "; ".join(stale[:10])
        )
    if unexplained:
        problems.append(f"{len(unexplained)} unexplained redelivery(ies): " + "; ".join(unexplained[:10]))

    # Every group saw every message: in the probe, and in the handlers' rows.
    writes = list(Write.objects.values_list("group", "partition", "position", "pid", "attempt"))
    seen_probe = {g: {(d.partition, pos) for d in deliveries if d.group == g for pos, _ in d.handled} for g in GROUPS}
    seen_rows = {g: {(p, pos) for gg, p, pos, _, _ in writes if gg == g} for g in GROUPS}
    for g in GROUPS:
        for where, seen in (("the probe", seen_probe[g]), ("the Write rows", seen_rows[g])):
            missing = expected - seen
            if missing:
                problems.append(f"group {g}: {len(missing)} message(s) missing from {where}: {sorted(missing)[:5]}")

    # Exactly once for the atomic group: one row per message, from the acknowledged delivery.
    atomic_rows = Counter((p, pos) for g, p, pos, _, _ in writes if g == ATOMIC_GROUP)
    duplicates = {k: c for k, c in atomic_rows.items() if c > 1}
    if duplicates:
        problems.append(
            f"{ATOMIC_GROUP}: {len(duplicates)} message(s) written more than once: {list(duplicates.items())[:5]}"
        )
    acked_by = {
        (d.partition, pos): (d.pid, d.attempt)
        for d in deliveries
        if d.group == ATOMIC_GROUP and d.acknowledged
        for pos, _ in d.handled
    }
    foreign = [
        (p, pos, pid, a) for g, p, pos, pid, a in writes if g == ATOMIC_GROUP and acked_by.get((p, pos)) != (pid, a)
    ]
    if foreign:
        problems.append(
            f"{ATOMIC_GROUP}: {len(foreign)} row(s) written by a delivery that was not acknowledged "
            f"(should have rolled back): {foreign[:5]}"
        )

    # The traps landed as meant.
    for t in traps:
        if t.failure:
            problems.append(f"trap {t.name} ({t.group}): {t.failure}")
            continue
        trapped = next(
            (d for d in deliveries if d.pid == t.pid and d.trap == t.name and d.partition == t.partition), None
        )
        again = [d for d in by_key[t.group, t.partition] if d.start == (t.first or 0) - 1 and d.pid != t.pid]
        if trapped is None:
            problems.append(f"trap {t.name}: its delivery is not in the probe")
            continue
        if not again:
            problems.append(
                f"trap {t.name}: {t.group} {t.partition} {t.first}-{t.last} never delivered to another worker"
            )
        if t.kind == "kill":
            if trapped.ended is not None or not 0 < len(trapped.handled) < t.last - t.first + 1:  # type: ignore[operator]
                problems.append(
                    f"trap {t.name}: not in the middle of its batch when killed "
                    f"({len(trapped.handled)} of {t.last - t.first + 1} handled, ended {trapped.ended})"  # type: ignore[operator]
                )
        else:
            line = f"partition '{t.partition}': the lease of positions {t.first}-{t.last} was lost; {REFUSED}"
            if trapped.ended is None or trapped.ended < (t.resumed_at or 0):
                problems.append(f"trap {t.name}: the stopped handler did not finish after SIGCONT")
            if line not in logs.get(t.pid or 0, ""):
                problems.append(f"trap {t.name}: the stopped worker's log does not say its acknowledgement was refused")
            # The renewer renews a lease once a third of it ran (checking every 0.5 s): at the
            # stop, at least two thirds of it less 0.5 s were left.
            taken_over = min((d.began for d in again if d.began > (t.signalled_at or 0)), default=None)
            if taken_over and t.signalled_at and taken_over - t.signalled_at < opts.lease * 2 / 3 - 0.5:
                problems.append(
                    f"trap {t.name}: taken over {taken_over - t.signalled_at:.1f}s after its SIGSTOP, before "
                    f"its lease ({opts.lease:g}s) can have run out"
                )

    # A refused acknowledgement must be that of a delivery another worker took over (a
    # redelivery counted above). The renewer's "lost while its batch ran" is only counted: it
    # also appears when a renewal races the batch's own acknowledgement.
    repeated = {
        (before.pid, before.group, before.partition, before.start + 1, before.end)
        for ds in by_key.values()
        for before, after in zip(ds, ds[1:], strict=False)
        if after.start == before.start
    }
    refused = [(pid, m.groups()) for pid, log in logs.items() for m in REFUSED_LINE.finditer(log)]
    refused_unexplained = [(pid, g) for pid, g in refused if (pid, g[0], g[1], int(g[2]), int(g[3])) not in repeated]
    if refused_unexplained:
        problems.append(
            f"{len(refused_unexplained)} refused acknowledgement(s) of a batch no other worker took over "
            f"(pid, (group, partition, first, last)): {refused_unexplained[:10]}"
        )
    errors = {pid: log.count("unexpected error") + log.count("Traceback") for pid, log in logs.items()}
    if any(errors.values()):
        problems.append(f"errors in the worker logs (pid: count): { {p: c for p, c in errors.items() if c} }")

    # The end state: nothing dead-lettered, every cursor at its end, free; lag 0.
    dead = DeadLetter.objects.filter(topic=TOPIC).count()
    if dead:
        problems.append(f"{dead} dead letter(s)")
    cursors = list(
        GroupCursor.objects.filter(topic=TOPIC).values_list(
            "group_name", "partition__name", "position", "lease_token", "blocked", "attempts", "retry_at"
        )
    )
    bad = [c for c in cursors if c[2] != per or c[3] is not None or c[4] or c[5] or c[6] is not None]
    if len(cursors) != parts * len(GROUPS) or bad:
        problems.append(f"{len(cursors)} cursors (of {parts * len(GROUPS)}), not at the end or not free: {bad[:5]}")
    lag = {g: django_jobs.topic(TOPIC).group(g).total_lag() for g in GROUPS}
    if any(lag.values()):
        problems.append(f"lag at the end: {lag}")

    # The workers.
    for w in fleet.unexpected:
        problems.append(f"worker {w.worker_id} exited with {w.exit_code} on its own:\n{tail(w.log_path)}")
    for w in fleet.workers:
        if w.stopped and w.exit_code != 0:
            problems.append(f"worker {w.worker_id} exited with {w.exit_code} after SIGTERM:\n{tail(w.log_path)}")

    redelivered = [d for d in deliveries if d.cause]
    takeovers = [stop_takeover(t, deliveries, opts.lease) for t in traps if t.kind == "stop"]
    figures: dict[str, Any] = {
        "groups": len(GROUPS),
        "partitions": parts,
        "messages_per_partition": per,
        "messages": len(stored),
        "deliveries_expected": len(expected) * len(GROUPS),
        "batches_begun": len(deliveries),
        "messages_handled": sum(len(d.handled) for d in deliveries),
        "redelivered_batches": len(redelivered),
        "redelivered_batches_after_kill": sum(1 for d in redelivered if d.cause == "kill"),
        "redelivered_batches_after_stop": sum(1 for d in redelivered if d.cause == "stop"),
        "redelivered_batches_after_expired_take": len(stale),
        "redelivered_messages": sum(d.end - d.start for d in redelivered),
        "redeliveries_unexplained": len(unexplained),
        "messages_handled_twice": sum(
            c - 1
            for c in Counter((d.group, d.partition, pos) for d in deliveries for pos, _ in d.handled).values()
            if c > 1
        ),
        "order_violations": len(violations),
        "sigkills": sum(1 for t in traps if t.kind == "kill" and t.signalled_at),
        "sigstops": sum(1 for t in traps if t.kind == "stop" and t.signalled_at),
        "stopped_seconds": [round((t.resumed_at or 0) - (t.signalled_at or 0), 1) for t in traps if t.kind == "stop"],
        "takeover_after_expiry_s": [t["after_expiry_s"] if t else "-" for t in takeovers],
        "batches_meanwhile": [f"{t['waiting_longer']} vs {t['waiting_less']}" if t else "-" for t in takeovers],
        "late_acks_refused": len(refused),
        "late_acks_refused_unexplained": len(refused_unexplained),
        "renewals_found_lease_gone": sum(log.count(LOST_WHILE_RUNNING) for log in logs.values()),
        "traps": [
            {
                "trap": t.name,
                "group": t.group,
                "worker": t.worker_id,
                "batch": f"{t.partition} {t.first}-{t.last}",
                "taken_over_by_pid": t.taken_over_by,
                "replacement": t.replacement,
                "failure": t.failure,
            }
            for t in traps
        ],
        "atomic_rows": sum(atomic_rows.values()),
        "atomic_duplicates": len(duplicates),
        "atomic_missing": len(expected - seen_rows[ATOMIC_GROUP]),
        "atomic_rows_not_acknowledged": len(foreign),
        "other_groups_rows": len(writes) - sum(atomic_rows.values()),
        "dead_letters": dead,
        "lag_at_end": sum(lag.values()),
        "workers_started": len(fleet.workers),
        "unexpected_worker_exits": len(fleet.unexpected),
    }
    return figures, problems


TABLE = [
    ("groups x partitions x messages", ("groups", "partitions", "messages_per_partition")),
    ("deliveries expected (message x group)", "deliveries_expected"),
    ("messages handled (with repeats)", "messages_handled"),
    ("batches begun", "batches_begun"),
    ("redelivered batches", "redelivered_batches"),
    ("  after a SIGKILL / a SIGSTOP", ("redelivered_batches_after_kill", "redelivered_batches_after_stop")),
    ("  after a take under an expired lease", "redelivered_batches_after_expired_take"),
    ("  unexplained", "redeliveries_unexplained"),
    ("redelivered messages", "redelivered_messages"),
    ("messages handled more than once", "messages_handled_twice"),
    ("order violations", "order_violations"),
    ("SIGKILLs mid-batch / SIGSTOPs", ("sigkills", "sigstops")),
    ("stopped for (s)", "stopped_seconds"),
    ("  taken over after the lease's latest expiry (s)", "takeover_after_expiry_s"),
    ("  batches of the group begun meanwhile: waiting longer / less", "batches_meanwhile"),
    ("late acknowledgements refused", "late_acks_refused"),
    ("  of a batch not taken over", "late_acks_refused_unexplained"),
    ('renewer: "lost while its batch ran"', "renewals_found_lease_gone"),
    ("atomic group's rows", "atomic_rows"),
    ("  duplicates / missing", ("atomic_duplicates", "atomic_missing")),
    ("  from unacknowledged deliveries", "atomic_rows_not_acknowledged"),
    ("other groups' rows", "other_groups_rows"),
    ("dead letters", "dead_letters"),
    ("lag at the end", "lag_at_end"),
    ("workers started / unexpected exits", ("workers_started", "unexpected_worker_exits")),
    ("elapsed (s)", "elapsed_s"),
    ("deliveries per second", "rate"),
    ("load average before / after", "load_average_before_after"),
]


def show(value: Any) -> str:
    if isinstance(value, list):
        return " / ".join(show(v) for v in value) or "none"
    return f"{value:,}" if isinstance(value, (int, float)) else str(value)


def text_table(figures: dict[str, Any]) -> str:
    cells = [
        (label, " / ".join(show(figures[k]) for k in key) if isinstance(key, tuple) else show(figures[key]))
        for label, key in TABLE
    ]
    width = max(len(label) for label, _ in cells)
    lines = [f"{label.ljust(width)}  {value}" for label, value in cells]
    lines.append("")
    for t in figures["traps"]:
        lines.append(
            f"trap {t['trap']:<7} {t['group']:<8} {t['worker'] or '-':<8} batch {t['batch']:<12} "
            + (f"taken over by pid {t['taken_over_by_pid']}" if t["taken_over_by_pid"] else "")
            + (f"replaced by {t['replacement']}" if t["replacement"] else "")
            + (f"  FAILED: {t['failure']}" if t["failure"] else "")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["postgresql", "mysql"], default="postgresql", help="default postgresql")
    parser.add_argument("--partitions", type=int, default=100, help="partitions; default 100")
    parser.add_argument("--messages", type=int, default=100, help="messages per partition; default 100")
    parser.add_argument("--rate", type=float, default=0.0, help="messages published per second (0: all first)")
    parser.add_argument("--workers", type=int, default=2, help="runworker processes; default 2")
    parser.add_argument("--batch", type=int, default=10, help="messages per batch; default 10")
    parser.add_argument("--threads", type=int, default=4, help="threads per group and process; default 4")
    parser.add_argument("--lease", type=float, default=5.0, help="the topic's lease (s); default 5")
    parser.add_argument("--kills", type=int, default=1, help="workers SIGKILLed mid-batch; default 1")
    parser.add_argument("--stops", type=int, default=1, help="workers SIGSTOPped past their lease; default 1")
    parser.add_argument("--trap-at", type=float, default=None, help="fraction of deliveries before the traps")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the run at most; 600")
    parser.add_argument("--seed", type=int, default=None, help="random seed (when the traps are armed)")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs, probe files)")
    opts = parser.parse_args()
    if opts.batch < 2:
        parser.error("--batch must be at least 2 (a trap lands in the middle of a batch)")
    if opts.seed is not None:
        random.seed(opts.seed)

    version = create_database(opts.db)
    tp.setup_django()
    import django_jobs

    run_dir = Path(tempfile.mkdtemp(prefix="jobs-bus-chaos-"))
    probe = run_dir / "probe"
    (probe / "traps").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    timeline = run_dir / "chaos.tsv"
    env = {
        **tp.worker_env(),
        PROBE_ENV: str(probe),
        "JOBS_BUS_CHAOS_BATCH": str(opts.batch),
        "JOBS_BUS_CHAOS_THREADS": str(opts.threads),
    }
    django_jobs.topic(TOPIC).configure(lease=opts.lease)
    fleet = Fleet(["-q", "no-jobs-here", "--topics", TOPIC, "--sleep", "0.2", "--grace", "10", "-v", "1"], env,
                  run_dir / "logs")  # fmt: skip
    traps = plan_traps(opts)
    total = opts.partitions * opts.messages * len(GROUPS)
    publisher = Publisher(opts.partitions, opts.messages, opts.rate)
    note(
        f"bus chaos run on {version}: {len(GROUPS)} groups x {opts.partitions} partitions x {opts.messages} "
        f"messages, {opts.workers} workers, lease {opts.lease:g}s, traps at {traps[0].at if traps else 0:.2f}: "
        f"{', '.join(f'{t.name} {t.group}' for t in traps)}; run directory {run_dir}"
    )
    load_before, source_before = os.getloadavg(), source_state()
    if not opts.rate:
        publisher.run()
        if publisher.error is not None:
            fail(f"publishing failed: {publisher.error!r}")
    for _ in range(opts.workers):
        fleet.start()
    deadline = time.monotonic() + 120
    while not (fleet.registered() and groups_registered() == len(GROUPS)):
        fleet.replace_exited()
        if time.monotonic() > deadline:
            fleet.stop()
            fail(f"the workers did not register within 120 s:\n{tail(fleet.workers[0].log_path)}")
        time.sleep(0.1)
    started = time.monotonic()
    if opts.rate:
        publisher.start()
    done = False
    last_note = started
    try:
        pending = list(traps)
        while time.monotonic() - started < opts.timeout:
            fleet.replace_exited()
            if publisher.error is not None:
                fleet.stop()
                fail(f"publishing failed: {publisher.error!r}")
            so_far, cursors = consumed()
            if pending and so_far >= pending[0].at * total:
                spring(pending.pop(0), fleet, probe, opts.lease, timeline)
                continue
            if not pending and so_far == total and cursors == opts.partitions * len(GROUPS):
                done = True
                break
            if time.monotonic() - last_note > 10:
                last_note = time.monotonic()
                note(f"  {last_note - started:5.0f}s consumed {so_far:,} of {total:,}")
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        fleet.stop()
    finally:
        for w in fleet.alive:
            if w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)
                w.proc.kill()
    figures, problems = judge(opts, fleet, traps, run_dir)
    if not done:
        problems.insert(0, f"not every message consumed by every group within {opts.timeout:.0f}s")
    figures["finished"] = done
    figures["elapsed_s"] = round(elapsed, 1)
    figures["rate"] = round(figures["messages_handled"] / elapsed, 1)
    figures["database"] = version
    source_after = source_state()
    figures["code"] = source_before if source_after == source_before else f"{source_before} -> {source_after}"
    figures["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    figures["seed"] = opts.seed
    connection.close()

    report("bus_chaos", text_table(figures), figures, problems, run_dir, keep=opts.keep)


if __name__ == "__main__":
    main()

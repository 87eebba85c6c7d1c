"""Bus mode on real worker processes (``manage.py runworker`` with the subscribers of
tests/bus/subscribers.py): order per partition across processes, a worker SIGKILLed mid-batch
(its batch delivered again, in order, to the next worker), a late acknowledgement refused
after a worker stopped past its lease, groups independent of each other, dead letters and their
replay, on_failure="block", and atomic=True exactly once with a crash injected at each point.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User

import django_jobs
from django_jobs.models import DeadLetter, Job, Message
from tests.conftest import read_log, stop_process, wait_until
from tests.tasks import read_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
BUS = {"JOBS_TEST_BUS": "1"}
ARGS = ("-q", "no-jobs-here", "--sleep", "0.1", "--grace", "2")


@pytest.fixture
def bus_worker(worker_process):
    def start(*topics: str, env: dict | None = None):
        return worker_process(*ARGS, "--topics", ",".join(topics), env={**BUS, **(env or {})})

    return start


def consumed(topic, group):
    """The group has a cursor in the topic's partitions (it registered) and no lag."""
    partitions = django_jobs.topic(topic).group(group).partitions()
    return bool(partitions) and all(p.lag == 0 for p in partitions)


def delivered(probe, group=None):
    return [r for r in read_records(probe) if group is None or r["group"] == group]


def publish(topic, probe, ns, partition="p", **extra):
    django_jobs.topic(topic).publish_many(
        [{"payload": {"probe": probe, "n": n, **extra}, "partition": partition} for n in ns]
    )


def test_two_workers_deliver_every_partition_in_order_one_batch_at_a_time(bus_worker, probe):
    for part in range(6):
        publish("spread", probe, range(20), partition=f"p{part}")
    bus_worker("spread")
    bus_worker("spread")
    wait_until(lambda: len(delivered(probe)) >= 120, timeout=90, message="every message delivered")
    by_partition = defaultdict(list)
    for r in sorted(delivered(probe), key=lambda r: r["t"]):  # one host: one monotonic clock
        by_partition[r["partition"]].append(r["n"])
    assert {p: ns for p, ns in by_partition.items()} == {f"p{part}": list(range(20)) for part in range(6)}
    wait_until(lambda: consumed("spread", "sorter"), timeout=30)


def test_a_killed_workers_batch_is_delivered_again_in_order_to_the_next_worker(bus_worker, probe, tmp_path):
    django_jobs.topic("orders").configure(lease=2)
    release = str(tmp_path / "release")
    publish("orders", probe, range(1, 6), hold=release)
    first = bus_worker("orders")
    wait_until(lambda: [r["n"] for r in delivered(probe, "billing")] == [1, 2], timeout=60, message="first batch")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    Path(release).touch()
    second = bus_worker("orders")
    wait_until(lambda: len(delivered(probe, "billing")) >= 7, timeout=60, message="the rest delivered")
    again = [(r["n"], r["attempt"]) for r in delivered(probe, "billing") if r["pid"] == second.pid]
    assert [n for n, _ in again] == [1, 2, 3, 4, 5]  # the dead worker's batch first, in order
    wait_until(lambda: consumed("orders", "billing"), timeout=30)


@pytest.mark.needs("ROW_LOCKS")  # SQLite: a stopped process may hold the database's one write lock
def test_a_worker_stopped_past_its_lease_has_its_late_ack_refused(bus_worker, probe, tmp_path):
    django_jobs.topic("orders").configure(lease=2)
    release = str(tmp_path / "release")
    publish("orders", probe, range(1, 4), hold=release)
    first = bus_worker("orders")
    wait_until(lambda: [r["n"] for r in delivered(probe, "billing")] == [1, 2], timeout=60, message="first batch")
    stop_process(first)  # stopped for sure before the handler can see the release file
    try:
        Path(release).touch()
        second = bus_worker("orders")
        wait_until(
            lambda: [r["n"] for r in delivered(probe, "billing") if r["pid"] == second.pid] == [1, 2, 3],
            timeout=60,
            message="the second worker took the partition over",
        )
        wait_until(lambda: consumed("orders", "billing"), timeout=30)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    wait_until(lambda: "acknowledgement was refused" in read_log(first), timeout=30, message="the refusal logged")
    group = django_jobs.topic("orders").group("billing")
    assert group.total_lag() == 0 and [p.position for p in group.partitions()] == [3]


def stopped_itself(marker: Path, workers) -> tuple[subprocess.Popen, float]:
    """The worker that stopped itself at a test's stop point (tests/bus/subscribers.py), once it
    has stopped, and the ``time.monotonic()`` it stopped at."""
    wait_until(lambda: marker.exists() and marker.read_text().endswith("\n"), timeout=60, message="the stop")
    pid, at = marker.read_text().split()
    proc = next(w for w in workers if w.pid == int(pid))
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status)
    return proc, float(at)


#: How long after a lease's expiry another worker may take the batch over here: the workers poll
#: every 0.1 s; the rest is room for a loaded machine.
TAKEOVER_MARGIN = 3.0


@pytest.mark.needs("ROW_LOCKS")  # SQLite: a stopped process may hold the database's one write lock
def test_an_idle_worker_takes_a_stopped_workers_batch_over_within_the_lease_and_a_poll(worker_process, probe, tmp_path):
    # The default poll interval, no NOTIFY for an expiry: the lease runs out at most `lease`
    # after the stop (the renewer renewed it at most then), and an idle worker looks within a poll.
    lease, poll = 3, 1.0
    django_jobs.topic("takeover").configure(lease=lease)
    args = ("-q", "no-jobs-here", "--sleep", str(poll), "--grace", "2", "--topics", "takeover")
    workers = [worker_process(*args, env=BUS), worker_process(*args, env=BUS)]
    wait_until(lambda: "started" in read_log(workers[0]) and "started" in read_log(workers[1]), timeout=60)
    release = tmp_path / "release"
    publish("takeover", probe, range(1, 4), hold=str(release))
    wait_until(lambda: [r["n"] for r in delivered(probe)] == [1, 2], timeout=30, message="the first batch")
    holder = next(w for w in workers if w.pid == delivered(probe)[0]["pid"])
    stop_process(holder)
    stopped_at = time.monotonic()
    try:
        release.touch()
        wait_until(lambda: len(delivered(probe)) >= 4, timeout=30, message="the takeover")
        again = delivered(probe)[2]
        assert (again["n"], again["attempt"]) == (1, 2) and again["pid"] != holder.pid
        took = again["t"] - stopped_at
        assert took < lease + 1.2 * poll + TAKEOVER_MARGIN, f"taken over {took:.1f}s after the stop"
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    wait_until(lambda: consumed("takeover", "relay"), timeout=30)


# On SQLite a stopped process may hold the database's one write lock; MySQL (not MariaDB) has no
# idle transaction timeout, and fails these.
@pytest.mark.needs("ROW_LOCKS")
def test_a_worker_stopped_inside_a_take_keeps_the_partition_no_longer_than_the_lease(bus_worker, probe, tmp_path):
    # Stopped between the take's UPDATE and its commit, a worker holds the cursor's row lock, and
    # every other worker's take skips the row (SKIP LOCKED): the database must end that session.
    lease = 2
    django_jobs.topic("takeover").configure(lease=lease)
    marker = tmp_path / "stopped"
    env = {"JOBS_TEST_STOP_IN_TAKE": str(marker)}
    workers = [bus_worker("takeover", env=env), bus_worker("takeover", env=env)]
    wait_until(lambda: "started" in read_log(workers[0]) and "started" in read_log(workers[1]), timeout=60)
    publish("takeover", probe, range(1, 4))
    stopped, stopped_at = stopped_itself(marker, workers)
    try:
        wait_until(lambda: [r["n"] for r in delivered(probe)] == [1, 2, 3], timeout=30, message="the takeover")
        took = delivered(probe)[0]["t"] - stopped_at
        assert took < lease + TAKEOVER_MARGIN, f"taken over {took:.1f}s after the stop"
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    # The stopped take was rolled back: no attempt counted, the other worker had every batch.
    assert {(r["pid"], r["attempt"]) for r in delivered(probe)} == {(w.pid, 1) for w in workers if w is not stopped}
    wait_until(lambda: consumed("takeover", "relay"), timeout=30)
    wait_until(lambda: "database error" in read_log(stopped), timeout=30, message="the resumed take's error")
    publish("takeover", probe, [4])  # both workers go on
    wait_until(lambda: 4 in [r["n"] for r in delivered(probe)], timeout=30)


@pytest.mark.needs("ROW_LOCKS")
@pytest.mark.parametrize("stop", ["stop_after_writes", "stop_after_ack"])
def test_an_atomic_handler_stopped_in_its_transaction_holds_its_locks_no_longer_than_the_lease(
    bus_worker, tmp_path, stop
):
    # After its writes, the stopped transaction holds ledger-out's partition row, which the
    # next holder's publish waits for; after its acknowledgement, the cursor's row as well.
    lease = 2
    django_jobs.topic("ledger").configure(lease=lease)
    user = User.objects.create(username="ledger")
    marker = tmp_path / "stopped"
    workers = [bus_worker("ledger"), bus_worker("ledger")]
    wait_until(lambda: "started" in read_log(workers[0]) and "started" in read_log(workers[1]), timeout=60)
    ledger = django_jobs.topic("ledger")
    ledger.publish({"n": 1, "user": user.pk, "crash": stop, "marker": str(marker)})
    ledger.publish_many([{"payload": {"n": n, "user": user.pk}} for n in (2, 3)])
    stopped, stopped_at = stopped_itself(marker, workers)
    try:
        wait_until(lambda: consumed("ledger", "books"), timeout=30, message="all three consumed by the other worker")
        took = time.monotonic() - stopped_at
        assert took < lease + TAKEOVER_MARGIN, f"consumed {took:.1f}s after the stop"
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    # Resumed, its transaction's next statement finds the session ended: the batch is lost to it.
    wait_until(lambda: "1-1 failed (attempt 1)" in read_log(stopped), timeout=30, message="the resumed worker's error")
    assert "-> lost" in read_log(stopped)
    # Exactly once: the stopped transaction was rolled back by the database.
    assert sorted(LogEntry.objects.values_list("object_repr", flat=True)) == ["ledger-1", "ledger-2", "ledger-3"]
    assert Job.objects.filter(queue="ledger").count() == 3
    assert sorted(Message.objects.filter(topic="ledger-out").values_list("payload__n", flat=True)) == [1, 2, 3]


def test_a_failing_group_does_not_delay_another(bus_worker, probe, tmp_path):
    failing = tmp_path / "failing"
    failing.touch()
    publish("orders", probe, range(1, 6), fail_group="billing", fail_while=str(failing))
    bus_worker("orders")
    wait_until(lambda: len(delivered(probe, "email")) == 5, timeout=60, message="email got everything")
    assert [r["n"] for r in delivered(probe, "email")] == [1, 2, 3, 4, 5]
    # billing keeps failing: its batches go to its dead letters, two messages at a time.
    wait_until(lambda: DeadLetter.objects.filter(group_name="billing").count() == 5, timeout=60)
    assert not DeadLetter.objects.filter(group_name="email").exists()
    letter = DeadLetter.objects.filter(group_name="billing").first()
    assert letter.attempts == 2 and "told to fail" in letter.error and "RuntimeError" in letter.traceback


def test_dead_letters_are_replayed_one_by_one_or_in_bulk(bus_worker, probe, tmp_path):
    failing = tmp_path / "failing"
    failing.touch()
    publish("orders", probe, range(1, 5), fail_group="billing", fail_while=str(failing))
    bus_worker("orders")
    group = django_jobs.topic("orders").group("billing")
    wait_until(lambda: group.dead_letters().count() == 4, timeout=60, message="all dead")
    failing.unlink()
    first = group.dead_letters().first()
    assert group.replay([first.id]) == 1
    wait_until(lambda: group.dead_letters().count() == 3, timeout=30, message="one replayed")
    assert [r["n"] for r in delivered(probe, "billing") if r["replay"]] == [first.payload["n"]]
    assert group.replay() == 3
    wait_until(lambda: not group.dead_letters().exists(), timeout=30, message="all replayed")
    assert sorted(r["n"] for r in delivered(probe, "billing") if r["replay"]) == [1, 2, 3, 4]


def test_on_failure_block_stops_the_partition_until_an_operator_retries_it(bus_worker, probe, tmp_path):
    failing = tmp_path / "failing"
    failing.touch()
    publish("blocking", probe, [1], fail_group="ops", fail_while=str(failing))
    publish("blocking", probe, [2])
    publish("blocking", probe, [10], partition="other")
    bus_worker("blocking")
    group = django_jobs.topic("blocking").group("ops")
    wait_until(lambda: [p.partition for p in group.partitions() if p.blocked] == ["p"], timeout=60)
    wait_until(lambda: 10 in [r["n"] for r in delivered(probe)], timeout=30, message="the other partition goes on")
    assert [r["n"] for r in delivered(probe) if r["partition"] == "p"] == [1]
    failing.unlink()
    group.retry_partition("p")
    wait_until(lambda: consumed("blocking", "ops"), timeout=30, message="unblocked")
    assert [r["n"] for r in delivered(probe) if r["partition"] == "p"] == [1, 1, 2]


@pytest.mark.parametrize("crash", ["before_writes", "after_writes", "raise", "after_ack", "after_commit"])
def test_atomic_subscriber_writes_exactly_once_whatever_the_crash_point(bus_worker, worker_process, tmp_path, crash):
    user = User.objects.create(username="ledger")
    marker = str(tmp_path / "crashed")
    ledger = django_jobs.topic("ledger")
    ledger.publish({"n": 1, "user": user.pk, "crash": crash, "marker": marker})
    ledger.publish_many([{"payload": {"n": n, "user": user.pk}} for n in (2, 3)])
    first = bus_worker("ledger")
    if crash != "raise":
        assert first.wait(60) != 0  # it died at the crash point
        assert os.path.exists(marker)
        bus_worker("ledger")
    wait_until(lambda: consumed("ledger", "books"), timeout=60, message="all three consumed")
    reprs = sorted(LogEntry.objects.values_list("object_repr", flat=True))
    assert reprs == ["ledger-1", "ledger-2", "ledger-3"]
    assert Job.objects.filter(queue="ledger").count() == 3
    assert sorted(Message.objects.filter(topic="ledger-out").values_list("payload__n", flat=True)) == [1, 2, 3]

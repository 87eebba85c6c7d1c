"""Bus mode on real worker processes (``manage.py runworker`` with the subscribers of
tests/bus/subscribers.py): order per partition across processes, a worker SIGKILLed mid-batch
(its batch delivered again, in order, to the next worker), a late acknowledgement refused
after a worker stopped past its lease, groups independent of each other, dead letters and their
replay, on_failure="block", and atomic=True exactly once with a crash injected at each point.
"""

from __future__ import annotations

import os
import signal
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
    def start(*topics: str):
        return worker_process(*ARGS, "--topics", ",".join(topics), env=BUS)

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

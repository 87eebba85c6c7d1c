"""A take of a batch that pauses between reading the clock and writing the lease (the process
SIGSTOPped, a long GC or VM pause) must not hand out a batch whose lease has already expired:
another worker would take the same batch over at once, and two workers would run one
(partition, group)'s batch at the same time. Found by benchmarks/bus_chaos.py (a worker
SIGSTOPped inside ``acquire_batch``, then SIGCONTed, ran a batch whose lease had expired before
it was handed out; its acknowledgement was refused and another worker ran the batch again).

A take that lasted a third of its lease or more renews the lease (guarded on its token) before
handing the batch out; a slow take is not thrown away (it used to be given back when it lasted
80% of the lease, and on a database slow enough no take ever succeeded), and one whose lease ran
out and was taken over meanwhile gives the batch up unrun."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import django_jobs
from django_jobs.drivers import driver
from django_jobs.engine import topics as bus
from django_jobs.models import GroupCursor
from django_jobs.spec.topics import Subscriber
from django_jobs.worker.consumer import Consumer
from tests.conftest import wait_until

LEASE = 1.0


@pytest.mark.django_db(transaction=True)
def test_a_batch_paused_past_its_lease_while_being_taken_is_not_handed_out(monkeypatch):
    bus.ensure_group("stale", "g", start_from="beginning", using="default")
    django_jobs.topic("stale").configure(lease=LEASE)
    django_jobs.topic("stale").publish_many([{"payload": n} for n in range(3)])
    d = driver("default")
    real_clock = type(d).clock
    paused = []

    def clock_then_pause(self, cursor):
        now = real_clock(self, cursor)
        if not paused:  # the first take only: its process stops right after reading the clock
            paused.append(now)
            time.sleep(LEASE + 0.5)
        return now

    monkeypatch.setattr(type(d), "clock", clock_then_pause)
    first = bus.acquire_batch("stale", "g", batch_size=3, worker_id="paused", using="default")
    handed_out_at = timezone.now()
    second = bus.acquire_batch("stale", "g", batch_size=3, worker_id="other", using="default")
    assert paused, "the first take read the clock"
    # The first worker's handler starts now: its lease must be live, and no one else may have the batch.
    assert first is None or first.lease_expires_at > handed_out_at
    assert first is None or second is None
    # Nobody took it over meanwhile: the first keeps it, on a renewed lease.
    assert first is not None and second is None
    assert [m.payload for m in first.messages] == [0, 1, 2]
    assert bus.ack_batch(first, using="default")


@pytest.mark.django_db(transaction=True)
def test_a_take_whose_lease_ran_out_and_was_taken_over_gives_the_batch_up(monkeypatch):
    bus.ensure_group("stale", "g", start_from="beginning", using="default")
    django_jobs.topic("stale").configure(lease=LEASE)
    django_jobs.topic("stale").publish_many([{"payload": n} for n in range(3)])
    real_acquire = bus._acquire
    taken_over = []

    def acquire_then_lose_it(*args, **kwargs):
        batch = real_acquire(*args, **kwargs)
        if kwargs["worker_id"] == "stalled":
            # Committed, then this process stalls past its lease and another worker takes over.
            time.sleep(LEASE + 0.2)
            taken_over.append(bus.acquire_batch("stale", "g", batch_size=3, worker_id="other", using="default"))
        return batch

    monkeypatch.setattr(bus, "_acquire", acquire_then_lose_it)
    first = bus.acquire_batch("stale", "g", batch_size=3, worker_id="stalled", using="default")
    assert first is None  # its renewal found the other worker's token
    (other,) = taken_over
    assert other is not None and other.attempt == 2 and [m.payload for m in other.messages] == [0, 1, 2]


@pytest.mark.django_db(transaction=True)
def test_a_slow_take_hands_its_batch_out_on_a_renewed_lease():
    # Every statement takes a quarter of the lease: the take lasts longer than the lease.
    bus.ensure_group("stale", "g", start_from="beginning", using="default")
    django_jobs.topic("stale").configure(lease=LEASE)
    django_jobs.topic("stale").publish_many([{"payload": n} for n in range(3)])

    def slow(execute, sql, params, many, context):
        time.sleep(LEASE / 4)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(slow):
        started = timezone.now()
        batch = bus.acquire_batch("stale", "g", batch_size=3, worker_id="slow", using="default")
        handed_out_at = timezone.now()
    assert handed_out_at - started > timedelta(seconds=LEASE)  # the take outlasted its first lease
    assert batch is not None and batch.lease_expires_at > handed_out_at
    assert [m.payload for m in batch.messages] == [0, 1, 2]
    assert bus.acquire_batch("stale", "g", batch_size=3, worker_id="other", using="default") is None


@pytest.mark.django_db(transaction=True)
def test_a_running_batch_is_renewed_in_time_whatever_the_database_clock_says(monkeypatch):
    # On PostgreSQL a lease's expiry is written on the database's clock; one a minute ahead of
    # this host's must not put the renewal off (the renewer used to compare it with time.time()).
    d = driver("default")
    real_clock = type(d).clock
    monkeypatch.setattr(type(d), "clock", lambda self, cursor: real_clock(self, cursor) + timedelta(minutes=1))
    bus.ensure_group("skew", "g", start_from="beginning", using="default")
    lease = 3  # renewed after a third of it: a second to spare on a loaded machine
    django_jobs.topic("skew").configure(lease=lease)
    django_jobs.topic("skew").publish({"n": 1})
    running, release, stopping = threading.Event(), threading.Event(), threading.Event()

    def handler(message, context):
        running.set()
        release.wait(30)

    consumer = Consumer(
        using="default",
        subscribers=[Subscriber("skew", "g", handler, start_from="beginning")],
        worker_id="skewed",
        stopping=stopping,
        sleep=0.05,
    )
    consumer.start()
    try:
        assert running.wait(30)
        cursor = GroupCursor.objects.get(topic="skew", group_name="g")
        wait_until(
            lambda: GroupCursor.objects.get(id=cursor.id).lease_expires_at > cursor.lease_expires_at,
            timeout=lease,
            message="the lease renewed before it ran out",
        )
        assert bus.acquire_batch("skew", "g", batch_size=1, worker_id="other", using="default") is None
    finally:
        release.set()
        stopping.set()
        consumer.join(time.monotonic() + 10)

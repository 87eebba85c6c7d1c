"""A take of a batch that pauses between reading the clock and writing the lease (the process
SIGSTOPped, a long GC or VM pause) must not hand out a batch whose lease has already expired:
another worker would take the same batch over at once, and two workers would run one
(partition, group)'s batch at the same time. Found by benchmarks/bus_chaos.py (a worker
SIGSTOPped inside ``acquire_batch``, then SIGCONTed, ran a batch whose lease had expired before
it was handed out; its acknowledgement was refused and another worker ran the batch again)."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

import django_jobs
from django_jobs.drivers import driver
from django_jobs.engine import topics as bus

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
    assert first is None and second is not None  # given back unrun, taken by the next worker
    assert [m.payload for m in second.messages] == [0, 1, 2]

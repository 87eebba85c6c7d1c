"""Bus-mode events (docs/reference/events.md): a message's failures (retried, blocked,
dead-lettered, expired) and an operator's acts on a group (paused, resumed, seeked, replay
requested, a blocked partition skipped) are written in the transaction that makes the change,
with the topic as ``queue``; delivering and acknowledging a message writes none."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

import django_jobs
from django_jobs.engine import topics as bus

pytestmark = pytest.mark.django_db(transaction=True)
LATER = timezone.now() + timedelta(days=1)


def kinds(topic: str) -> list[tuple[str, dict]]:
    return [(e.kind, e.data) for e in django_jobs.events(queue=topic, limit=1000).events]


def take(topic: str, group: str, now=LATER):
    return bus.acquire_batch(topic, group, batch_size=2, worker_id="w", using="default", now=now)


@pytest.fixture
def orders():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    django_jobs.topic("orders").publish_many([{"payload": i, "partition": "p"} for i in range(6)])


def test_delivering_and_acknowledging_writes_no_event(orders):
    assert bus.ack_batch(take("orders", "billing"), using="default")
    assert kinds("orders") == []


def test_a_failed_batch_writes_retried_then_dead_lettered_with_its_messages(orders):
    b = take("orders", "billing")
    assert bus.fail_batch(b, error="Traceback...\nValueError: boom", max_attempts=2, backoff=0, using="default",
                          now=LATER) == "retry"  # fmt: skip
    b = take("orders", "billing", now=LATER + timedelta(seconds=1))
    assert bus.fail_batch(b, error="ValueError: boom", max_attempts=2, using="default", now=LATER) == "dead"
    (k1, retried), (k2, dead) = kinds("orders")
    assert (k1, k2) == ("message-retried", "dead-lettered")
    assert retried == {
        "group": "billing",
        "partition": "p",
        "positions": [1, 2],
        "attempt": 1,
        "error": "ValueError: boom",
    }
    assert dead["attempt"] == 2 and dead["messages"] == [m.id for m in b.messages]


def test_a_blocked_partition_and_its_skip_are_events(orders):
    b = take("orders", "billing")
    assert bus.fail_batch(b, error="X", max_attempts=1, on_failure="block", using="default", now=LATER) == "blocked"
    skipped = django_jobs.topic("orders").group("billing").skip_partition("p")
    (k1, blocked), (k2, dead) = kinds("orders")
    assert (k1, blocked["positions"]) == ("message-blocked", [1, 2])
    assert (k2, dead["messages"], dead["skipped"]) == ("dead-lettered", [skipped], True)


def test_expired_messages_are_one_event_per_skip(orders):
    django_jobs.topic("orders").configure(max_wait=60)
    b = take("orders", "billing")  # a day after publication: the batch read (2) waited too long
    assert b is None
    [(kind, data)] = kinds("orders")
    assert kind == "message-expired" and data == {"group": "billing", "partition": "p", "positions": [1, 2], "count": 2}


def test_operator_acts_on_a_group_are_events(orders):
    group = django_jobs.topic("orders").group("billing")
    group.pause()
    group.resume()
    assert group.seek("end") == 1
    b = take("orders", "billing")
    assert b is None  # nothing left after the seek
    group.seek("beginning")
    b = take("orders", "billing")
    bus.fail_batch(b, error="X", max_attempts=1, using="default", now=LATER)
    assert group.replay() == 2
    assert group.replay() == 0  # nothing left to queue: no event
    assert [k for k, _ in kinds("orders")] == [
        "group-paused", "group-resumed", "group-seeked", "group-seeked", "dead-lettered", "replay-requested",
    ]  # fmt: skip
    seeks = [d for k, d in kinds("orders") if k == "group-seeked"]
    assert seeks == [{"group": "billing", "to": "end", "moved": 1}, {"group": "billing", "to": "beginning", "moved": 1}]


def test_no_events_when_events_are_off(orders):
    with override_settings(DJANGO_JOBS={"EVENTS": False}):
        group = django_jobs.topic("orders").group("billing")
        group.pause()
        group.seek("end")
    assert kinds("orders") == []

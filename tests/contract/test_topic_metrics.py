"""Bus mode's metrics, the same on every database: the running totals a group's cursors keep
(acknowledged, dead-lettered, expired), moved by the statements that move the cursor and by
nothing else; the once-a-minute snapshots (one row per series and minute, whatever the number
of writers); their retention; and the rates and per-minute flows read from them.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import django_jobs
from django_jobs import console_topics as console
from django_jobs.conf import get_settings
from django_jobs.engine import topic_metrics as metrics
from django_jobs.engine import topic_publish as publishing
from django_jobs.engine import topics as bus
from django_jobs.models import GroupCursor, TopicMetric
from django_jobs.services import TopicRecorder
from django_jobs.spec.topics import new_message
from tests.factories import pruner, race

db = pytest.mark.django_db
# In the future: messages published on the real clock are all older than any of these times.
T0 = (timezone.now() + timedelta(days=1)).replace(second=0, microsecond=0)


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def take(topic="orders", group="billing", *, batch=10, now=None):
    return bus.acquire_batch(topic, group, batch_size=batch, worker_id="w", using="default", now=now or at(1))


def totals(topic="orders", group="billing") -> tuple[int, int, int]:
    """The group's (acked, dead-lettered, expired) over its cursors."""
    rows = GroupCursor.objects.filter(topic=topic, group_name=group)
    return (
        sum(r.acked_count for r in rows),
        sum(r.dead_lettered_count for r in rows),
        sum(r.expired_count for r in rows),
    )


def publish(n: int, *, partition="p", topic="orders", now=None):
    messages = [new_message({"n": i}, partition=partition, cap=1024) for i in range(n)]
    return publishing.publish_messages(topic, messages, using="default", now=now)


@pytest.fixture
def billing():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    return django_jobs.topic("orders").group("billing")


# -- the counters on the cursor ----------------------------------------------------------------------


@db
def test_an_acknowledgement_counts_its_messages_and_a_seek_or_a_refused_ack_counts_none(billing):
    publish(5)
    assert bus.ack_batch(take(batch=2), using="default")
    assert bus.ack_batch(take(batch=10), using="default")
    assert totals() == (5, 0, 0)
    billing.seek("beginning")  # the cursor goes back; what was consumed stays counted
    assert totals() == (5, 0, 0) and billing.total_lag() == 5
    held = take(batch=5)
    billing.seek("end")
    assert not bus.ack_batch(held, using="default")  # refused: the lease was cleared
    assert totals() == (5, 0, 0)
    billing.seek("beginning")
    assert bus.ack_batch(take(batch=5), using="default")
    assert totals() == (10, 0, 0), "consumed again after a seek back: counted again"


@db(transaction=True)
def test_an_acknowledgement_rolled_back_with_its_handler_counts_nothing(billing):
    publish(3)
    batch = take()
    with pytest.raises(RuntimeError), transaction.atomic():  # atomic=True: the handler raised after the ack
        assert bus.ack_batch(batch, using="default")
        raise RuntimeError
    assert totals() == (0, 0, 0)
    assert bus.ack_batch(batch, using="default")
    assert totals() == (3, 0, 0)


@db
def test_dead_letters_count_as_dead_lettered_and_a_retry_or_a_block_counts_nothing(billing):
    publish(2)
    first = take(batch=2, now=at(1))
    assert bus.fail_batch(first, error="x", max_attempts=2, backoff=[1], using="default", now=at(1)) == "retry"
    assert totals() == (0, 0, 0)
    again = take(batch=2, now=at(2))
    assert bus.fail_batch(again, error="x", max_attempts=2, using="default", now=at(2)) == "dead"
    assert totals() == (0, 2, 0)
    publish(2)
    blocked = take(batch=1, now=at(3))
    assert bus.fail_batch(blocked, error="y", max_attempts=1, on_failure="block", using="default") == "blocked"
    assert totals() == (0, 2, 0), "a blocked partition consumed nothing yet"
    billing.skip_partition("p")  # its head goes to the dead letters
    assert totals() == (0, 3, 0)
    billing.seek("beginning")
    assert totals() == (0, 3, 0)


@db
def test_messages_skipped_past_max_wait_count_as_expired(billing):
    django_jobs.topic("orders").configure(max_wait=60)
    publish(2, now=at(0))
    publish(1, now=at(50))
    batch = take(now=at(61))
    assert [m.payload for m in batch.messages] == [{"n": 0}]
    assert totals() == (0, 0, 2)
    bus.ack_batch(batch, using="default")
    assert totals() == (1, 0, 2)


@db
def test_each_group_counts_apart(billing):
    bus.ensure_group("orders", "email", start_from="beginning", using="default")
    publish(4)
    bus.ack_batch(take(batch=4), using="default")
    assert totals("orders", "billing") == (4, 0, 0) and totals("orders", "email") == (0, 0, 0)


# -- snapshots ---------------------------------------------------------------------------------------


def snapshot_rows(minute=None):
    rows = TopicMetric.objects.order_by("topic", "group_name", "minute")
    if minute is not None:
        rows = rows.filter(minute=minute)
    return list(rows.values_list("topic", "group_name", "published", "acked", "dead_lettered", "expired"))


@db
def test_a_snapshot_copies_every_topics_and_groups_totals_once_per_minute(billing):
    publish(5)
    publish(2, topic="refunds")  # a topic without a group: its published total only
    bus.ack_batch(take(batch=3), using="default")
    done = metrics.record_topic_totals(using="default", now=at(5))
    assert (done.minute, done.taken_at, done.rows) == (T0, at(5), 3)
    assert snapshot_rows() == [
        ("orders", "", 5, 0, 0, 0),
        ("orders", "billing", 0, 3, 0, 0),
        ("refunds", "", 2, 0, 0, 0),
    ]
    publish(1)
    assert metrics.record_topic_totals(using="default", now=at(40)).rows == 0, "the minute has its snapshot"
    assert snapshot_rows(T0)[0] == ("orders", "", 5, 0, 0, 0)
    assert metrics.record_topic_totals(using="default", now=at(61)).rows == 3
    assert snapshot_rows(at(60))[0] == ("orders", "", 6, 0, 0, 0)
    assert TopicMetric.objects.get(topic="orders", group_name="", minute=at(60)).taken_at == at(61)


@db(transaction=True)
def test_two_writers_of_the_same_minutes_write_each_series_once(billing):
    """Two recorders (the leaders of two backend aliases on one database) write the same
    minutes at the same moments: the unique constraint keeps one row per series and minute."""
    publish(3)
    minutes = 20
    for i in range(minutes):
        race(2, lambda _, i=i: metrics.record_topic_totals(using="default", now=at(60 * i + 1)))
    assert TopicMetric.objects.filter(group_name="").count() == minutes
    assert TopicMetric.objects.filter(group_name="billing").count() == minutes
    assert set(TopicMetric.objects.values_list("published", flat=True)) == {0, 3}


@db
def test_the_recorder_reads_the_database_once_a_minute(billing, django_assert_num_queries):
    publish(1)
    recorder = TopicRecorder(using="default", settings=get_settings(), interval=0.5)
    assert recorder.run_once() == {"snapshots": 2}
    with django_assert_num_queries(0):
        assert recorder.run_once() == {"snapshots": 0}, "the same minute: nothing asked"
    assert recorder.run_once(now=at(0)) == {"snapshots": 2}, "a given time is always recorded"
    assert recorder.run_once(now=at(30)) == {"snapshots": 0}


@db
def test_the_pruner_deletes_snapshots_older_than_metrics_keep_days(billing):
    publish(1)
    now = timezone.now()
    metrics.record_topic_totals(using="default", now=now - timedelta(days=3))
    metrics.record_topic_totals(using="default", now=now - timedelta(days=1))
    counts = pruner(METRICS_KEEP_DAYS=2).run_once(now=now)
    assert counts["topic_metrics"] == 2
    assert TopicMetric.objects.count() == 2 and TopicMetric.objects.filter(minute__gt=now - timedelta(days=2)).count()


# -- rates and flows -----------------------------------------------------------------------------------


@db
def test_rates_are_the_growth_since_the_snapshot_five_minutes_ago_per_minute(billing):
    now = timezone.now() + timedelta(minutes=1)  # later than the messages published below
    publish(4)
    assert console.topic_overview(using="default", now=now)[0].rates is None, "no snapshot yet"
    metrics.record_topic_totals(using="default", now=now - timedelta(minutes=6))
    publish(2)  # before the window: not in the rate
    metrics.record_topic_totals(using="default", now=now - timedelta(minutes=5))
    publish(10)
    bus.ack_batch(take(batch=4, now=now), using="default")
    assert bus.fail_batch(take(batch=1, now=now), error="x", max_attempts=1, using="default", now=now) == "dead"
    [orders] = console.topic_overview(using="default", now=now)
    assert orders.rates.minutes == pytest.approx(5) and orders.published_per_minute == pytest.approx(2.0)
    [group] = orders.groups
    assert (group.acked, group.dead_lettered, group.expired) == (4, 1, 0)
    assert (group.rates.acked, group.rates.dead_lettered) == (pytest.approx(0.8), pytest.approx(0.2))
    assert group.consumed_per_minute == pytest.approx(1.0)


@db
def test_a_young_install_measures_from_its_oldest_snapshot_a_minute_old(billing):
    now = timezone.now()
    publish(1)  # a topic has a snapshot once it has a partition
    metrics.record_topic_totals(using="default", now=now - timedelta(seconds=30))
    publish(3)
    assert console.topic_overview(using="default", now=now)[0].rates is None, "half a minute says little"
    TopicMetric.objects.update(taken_at=now - timedelta(minutes=2))
    assert console.topic_overview(using="default", now=now)[0].published_per_minute == pytest.approx(1.5)


@db
def test_a_flow_gives_each_minute_its_growth_and_spreads_a_gap_over_its_minutes(billing):
    now = timezone.now().replace(second=30, microsecond=0)
    minute = now.replace(second=0)
    publish(1)  # a topic has a snapshot once it has a partition
    # (minutes ago, messages published after that minute's snapshot)
    steps = [(10, 7), (9, 2), (8, 3), (5, 4), (0, 5)]
    for ago, n in steps:
        metrics.record_topic_totals(using="default", now=minute - timedelta(minutes=ago, seconds=-1))
        publish(n)
    detail = console.topic_detail(using="default", name="orders", now=now)
    per_minute = {m.start: m.published for m in detail.flow.minutes}
    assert len(detail.flow.minutes) == 60 and detail.flow.minutes[-1].start == minute
    assert per_minute[minute - timedelta(minutes=10)] == 7
    assert per_minute[minute - timedelta(minutes=9)] == 2
    for ago in (8, 7, 6):  # three minutes without a snapshot share the growth
        assert per_minute[minute - timedelta(minutes=ago)] == pytest.approx(1.0)
    for ago in (5, 4, 3, 2, 1):
        assert per_minute[minute - timedelta(minutes=ago)] == pytest.approx(0.8)
    assert per_minute[minute] == 5, "the current minute: from its snapshot up to now"
    assert per_minute[minute - timedelta(minutes=11)] == 0, "before the first snapshot"
    assert detail.flow.published == pytest.approx(21)
    assert detail.group_flows["billing"].acked == 0


@db
def test_the_figures_read_grouped_small_tables_never_the_messages(billing, django_assert_num_queries):
    publish(3)
    metrics.record_topic_totals(using="default", now=timezone.now() - timedelta(minutes=5))
    with django_assert_num_queries(8) as overview:
        console.topic_overview(using="default")
    with django_assert_num_queries(4) as scrape:  # what a Prometheus scrape reads of the topics
        console.topic_counters(using="default")
    sql = [q["sql"] for q in overview.captured_queries + scrape.captured_queries]
    assert not [q for q in sql if "django_jobs_message" in q]

"""Bus mode's engine contract (``engine.topics``, ``engine.topic_control``), the same on every
database: publish (positions, transaction ids, max size), the cursor and lease of a group per
partition (order, one batch at a time, late acks refused, expiry and takeover), failures
(retry, dead letters, block), groups apart, seek, pause, lag, delay, max wait, window buffer,
retention. Time is passed as ``now``.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import close_old_connections, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_jobs
from django_jobs.drivers import driver
from django_jobs.engine import topic_control as control
from django_jobs.engine import topic_publish as publishing
from django_jobs.engine import topics as bus
from django_jobs.exceptions import (
    InvalidPublishOption,
    InvalidSeek,
    InvalidTopicName,
    InvalidTopicSetting,
    PartitionNotBlocked,
    PayloadTooLarge,
    TopicFull,
)
from django_jobs.models import DeadLetter, GroupCursor, Message, TopicPartition

db = pytest.mark.django_db
# In the future: messages published on the real clock are all older than any of these times.
T0 = (timezone.now() + timedelta(days=1)).replace(microsecond=0)


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def publish(topic: str, *payloads, partition=None, **kw):
    t = django_jobs.topic(topic)
    return [t.publish(p, partition=partition, **kw) for p in payloads]


def take(topic, group, *, batch=10, now=None, worker="w1"):
    return bus.acquire_batch(topic, group, batch_size=batch, worker_id=worker, using="default", now=now or at(1))


def payloads(batch):
    return [m.payload for m in batch.messages]


# -- publish ---------------------------------------------------------------------------------------------


@db
def test_publish_stores_one_row_per_message_with_consecutive_positions_per_partition():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    bus.ensure_group("orders", "email", start_from="beginning", using="default")
    a = publish("orders", {"n": 1}, {"n": 2}, partition="a")
    b = publish("orders", {"n": 3}, partition="b")
    assert [p.position for p in a] == [1, 2] and b[0].position == 1
    assert Message.objects.count() == 3  # not one per group
    assert GroupCursor.objects.filter(topic="orders").count() == 4  # 2 partitions x 2 groups


@db(transaction=True)
def test_publish_is_part_of_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        publish("orders", 1)
        raise RuntimeError
    assert not Message.objects.exists()
    publish("orders", 2)
    assert list(Message.objects.values_list("payload", "position")) == [(2, 1)]


@db
def test_a_transaction_id_is_published_once_and_its_repeat_returns_the_first_message():
    first = django_jobs.topic("orders").publish({"n": 1}, transaction_id="order-1")
    again = django_jobs.topic("orders").publish({"n": 2}, transaction_id="order-1")
    other_topic = django_jobs.topic("refunds").publish({"n": 3}, transaction_id="order-1")
    assert not first.duplicate and again.duplicate and again.id == first.id and again.position == 1
    assert not other_topic.duplicate
    many = django_jobs.topic("orders").publish_many(
        [{"payload": 4, "transaction_id": "x"}, {"payload": 5, "transaction_id": "x"}, {"payload": 6}]
    )
    assert [m.duplicate for m in many] == [False, True, False] and many[0].id == many[1].id
    assert Message.objects.filter(topic="orders").count() == 3


@db(transaction=True)
def test_concurrent_publishers_of_one_transaction_id_store_it_once():
    barrier = threading.Barrier(4)
    results = []

    def publisher():
        try:
            barrier.wait()
            results.append(django_jobs.topic("orders").publish({"n": 1}, partition=None, transaction_id="t-1"))
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=publisher) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 4
    assert len({r.id for r in results}) == 1 and sum(not r.duplicate for r in results) == 1
    assert Message.objects.count() == 1


@db
def test_publish_refuses_bad_input_with_specific_errors():
    t = django_jobs.topic("orders")
    with pytest.raises(InvalidTopicName):
        django_jobs.topic("bad name")
    with pytest.raises(InvalidPublishOption):
        t.publish(1, partition=5)
    with pytest.raises(InvalidPublishOption):
        t.publish(1, transaction_id="x" * 256)
    with pytest.raises(InvalidPublishOption):
        t.publish(1, delay=-1)
    with pytest.raises(InvalidPublishOption):
        t.publish_many([{"payload": 1, "colour": "red"}])
    with pytest.raises(django_jobs.exceptions.InvalidTaskArguments):
        t.publish({1: object()})
    with pytest.raises(PayloadTooLarge):
        t.publish("x" * (1024 * 1024 + 1))
    with pytest.raises(InvalidTopicSetting):
        t.configure(max_size=0)
    with pytest.raises(InvalidTopicSetting):
        t.configure(lease=0.5)
    with pytest.raises(InvalidTopicSetting):
        t.configure(colour=1)
    assert not Message.objects.exists()


@db
def test_max_size_bounds_the_largest_backlog_of_any_group():
    t = django_jobs.topic("orders")
    t.configure(max_size=3)
    bus.ensure_group("orders", "fast", start_from="beginning", using="default")
    bus.ensure_group("orders", "slow", start_from="beginning", using="default")
    t.publish_many([{"payload": i} for i in range(3)])
    with pytest.raises(TopicFull) as caught:
        t.publish(4)
    assert (caught.value.size, caught.value.limit, caught.value.adding) == (3, 3, 1)
    with pytest.raises(TopicFull):  # all or nothing
        t.publish_many([{"payload": 1}, {"payload": 2}])
    bus.ack_batch(take("orders", "fast"), using="default")
    with pytest.raises(TopicFull):  # "slow" still has 3 to consume
        t.publish(4)
    bus.ack_batch(take("orders", "slow", batch=1), using="default")
    t.publish(4)
    assert Message.objects.count() == 4
    t.configure(max_size=None)
    t.publish_many([{"payload": i} for i in range(10)])


@db
def test_a_single_publish_is_one_statement_where_the_database_can():
    if not driver("default").PUBLISH_ONE:
        pytest.skip("one-statement publish is PostgreSQL's; elsewhere the general path (the tests above)")
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    t = django_jobs.topic("orders")
    t.publish(0, partition="a")  # the partition exists
    with CaptureQueriesContext(connection) as first:
        existing = t.publish({"n": 1}, partition="a")
    with CaptureQueriesContext(connection) as second:
        new = t.publish({"n": 2}, partition="b")  # a new partition: its cursor comes with it
    assert (len(first), len(second)) == (1, 1), [q["sql"][:80] for q in [*first, *second]]
    assert (existing.position, new.position) == (2, 1)
    assert GroupCursor.objects.filter(topic="orders", group_name="billing").count() == 2
    batch = take("orders", "billing", batch=10, now=at(1))
    assert batch is not None
    got = {batch.partition: payloads(batch)}
    bus.ack_batch(batch, using="default")
    batch = take("orders", "billing", batch=10, now=at(1))
    got[batch.partition] = payloads(batch)
    assert got == {"a": [0, {"n": 1}], "b": [{"n": 2}]}


@db
def test_a_single_publish_waits_its_own_delay_else_the_topics_else_the_declared_one():
    t = django_jobs.topic("orders")

    def delay_of(published) -> float:
        m = Message.objects.get(id=published.id)
        return (m.available_at - m.created_at).total_seconds()

    with override_settings(DJANGO_JOBS={"TOPICS": {"orders": {"delay": 3}}}):
        assert delay_of(t.publish(1)) == 3
        assert delay_of(t.publish(2, delay=5)) == 5
        t.configure(delay=7)
        assert delay_of(t.publish(3)) == 7
        assert delay_of(t.publish(4, delay=0)) == 0
    t.configure(delay=None)
    assert delay_of(t.publish(5)) == 0


@db
def test_a_declared_max_size_bounds_a_single_publish():
    with override_settings(DJANGO_JOBS={"TOPICS": {"orders": {"max_size": 1}}}):
        bus.ensure_group("orders", "billing", start_from="beginning", using="default")
        t = django_jobs.topic("orders")
        t.publish(1)
        with pytest.raises(TopicFull):
            t.publish(2)
    assert Message.objects.filter(topic="orders").count() == 1


@db(transaction=True)
def test_a_single_publish_wakes_the_topics_consumers_on_commit():
    if not driver("default").LISTEN_NOTIFY:
        pytest.skip("wake-ups are PostgreSQL's LISTEN/NOTIFY; other databases poll")
    import psycopg

    from django_jobs.conf import get_settings

    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"], port=settings["PORT"] or 5432, user=settings["USER"],
        password=settings["PASSWORD"], dbname=settings["NAME"], autocommit=True,
    ) as listener:  # fmt: skip
        listener.execute(f"LISTEN {get_settings().NOTIFY_CHANNEL}")
        with transaction.atomic():
            django_jobs.topic("orders").publish(1)
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # not before the commit
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == ["topic:orders"]


# -- consume: order, leases, acks ------------------------------------------------------------------------


@db
def test_a_group_receives_a_partition_in_order_one_batch_at_a_time():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publish("orders", *range(5), partition="p")
    first = take("orders", "billing", batch=2)
    assert payloads(first) == [0, 1] and first.start == 0 and first.end == 2
    assert take("orders", "billing", batch=2, worker="w2") is None  # the partition is leased
    assert bus.ack_batch(first, using="default")
    second = take("orders", "billing", batch=2, worker="w2")
    assert payloads(second) == [2, 3]


@db
def test_groups_have_their_own_cursors_and_never_wait_for_each_other():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    bus.ensure_group("orders", "email", start_from="beginning", using="default")
    publish("orders", 1, 2, partition="p")
    billing = take("orders", "billing")  # held, never acknowledged
    email = take("orders", "email")
    assert payloads(billing) == payloads(email) == [1, 2]
    assert bus.ack_batch(email, using="default")
    assert dict(django_jobs.topic("orders").group("email").lag()) == {"p": 0}
    assert django_jobs.topic("orders").group("billing").lag() == {"p": 2}


@db
def test_an_expired_lease_is_taken_over_and_the_late_ack_is_refused():
    django_jobs.topic("orders").configure(lease=10)
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publish("orders", 1, 2, 3, partition="p")
    dead = take("orders", "billing", batch=2, now=at(0))
    assert take("orders", "billing", now=at(9)) is None
    again = take("orders", "billing", batch=2, now=at(10), worker="w2")
    assert payloads(again) == [1, 2] and again.token != dead.token  # the same batch, in order
    assert again.attempt == 2  # the takeover counts an attempt
    assert not bus.ack_batch(dead, using="default")
    assert bus.fail_batch(dead, error="late", max_attempts=3, using="default") == "lost"
    assert bus.ack_batch(again, using="default")
    third = take("orders", "billing", now=at(11))
    assert payloads(third) == [3] and third.attempt == 1  # an ack starts the next batch afresh


@db
def test_renewing_a_lease_keeps_the_partition():
    django_jobs.topic("orders").configure(lease=10)
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publish("orders", 1, partition="p")
    held = take("orders", "billing", now=at(0))
    assert bus.renew_batch_lease(held, lease_seconds=10, using="default", now=at(8))
    assert take("orders", "billing", now=at(12)) is None
    assert bus.release_batch(held, using="default")
    assert payloads(take("orders", "billing", now=at(12))) == [1]


@db
def test_start_from_new_skips_what_was_published_before_the_group_existed():
    publish("orders", 1, partition="p")
    bus.ensure_group("orders", "late", start_from="new", using="default")
    bus.ensure_group("orders", "replay", start_from="beginning", using="default")
    publish("orders", 2, partition="p")
    publish("orders", 3, partition="q")  # a partition the groups never saw: from its start
    got = []
    while (b := take("orders", "late")) is not None:
        got += payloads(b)
        bus.ack_batch(b, using="default")
    assert sorted(got) == [2, 3]
    assert sum(django_jobs.topic("orders").group("replay").lag().values()) == 3


# -- failures --------------------------------------------------------------------------------------------


@db
def test_a_failed_batch_is_retried_after_its_backoff_then_dead_lettered_and_the_partition_moves_on():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publish("orders", "bad", "good", partition="p")
    options = {"max_attempts": 2, "backoff": [30], "using": "default"}
    first = take("orders", "billing", batch=1, now=at(0))
    assert bus.fail_batch(first, error="boom", now=at(0), **options) == "retry"
    assert take("orders", "billing", now=at(29)) is None
    second = take("orders", "billing", batch=1, now=at(30))
    assert payloads(second) == ["bad"] and second.attempt == 2
    assert bus.fail_batch(second, error="boom again", traceback="Traceback...", now=at(30), **options) == "dead"
    letter = DeadLetter.objects.get()
    assert (letter.payload, letter.error, letter.traceback, letter.attempts) == ("bad", "boom again", "Traceback...", 2)
    assert payloads(take("orders", "billing", now=at(31))) == ["good"]


@db
def test_on_failure_block_stops_the_partition_until_an_operator_retries_or_skips():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publish("orders", "bad", "next", partition="p")
    publish("orders", "other", partition="q")
    group = django_jobs.topic("orders").group("billing")
    b = take("orders", "billing", batch=1, now=at(0))
    q_first = b.partition == "q"
    if q_first:  # take p's head: the order partitions are handed out in is not the point here
        bus.ack_batch(b, using="default")
        b = take("orders", "billing", batch=1, now=at(0))
    assert bus.fail_batch(b, error="no", max_attempts=1, on_failure="block", using="default") == "blocked"
    rest = take("orders", "billing", now=at(1))
    assert rest is None or rest.partition == "q"  # other partitions go on
    if rest is not None:
        bus.ack_batch(rest, using="default")
    assert take("orders", "billing", now=at(100)) is None
    assert [p.blocked for p in group.partitions() if p.partition == "p"] == [True]
    group.retry_partition("p")
    again = take("orders", "billing", batch=1, now=at(101))
    assert payloads(again) == ["bad"] and again.attempt == 1
    assert bus.fail_batch(again, error="still no", max_attempts=1, on_failure="block", using="default") == "blocked"
    assert group.skip_partition("p") == again.messages[0].id
    assert DeadLetter.objects.get().payload == "bad"
    assert payloads(take("orders", "billing", now=at(102))) == ["next"]
    with pytest.raises(PartitionNotBlocked):
        group.retry_partition("p")


@db
def test_dead_letters_are_replayed_once_each_and_deleted_on_success():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publish("orders", 1, 2, partition="p")
    for _ in range(2):
        b = take("orders", "billing", batch=1)
        bus.fail_batch(b, error="x", max_attempts=1, using="default")
    group = django_jobs.topic("orders").group("billing")
    ids = list(group.dead_letters().values_list("id", flat=True))
    assert control.claim_replay("orders", "billing", lease_seconds=30, using="default") is None
    assert group.replay(ids[:1]) == 1
    replay = control.claim_replay("orders", "billing", lease_seconds=30, using="default", now=at(0))
    assert replay.message.payload == 1
    assert control.claim_replay("orders", "billing", lease_seconds=30, using="default", now=at(1)) is None
    assert control.settle_replay(replay, error=None, using="default")
    assert list(group.dead_letters().values_list("payload", flat=True)) == [2]
    assert group.replay() == 1
    replay = control.claim_replay("orders", "billing", lease_seconds=30, using="default", now=at(0))
    assert control.settle_replay(replay, error="again", using="default")
    letter = group.dead_letters().get()
    assert (letter.state, letter.error, letter.attempts) == ("dead", "again", 2)


# -- operator: seek, pause, lag -------------------------------------------------------------------------


@db
def test_seek_moves_the_cursors_and_refuses_the_old_lease_holders_ack():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    published = publish("orders", 1, 2, 3, partition="p")
    group = django_jobs.topic("orders").group("billing")
    held = take("orders", "billing", batch=1)
    group.seek("end")
    assert not bus.ack_batch(held, using="default")
    assert group.lag() == {"p": 0}
    group.seek(published[1].id)
    assert payloads(take("orders", "billing")) == [2, 3]
    group.seek("beginning")
    assert group.lag() == {"p": 3}
    with pytest.raises(InvalidSeek):
        group.seek("yesterday")
    with pytest.raises(InvalidSeek):
        group.seek(10**12)


@db
def test_seek_to_a_datetime_starts_at_the_first_message_published_then():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publishing.publish_messages("orders", [_msg(1)], using="default", now=at(0))
    publishing.publish_messages("orders", [_msg(2)], using="default", now=at(10))
    group = django_jobs.topic("orders").group("billing")
    group.seek(at(5))
    assert payloads(take("orders", "billing", now=at(11))) == [2]


def _msg(payload, **kw):
    from django_jobs.spec.topics import new_message

    return new_message(payload, cap=1024, **kw)


@db
def test_a_paused_group_gets_nothing_until_resumed():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publish("orders", 1)
    group = django_jobs.topic("orders").group("billing")
    group.pause()
    assert take("orders", "billing") is None
    group.resume()
    assert payloads(take("orders", "billing")) == [1]


# -- time: delay, max wait, window buffer, retention -----------------------------------------------------


@db
def test_a_delayed_message_waits_and_holds_back_its_partition():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publishing.publish_messages("orders", [_msg(1, delay=10), _msg(2)], using="default", now=at(0))
    assert take("orders", "billing", now=at(5)) is None
    assert payloads(take("orders", "billing", now=at(10))) == [1, 2]


@db
def test_messages_older_than_max_wait_are_skipped_and_counted():
    django_jobs.topic("orders").configure(max_wait=60)
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publishing.publish_messages("orders", [_msg(1), _msg(2)], using="default", now=at(0))
    publishing.publish_messages("orders", [_msg(3)], using="default", now=at(50))
    assert payloads(take("orders", "billing", now=at(61))) == [3]
    assert [p.expired for p in control.group_lag("orders", "billing", using="default")] == [2]


@db
def test_a_partition_is_handed_out_once_its_newest_message_is_older_than_the_window_buffer():
    django_jobs.topic("orders").configure(window_buffer=5)
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    publishing.publish_messages("orders", [_msg(1)], using="default", now=at(0))
    publishing.publish_messages("orders", [_msg(2)], using="default", now=at(3))
    assert take("orders", "billing", now=at(6)) is None
    assert payloads(take("orders", "billing", now=at(8))) == [1, 2]


@db
def test_retention_deletes_what_every_group_consumed_and_anything_past_max_age():
    t = django_jobs.topic("orders")
    t.configure(retention=60, max_age=3600)
    bus.ensure_group("orders", "a", start_from="beginning", using="default")
    bus.ensure_group("orders", "b", start_from="beginning", using="default")
    publishing.publish_messages("orders", [_msg(1), _msg(2)], using="default", now=at(0))
    bus.ack_batch(take("orders", "a", now=at(1)), using="default")
    bus.ack_batch(take("orders", "b", batch=1, now=at(1)), using="default")
    assert t.prune(now=at(30)) == 0  # too young
    assert t.prune(now=at(61)) == 1  # "b" has not consumed the second
    assert list(Message.objects.values_list("payload", flat=True)) == [2]
    assert t.prune(now=at(3601)) == 1
    assert TopicPartition.objects.get().last_position == 2  # positions are never reused


@db
def test_names_and_transaction_ids_that_differ_only_by_case_or_trailing_space_are_distinct():
    # MariaDB/MySQL compare these columns exactly too (migration 0012 gives them a binary collation).
    a = django_jobs.topic("Orders").publish(1, partition="P", transaction_id="T")
    b = django_jobs.topic("orders").publish(2, partition="P", transaction_id="t")
    c = django_jobs.topic("orders").publish(3, partition="p ", transaction_id="t ")
    assert not (a.duplicate or b.duplicate or c.duplicate)
    assert (a.position, b.position, c.position) == (1, 1, 1)
    assert TopicPartition.objects.count() == 3

"""Bus mode's declarations and their errors: ``@subscriber`` options, one handler per group,
``DJANGO_JOBS["TOPICS"]`` (check E002), ``runworker --topics``, and the handler's call through
the worker's consumer (a thread worker in this process)."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Sum
from django.test import override_settings

import django_jobs
from django_jobs.conf import get_settings
from django_jobs.engine import topics as bus
from django_jobs.exceptions import InvalidSubscriber, InvalidTopicName, InvalidTopicSetting
from django_jobs.models import GroupCursor, TopicMetric
from django_jobs.spec import topics as spec
from django_jobs.spec.settings import settings_problems
from tests.conftest import wait_until


def handler(message, context):
    return None


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"batch": 0}, "batch must be an integer from 1 to 1000"),
        ({"batch": True}, "batch must be an integer"),
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ({"on_failure": "ignore"}, 'on_failure must be "dead_letter" or "block"'),
        ({"atomic": 1}, "atomic must be True or False"),
        ({"concurrency": 0}, "concurrency must be an integer from 1 to 100"),
        ({"start_from": "yesterday"}, "start_from must be"),
        ({"start_from": datetime(2026, 1, 1)}, "start_from must be"),  # naive
        ({"backoff": "linear"}, "backoff"),
        ({"backoff": handler}, "A subscriber's backoff is"),
        ({"colour": "red"}, "Unknown subscriber option(s): colour"),
    ],
)
def test_subscriber_options_are_validated_with_a_specific_message(options, error, registry):
    with pytest.raises(InvalidSubscriber, match=error.replace("(", r"\(").replace(")", r"\)")):
        django_jobs.subscriber("orders", group="billing", **options)(handler)
    assert ("orders", "billing") not in spec._registry


def test_topic_and_group_names_are_validated(registry):
    with pytest.raises(InvalidTopicName, match="Invalid topic name"):
        django_jobs.subscriber("no spaces", group="billing")(handler)
    with pytest.raises(InvalidTopicName, match="Invalid group name"):
        django_jobs.subscriber("orders", group="")(handler)


def test_a_group_has_one_handler_per_topic(registry):
    def other(message, context):
        return None

    sub = django_jobs.subscriber("orders", group="billing", batch=5)(handler)
    assert sub.batch == 5 and sub(None, None) is None  # still callable
    django_jobs.subscriber("orders", group="billing")(handler)  # the same function again: a reload
    with pytest.raises(InvalidSubscriber, match="already has a subscriber"):
        django_jobs.subscriber("orders", group="billing")(other)
    django_jobs.subscriber("orders", group="email")(other)


def test_topics_declared_in_settings_are_validated():
    with override_settings(DJANGO_JOBS={"TOPICS": {"orders": {"lease": 0}}}):
        assert any("TOPICS" in p and "lease" in p for p in settings_problems(get_settings()))
    with override_settings(DJANGO_JOBS={"TOPICS": {"orders": {"colour": 1}}}):
        assert any("Unknown topic setting 'colour'" in p for p in settings_problems(get_settings()))
    with override_settings(DJANGO_JOBS={"TOPICS": {"orders": {"max_size": 10, "retention": 60}}}):
        assert settings_problems(get_settings()) == []
    with pytest.raises(InvalidTopicSetting):
        spec.validate_topic_declarations(["orders"])


@pytest.mark.django_db
def test_declared_settings_apply_until_configure_overrides_them():
    with override_settings(DJANGO_JOBS={"TOPICS": {"orders": {"max_size": 10, "lease": 60}}}):
        t = django_jobs.topic("orders")
        assert (t.config.max_size, t.config.lease_seconds) == (10, 60)
        t.configure(max_size=20)
        assert (t.config.max_size, t.config.lease_seconds) == (20, 60)
        t.configure(max_size=None)
        assert t.config.max_size == 10


@pytest.mark.django_db
def test_runworker_refuses_a_topic_without_subscriber():
    with pytest.raises(CommandError, match="No subscriber for topic"):
        call_command("runworker", "--topics", "nobody-listens", "--max-time", "1")


@pytest.mark.django_db(transaction=True)
def test_a_thread_worker_runs_a_subscriber_alongside_jobs(registry, thread_worker):
    seen = []

    @django_jobs.subscriber("inproc", group="g", start_from="beginning", batch=3)
    def collect(messages, context):
        seen.extend((m.payload, context.partition, context.attempt) for m in messages)

    django_jobs.topic("inproc").publish_many([{"payload": n} for n in range(5)])
    worker = thread_worker(topics=["inproc"])
    wait_until(lambda: len(seen) == 5, timeout=30, message="five messages handled")
    assert [p for p, _, _ in seen] == [0, 1, 2, 3, 4] and {a for _, _, a in seen} == {1}
    wait_until(lambda: django_jobs.topic("inproc").group("g").total_lag() == 0, timeout=30)
    worker.stop()
    # A worker told to run no topic runs none.
    quiet = thread_worker(topics=[])
    assert quiet.worker._consumer is None


@pytest.mark.django_db(transaction=True)
def test_a_batch_whose_workers_keep_dying_goes_to_the_dead_letters_unrun(registry, thread_worker):
    ran = []

    @django_jobs.subscriber("poison", group="g", start_from="beginning", max_attempts=1)
    def handle(message, context):
        ran.append(message.payload)

    bus.ensure_group("poison", "g", start_from="beginning", using="default")
    django_jobs.topic("poison").configure(lease=1)
    django_jobs.topic("poison").publish_many([{"payload": "kills"}, {"payload": "fine"}])
    # A worker takes "kills" and dies: its lease expires a second later.
    dead = bus.acquire_batch("poison", "g", batch_size=1, worker_id="dead", using="default")
    assert dead.messages[0].payload == "kills"
    thread_worker(topics=["poison"])
    wait_until(lambda: ran == ["fine"], timeout=30, message="the next message handled")
    letter = django_jobs.topic("poison").group("g").dead_letters().get()
    assert letter.payload == "kills" and "died" in letter.error and letter.attempts == 2


@pytest.mark.django_db(transaction=True)
def test_a_worker_counts_what_its_subscribers_consume_and_records_the_totals(registry, thread_worker):
    @django_jobs.subscriber("counted", group="fine", start_from="beginning", batch=2)
    def fine(messages, context):
        return None

    @django_jobs.subscriber("counted", group="fails", start_from="beginning", max_attempts=1)
    def fails(message, context):
        raise ValueError("no")

    for group in ("fine", "fails"):
        bus.ensure_group("counted", group, start_from="beginning", using="default")
    django_jobs.topic("counted").publish_many([{"payload": n} for n in range(5)])
    thread_worker(topics=["counted"])

    def consumed(group):
        return GroupCursor.objects.filter(topic="counted", group_name=group).aggregate(
            acked=Sum("acked_count"), dead=Sum("dead_lettered_count")
        )

    wait_until(lambda: consumed("fine") == {"acked": 5, "dead": 0}, timeout=30, message="five acknowledged")
    wait_until(lambda: consumed("fails") == {"acked": 0, "dead": 5}, timeout=30, message="five dead letters")
    # The worker leads (it is alone): its TopicRecorder writes this minute's totals.
    wait_until(lambda: TopicMetric.objects.filter(topic="counted").count() >= 3, timeout=30, message="a snapshot")
    snapshot = {
        g: (published, acked, dead)
        for g, published, acked, dead in TopicMetric.objects.filter(topic="counted")
        .order_by("minute")
        .values_list("group_name", "published", "acked", "dead_lettered")
    }
    assert snapshot[""][0] == 5 and set(snapshot) == {"", "fine", "fails"}

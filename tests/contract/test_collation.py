"""Names and keys compare exactly on every database: strings that differ only by case, accents or
trailing spaces are different dedup keys, idempotency keys, partitions, queues and schedules.

PostgreSQL and SQLite compare strings byte for byte; MySQL/MariaDB compare in the column's
collation, by default case- and accent-insensitive and blind to trailing spaces, until migration
0010 moved these columns to a binary NO PAD collation. The last test checks that schema on
MySQL/MariaDB, so that a later migration restating one of the columns cannot undo it unnoticed.
"""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

import django_jobs
from django_jobs import Dedup, QueueFull, engine, schedules
from django_jobs.models import Event, Job, JobDedup, JobStart, Metric, QueueState, Schedule
from tests import factories, tasks_limits
from tests.factories import claim, claim_gated, insert_job

db = pytest.mark.django_db

T0 = datetime(2031, 5, 6, 7, 8, tzinfo=UTC)

#: Two keys that one case-, accent- or space-blind comparison would take for one.
KEY_PAIRS = pytest.mark.parametrize(
    ("first", "second"),
    [("Order-1", "order-1"), ("café", "cafe"), ("order-1", "order-1 ")],
    ids=["case", "accent", "trailing-space"],
)
#: Queue names allow letters, digits and "_-.:" only: they can differ by case alone.
UPPER, LOWER = "Emails", "emails"


def enqueue(queue: str = "default", **options):
    return tasks_limits.quick.using(queue_name=queue, **options).enqueue()


def claimed_queues(claimed) -> list[str]:
    return sorted(c.queue for c in claimed)


# -- keys -------------------------------------------------------------------------------------------


@db
@KEY_PAIRS
def test_dedup_keys_that_differ_only_by_case_accents_or_trailing_spaces_are_two_jobs(first, second):
    a, b = enqueue(dedup=Dedup(first)), enqueue(dedup=Dedup(second))
    assert (a.duplicate, b.duplicate) == (False, False)
    assert a.id != b.id
    again = enqueue(dedup=Dedup(second))
    assert (again.id, again.duplicate) == (b.id, True), "the same key is still deduplicated"
    assert sorted(JobDedup.objects.values_list("key", flat=True)) == sorted([first, second])
    assert Job.objects.get(id=a.id).dedup_key == first and Job.objects.get(id=b.id).dedup_key == second


@db
@KEY_PAIRS
def test_idempotency_keys_that_differ_only_by_case_accents_or_trailing_spaces_are_two_jobs(first, second):
    a, b = enqueue(idempotency_key=first), enqueue(idempotency_key=second)
    assert (a.duplicate, b.duplicate) == (False, False)
    assert a.id != b.id
    again = enqueue(idempotency_key=first)
    assert (again.id, again.duplicate) == (a.id, True), "the same key still names its job"
    assert str(Job.objects.get(idempotency_key=second).id) == b.id


@db
@KEY_PAIRS
def test_partitions_that_differ_only_by_case_accents_or_trailing_spaces_run_side_by_side(first, second):
    heads = [insert_job(partition=first, now=T0), insert_job(partition=second, now=T0)]
    insert_job(partition=first, now=T0)  # waits for its head
    claimed = claim(now=T0)
    assert {c.id for c in claimed} == {j.id for j in heads}
    assert sorted(c.partition_key for c in claimed) == sorted([first, second])
    assert claim(now=T0) == []


@db
@KEY_PAIRS
def test_a_partition_rate_limit_counts_the_starts_of_its_own_partition_only(first, second):
    django_jobs.queue("rl").set_partition_rate_limit(1, per_seconds=60)
    for partition in (first, first, second):
        insert_job(partition=partition, queue="rl", now=T0)
    claimed, _ = claim_gated("rl", now=T0)
    assert sorted(c.partition_key for c in claimed) == sorted([first, second])
    for c in claimed:
        factories.finish(c, now=T0)
    assert claim_gated("rl", now=T0 + timedelta(seconds=1))[0] == [], "first's one start in the window is used"
    assert sorted(JobStart.objects.values_list("partition_key", flat=True)) == sorted([first, second])


# -- queues -----------------------------------------------------------------------------------------


@db
def test_queues_that_differ_only_by_case_are_claimed_apart():
    for queue in (UPPER, LOWER, LOWER):
        enqueue(queue)
    assert claimed_queues(claim(queues=[LOWER], now=T0)) == [LOWER, LOWER]
    assert claimed_queues(claim(queues=[LOWER], now=T0)) == []
    assert claimed_queues(claim(queues=[UPPER], now=T0)) == [UPPER]


@db
def test_queues_that_differ_only_by_case_have_their_own_limits():
    django_jobs.queue(UPPER).configure(max_size=1, concurrency=1)
    django_jobs.queue(LOWER).configure(max_size=3)
    assert sorted(QueueState.objects.values_list("name", "max_size")) == [(UPPER, 1), (LOWER, 3)]
    assert engine.gated_queues(using="default", queues=None) == [UPPER]

    enqueue(UPPER)
    with pytest.raises(QueueFull):
        enqueue(UPPER)
    for _ in range(3):
        enqueue(LOWER)
    with pytest.raises(QueueFull):
        enqueue(LOWER)
    # The fast claim takes the ungated queue's jobs; the gated one's go through claim_gated_jobs.
    assert claimed_queues(claim(now=T0)) == [LOWER] * 3
    assert claimed_queues(claim_gated(UPPER, now=T0)[0]) == [UPPER]


@pytest.mark.django_db(transaction=True)
def test_queues_that_differ_only_by_case_have_their_own_events_and_metrics():
    for queue in (UPPER, LOWER):
        enqueue(queue)
    for c in claim(now=T0):
        factories.finish(c, now=T0)
    assert sorted(Metric.objects.values_list("queue", "minute", "completed")) == [(UPPER, T0, 1), (LOWER, T0, 1)]
    assert Event.objects.filter(queue=LOWER, kind="completed").count() == 1
    assert Event.objects.filter(queue=LOWER, kind="Completed").count() == 0


# -- schedules --------------------------------------------------------------------------------------


@db
def test_schedules_whose_names_differ_only_by_case_are_two_schedules():
    schedules.schedule("Nightly", "tests.tasks.noop", cron="0 3 * * *")
    schedules.schedule("nightly", "tests.tasks.noop", cron="0 4 * * *", queue=LOWER)
    rows = sorted(Schedule.objects.values_list("name", "cron", "queue"))
    assert rows == [("Nightly", "0 3 * * *", None), ("nightly", "0 4 * * *", LOWER)]


# -- the schema on MySQL/MariaDB ----------------------------------------------------------------------


@pytest.mark.mysql
@db
def test_every_name_and_key_column_has_a_binary_no_pad_collation_on_mysql():
    migration = importlib.import_module("django_jobs.migrations.0010_mysql_binary_collation")
    # The bus mode's tables name theirs in their own migrations.
    columns = dict(migration.COLUMNS)
    for later in ("0012_topics", "0016_topic_metrics"):
        columns.update(importlib.import_module(f"django_jobs.migrations.{later}").COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'django\\_jobs\\_%%'"
        )
        collations = {(table, column): (charset, collation) for table, column, charset, collation in cursor}
        expected = {}
        for table, names in columns.items():
            for column in names:
                charset, _ = collations[table, column]
                expected[table, column] = (charset, migration.binary_collation(cursor, charset))
    assert {key: collations[key] for key in expected} == expected
    assert all(collation.endswith("_bin") for _, collation in expected.values())

"""Bus mode's metrics: a once-a-minute snapshot of the running totals, and its retention.

What is counted lives where it is already written (docs/explanation/bus-mode.md): a topic's
published total is the sum of its partitions' position counters, which every publish bumps; a
group's consumed totals are the counters of its cursors (``acked_count``,
``dead_lettered_count``, ``expired_count``), bumped by the statements that move the cursor.
Neither path gains a statement or a shared row. :func:`record_topic_totals` copies those sums
into :class:`~django_jobs.models.TopicMetric` once a minute; throughput is the difference of
two snapshots (:mod:`django_jobs.console_topics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Sum

from ..drivers import driver
from ..models import GroupCursor, TopicMetric, TopicPartition
from .maintenance import trim_minutes
from .topics import clock

TOPIC_METRIC_TABLE = TopicMetric._meta.db_table


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What :func:`record_topic_totals` did: the minute, the moment read, the rows offered (0:
    the minute had its snapshot already)."""

    minute: datetime
    taken_at: datetime
    rows: int


def record_topic_totals(*, using: str, now: datetime | None = None) -> Snapshot:
    """Write the current minute's snapshot: one row per topic with partitions (its published
    total) and one per group with cursors (its acknowledged, dead-lettered and expired totals),
    stamped ``now`` (None: the database's clock where the driver has one). Nothing when the
    minute has rows already.

    Two writers of one minute (two leaders of two backend aliases, a leadership handed over)
    both find the minute empty at worst: the unique constraint ``(topic, group_name, minute)``
    keeps the first row of each series and drops the other writer's (``ignore_conflicts``), so a
    minute has at most one row per series whatever the number of writers.

    Three queries: the minute's check (its index), the partitions summed per topic and the
    cursors summed per group (rows: partitions x groups, never messages), then one insert. The
    sums are plain reads: no lock is taken on the rows the consumers update."""
    d = driver(using)
    with d.cursor() as cursor:
        now = clock(d, cursor, now)
    minute = now.replace(second=0, microsecond=0)
    metrics = TopicMetric.objects.using(using)
    if metrics.filter(minute=minute).exists():
        return Snapshot(minute, now, 0)
    published = TopicPartition.objects.using(using).values_list("topic").annotate(Sum("last_position")).order_by()
    consumed = (
        GroupCursor.objects.using(using)
        .values_list("topic", "group_name")
        .annotate(Sum("acked_count"), Sum("dead_lettered_count"), Sum("expired_count"))
        .order_by()
    )
    rows = [
        TopicMetric(topic=topic, group_name="", minute=minute, taken_at=now, published=total or 0)
        for topic, total in published
    ]
    rows += [
        TopicMetric(
            topic=topic,
            group_name=group,
            minute=minute,
            taken_at=now,
            acked=acked or 0,
            dead_lettered=dead or 0,
            expired=expired or 0,
        )
        for topic, group, acked, dead, expired in consumed
    ]
    with transaction.atomic(using=using):  # the minute's rows appear together
        metrics.bulk_create(rows, ignore_conflicts=True)
    return Snapshot(minute, now, len(rows))


def trim_topic_metrics(*, using: str, older_than: datetime, limit: int) -> int:
    """Delete up to ``limit`` TopicMetric rows of minutes before ``older_than``; return how many."""
    return trim_minutes(TOPIC_METRIC_TABLE, using=using, older_than=older_than, limit=limit)


__all__ = ["TOPIC_METRIC_TABLE", "Snapshot", "record_topic_totals", "trim_topic_metrics"]

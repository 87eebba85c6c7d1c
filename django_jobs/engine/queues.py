"""Queue state: pause flags, limits and declarations, counts, and the queues with metrics."""

from __future__ import annotations

from typing import Any

from django.db import connections, models, transaction

from ..drivers import driver
from ..models import Job, JobStart, QueueState
from ..states import UNFINISHED_STATES, JobState
from .common import METRIC_TABLE
from .effects import _job_events, notify
from .partitions import _unblock_partitions

# -- queue control ----------------------------------------------------------------------------


def set_queue_paused(*, using: str, queue: str, paused: bool) -> None:
    """Pause or resume ``queue`` for every worker (the claim skips paused queues)."""
    update_queue_state(using=using, queue=queue, changes={"paused": paused})
    if not paused:
        notify(using, [queue])  # wake the workers that skipped it


def update_queue_state(*, using: str, queue: str, changes: dict[str, Any]) -> None:
    """Write ``changes`` (validated QueueState columns) to ``queue``'s row, creating it; a removed
    rate limit drops its start log. Wakes the queue's workers: a loosened limit lets jobs start."""
    if not changes:
        return
    with transaction.atomic(using=using):
        was = QueueState.objects.using(using).select_for_update().filter(name=queue).values_list("paused", flat=True)
        was_paused = bool(was.first())
        QueueState.objects.using(using).update_or_create(name=queue, defaults=changes)
        if "paused" in changes and bool(changes["paused"]) != was_paused:
            _job_events(using, [(queue, None, "paused" if changes["paused"] else "resumed", {})])
        starts = JobStart.objects.using(using).filter(queue=queue)
        if "rate_limit" in changes and changes["rate_limit"] is None:
            starts.filter(partition_key="").delete()
        if "partition_rate_limit" in changes and changes["partition_rate_limit"] is None:
            starts.exclude(partition_key="").delete()
        if (changes.get("partition_concurrency") or 1) > 1:
            # More of each partition may run now: unblock them (one pass over its blocked jobs).
            blocked = (
                Job.objects.using(using)
                .filter(queue=queue, blocked=True, state__in=UNFINISHED_STATES)
                .order_by()
                .values_list("partition_key", flat=True)
                .distinct()
            )
            _unblock_partitions(using, {(queue, p) for p in blocked if p is not None})
    notify(using, [queue])


def sync_queue_declarations(*, using: str, declared: dict[str, dict[str, Any]], columns_for: Any) -> int:
    """Apply ``DJANGO_JOBS["QUEUES"]`` (``{queue: {key: value}}``, validated and JSON-shaped) to
    the QueueState rows; return how many queues changed.

    Per queue, a key is written when its declared value differs from the one declared last time
    (the row keeps that in ``declared``), so a runtime edit survives restarts until the settings
    change; a key declared last time but not now (or a whole queue no longer declared) goes back
    to no limit. ``columns_for(**{key: value})`` turns keys into columns (a rate limit is one key,
    two columns, always written together). Each queue in one transaction with its ``declared``.
    """
    changed = 0
    rows = QueueState.objects.using(using).values_list("name", "declared")  # a small table
    names = set(declared) | {name for name, was in rows if was}
    for name in sorted(names):
        now_declared = declared.get(name, {})
        with transaction.atomic(using=using):
            row, _ = QueueState.objects.using(using).select_for_update().get_or_create(name=name)
            before = row.declared or {}
            keys = {k: v for k, v in now_declared.items() if k not in before or before[k] != v}
            keys.update({k: (False if k == "paused" else None) for k in before if k not in now_declared})
            if not keys and before == now_declared:
                continue
            QueueState.objects.using(using).filter(name=name).update(declared=now_declared)
            if keys:
                update_queue_state(using=using, queue=name, changes=columns_for(**keys))
                changed += 1
    return changed


def is_queue_paused(*, using: str, queue: str) -> bool:
    return QueueState.objects.using(using).filter(name=queue, paused=True).exists()


def queue_counts(*, using: str, backend: str, queue: str) -> dict[str, int]:
    """``{state: n}`` of the queue's unfinished jobs (each state has its partial index)."""
    counts = {s: 0 for s in (JobState.WAITING, JobState.DELAYED, JobState.ACTIVE, JobState.WAITING_CHILDREN)}
    rows = (
        Job.objects.using(using)
        .filter(backend=backend, queue=queue, state__in=list(counts))
        .values_list("state")
        .annotate(n=models.Count("id"))
        .order_by()
    )
    for state, n in rows:
        counts[state] = n
    return counts


def metric_queues(*, using: str) -> list[str]:
    """Every queue with Metric rows (jobs of it finished since the oldest minute kept), by a loose
    index scan of the metric table's (queue, minute) key: the cheap way to give
    :func:`django_jobs.models.known_queues` its ``recent`` source over all time."""
    with connections[using].cursor() as cursor:
        return driver(using).distinct_queues(cursor, METRIC_TABLE)

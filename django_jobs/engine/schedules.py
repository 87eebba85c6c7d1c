"""Schedules: advancing a schedule's cursor and inserting its due job in one transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from ..drivers import driver
from ..exceptions import QueueFull
from ..models import Job, Schedule
from ..spec.newjob import NewJob
from ..states import JobState
from .common import logger
from .effects import _enqueued_data, notify, write_events
from .insert import _new_job
from .partitions import _admit, _unblock_heads

# -- schedules ------------------------------------------------------------------------------


_UNSET: Any = object()


def advance_schedule(
    *,
    using: str,
    schedule_id: int,
    due: datetime,
    next_run_at: datetime | None,
    job: NewJob | None,
    scheduler_key: str | None = None,
    next_if_refused: datetime | None = _UNSET,
    now: datetime | None = None,
) -> str | None:
    """Move a schedule from its tick ``due`` to ``next_run_at`` and, with ``job``, insert that
    tick's job with ``scheduler_key``, in one transaction. Returns ``"fired"``, ``"skipped"``
    (no ``job``: the catch-up policy skipped the tick), ``"refused"`` (the queue was full: no job, the tick does not count
    and the schedule moves to ``next_if_refused`` instead, default ``next_run_at``), or None when
    another worker moved it first.

    The compare-and-set on ``next_run_at`` makes one worker win each tick; the job's unique
    ``scheduler_key`` (schedule, tick) is the constraint behind it, so even a stale worker cannot
    insert a tick twice.
    """
    given_now, now = now, now or timezone.now()
    rows = Schedule.objects.using(using).filter(id=schedule_id)
    with transaction.atomic(using=using):
        if not rows.filter(next_run_at=due, enabled=True).update(next_run_at=next_run_at):
            return None
        if job is None:
            return "skipped"
        row = _new_job(job, now=now)
        row.scheduler_key = scheduler_key
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                d = driver(using)
                _admit(cursor, d, row.queue, {row.partition_key: 1})
                if given_now is None and d.DATABASE_CLOCK:
                    # The database's clock, as for every enqueue and the job's later times (a
                    # tick is rare: one round trip more is nothing here).
                    row.enqueued_at = d.transaction_now(cursor)
                Job.objects.using(using).bulk_create([row], ignore_conflicts=True)
                if Job.objects.using(using).filter(id=row.id).exists():  # not a tick's second job
                    write_events(cursor, driver(using), [(row.queue, row.id, "enqueued", _enqueued_data(row))], now)
                if row.partition_key is not None:
                    _unblock_heads(cursor, driver(using), {(row.queue, row.partition_key)})
        except QueueFull as exc:
            # Backpressure wins over the schedule: this tick is skipped (not counted against its
            # limit), the next one tries again.
            logger.warning("Schedule %s: the job of its tick %s was not enqueued: %s", schedule_id, due, exc)
            if next_if_refused is not _UNSET and next_if_refused != next_run_at:
                rows.update(next_run_at=next_if_refused)
            return "refused"
        rows.update(iterations=F("iterations") + 1, last_run_at=now)
    if row.state == JobState.WAITING:
        notify(using, [row.queue])
    return "fired"

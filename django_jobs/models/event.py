"""Lifecycle events and per-minute metrics (seed tables ``event`` and ``metrics``).

Both are written by :mod:`django_jobs.engine` in the transaction that makes the change they
record, so an event or a count is never ahead of, or behind, the job rows it describes.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q, Sum


class EventQuerySet(models.QuerySet):
    def count_since(self, kinds: list[str], since: datetime) -> int:
        """How many events of ``kinds`` were written at or after ``since`` (the health check's
        rescues). No index holds ``created_at``: the newest event before ``since`` is found by
        walking the primary key backwards, past the window's events only, and the count then
        reads the primary key range after it. The pruner keeps EVENTS_MAX_PER_QUEUE events per
        queue, which bounds both."""
        before = self.filter(created_at__lt=since).order_by("-id").values_list("id", flat=True).first()
        window = self.filter(kind__in=kinds, created_at__gte=since)
        if before is not None:
            window = window.filter(id__gt=before)
        return window.count()


class Event(models.Model):
    """One lifecycle step of a job (``job_id`` set) or of a queue (paused, resumed).

    Readers page forward with :func:`django_jobs.events`, ordered by ``(txid, id)``: on
    PostgreSQL ids are handed out before commit, so a later id can commit first; ``txid`` (the
    writing transaction's id) lets a reader return only events no running transaction can still
    precede (see :func:`django_jobs.eventlog.events`). SQLite has one writer at a time: ``txid`` is 0
    and ids commit in order.
    """

    id = models.BigAutoField(primary_key=True)
    txid = models.BigIntegerField(default=0)
    queue = models.CharField(max_length=100)
    job_id = models.UUIDField(null=True, blank=True)
    #: enqueued, promoted, active, progress, completed, failed, retried, snoozed, stalled,
    #: rescued, released, cancelled, removed, paused, resumed (docs/reference/events.md).
    kind = models.CharField(max_length=20)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    objects = EventQuerySet.as_manager()

    class Meta:
        db_table = "django_jobs_event"
        ordering = ("txid", "id")
        indexes = [
            models.Index(fields=["txid", "id"], name="django_jobs_event_order_idx"),
            models.Index(fields=["queue", "txid", "id"], name="django_jobs_event_queue_idx"),
            models.Index(fields=["job_id"], name="django_jobs_event_job_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.queue} {self.job_id or ''}".rstrip()


class MetricQuerySet(models.QuerySet):
    """The reads of the dashboards (admin and ``manage.py jobs``): finished jobs are counted from
    these rows (one per queue and minute), never with a COUNT over the job table."""

    #: The columns summed per minute or per window.
    SUMMED = ("completed", "failed", "retried", "runtime_ms")

    def per_minute(self, *, queue: str | None, since: datetime, until: datetime) -> models.QuerySet:
        """``(minute, completed, failed, retried, runtime_ms)`` sums per minute in ``[since,
        until)``, of one queue or all (at most one row per minute: 1440 for a day)."""
        metrics = self.filter(minute__gte=since, minute__lt=until)
        if queue is not None:
            metrics = metrics.filter(queue=queue)
        return (
            metrics.values_list("minute")
            .annotate(Sum("completed"), Sum("failed"), Sum("retried"), Sum("runtime_ms"))
            .order_by()
        )

    def sums_by_queue(
        self, *, windows: dict[str, Q], since: datetime, until: datetime
    ) -> dict[str, dict[str, dict[str, int]]]:
        """``{queue: {window: {column: sum}}}`` of the queues with rows in ``[since, until)``, in
        one query: a conditional sum of each :attr:`SUMMED` column per window (``Q()``: every
        row), over the rows found by the minute index."""
        columns = self.SUMMED
        sums = {
            f"{window}_{column}": Sum(column, filter=condition or None, default=0)
            for window, condition in windows.items()
            for column in columns
        }
        rows = self.filter(minute__gte=since, minute__lt=until).values("queue").annotate(**sums).order_by()
        return {
            row["queue"]: {window: {column: row[f"{window}_{column}"] for column in columns} for window in windows}
            for row in rows
        }

    def queues(self, since: datetime | None = None) -> set[str]:
        """The queues with rows from ``since`` on (None: any row)."""
        metrics = self if since is None else self.filter(minute__gte=since)  # django_jobs_metric_minute_idx
        return set(metrics.order_by().values_list("queue", flat=True).distinct())


class Metric(models.Model):
    """Jobs finished in one queue in one minute, written with the outcome batches.

    ``runtime_ms`` sums the last attempt's run time of the completed and failed jobs, so the
    average duration of a minute is ``runtime_ms / (completed + failed)``.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=100)
    minute = models.DateTimeField()
    completed = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    #: Attempts that ended in a retry (the job runs again later).
    retried = models.BigIntegerField(default=0)
    runtime_ms = models.BigIntegerField(default=0)

    objects = MetricQuerySet.as_manager()

    class Meta:
        db_table = "django_jobs_metric"
        ordering = ("queue", "minute")
        constraints = [models.UniqueConstraint(fields=["queue", "minute"], name="django_jobs_metric_queue_minute")]
        indexes = [models.Index(fields=["minute"], name="django_jobs_metric_minute_idx")]

    def __str__(self) -> str:
        return f"{self.queue} {self.minute:%Y-%m-%d %H:%M}"

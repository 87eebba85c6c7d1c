"""Per-queue flags and limits (seed tables ``meta`` and ``rate_limit``; queen's max queue size
and partition leases), and the start log behind the sliding-window rate limits.

Writes go through :mod:`django_jobs.engine` (``django_jobs.queue(...)`` and the admin call it).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..conf import get_settings
from ..states import FINISHED_STATES
from .event import Metric
from .job import Job


class QueueStateQuerySet(models.QuerySet):
    def by_name(self) -> dict[str, QueueState]:
        """``{name: row}`` of every queue that has a flag or a limit."""
        return {row.name: row for row in self.all()}

    def names(self) -> set[str]:
        return set(self.values_list("name", flat=True))


class QueueState(models.Model):
    """One row per queue that has a flag or a limit; a queue without a row has none."""

    name = models.CharField(primary_key=True, max_length=100)
    paused = models.BooleanField(default=False)
    #: At most this many of the queue's jobs active at once, across every worker.
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    #: At most ``rate_limit`` jobs started in any ``rate_window_seconds`` (a sliding window).
    rate_limit = models.PositiveIntegerField(null=True, blank=True)
    rate_window_seconds = models.FloatField(null=True, blank=True)
    #: Enqueueing past this many unfinished jobs raises QueueFull.
    max_size = models.PositiveIntegerField(null=True, blank=True)
    #: The same three limits for each partition of the queue (``.using(partition=...)``).
    #: ``partition_concurrency`` None means 1: one job of a partition at a time, in order.
    partition_concurrency = models.PositiveIntegerField(null=True, blank=True)
    partition_rate_limit = models.PositiveIntegerField(null=True, blank=True)
    partition_rate_window_seconds = models.FloatField(null=True, blank=True)
    partition_max_size = models.PositiveIntegerField(null=True, blank=True)
    #: The values ``DJANGO_JOBS["QUEUES"]`` last declared: a worker start writes a declared
    #: value only when the declaration changed, so a runtime edit survives restarts.
    declared = models.JSONField(default=dict, blank=True, db_default={})
    updated_at = models.DateTimeField(auto_now=True)

    objects = QueueStateQuerySet.as_manager()

    class Meta:
        db_table = "django_jobs_queuestate"
        verbose_name = "queue"
        ordering = ("name",)
        permissions = [("control_queue", "Can pause, resume, drain and clean queues and change their limits")]
        constraints = [
            models.CheckConstraint(
                condition=Q(concurrency_limit__isnull=True) | Q(concurrency_limit__gte=1),
                name="django_jobs_queue_concurrency_min",
            ),
            models.CheckConstraint(
                condition=Q(rate_limit__isnull=True, rate_window_seconds__isnull=True)
                | Q(
                    rate_limit__isnull=False,
                    rate_window_seconds__isnull=False,
                    rate_limit__gte=1,
                    rate_window_seconds__gt=0,
                ),
                name="django_jobs_queue_rate_valid",
            ),
            models.CheckConstraint(
                condition=Q(max_size__isnull=True) | Q(max_size__gte=1), name="django_jobs_queue_max_size_min"
            ),
            models.CheckConstraint(
                condition=Q(partition_concurrency__isnull=True) | Q(partition_concurrency__gte=1),
                name="django_jobs_partition_concurrency_min",
            ),
            models.CheckConstraint(
                condition=Q(partition_rate_limit__isnull=True, partition_rate_window_seconds__isnull=True)
                | Q(
                    partition_rate_limit__isnull=False,
                    partition_rate_window_seconds__isnull=False,
                    partition_rate_limit__gte=1,
                    partition_rate_window_seconds__gt=0,
                ),
                name="django_jobs_partition_rate_valid",
            ),
            models.CheckConstraint(
                condition=Q(partition_max_size__isnull=True) | Q(partition_max_size__gte=1),
                name="django_jobs_partition_max_size_min",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def gated(self) -> bool:
        """True when claims of this queue go through its lock (a concurrency or rate limit)."""
        return bool(
            self.concurrency_limit is not None
            or self.rate_limit is not None
            or self.partition_rate_limit is not None
            or (self.partition_concurrency or 1) > 1
        )


# -- which queues there are ---------------------------------------------------------------------

#: A queue with Metric rows this recent is known: jobs of it finished lately.
RECENT_METRICS = timedelta(days=1)


def known_queues(
    *,
    using: str,
    states: Iterable[str] | None = None,
    recent: Iterable[str] | None = None,
    unfinished: Iterable[str] | None = None,
    declared: bool = True,
    recent_window: timedelta | None = RECENT_METRICS,
    now: datetime | None = None,
) -> list[str]:
    """The queues there are, by name: those with a QueueState row (a flag or a limit), Metric rows
    in the last ``recent_window`` (None: any Metric row), unfinished jobs (of any backend: the
    distinct values of :meth:`JobQuerySet.unfinished_values`), or, with ``declared``, a
    declaration in the settings (:func:`declared_queues`). None of these reads the job table's
    finished history, which grows without bound.

    A caller that has already read a source passes its queue names (``states``, ``recent`` or
    ``unfinished``; an empty tuple leaves the source out) and saves its query: the admin's
    filters pass the unfinished queues they read once per request, the dashboards the queues of
    the figures they show (``declared=False``: a dashboard lists the queues it has figures for).
    """
    if states is None:
        states = QueueState.objects.using(using).names()
    if recent is None:
        since = None if recent_window is None else (now or timezone.now()) - recent_window
        recent = Metric.objects.using(using).queues(since)
    if unfinished is None:
        unfinished = {queue for queue, _, _ in Job.objects.using(using).unfinished_values()}
    names = set(states) | set(recent) | set(unfinished)
    if declared:
        names |= declared_queues()
    return sorted(names)


def declared_queues() -> set[str]:
    """Queues the settings declare: ``DJANGO_JOBS["QUEUES"]`` and the ``QUEUES`` of every
    ``TASKS`` backend."""
    names = set(get_settings().QUEUES or {})
    for backend in getattr(settings, "TASKS", {}).values():
        names |= set(backend.get("QUEUES") or [])
    return names


def queue_exists(*, using: str, backend: str, name: str) -> bool:
    """Whether ``name`` is a queue: it has a QueueState row, Metric rows or jobs of ``backend``
    (unfinished or finished). Each probe is an EXISTS on an index led by the queue name."""
    jobs = Job.objects.using(using).filter(backend=backend, queue=name)
    return (
        QueueState.objects.using(using).filter(name=name).exists()
        or jobs.has_unfinished()
        or jobs.filter(state__in=sorted(FINISHED_STATES)).exists()
        or Metric.objects.using(using).filter(queue=name).exists()
    )


class JobStart(models.Model):
    """One row per job started in a rate-limited queue (``partition_key`` ``""``) or partition,
    kept for one window: the sliding-window log the rate limits count. Written and trimmed by
    the claim under the queue's lock."""

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=100)
    partition_key = models.CharField(max_length=255, default="", blank=True)
    started_at = models.DateTimeField()

    class Meta:
        db_table = "django_jobs_jobstart"
        indexes = [models.Index(fields=["queue", "partition_key", "started_at"], name="django_jobs_start_idx")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.partition_key} {self.started_at}"

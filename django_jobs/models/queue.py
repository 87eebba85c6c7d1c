"""Per-queue flags and limits (seed tables ``meta`` and ``rate_limit``; queen's max queue size
and partition leases), and the start log behind the sliding-window rate limits.

Writes go through :mod:`django_jobs.engine` (``django_jobs.queue(...)`` and the admin call it).
"""

from django.db import models
from django.db.models import Q


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

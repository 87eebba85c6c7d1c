"""Live worker processes. The oldest live row is the leader for leader-only services."""

from __future__ import annotations

from django.db import models
from django.db.models import Count, IntegerField, OuterRef, Subquery

from ..states import JobState
from .job import Job


class WorkerQuerySet(models.QuerySet):
    def with_running_jobs(self) -> WorkerQuerySet:
        """Each worker with ``running_jobs``: how many active jobs it holds (None for none), in a
        subquery per worker."""
        # Active jobs only: a handful of rows (the partial index django_jobs_active_idx).
        running = (
            Job.objects.filter(state=JobState.ACTIVE, worker_id=OuterRef("id"))
            .order_by()
            .values("worker_id")
            .annotate(n=Count("id"))
            .values("n")
        )
        return self.annotate(running_jobs=Subquery(running, output_field=IntegerField()))


class Worker(models.Model):
    id = models.CharField(primary_key=True, max_length=200)
    backend = models.CharField(max_length=100, default="default")
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()

    objects = WorkerQuerySet.as_manager()

    class Meta:
        db_table = "django_jobs_worker"
        ordering = ("started_at",)
        indexes = [models.Index(fields=["heartbeat_at"], name="django_jobs_worker_hb_idx")]

    def __str__(self) -> str:
        return self.id

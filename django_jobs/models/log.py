"""Job logs: ordered lines a running job writes with ``context.log()`` (seed table ``job_log``)."""

from __future__ import annotations

import uuid

from django.db import models


class JobLogQuerySet(models.QuerySet):
    def of_job(self, job_id: uuid.UUID) -> JobLogQuerySet:
        """One job's lines, in the order it wrote them."""
        return self.filter(job_id=job_id).order_by("idx")


class JobLog(models.Model):
    job = models.ForeignKey("django_jobs.Job", on_delete=models.CASCADE, related_name="logs")
    #: 0-based position within the job's log; unique per job, so lines keep one order.
    idx = models.PositiveIntegerField()
    line = models.TextField()
    created_at = models.DateTimeField()

    objects = JobLogQuerySet.as_manager()

    class Meta:
        db_table = "django_jobs_joblog"
        ordering = ("job", "idx")
        constraints = [models.UniqueConstraint(fields=["job", "idx"], name="django_jobs_joblog_job_idx")]

    def __str__(self) -> str:
        return f"{self.job_id}[{self.idx}] {self.line[:60]}"

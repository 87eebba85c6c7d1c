"""Live worker processes. The oldest live row is the leader for leader-only services."""

from django.db import models


class Worker(models.Model):
    id = models.CharField(primary_key=True, max_length=200)
    backend = models.CharField(max_length=100, default="default")
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()

    class Meta:
        db_table = "django_jobs_worker"
        ordering = ("started_at",)
        indexes = [models.Index(fields=["heartbeat_at"], name="django_jobs_worker_hb_idx")]

    def __str__(self) -> str:
        return self.id

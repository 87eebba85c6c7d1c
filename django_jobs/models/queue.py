"""Per-queue flags and limits (seed tables ``meta`` and ``rate_limit``). Behaviour arrives with
the queue-control features; the row exists so those features add behaviour, not tables."""

from django.db import models


class QueueState(models.Model):
    name = models.CharField(primary_key=True, max_length=100)
    paused = models.BooleanField(default=False)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    rate_limit = models.PositiveIntegerField(null=True, blank=True)
    rate_window_seconds = models.FloatField(null=True, blank=True)
    max_size = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "django_jobs_queuestate"
        verbose_name = "queue"
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name

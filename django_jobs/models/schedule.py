"""Job schedules: a job template fired at the ticks of a cron expression or a fixed interval
(seed table ``scheduler``). The engine fires each tick once: a compare-and-set on
``next_run_at`` and a unique ``Job.scheduler_key`` per (schedule, tick)."""

from django.core.exceptions import ValidationError
from django.db import models

from ..exceptions import InvalidSchedule
from ..spec.schedules import declaration_fields


class CatchUp(models.TextChoices):
    """What a schedule does with ticks missed for longer than MISFIRE_GRACE (downtime)."""

    LATEST = "latest", "Run the latest missed tick once"
    ALL = "all", "Run every missed tick"
    NONE = "none", "Skip missed ticks"


class Schedule(models.Model):
    backend = models.CharField(max_length=100, default="default")
    name = models.CharField(max_length=200)
    #: The job template.
    task_path = models.CharField(max_length=255)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=100, null=True, blank=True, help_text="Empty: the task's queue.")
    priority = models.SmallIntegerField(null=True, blank=True, help_text="Empty: the task's priority.")
    #: django-jobs task options applied with .using(): max_attempts, backoff, timeout, lifo.
    options = models.JSONField(default=dict, blank=True)
    #: When: a cron expression (5 fields, or 6 with seconds first) or a fixed interval.
    cron = models.CharField(max_length=200, null=True, blank=True)
    every_seconds = models.FloatField(null=True, blank=True)
    offset_seconds = models.FloatField(default=0)
    timezone = models.CharField(max_length=64, default="UTC")
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    limit = models.PositiveIntegerField(null=True, blank=True, help_text="Most ticks to fire; empty: no limit.")
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.LATEST)
    enabled = models.BooleanField(default=True)
    #: State: the next tick to fire (None: finished, past its end or limit), ticks fired so far.
    next_run_at = models.DateTimeField(null=True, blank=True)
    iterations = models.PositiveIntegerField(default=0)
    last_run_at = models.DateTimeField(null=True, blank=True)
    #: Where it came from: "code" (DJANGO_JOBS["SCHEDULES"], synced at worker start) or "runtime".
    source = models.CharField(max_length=10, default="runtime")
    #: A hash of the code declaration last synced; edited_at: the last runtime edit (API, admin),
    #: which the sync then leaves alone.
    code_hash = models.CharField(max_length=64, null=True, blank=True)
    edited_at = models.DateTimeField(null=True, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "django_jobs_schedule"
        ordering = ("backend", "name")
        constraints = [models.UniqueConstraint(fields=["backend", "name"], name="django_jobs_schedule_name")]
        indexes = [
            models.Index(fields=["next_run_at"], name="django_jobs_schedule_due", condition=models.Q(enabled=True))
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The same validation as ``django_jobs.schedule()`` (the admin's form calls it)."""
        declaration = {
            "task": self.task_path,
            "cron": self.cron or None,
            "every": self.every_seconds,
            "offset": self.offset_seconds,
            "timezone": self.timezone,
            "args": self.args,
            "kwargs": self.kwargs,
            "queue": self.queue or None,
            "priority": self.priority,
            "options": self.options,
            "start": self.start_at,
            "end": self.end_at,
            "limit": self.limit,
            "catch_up": self.catch_up,
        }
        try:
            declaration_fields(self.name or "?", declaration)
        except InvalidSchedule as exc:
            raise ValidationError(str(exc)) from None

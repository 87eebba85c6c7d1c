"""Deduplication keys (seed tables ``dedup`` and ``dedup_next``).

Written by :mod:`django_jobs.engine` only (``enqueue_deduplicated``, ``promote_dedup_stashes``,
``delete_expired_dedup_keys``); see docs/howto/deduplication.md.
"""

from django.db import models
from django.db.models import Q


class JobDedup(models.Model):
    """A dedup key and the job holding it, unique per (backend, queue, key).

    The unique constraint is the invariant: two enqueues of one key race on it (``INSERT ... ON
    CONFLICT DO NOTHING``), never on a check made beforehand. Deleting the job deletes its key
    (CASCADE), which releases it.
    """

    backend = models.CharField(max_length=100)
    queue = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    job = models.ForeignKey("django_jobs.Job", on_delete=models.CASCADE, related_name="+")
    #: When the key stops holding whatever its job's state (``Dedup(ttl=...)``); NULL: it holds
    #: while the job is unfinished.
    expire_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "django_jobs_dedup"
        verbose_name = "dedup key"
        constraints = [
            models.UniqueConstraint(fields=["backend", "queue", "key"], name="django_jobs_dedup_key"),
        ]
        indexes = [
            # Expired keys, for the sweeper (lazily reclaimed at enqueue too).
            models.Index(
                fields=["expire_at"], name="django_jobs_dedup_expire_idx", condition=Q(expire_at__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue}:{self.key} -> {self.job_id}"


class JobDedupNext(models.Model):
    """The stashed enqueue of a ``keep_last_if_active`` key whose job was running: one per key,
    each later duplicate overwrites it. Becomes the key's next job once the running one finished
    (:func:`django_jobs.engine.promote_dedup_stashes`).

    ``payload``: ``task_path``, ``args``, ``kwargs``, ``priority``, ``max_attempts``,
    ``options``, ``run_after`` (ISO or null), ``lifo``, ``trace_id``, ``ttl``, ``enqueued_at``.
    """

    backend = models.CharField(max_length=100)
    queue = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    payload = models.JSONField()
    stashed_at = models.DateTimeField()

    class Meta:
        db_table = "django_jobs_dedup_next"
        verbose_name = "stashed dedup enqueue"
        constraints = [
            models.UniqueConstraint(fields=["backend", "queue", "key"], name="django_jobs_dedup_next_key"),
        ]

    def __str__(self) -> str:
        return f"{self.queue}:{self.key} (next)"

"""The job table: one row per job, its state in one column (seed schema ``003``, table ``job``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Count, Min, Q
from django.db.models.expressions import RawSQL

from ..states import FINISHED_STATES, UNFINISHED_PARTS, UNFINISHED_SQL, UNFINISHED_STATES, JobState
from ..uuid7 import uuid7


class JobQuerySet(models.QuerySet):
    """The read vocabulary. Writes go through :mod:`django_jobs.engine` only."""

    def ready(self, queues: list[str] | None = None) -> JobQuerySet:
        """Waiting jobs in claim order (priority first, then ``seq``: LIFO newest first, then
        FIFO by availability; then id)."""
        qs = self.filter(state=JobState.WAITING)
        if queues:
            qs = qs.filter(queue__in=queues)
        return qs.order_by("-priority", "seq", "id")

    def due(self, now: datetime) -> JobQuerySet:
        """Delayed jobs whose time has come."""
        return self.filter(state=JobState.DELAYED, available_at__lte=now)

    def stalled(self, now: datetime) -> JobQuerySet:
        """Active jobs whose lease expired: their worker died or hangs."""
        return self.filter(state=JobState.ACTIVE, lease_expires_at__lt=now)

    def finished(self) -> JobQuerySet:
        return self.filter(state__in=FINISHED_STATES)

    def stats_by_queue(self) -> dict[str, dict[str, int]]:
        """``{queue: {state: count}}`` over the whole table."""
        out: dict[str, dict[str, int]] = {}
        for row in self.values("queue", "state").annotate(n=Count("id")).order_by():
            out.setdefault(row["queue"], {})[row["state"]] = row["n"]
        return out

    # -- what the admin, the console (``manage.py jobs``) and the queue pages read ------------------
    #
    # Unfinished jobs are read part by part (states.UNFINISHED_PARTS), each part through the
    # partial index its rows are in anyway, in one UNION ALL: what these cost follows the
    # backlog, never the finished history, which grows without bound, and no plain job writes an
    # index entry only they read.

    def unfinished_parts(self) -> list[JobQuerySet]:
        """The unfinished jobs of this queryset as disjoint querysets, one per
        :data:`~django_jobs.states.UNFINISHED_PARTS` (each read through its own partial index)."""
        parts = []
        for state, blocked in UNFINISHED_PARTS:
            part = self.filter(state=state)
            if blocked is not None:
                part = part.filter(blocked=blocked)
            if blocked:
                # Every term of django_jobs_blocked_idx's condition, the list as literals: SQLite
                # reads a partial index only for a query that repeats each term, and it matches a
                # bound parameter against a literal but not a list of them.
                part = part.filter(RawSQL(f"state IN {UNFINISHED_SQL}", (), output_field=models.BooleanField()))
            parts.append(part)
        return parts

    def _unfinished_grouped(self, *by: str) -> list[tuple[Any, ...]]:
        """``(*by, state, n, oldest available_at)`` of the unfinished jobs, one row per group and
        state (the parts of one state added up), in one statement."""
        parts = [
            part.values_list(*by, "state").annotate(n=Count("id"), oldest=Min("available_at")).order_by()
            for part in self.unfinished_parts()
        ]
        out: dict[tuple[Any, ...], list[Any]] = {}
        for *key, n, oldest in parts[0].union(*parts[1:], all=True).order_by():
            row = out.setdefault(tuple(key), [0, None])
            row[0] += n
            if oldest is not None and (row[1] is None or oldest < row[1]):
                row[1] = oldest
        return [(*key, n, oldest) for key, (n, oldest) in out.items()]

    def unfinished_by_queue(self, backend: str) -> dict[str, tuple[dict[str, int], datetime | None]]:
        """``{queue: ({state: n}, oldest waiting available_at)}`` of ``backend``'s unfinished jobs,
        read through the partial indexes of their states (:meth:`unfinished_parts`): its cost
        follows the backlog, not the history."""
        out: dict[str, tuple[dict[str, int], datetime | None]] = {}
        for name, state, n, oldest in self.filter(backend=backend)._unfinished_grouped("queue"):
            counts, waiting_since = out.get(name, ({}, None))
            counts[state] = n
            out[name] = (counts, oldest if state == JobState.WAITING else waiting_since)
        return out

    def unfinished_by_task(self, backend: str, queue: str) -> list[tuple[str, str, int, datetime | None]]:
        """``(task_path, state, n, oldest available_at)`` rows of one queue's unfinished jobs of
        ``backend``, one per task and state (one statement over the unfinished parts)."""
        return self.filter(backend=backend, queue=queue)._unfinished_grouped("task_path")

    def unfinished_values(self, limit: int = 1000) -> list[tuple[str, str, int]]:
        """Distinct ``(queue, task_path, priority)`` of the unfinished jobs of every backend, at
        most ``limit`` of them: a small set the partial indexes of the unfinished parts cover
        (the admin's filters offer them as choices)."""
        parts = [p.order_by().values_list("queue", "task_path", "priority").distinct() for p in self.unfinished_parts()]
        return list(parts[0].union(*parts[1:]).order_by()[:limit])

    def has_unfinished(self) -> bool:
        """Whether any job of this queryset is unfinished (an EXISTS per part, each on the
        partial index of its state)."""
        return any(part.exists() for part in self.unfinished_parts())

    def running_by_worker(self, backend: str) -> dict[str, int]:
        """``{worker_id: n}`` of ``backend``'s active jobs (one GROUP BY over the active jobs)."""
        return dict(
            self.filter(backend=backend, state=JobState.ACTIVE)
            .values_list("worker_id")
            .annotate(n=Count("id"))
            .order_by()
        )

    def oldest_ready_by_queue(self, backend: str) -> dict[str, datetime]:
        """``{queue: oldest available_at}`` of ``backend``'s ready jobs (waiting, not blocked
        behind their partition), one GROUP BY over the rows of the ready indexes: its cost follows
        the ready backlog, never the history. Queues with nothing ready are left out."""
        rows = (
            self.filter(backend=backend, state=JobState.WAITING, blocked=False)
            .values_list("queue")
            .annotate(oldest=Min("available_at"))
            .order_by()
        )
        return dict(rows)

    def matching(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        task: str | None = None,
        priority: int | None = None,
        trace: str | None = None,
        partition: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> JobQuerySet:
        """The jobs matching the filters, as the admin's list filters them (``since``/``until``:
        enqueued in that range); a filter that is None or ``""`` is left out."""
        filters: dict[str, Any] = {
            "queue": queue, "state": state, "task_path": task, "priority": priority, "trace_id": trace,
            "partition_key": partition, "enqueued_at__gte": since, "enqueued_at__lt": until,
        }  # fmt: skip
        return self.filter(**{k: v for k, v in filters.items() if v is not None and v != ""})

    def finished_count(self, *, backend: str, queue: str, state: str, before: datetime, cap: int = 10_000) -> int:
        """How many of ``queue``'s jobs finished in ``state`` before ``before``, counted up to
        ``cap + 1`` (a result above ``cap`` means "more than cap"): what a clean would delete. The
        count walks django_jobs_finished_q_idx and stops after ``cap + 1`` rows."""
        return (
            self.filter(backend=backend, queue=queue, state=state, finished_at__lt=before).order_by()[: cap + 1].count()
        )


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    backend = models.CharField(max_length=100, default="default")
    queue = models.CharField(max_length=100, default="default")
    task_path = models.CharField(max_length=255)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=20, choices=JobState.choices, default=JobState.WAITING)
    priority = models.SmallIntegerField(default=0)
    #: When the job may run: enqueue time, ``run_after``, or the end of a retry's backoff.
    available_at = models.DateTimeField()
    #: Claim order within a priority (seed schema's ``job_seq``): microseconds since the Unix
    #: epoch of the moment the job became ready (``available_at``), negated for a LIFO job so
    #: LIFO jobs sort ahead of FIFO ones, newest first, with one ascending column and one index.
    #: Set by the engine at enqueue and when a retry or snooze reschedules the job.
    # db_default too: code from before this column (a rolling deploy) inserts rows without it.
    seq = models.BigIntegerField(default=0, db_default=0)
    #: Per-job options given at enqueue (backoff, and what later features add); settings fill
    #: in what is missing when the worker needs it.
    options = models.JSONField(default=dict, blank=True)

    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)

    # Lease: an active job belongs to ``worker_id`` until ``lease_expires_at``. Every outcome
    # write is guarded on ``lease_token`` so a rescued job's late result is dropped. The token is
    # one per claim statement, chosen by the worker; an outcome keeps it on the row (rescue and
    # release clear it), so a batch sent again after a lost answer knows what it wrote.
    lease_token = models.UUIDField(null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    worker_id = models.CharField(max_length=200, null=True, blank=True)
    stalled_count = models.PositiveIntegerField(default=0)

    progress = models.JSONField(null=True, blank=True)
    return_value = models.JSONField(null=True, blank=True)
    #: One ``{"exception_class_path", "traceback", "attempt", "at"}`` per failed attempt.
    errors = models.JSONField(default=list, blank=True)
    #: One worker id per attempt started.
    worker_ids = models.JSONField(default=list, blank=True)

    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    #: When the pruner may delete this finished job: ``finished_at`` plus its retention age
    #: (task, queue or global setting; docs/howto/retention.md). None: unfinished, or kept.
    purge_at = models.DateTimeField(null=True, blank=True)

    # Columns for the features that follow (dedup, flows, schedules, partitions, tracing).
    dedup_key = models.CharField(max_length=255, null=True, blank=True)
    # Indexed by django_jobs_parent_idx, only where set: a job without a parent (nearly every
    # job) writes no entry for it. No foreign-key constraint in the database (migration 0020):
    # its check fired at every job's commit, a NULL included, which a job outside a flow must
    # not pay for. The engine checks the parent itself (a child attaches by a guarded increment
    # of the parent's pending_children) and nulls children before it deletes rows; Django's
    # collector does SET_NULL for deletes through the ORM (the admin's included).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children", db_index=False,
        db_constraint=False,
    )  # fmt: skip
    pending_children = models.PositiveIntegerField(default=0)
    scheduler_key = models.CharField(max_length=255, null=True, blank=True)
    partition_key = models.CharField(max_length=255, null=True, blank=True)
    #: A partitioned job that is not its partition's next one: kept out of the ready indexes so
    #: claims do not walk a deep partition's backlog. A hint only (each claim still checks the
    #: partition's order); set at insert, cleared for the partition's next job when one
    #: finishes, and by the PartitionSweeper for any partition left without a runnable head.
    blocked = models.BooleanField(default=False, db_default=False)
    trace_id = models.CharField(max_length=64, null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = "django_jobs_job"
        ordering = ("-enqueued_at",)
        indexes = [
            # The ready set in claim order. Only waiting rows, so it stays small. Workers of all
            # queues walk the first; workers of one queue the second.
            models.Index(
                fields=["-priority", "seq", "id"],
                name="django_jobs_ready_idx",
                condition=Q(state="waiting", blocked=False),
            ),
            models.Index(
                fields=["queue", "-priority", "seq", "id"],
                name="django_jobs_ready_queue_idx",
                condition=Q(state="waiting", blocked=False),
            ),
            # A flow parent's children (settling a flow, cancelling its descendants).
            models.Index(fields=["parent"], name="django_jobs_parent_idx", condition=Q(parent__isnull=False)),
            # Delayed jobs by due time (the promoter).
            models.Index(fields=["available_at"], name="django_jobs_delayed_idx", condition=Q(state="delayed")),
            # Delayed jobs by queue: the delayed part of a queue's size (max_size) and counts.
            models.Index(
                fields=["queue", "available_at"], name="django_jobs_delayed_q_idx", condition=Q(state="delayed")
            ),
            # Flow parents waiting for their children, by queue: that part of a queue's counts.
            models.Index(fields=["queue"], name="django_jobs_parent_wait_idx", condition=Q(state="waiting-children")),
            # Active jobs by lease expiry (the rescuer).
            models.Index(fields=["lease_expires_at"], name="django_jobs_active_idx", condition=Q(state="active")),
            # Finished jobs of a queue by age: queue(...).clean() and the pruner's count limits.
            models.Index(
                fields=["queue", "finished_at"],
                name="django_jobs_finished_q_idx",
                condition=Q(state__in=["completed", "failed", "cancelled"]),
            ),
            # Finished jobs by the time retention lets them go (the pruner).
            models.Index(fields=["purge_at"], name="django_jobs_purge_idx", condition=Q(purge_at__isnull=False)),
            # Unfinished jobs of partitions, in partition order: the size a partition_max_size
            # checks, and the "is an earlier job of this partition unfinished?" probe of a claim.
            # Only partitioned rows: a queue's own size adds up the partial indexes of the
            # unfinished states (states.UNFINISHED_PARTS), which a plain job is in anyway.
            models.Index(
                fields=["queue", "partition_key", "id"],
                name="django_jobs_unfinished_idx",
                condition=Q(state__in=list(UNFINISHED_STATES), partition_key__isnull=False),
            ),
            # Unfinished jobs that wait for their partition's turn (the PartitionSweeper's scan).
            models.Index(
                fields=["queue", "partition_key", "id"],
                name="django_jobs_blocked_idx",
                condition=Q(blocked=True, state__in=list(UNFINISHED_STATES)),
            ),
            # Running jobs of partitions: the "is a job of this partition running?" probe. Only
            # partitioned rows, so a plain job's claim does not pay for one more index entry (a
            # concurrency limit counts the queue's running jobs through django_jobs_active_idx).
            models.Index(
                fields=["queue", "partition_key"],
                name="django_jobs_part_active_idx",
                condition=Q(state="active", partition_key__isnull=False),
            ),
            # The jobs of one pipeline (django_jobs.trace()).
            models.Index(fields=["trace_id"], name="django_jobs_trace_idx"),
        ]
        permissions = [
            ("retry_job", "Can retry failed or cancelled jobs"),
            ("cancel_job", "Can cancel jobs"),
            ("run_job_now", "Can run delayed jobs now"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100), name="django_jobs_priority_range"
            ),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="django_jobs_max_attempts_min"),
            models.CheckConstraint(condition=Q(state__in=[s.value for s in JobState]), name="django_jobs_state_valid"),
            # A queue's jobs are unique by idempotency key for as long as the row exists; the engine
            # inserts with ON CONFLICT on exactly this index (its WHERE included).
            # One job per (schedule, tick): the last guard of "exactly one job per tick".
            models.UniqueConstraint(
                fields=["scheduler_key"],
                condition=Q(scheduler_key__isnull=False),
                name="django_jobs_scheduler_tick",
            ),
            models.UniqueConstraint(
                fields=["backend", "queue", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="django_jobs_idempotency_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} [{self.state}] {self.id}"

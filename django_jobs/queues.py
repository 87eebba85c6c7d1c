"""Queue control: ``django_jobs.queue("emails")`` pauses and resumes a queue, limits how many of
its jobs run at once, how fast they start and how many may wait, counts its jobs and removes
them; ``DJANGO_JOBS["QUEUES"]`` declares the same in settings. See docs/howto/queue-control.md,
rate-and-concurrency-limits.md, partitions.md and backpressure.md.

The limits are stored on the queue's QueueState row, which every worker reads in its claim, so a
change holds for every worker and host from the moment it commits. Queue names and what a
declaration may hold are :mod:`django_jobs.spec.queues` (re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from . import engine
from .conf import get_settings
from .exceptions import InvalidQueueSetting, QueueBusy
from .models import Job, QueueState
from .spec.queues import DECLARABLE, queue_columns, validate_queue_declarations, validate_queue_name

__all__ = [
    "DECLARABLE", "InvalidQueueSetting", "QueueBusy", "QueueControl", "QueueLimits", "queue", "sync_queues",
    "validate_queue_declarations",
]  # fmt: skip

CLEANABLE_STATES = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class QueueLimits:
    """A queue's flags and limits as stored (None: no limit)."""

    paused: bool = False
    concurrency: int | None = None
    #: ``(max_jobs, per_seconds)``
    rate_limit: tuple[int, float] | None = None
    max_size: int | None = None
    #: None means 1: one job of a partition at a time, in order.
    partition_concurrency: int | None = None
    partition_rate_limit: tuple[int, float] | None = None
    partition_max_size: int | None = None


@dataclass(frozen=True)
class QueueControl:
    """One queue of one backend; made by :func:`queue`."""

    name: str
    backend: str = "default"

    @property
    def _using(self) -> str:
        return get_settings(self.backend).DATABASE

    def pause(self) -> None:
        """Stop every worker from starting this queue's jobs (running ones finish); enqueueing
        goes on. Holds from the moment it commits: the claim itself skips paused queues."""
        engine.set_queue_paused(using=self._using, queue=self.name, paused=True)

    def resume(self) -> None:
        """Let workers start this queue's jobs again (PostgreSQL wakes them with a NOTIFY)."""
        engine.set_queue_paused(using=self._using, queue=self.name, paused=False)

    def set_concurrency(self, n: int | None) -> None:
        """At most ``n`` of the queue's jobs run at any instant, across every worker and host
        (None: no limit). Running jobs beyond a lowered limit finish; no new one starts meanwhile."""
        self._set(concurrency=n)

    def set_rate_limit(self, max_jobs: int | None, per_seconds: float = 1.0) -> None:
        """At most ``max_jobs`` of the queue's jobs start in any ``per_seconds`` (a sliding
        window, across every worker); ``set_rate_limit(None)`` removes it."""
        self._set(rate_limit=None if max_jobs is None else (max_jobs, per_seconds))

    def set_max_size(self, n: int | None) -> None:
        """Enqueueing past ``n`` unfinished jobs raises QueueFull and inserts nothing (None: no
        limit). Jobs already stored stay, even when more than a lowered limit."""
        self._set(max_size=n)

    def set_partition_concurrency(self, n: int | None) -> None:
        """Up to ``n`` jobs of each partition run at once (None: 1, in order). Above 1 a
        partition's jobs may finish out of order."""
        self._set(partition_concurrency=n)

    def set_partition_rate_limit(self, max_jobs: int | None, per_seconds: float = 1.0) -> None:
        """At most ``max_jobs`` jobs of each partition start in any ``per_seconds``."""
        self._set(partition_rate_limit=None if max_jobs is None else (max_jobs, per_seconds))

    def set_partition_max_size(self, n: int | None) -> None:
        """Enqueueing past ``n`` unfinished jobs in one partition raises QueueFull naming it."""
        self._set(partition_max_size=n)

    def configure(self, **limits: Any) -> None:
        """Set several of ``paused``, ``concurrency``, ``rate_limit`` (``(max_jobs, per_seconds)``),
        ``max_size`` and their ``partition_`` forms in one write."""
        self._set(**limits)

    @property
    def limits(self) -> QueueLimits:
        """The queue's flags and limits as stored now."""
        row = QueueState.objects.using(self._using).filter(name=self.name).first()
        if row is None:
            return QueueLimits()
        return QueueLimits(
            paused=row.paused,
            concurrency=row.concurrency_limit,
            rate_limit=(row.rate_limit, row.rate_window_seconds) if row.rate_limit else None,
            max_size=row.max_size,
            partition_concurrency=row.partition_concurrency,
            partition_rate_limit=(row.partition_rate_limit, row.partition_rate_window_seconds)
            if row.partition_rate_limit
            else None,
            partition_max_size=row.partition_max_size,
        )

    def _set(self, **limits: Any) -> None:
        engine.update_queue_state(using=self._using, queue=self.name, changes=queue_columns(**limits))

    @property
    def is_paused(self) -> bool:
        return engine.is_queue_paused(using=self._using, queue=self.name)

    def counts(self) -> dict[str, int]:
        """``{state: n}`` of the queue's unfinished jobs: waiting, delayed, active and
        waiting-children (finished jobs are history and are not scanned)."""
        return engine.queue_counts(using=self._using, backend=self.backend, queue=self.name)

    def drain(self) -> int:
        """Delete the queue's waiting and delayed jobs; return how many."""
        ids = list(
            Job.objects.using(self._using)
            .filter(backend=self.backend, queue=self.name, state__in=["waiting", "delayed"])
            .values_list("id", flat=True)
        )
        return self._delete(ids)

    def clean(self, state: str, older_than: timedelta, limit: int = 1000) -> int:
        """Delete up to ``limit`` of the queue's jobs that finished in ``state`` (completed,
        failed or cancelled) more than ``older_than`` ago, oldest first; return how many."""
        if state not in CLEANABLE_STATES:
            raise ValueError(
                f"clean() removes finished jobs: state must be one of {', '.join(CLEANABLE_STATES)}; got {state!r}."
            )
        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise ValueError(f"older_than must be a timedelta >= 0; got {older_than!r}.")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1; got {limit!r}.")
        cutoff = timezone.now() - older_than
        ids = list(
            Job.objects.using(self._using)
            .filter(backend=self.backend, queue=self.name, state=state, finished_at__lt=cutoff)
            .order_by("finished_at")
            .values_list("id", flat=True)[:limit]
        )
        return self._delete(ids)

    def obliterate(self, *, force: bool = False) -> int:
        """Delete every job of the queue and its settings; return how many jobs. Refuses with
        QueueBusy while jobs of the queue run, unless ``force`` (their outcomes are then lost)."""
        jobs = Job.objects.using(self._using).filter(backend=self.backend, queue=self.name)
        active = jobs.filter(state="active").count()
        if active and not force:
            raise QueueBusy(
                f"Queue {self.name!r} has {active} running job(s); pause it and wait for them, or pass force=True."
            )
        deleted = self._delete(list(jobs.values_list("id", flat=True)))
        QueueState.objects.using(self._using).filter(name=self.name).delete()
        return deleted

    def _delete(self, ids: list[Any]) -> int:
        total = 0
        for start in range(0, len(ids), 1000):
            total += engine.delete_jobs(using=self._using, job_ids=ids[start : start + 1000])
        return total


def queue(name: str, *, backend: str = "default") -> QueueControl:
    """The control of queue ``name`` of ``backend``; raises InvalidQueueName for a bad name.

    Flags and limits belong to the queue name in the backend's database (backends sharing a
    database share them); counts and removals concern the jobs of ``backend``.
    """
    validate_queue_name(name)
    return QueueControl(name=name, backend=backend)


def sync_queues(*, using: str, declared: dict[str, Any] | None) -> int:
    """Write ``DJANGO_JOBS["QUEUES"]`` to the QueueState rows (a worker does at start); return how
    many queues changed.

    A declared value is written only when the declaration changed since the last sync (the
    row remembers it), so a limit changed at runtime (the admin, ``queue(...).set_...``)
    survives worker restarts until the settings change it. A key removed from the declaration,
    or a queue removed from it, goes back to no limit.
    """

    def columns_for(**keys: Any) -> dict[str, Any]:
        return queue_columns(**{k: tuple(v) if isinstance(v, list) else v for k, v in keys.items()})

    return engine.sync_queue_declarations(
        using=using, declared=validate_queue_declarations(declared), columns_for=columns_for
    )

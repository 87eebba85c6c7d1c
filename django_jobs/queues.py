"""Queue control: ``django_jobs.queue("emails")`` pauses and resumes a queue, limits how many of
its jobs run at once, how fast they start and how many may wait, counts its jobs and removes
them; ``DJANGO_JOBS["QUEUES"]`` declares the same in settings. See docs/howto/queue-control.md,
rate-and-concurrency-limits.md, partitions.md and backpressure.md.

The limits are stored on the queue's QueueState row, which every worker reads in its claim, so a
change holds for every worker and host from the moment it commits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from .exceptions import InvalidQueueSetting, JobsConfigurationError, JobsError, QueueBusy

__all__ = ["InvalidQueueSetting", "QueueBusy", "QueueControl", "QueueLimits", "queue", "sync_queues"]

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


#: The keys of a DJANGO_JOBS["QUEUES"] declaration.
DECLARABLE = (
    "paused",
    "concurrency",
    "rate_limit",
    "max_size",
    "partition_concurrency",
    "partition_rate_limit",
    "partition_max_size",
)


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidQueueSetting(f"{what} must be an integer >= 1, or None to remove the limit; got {value!r}.")
    return value


def _rate(value: Any, what: str) -> tuple[int, float] | None:
    """``None`` or ``(max_jobs, per_seconds)``, validated."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise InvalidQueueSetting(
            f"{what} must be (max_jobs, per_seconds), such as (20, 1.0), or None to remove it; got {value!r}."
        )
    max_jobs, per = value
    _count(max_jobs, f"{what}: max_jobs")
    if not isinstance(per, (int, float)) or isinstance(per, bool) or not math.isfinite(per) or per <= 0:
        raise InvalidQueueSetting(f"{what}: per_seconds must be a number of seconds > 0; got {per!r}.")
    return int(max_jobs), float(per)


def _columns(**limits: Any) -> dict[str, Any]:
    """QueueState columns for validated ``limits`` (keys of :data:`DECLARABLE`)."""
    columns: dict[str, Any] = {}
    for key, value in limits.items():
        if key == "paused":
            if not isinstance(value, bool):
                raise InvalidQueueSetting(f"paused must be True or False; got {value!r}.")
            columns["paused"] = value
        elif key in ("concurrency", "max_size", "partition_concurrency", "partition_max_size"):
            column = {"concurrency": "concurrency_limit"}.get(key, key)
            columns[column] = _count(value, key)
        elif key in ("rate_limit", "partition_rate_limit"):
            rate = _rate(value, key)
            columns[key] = rate[0] if rate else None
            columns[f"{key.removesuffix('_limit')}_window_seconds"] = rate[1] if rate else None
        else:
            raise InvalidQueueSetting(f"Unknown queue setting {key!r}; allowed: {', '.join(DECLARABLE)}.")
    return columns


@dataclass(frozen=True)
class QueueControl:
    """One queue of one backend; made by :func:`queue`."""

    name: str
    backend: str = "default"

    @property
    def _using(self) -> str:
        from .conf import get_settings

        return get_settings(self.backend).DATABASE

    def pause(self) -> None:
        """Stop every worker from starting this queue's jobs (running ones finish); enqueueing
        goes on. Holds from the moment it commits: the claim itself skips paused queues."""
        from . import engine

        engine.set_queue_paused(using=self._using, queue=self.name, paused=True)

    def resume(self) -> None:
        """Let workers start this queue's jobs again (PostgreSQL wakes them with a NOTIFY)."""
        from . import engine

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
        from .models import QueueState

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
        from . import engine

        engine.update_queue_state(using=self._using, queue=self.name, changes=_columns(**limits))

    @property
    def is_paused(self) -> bool:
        from . import engine

        return engine.is_queue_paused(using=self._using, queue=self.name)

    def counts(self) -> dict[str, int]:
        """``{state: n}`` of the queue's unfinished jobs: waiting, delayed, active and
        waiting-children (finished jobs are history and are not scanned)."""
        from . import engine

        return engine.queue_counts(using=self._using, backend=self.backend, queue=self.name)

    def drain(self) -> int:
        """Delete the queue's waiting and delayed jobs; return how many."""
        from .models import Job

        ids = list(
            Job.objects.using(self._using)
            .filter(backend=self.backend, queue=self.name, state__in=["waiting", "delayed"])
            .values_list("id", flat=True)
        )
        return self._delete(ids)

    def clean(self, state: str, older_than: timedelta, limit: int = 1000) -> int:
        """Delete up to ``limit`` of the queue's jobs that finished in ``state`` (completed,
        failed or cancelled) more than ``older_than`` ago, oldest first; return how many."""
        from .models import Job

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
        from .models import Job, QueueState

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
        from . import engine

        total = 0
        for start in range(0, len(ids), 1000):
            total += engine.delete_jobs(using=self._using, job_ids=ids[start : start + 1000])
        return total


def queue(name: str, *, backend: str = "default") -> QueueControl:
    """The control of queue ``name`` of ``backend``; raises InvalidQueueName for a bad name.

    Flags and limits belong to the queue name in the backend's database (backends sharing a
    database share them); counts and removals concern the jobs of ``backend``.
    """
    from .backend import validate_queue_name

    validate_queue_name(name)
    return QueueControl(name=name, backend=backend)


def validate_queue_declarations(declared: Any) -> dict[str, dict[str, Any]]:
    """``DJANGO_JOBS["QUEUES"]`` validated and JSON-shaped (a rate limit as ``[max_jobs,
    per_seconds]``); JobsConfigurationError naming the queue and the key for anything invalid."""
    from .backend import validate_queue_name

    if declared is None:
        return {}
    if not isinstance(declared, dict):
        raise JobsConfigurationError(
            'QUEUES must be a dict such as {"emails": {"concurrency": 5, "rate_limit": (20, 1.0)}}; '
            f"got {type(declared).__name__}."
        )
    out: dict[str, dict[str, Any]] = {}
    for name, limits in declared.items():
        try:
            validate_queue_name(name)
        except JobsError as exc:
            raise JobsConfigurationError(f"QUEUES: {exc}") from None
        if not isinstance(limits, dict):
            raise JobsConfigurationError(f"QUEUES[{name!r}] must be a dict of limits; got {limits!r}.")
        try:
            _columns(**limits)
        except InvalidQueueSetting as exc:
            raise JobsConfigurationError(f"QUEUES[{name!r}]: {exc}") from None
        out[name] = {
            k: list(_rate(v, k)) if k.endswith("rate_limit") and v is not None else v for k, v in limits.items()
        }
    return out


def sync_queues(*, using: str, declared: dict[str, Any] | None) -> int:
    """Write ``DJANGO_JOBS["QUEUES"]`` to the QueueState rows (a worker does at start); return how
    many queues changed.

    A declared value is written only when the declaration changed since the last sync (the
    row remembers it), so a limit changed at runtime (the admin, ``queue(...).set_...``)
    survives worker restarts until the settings change it. A key removed from the declaration,
    or a queue removed from it, goes back to no limit.
    """
    from . import engine

    def columns_for(**keys: Any) -> dict[str, Any]:
        return _columns(**{k: tuple(v) if isinstance(v, list) else v for k, v in keys.items()})

    return engine.sync_queue_declarations(
        using=using, declared=validate_queue_declarations(declared), columns_for=columns_for
    )

"""Queue control: ``django_jobs.queue("emails")`` pauses and resumes a queue, counts its jobs and
removes them. See docs/howto/queue-control.md.

Concurrency, rate and size limits of a queue arrive with the rest of the queue-control work;
``QueueState`` already has their columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from .exceptions import JobsError

__all__ = ["QueueBusy", "QueueControl", "queue"]

CLEANABLE_STATES = ("completed", "failed", "cancelled")


class QueueBusy(JobsError):
    """The queue has running jobs; pass force=True to remove them anyway."""


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
    """The control of queue ``name`` of ``backend``; raises InvalidQueueName for a bad name."""
    from .backend import validate_queue_name

    validate_queue_name(name)
    return QueueControl(name=name, backend=backend)

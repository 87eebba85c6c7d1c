"""What the operations commands show (``manage.py jobs``): read-only views of queues and jobs.

The command formats these; the admin dashboards of the operations console build on the same.
Writes (retry, cancel, pause) go through :mod:`django_jobs.api` and :mod:`django_jobs.queues`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count

from .states import UNFINISHED_STATES, JobState

__all__ = ["QueueRow", "job_detail", "list_jobs", "queue_overview"]


@dataclass(frozen=True)
class QueueRow:
    """One queue of the overview: unfinished jobs per state, flags and limits."""

    name: str
    counts: dict[str, int] = field(default_factory=dict)
    paused: bool = False
    concurrency: int | None = None
    rate_limit: tuple[int, float] | None = None
    max_size: int | None = None


def queue_overview(*, using: str, backend: str) -> list[QueueRow]:
    """Every queue with unfinished jobs of ``backend`` or a QueueState row, by name. Counts only
    unfinished states (one GROUP BY over django_jobs_unfinished_idx): finished history, which
    grows without bound, is never counted."""
    from .models import Job, QueueState

    counts: dict[str, dict[str, int]] = {}
    rows = (
        Job.objects.using(using)
        .filter(backend=backend, state__in=UNFINISHED_STATES)
        .values_list("queue", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    for queue, state, n in rows:
        counts.setdefault(queue, {})[state] = n
    states = {row.name: row for row in QueueState.objects.using(using).all()}
    out = []
    for name in sorted(set(counts) | set(states)):
        row = states.get(name)
        out.append(
            QueueRow(
                name=name,
                counts={s: counts.get(name, {}).get(s, 0) for s in UNFINISHED_STATES},
                paused=bool(row and row.paused),
                concurrency=row.concurrency_limit if row else None,
                rate_limit=(row.rate_limit, row.rate_window_seconds) if row and row.rate_limit else None,
                max_size=row.max_size if row else None,
            )
        )
    return out


def list_jobs(
    *,
    using: str,
    backend: str,
    queue: str | None = None,
    state: str | None = None,
    task: str | None = None,
    limit: int = 20,
) -> list[Any]:
    """The newest ``limit`` jobs matching the filters (ValueError for an unknown state)."""
    from .models import Job

    if state is not None and state not in JobState.values:
        raise ValueError(f"Unknown state {state!r}; one of {', '.join(JobState.values)}.")
    jobs = Job.objects.using(using).filter(backend=backend)
    if queue:
        jobs = jobs.filter(queue=queue)
    if state:
        jobs = jobs.filter(state=state)
    if task:
        jobs = jobs.filter(task_path=task)
    return list(jobs.order_by("-id")[:limit])  # ids are UUIDv7: newest first, by the primary key


def job_detail(*, using: str, job_id: str) -> tuple[Any, list[Any]] | None:
    """``(job, log lines)`` of one job; None for an unknown or malformed id."""
    from .models import Job, JobLog

    try:
        pk = uuid.UUID(str(job_id))
    except ValueError:
        return None
    job = Job.objects.using(using).filter(id=pk).first()
    if job is None:
        return None
    return job, list(JobLog.objects.using(using).filter(job_id=pk).order_by("idx"))

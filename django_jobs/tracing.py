"""``django_jobs.trace(trace_id)``: the jobs of one pipeline. A job's trace id, and what decides
it, are declared in :mod:`django_jobs.spec.tracing` (re-exported here, where they were first
imported from). See docs/howto/idempotency-and-tracing.md.
"""

from __future__ import annotations

from typing import Any

from django.tasks import task_backends

from .backend import JobsBackend
from .exceptions import InvalidTaskOptions
from .models import Job
from .spec.tracing import (
    TRACE_ID_RE,
    current_trace_id,
    new_trace_id,
    running,
    trace_id_for_new_job,
    validate_trace_id,
)


def trace(trace_id: str, *, backend: str = "default") -> list[Any]:
    """Every job of the pipeline ``trace_id`` in enqueue order (``enqueued_at``, then id), as
    ``JobResult``s of the jobs enqueued through the TASKS alias ``backend``.

    Raises ``ValueError`` for a string that cannot be a trace id.
    """
    try:
        validate_trace_id(trace_id)
    except InvalidTaskOptions as exc:
        raise ValueError(str(exc)) from None
    jobs_backend = task_backends[backend]
    if not isinstance(jobs_backend, JobsBackend):
        raise TypeError(
            f"trace() reads jobs of django_jobs.backend.JobsBackend; TASKS[{backend!r}] is a "
            f"{type(jobs_backend).__name__}."
        )
    jobs = Job.objects.using(jobs_backend.database).filter(backend=backend, trace_id=trace_id)
    return [jobs_backend._result_from_job(job) for job in jobs.order_by("enqueued_at", "id")]


__all__ = [
    "TRACE_ID_RE", "current_trace_id", "new_trace_id", "running", "trace", "trace_id_for_new_job",
    "validate_trace_id",
]  # fmt: skip

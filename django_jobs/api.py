"""The Python API beyond Django's Tasks framework: ``cancel`` and ``retry`` (more arrives with
the features that need it). Importable as ``django_jobs.cancel`` / ``django_jobs.retry``."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.tasks import TaskResult, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist

from . import engine
from .exceptions import JobNotRetryable
from .models import JobDependency
from .signals import job_cancelled, send_job_signal


def _job_id(result_id: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(result_id))
    except (ValueError, TypeError, AttributeError):
        raise TaskResultDoesNotExist(f"No job with id {result_id!r} (not a job id).") from None


def cancel(result_id: Any, *, backend: str = "default") -> TaskResult:
    """Cancel a job and return its result. A waiting or delayed job is ``cancelled`` at once; a
    running one is flagged (``context.is_cancelled()`` turns true within a second) and ends
    ``cancelled`` whatever its attempt returns; a finished job is left as it is.

    Raises ``TaskResultDoesNotExist`` for an unknown id.
    """
    jobs_backend = task_backends[backend]
    db = jobs_backend.database
    job_id = _job_id(result_id)
    done = engine.cancel_job(using=db, job_id=job_id)
    if done is None:
        raise TaskResultDoesNotExist(f"No job with id {result_id!r}.")
    # A running job's signal is sent when its attempt ends; these were cancelled at once.
    at_once = [(job_id, done.queue)] if done.change == "cancelled" else []
    at_once += list(done.descendants)
    if at_once:

        def send() -> None:
            for cancelled_id, queue in at_once:
                send_job_signal(job_cancelled, backend, job_id=str(cancelled_id), queue=queue, was_running=False)

        transaction.on_commit(send, using=db, robust=True)
    return jobs_backend.get_result(result_id)


def retry(result_id: Any, *, backend: str = "default") -> TaskResult:
    """Re-queue a failed or cancelled job (one more attempt when its attempts are used up) and
    return its result. Raises ``TaskResultDoesNotExist`` for an unknown id and
    ``JobNotRetryable`` for a job in another state."""
    jobs_backend = task_backends[backend]
    job_id = _job_id(result_id)
    if not engine.retry_job(using=jobs_backend.database, job_id=job_id):
        result = jobs_backend.get_result(result_id)  # raises TaskResultDoesNotExist when unknown
        pending = JobDependency.objects.using(jobs_backend.database).filter(parent_id=job_id, status="pending").count()
        if pending:
            raise JobNotRetryable(
                f"Job {result_id} still has {pending} unfinished flow child(ren); it would run without them. Let "
                "them finish (or retry them) first."
            )
        raise JobNotRetryable(f"Job {result_id} is {result.status}; only failed or cancelled jobs can be retried.")
    return jobs_backend.get_result(result_id)

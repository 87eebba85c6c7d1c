"""The Python API beyond Django's Tasks framework: ``cancel``, ``retry`` and ``rotate_keys`` (more
arrives with the features that need it). Importable as ``django_jobs.cancel`` and so on."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.tasks import TaskResult, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist

from . import engine
from .exceptions import InvalidKeyRotation, JobNotRetryable
from .models import JobDependency
from .signals import job_cancelled, send_job_signal
from .spec.encryption import require_keys


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


@dataclass
class KeyRotation:
    """What :func:`rotate_keys` did. Encrypted jobs: ``examined``, ``rotated`` (re-encrypted
    with the first key; the others had it already) and ``last_id``, the job id the run ended
    after (for ``after=``). ``flow_values`` and ``stashes``: the encrypted flow children's values
    on dependency rows and the stashed dedup enqueues re-encrypted. Bus mode: ``messages``,
    ``dead_letters`` and ``cursor_errors`` (a group cursor's last error) re-encrypted.
    ``undecryptable``: what no key decrypts (a job id, or ``"flow value <id>"``, ``"dedup stash
    <id>"``, ``"message <id>"``, ``"dead letter <id>"``, ``"cursor error <id>"``), left as it is."""

    examined: int = 0
    rotated: int = 0
    flow_values: int = 0
    stashes: int = 0
    messages: int = 0
    dead_letters: int = 0
    cursor_errors: int = 0
    undecryptable: list[str] = field(default_factory=list)
    last_id: uuid.UUID | None = None


#: The KeyRotation field counting each kind but jobs (``engine.ENCRYPTED_KINDS``).
_ROTATED_FIELD = {
    "flow values": "flow_values",
    "dedup stashes": "stashes",
    "messages": "messages",
    "dead letters": "dead_letters",
    "cursor errors": "cursor_errors",
}


def rotate_keys(
    *,
    backend: str = "default",
    batch_size: int = 500,
    after: Any = None,
    on_batch: Callable[[KeyRotation], None] | None = None,
) -> KeyRotation:
    """Re-encrypt everything stored encrypted with the first of
    ``DJANGO_JOBS["ENCRYPTION_KEYS"]``, ``batch_size`` rows per transaction: every encrypted job
    (``encrypt=True``: arguments, return value, error tracebacks) in id order from after the job
    id ``after`` (None: the first), then the values encrypted flow children left on their
    dependency rows, the stashed dedup enqueues of encrypted jobs, and bus mode's encrypted
    messages, dead letters and cursors' last errors (``after`` is for jobs only). Safe while workers run
    (each batch's rows are locked and read again); a row the first key encrypted already is not
    written, so a run started again after a stop redoes nothing. ``on_batch`` gets the running
    totals after each batch of jobs. Raises EncryptionKeysMissing without keys and
    InvalidKeyRotation for a ``batch_size`` outside 1-10,000 or an ``after`` that is not a job id.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
        raise InvalidKeyRotation(f"batch_size must be an integer from 1 to 10,000; got {batch_size!r}.")
    try:
        start = None if after is None else uuid.UUID(str(after))
    except ValueError:
        raise InvalidKeyRotation(f"after must be a job id (a UUID); got {after!r}.") from None
    require_keys()
    using = task_backends[backend].database
    totals = KeyRotation(last_id=start)
    for kind in engine.ENCRYPTED_KINDS:
        cursor = start if kind == "jobs" else None
        while True:
            batch = engine.rotate_encrypted(kind, using=using, limit=batch_size, after=cursor)
            if not batch.examined:
                break
            cursor = batch.last_id
            if kind == "jobs":
                totals.examined += batch.examined
                totals.rotated += batch.rotated
                totals.undecryptable += [str(i) for i in batch.undecryptable]
                totals.last_id = batch.last_id
                if on_batch is not None:
                    on_batch(totals)
                continue
            field_name = _ROTATED_FIELD[kind]
            setattr(totals, field_name, getattr(totals, field_name) + batch.rotated)
            totals.undecryptable += [f"{kind[:-1]} {i}" for i in batch.undecryptable]
    return totals

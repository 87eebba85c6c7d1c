"""Operator and job-side controls: cancel, retry, cancel requests, progress and job logs."""

from __future__ import annotations

import json
import random
import time
import uuid
from datetime import datetime
from typing import Any, NamedTuple

from django.db import OperationalError, connections, transaction
from django.utils import timezone

from ..db import is_transient
from ..drivers import driver
from ..models import Job, JobLog
from ..states import FINISHED_STATES, JobState
from .common import (
    JOB_TABLE,
    _cancelled_error,
    _drop_broken_connection,
    events_channel,
    events_enabled,
    logger,
    ready_seq,
)
from .effects import (
    _finished_elsewhere,
    _job_events,
    _notify_cancel,
    notify,
    write_events,
)
from .flows import cancel_descendants, settle_dependencies
from .partitions import _unblock_partitions_of


class CancelResult(NamedTuple):
    #: The job's state afterwards (``active`` for a running job that was flagged).
    state: str
    #: What this call did: ``cancelled`` (was waiting/delayed), ``flagged`` (was running), or
    #: ``None`` (nothing: already finished, or already flagged).
    change: str | None
    queue: str
    #: ``(id, queue)`` of the flow children cancelled with it (at once; running ones are flagged).
    descendants: tuple[tuple[uuid.UUID, str], ...] = ()


def cancel_job(*, using: str, job_id: uuid.UUID, now: datetime | None = None) -> CancelResult | None:
    """Cancel a job; say what happened (``None`` when there is no such job).

    A waiting, delayed or waiting-children job becomes ``cancelled`` at once. A running one is
    flagged (``cancel_requested_at``): the task sees ``context.is_cancelled()`` turn true, and
    whatever its attempt comes to is recorded as ``cancelled``. A finished job is left as it is.
    Both writes are guarded on the state, so a worker finishing at the same moment wins or loses
    cleanly: exactly one outcome is recorded.
    """
    # A cancel that cascades through a flow locks the parent, then its children; a worker
    # finishing a child locks them the other way round. PostgreSQL breaks such a deadlock by
    # failing one side: retry ours, unless it runs in the caller's transaction (then it is theirs).
    # A lost connection is retried too: the try may have committed before its answer was lost,
    # which the next try recognises by the time it wrote (``now``, the same for every try).
    now = now or timezone.now()
    tries = 1 if connections[using].in_atomic_block else 4
    for attempt in range(tries):
        try:
            return _cancel_job(using=using, job_id=job_id, now=now)
        except OperationalError as exc:
            if attempt == tries - 1 or not is_transient(exc):
                raise
            _drop_broken_connection(using)
            time.sleep(random.uniform(0.01, 0.05) * 2**attempt)
    raise AssertionError("unreachable")


def _cancel_job(*, using: str, job_id: uuid.UUID, now: datetime) -> CancelResult | None:
    jobs = Job.objects.using(using).filter(id=job_id)
    change = None
    descendants: list[tuple[uuid.UUID, str]] = []
    with transaction.atomic(using=using):
        # Two guarded writes; a worker may move the job between them (a release or rescue puts
        # an active job back to waiting, a claim makes a waiting one active), so try again.
        for _ in range(3):
            if jobs.filter(state__in=[JobState.WAITING, JobState.DELAYED, JobState.WAITING_CHILDREN]).update(
                state=JobState.CANCELLED, finished_at=now, cancel_requested_at=now
            ):
                change = "cancelled"
                break
            if jobs.filter(state=JobState.ACTIVE, cancel_requested_at__isnull=True).update(cancel_requested_at=now):
                change = "flagged"
                _notify_cancel(using, [job_id])  # its worker hears now; it also polls
                break
            row = jobs.values_list("state", "cancel_requested_at", "queue", "finished_at").first()
            if row is not None and row[1] == now:
                # An earlier try of this cancel committed all of it, and only its answer was lost.
                # It cancelled the job (finished then) or flagged it (its worker finished it later).
                return CancelResult(row[0], "cancelled" if row[3] == now else "flagged", row[2])
            state = row[0] if row is not None else None
            if state is None or state in FINISHED_STATES or state == JobState.ACTIVE:
                break  # unknown, finished, or already flagged: nothing to do
        if change == "cancelled":
            with connections[using].cursor() as cursor:
                _finished_elsewhere(cursor, driver(using), [job_id], "cancelled", now)
        elif change == "flagged":
            row = jobs.values_list("queue", flat=True).first()
            _job_events(using, [(row, job_id, "cancel-requested", {})], now)
        if change is not None:
            descendants = cancel_descendants(using=using, parent_ids=[job_id], now=now)  # a flow's children
        if change == "cancelled":
            settle_dependencies(using=using, finished=[(job_id, JobState.CANCELLED, _cancelled_error(job_id))], now=now)
            _unblock_partitions_of(using, [job_id, *(d for d, _ in descendants)])
    row = jobs.values_list("state", "queue").first()
    return None if row is None else CancelResult(row[0], change, row[1], tuple(descendants))


def cancel_requested_ids(*, using: str, worker_id: str) -> list[uuid.UUID]:
    """Ids of ``worker_id``'s running jobs that were cancelled (the worker's poll for cancels)."""
    d = driver(using)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {JOB_TABLE} WHERE state = 'active' AND worker_id = %s AND cancel_requested_at IS NOT NULL",
            [worker_id],
        )
        return [d.to_uuid(r[0]) for r in cursor.fetchall()]


def retry_job(*, using: str, job_id: uuid.UUID, now: datetime | None = None) -> bool:
    """Re-queue a failed or cancelled job (guarded on those states); when its attempts are used up
    it gets one more. Errors and worker ids of earlier attempts are kept."""
    from django.db.models import BigIntegerField, Case, F, PositiveIntegerField, Value, When

    now = now or timezone.now()
    seq = ready_seq(now)
    with transaction.atomic(using=using):
        retried = bool(
            Job.objects.using(using)
            .filter(id=job_id, state__in=[JobState.FAILED, JobState.CANCELLED])
            # A flow parent with unfinished children would run without them: refused.
            .exclude(dependencies__status="pending")
            .update(
                state=JobState.WAITING,
                available_at=now,
                # Ready now: a new seq from now, keeping the sign (a LIFO job stays LIFO).
                seq=Case(When(seq__lt=0, then=Value(-seq)), default=Value(seq), output_field=BigIntegerField()),
                finished_at=None,
                purge_at=None,
                cancel_requested_at=None,
                max_attempts=Case(
                    When(attempts__gte=F("max_attempts"), then=F("attempts") + 1),
                    default=F("max_attempts"),
                    output_field=PositiveIntegerField(),
                ),
            )
        )
        if retried:
            queue = Job.objects.using(using).filter(id=job_id).values_list("queue", flat=True).first()
            _job_events(using, [(queue, job_id, "retried", {"manual": True})], now)
            notify(using, [queue])
    _unblock_partitions_of(using, [job_id])  # back in its partition: it may be the next again
    return retried


def is_cancel_requested(*, using: str, job_id: uuid.UUID) -> bool:
    return Job.objects.using(using).filter(id=job_id, cancel_requested_at__isnull=False).exists()


def set_progress(*, using: str, job_id: uuid.UUID, lease_token: uuid.UUID, value: Any) -> bool:
    """Store a running job's progress, guarded on its lease, with its ``progress`` event; False
    when the job is no longer ours."""
    d = driver(using)
    fused = d.FUSED_EFFECTS and events_enabled()
    with d.effects_atomic(), connections[using].cursor() as cursor:
        queue = d.set_progress(
            cursor, job_id=job_id, lease_token=lease_token, value_json=json.dumps(value),
            events_channel=events_channel() if fused else None,
        )  # fmt: skip
        if queue is None:
            return False
        if not d.FUSED_EFFECTS:
            write_events(cursor, d, [(queue, job_id, "progress", {"progress": value})])
    return True


def append_job_log(
    *,
    using: str,
    job_id: uuid.UUID,
    lease_token: uuid.UUID,
    line: str,
    max_lines: int,
    now: datetime | None = None,
) -> bool:
    """Append one line to a running job's log; False when not stored (the job is no longer this
    attempt's, or its log is full).

    The position is computed by the INSERT itself, so lines of one job keep one order. Writers
    of one job are serialised (an advisory lock on PostgreSQL, the write lock on SQLite); should
    two still race for a position, the unique constraint stops one and it retries.
    The line at position ``max_lines - 1`` is replaced by a truncation notice.
    """
    from django.db import IntegrityError

    d = driver(using)
    now = now or timezone.now()
    log_table = JobLog._meta.db_table
    notice = f"[django-jobs: log truncated at {max_lines} lines (LOG_MAX_LINES)]"
    # No leading WITH: Python's sqlite3 reports no rowcount for a statement that starts with one.
    sql = (
        f"INSERT INTO {log_table} (job_id, idx, line, created_at) "
        f"SELECT j.id, nxt.idx, CASE WHEN nxt.idx = %s THEN %s ELSE %s END, %s "
        f"FROM {JOB_TABLE} j, (SELECT COALESCE(MAX(idx), -1) + 1 AS idx FROM {log_table} WHERE job_id = %s) nxt "
        f"WHERE j.id = %s AND j.state = 'active' AND j.lease_token = %s AND nxt.idx < %s"
    )
    params = [max_lines - 1, notice, line, d.dt(now), d.uuid(job_id), d.uuid(job_id), d.uuid(lease_token), max_lines]
    # Writers of one job queue up on a lock keyed by the job (where the database has one), so
    # they do not keep colliding on the unique position (one could starve the other).
    lock_key = int.from_bytes(job_id.bytes[8:], "big", signed=True)
    for _ in range(20):
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                d.lock_job_log(cursor, lock_key)
                cursor.execute(sql, params)
                return cursor.rowcount == 1
        except IntegrityError:
            continue  # another thread of the same job took this position; compute the next one
    logger.warning("Could not append a log line to job %s after 20 tries; dropped.", job_id)
    return False

"""Maintenance verbs run by the services: promote due jobs, rescue stalled ones, prune finished
jobs, trim events and metrics, delete jobs."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.utils import timezone

from ..drivers import Driver, driver
from ..drivers.base import UNFINISHED_SQL
from ..models import Job, JobDependency, JobLog
from ..models.dedup import JobDedup
from ..states import FINISHED_STATES, JobState
from .common import (
    _FINISHED_SQL,
    EVENT_TABLE,
    JOB_TABLE,
    METRIC_TABLE,
    _backend_scope,
    _cancelled_error,
    logger,
    ready_seq,
)
from .dedup import DEDUP_TABLE
from .effects import _finished_elsewhere, _job_events, notify, write_events
from .flows import settle_dependencies
from .partitions import _partitions_of, _unblock_partitions


def delete_jobs(*, using: str, job_ids: list[uuid.UUID], now: datetime | None = None) -> int:
    """Delete jobs (and their logs, dedup keys and dependency rows); a flow child deleted before
    it finished counts as cancelled for its parent, so no parent waits for it forever."""
    if not job_ids:
        return 0
    with transaction.atomic(using=using):
        unfinished_children = list(
            Job.objects.using(using)
            .filter(id__in=job_ids, parent__isnull=False)
            .exclude(state__in=FINISHED_STATES)
            .values_list("id", flat=True)
        )
        settle_dependencies(
            using=using,
            finished=[(j, JobState.CANCELLED, _cancelled_error(j)) for j in unfinished_children],
            now=now,
        )
        partitions = _partitions_of(using, job_ids, unfinished=True)
        gone = list(Job.objects.using(using).filter(id__in=job_ids).values_list("queue", "id"))
        _job_events(using, [(q, j, "removed", {}) for q, j in gone], now)
        deleted, by_model = Job.objects.using(using).filter(id__in=job_ids).delete()
        _unblock_partitions(using, partitions)  # their partitions' next jobs may run now
    return by_model.get(Job._meta.label, 0)


def _prunable(d: Driver, now_sql: str) -> str:
    """What a finished job ``j`` needs to be deleted besides its policy: no dedup key of its
    that still holds (``Dedup(ttl=...)`` holds whatever the job's state), and no unfinished
    flow child (a worker finishing that child locks its edge, then the parent: deleting the
    parent first would take those locks the other way round)."""
    return (
        f"NOT EXISTS (SELECT 1 FROM {DEDUP_TABLE} k WHERE k.job_id = j.id AND k.expire_at > {now_sql}) "
        f"AND NOT EXISTS (SELECT 1 FROM {JOB_TABLE} c WHERE c.parent_id = j.id AND c.state IN {UNFINISHED_SQL})"
    )


def _delete_finished(cursor: Any, d: Driver, select_ids: str, params: list[Any]) -> int:
    """Delete the finished jobs ``select_ids`` returns (it locks them, skipping locked rows) with
    their logs, flow edges and dedup keys; children keep running without the parent link. Call
    inside a transaction."""
    cursor.execute(select_ids, params)
    ids = [row[0] for row in cursor.fetchall()]
    if not ids:
        return 0
    in_sql, in_params = d.in_list("{col}", ids)
    for table, column in (
        (JobLog._meta.db_table, "job_id"),
        (JobDependency._meta.db_table, "parent_id"),
        (JobDedup._meta.db_table, "job_id"),
    ):
        cursor.execute(f"DELETE FROM {table} WHERE {in_sql.format(col=column)}", in_params)
    # Job.parent is ON DELETE SET NULL in Django only: the database needs it done first.
    cursor.execute(f"UPDATE {JOB_TABLE} SET parent_id = NULL WHERE {in_sql.format(col='parent_id')}", in_params)
    cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE {in_sql.format(col='id')} AND state IN {_FINISHED_SQL}", in_params)
    return cursor.rowcount


def prune_expired_jobs(*, using: str, limit: int, now: datetime | None = None) -> int:
    """Delete up to ``limit`` finished jobs whose retention ended (``purge_at`` passed), oldest
    first, in one short transaction; return how many. Unfinished jobs are never touched."""
    d = driver(using)
    now_sql, now_params = d.now(now)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        return _delete_finished(
            cursor,
            d,
            f"SELECT j.id FROM {JOB_TABLE} j WHERE j.purge_at IS NOT NULL AND j.purge_at <= {now_sql} "
            f"AND j.state IN {_FINISHED_SQL} AND {_prunable(d, now_sql)} ORDER BY j.purge_at LIMIT %s "
            f"{d.skip_locked()}",
            [*now_params, *now_params, limit],
        )


def prune_over_count(
    *,
    using: str,
    queue: str,
    state: str,
    keep: int,
    limit: int,
    task_path: str | None = None,
    exclude_tasks: list[str] | tuple[str, ...] = (),
    now: datetime | None = None,
) -> int:
    """Delete up to ``limit`` of ``queue``'s jobs finished in ``state`` (of ``task_path`` only,
    when given; never of ``exclude_tasks``, whose own policy governs them) beyond the ``keep``
    newest; return how many. Walks django_jobs_finished_q_idx."""
    if state not in FINISHED_STATES:
        raise ValueError(f"state must be one of {', '.join(FINISHED_STATES)}; got {state!r}.")
    d = driver(using)
    now_sql, now_params = d.now(now)
    scope = "j.queue = %s AND j.state = %s AND j.finished_at IS NOT NULL"
    params: list[Any] = [queue, state]
    if task_path is not None:
        scope += " AND j.task_path = %s"
        params.append(task_path)
    if exclude_tasks:
        sql, in_params = d.in_list("j.task_path", list(exclude_tasks))
        scope += f" AND NOT ({sql})"
        params += in_params
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT j.finished_at, j.id FROM {JOB_TABLE} j WHERE {scope} ORDER BY j.finished_at DESC, j.id DESC "
            f"LIMIT 1 OFFSET %s",
            [*params, keep],
        )
        cutoff = cursor.fetchone()
        if cutoff is None:
            return 0
        return _delete_finished(
            cursor,
            d,
            f"SELECT j.id FROM {JOB_TABLE} j WHERE {scope} AND (j.finished_at < %s OR (j.finished_at = %s AND "
            f"j.id <= %s)) AND {_prunable(d, now_sql)} ORDER BY j.finished_at LIMIT %s {d.skip_locked()}",
            [*params, cutoff[0], cutoff[0], cutoff[1], *now_params, limit],
        )


def trim_events(*, using: str, keep: int, limit: int) -> int:
    """Delete up to ``limit`` events per queue beyond each queue's ``keep`` newest; return how
    many."""
    d = driver(using)
    total = 0
    with connections[using].cursor() as cursor:
        queues = d.distinct_queues(cursor, EVENT_TABLE)
    for queue in queues:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(
                f"SELECT txid, id FROM {EVENT_TABLE} WHERE queue = %s ORDER BY txid DESC, id DESC LIMIT 1 OFFSET %s",
                [queue, keep],
            )
            cutoff = cursor.fetchone()
            if cutoff is None:
                continue
            cursor.execute(
                f"DELETE FROM {EVENT_TABLE} WHERE "
                + d.id_in(
                    f"SELECT id FROM {EVENT_TABLE} WHERE queue = %s AND (txid < %s OR (txid = %s AND id <= %s)) "
                    f"ORDER BY txid, id LIMIT %s"
                ),
                [queue, cutoff[0], cutoff[0], cutoff[1], limit],
            )
            total += cursor.rowcount
    return total


def trim_metrics(*, using: str, older_than: datetime, limit: int) -> int:
    """Delete up to ``limit`` Metric rows of minutes before ``older_than``; return how many."""
    return trim_minutes(METRIC_TABLE, using=using, older_than=older_than, limit=limit)


def trim_minutes(table: str, *, using: str, older_than: datetime, limit: int) -> int:
    """Delete up to ``limit`` rows of ``table`` (a per-minute table: Metric, TopicMetric) whose
    ``minute`` is before ``older_than``, oldest first; return how many."""
    d = driver(using)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE "
            + d.id_in(f"SELECT id FROM {table} WHERE minute < %s ORDER BY minute LIMIT %s"),
            [d.dt(older_than), limit],
        )
        return cursor.rowcount


# -- services -------------------------------------------------------------------------------


def promote_due_jobs(*, using: str, limit: int, backend: str | None = None, now: datetime | None = None) -> int:
    """Move up to ``limit`` delayed jobs whose time has come (of ``backend``, or all) to
    ``waiting``; return how many."""
    d = driver(using)
    now_sql, now_params = d.now(now)
    scope, scope_params = _backend_scope(backend)
    where = (
        d.id_in(
            f"SELECT id FROM {JOB_TABLE} WHERE state = 'delayed' AND available_at <= {now_sql}{scope} "
            f"ORDER BY available_at LIMIT %s {d.skip_locked()}"
        )
        + " AND state = 'delayed'"
    )
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        rows = d.update_returning(
            cursor, JOB_TABLE, "state = 'waiting'", [], where, [*now_params, *scope_params, limit], "queue, id"
        )
        write_events(cursor, d, [(r[0], d.to_uuid(r[1]), "promoted", {}) for r in rows], now)
    notify(using, sorted({r[0] for r in rows}))
    return len(rows)


def make_due(*, using: str, job_ids: list[uuid.UUID], now: datetime | None = None) -> int:
    """Move the given delayed jobs to ``waiting`` now, whatever their time (the test kit's
    ``drain_queue``, the admin's "run now"); guarded on ``delayed``; wakes their queues' workers.
    Returns how many moved."""
    from django.db.models import BigIntegerField, Case, Value, When

    if not job_ids:
        return 0
    now = now or timezone.now()
    seq = ready_seq(now)
    with transaction.atomic(using=using):
        due = list(
            Job.objects.using(using)
            .select_for_update()
            .filter(id__in=job_ids, state=JobState.DELAYED)
            .values_list("id", "queue")
        )
        moved = (
            Job.objects.using(using)
            .filter(id__in=[j for j, _ in due], state=JobState.DELAYED)
            .update(
                state=JobState.WAITING,
                available_at=now,
                seq=Case(When(seq__lt=0, then=Value(-seq)), default=Value(seq), output_field=BigIntegerField()),
            )
        )
        _job_events(using, [(q, j, "promoted", {"now": True}) for j, q in due], now)
        notify(using, sorted({q for _, q in due}))
    return moved


class RescuedJob(NamedTuple):
    id: uuid.UUID
    queue: str
    backend: str
    #: ``waiting`` (it runs again), ``failed`` (it stalled more than MAX_STALLED times) or
    #: ``cancelled`` (it was cancelled while it ran).
    state: str


def rescue_stalled_jobs(
    *, using: str, max_stalled: int, limit: int, backend: str | None = None, now: datetime | None = None
) -> list[RescuedJob]:
    """Handle active jobs whose lease expired (their worker died or hung).

    A job that stalled at most ``max_stalled`` times goes back to ``waiting`` (the interrupted
    attempt is not counted; ``stalled_count`` is); one that stalled more is ``failed`` with a
    ``JobStalled`` error; one cancelled while it ran becomes ``cancelled`` (it must not run
    again). Only jobs of ``backend`` when given. Returns the jobs it changed.
    """
    d = driver(using)
    now_sql, now_params = d.now(now)
    scope, scope_params = _backend_scope(backend)
    error = {
        "exception_class_path": "django_jobs.exceptions.JobStalled",
        "traceback": (
            "django_jobs.exceptions.JobStalled: the job's worker stopped renewing its lease "
            f"more than MAX_STALLED={max_stalled} time(s); it crashed, was killed, or blocked "
            "the process for longer than LEASE_SECONDS.\n"
        ),
    }
    cancel = "(cancel_requested_at IS NOT NULL)"
    fail = f"(stalled_count + 1 > {int(max_stalled)})"
    end = f"({cancel} OR {fail})"
    # "fail" counts this stall on top of the stalled_count before it. Ordered so that no
    # assignment reads a column assigned before it (MySQL assigns left to right): stalled_count
    # last, attempts after started_at.
    set_sql = (
        f"state = CASE WHEN {cancel} THEN 'cancelled' WHEN {fail} THEN 'failed' ELSE 'waiting' END, "
        f"started_at = CASE WHEN {end} OR attempts > 1 THEN started_at ELSE NULL END, "
        f"attempts = CASE WHEN {end} THEN attempts ELSE attempts - 1 END, "
        f"worker_ids = CASE WHEN {end} THEN worker_ids ELSE {d.json_pop('worker_ids')} END, "
        f"errors = CASE WHEN {fail} AND NOT {cancel} THEN {d.json_append('errors', d.cast('%s', 'jsonb'))} "
        f"ELSE errors END, "
        f"finished_at = CASE WHEN {end} THEN {now_sql} ELSE NULL END, "
        f"lease_token = NULL, lease_expires_at = NULL, stalled_count = stalled_count + 1"
    )
    where = (
        d.id_in(
            f"SELECT id FROM {JOB_TABLE} WHERE state = 'active' AND lease_expires_at < {now_sql}{scope} "
            f"ORDER BY lease_expires_at LIMIT %s {d.skip_locked()}"
        )
        + f" AND state = 'active' AND lease_expires_at < {now_sql}"
    )
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        returned = d.update_returning(
            cursor, JOB_TABLE, set_sql, [json.dumps(error), *now_params],
            where, [*now_params, *scope_params, limit, *now_params], "id, queue, backend, state, parent_id",
        )  # fmt: skip
        rows = [RescuedJob(d.to_uuid(r[0]), r[1], r[2], r[3]) for r in returned]
        write_events(
            cursor,
            d,
            [(r.queue, r.id, "stalled", {}) for r in rows]
            + [(r.queue, r.id, "rescued", {}) for r in rows if r.state == JobState.WAITING],
            now,
        )
        _finished_elsewhere(cursor, d, [r.id for r in rows if r.state in FINISHED_STATES], "finished", now)
        # Children of flows that ended here move their parents on, in the same transaction.
        settle_dependencies(
            using=using,
            finished=[
                (d.to_uuid(r[0]), r[3], error if r[3] == JobState.FAILED else _cancelled_error(d.to_uuid(r[0])))
                for r in returned
                if r[4] is not None and r[3] in FINISHED_STATES
            ],
            now=now,
        )
    for r in rows:
        logger.warning("Rescued stalled job %s (lease expired): now %s.", r.id, r.state)
    notify(using, sorted({r.queue for r in rows if r.state == JobState.WAITING}))
    return rows

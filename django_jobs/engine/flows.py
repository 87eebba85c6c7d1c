"""Flows: a parent and its children inserted together, the settling of a parent when its
children finish, and the cancelling of a subtree."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from ..drivers import driver
from ..models import DependencyStatus, Job, JobDependency
from ..spec.encryption import SHOWN, decrypt_errors, decrypt_json, is_encrypted
from ..spec.newjob import NewJob
from ..states import JobState
from .common import JOB_TABLE, _cancelled_error, ready_seq
from .effects import _enqueued_data, _finished_elsewhere, _job_events, _notify_cancel, notify, write_events
from .insert import _new_job
from .partitions import _admit, _unblock_heads

# -- flows ----------------------------------------------------------------------------------


@dataclass(slots=True)
class FlowJob:
    """One job of a flow, validated by the caller; :func:`insert_flow` stores a list of them."""

    id: uuid.UUID
    #: The job itself, as any enqueue asks for one.
    job: NewJob
    #: Its parent in the flow (None for the root), and what its failure does to that parent.
    parent_id: uuid.UUID | None
    failure_policy: str
    #: How many children it waits for (0: a leaf, ready at once).
    children: int


class FlowParentNotWaiting(Exception):  # noqa: N818 - translated to InvalidFlow by the caller
    def __init__(self, state: str | None, backend: str | None = None):
        self.state = state
        self.backend = backend


def insert_flow(
    *,
    using: str,
    jobs: list[FlowJob],
    attach_to: uuid.UUID | None = None,
    backend: str | None = None,
    now: datetime | None = None,
) -> list[Job]:
    """Insert a flow's jobs (parents listed before their children) in the caller's transaction.

    A job with children starts ``waiting-children`` with ``pending_children`` set; a leaf is
    waiting (or delayed until its ``run_after``). One ``JobDependency`` row per edge. With
    ``attach_to``, the first job (the flow's root) becomes one more child of that existing job,
    which must still be waiting for its children: the guarded increment of its
    ``pending_children`` locks its row, so a last child finishing at the same moment either
    released it first (and this raises FlowParentNotWaiting) or waits for this transaction.

    ``now``: None is this process's clock for the states and ``seq`` (the claim order, as for
    :func:`insert_job`), and for ``enqueued_at`` the database clock on PostgreSQL (the
    transaction's start, the clock of ``started_at`` and ``finished_at``), read once.
    """
    d = driver(using)
    enqueued_at = now
    now = now or timezone.now()
    with transaction.atomic(using=using):
        if enqueued_at is None and d.DATABASE_CLOCK:
            with connections[using].cursor() as cursor:
                enqueued_at = d.transaction_now(cursor)
        if attach_to is not None:
            parent = Job.objects.using(using).filter(id=attach_to, state=JobState.WAITING_CHILDREN)
            if backend is not None:
                parent = parent.filter(backend=backend)  # one flow, one backend
            attached = parent.update(pending_children=F("pending_children") + 1)
            if not attached:
                found = Job.objects.using(using).filter(id=attach_to).values_list("state", "backend").first()
                raise FlowParentNotWaiting(*(found or (None, None)))
            jobs[0].parent_id = attach_to
        rows = []
        for fj in jobs:
            job = _new_job(fj.job, now=now, enqueued_at=enqueued_at)
            job.id, job.parent_id, job.pending_children = fj.id, fj.parent_id, fj.children
            if fj.children:  # a parent waits for its children, even with a run_after ahead
                job.state = JobState.WAITING_CHILDREN
            rows.append(job)
        adding: dict[str, dict[str | None, int]] = {}
        for job in rows:
            per_queue = adding.setdefault(job.queue, {})
            per_queue[job.partition_key] = per_queue.get(job.partition_key, 0) + 1
        with connections[using].cursor() as cursor:
            for queue in sorted(adding):  # one lock order, so two flows cannot deadlock on them
                _admit(cursor, driver(using), queue, adding[queue])
            Job.objects.using(using).bulk_create(rows)
            write_events(cursor, driver(using), [(j.queue, j.id, "enqueued", _enqueued_data(j)) for j in rows], now)
            _unblock_heads(cursor, driver(using), {(j.queue, j.partition_key) for j in rows if j.partition_key})
        edges = [
            JobDependency(
                parent_id=fj.parent_id, child_id=fj.id, child_queue=fj.job.queue, failure_policy=fj.failure_policy
            )
            for fj in jobs
            if fj.parent_id is not None
        ]
        JobDependency.objects.using(using).bulk_create(edges)
    notify(using, sorted({j.queue for j in rows if j.state == JobState.WAITING}))
    return rows


def settle_dependencies(*, using: str, finished: list[tuple[uuid.UUID, str, Any]], now: datetime | None = None) -> None:
    """Children of flows reached a final state: record it on their dependency rows and move
    their parents on. Call inside the transaction that wrote the final states.

    ``finished``: ``(child id, state, value)`` with state ``completed`` (value: its return value
    as JSON text) or ``failed``/``cancelled`` (value: the error dict). Each edge is updated once,
    guarded on ``pending``; the parent's row is updated in one statement under its row lock, so
    the last two children finishing at once release it exactly once. A parent failed by its
    child (policy ``fail``) settles its own parent in turn.
    """
    d = driver(using)
    now = now or timezone.now()
    dep_table = JobDependency._meta.db_table
    seq_now = ready_seq(now)
    released: set[str] = set()
    # Children in id order, so concurrent settlers meet their edges (and mostly their parents) in
    # one order; a deadlock that remains is retried by the caller like any transient error.
    work = sorted(finished, key=lambda f: str(f[0]), reverse=True)
    with connections[using].cursor() as cursor:
        while work:
            child_id, state, value = work.pop()
            ok = state == JobState.COMPLETED
            value_json = value if ok else json.dumps(value)
            edges = d.update_returning(
                cursor, dep_table,
                f"status = CASE WHEN %s = 1 THEN 'processed' WHEN failure_policy = 'ignore' THEN 'ignored' "
                f"WHEN failure_policy = 'remove' THEN 'removed' ELSE 'failed' END, "
                f"value = {d.cast('%s', 'jsonb')}, finished_at = %s",
                [1 if ok else 0, value_json, d.dt(now)],
                "child_id = %s AND status = 'pending'", [d.uuid(child_id)],
                "parent_id, failure_policy, status",
            )  # fmt: skip
            edge = edges[0] if edges else None
            if edge is None:
                continue  # not a flow child, or settled already
            parent_id, policy, status = d.to_uuid(edge[0]), edge[1], edge[2]
            decrement = "pending_children = CASE WHEN pending_children > 0 THEN pending_children - 1 ELSE 0 END"
            if status == "failed" and policy == "fail":
                error = {
                    "exception_class_path": "django_jobs.exceptions.ChildFailed",
                    "traceback": f"django_jobs.exceptions.ChildFailed: child job {child_id} ended {state}; "
                    f"the parent fails with it (failure_policy='fail').\n\n"
                    f"The child's error:\n{_child_traceback(value)}",
                    "child_id": str(child_id),
                    "at": now.isoformat(),
                }
                failed = d.update_returning(
                    cursor, JOB_TABLE,
                    f"{decrement}, state = 'failed', finished_at = %s, "
                    f"errors = {d.json_append('errors', d.cast('%s', 'jsonb'))}",
                    [d.dt(now), json.dumps(error)],
                    "id = %s AND state = 'waiting-children'", [d.uuid(parent_id)],
                    "id",
                )  # fmt: skip
                if failed:
                    work.append((parent_id, JobState.FAILED, error))
                    _finished_elsewhere(cursor, d, [parent_id], "failed", now)
                else:
                    cursor.execute(f"UPDATE {JOB_TABLE} SET {decrement} WHERE id = %s", [d.uuid(parent_id)])
                continue
            # Released when the last child is done, or at once by a failure under "continue".
            release = "(state = 'waiting-children' AND (pending_children <= 1 OR %s = 1))"
            early = 1 if status == "failed" and policy == "continue" else 0
            # Its state before (row-locked, as the UPDATE would): only a release writes an event.
            cursor.execute(f"SELECT state FROM {JOB_TABLE} WHERE id = %s {d.for_update()}", [d.uuid(parent_id)])
            before = cursor.fetchone()
            rows = d.update_returning(
                cursor, JOB_TABLE,
                # A parent with a run_after still ahead is released to delayed, keeping its time
                # (and the seq it got for it); otherwise it is ready now.
                f"available_at = CASE WHEN {release} AND available_at < %s THEN %s ELSE available_at END, "
                f"seq = CASE WHEN {release} AND available_at <= %s THEN (CASE WHEN seq < 0 THEN %s ELSE %s END) "
                f"ELSE seq END, "
                f"state = CASE WHEN {release} THEN (CASE WHEN available_at > %s THEN 'delayed' ELSE 'waiting' END) "
                f"ELSE state END, {decrement}",
                [early, d.dt(now), d.dt(now), early, d.dt(now), -seq_now, seq_now, early, d.dt(now)],
                "id = %s", [d.uuid(parent_id)],
                "state, queue, pending_children",
            )  # fmt: skip
            row = rows[0] if rows else None
            was_held = before is not None and before[0] == JobState.WAITING_CHILDREN
            if row is not None and was_held and row[0] in (JobState.WAITING, JobState.DELAYED):
                write_events(cursor, d, [(row[1], parent_id, "promoted", {"from": "waiting-children"})], now)
            if row is not None and was_held and row[0] == JobState.WAITING:
                released.add(row[1])
    if released:
        notify(using, sorted(released))


def children_values(*, using: str, parent_id: uuid.UUID) -> dict[str, dict[str, Any]]:
    """``{"results": {child id: return value}, "failures": {child id: error}}`` of a parent's
    finished children (failures: those ignored or, under ``continue``, failed; a ``remove``d
    dependency is not reported)."""
    out: dict[str, dict[str, Any]] = {"results": {}, "failures": {}}
    rows = (
        JobDependency.objects.using(using)
        .filter(parent_id=parent_id)
        .exclude(status__in=[DependencyStatus.PENDING, DependencyStatus.REMOVED])
    )
    for child_id, status, value in rows.order_by("finished_at", "id").values_list("child_id", "status", "value"):
        key = "results" if status == DependencyStatus.PROCESSED else "failures"
        # An encrypted child's return value (or traceback) was copied here as stored.
        if is_encrypted(value):
            value = decrypt_json(value)
        elif isinstance(value, dict) and is_encrypted(value.get("traceback")):
            value = decrypt_errors([value])[0]
        out[key][str(child_id)] = value
    return out


def _child_traceback(error: Any) -> str:
    """A failed child's traceback, for the error of the parent it fails; an encrypted child's is
    not copied (the parent may not be encrypted)."""
    traceback = (error or {}).get("traceback", "")
    return SHOWN if is_encrypted(traceback) else traceback


def cancel_descendants(
    *, using: str, parent_ids: list[uuid.UUID], now: datetime | None = None
) -> list[tuple[uuid.UUID, str]]:
    """Cancel the unfinished children of cancelled parents, all the way down: waiting, delayed
    and waiting-children ones at once (their dependency rows settled like any cancelled child's),
    running ones flagged (their workers are told). Returns ``(id, queue)`` of those cancelled at
    once. Call inside a transaction."""
    now = now or timezone.now()
    done: list[tuple[uuid.UUID, str]] = []
    frontier = list(parent_ids)
    unfinished = [JobState.WAITING, JobState.DELAYED, JobState.WAITING_CHILDREN]
    while frontier:
        children = Job.objects.using(using).filter(parent_id__in=frontier)
        # Lock in id order: two cascades (or a cascade and a worker) meet the rows in one order.
        candidates = list(children.filter(state__in=unfinished).order_by("id").values_list("id", "queue"))
        cancelled = []
        for job_id, queue in candidates:
            if (
                Job.objects.using(using)
                .filter(id=job_id, state__in=unfinished)
                .update(state=JobState.CANCELLED, finished_at=now, cancel_requested_at=now)
            ):
                cancelled.append((job_id, queue))
        with connections[using].cursor() as cursor:
            _finished_elsewhere(cursor, driver(using), [j for j, _ in cancelled], "cancelled", now)
        settle_dependencies(
            using=using, finished=[(j, JobState.CANCELLED, _cancelled_error(j)) for j, _ in cancelled], now=now
        )
        running = list(
            children.filter(state=JobState.ACTIVE, cancel_requested_at__isnull=True).values_list("id", flat=True)
        )
        if running:
            flagged = list(
                Job.objects.using(using)
                .select_for_update()
                .filter(id__in=running, state=JobState.ACTIVE, cancel_requested_at__isnull=True)
                .values_list("id", "queue")
            )
            Job.objects.using(using).filter(id__in=[j for j, _ in flagged]).update(cancel_requested_at=now)
            _job_events(using, [(q, j, "cancel-requested", {}) for j, q in flagged], now)
            _notify_cancel(using, running)
        done += cancelled
        # Running children that were released early (failure_policy "continue") have children too.
        frontier = [j for j, _ in cancelled] + running
    return done

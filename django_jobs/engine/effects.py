"""What follows an insert or a finish: NOTIFY wake-ups (sent once per queue and transaction) and the
event log's rows, written in the same transaction as the change they record."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from ..conf import get_settings
from ..drivers import Driver, driver
from ..models import Job
from ..spec import retention
from ..states import JobState
from .common import (
    CANCEL_PREFIX,
    JOB_TABLE,
    NewRow,
    Outcome,
    events_channel,
    events_enabled,
)


def _first_notify_in_transaction(conn: Any, queue: str) -> bool:
    """True when a NOTIFY for ``queue`` should ride on this statement: always in autocommit,
    once per queue inside a transaction (PostgreSQL delivers them on commit)."""
    if not conn.in_atomic_block or conn.savepoint_ids:
        # Inside a savepoint the NOTIFY may be rolled back with it: always send, never remember.
        return True
    sent = _sent_in_transaction(conn)
    if queue in sent:
        return False
    sent.add(queue)
    return True


def notify(using: str, queues: list[str]) -> None:
    """Wake listening workers (PostgreSQL). Inside a transaction the notification is delivered
    on commit, and PostgreSQL folds identical notifications of one transaction into one; we
    also send each queue at most once per transaction to save the round trips."""
    d = driver(using)
    if not d.LISTEN_NOTIFY or not queues:
        return
    conn = d.connection
    if conn.in_atomic_block and not conn.savepoint_ids:
        sent = _sent_in_transaction(conn)
        queues = [q for q in queues if q not in sent]
        if not queues:
            return
        sent.update(queues)
    with conn.cursor() as cursor:
        d.notify(cursor, get_settings().NOTIFY_CHANNEL, sorted(set(queues)))


def _sent_in_transaction(conn: Any) -> set[str]:
    """The set of queues already notified in the current outermost transaction."""
    marker = getattr(conn, "_django_jobs_notified", None)
    # The transaction is identified by the on_commit list object's first callback we register.
    if marker is None or not any(func is marker[1] for _, func, _ in conn.run_on_commit):
        sent: set[str] = set()

        def forget() -> None:
            conn._django_jobs_notified = None

        marker = (sent, forget)
        conn._django_jobs_notified = marker
        transaction.on_commit(forget, using=conn.alias)
    return marker[0]


# -- events ---------------------------------------------------------------------------------


def write_events(
    cursor: Any,
    d: Driver,
    events: list[tuple[str, uuid.UUID | None, str, dict[str, Any]]],
    now: datetime | None = None,
) -> None:
    """Write ``(queue, job id, kind, data)`` events in the caller's transaction (call it inside
    the transaction that made the change); on PostgreSQL also NOTIFY the events channel."""
    if not events or not events_enabled():
        return
    d.append_events(cursor, events, now or timezone.now(), events_channel())


def _job_events(
    using: str, rows: list[tuple[str, uuid.UUID, str, dict[str, Any]]], now: datetime | None = None
) -> None:
    """:func:`write_events` on a new cursor of ``using`` (in the caller's transaction)."""
    if rows and events_enabled():
        with connections[using].cursor() as cursor:
            write_events(cursor, driver(using), rows, now)


def _enqueued_data(job: Job | NewRow) -> dict[str, Any]:
    return {"task": job.task_path, "state": job.state}


def _enqueued_event(cursor: Any, d: Driver, job: Job | NewRow) -> None:
    """The ``enqueued`` event of a job just inserted, where the INSERT did not write it."""
    if not d.FUSED_EFFECTS:
        write_events(cursor, d, [(job.queue, job.id, "enqueued", _enqueued_data(job))])


def _finished_elsewhere(cursor: Any, d: Driver, job_ids: list[uuid.UUID], kind: str, now: datetime | None) -> None:
    """Jobs that just finished outside an outcome batch (cancel, rescue, a flow parent failed by
    its child): their event, and ``purge_at`` from their retention policy. In the caller's
    transaction; jobs not in a finished state are left alone."""
    if not job_ids:
        return
    when = now or timezone.now()
    in_sql, in_params = d.in_list("id", [d.uuid(j) for j in job_ids])
    cursor.execute(
        f"SELECT id, queue, state, options FROM {JOB_TABLE} WHERE {in_sql} AND state IN ('completed', 'failed', "
        f"'cancelled')",
        in_params,
    )
    rows = cursor.fetchall()
    by_purge: dict[datetime | None, list[Any]] = {}
    events = []
    for jid, queue, state, options in rows:
        task_retention = (d.to_json(options) or {}).get("retention")
        purge = retention.purge_at(state, when, queue=queue, task_retention=task_retention)
        by_purge.setdefault(purge, []).append(jid)
        events.append((queue, d.to_uuid(jid), kind if kind != "finished" else state, {}))
    for purge, ids in by_purge.items():
        if purge is not None:
            sql, params = d.in_list("id", ids)
            cursor.execute(f"UPDATE {JOB_TABLE} SET purge_at = %s WHERE {sql}", [d.dt(purge), *params])
    write_events(cursor, d, events, now)


def _outcome_events_and_metrics(
    cursor: Any, d: Driver, rows: list[tuple[Any, ...]], by_id: dict[uuid.UUID, Outcome], now: datetime
) -> None:
    """The events and Metric counts of written outcomes, where the outcome statement did not
    write them itself. ``rows``: id, queue, state, parent, partition, attempts, last start."""
    events = []
    metrics: dict[str, list[int]] = {}
    for jid, queue, state, _parent, _partition, attempts, started, _finished in rows:
        o = by_id[d.to_uuid(jid)]
        if o.runtime_ms is not None:
            runtime = o.runtime_ms
        else:
            runtime = round((now - d.to_dt(started)).total_seconds() * 1000) if started is not None else 0
        counts = metrics.setdefault(queue, [0, 0, 0, 0])
        if state in (JobState.WAITING, JobState.DELAYED):
            kind = "snoozed" if o.uncount_attempt else "retried"
            counts[2] += 0 if o.uncount_attempt else 1
        else:
            kind = state
            if state in (JobState.COMPLETED, JobState.FAILED):
                counts[0 if state == JobState.COMPLETED else 1] += 1
                counts[3] += runtime
        data: dict[str, Any] = {"attempt": attempts, "runtime_ms": runtime}
        if o.error is not None:
            data["error"] = o.error.get("exception_class_path")
        events.append((queue, o.job_id, kind, data))
    write_events(cursor, d, events, now)
    d.add_metrics(cursor, now.replace(second=0, microsecond=0), metrics)


def _notify_cancel(using: str, job_ids: list[uuid.UUID]) -> None:
    """Tell the workers running these jobs that they were cancelled (where workers listen;
    elsewhere they poll)."""
    d = driver(using)
    if not d.LISTEN_NOTIFY or not job_ids:
        return
    with d.connection.cursor() as cursor:
        d.notify(cursor, get_settings().NOTIFY_CHANNEL, [f"{CANCEL_PREFIX}{job_id}" for job_id in job_ids])

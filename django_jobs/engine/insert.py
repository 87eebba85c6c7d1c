"""Inserting jobs: one job (``insert_new_job``, in the caller's transaction) and many
(``insert_jobs``, constant-shape JSON-array statements in chunks)."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.utils import timezone

from ..conf import get_settings
from ..db import Dialect, hot_cursor
from ..models import Job
from ..states import JobState
from ..tracing import trace_id_for_new_job
from ..uuid7 import uuid7, uuid7_many
from .common import (
    EVENT_TABLE,
    INSERT_CHUNK,
    JOB_TABLE,
    QUEUE_TABLE,
    NewJob,
    _mark_saved,
    _sqlite_atomic,
    events_channel,
    events_enabled,
    ready_seq,
)
from .effects import (
    _EVENT_COLUMNS,
    _TXID,
    _enqueued_event_sqlite,
    _first_notify_in_transaction,
    _pg_event_cte,
    _pg_event_notify,
    _sent_in_transaction,
)
from .partitions import _SIZE_LIMITED, _admit, _unblock_heads


def insert_job(*, using: str, **fields: Any) -> Job:
    """Insert one job in the caller's transaction, as :func:`insert_new_job` (same arguments),
    and return it as a saved ``Job``."""
    job = _as_job(insert_new_job(using=using, **fields))
    _mark_saved(job, using)
    return job


def insert_new_job(
    *,
    using: str,
    backend: str,
    task_path: str,
    queue: str,
    priority: int,
    args: list[Any],
    kwargs: dict[str, Any],
    max_attempts: int,
    options: dict[str, Any],
    run_after: datetime | None = None,
    lifo: bool = False,
    trace_id: str | None = None,
    partition: str | None = None,
    now: datetime | None = None,
) -> NewJob:
    """Insert one job in the caller's transaction (waiting, or delayed until ``run_after``);
    return the row written as a :class:`NewJob` (``JobsBackend.enqueue`` reads a few of its
    values; building a ``Job`` cost more than that: :func:`insert_job` returns one).

    ``lifo``: the job is claimed before the FIFO jobs of its priority, newest first
    (see :func:`ready_seq`). ``trace_id``: the job's pipeline; ``None``: the running job's, or a
    new one (:func:`django_jobs.tracing.trace_id_for_new_job`). ``partition``: the job runs
    after the earlier jobs of its (queue, partition) finished. Raises QueueFull when the queue
    (or partition) has a size limit the job would pass; nothing is inserted then.

    ``enqueued_at`` is ``now`` when given, else the database clock on PostgreSQL (the clock of
    ``started_at`` and ``finished_at``), read back by the INSERT itself; this process's on SQLite.
    """
    d = Dialect(using)
    job = _new_row(
        backend=backend,
        task_path=task_path,
        queue=queue,
        priority=priority,
        args=args,
        kwargs=kwargs,
        max_attempts=max_attempts,
        options=options,
        run_after=run_after,
        lifo=lifo,
        trace_id=trace_id,
        partition=partition,
        now=now,
        database_clock=d.pg,
    )
    conn = d.connection
    wake = job.state == JobState.WAITING and d.pg and _first_notify_in_transaction(conn, job.queue)
    with _sqlite_atomic(d), hot_cursor(using) as cursor:
        # The common case in one statement: the INSERT carries its own "the queue has no size
        # limit" guard (a primary-key probe), so an unlimited queue pays no extra round trip.
        cursor.execute(*_insert_statement(d, job, wake=wake, guarded=True))
        if cursor.rowcount == 1:
            if d.pg:
                _set_enqueued_at(d, job, cursor.fetchone()[0])
            _enqueued_event_sqlite(cursor, d, job)
            if job.partition_key is not None:
                _unblock_heads(cursor, d, {(job.queue, job.partition_key)})
            return job
        if wake and conn.in_atomic_block and not conn.savepoint_ids:
            _sent_in_transaction(conn).discard(job.queue)  # that NOTIFY went with no row
        with transaction.atomic(using=using):
            _insert_new(cursor, d, using, job, wake=True)
    return job


def _new_job(**fields: Any) -> Job:
    """The unsaved ``Job`` of a new job: :func:`_new_row`'s arguments, its row."""
    return _as_job(_new_row(**fields))


def _new_row(
    *,
    backend: str,
    task_path: str,
    queue: str,
    priority: int,
    args: list[Any],
    kwargs: dict[str, Any],
    max_attempts: int,
    options: dict[str, Any],
    run_after: datetime | None,
    lifo: bool,
    now: datetime | None,
    trace_id: str | None = None,
    dedup_key: str | None = None,
    idempotency_key: str | None = None,
    enqueued_at: datetime | None = None,
    partition: str | None = None,
    database_clock: bool = False,
) -> NewJob:
    """The row of a new job: waiting, or delayed until ``run_after`` when that is after
    ``now``; ``enqueued_at`` defaults to ``now``.

    ``database_clock`` (PostgreSQL): when neither ``enqueued_at`` nor ``now`` is given, leave
    ``enqueued_at`` None for the INSERT to stamp with the database's ``now()`` and read back
    (:func:`_insert_sql`). That is the clock claims and outcomes stamp ``started_at`` and
    ``finished_at`` with, and, being the transaction's start, it keeps a job enqueued and run in
    one transaction (a test) from starting before it was enqueued. The state and ``seq`` still
    come from this process's clock: a FIFO or LIFO order needs distinct times within one
    transaction, which ``now()`` is not.
    """
    given = enqueued_at or now
    now = now or timezone.now()
    delayed = run_after is not None and run_after > now
    available_at = run_after if delayed else now
    return NewJob(
        id=uuid7(),
        backend=backend,
        queue=queue,
        task_path=task_path,
        args=args,
        kwargs=kwargs,
        state=JobState.DELAYED if delayed else JobState.WAITING,
        priority=priority,
        available_at=available_at,
        options=options,
        max_attempts=max_attempts,
        enqueued_at=given if given is not None or database_clock else now,
        seq=ready_seq(available_at, lifo),
        trace_id=trace_id_for_new_job(trace_id),
        dedup_key=dedup_key,
        idempotency_key=idempotency_key,
        partition_key=partition,
        # Blocked until _unblock_heads finds it is its partition's next job (right after insert).
        blocked=partition is not None,
    )


def _as_job(row: NewJob) -> Job:
    """The unsaved ``Job`` of ``row``; its other fields get their defaults."""
    # Positional, in field order: Django's fast path of Model.__init__, which skips matching
    # keywords to fields and a get_default() call per field (most of the cost of Job(**row)).
    return Job(
        *[
            getattr(row, name) if in_row else default() if per_job else default
            for name, in_row, default, per_job in _job_fields()
        ]
    )


@functools.cache
def _job_fields() -> tuple[tuple[str, bool, Any, bool], ...]:
    """Job's concrete fields in the order ``Job(*values)`` takes them: each one's attname,
    whether a :class:`NewJob` has it, its default, and whether that is a function to call for
    every job, as Django calls it (a callable default such as ``list``, so no two jobs share a
    list). A constant default (None, 0, a string, a bool) is read once."""
    in_row = set(NewJob.__slots__)
    found = []
    for f in Job._meta.concrete_fields:
        value = f.get_default()
        if (f.has_default() and callable(f.default)) or not isinstance(value, (type(None), bool, int, str)):
            found.append((f.attname, f.attname in in_row, f.get_default, True))
        else:
            found.append((f.attname, f.attname in in_row, value, False))
    return tuple(found)


def _json(value: Any) -> str:
    """``json.dumps(value)``; an empty list or dict (most jobs' args or kwargs, and options)
    without running the encoder."""
    if not value and type(value) in (list, dict):
        return "[]" if type(value) is list else "{}"
    return json.dumps(value)


def _insert_params(d: Dialect, job: Job | NewJob) -> list[Any]:
    """The parameters of :func:`_insert_sql` for ``job``, in its column order."""
    return [
        d.uuid(job.id),
        job.backend,
        job.queue,
        job.task_path,
        _json(job.args),
        _json(job.kwargs),
        job.state,
        job.priority,
        d.dt(job.available_at),
        _json(job.options),
        job.max_attempts,
        d.dt(job.enqueued_at),
        job.seq,
        job.trace_id,
        job.dedup_key,
        job.idempotency_key,
        job.partition_key,
        job.blocked,
    ]


def _set_enqueued_at(d: Dialect, job: Job | NewJob, value: Any) -> None:
    """``job.enqueued_at`` as its INSERT stored it (PostgreSQL: possibly the database clock)."""
    job.enqueued_at = d.to_dt(value)


_INSERT_COLUMNS = (
    "id, backend, queue, task_path, args, kwargs, state, priority, available_at, options, max_attempts, "
    "enqueued_at, attempts, stalled_count, pending_children, errors, worker_ids, seq"
)


@functools.cache
def _insert_sql(pg: bool, notify: bool, once: bool = False, guarded: bool = False, events: bool = False) -> str:
    """The INSERT of :func:`insert_job`, built once per vendor: enqueue is a hot path and
    compiling Django's 32-column insert costs more than the database's work.

    ``once``: the idempotency-key insert (:func:`insert_job_once`): nothing is inserted when the
    queue has a job with that key, and the new id is returned when one is.
    ``guarded``: nothing is inserted when the queue has a size limit (one more parameter, the
    queue's name, after the row's): the caller then admits the job under the queue's lock.
    ``events`` (PostgreSQL): the row's ``enqueued`` event and the events NOTIFY ride on it (one
    more parameter, the events channel, last); SQLite callers write it with a second statement.

    ``enqueued_at`` NULL (PostgreSQL) means the database clock, ``now()``: the clock of the
    claims' ``started_at`` and the outcomes' ``finished_at``, and like theirs the transaction's
    start, so a job enqueued and run in one transaction has ``enqueued_at <= started_at``. The
    stored value comes back in the statement's result, no extra round trip: on PostgreSQL its
    first column (second with ``once``, after the id), on SQLite only with ``once`` (its
    callers give the time themselves).
    """

    def cast(t: str) -> str:
        return f"%s::{t}" if pg else "%s"

    enqueued = "COALESCE(%s::timestamptz, now())" if pg else "%s"
    values = ", ".join(
        [cast("uuid"), "%s", "%s", "%s", cast("jsonb"), cast("jsonb"), "%s", "%s", cast("timestamptz"),
         cast("jsonb"), "%s", enqueued, "0", "0", "0", "'[]'", "'[]'", "%s", "%s", "%s", "%s", "%s", "%s"]
    )  # fmt: skip
    columns = f"{_INSERT_COLUMNS}, trace_id, dedup_key, idempotency_key, partition_key, blocked"
    if guarded:
        unlimited = f"NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} WHERE name = %s AND {_SIZE_LIMITED})"
        sql = f"INSERT INTO {JOB_TABLE} ({columns}) SELECT {values} WHERE {unlimited}"
    else:
        sql = f"INSERT INTO {JOB_TABLE} ({columns}) VALUES ({values})"
    if once:
        # The conflict target names the partial unique index django_jobs_idempotency_key, WHERE
        # included (both vendors need it to infer a partial index).
        sql += " ON CONFLICT (backend, queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
    if events and pg:
        # The row, its "enqueued" event and the NOTIFYs in one statement: one round trip.
        data = "jsonb_build_object('task', new_job.task_path, 'state', new_job.state)"
        selected = ["new_job.id"] if once else []
        selected.append("new_job.enqueued_at")
        if notify:
            selected.append("pg_notify(%s, new_job.queue)")
        return (
            f"WITH new_job AS ({sql} RETURNING id, queue, task_path, state, enqueued_at), "
            f"{_pg_event_cte('new_job', "'enqueued'", data)} "
            f"SELECT {', '.join(selected)} FROM new_job, {_pg_event_notify('new_job')}"
        )
    if once:
        if notify:  # NOTIFY only when a row was inserted
            return (
                f"WITH new_job AS ({sql} RETURNING id, queue, enqueued_at) "
                "SELECT id, enqueued_at, pg_notify(%s, queue) FROM new_job"
            )
        return f"{sql} RETURNING id, enqueued_at"
    if notify:
        # The INSERT and its NOTIFY in one statement: enqueue is a hot path and a separate
        # SELECT pg_notify would cost a round trip. Delivered on commit, like any NOTIFY.
        return f"WITH new_job AS ({sql} RETURNING queue, enqueued_at) SELECT enqueued_at, pg_notify(%s, queue) FROM new_job"
    return f"{sql} RETURNING enqueued_at" if pg else sql


_MANY_ROW_PARAMS = 4  # id, args, kwargs, seq: what differs between the jobs of one batch
_MANY_SHARED_PARAMS = 12  # the rest, bound once per statement


def _insert_many_sql(pg: bool, n: int, events: bool = False) -> str:
    """A multi-row INSERT of ``n`` jobs of one task (no NOTIFY: the caller sends one per batch).

    Only what differs between the jobs is a VALUES row; the columns they share are bound once
    and repeated by the SELECT. psycopg (client-side binding, Django's default) scans every
    placeholder of a statement this long on each execution, and with all 13 per row that scan
    cost more than the database's work: 4 per row tripled the rate on PostgreSQL (15,000 ->
    44,000 rows/s, 500-row statements) and gained a third on SQLite.

    ``enqueued_at`` as in :func:`_insert_sql`: NULL is the database clock on PostgreSQL, where
    the statement returns one row, the ``enqueued_at`` stored (the same for every row).
    """

    def cast(t: str) -> str:
        return f"%s::{t}" if pg else "%s"

    row = f"({cast('uuid')}, {cast('jsonb')}, {cast('jsonb')}, %s)"
    enqueued = "COALESCE(%s::timestamptz, now())" if pg else "%s"
    shared = ", ".join(
        ["v.id", "%s", "%s", "%s", "v.args", "v.kwargs", "%s", "%s", cast("timestamptz"), cast("jsonb"), "%s",
         enqueued, "0", "0", "0", "'[]'", "'[]'", "v.seq", "%s", "%s", "%s"]
    )  # fmt: skip
    # PostgreSQL with events: each row's "enqueued" event rides on the statement (two more
    # parameters after the rows: the queue and the event's data, the same for every row).
    event = (
        f", ev AS (INSERT INTO {EVENT_TABLE} ({_EVENT_COLUMNS}) SELECT {_TXID}, %s, v.id, 'enqueued', "
        f"%s::jsonb, clock_timestamp() FROM v)"
        if events and pg
        else ""
    )
    insert = f"INSERT INTO {JOB_TABLE} ({_INSERT_COLUMNS}, trace_id, partition_key, blocked) SELECT {shared} FROM v"
    if pg:
        # The rows are one parameter, a JSON array of [id, args, kwargs, seq] (see
        # _json_rows): the statement's text is the same for every chunk, so it is prepared
        # once per connection and psycopg does not scan 2,000 placeholders per chunk. One row
        # back, not one per job: every row has the same enqueued_at.
        return (
            f"WITH v(id, args, kwargs, seq) AS (SELECT (e->>0)::uuid, e->1, e->2, (e->>3)::bigint "
            f"FROM jsonb_array_elements(%s::jsonb) e){event}, "
            f"ins AS ({insert} RETURNING enqueued_at) SELECT enqueued_at FROM ins LIMIT 1"
        )
    return f"WITH v(id, args, kwargs, seq) AS (VALUES {', '.join([row] * n)}){event} {insert}"


# Full chunks are the common case, so only that size is kept; a cache keyed by every size a
# caller's last chunk happens to have would grow without bound.
_insert_chunk_sql = functools.cache(_insert_many_sql)


class InsertedJobs(NamedTuple):
    """What :func:`insert_jobs` inserted."""

    #: The new jobs' ids, in the order of the rows given.
    ids: list[uuid.UUID]
    #: The ``enqueued_at`` every one of them got (None when no row was given).
    enqueued_at: datetime | None


def _rows_per_statement(conn: Any) -> int:
    limit = conn.features.max_query_params  # None on PostgreSQL (65,535, far above a chunk)
    if limit is None:
        return INSERT_CHUNK
    return max(1, min(INSERT_CHUNK, (limit - _MANY_SHARED_PARAMS) // _MANY_ROW_PARAMS))


def insert_jobs(
    *,
    using: str,
    rows: list[tuple[str, str]],
    backend: str,
    task_path: str,
    queue: str,
    priority: int,
    max_attempts: int,
    options: dict[str, Any],
    run_after: datetime | None = None,
    lifo: bool = False,
    now: datetime | None = None,
    position: int = 0,
    trace_id: str | None = None,
    partition: str | None = None,
    database_clock: bool = False,
) -> InsertedJobs:
    """Insert jobs of one task in the caller's transaction, one multi-row INSERT per
    :data:`INSERT_CHUNK` rows; return their ids in the order of ``rows`` and the
    ``enqueued_at`` they all got.

    ``rows``: ``(args JSON, kwargs JSON)`` per job, already validated by the caller. Every job
    gets the state :func:`insert_job` would give it (delayed until ``run_after`` when that is
    after ``now``, else waiting), the same ``enqueued_at`` and the same ``options``.
    ``now``: None is this process's clock for the state and ``seq``, and for ``enqueued_at``
    the database clock on PostgreSQL (as :func:`insert_job`), read back by the INSERT.
    ``database_clock``: ``enqueued_at`` from the database clock on PostgreSQL even though
    ``now`` is given (``enqueue_many`` gives one ``now`` so its chunks agree on the state).
    ``position``: where ``rows[0]`` stands in the caller's whole batch. FIFO jobs of one batch
    share a seq and keep their order by id; LIFO jobs get ``seq - position`` so the last one
    given runs first, as if each were enqueued a microsecond after the one before it.
    ``trace_id``: shared by every job (``None``: the running job's, or a new one).
    ``partition``: shared by every job. Raises QueueFull (call inside a savepoint: nothing of
    the batch may stay) when the queue or partition has a size limit that ``position`` +
    ``len(rows)`` jobs would pass.

    Sends no NOTIFY: the caller wakes workers once per batch with :func:`notify`.
    """
    if not rows:
        return InsertedJobs([], None)
    d = Dialect(using)
    conn = connections[using]
    # None: the database clock, stamped by the INSERT.
    enqueued_at = None if d.pg and (now is None or database_clock) else now or timezone.now()
    now = now or enqueued_at or timezone.now()
    delayed = run_after is not None and run_after > now
    available_at = run_after if delayed else now
    state = JobState.DELAYED if delayed else JobState.WAITING
    seq = ready_seq(available_at, lifo)
    step = -1 if lifo else 0
    # In the order of the shared %s of _insert_many_sql's SELECT.
    shared = [
        backend,
        queue,
        task_path,
        state,
        priority,
        d.dt(available_at),
        json.dumps(options),
        max_attempts,
        d.dt(enqueued_at),
        trace_id_for_new_job(trace_id),
        partition,
        partition is not None,  # blocked: _unblock_heads frees the partition's next one below
    ]
    enqueued_slot = 8  # enqueued_at's place in shared
    ids = uuid7_many(len(rows))
    per_statement = _rows_per_statement(conn)
    events = events_enabled()
    event_data = json.dumps({"task": task_path, "state": state})
    with hot_cursor(using) as cursor:
        _admit(cursor, d, queue, {partition: len(rows)}, batch_before=position)
        for start, stop in _chunks(rows, per_statement, _CHUNK_JSON_CHARS if d.pg else None):
            part = rows[start:stop]
            params: list[Any] = []
            if d.pg:
                params.append(_json_rows(ids, part, start, seq, step * position, step))
            else:
                for i, (args_json, kwargs_json) in enumerate(part, start):
                    params += (d.uuid(ids[i]), args_json, kwargs_json, seq + step * (position + i))
            if events and d.pg:
                params += (queue, event_data)
            params += shared  # after the rows: the WITH comes first in the statement
            n = len(part)
            pg_events = events and d.pg
            if d.pg or n == INSERT_CHUNK:
                sql = _insert_chunk_sql(d.pg, INSERT_CHUNK if d.pg else n, pg_events)
            else:
                sql = _insert_many_sql(d.pg, n, pg_events)
            cursor.execute(sql, params)
            if d.pg:  # the statement returns the enqueued_at it stored; later chunks reuse it
                enqueued_at = d.to_dt(cursor.fetchone()[0])
                shared[enqueued_slot] = enqueued_at
            if events and not d.pg:
                values = ", ".join(["(%s)"] * n)
                cursor.execute(
                    f"WITH v(id) AS (VALUES {values}) INSERT INTO {EVENT_TABLE} ({_EVENT_COLUMNS}) "
                    f"SELECT 0, %s, v.id, 'enqueued', %s, %s FROM v",
                    [*(d.uuid(j) for j in ids[start : start + n]), queue, event_data, d.dt(now)],
                )
        if events and d.pg and position == 0:
            # One per batch: its later chunks commit in the same transaction.
            cursor.execute("SELECT pg_notify(%s, '')", [events_channel()])
        if partition is not None:
            _unblock_heads(cursor, d, {(queue, partition)})
    return InsertedJobs(ids, enqueued_at)


#: Most characters of JSON in one chunk of :func:`insert_jobs` on PostgreSQL, whose rows travel
#: as one jsonb value (at most 256 MiB): 500 jobs of a MAX_PAYLOAD_BYTES of 1 MiB would not fit.
#: 32 Mi characters are 128 MiB of UTF-8 at most.
_CHUNK_JSON_CHARS = 32 * 1024 * 1024


def _chunks(rows: list[tuple[str, str]], most: int, most_chars: int | None) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive chunks of ``rows``: at most ``most`` rows, and at most
    ``most_chars`` characters of JSON (a lone larger row still makes a chunk)."""
    start = 0
    while start < len(rows):
        stop, size = start, 0
        while stop < len(rows) and stop - start < most:
            size += len(rows[stop][0]) + len(rows[stop][1])
            if most_chars is not None and size > most_chars and stop > start:
                break
            stop += 1
        yield start, stop
        start = stop


def _json_rows(ids: list[uuid.UUID], part: list[tuple[str, str]], start: int, seq: int, offset: int, step: int) -> str:
    """The rows of one PostgreSQL chunk of :func:`insert_jobs` as one JSON array of
    ``[id, args, kwargs, seq]``. The args and kwargs are JSON the caller validated, spliced in
    as they are rather than parsed and dumped again."""
    return (
        "["
        + ",".join(
            f'["{ids[i]}",{args_json},{kwargs_json},{seq + offset + step * i}]'
            for i, (args_json, kwargs_json) in enumerate(part, start)
        )
        + "]"
    )


def _insert_new(cursor: Any, d: Dialect, using: str, job: Job | NewJob, *, wake: bool = False) -> None:
    """Insert ``job`` after :func:`_admit` let it in (call inside a transaction); with ``wake``,
    its NOTIFY rides on the INSERT as in :func:`insert_job`."""
    wake = wake and job.state == JobState.WAITING and d.pg and _first_notify_in_transaction(d.connection, job.queue)
    _admit(cursor, d, job.queue, {job.partition_key: 1})
    cursor.execute(*_insert_statement(d, job, wake=wake))
    if d.pg:
        _set_enqueued_at(d, job, cursor.fetchone()[0])
    _enqueued_event_sqlite(cursor, d, job)
    _mark_saved(job, using)
    if job.partition_key is not None:
        _unblock_heads(cursor, d, {(job.queue, job.partition_key)})


def _insert_statement(
    d: Dialect, job: Job | NewJob, *, wake: bool, once: bool = False, guarded: bool = False
) -> tuple[str, list[Any]]:
    """The INSERT of ``job`` and its parameters; with ``wake``, the NOTIFY rides on it."""
    params = _insert_params(d, job)
    if guarded:
        params.append(job.queue)
    if wake:
        params.append(get_settings().NOTIFY_CHANNEL)
    events = d.pg and events_enabled()
    if events:
        params.append(events_channel())
    return _insert_sql(d.pg, notify=wake, once=once, guarded=guarded, events=events), params

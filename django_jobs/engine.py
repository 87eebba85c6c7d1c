"""The only writer of job state.

Every transition lives here: insert, claim, record outcomes (complete / retry / fail), release,
renew leases, promote, rescue, and the worker-table bookkeeping. Admin actions, the worker, the
backend and the CLI call these functions; nothing else updates a job row.

Rules every function follows:

* Each state change is guarded on the state it expects (and, for active jobs, on the lease
  token). Zero rows updated means another actor won a race: we log it and move on.
* Time is a parameter: ``now=None`` means the database clock on PostgreSQL (leases must not
  depend on the clocks of many worker hosts) and this process's clock on SQLite (one host).
* The hot paths (claim, record outcomes) are single statements written in SQL, because they
  run thousands of times a second and one round trip beats three; the vendor spellings come
  from :class:`django_jobs.db.Dialect`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import random
import socket
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.db import InterfaceError, OperationalError, connections, models, transaction
from django.db.models import F
from django.utils import timezone

from .conf import get_settings
from .db import Dialect, hot_cursor, is_transient
from .exceptions import InvalidTaskOptions, JobsError, QueueFull
from .models import Event, Job, JobDependency, JobLog, JobStart, Metric, QueueState, Worker
from .models.dedup import JobDedup, JobDedupNext
from .states import FINISHED_STATES, UNFINISHED_STATES, JobState
from .tracing import trace_id_for_new_job
from .uuid7 import uuid7, uuid7_many

logger = logging.getLogger("django_jobs.engine")

JOB_TABLE = Job._meta.db_table
QUEUE_TABLE = QueueState._meta.db_table
START_TABLE = JobStart._meta.db_table
EVENT_TABLE = Event._meta.db_table
METRIC_TABLE = Metric._meta.db_table
#: The unfinished states as an SQL list, spelled as the condition of django_jobs_unfinished_idx
#: so the planner can use that index.
UNFINISHED_SQL = "(" + ", ".join(f"'{s}'" for s in UNFINISHED_STATES) + ")"

# Columns returned by a claim, in order; ClaimedJob mirrors them.
#: What a claim returns of each job: these columns, then its JSON columns as one JSON array
#: (:func:`_claim_payload`), so the worker decodes one string per job instead of five.
_CLAIM_COLUMNS = (
    "id",
    "backend",
    "queue",
    "task_path",
    "priority",
    "attempts",
    "max_attempts",
    "lease_token",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
    "available_at",
    "seq",
    "parent_id",
    "trace_id",
    "partition_key",
    "payload",
)
_CLAIM_JSON = ("args", "kwargs", "options", "errors", "worker_ids")


def _claim_payload(d: Dialect) -> str:
    if d.pg:
        return f"jsonb_build_array({', '.join(_CLAIM_JSON)})::text AS payload"
    return f"json_array({', '.join(f'json({c})' for c in _CLAIM_JSON)}) AS payload"


@dataclass(slots=True)
class ClaimedJob:
    """An active job as the worker sees it, straight from the claim statement."""

    id: uuid.UUID
    backend: str
    queue: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    attempts: int
    max_attempts: int
    options: dict[str, Any]
    lease_token: uuid.UUID
    enqueued_at: datetime
    started_at: datetime
    last_attempted_at: datetime
    available_at: datetime
    errors: list[dict[str, Any]]
    worker_ids: list[str]
    #: Claim order within a priority (negative: LIFO); see :func:`ready_seq`.
    seq: int = 0
    #: The job's parent in a flow (the flows feature fills it); None for a job on its own.
    parent_id: uuid.UUID | None = None
    #: The pipeline the job belongs to (``django_jobs.trace``); None only for rows from before
    #: trace ids were stored.
    trace_id: str | None = None
    #: ``.using(partition=...)``: the jobs of one (queue, partition) run one at a time, in order.
    partition_key: str | None = None


@dataclass(slots=True)
class Outcome:
    """What one attempt of a job came to; :func:`record_outcomes` writes a batch of them.

    ``state`` is the state the job moves to: ``completed``, ``failed``, ``waiting`` (retry now)
    or ``delayed`` (retry at ``available_at``).
    """

    job_id: uuid.UUID
    lease_token: uuid.UUID
    state: str
    return_value_json: str | None = None
    error: dict[str, Any] | None = None
    available_at: datetime | None = None
    #: Snooze: take the attempt and its worker id back (the attempt does not count).
    uncount_attempt: bool = False
    #: The job's queue and the number of the attempt, for signals and logs (not written).
    queue: str = ""
    attempt: int = 0
    #: The job is a child in a flow: its final state must move its parent on (same transaction).
    has_parent: bool = False
    #: The task's ``retention`` (the job's options): when the finished job may be pruned.
    retention: dict[str, Any] | None = None
    #: How long the attempt ran (ms; the executor measures it). None: from its claim to now.
    runtime_ms: int | None = None
    #: Set by :func:`record_outcomes` on a written outcome: when the job finished (None: it did not).
    finished_at: datetime | None = field(default=None, compare=False)
    #: The claimed job and the exception the attempt raised, kept in this process (never pickled
    #: to or from a child process) so ``task_finished`` can be sent once the outcome is stored.
    job: ClaimedJob | None = field(default=None, repr=False, compare=False)
    exc: BaseException | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in self.__slots__}
        state["job"] = state["exc"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


# -- enqueue --------------------------------------------------------------------------------


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ready_seq(available_at: datetime, lifo: bool = False) -> int:
    """The ``seq`` of a job that becomes ready at ``available_at``: microseconds since the Unix
    epoch, negated for a LIFO job.

    Claim order is ``priority DESC, seq, id``. A FIFO job's seq grows with the moment it became
    ready, so FIFO order is the order of ``available_at`` (then id), as before ``seq`` existed.
    A LIFO job's is negative, so it sorts ahead of every FIFO job of its priority and, among LIFO
    jobs, the newest comes first (the seed schema's signed ``job_seq``). Computed here, not by a
    database sequence, so both vendors agree and a rescheduled job can get a new one from its
    new time.
    """
    if available_at.tzinfo is None:  # USE_TZ = False: Django's naive datetimes are UTC to us
        available_at = available_at.replace(tzinfo=UTC)
    micros = (available_at - _EPOCH) // timedelta(microseconds=1)
    return -micros if lifo else micros


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


@dataclass(slots=True)
class NewJob:
    """A new job's row as its INSERT writes it: the columns set at enqueue (the others start at
    the table's defaults: no attempt, no error, no lease, no parent). The plain enqueue's value
    object, lighter than a model instance; :func:`_as_job` makes the unsaved ``Job`` of it."""

    id: uuid.UUID
    backend: str
    queue: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    state: str
    priority: int
    available_at: datetime
    options: dict[str, Any]
    max_attempts: int
    #: None until inserted when the database clock stamps it (PostgreSQL, see :func:`_new_row`).
    enqueued_at: datetime | None
    seq: int
    trace_id: str
    dedup_key: str | None
    idempotency_key: str | None
    partition_key: str | None
    blocked: bool


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


def _mark_saved(job: Job | NewJob, using: str) -> None:
    if isinstance(job, Job):  # a NewJob is no model instance: nothing to mark
        job._state.adding = False
        job._state.db = using


def _set_enqueued_at(d: Dialect, job: Job | NewJob, value: Any) -> None:
    """``job.enqueued_at`` as its INSERT stored it (PostgreSQL: possibly the database clock)."""
    job.enqueued_at = d.to_dt(value)


_INSERT_COLUMNS = (
    "id, backend, queue, task_path, args, kwargs, state, priority, available_at, options, max_attempts, "
    "enqueued_at, attempts, stalled_count, pending_children, errors, worker_ids, seq"
)


#: True for a queue whose enqueues are counted against a size limit (see :func:`_admit`).
_SIZE_LIMITED = "(max_size IS NOT NULL OR partition_max_size IS NOT NULL)"


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


#: Rows per INSERT statement of :func:`insert_jobs`. 500 rows x 4 parameters + 10 = 2,010 bound
#: variables: under SQLite's limit (32,766 by default since 3.32, our minimum is 3.35; a build
#: or connection set lower is honoured, see _rows_per_statement) and PostgreSQL's 65,535. Large
#: enough that the round trip per statement is a small part of its cost, small enough that one
#: statement's SQL and parameters stay around 100 KiB however many jobs the caller sends.
INSERT_CHUNK = 500
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
    conn = connections[using]
    if conn.vendor != "postgresql" or not queues:
        return
    channel = get_settings().NOTIFY_CHANNEL
    if conn.in_atomic_block and not conn.savepoint_ids:
        sent = _sent_in_transaction(conn)
        queues = [q for q in queues if q not in sent]
        if not queues:
            return
        sent.update(queues)
    with conn.cursor() as cursor:
        for queue in sorted(set(queues)):
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, queue])


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

#: The writing transaction's id (PostgreSQL): readers order events by (txid, id); see events.py.
_TXID = "pg_current_xact_id()::text::bigint"
_EVENT_COLUMNS = "txid, queue, job_id, kind, data, created_at"


def events_enabled() -> bool:
    return get_settings().EVENTS


def events_channel() -> str:
    """The NOTIFY channel of events (PostgreSQL): each transaction that writes events sends one
    notification on it (PostgreSQL folds a transaction's identical notifications into one)."""
    return f"{get_settings().NOTIFY_CHANNEL}_events"


def _pg_event_cte(source: str, kind_sql: str, data_sql: str) -> str:
    """A data-modifying CTE writing one event per row of the CTE ``source`` (which has ``id``
    and ``queue`` columns), so a hot statement records its events without a round trip."""
    return (
        f"ev AS (INSERT INTO {EVENT_TABLE} ({_EVENT_COLUMNS}) SELECT {_TXID}, {source}.queue, {source}.id, "
        f"{kind_sql}, {data_sql}, clock_timestamp() FROM {source})"
    )


def _pg_event_notify(source: str) -> str:
    """A one-row FROM item sending the events NOTIFY (one ``%s``: the channel) when ``source``
    has rows; join it to the statement's final SELECT."""
    return f"(SELECT count(pg_notify(%s, '')) AS n FROM (SELECT 1 FROM {source} LIMIT 1) one) ev_notify"


def write_events(
    cursor: Any,
    d: Dialect,
    events: list[tuple[str, uuid.UUID | None, str, dict[str, Any]]],
    now: datetime | None = None,
) -> None:
    """Write ``(queue, job id, kind, data)`` events in the caller's transaction (call it inside
    the transaction that made the change); on PostgreSQL also NOTIFY the events channel."""
    if not events or not events_enabled():
        return
    created = now or timezone.now()
    for start in range(0, len(events), INSERT_CHUNK):
        part = events[start : start + INSERT_CHUNK]
        params: list[Any] = []
        for queue, job_id, kind, data in part:
            params += [queue, d.uuid(job_id), kind, json.dumps(data, default=str)]
        if d.pg:
            rows = ", ".join(["(%s, %s::uuid, %s, %s::jsonb)"] * len(part))
            cursor.execute(
                f"WITH ins AS (INSERT INTO {EVENT_TABLE} ({_EVENT_COLUMNS}) SELECT {_TXID}, v.q, v.j, v.k, v.d, "
                f"clock_timestamp() FROM (VALUES {rows}) v(q, j, k, d) RETURNING 1) "
                f"SELECT count(pg_notify(%s, '')) FROM (SELECT 1 FROM ins LIMIT 1) one",
                [*params, events_channel()],
            )
        else:
            rows = ", ".join(["(0, %s, %s, %s, %s, %s)"] * len(part))
            flat = []
            for i in range(0, len(params), 4):
                flat += [*params[i : i + 4], d.dt(created)]
            cursor.execute(f"INSERT INTO {EVENT_TABLE} ({_EVENT_COLUMNS}) VALUES {rows}", flat)


def _job_events(
    using: str, rows: list[tuple[str, uuid.UUID, str, dict[str, Any]]], now: datetime | None = None
) -> None:
    """:func:`write_events` on a new cursor of ``using`` (in the caller's transaction)."""
    if rows and events_enabled():
        with connections[using].cursor() as cursor:
            write_events(cursor, Dialect(using), rows, now)


def _enqueued_data(job: Job | NewJob) -> dict[str, Any]:
    return {"task": job.task_path, "state": job.state}


def _sqlite_atomic(d: Dialect) -> Any:
    """SQLite with events: a transaction around a change and its events, which are written by a
    second statement there (PostgreSQL writes them in the change's own statement)."""
    if d.pg or not events_enabled():
        return contextlib.nullcontext()
    return transaction.atomic(using=d.using)


def _enqueued_event_sqlite(cursor: Any, d: Dialect, job: Job | NewJob) -> None:
    """SQLite: the ``enqueued`` event of a job just inserted (PostgreSQL writes it in the INSERT)."""
    if not d.pg:
        write_events(cursor, d, [(job.queue, job.id, "enqueued", _enqueued_data(job))])


def _finished_elsewhere(cursor: Any, d: Dialect, job_ids: list[uuid.UUID], kind: str, now: datetime | None) -> None:
    """Jobs that just finished outside an outcome batch (cancel, rescue, a flow parent failed by
    its child): their event, and ``purge_at`` from their retention policy. In the caller's
    transaction; jobs not in a finished state are left alone."""
    from . import retention

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


# -- deduplication --------------------------------------------------------------------------

DEDUP_TABLE = JobDedup._meta.db_table
DEDUP_NEXT_TABLE = JobDedupNext._meta.db_table
#: How often one enqueue starts over when the key it met was released before it could lock it
#: (its holder deleted, or the sweeper removing it as expired). Each try is a savepoint.
_DEDUP_TRIES = 10
_UNSTARTED = (JobState.WAITING, JobState.DELAYED)
_KEY_WHERE = 'backend = %s AND queue = %s AND "key" = %s'


class DedupOutcome(NamedTuple):
    """What :func:`enqueue_deduplicated` did."""

    #: The job holding the key now: the new job, or (a duplicate) the one that held it.
    job: Job
    #: A new job was inserted: the key was free, its holder had finished, or it had expired.
    created: bool
    #: A new job: ``("took_over",)`` when the key had a finished or expired holder. A duplicate:
    #: any of ``replaced`` (the holder's arguments and run_after), ``extended`` (the key's
    #: expiry), ``stashed`` (kept to run after the running holder).
    changes: tuple[str, ...] = ()


def enqueue_deduplicated(
    *,
    using: str,
    backend: str,
    queue: str,
    key: str,
    ttl: float | None = None,
    extend: bool = False,
    replace: bool = False,
    keep_last_if_active: bool = False,
    task_path: str,
    priority: int,
    args: list[Any],
    kwargs: dict[str, Any],
    max_attempts: int,
    options: dict[str, Any],
    run_after: datetime | None = None,
    lifo: bool = False,
    trace_id: str | None = None,
    partition: str | None = None,
    notify_workers: bool = True,
    now: datetime | None = None,
) -> DedupOutcome:
    """Insert a job unless ``key`` (unique per backend and queue) is held; in the caller's
    transaction, inside a savepoint.

    The key is taken with ``INSERT ... ON CONFLICT DO NOTHING`` on the unique constraint, never
    checked first: of concurrent enqueues of a free key exactly one inserts it (on PostgreSQL the
    others wait on the unique index until it commits or rolls back; on SQLite the statement holds
    the write lock). On a conflict the key's row is locked (``FOR UPDATE``; SQLite's write lock)
    and the holder decides:

    * the key expired (``expire_at`` passed), or has no expiry and its job finished: this
      enqueue takes it over (a guarded UPDATE on the old job id and the reason) and inserts its
      job; a stash left for the key is dropped, this enqueue being newer;
    * else it is a duplicate: the holder is returned, after ``replace`` gave a waiting or
      delayed holder this enqueue's arguments and run_after (guarded on those states),
      ``keep_last_if_active`` stashed this enqueue while the holder runs (one per key, the last
      one wins, made a job by :func:`promote_dedup_stashes`; the key then holds until it is),
      or ``extend`` moved the key's expiry to ``ttl`` seconds from now.

    ``ttl``: seconds the key holds from now, whatever its job's state (None: while the job is
    unfinished). Expiry is on ``now``, or the database clock on PostgreSQL. ``notify_workers``:
    wake the queue's workers when a job became waiting (``enqueue_many`` wakes them once).
    Raises InvalidTaskOptions when ``replace`` meets a holder of another task.
    """
    d = Dialect(using)
    conn = connections[using]
    for _ in range(_DEDUP_TRIES):
        job = _new_job(
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
            now=now,
            trace_id=trace_id,
            dedup_key=key,
            partition=partition,
            database_clock=d.pg,
        )
        with transaction.atomic(using=using), conn.cursor() as cursor:
            outcome = _enqueue_dedup_try(
                cursor,
                d,
                using,
                job,
                ttl=ttl,
                extend=extend,
                replace=replace,
                keep_last=keep_last_if_active,
                wake=notify_workers,
                now=now,
            )
        if outcome is not None:
            break
    else:
        raise JobsError(
            f"Could not enqueue with dedup key {key!r} (queue {queue!r}) after {_DEDUP_TRIES} tries: the key was "
            "released every time before it could be read (are its jobs deleted as fast as they are enqueued?). "
            "Enqueue again."
        )
    if notify_workers and outcome.job.state == JobState.WAITING and "replaced" in outcome.changes:
        notify(using, [queue])  # a new job's NOTIFY rode on its INSERT
    return outcome


def _enqueue_dedup_try(
    cursor: Any,
    d: Dialect,
    using: str,
    job: Job,
    *,
    ttl: float | None,
    extend: bool,
    replace: bool,
    keep_last: bool,
    wake: bool,
    now: datetime | None,
) -> DedupOutcome | None:
    """One try of :func:`enqueue_deduplicated`; None: the key vanished or its holder just
    finished, start over. ``wake``: a new waiting job notifies its queue's workers."""
    key_params = [job.backend, job.queue, job.dedup_key]
    expire_sql, expire_params = _dedup_expiry(d, ttl, now)
    # The key first, the job second: a duplicate (the common case under contention) then writes
    # nothing. The foreign key to the job is checked at commit (Django creates it deferred).
    cursor.execute(
        f'INSERT INTO {DEDUP_TABLE} (backend, queue, "key", job_id, expire_at) '
        f"VALUES (%s, %s, %s, {d.cast('%s', 'uuid')}, {expire_sql}) "
        f'ON CONFLICT (backend, queue, "key") DO NOTHING RETURNING id',
        [*key_params, d.uuid(job.id), *expire_params],
    )
    if cursor.fetchone() is not None:
        _insert_new(cursor, d, using, job, wake=wake)
        return DedupOutcome(job, True)
    # On SQLite the INSERT took the write lock, even though it wrote nothing.
    held = _lock_dedup_key(cursor, d, job.backend, job.queue, job.dedup_key, now, sqlite_write_locked=True)
    if held is None:
        return None  # released between the INSERT and the lock
    key_id, holder_id, has_expiry, expired = held
    holder = _read_job(cursor, d, using, "id = %s", [d.uuid(holder_id)])
    if expired or holder is None or (not has_expiry and holder.state in FINISHED_STATES):
        # Guarded on the old holder and on the reason (the row is locked, so it holds).
        now_sql, now_params = d.now(now)
        reason = f"expire_at <= {now_sql}" if expired else "expire_at IS NULL" if holder is not None else "1 = 1"
        cursor.execute(
            f"UPDATE {DEDUP_TABLE} SET job_id = {d.cast('%s', 'uuid')}, expire_at = {expire_sql} "
            f"WHERE id = %s AND job_id = {d.cast('%s', 'uuid')} AND {reason}",
            [d.uuid(job.id), *expire_params, key_id, d.uuid(holder_id), *(now_params if expired else [])],
        )
        if cursor.rowcount != 1:
            logger.info("Dedup key %r changed hands while locked; trying again.", job.dedup_key)
            return None
        cursor.execute(f"DELETE FROM {DEDUP_NEXT_TABLE} WHERE {_KEY_WHERE}", key_params)
        _insert_new(cursor, d, using, job, wake=wake)
        return DedupOutcome(job, True, ("took_over",))
    changes: list[str] = []
    state = holder.state
    if replace and state in _UNSTARTED:
        if holder.task_path != job.task_path:
            raise InvalidTaskOptions(
                f"Dedup key {job.dedup_key!r} of queue {job.queue!r} is held by job {holder.id} of "
                f"{holder.task_path}; replace=True cannot give it the arguments of {job.task_path}. Use keys that "
                "name the task too, such as f'{task_name}:{id}'."
            )
        # Guarded on the states a holder may be replaced in; the UPDATE locks the row, so a claim
        # (SKIP LOCKED) cannot start it with the old arguments until this transaction ends.
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET args = {d.cast('%s', 'jsonb')}, kwargs = {d.cast('%s', 'jsonb')}, "
            f"state = %s, available_at = {d.cast('%s', 'timestamptz')}, seq = %s "
            f"WHERE id = {d.cast('%s', 'uuid')} AND state IN ('waiting', 'delayed')",
            [json.dumps(job.args), json.dumps(job.kwargs), job.state, d.dt(job.available_at), job.seq,
             d.uuid(holder.id)],
        )  # fmt: skip
        if cursor.rowcount == 1:
            changes.append("replaced")
        else:
            state = _job_state(cursor, d, holder.id)
    elif keep_last and state in _UNSTARTED and d.pg:
        # Keep an unstarted holder unstarted while this transaction decides (a claim skips a
        # locked row); SQLite's claims wait for the write lock this transaction holds.
        cursor.execute(
            f"SELECT id FROM {JOB_TABLE} WHERE id = %s AND state IN ('waiting', 'delayed') FOR UPDATE",
            [holder.id],
        )
        if cursor.fetchone() is None:
            state = _job_state(cursor, d, holder.id)
    if state is None or (not has_expiry and state in FINISHED_STATES):
        return None  # it finished (or went) meanwhile: the key is free to take over
    if keep_last and state == JobState.ACTIVE:
        _stash(cursor, d, job, ttl=ttl)
        # The key holds until the stash is a job, whatever its ttl (the seed's "persisted" key).
        cursor.execute(f"UPDATE {DEDUP_TABLE} SET expire_at = NULL WHERE id = %s", [key_id])
        changes.append("stashed")
    elif extend and has_expiry:
        cursor.execute(
            f"UPDATE {DEDUP_TABLE} SET expire_at = {expire_sql} WHERE id = %s AND expire_at IS NOT NULL",
            [*expire_params, key_id],
        )
        changes.append("extended")
    if changes:
        holder = _read_job(cursor, d, using, "id = %s", [d.uuid(holder.id)]) or holder
    return DedupOutcome(holder, False, tuple(changes))


def _dedup_expiry(d: Dialect, ttl: float | None, now: datetime | None) -> tuple[str, list[Any]]:
    """SQL for a key's ``expire_at``: ``ttl`` seconds from now, or NULL."""
    if ttl is None:
        return "NULL", []
    return d.now_plus(now, ttl)


def _lock_dedup_key(
    cursor: Any,
    d: Dialect,
    backend: str,
    queue: str,
    key: str | None,
    now: datetime | None,
    *,
    sqlite_write_locked: bool = False,
) -> tuple[int, uuid.UUID, bool, bool] | None:
    """Lock a dedup key's row; ``(row id, holder id, has an expiry, has expired)``, None when
    there is no such key. ``sqlite_write_locked``: this transaction already wrote (on SQLite it
    holds the write lock, so a read is enough and a duplicate's commit writes nothing)."""
    if d.pg:
        now_sql, now_params = d.now(now)
        cursor.execute(
            f"SELECT id, job_id, expire_at IS NOT NULL, (expire_at IS NOT NULL AND expire_at <= {now_sql}) "
            f"FROM {DEDUP_TABLE} WHERE {_KEY_WHERE} FOR UPDATE",
            [*now_params, backend, queue, key],
        )
        row = cursor.fetchone()
        return None if row is None else (row[0], d.to_uuid(row[1]), row[2], row[3])
    # SQLite has no row locks: a write takes the database's write lock for the transaction. A read
    # first would not do: a deferred transaction that read cannot always upgrade. The expiry is
    # compared here, not in RETURNING: SQLite 3.40.1 evaluates "expire_at IS NOT NULL" as true for
    # a NULL in the RETURNING of an UPDATE or DELETE on a table whose key is declared "integer NOT
    # NULL PRIMARY KEY", as Django declares it. SQLite's clock is this process's anyway.
    if sqlite_write_locked:
        cursor.execute(f"SELECT id, job_id, expire_at FROM {DEDUP_TABLE} WHERE {_KEY_WHERE}", [backend, queue, key])
    else:
        cursor.execute(
            f"UPDATE {DEDUP_TABLE} SET job_id = job_id WHERE {_KEY_WHERE} RETURNING id, job_id, expire_at",
            [backend, queue, key],
        )
    row = cursor.fetchone()
    if row is None:
        return None
    expire_at = d.to_dt(row[2])
    expired = expire_at is not None and expire_at <= (now or timezone.now())
    return row[0], d.to_uuid(row[1]), expire_at is not None, expired


#: The columns :func:`_read_job` reads: what a result and the dedup decisions need.
_READ_COLUMNS = (
    "id, backend, queue, task_path, args, kwargs, state, priority, available_at, seq, options, attempts, "
    "max_attempts, progress, return_value, errors, worker_ids, enqueued_at, started_at, last_attempted_at, "
    "finished_at, trace_id, dedup_key, idempotency_key"
)


def _read_job(cursor: Any, d: Dialect, using: str, where: str, params: list[Any]) -> Job | None:
    """One job row read with raw SQL (the ORM's query compilation cost more than the query on
    the duplicate path), or None."""
    cursor.execute(f"SELECT {_READ_COLUMNS} FROM {JOB_TABLE} WHERE {where}", params)
    row = cursor.fetchone()
    if row is None:
        return None
    (jid, backend, queue, path, args, kwargs, state, priority, available, seq, options, attempts, max_attempts,
     progress, return_value, errors, worker_ids, enqueued, started, last, finished, trace_id, dedup_key,
     idempotency_key) = row  # fmt: skip
    job = Job(
        id=d.to_uuid(jid),
        backend=backend,
        queue=queue,
        task_path=path,
        args=d.to_json(args),
        kwargs=d.to_json(kwargs),
        state=state,
        priority=priority,
        available_at=d.to_dt(available),
        seq=seq,
        options=d.to_json(options),
        attempts=attempts,
        max_attempts=max_attempts,
        progress=d.to_json(progress),
        return_value=d.to_json(return_value),
        errors=d.to_json(errors),
        worker_ids=d.to_json(worker_ids),
        enqueued_at=d.to_dt(enqueued),
        started_at=d.to_dt(started),
        last_attempted_at=d.to_dt(last),
        finished_at=d.to_dt(finished),
        trace_id=trace_id,
        dedup_key=dedup_key,
        idempotency_key=idempotency_key,
    )
    _mark_saved(job, using)
    return job


def _job_state(cursor: Any, d: Dialect, job_id: uuid.UUID) -> str | None:
    cursor.execute(f"SELECT state FROM {JOB_TABLE} WHERE id = {d.cast('%s', 'uuid')}", [d.uuid(job_id)])
    row = cursor.fetchone()
    return None if row is None else row[0]


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


def _queue_size_limited(using: str, queue: str) -> bool:
    return (
        QueueState.objects.using(using)
        .filter(name=queue)
        .filter(models.Q(max_size__isnull=False) | models.Q(partition_max_size__isnull=False))
        .exists()
    )


def _lock_queue(cursor: Any, d: Dialect, queue: str, columns: str, where: str = "") -> tuple[Any, ...] | None:
    """Lock ``queue``'s QueueState row until the transaction ends and return ``columns`` of it;
    None when the queue has no row (or it does not match ``where``, then nothing is locked).

    PostgreSQL: ``SELECT ... FOR UPDATE``. SQLite has no row locks: an UPDATE that changes
    nothing takes the database's write lock, which the transaction keeps (and, being a write
    first, waits for the lock instead of failing to upgrade a read).
    """
    extra = f" AND {where}" if where else ""
    if d.pg:
        cursor.execute(f"SELECT {columns} FROM {QUEUE_TABLE} WHERE name = %s{extra} FOR UPDATE", [queue])
    else:
        cursor.execute(f"UPDATE {QUEUE_TABLE} SET name = name WHERE name = %s{extra} RETURNING {columns}", [queue])
    return cursor.fetchone()


def _count_unfinished(cursor: Any, queue: str, partition: str | None, cap: int) -> int:
    """Unfinished jobs of ``queue`` (of one ``partition``), counting no further than ``cap``:
    an index range of django_jobs_unfinished_idx, bounded by the limit it is checked against."""
    where, params = "queue = %s", [queue]
    if partition is not None:
        where += " AND partition_key = %s"
        params.append(partition)
    cursor.execute(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM {JOB_TABLE} WHERE {where} AND state IN {UNFINISHED_SQL} LIMIT %s) s",
        [*params, cap],
    )
    return cursor.fetchone()[0]


def _admit(cursor: Any, d: Dialect, queue: str, adding: dict[str | None, int], *, batch_before: int = 0) -> None:
    """Raise QueueFull when ``adding`` (``{partition or None: new jobs}``) would take ``queue``
    or one of its partitions past its max size. Call inside a transaction, before the INSERT.

    A queue without a size limit costs one primary-key probe and locks nothing. A limited one
    is locked until the caller's transaction ends (PostgreSQL: a transaction-level advisory lock
    per queue; SQLite: the database write lock), so concurrent enqueuers count one after another
    and each sees the jobs the one before it committed (READ COMMITTED: each statement after the
    lock reads anew): the size never passes the limit, however many processes enqueue. ``batch_before``: jobs of the same batch
    this transaction already inserted (they are counted in the size; the message names them).
    """
    if d.pg:
        # An advisory lock, not the QueueState row's: the caller keeps it until its transaction
        # ends, and a long transaction must not hold up the claims (which lock the row).
        cursor.execute(f"SELECT 1 FROM {QUEUE_TABLE} WHERE name = %s AND {_SIZE_LIMITED}", [queue])
        if cursor.fetchone() is None:
            return
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"django_jobs.admit:{queue}"])
        cursor.execute(f"SELECT max_size, partition_max_size FROM {QUEUE_TABLE} WHERE name = %s", [queue])
        row = cursor.fetchone()
    else:
        row = _lock_queue(cursor, d, queue, "max_size, partition_max_size", _SIZE_LIMITED)
    if row is None:
        return
    max_size, partition_max = row
    total = sum(adding.values())
    if max_size is not None:
        size = _count_unfinished(cursor, queue, None, max_size)
        if size + total > max_size:
            raise QueueFull(queue=queue, size=size - batch_before, limit=max_size, adding=total + batch_before)
    if partition_max is not None:
        for partition, n in adding.items():
            if partition is None:
                continue
            size = _count_unfinished(cursor, queue, partition, partition_max)
            if size + n > partition_max:
                raise QueueFull(
                    queue=queue, partition=partition, size=size - batch_before, limit=partition_max,
                    adding=n + batch_before,
                )  # fmt: skip


def _unblock_heads(cursor: Any, d: Dialect, partitions: set[tuple[str, str]]) -> int:
    """Clear ``blocked`` on the next job (earliest unfinished) of each (queue, partition) so
    claims see it; return how many were blocked. Inserts block a partitioned job and call this
    right after; a job reaching a final state calls it for its partition. A hint only: two
    enqueues racing a finish can leave a partition's next job blocked, which the
    PartitionSweeper (:func:`unblock_partitions`) clears within one of its intervals."""
    if not partitions:
        return 0
    keys = sorted(partitions)
    if d.pg:
        # One statement for the batch (an outcome batch finishes jobs of many partitions): per
        # (queue, partition), its first partition_concurrency (default 1) unfinished jobs.
        # The rows are locked in id order first (the ORDER BY ... FOR UPDATE): two batches freeing
        # overlapping partitions then wait for each other instead of deadlocking.
        values = ", ".join(["(%s::text, %s::text)"] * len(keys))
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET blocked = false WHERE id IN (SELECT b.id FROM {JOB_TABLE} b WHERE b.id IN ("
            f"SELECT n.id FROM (VALUES {values}) v(q, p) "
            f"CROSS JOIN LATERAL (SELECT u.id FROM {JOB_TABLE} u WHERE u.queue = v.q AND u.partition_key = v.p "
            f"AND u.state IN {UNFINISHED_SQL} ORDER BY u.id LIMIT (SELECT COALESCE(MAX(partition_concurrency), 1) "
            f"FROM {QUEUE_TABLE} WHERE name = v.q)) n) AND b.blocked ORDER BY b.id FOR UPDATE) AND blocked",
            [x for key in keys for x in key],
        )
        return cursor.rowcount
    freed = 0
    for queue, partition in keys:
        # The first partition_concurrency (default 1) unfinished jobs may run.
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET blocked = {d.false()} WHERE id IN (SELECT id FROM {JOB_TABLE} WHERE queue = %s "
            f"AND partition_key = %s AND state IN {UNFINISHED_SQL} ORDER BY id LIMIT (SELECT "
            f"COALESCE(MAX(partition_concurrency), 1) FROM {QUEUE_TABLE} WHERE name = %s)) AND blocked",
            [queue, partition, queue],
        )
        freed += cursor.rowcount
    return freed


def unblock_partitions(*, using: str, limit: int) -> int:
    """Clear ``blocked`` on the next job(s) of up to ``limit`` partitions whose earliest
    unfinished job is blocked (so nothing of the partition could be claimed again); return how
    many jobs. The PartitionSweeper's run: one scan of django_jobs_blocked_idx (one entry per
    unfinished job that waits for its partition's turn) grouped by partition, with one probe of
    django_jobs_unfinished_idx per partition."""
    d = Dialect(using)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT b.queue, b.partition_key FROM {JOB_TABLE} b WHERE {d.is_blocked('b')} AND b.state IN {UNFINISHED_SQL} "
            f"GROUP BY b.queue, b.partition_key HAVING (SELECT {d.is_blocked('f')} FROM {JOB_TABLE} f WHERE "
            f"f.queue = b.queue AND f.partition_key = b.partition_key AND f.state IN {UNFINISHED_SQL} "
            f"ORDER BY f.id LIMIT 1) LIMIT %s",
            [limit],
        )
        stuck = {(q, p) for q, p in cursor.fetchall()}
    freed = _unblock_partitions(using, stuck)
    if freed:
        logger.debug("Unblocked the next job of %d partition(s) left without one.", freed)
    return freed


def _stash(cursor: Any, d: Dialect, job: Job, *, ttl: float | None) -> None:
    """Keep ``job`` (unsaved) as its key's next job, replacing an earlier stash."""
    delayed = job.state == JobState.DELAYED
    payload = {
        "task_path": job.task_path,
        "args": job.args,
        "kwargs": job.kwargs,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "options": job.options,
        "run_after": job.available_at.isoformat() if delayed else None,
        "lifo": job.seq < 0,
        "trace_id": job.trace_id,
        "partition": job.partition_key,
        "ttl": ttl,
        # None: the database clock; the job then gets stashed_at (see _promote_stash).
        "enqueued_at": job.enqueued_at.isoformat() if job.enqueued_at is not None else None,
    }
    stashed_sql, stashed_params = d.now(job.enqueued_at)
    cursor.execute(
        f'INSERT INTO {DEDUP_NEXT_TABLE} (backend, queue, "key", payload, stashed_at) '
        f"VALUES (%s, %s, %s, {d.cast('%s', 'jsonb')}, {stashed_sql}) "
        f'ON CONFLICT (backend, queue, "key") DO UPDATE SET payload = excluded.payload, '
        f"stashed_at = excluded.stashed_at",
        [job.backend, job.queue, job.dedup_key, json.dumps(payload), *stashed_params],
    )


def insert_job_once(
    *,
    using: str,
    idempotency_key: str,
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
) -> tuple[Job, bool]:
    """Insert a job unless ``queue`` (of ``backend``) has one with ``idempotency_key``; return
    ``(job, inserted)``: the new job, or the existing one and False.

    One ``INSERT ... ON CONFLICT DO NOTHING`` on the partial unique index, then, on a conflict,
    a read of the row that won (on PostgreSQL a concurrent insert of the key is waited for). The
    key holds for as long as the job row exists, whatever its state.
    """
    d = Dialect(using)
    conn = connections[using]
    for _ in range(_DEDUP_TRIES):
        job = _new_job(
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
            now=now,
            trace_id=trace_id,
            idempotency_key=idempotency_key,
            partition=partition,
            database_clock=d.pg,
        )
        # In autocommit the NOTIFY rides on the INSERT; in a transaction notify() sends it once per
        # queue, and only for a job that was inserted.
        wake = job.state == JobState.WAITING and d.pg and not conn.in_atomic_block
        with _sqlite_atomic(d), conn.cursor() as cursor:
            cursor.execute(*_insert_statement(d, job, wake=wake, once=True, guarded=True))
            row = cursor.fetchone()  # (id, enqueued_at) when the row was inserted
            inserted = row is not None
            if inserted:
                _set_enqueued_at(d, job, row[1])
                _enqueued_event_sqlite(cursor, d, job)
        where = "backend = %s AND queue = %s AND idempotency_key = %s"
        if not inserted and _queue_size_limited(using, queue):
            # The guard refused it: a limited queue admits under its lock (a duplicate first).
            with conn.cursor() as cursor:
                found = _read_job(cursor, d, using, where, [backend, queue, idempotency_key])
            if found is not None:
                return found, False
            try:
                with transaction.atomic(using=using), conn.cursor() as cursor:
                    _admit(cursor, d, queue, {job.partition_key: 1})
                    cursor.execute(*_insert_statement(d, job, wake=wake, once=True))
                    row = cursor.fetchone()
                    inserted = row is not None
                    if inserted:
                        _set_enqueued_at(d, job, row[1])
                        _enqueued_event_sqlite(cursor, d, job)
            except QueueFull:
                # The key's first job may have committed while we waited for the lock: a
                # duplicate returns it, full or not.
                with conn.cursor() as cursor:
                    found = _read_job(cursor, d, using, where, [backend, queue, idempotency_key])
                if found is not None:
                    return found, False
                raise
        if inserted:
            _mark_saved(job, using)
            if job.partition_key is not None:
                with conn.cursor() as cursor:
                    _unblock_heads(cursor, d, {(job.queue, job.partition_key)})
            if job.state == JobState.WAITING and not wake:
                notify(using, [queue])
            return job, True
        with conn.cursor() as cursor:
            found = _read_job(cursor, d, using, where, [backend, queue, idempotency_key])
        if found is not None:
            return found, False
        # The job that had the key was deleted after our INSERT met it: the key is free again.
    raise JobsError(
        f"Could not enqueue with idempotency key {idempotency_key!r} (queue {queue!r}) after {_DEDUP_TRIES} "
        "tries: the job holding it was deleted every time before it could be read. Enqueue again."
    )


def promote_dedup_stashes(*, using: str, limit: int, backend: str | None = None, now: datetime | None = None) -> int:
    """Turn up to ``limit`` stashed enqueues (``keep_last_if_active``) whose key's holder has
    finished (or is gone) into jobs (of ``backend``, or all); return how many.

    Each stash, in its own transaction (a savepoint inside the caller's): lock the key row,
    check again that its holder finished, lock the stash, insert its job, move the key to it
    (guarded on the old holder; with the stash's ``ttl`` as expiry) and delete the stash. A
    stash whose key another enqueue took meanwhile stays until that holder finishes.
    """
    d = Dialect(using)
    scope, scope_params = (" AND n.backend = %s", [backend]) if backend is not None else ("", [])
    finished = ", ".join(f"'{s}'" for s in sorted(FINISHED_STATES))
    with connections[using].cursor() as cursor:
        cursor.execute(
            f'SELECT n.backend, n.queue, n."key" FROM {DEDUP_NEXT_TABLE} n '
            f'LEFT JOIN {DEDUP_TABLE} k ON k.backend = n.backend AND k.queue = n.queue AND k."key" = n."key" '
            f"LEFT JOIN {JOB_TABLE} j ON j.id = k.job_id "
            f"WHERE (k.id IS NULL OR j.state IN ({finished})){scope} ORDER BY n.id LIMIT %s",
            [*scope_params, limit],
        )
        candidates = cursor.fetchall()
    woken: set[str] = set()
    promoted = 0
    for cand_backend, queue, key in candidates:
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                job = _promote_stash(cursor, d, using, cand_backend, queue, key, now)
        except QueueFull as exc:
            logger.warning("Dedup key %r: its stashed enqueue waits, %s", key, exc)
            continue
        if job is not None:
            promoted += 1
            logger.info("Dedup key %r of queue %r: its stashed enqueue is job %s.", key, queue, job.id)
            if job.state == JobState.WAITING:
                woken.add(queue)
    notify(using, sorted(woken))
    return promoted


def _promote_stash(
    cursor: Any, d: Dialect, using: str, backend: str, queue: str, key: str, now: datetime | None
) -> Job | None:
    held = _lock_dedup_key(cursor, d, backend, queue, key, now)
    if held is not None and _job_state(cursor, d, held[1]) not in (*FINISHED_STATES, None):
        return None  # its holder runs again (retried): the stash waits for it
    cursor.execute(
        f"SELECT id, payload, stashed_at FROM {DEDUP_NEXT_TABLE} WHERE {_KEY_WHERE}{' FOR UPDATE' if d.pg else ''}",
        [backend, queue, key],
    )
    stash = cursor.fetchone()
    if stash is None:
        return None  # promoted by another sweeper, or dropped by a takeover
    p = d.to_json(stash[1])
    # The stashed enqueue's time: in its payload, or (stamped by the database clock) stashed_at.
    enqueued_at = datetime.fromisoformat(p["enqueued_at"]) if p.get("enqueued_at") else d.to_dt(stash[2])
    job = _new_job(
        backend=backend,
        task_path=p["task_path"],
        queue=queue,
        priority=p["priority"],
        args=p["args"],
        kwargs=p["kwargs"],
        max_attempts=p["max_attempts"],
        options=p["options"],
        run_after=datetime.fromisoformat(p["run_after"]) if p.get("run_after") else None,
        lifo=bool(p.get("lifo")),
        now=now,
        trace_id=p.get("trace_id"),
        dedup_key=key,
        enqueued_at=enqueued_at,
        partition=p.get("partition"),
    )
    expire_sql, expire_params = _dedup_expiry(d, p.get("ttl"), now)
    if held is not None:
        cursor.execute(
            f"UPDATE {DEDUP_TABLE} SET job_id = {d.cast('%s', 'uuid')}, expire_at = {expire_sql} "
            f"WHERE id = %s AND job_id = {d.cast('%s', 'uuid')}",
            [d.uuid(job.id), *expire_params, held[0], d.uuid(held[1])],
        )
        if cursor.rowcount != 1:
            return None
    else:
        cursor.execute(
            f'INSERT INTO {DEDUP_TABLE} (backend, queue, "key", job_id, expire_at) '
            f"VALUES (%s, %s, %s, {d.cast('%s', 'uuid')}, {expire_sql}) "
            f'ON CONFLICT (backend, queue, "key") DO NOTHING RETURNING id',
            [backend, queue, key, d.uuid(job.id), *expire_params],
        )
        if cursor.fetchone() is None:
            return None  # an enqueue took the free key meanwhile: the stash waits for its job
    _insert_new(cursor, d, using, job)
    cursor.execute(f"DELETE FROM {DEDUP_NEXT_TABLE} WHERE id = %s", [stash[0]])
    return job


def delete_expired_dedup_keys(
    *, using: str, limit: int, backend: str | None = None, now: datetime | None = None
) -> int:
    """Delete up to ``limit`` dedup keys whose ``expire_at`` passed, and up to ``limit`` keys
    without expiry whose holder finished (of ``backend``, or all); return how many. Enqueues
    reclaim such keys too; this keeps the table small."""
    d = Dialect(using)
    now_sql, now_params = d.now(now)
    scope, scope_params = _backend_scope(backend)
    sql = (
        f"DELETE FROM {DEDUP_TABLE} WHERE "
        + d.id_in(
            f"SELECT id FROM {DEDUP_TABLE} WHERE expire_at <= {now_sql}{scope} "
            f"ORDER BY expire_at LIMIT %s {d.skip_locked()}"
        )
        + f" AND expire_at <= {now_sql}"
    )
    # Keys without an expiry (simple, keep-last-if-active) whose holder finished and that hold no
    # stash: free already, deleted so the table does not grow by one row per key ever used. The
    # DELETE re-checks the holder, so a key an enqueue took over meanwhile is kept.
    finished = "('completed', 'failed', 'cancelled')"
    held_by_finished = f"job_id IN (SELECT id FROM {JOB_TABLE} WHERE state IN {finished})"
    no_stash = (
        f"NOT EXISTS (SELECT 1 FROM {DEDUP_NEXT_TABLE} n WHERE n.backend = {DEDUP_TABLE}.backend "
        f"AND n.queue = {DEDUP_TABLE}.queue AND n.key = {DEDUP_TABLE}.key)"
    )
    stale_sql = (
        f"DELETE FROM {DEDUP_TABLE} WHERE "
        + d.id_in(
            f"SELECT id FROM {DEDUP_TABLE} WHERE expire_at IS NULL AND {held_by_finished} AND {no_stash}{scope} "
            f"LIMIT %s {d.skip_locked()}"
        )
        + f" AND expire_at IS NULL AND {held_by_finished} AND {no_stash}"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*now_params, *scope_params, limit, *now_params])
        deleted = cursor.rowcount
        cursor.execute(stale_sql, [*scope_params, limit])
        return deleted + cursor.rowcount


# -- claim ----------------------------------------------------------------------------------


#: A queue whose claims take its lock (:func:`claim_gated_jobs`): the fast claim skips its jobs.
_GATED_SQL = (
    "(q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL OR q.partition_rate_limit IS NOT NULL "
    "OR COALESCE(q.partition_concurrency, 1) > 1)"
)


def _partition_free(concurrency: int) -> str:
    """The claim condition of a partitioned candidate ``j`` (always true without a partition).

    ``concurrency`` 1: no earlier job of its (queue, partition) is unfinished (so partitions run
    in order: a failed job waiting for its retry blocks the ones after it) and none is running
    (a job whose enqueue committed after a later one started must not run beside it). Each is
    one probe of a partial index (django_jobs_unfinished_idx, django_jobs_part_active_idx).
    Exact without a lock: "unfinished" only shrinks, so a job every snapshot sees as blocked
    stays blocked until its predecessors are committed as finished.

    Above 1: ``j`` is among the first ``concurrency`` unfinished jobs of its partition and
    fewer than ``concurrency`` run (order is then no longer guaranteed).
    """
    same = "p.queue = j.queue AND p.partition_key = j.partition_key"
    earlier = f"SELECT 1 FROM {JOB_TABLE} p WHERE {same} AND p.state IN {UNFINISHED_SQL} AND p.id < j.id"
    running = f"SELECT 1 FROM {JOB_TABLE} p WHERE {same} AND p.state = 'active' AND p.partition_key IS NOT NULL"
    if concurrency == 1:
        return f"(j.partition_key IS NULL OR (NOT EXISTS ({earlier}) AND NOT EXISTS ({running})))"
    return (
        f"(j.partition_key IS NULL OR ((SELECT COUNT(*) FROM ({earlier} LIMIT {concurrency}) e) < {concurrency} "
        f"AND (SELECT COUNT(*) FROM ({running} LIMIT {concurrency}) r) < {concurrency}))"
    )


def _claim_statement(
    d: Dialect,
    *,
    now: datetime | None,
    lease_seconds: float,
    worker_id: str,
    where: list[str],
    where_params: list[Any],
    limit: int,
    lease_token: uuid.UUID,
    include_blocked: bool = False,
) -> tuple[str, list[Any]]:
    """The claim: select the ready ids matching ``where`` (about candidate ``j``) in claim
    order, locking only those rows and skipping rows another worker holds (``FOR UPDATE SKIP
    LOCKED``; on SQLite the statement holds the database write lock instead), and mark them
    active with ``lease_token`` and an expiry of database time + ``lease_seconds``.

    The caller picks the token before it sends the claim: should the answer be lost after the
    commit, the caller still knows which rows the claim took (``release_jobs(lease_tokens=)``)."""
    now_sql, now_params = d.now(now)
    lease_sql, lease_params = d.now_plus(now, lease_seconds)
    # "Not blocked" spelled as in the ready indexes' condition, so both vendors use them.
    ready = "j.state = 'waiting'" if include_blocked else f"j.state = 'waiting' AND {d.not_blocked('j')}"
    select_ids = (
        f"SELECT j.id FROM {JOB_TABLE} j WHERE {ready} AND {' AND '.join(where or ['1 = 1'])} "
        f"ORDER BY j.priority DESC, j.seq, j.id LIMIT %s {d.skip_locked()}"
    )
    returning = ", ".join([*_CLAIM_COLUMNS[:-1], _claim_payload(d)])
    sql = (
        f"UPDATE {JOB_TABLE} SET state = 'active', attempts = attempts + 1, "
        f"lease_token = %s, lease_expires_at = {lease_sql}, worker_id = %s, "
        f"worker_ids = {d.json_append_text('worker_ids', '%s')}, "
        f"started_at = COALESCE(started_at, {now_sql}), last_attempted_at = {now_sql} "
        # No "AND state = 'waiting'" here: the ids were read and locked as waiting by this very
        # statement, so it holds. Spelled out, it let PostgreSQL's planner AND the id list with
        # django_jobs_unfinished_idx (whose condition it implies) and read that whole index (the
        # backlog: 20,000 entries, 1.3 of 2.2 ms) for every claim when its statistics are stale.
        f"WHERE {d.id_in(select_ids)} RETURNING {returning}"
    )
    params = [d.uuid(lease_token), *lease_params, worker_id, worker_id, *now_params, *now_params, *where_params, limit]
    if d.pg and events_enabled():
        # The "active" events ride on the claim (SQLite: _run_claim writes them).
        data = "jsonb_build_object('attempt', r.attempts, 'worker', r.worker_id)"
        sql = (
            f"WITH r AS ({sql}, worker_id), {_pg_event_cte('r', "'active'", data)} "
            f"SELECT {', '.join('r.' + c for c in _CLAIM_COLUMNS)} FROM r, {_pg_event_notify('r')}"
        )
        params.append(events_channel())
    return sql, params


def _queue_scope(d: Dialect, queues: list[str] | None, backend: str | None) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    # One queue: an equality, so the database walks django_jobs_ready_queue_idx in claim order.
    # All queues: it walks django_jobs_ready_idx in claim order. Several: the planner's choice.
    if queues and len(queues) == 1:
        where.append("j.queue = %s")
        params.append(queues[0])
    elif queues:
        sql, in_params = d.in_list("j.queue", queues)
        where.append(sql)
        params += in_params
    if backend is not None:
        where.append("j.backend = %s")
        params.append(backend)
    return where, params


def _run_claim(d: Dialect, using: str, sql: str, params: list[Any]) -> list[ClaimedJob]:
    with _sqlite_atomic(d), hot_cursor(using, generic=True) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        jobs = [_claimed(d, row) for row in rows]
        if not d.pg:
            write_events(
                cursor,
                d,
                [(j.queue, j.id, "active", {"attempt": j.attempts, "worker": j.worker_ids[-1]}) for j in jobs],
                jobs[0].last_attempted_at if jobs else None,
            )
    # RETURNING has no order: restore claim order so higher priorities start first.
    jobs.sort(key=lambda j: (-j.priority, j.seq, j.id))
    return jobs


def claim_jobs(
    *,
    using: str,
    queues: list[str] | None,
    limit: int,
    worker_id: str,
    lease_seconds: float,
    backend: str | None = None,
    job_ids: list[uuid.UUID] | None = None,
    skip_gated: bool = True,
    lease_token: uuid.UUID | None = None,
    now: datetime | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` waiting jobs of ``queues`` (``None`` = all) for ``worker_id``;
    with ``backend``, only jobs enqueued through that TASKS alias. Every job claimed gets
    ``lease_token`` (a new one when None); a worker passes its own so it can tell which rows a
    claim took even when the claim's answer is lost.

    One statement (:func:`_claim_statement`), committed before any user code runs. It skips
    paused queues and queues with a concurrency or rate limit (:func:`claim_gated_jobs` claims
    those under their lock), and a partitioned job until it is its partition's turn.
    ``job_ids``: the test kit runs the given jobs, whatever their queue's flags.
    ``skip_gated=False``: the test kit's drain, one job at a time, claims limited queues too.
    """
    if limit <= 0:
        return []
    d = Dialect(using)
    where, where_params = _queue_scope(d, queues, backend)
    if job_ids is not None:
        if not job_ids:
            return []
        sql, params = d.in_list("j.id", [d.uuid(j) for j in job_ids])
        where.append(sql)
        where_params += params
    else:
        # Paused and gated queues are skipped here, in the claim itself: a pause or a limit holds
        # for every worker from the moment it commits. An uncorrelated NOT IN, so the database
        # reads the (small) table once per statement into a hashed set. Not a correlated NOT
        # EXISTS: PostgreSQL turns that into an anti-join it expects to remove nearly every row,
        # prices the LIMIT as a walk of the whole ready index and JIT-compiles every claim (0.5-1 s
        # per claim on a 100,000-job backlog, against 0.3 ms this way).
        skipped = f"(q.paused OR {_GATED_SQL})" if skip_gated else "q.paused"
        where.append(f"j.queue NOT IN (SELECT q.name FROM {QUEUE_TABLE} q WHERE {skipped})")
        where.append(_partition_free(1))
    sql, params = _claim_statement(
        d, now=now, lease_seconds=lease_seconds, worker_id=worker_id, where=where, where_params=where_params,
        limit=limit, lease_token=lease_token or uuid.uuid4(), include_blocked=job_ids is not None,
    )  # fmt: skip
    return _run_claim(d, using, sql, params)


def gated_queues(*, using: str, queues: list[str] | None) -> list[str]:
    """The queues among ``queues`` (None: all) with a concurrency or rate limit, not paused."""
    d = Dialect(using)
    where, params = f"NOT q.paused AND {_GATED_SQL}", []
    if queues:
        sql, params = d.in_list("q.name", queues)
        where += f" AND {sql}"
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT q.name FROM {QUEUE_TABLE} q WHERE {where} ORDER BY q.name", params)
        return [row[0] for row in cursor.fetchall()]


_GATE_COLUMNS = (
    "paused, concurrency_limit, rate_limit, rate_window_seconds, partition_concurrency, partition_rate_limit, "
    "partition_rate_window_seconds"
)


def claim_gated_jobs(
    *,
    using: str,
    queue: str,
    limit: int,
    worker_id: str,
    lease_seconds: float,
    backend: str | None = None,
    lease_token: uuid.UUID | None = None,
    now: datetime | None = None,
) -> tuple[list[ClaimedJob], float | None]:
    """Claim up to ``limit`` jobs of ``queue``, which has a concurrency or rate limit; return
    them and, when a rate limit held some back, the seconds until its window lets one more start.
    ``lease_token``: as for :func:`claim_jobs`.

    One transaction holding the queue's row lock, so the claims of one queue run one after
    another across every worker and each counts what the one before it committed:

    * concurrency: at most ``concurrency_limit - running`` more;
    * rate: the start log (JobStart) keeps one row per start for one window; at most
      ``rate_limit`` minus the starts of the last ``rate_window_seconds`` more. A sliding window:
      no span of that length ever holds more starts than the limit;
    * per partition: the partition condition with ``partition_concurrency``; with a partition
      rate limit, a partition's starts in its window must stay under it, one job per partition
      per claim so the count cannot be passed within the statement.

    The time is read after the lock is held (PostgreSQL: ``clock_timestamp()``) and used for the
    window, the start log and the jobs' ``last_attempted_at``: the claims of a queue then carry
    increasing times, which is what makes the sliding window exact.
    """
    if limit <= 0:
        return [], None
    d = Dialect(using)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        row = _lock_queue(cursor, d, queue, _GATE_COLUMNS)
        if row is None or row[0]:
            return [], None
        _, concurrency, rate, window, part_conc, part_rate, part_window = row
        if now is None:
            if d.pg:
                cursor.execute("SELECT clock_timestamp()")
                now = cursor.fetchone()[0]
            else:
                now = timezone.now()
        n, wake = limit, None
        if concurrency is not None:
            cursor.execute(f"SELECT COUNT(*) FROM {JOB_TABLE} WHERE queue = %s AND state = 'active'", [queue])
            n = min(n, concurrency - cursor.fetchone()[0])
        if rate is not None:
            since = now - timedelta(seconds=window)
            cursor.execute(
                f"DELETE FROM {START_TABLE} WHERE queue = %s AND partition_key = '' AND started_at <= %s",
                [queue, d.dt(since)],
            )
            cursor.execute(
                f"SELECT COUNT(*), MIN(started_at) FROM {START_TABLE} WHERE queue = %s AND partition_key = ''",
                [queue],
            )
            count, oldest = cursor.fetchone()
            if count >= rate:
                wake = (d.to_dt(oldest) + timedelta(seconds=window) - now).total_seconds()
            n = min(n, rate - count)
        if n <= 0:
            return [], wake
        where, where_params = _queue_scope(d, [queue], backend)
        where.append(_partition_free(part_conc or 1))
        if part_rate is not None:
            part_since = now - timedelta(seconds=part_window)
            cursor.execute(
                f"DELETE FROM {START_TABLE} WHERE queue = %s AND partition_key <> '' AND started_at <= %s",
                [queue, d.dt(part_since)],
            )
            where.append(
                f"(j.partition_key IS NULL OR ((SELECT COUNT(*) FROM {START_TABLE} s WHERE s.queue = j.queue "
                f"AND s.partition_key = j.partition_key) < %s AND NOT EXISTS (SELECT 1 FROM {JOB_TABLE} p "
                f"WHERE p.queue = j.queue AND p.partition_key = j.partition_key AND p.state = 'waiting' "
                f"AND p.id < j.id)))"
            )
            where_params.append(part_rate)
        sql, params = _claim_statement(
            d, now=now, lease_seconds=lease_seconds, worker_id=worker_id, where=where, where_params=where_params,
            limit=n, lease_token=lease_token or uuid.uuid4(),
        )  # fmt: skip
        jobs = _run_claim(d, using, sql, params)
        starts = [(queue, "") for _ in jobs] if rate is not None else []
        if part_rate is not None:
            starts += [(queue, j.partition_key) for j in jobs if j.partition_key is not None]
        if starts:
            JobStart.objects.using(using).bulk_create(
                [JobStart(queue=q, partition_key=p, started_at=now) for q, p in starts]
            )
        if part_rate is not None and len(jobs) < n:
            # Partitions held back by their rate: wake when the oldest of their starts leaves.
            cursor.execute(
                f"SELECT MIN(started_at) FROM {START_TABLE} WHERE queue = %s AND partition_key <> ''", [queue]
            )
            oldest = cursor.fetchone()[0]
            if oldest is not None:
                part_wake = (d.to_dt(oldest) + timedelta(seconds=part_window) - now).total_seconds()
                wake = part_wake if wake is None else min(wake, part_wake)
    return jobs, wake


def _claimed(d: Dialect, row: tuple[Any, ...]) -> ClaimedJob:
    (jid, backend, queue, path, prio, attempts, max_attempts, token, enq, started, last, avail, seq, parent,
     trace_id, partition, payload) = row  # fmt: skip
    args, kwargs, options, errors, worker_ids = json.loads(payload)
    return ClaimedJob(
        id=d.to_uuid(jid),
        backend=backend,
        queue=queue,
        task_path=path,
        args=args,
        kwargs=kwargs,
        priority=prio,
        attempts=attempts,
        max_attempts=max_attempts,
        options=options,
        lease_token=d.to_uuid(token),
        enqueued_at=d.to_dt(enq),
        started_at=d.to_dt(started),
        last_attempted_at=d.to_dt(last),
        available_at=d.to_dt(avail),
        errors=errors,
        worker_ids=worker_ids,
        seq=seq,
        parent_id=d.to_uuid(parent) if parent is not None else None,
        trace_id=trace_id,
        partition_key=partition,
    )


# -- outcomes -------------------------------------------------------------------------------

_OUTCOME_STATES = {JobState.COMPLETED, JobState.FAILED, JobState.WAITING, JobState.DELAYED}


def record_outcomes(outcomes: list[Outcome], *, using: str, now: datetime | None = None) -> dict[uuid.UUID, str]:
    """Write a batch of attempt outcomes in one statement; return ``{job id: state written}`` for
    the jobs that were written (the state is ``cancelled`` where a cancel was requested), and set
    each written outcome's ``finished_at`` (None unless the job finished).

    Each row is guarded on (id, ``active``, lease token): an outcome whose job was rescued,
    cancelled or released meanwhile matches nothing, is logged and dropped.

    Idempotent in what it reports: the written row keeps its lease token (rescue and release
    clear theirs), so when a batch is sent again because the answer to the first try was lost,
    the rows that try committed are found by (id, token) and reported as written, not dropped,
    and what follows their commit (freeing their partitions' next jobs) is done again.
    """
    if not outcomes:
        return {}
    for o in outcomes:
        if o.state not in _OUTCOME_STATES:
            raise ValueError(f"not an outcome state: {o.state!r}")
    from . import retention

    d = Dialect(using)
    now_sql, now_params = d.now(now)
    # When retention lets the finished job go (purge_at), from this process's clock: a day's
    # policy does not care about the milliseconds between it and the database's.
    finished_at = now or timezone.now()
    purges: dict[tuple[str, str], datetime | None] = {}  # one finish time per batch: per (state, queue)

    def purge_at(state: str, o: Outcome) -> datetime | None:
        if o.retention is not None:
            return retention.purge_at(state, finished_at, queue=o.queue, task_retention=o.retention)
        key = (state, o.queue)
        if key not in purges:
            purges[key] = retention.purge_at(state, finished_at, queue=o.queue, task_retention=None)
        return purges[key]

    rows_out: list[list[Any]] = []
    for o in outcomes:
        rows_out.append(
            [
                o.job_id,
                o.lease_token,
                str(o.state),
                o.return_value_json,
                json.dumps(o.error) if o.error is not None else None,
                o.available_at,
                1 if o.uncount_attempt else 0,
                ready_seq(o.available_at) if o.available_at is not None else None,
                purge_at(o.state, o) if o.state in FINISHED_STATES else None,
                purge_at(JobState.CANCELLED, o),
                o.runtime_ms,
            ]
        )
    t = JOB_TABLE
    events = events_enabled()
    columns = "id, token, state, rv, err, avail, uncount, avail_seq, purge, purge_c, rt"
    values: list[Any]
    if d.pg:
        # The whole batch is one JSON parameter (serialised by json's C encoder) and the
        # statement's text is the same for every batch size, so psycopg parses it once. (A VALUES
        # list of 11 parameters a row was parsed and quoted anew for every batch: the completer's
        # largest cost.)
        values = [json.dumps(rows_out, default=str)]
        values_cte = (
            f"WITH v({columns}) AS (SELECT (e->>0)::uuid, (e->>1)::uuid, e->>2, (e->>3)::jsonb, (e->>4)::jsonb, "
            f"(e->>5)::timestamptz, (e->>6)::integer, (e->>7)::bigint, (e->>8)::timestamptz, (e->>9)::timestamptz, "
            f"(e->>10)::bigint FROM jsonb_array_elements(%s::jsonb) e)"
        )
    else:
        values = [
            v
            for r in rows_out
            for v in (d.uuid(r[0]), d.uuid(r[1]), *r[2:5], d.dt(r[5]), r[6], r[7], d.dt(r[8]), d.dt(r[9]), r[10])
        ]
        row_sql = f"({', '.join(['%s'] * 11)})"
        values_cte = f"WITH v({columns}) AS (VALUES {', '.join([row_sql] * len(outcomes))})"
    update = (
        f"UPDATE {t} SET state = CASE WHEN {t}.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE v.state END, "
        f"return_value = v.rv, "
        f"attempts = {t}.attempts - v.uncount, "
        f"worker_ids = CASE WHEN v.uncount = 1 THEN {d.json_pop(t + '.worker_ids')} ELSE {t}.worker_ids END, "
        f"errors = CASE WHEN v.err IS NULL THEN {t}.errors ELSE {d.json_append(t + '.errors', 'v.err')} END, "
        f"available_at = COALESCE(v.avail, {t}.available_at), "
        f"seq = CASE WHEN v.avail_seq IS NULL THEN {t}.seq WHEN {t}.seq < 0 THEN -v.avail_seq ELSE v.avail_seq END, "
        f"finished_at = CASE WHEN v.state IN ('completed', 'failed') OR {t}.cancel_requested_at IS NOT NULL "
        f"THEN {now_sql} ELSE NULL END, "
        f"purge_at = CASE WHEN {t}.cancel_requested_at IS NOT NULL THEN v.purge_c "
        f"WHEN v.state IN ('completed', 'failed') THEN v.purge ELSE NULL END, "
        # The lease token stays: it tells a retried batch which rows its lost first try wrote.
        f"lease_expires_at = NULL "
        f"FROM v WHERE {t}.id = v.id AND {t}.state = 'active' AND {t}.lease_token = v.token "
        f"RETURNING {t}.id, {t}.queue, {t}.state, {t}.parent_id, {t}.partition_key, {t}.attempts, "
        f"{t}.last_attempted_at, {t}.finished_at"
    )
    sql = f"{values_cte} {update}"
    params = [*values, *now_params]
    if d.pg:
        # The batch's events and its Metric counts ride on the same statement: no round trip
        # more, and they commit (or not) with the outcomes they count.
        kind = (
            "CASE WHEN r.state IN ('waiting', 'delayed') THEN CASE WHEN r.uncount = 1 THEN 'snoozed' "
            "ELSE 'retried' END ELSE r.state END"
        )
        runtime = f"COALESCE(r.rt, EXTRACT(EPOCH FROM ({now_sql} - r.last_attempted_at)) * 1000)"
        data = (
            f"jsonb_strip_nulls(jsonb_build_object('attempt', r.attempts, 'error', r.err->>'exception_class_path', "
            f"'runtime_ms', round({runtime})::bigint))"
        )
        ended = "r.state IN ('completed', 'failed')"
        sql = (
            f"{values_cte}, r AS ({update}, v.uncount, v.err, v.rt), "
            + (f"{_pg_event_cte('r', kind, data)}, " if events else "")
            + f"m AS (INSERT INTO {METRIC_TABLE} (queue, minute, completed, failed, retried, runtime_ms) "
            f"SELECT r.queue, date_trunc('minute', {now_sql}, 'UTC'), count(*) FILTER (WHERE r.state = 'completed'), "
            f"count(*) FILTER (WHERE r.state = 'failed'), "
            f"count(*) FILTER (WHERE r.state IN ('waiting', 'delayed') AND r.uncount = 0), "
            f"COALESCE(round(sum({runtime}) FILTER (WHERE {ended})), 0)::bigint "
            f"FROM r GROUP BY r.queue ORDER BY r.queue "
            f"ON CONFLICT (queue, minute) DO UPDATE SET completed = {METRIC_TABLE}.completed + EXCLUDED.completed, "
            f"failed = {METRIC_TABLE}.failed + EXCLUDED.failed, retried = {METRIC_TABLE}.retried + EXCLUDED.retried, "
            f"runtime_ms = {METRIC_TABLE}.runtime_ms + EXCLUDED.runtime_ms) "
            f"SELECT r.id, r.queue, r.state, r.parent_id, r.partition_key, r.attempts, r.last_attempted_at, "
            f"r.finished_at FROM r" + (f", {_pg_event_notify('r')}" if events else "")
        )
        if events:
            params += now_params  # the run time in the event's data
        params += [*now_params, *now_params]  # the metric's minute and run time
        if events:
            params.append(events_channel())
    by_id = {o.job_id: o for o in outcomes}

    def children_that_ended(rows: list[tuple[Any, ...]]) -> list[tuple[uuid.UUID, str, Any]]:
        out = []
        for r in rows:
            if r[3] is not None and r[2] in FINISHED_STATES:
                o = by_id[d.to_uuid(r[0])]
                value = o.return_value_json if r[2] == JobState.COMPLETED else (o.error or _cancelled_error(o.job_id))
                out.append((o.job_id, r[2], value))
        return out

    # A child's final state and its parent's progress are one change: one transaction when the
    # batch has flow children (Outcome.has_parent); plain autocommit otherwise (the hot path).
    flows = any(o.has_parent for o in outcomes)
    # SQLite writes the events and metrics with more statements: one transaction with them.
    with transaction.atomic(using=using) if flows or not d.pg else contextlib.nullcontext():
        with hot_cursor(using, generic=True) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            if not d.pg:
                _outcome_events_and_metrics(cursor, d, rows, by_id, finished_at)
        ended = children_that_ended(rows)
        if flows:
            settle_dependencies(using=using, finished=ended, now=now)
    if ended and not flows:
        # An outcome built without has_parent: still move the parents on, at once.
        logger.warning(
            "Outcomes of flow children %s came without has_parent; settling them now.", [e[0] for e in ended]
        )
        with transaction.atomic(using=using):
            settle_dependencies(using=using, finished=ended, now=now)
    row_of = {d.to_uuid(r[0]): r for r in rows}
    missing = [o for o in outcomes if o.job_id not in row_of] if len(row_of) < len(outcomes) else []
    if missing:
        earlier = _written_before(d, using, missing)
        rows = rows + earlier
        row_of.update((d.to_uuid(r[0]), r) for r in earlier)
    written: dict[uuid.UUID, str] = {}
    for o in outcomes:
        r = row_of.get(o.job_id)
        if r is not None:
            written[o.job_id] = r[2]
            o.finished_at = d.to_dt(r[7])
        else:
            logger.warning(
                "Dropped the %s outcome of job %s: it is no longer active under this lease "
                "(rescued, cancelled or released meanwhile).",
                o.state,
                o.job_id,
            )
    requeued = {r[1] for r in rows if r[2] == JobState.WAITING}
    turns = {(r[1], r[4]) for r in rows if r[4] is not None and r[2] in FINISHED_STATES}
    if turns:
        # Their partitions' next jobs may run now: one transaction for the batch (one commit, not
        # one per partition). After the outcomes' own commit: a crash in between leaves them
        # blocked for the PartitionSweeper.
        # Freeing is idempotent: after a lost connection it is tried once more on a new one
        # (outside a transaction) rather than left to the leader's sweeper, whose worker may be
        # the one that just died.
        tries = 1 if connections[using].in_atomic_block else 2
        for attempt in range(tries):
            try:
                with transaction.atomic(using=using), connections[using].cursor() as cursor:
                    if _unblock_heads(cursor, d, turns):
                        requeued |= {q for q, _ in turns}
                break
            except (OperationalError, InterfaceError) as exc:
                # The outcomes are committed; only this hint failed (a lock conflict, a lost
                # connection). Raising would make the completer write them again.
                if not is_transient(exc):
                    raise
                _drop_broken_connection(using)
                if attempt == tries - 1:
                    logger.info(
                        "Freeing the next jobs of %d partition(s) failed (%s); the sweeper will.", len(turns), exc
                    )
    if requeued:
        try:
            notify(using, sorted(requeued))
        except (OperationalError, InterfaceError) as exc:
            # Only a wake-up hint after the commit: workers also poll. Raising would make the
            # completer send the batch again.
            if not is_transient(exc):
                raise
            logger.info("Waking the workers of %s failed (%s); they will poll.", sorted(requeued), exc)
            _drop_broken_connection(using)
    return written


def _written_before(d: Dialect, using: str, outcomes: list[Outcome]) -> list[tuple[Any, ...]]:
    """Rows, shaped as the outcome statement returns them, of ``outcomes`` that an earlier try
    of the same batch already wrote: no longer active, still holding the outcome's lease token,
    in a state that outcome leads to, with its return value and (last) error."""
    ids_sql, ids_params = d.in_list("id", [d.uuid(o.job_id) for o in outcomes])
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT id, queue, state, parent_id, partition_key, attempts, last_attempted_at, finished_at, "
            f"lease_token, return_value, errors FROM {JOB_TABLE} WHERE {ids_sql} AND state <> 'active'",
            ids_params,
        )
        found = cursor.fetchall()
    by_id = {o.job_id: o for o in outcomes}

    def wrote(row: tuple[Any, ...]) -> bool:
        o = by_id[d.to_uuid(row[0])]
        value, errors = d.to_json(row[9]), d.to_json(row[10]) or []
        return (
            d.to_uuid(row[8]) == o.lease_token
            and row[2] in _SAME_OUTCOME[o.state]
            and value == (json.loads(o.return_value_json) if o.return_value_json is not None else None)
            and (o.error is None or (bool(errors) and errors[-1] == o.error))
        )

    return [r[:8] for r in found if wrote(r)]


#: The states a row written by an outcome can be found in later: the outcome's own, ``waiting``
#: once a delayed retry is due, ``cancelled`` when a cancel was requested (or came later).
_SAME_OUTCOME = {
    JobState.COMPLETED: {JobState.COMPLETED, JobState.CANCELLED},
    JobState.FAILED: {JobState.FAILED, JobState.CANCELLED},
    JobState.WAITING: {JobState.WAITING, JobState.CANCELLED},
    JobState.DELAYED: {JobState.DELAYED, JobState.WAITING, JobState.CANCELLED},
}


def _drop_broken_connection(using: str) -> None:
    """After a transient error outside a transaction, close the connection so the next statement
    opens a new one instead of failing on the broken one."""
    conn = connections[using]
    if not conn.in_atomic_block:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is dropped anyway
            logger.debug("closing a broken connection failed", exc_info=True)


def _outcome_events_and_metrics(
    cursor: Any, d: Dialect, rows: list[tuple[Any, ...]], by_id: dict[uuid.UUID, Outcome], now: datetime
) -> None:
    """SQLite: the events and Metric counts of written outcomes (PostgreSQL writes them in the
    outcome statement itself). ``rows``: id, queue, state, parent, partition, attempts, last start."""
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
    minute = now.replace(second=0, microsecond=0)
    for queue in sorted(metrics):
        completed, failed, retried, runtime_ms = metrics[queue]
        cursor.execute(
            f"INSERT INTO {METRIC_TABLE} (queue, minute, completed, failed, retried, runtime_ms) "
            f"VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (queue, minute) DO UPDATE SET "
            f"completed = completed + excluded.completed, failed = failed + excluded.failed, "
            f"retried = retried + excluded.retried, runtime_ms = runtime_ms + excluded.runtime_ms",
            [queue, d.dt(minute), completed, failed, retried, runtime_ms],
        )


def release_jobs(
    *,
    using: str,
    worker_id: str,
    job_ids: list[uuid.UUID] | None = None,
    lease_tokens: Collection[uuid.UUID] | None = None,
    now: datetime | None = None,
) -> int:
    """Return this worker's active jobs to ``waiting`` without counting the attempt (shutdown).

    ``job_ids``/``lease_tokens``: only those jobs, or the jobs of those claims (a claim whose
    answer was lost). Running it again changes nothing more, so a release whose own answer is
    lost can simply be repeated.

    The attempt and its worker id are taken back, so the next worker runs it as the same attempt.
    A job cancelled while it ran is not run again: it becomes ``cancelled``.
    """
    d = Dialect(using)
    now_sql, now_params = d.now(now)
    where = ["state = 'active'", "worker_id = %s"]
    params: list[Any] = [worker_id]
    for column, values in (("id", job_ids), ("lease_token", lease_tokens)):
        if values is None:
            continue
        if not values:
            return 0
        sql, p = d.in_list(column, [d.uuid(v) for v in values])
        where.append(sql)
        params += p
    sql = (
        f"UPDATE {JOB_TABLE} SET "
        f"state = CASE WHEN cancel_requested_at IS NULL THEN 'waiting' ELSE 'cancelled' END, "
        f"finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE {now_sql} END, "
        # A job handed back takes its attempt back; a cancelled one ends, its attempt counted.
        f"attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END, "
        f"worker_ids = CASE WHEN cancel_requested_at IS NULL THEN {d.json_pop('worker_ids')} ELSE worker_ids END, "
        f"started_at = CASE WHEN attempts <= 1 AND cancel_requested_at IS NULL THEN NULL ELSE started_at END, "
        f"lease_token = NULL, lease_expires_at = NULL "
        f"WHERE {' AND '.join(where)} RETURNING queue, state, id, parent_id"
    )
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql, [*now_params, *params])
        returned = cursor.fetchall()
        write_events(cursor, d, [(r[0], d.to_uuid(r[2]), "released", {}) for r in returned if r[1] == JobState.WAITING])
        _finished_elsewhere(
            cursor, d, [d.to_uuid(r[2]) for r in returned if r[1] == JobState.CANCELLED], "finished", now
        )
        ended = [d.to_uuid(r[2]) for r in returned if r[1] == JobState.CANCELLED and r[3] is not None]
        settle_dependencies(
            using=using, finished=[(j, JobState.CANCELLED, _cancelled_error(j)) for j in ended], now=now
        )
    rows = [r for r in returned if r[1] == JobState.WAITING]
    notify(using, sorted({r[0] for r in rows}))
    return len(rows)


def _cancelled_error(job_id: uuid.UUID) -> dict[str, str]:
    return {
        "exception_class_path": "django_jobs.exceptions.JobCancelled",
        "traceback": f"django_jobs.exceptions.JobCancelled: job {job_id} was cancelled.\n",
    }


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
                _finished_elsewhere(cursor, Dialect(using), [job_id], "cancelled", now)
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


#: NOTIFY payload prefix of "this running job was cancelled" (followed by the job id).
CANCEL_PREFIX = "!cancel:"


def cancel_requested_ids(*, using: str, worker_id: str) -> list[uuid.UUID]:
    """Ids of ``worker_id``'s running jobs that were cancelled (the worker's poll for cancels)."""
    d = Dialect(using)
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


def _partitions_of(using: str, job_ids: list[uuid.UUID], *, unfinished: bool = False) -> set[tuple[str, str]]:
    """(queue, partition) of the partitioned jobs among ``job_ids`` (only unfinished ones)."""
    jobs = Job.objects.using(using).filter(id__in=job_ids, partition_key__isnull=False)
    if unfinished:
        jobs = jobs.exclude(state__in=FINISHED_STATES)
    return set(jobs.values_list("queue", "partition_key"))


def _unblock_partitions(using: str, keys: set[tuple[str, str]]) -> int:
    """Let the next jobs of these partitions run now (after a cancel, delete or retry changed
    which job is next, or when the sweeper finds one stuck) and wake their queues' workers."""
    if not keys:
        return 0
    with connections[using].cursor() as cursor:
        freed = _unblock_heads(cursor, Dialect(using), keys)
    if freed:
        notify(using, sorted({q for q, _ in keys}))
    return freed


def _unblock_partitions_of(using: str, job_ids: list[uuid.UUID]) -> None:
    _unblock_partitions(using, _partitions_of(using, job_ids))


def is_cancel_requested(*, using: str, job_id: uuid.UUID) -> bool:
    return Job.objects.using(using).filter(id=job_id, cancel_requested_at__isnull=False).exists()


def set_progress(*, using: str, job_id: uuid.UUID, lease_token: uuid.UUID, value: Any) -> bool:
    """Store a running job's progress, guarded on its lease, with its ``progress`` event; False
    when the job is no longer ours."""
    d = Dialect(using)
    events = events_enabled()
    update = (
        f"UPDATE {JOB_TABLE} SET progress = {d.cast('%s', 'jsonb')} WHERE id = %s AND state = 'active' "
        f"AND lease_token = %s RETURNING id, queue"
    )
    params: list[Any] = [json.dumps(value), d.uuid(job_id), d.uuid(lease_token)]
    if d.pg and events:
        # The update and its event in one statement, as on the other hot paths.
        data = "jsonb_build_object('progress', %s::jsonb)"
        update = (
            f"WITH r AS ({update}), {_pg_event_cte('r', "'progress'", data)} SELECT 1 FROM r, {_pg_event_notify('r')}"
        )
        params += [json.dumps(value), events_channel()]
    with _sqlite_atomic(d), connections[using].cursor() as cursor:
        cursor.execute(update, params)
        row = cursor.fetchone()
        if row is None:
            return False
        if not d.pg:
            write_events(cursor, d, [(row[1], job_id, "progress", {"progress": value})])
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

    d = Dialect(using)
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
    # PostgreSQL: writers of one job queue up on a transaction-level advisory lock keyed by the
    # job, so they do not keep colliding on the unique position (one could starve the other).
    lock_key = int.from_bytes(job_id.bytes[8:], "big", signed=True)
    for _ in range(20):
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                if d.pg:
                    cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key])
                cursor.execute(sql, params)
                return cursor.rowcount == 1
        except IntegrityError:
            continue  # another thread of the same job took this position; compute the next one
    logger.warning("Could not append a log line to job %s after 20 tries; dropped.", job_id)
    return False


def renew_leases(
    *, using: str, lease_tokens: Collection[uuid.UUID], lease_seconds: float, now: datetime | None = None
) -> int:
    """Extend the leases of the active jobs claimed with ``lease_tokens``; return how many.

    By token, not by worker: a worker renews only the leases it knows it holds. A row that a
    claim took while its answer was lost is not renewed, so it is released or rescued instead of
    staying active under a live worker that never runs it.
    """
    if not lease_tokens:
        return 0
    d = Dialect(using)
    lease_sql, lease_params = d.now_plus(now, lease_seconds)
    tokens_sql, tokens_params = d.in_list("lease_token", [d.uuid(t) for t in lease_tokens])
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET lease_expires_at = {lease_sql} WHERE state = 'active' AND {tokens_sql}",
            [*lease_params, *tokens_params],
        )
        return cursor.rowcount


# -- flows ----------------------------------------------------------------------------------


@dataclass(slots=True)
class FlowJob:
    """One job of a flow, validated by the caller; :func:`insert_flow` stores a list of them."""

    id: uuid.UUID
    backend: str
    queue: str
    task_path: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    max_attempts: int
    options: dict[str, Any]
    run_after: datetime | None
    lifo: bool
    #: Its parent in the flow (None for the root), and what its failure does to that parent.
    parent_id: uuid.UUID | None
    failure_policy: str
    #: How many children it waits for (0: a leaf, ready at once).
    children: int
    trace_id: str | None = None
    partition: str | None = None


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
    from .models import JobDependency

    d = Dialect(using)
    enqueued_at = now
    now = now or timezone.now()
    with transaction.atomic(using=using):
        if enqueued_at is None and d.pg:
            with connections[using].cursor() as cursor:
                cursor.execute("SELECT now()")
                enqueued_at = d.to_dt(cursor.fetchone()[0])
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
            job = _new_job(
                backend=fj.backend,
                task_path=fj.task_path,
                queue=fj.queue,
                priority=fj.priority,
                args=fj.args,
                kwargs=fj.kwargs,
                max_attempts=fj.max_attempts,
                options=fj.options,
                run_after=fj.run_after,
                lifo=fj.lifo,
                now=now,
                trace_id=fj.trace_id,
                partition=fj.partition,
                enqueued_at=enqueued_at,
            )
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
                _admit(cursor, Dialect(using), queue, adding[queue])
            Job.objects.using(using).bulk_create(rows)
            write_events(cursor, Dialect(using), [(j.queue, j.id, "enqueued", _enqueued_data(j)) for j in rows], now)
            _unblock_heads(cursor, Dialect(using), {(j.queue, j.partition_key) for j in rows if j.partition_key})
        edges = [
            JobDependency(
                parent_id=fj.parent_id, child_id=fj.id, child_queue=fj.queue, failure_policy=fj.failure_policy
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
    d = Dialect(using)
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
            cursor.execute(
                f"UPDATE {dep_table} SET status = CASE WHEN %s = 1 THEN 'processed' "
                f"WHEN failure_policy = 'ignore' THEN 'ignored' WHEN failure_policy = 'remove' THEN 'removed' "
                f"ELSE 'failed' END, value = {d.cast('%s', 'jsonb')}, finished_at = %s "
                f"WHERE child_id = %s AND status = 'pending' RETURNING parent_id, failure_policy, status",
                [1 if ok else 0, value_json, d.dt(now), d.uuid(child_id)],
            )
            edge = cursor.fetchone()
            if edge is None:
                continue  # not a flow child, or settled already
            parent_id, policy, status = d.to_uuid(edge[0]), edge[1], edge[2]
            decrement = "pending_children = CASE WHEN pending_children > 0 THEN pending_children - 1 ELSE 0 END"
            if status == "failed" and policy == "fail":
                error = {
                    "exception_class_path": "django_jobs.exceptions.ChildFailed",
                    "traceback": f"django_jobs.exceptions.ChildFailed: child job {child_id} ended {state}; "
                    f"the parent fails with it (failure_policy='fail').\n\n"
                    f"The child's error:\n{(value or {}).get('traceback', '')}",
                    "child_id": str(child_id),
                    "at": now.isoformat(),
                }
                cursor.execute(
                    f"UPDATE {JOB_TABLE} SET {decrement}, state = 'failed', finished_at = %s, "
                    f"errors = {d.json_append('errors', d.cast('%s', 'jsonb'))} "
                    f"WHERE id = %s AND state = 'waiting-children' RETURNING id",
                    [d.dt(now), json.dumps(error), d.uuid(parent_id)],
                )
                if cursor.fetchone() is not None:
                    work.append((parent_id, JobState.FAILED, error))
                    _finished_elsewhere(cursor, d, [parent_id], "failed", now)
                else:
                    cursor.execute(f"UPDATE {JOB_TABLE} SET {decrement} WHERE id = %s", [d.uuid(parent_id)])
                continue
            # Released when the last child is done, or at once by a failure under "continue".
            release = "(state = 'waiting-children' AND (pending_children <= 1 OR %s = 1))"
            early = 1 if status == "failed" and policy == "continue" else 0
            # Its state before (row-locked, as the UPDATE would): only a release writes an event.
            cursor.execute(
                f"SELECT state FROM {JOB_TABLE} WHERE id = %s {'FOR UPDATE' if d.pg else ''}", [d.uuid(parent_id)]
            )
            before = cursor.fetchone()
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET "
                # A parent with a run_after still ahead is released to delayed, keeping its time
                # (and the seq it got for it); otherwise it is ready now.
                f"available_at = CASE WHEN {release} AND available_at < %s THEN %s ELSE available_at END, "
                f"seq = CASE WHEN {release} AND available_at <= %s THEN (CASE WHEN seq < 0 THEN %s ELSE %s END) "
                f"ELSE seq END, "
                f"state = CASE WHEN {release} THEN (CASE WHEN available_at > %s THEN 'delayed' ELSE 'waiting' END) "
                f"ELSE state END, "
                f"{decrement} WHERE id = %s RETURNING state, queue, pending_children",
                [
                    early,
                    d.dt(now),
                    d.dt(now),
                    early,
                    d.dt(now),
                    -seq_now,
                    seq_now,
                    early,
                    d.dt(now),
                    d.uuid(parent_id),
                ],  # fmt: skip
            )
            row = cursor.fetchone()
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
    from .models import DependencyStatus

    out: dict[str, dict[str, Any]] = {"results": {}, "failures": {}}
    rows = (
        JobDependency.objects.using(using)
        .filter(parent_id=parent_id)
        .exclude(status__in=[DependencyStatus.PENDING, DependencyStatus.REMOVED])
    )
    for child_id, status, value in rows.order_by("finished_at", "id").values_list("child_id", "status", "value"):
        key = "results" if status == DependencyStatus.PROCESSED else "failures"
        out[key][str(child_id)] = value
    return out


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
            _finished_elsewhere(cursor, Dialect(using), [j for j, _ in cancelled], "cancelled", now)
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


def _notify_cancel(using: str, job_ids: list[uuid.UUID]) -> None:
    """Tell the workers running these jobs that they were cancelled (PostgreSQL; others poll)."""
    conn = connections[using]
    if conn.vendor != "postgresql" or not job_ids:
        return
    channel = get_settings().NOTIFY_CHANNEL
    with conn.cursor() as cursor:
        for job_id in job_ids:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, f"{CANCEL_PREFIX}{job_id}"])


# -- schedules ------------------------------------------------------------------------------


_UNSET: Any = object()


def advance_schedule(
    *,
    using: str,
    schedule_id: int,
    due: datetime,
    next_run_at: datetime | None,
    job: Job | None,
    next_if_refused: datetime | None = _UNSET,
    now: datetime | None = None,
) -> str | None:
    """Move a schedule from its tick ``due`` to ``next_run_at`` and, with ``job``, insert that
    tick's job, in one transaction. Returns ``"fired"``, ``"skipped"`` (no ``job``: the catch-up
    policy skipped the tick), ``"refused"`` (the queue was full: no job, the tick does not count
    and the schedule moves to ``next_if_refused`` instead, default ``next_run_at``), or None when
    another worker moved it first.

    The compare-and-set on ``next_run_at`` makes one worker win each tick; the job's unique
    ``scheduler_key`` (schedule, tick) is the constraint behind it, so even a stale worker cannot
    insert a tick twice.
    """
    from .models import Schedule

    given_now, now = now, now or timezone.now()
    rows = Schedule.objects.using(using).filter(id=schedule_id)
    with transaction.atomic(using=using):
        if not rows.filter(next_run_at=due, enabled=True).update(next_run_at=next_run_at):
            return None
        if job is None:
            return "skipped"
        job.seq = ready_seq(job.available_at, bool(job.options.get("lifo")))
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                _admit(cursor, Dialect(using), job.queue, {job.partition_key: 1})
                job.blocked = job.partition_key is not None
                if given_now is None and Dialect(using).pg:
                    # The database's clock, as for every enqueue and the job's later times (a
                    # tick is rare: one round trip more is nothing here).
                    cursor.execute("SELECT now()")
                    job.enqueued_at = cursor.fetchone()[0]
                Job.objects.using(using).bulk_create([job], ignore_conflicts=True)
                if Job.objects.using(using).filter(id=job.id).exists():  # not a tick's second job
                    write_events(cursor, Dialect(using), [(job.queue, job.id, "enqueued", _enqueued_data(job))], now)
                if job.partition_key is not None:
                    _unblock_heads(cursor, Dialect(using), {(job.queue, job.partition_key)})
        except QueueFull as exc:
            # Backpressure wins over the schedule: this tick is skipped (not counted against its
            # limit), the next one tries again.
            logger.warning("Schedule %s: the job of its tick %s was not enqueued: %s", schedule_id, due, exc)
            if next_if_refused is not _UNSET and next_if_refused != next_run_at:
                rows.update(next_run_at=next_if_refused)
            return "refused"
        rows.update(iterations=F("iterations") + 1, last_run_at=now)
    if job.state == JobState.WAITING:
        notify(using, [job.queue])
    return "fired"


# -- queue control ----------------------------------------------------------------------------


def set_queue_paused(*, using: str, queue: str, paused: bool) -> None:
    """Pause or resume ``queue`` for every worker (the claim skips paused queues)."""
    update_queue_state(using=using, queue=queue, changes={"paused": paused})
    if not paused:
        notify(using, [queue])  # wake the workers that skipped it


def update_queue_state(*, using: str, queue: str, changes: dict[str, Any]) -> None:
    """Write ``changes`` (validated QueueState columns) to ``queue``'s row, creating it; a removed
    rate limit drops its start log. Wakes the queue's workers: a loosened limit lets jobs start."""
    if not changes:
        return
    with transaction.atomic(using=using):
        was = QueueState.objects.using(using).select_for_update().filter(name=queue).values_list("paused", flat=True)
        was_paused = bool(was.first())
        QueueState.objects.using(using).update_or_create(name=queue, defaults=changes)
        if "paused" in changes and bool(changes["paused"]) != was_paused:
            _job_events(using, [(queue, None, "paused" if changes["paused"] else "resumed", {})])
        starts = JobStart.objects.using(using).filter(queue=queue)
        if "rate_limit" in changes and changes["rate_limit"] is None:
            starts.filter(partition_key="").delete()
        if "partition_rate_limit" in changes and changes["partition_rate_limit"] is None:
            starts.exclude(partition_key="").delete()
        if (changes.get("partition_concurrency") or 1) > 1:
            # More of each partition may run now: unblock them (one pass over its blocked jobs).
            blocked = (
                Job.objects.using(using)
                .filter(queue=queue, blocked=True, state__in=UNFINISHED_STATES)
                .order_by()
                .values_list("partition_key", flat=True)
                .distinct()
            )
            _unblock_partitions(using, {(queue, p) for p in blocked if p is not None})
    notify(using, [queue])


def sync_queue_declarations(*, using: str, declared: dict[str, dict[str, Any]], columns_for: Any) -> int:
    """Apply ``DJANGO_JOBS["QUEUES"]`` (``{queue: {key: value}}``, validated and JSON-shaped) to
    the QueueState rows; return how many queues changed.

    Per queue, a key is written when its declared value differs from the one declared last time
    (the row keeps that in ``declared``), so a runtime edit survives restarts until the settings
    change; a key declared last time but not now (or a whole queue no longer declared) goes back
    to no limit. ``columns_for(**{key: value})`` turns keys into columns (a rate limit is one key,
    two columns, always written together). Each queue in one transaction with its ``declared``.
    """
    changed = 0
    rows = QueueState.objects.using(using).values_list("name", "declared")  # a small table
    names = set(declared) | {name for name, was in rows if was}
    for name in sorted(names):
        now_declared = declared.get(name, {})
        with transaction.atomic(using=using):
            row, _ = QueueState.objects.using(using).select_for_update().get_or_create(name=name)
            before = row.declared or {}
            keys = {k: v for k, v in now_declared.items() if k not in before or before[k] != v}
            keys.update({k: (False if k == "paused" else None) for k in before if k not in now_declared})
            if not keys and before == now_declared:
                continue
            QueueState.objects.using(using).filter(name=name).update(declared=now_declared)
            if keys:
                update_queue_state(using=using, queue=name, changes=columns_for(**keys))
                changed += 1
    return changed


def is_queue_paused(*, using: str, queue: str) -> bool:
    return QueueState.objects.using(using).filter(name=queue, paused=True).exists()


def queue_counts(*, using: str, backend: str, queue: str) -> dict[str, int]:
    """``{state: n}`` of the queue's unfinished jobs (each state has its partial index)."""
    counts = {s: 0 for s in (JobState.WAITING, JobState.DELAYED, JobState.ACTIVE, JobState.WAITING_CHILDREN)}
    rows = (
        Job.objects.using(using)
        .filter(backend=backend, queue=queue, state__in=list(counts))
        .values_list("state")
        .annotate(n=models.Count("id"))
        .order_by()
    )
    for state, n in rows:
        counts[state] = n
    return counts


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


# -- retention ------------------------------------------------------------------------------

_FINISHED_SQL = "('completed', 'failed', 'cancelled')"


def _prunable(d: Dialect, now_sql: str) -> str:
    """What a finished job ``j`` needs to be deleted besides its policy: no dedup key of its
    that still holds (``Dedup(ttl=...)`` holds whatever the job's state), and no unfinished
    flow child (a worker finishing that child locks its edge, then the parent: deleting the
    parent first would take those locks the other way round)."""
    return (
        f"NOT EXISTS (SELECT 1 FROM {DEDUP_TABLE} k WHERE k.job_id = j.id AND k.expire_at > {now_sql}) "
        f"AND NOT EXISTS (SELECT 1 FROM {JOB_TABLE} c WHERE c.parent_id = j.id AND c.state IN {UNFINISHED_SQL})"
    )


def _delete_finished(cursor: Any, d: Dialect, select_ids: str, params: list[Any]) -> int:
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
    d = Dialect(using)
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
    d = Dialect(using)
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
    d = Dialect(using)
    total = 0
    for queue in _distinct_queues(using, EVENT_TABLE):
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
    d = Dialect(using)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {METRIC_TABLE} WHERE "
            + d.id_in(f"SELECT id FROM {METRIC_TABLE} WHERE minute < %s ORDER BY minute LIMIT %s"),
            [d.dt(older_than), limit],
        )
        return cursor.rowcount


def _distinct_queues(using: str, table: str) -> list[str]:
    """The distinct ``queue`` values of ``table`` by a loose index scan (one probe of an index
    leading with ``queue`` per queue), not a scan of every row."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE q(queue) AS (SELECT MIN(queue) FROM {table} UNION ALL "
            f"SELECT (SELECT MIN(t.queue) FROM {table} t WHERE t.queue > q.queue) FROM q WHERE q.queue IS NOT NULL) "
            f"SELECT queue FROM q WHERE queue IS NOT NULL"
        )
        return [row[0] for row in cursor.fetchall()]


def known_queues(*, using: str) -> list[str]:
    """Queues with a QueueState row or Metric rows (finished jobs lately): cheap to list, unlike
    the distinct queues of the job table."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT name FROM {QUEUE_TABLE}")
        names = {row[0] for row in cursor.fetchall()}
    return sorted(names | set(_distinct_queues(using, METRIC_TABLE)))


# -- services -------------------------------------------------------------------------------


def promote_due_jobs(*, using: str, limit: int, backend: str | None = None, now: datetime | None = None) -> int:
    """Move up to ``limit`` delayed jobs whose time has come (of ``backend``, or all) to
    ``waiting``; return how many."""
    d = Dialect(using)
    now_sql, now_params = d.now(now)
    scope, scope_params = _backend_scope(backend)
    sql = (
        f"UPDATE {JOB_TABLE} SET state = 'waiting' WHERE "
        + d.id_in(
            f"SELECT id FROM {JOB_TABLE} WHERE state = 'delayed' AND available_at <= {now_sql}{scope} "
            f"ORDER BY available_at LIMIT %s {d.skip_locked()}"
        )
        + " AND state = 'delayed' RETURNING queue, id"
    )
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql, [*now_params, *scope_params, limit])
        rows = cursor.fetchall()
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


def _backend_scope(backend: str | None) -> tuple[str, list[Any]]:
    return (" AND backend = %s", [backend]) if backend is not None else ("", [])


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
    d = Dialect(using)
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
    sql = (
        f"UPDATE {JOB_TABLE} SET stalled_count = stalled_count + 1, "
        f"state = CASE WHEN {cancel} THEN 'cancelled' WHEN {fail} THEN 'failed' ELSE 'waiting' END, "
        f"attempts = CASE WHEN {end} THEN attempts ELSE attempts - 1 END, "
        f"worker_ids = CASE WHEN {end} THEN worker_ids ELSE {d.json_pop('worker_ids')} END, "
        f"started_at = CASE WHEN {end} OR attempts > 1 THEN started_at ELSE NULL END, "
        f"errors = CASE WHEN {fail} AND NOT {cancel} THEN {d.json_append('errors', d.cast('%s', 'jsonb'))} "
        f"ELSE errors END, "
        f"finished_at = CASE WHEN {end} THEN {now_sql} ELSE NULL END, "
        f"lease_token = NULL, lease_expires_at = NULL "
        "WHERE "
        + d.id_in(
            f"SELECT id FROM {JOB_TABLE} WHERE state = 'active' AND lease_expires_at < {now_sql}{scope} "
            f"ORDER BY lease_expires_at LIMIT %s {d.skip_locked()}"
        )
        + f" AND state = 'active' AND lease_expires_at < {now_sql} RETURNING id, queue, backend, state, parent_id"
    )
    params = [json.dumps(error), *now_params, *now_params, *scope_params, limit, *now_params]
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        returned = cursor.fetchall()
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


def register_worker(
    *, using: str, worker_id: str, backend: str, queues: list[str] | None, concurrency: int, pid: int
) -> None:
    now = timezone.now()
    Worker.objects.using(using).update_or_create(
        id=worker_id,
        defaults={
            "backend": backend,
            "hostname": socket.gethostname()[:255],
            "pid": pid,
            "queues": queues or ["*"],
            "concurrency": concurrency,
            "started_at": now,
            "heartbeat_at": now,
        },
    )


def heartbeat_worker(*, using: str, worker_id: str, now: datetime | None = None) -> bool:
    """Record that the worker is alive; False when its row was removed (it looked dead)."""
    return Worker.objects.using(using).filter(id=worker_id).update(heartbeat_at=now or timezone.now()) == 1


def unregister_worker(*, using: str, worker_id: str) -> None:
    Worker.objects.using(using).filter(id=worker_id).delete()


def remove_dead_workers(
    *, using: str, older_than: timedelta, backend: str | None = None, now: datetime | None = None
) -> int:
    cutoff = (now or timezone.now()) - older_than
    qs = Worker.objects.using(using).filter(heartbeat_at__lt=cutoff)
    if backend is not None:
        qs = qs.filter(backend=backend)
    deleted, _ = qs.delete()
    return deleted


def leader_id(*, using: str, backend: str, alive_within: timedelta, now: datetime | None = None) -> str | None:
    """The oldest live worker of ``backend`` leads the leader-only services."""
    cutoff = (now or timezone.now()) - alive_within
    return (
        Worker.objects.using(using)
        .filter(backend=backend, heartbeat_at__gte=cutoff)
        .order_by("started_at", "id")
        .values_list("id", flat=True)
        .first()
    )

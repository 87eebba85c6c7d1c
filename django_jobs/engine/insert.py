"""Inserting jobs: one job (``insert_new_job``, in the caller's transaction) and many
(``insert_jobs``, constant-shape JSON-array statements in chunks)."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.utils import timezone

from ..conf import get_settings
from ..drivers import DRIVERS, Driver, driver
from ..drivers.inserts import MANY_ROW_PARAMS, MANY_SHARED_PARAMS
from ..models import Job
from ..spec.newjob import NewJob
from ..spec.tracing import trace_id_for_new_job
from ..states import JobState
from ..uuid7 import uuid7, uuid7_hex, uuid7_many
from .common import (
    INSERT_CHUNK,
    NewRow,
    _mark_saved,
    events_channel,
    events_enabled,
    ready_seq,
)
from .effects import (
    _enqueued_event,
    _first_notify_in_transaction,
    _sent_in_transaction,
)
from .partitions import _admit, _unblock_heads
from .size_limits import size_limited


def insert_job(job: NewJob, *, using: str, now: datetime | None = None) -> Job:
    """Insert ``job`` in the caller's transaction, as :func:`insert_new_job` (same arguments),
    and return it as a saved ``Job``."""
    saved = _as_job(insert_new_job(job, using=using, now=now))
    _mark_saved(saved, using)
    return saved


def insert_new_job(job: NewJob, *, using: str, now: datetime | None = None) -> NewRow:
    """Insert ``job`` in the caller's transaction (waiting, or delayed until its ``run_after``);
    return the row written as a :class:`NewRow` (``JobsBackend.enqueue`` reads a few of its
    values; building a ``Job`` cost more than that: :func:`insert_job` returns one).

    ``job.lifo``: the job is claimed before the FIFO jobs of its priority, newest first (see
    :func:`ready_seq`). ``job.trace_id`` ``None``: the running job's, or a new one
    (:func:`django_jobs.tracing.trace_id_for_new_job`). ``job.partition``: the job runs after the
    earlier jobs of its (queue, partition) finished. Raises QueueFull when the queue (or
    partition) has a size limit the job would pass; nothing is inserted then.

    ``enqueued_at`` is ``now`` when given, else the database clock on PostgreSQL (the clock of
    ``started_at`` and ``finished_at``), read back by the INSERT itself; this process's on SQLite.
    """
    d = driver(using)
    row = _new_row(job, now=now, database_clock=d.DATABASE_CLOCK)
    conn = d.connection
    limited = size_limited(conn, row.queue, get_settings().SIZE_LIMITS_REFRESH)
    wake = row.state == JobState.WAITING and d.LISTEN_NOTIFY and _first_notify_in_transaction(conn, row.queue)
    with d.effects_atomic(), d.cursor(hot=True) as cursor:
        # The common case in one statement: a queue this process knows has no size limit gets a
        # bare INSERT (engine.size_limits); with SIZE_LIMITS_REFRESH = 0 the INSERT carries its
        # own "the queue has no size limit" guard (a primary-key probe), no extra round trip.
        if not limited and _insert_job(cursor, d, row, wake=wake, guarded=limited is None):
            _enqueued_event(cursor, d, row)
            if row.partition_key is not None:
                _unblock_heads(cursor, d, {(row.queue, row.partition_key)})
            return row
        if wake and conn.in_atomic_block and not conn.savepoint_ids:
            _sent_in_transaction(conn).discard(row.queue)  # no NOTIFY went with a row
        with transaction.atomic(using=using):
            _insert_new(cursor, d, using, row, wake=True)
    return row


class PlainJob(NamedTuple):
    """What every job of one task shares when it has no ``run_after``, partition, dedup or
    idempotency key: :func:`insert_plain_job` adds the arguments, an id and the times. Made once
    per task by ``JobsBackend.enqueue`` (from a validated task), reused for each of its jobs."""

    using: str
    backend: str
    queue: str
    task_path: str
    priority: int
    max_attempts: int
    options_json: str
    lifo: bool
    #: The task's own trace id (``.using(trace_id=...)``); None: the running job's, or a new one.
    trace_id: str | None
    #: The settings' NOTIFY channel, and the events' (None: EVENTS off), read when it was made.
    notify_channel: str
    events_channel: str | None
    #: The settings' SIZE_LIMITS_REFRESH (engine.size_limits).
    size_limits_refresh: float


def plain_job(
    *, using: str, backend: str, queue: str, task_path: str, priority: int, max_attempts: int,
    options: dict[str, Any], lifo: bool, trace_id: str | None,
) -> PlainJob | None:  # fmt: skip
    """The :class:`PlainJob` of a task with these fields, or None where :func:`insert_plain_job`
    does not serve ``using``: it needs an INSERT that carries the job's event and stamps the
    database clock (PostgreSQL); elsewhere :func:`insert_new_job` does it all. Reads the
    settings now: make a new one when they change."""
    d = driver(using)
    if not (d.FUSED_EFFECTS and d.DATABASE_CLOCK):
        return None
    return PlainJob(
        using, backend, queue, task_path, priority, max_attempts, _json(options), lifo, trace_id,
        get_settings().NOTIFY_CHANNEL, events_channel() if events_enabled() else None,
        get_settings().SIZE_LIMITS_REFRESH,
    )  # fmt: skip


def insert_plain_job(
    plain: PlainJob, connection: Any, args_json: str, kwargs_json: str
) -> tuple[str, datetime, str] | None:
    """Insert one waiting job of ``plain`` with these arguments (JSON the caller validated) in
    the caller's transaction on ``connection`` (``connections[plain.using]``, which the caller
    also needs): :func:`insert_new_job`'s statement (the row, its ``enqueued`` event, the
    NOTIFYs, the queue's size-limit guard; prepared), without building a :class:`NewJob` or a
    :class:`NewRow` first. Only where :func:`plain_job` made ``plain``.

    ``enqueue()`` of a plain job is a hot path bound by the client's Python as much as by the
    database: this path is what that costs, and no more. Returns ``(id as text, enqueued_at,
    trace_id)``, or None when the queue has a size limit: nothing was inserted, and the caller
    goes through :func:`insert_new_job`, which admits the job under the queue's lock.
    """
    queue = plain.queue
    limited = size_limited(connection, queue, plain.size_limits_refresh)
    if limited:
        return None
    d = DRIVERS[connection.vendor](plain.using, connection)
    now = timezone.now()
    # The id as 32 hex digits, made once: the id's parameter (PostgreSQL's uuid input takes
    # them), the trace id of a job enqueued alone, and the id's text.
    hex_id = uuid7_hex()
    trace_id = trace_id_for_new_job(plain.trace_id, own=hex_id)
    wake = _first_notify_in_transaction(connection, queue)
    # drivers.inserts.PLAIN_PARAMS; enqueued_at is the database clock.
    params = [
        hex_id, queue, plain.task_path, args_json, kwargs_json, plain.priority, now, plain.options_json,
        plain.max_attempts, ready_seq(now, plain.lifo), trace_id,
    ]  # fmt: skip
    guarded = limited is None
    if guarded:
        params.append(queue)
    inserted, stored = d.insert_plain_job(
        plain.backend,
        params,
        notify_channel=plain.notify_channel if wake else None,
        events_channel=plain.events_channel,
        guarded=guarded,
    )
    if not inserted:
        if wake and connection.in_atomic_block and not connection.savepoint_ids:
            _sent_in_transaction(connection).discard(queue)  # that NOTIFY went with no row
        return None
    return id_text(hex_id), d.to_dt(stored), trace_id


def id_text(hex_id: str) -> str:
    """``str(uuid.UUID(hex_id))`` of 32 lower-case hex digits, without making the UUID."""
    return f"{hex_id[:8]}-{hex_id[8:12]}-{hex_id[12:16]}-{hex_id[16:20]}-{hex_id[20:]}"


def _new_job(job: NewJob, **row: Any) -> Job:
    """The unsaved ``Job`` of ``job``: :func:`_new_row`'s arguments, its row."""
    return _as_job(_new_row(job, **row))


def _new_row(
    job: NewJob,
    *,
    now: datetime | None,
    dedup_key: str | None = None,
    idempotency_key: str | None = None,
    enqueued_at: datetime | None = None,
    database_clock: bool = False,
) -> NewRow:
    """The row of ``job``: waiting, or delayed until its ``run_after`` when that is after
    ``now``; ``enqueued_at`` defaults to ``now``. The one place a :class:`NewJob`'s fields
    become columns: a new job option is a line here and one in the INSERT.

    ``database_clock`` (PostgreSQL): when neither ``enqueued_at`` nor ``now`` is given, leave
    ``enqueued_at`` None for the INSERT to stamp with the database's ``now()`` and read back
    (:func:`~django_jobs.drivers.inserts.insert_sql`). That is the clock claims and outcomes stamp ``started_at`` and
    ``finished_at`` with, and, being the transaction's start, it keeps a job enqueued and run in
    one transaction (a test) from starting before it was enqueued. The state and ``seq`` still
    come from this process's clock: a FIFO or LIFO order needs distinct times within one
    transaction, which ``now()`` is not.
    """
    given = enqueued_at or now
    now = now or timezone.now()
    run_after = job.run_after
    delayed = run_after is not None and run_after > now
    available_at = run_after if delayed else now
    partition = job.partition
    job_id = uuid7()
    return NewRow(
        id=job_id,
        backend=job.backend,
        queue=job.queue,
        task_path=job.task_path,
        args=job.args,
        kwargs=job.kwargs,
        state=JobState.DELAYED if delayed else JobState.WAITING,
        priority=job.priority,
        available_at=available_at,
        options=job.options,
        max_attempts=job.max_attempts,
        enqueued_at=given if given is not None or database_clock else now,
        seq=ready_seq(available_at, job.lifo),
        trace_id=trace_id_for_new_job(job.trace_id, own=job_id),
        dedup_key=dedup_key,
        idempotency_key=idempotency_key,
        partition_key=partition,
        # Blocked until _unblock_heads finds it is its partition's next job (right after insert).
        blocked=partition is not None,
    )


def _as_job(row: NewRow) -> Job:
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
    whether a :class:`NewRow` has it, its default, and whether that is a function to call for
    every job, as Django calls it (a callable default such as ``list``, so no two jobs share a
    list). A constant default (None, 0, a string, a bool) is read once."""
    in_row = set(NewRow.__slots__)
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


def _insert_params(d: Driver, job: Job | NewRow) -> list[Any]:
    """The parameters of :func:`~django_jobs.drivers.inserts.insert_sql` for ``job``, in its column order."""
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


def _set_enqueued_at(d: Driver, job: Job | NewRow, value: Any) -> None:
    """``job.enqueued_at`` as its INSERT stored it (PostgreSQL: possibly the database clock)."""
    job.enqueued_at = d.to_dt(value)


class InsertedJobs(NamedTuple):
    """What :func:`insert_jobs` inserted."""

    #: The new jobs' ids, in the order of the rows given.
    ids: list[uuid.UUID]
    #: The ``enqueued_at`` every one of them got (None when no row was given).
    enqueued_at: datetime | None
    #: The queue has a size limit (each chunk is admitted); False: the later chunks of the
    #: batch skip the probe.
    limited: bool = True
    #: ``str()`` of each id (a result's id), made once for the driver and the caller.
    texts: Sequence[str] = ()


def _rows_per_statement(conn: Any) -> int:
    limit = conn.features.max_query_params  # None on PostgreSQL (65,535, far above a chunk)
    if limit is None:
        return INSERT_CHUNK
    return max(1, min(INSERT_CHUNK, (limit - MANY_SHARED_PARAMS) // MANY_ROW_PARAMS))


def insert_jobs(
    job: NewJob,
    *,
    using: str,
    rows: list[tuple[str, str]],
    now: datetime | None = None,
    position: int = 0,
    database_clock: bool = False,
    after: InsertedJobs | None = None,
) -> InsertedJobs:
    """Insert jobs of one task in the caller's transaction, one multi-row INSERT per
    :data:`INSERT_CHUNK` rows; return their ids in the order of ``rows`` and the
    ``enqueued_at`` they all got.

    ``job``: what every job shares (backend, task, queue, priority, options, run_after, lifo,
    trace id, partition); its ``args`` and ``kwargs`` are not read. ``rows``: ``(args JSON,
    kwargs JSON)`` per job, already validated by the caller. Every job gets the state
    :func:`insert_job` would give it (delayed until ``run_after`` when that is after ``now``,
    else waiting), the same ``enqueued_at`` and the same ``options``.
    ``now``: None is this process's clock for the state and ``seq``, and for ``enqueued_at``
    the database clock on PostgreSQL (as :func:`insert_job`), read back by the INSERT.
    ``database_clock``: ``enqueued_at`` from the database clock on PostgreSQL even though
    ``now`` is given (``enqueue_many`` gives one ``now`` so its chunks agree on the state).
    ``position``: where ``rows[0]`` stands in the caller's whole batch. FIFO jobs of one batch
    share a seq and keep their order by id; LIFO jobs get ``seq - position`` so the last one
    given runs first, as if each were enqueued a microsecond after the one before it.
    ``job.trace_id`` (``None``: the running job's, or a new one) and ``job.partition`` are
    shared by every job. Raises QueueFull (call inside a savepoint: nothing of the batch may
    stay) when the queue or partition has a size limit that ``position`` + ``len(rows)`` jobs
    would pass.

    ``after``: what the batch's first chunk returned, for its later chunks. They get the same
    ``enqueued_at`` and skip the admission probe of a queue without a size limit, so they
    read no answer: inside :meth:`Driver.pipeline <django_jobs.drivers.base.Driver.pipeline>`
    each is sent while the caller builds the next.

    Sends no NOTIFY: the caller wakes workers once per batch with :func:`notify`.
    """
    if not rows:
        return InsertedJobs([], None)
    d = driver(using)
    conn = connections[using]
    # None: the database clock, stamped by the INSERT.
    enqueued_at = None if d.DATABASE_CLOCK and (now is None or database_clock) else now or timezone.now()
    if after is not None and after.enqueued_at is not None:
        enqueued_at = after.enqueued_at
    now = now or enqueued_at or timezone.now()
    run_after, queue, partition = job.run_after, job.queue, job.partition
    delayed = run_after is not None and run_after > now
    available_at = run_after if delayed else now
    state = JobState.DELAYED if delayed else JobState.WAITING
    seq = ready_seq(available_at, job.lifo)
    step = -1 if job.lifo else 0
    # In the order of the shared %s of drivers.inserts.insert_many_sql's SELECT.
    shared = [
        job.backend,
        queue,
        job.task_path,
        state,
        job.priority,
        d.dt(available_at),
        json.dumps(job.options),
        job.max_attempts,
        d.dt(enqueued_at),
        trace_id_for_new_job(job.trace_id),
        partition,
        partition is not None,  # blocked: _unblock_heads frees the partition's next one below
    ]
    enqueued_slot = 8  # enqueued_at's place in shared
    ids = uuid7_many(len(rows))
    texts = [str(i) for i in ids]
    per_statement = _rows_per_statement(conn)
    events = events_enabled()
    event_data = json.dumps({"task": job.task_path, "state": state})
    with d.cursor(hot=True) as cursor:
        limited = after.limited if after is not None else True
        if limited:
            limited = _admit(cursor, d, queue, {partition: len(rows)}, batch_before=position)
        fused = events and d.FUSED_EFFECTS
        for start, stop in _chunks(rows, per_statement, _CHUNK_JSON_CHARS if d.BATCH_AS_JSON else None):
            stored = d.insert_jobs(
                cursor, ids=ids, texts=texts, part=rows[start:stop], start=start, seq=seq, offset=step * position, step=step,
                shared=shared, event=(queue, event_data) if fused else None, fetch=enqueued_at is None,
            )  # fmt: skip
            if stored is not None:  # the database stamped enqueued_at; later chunks reuse it
                enqueued_at = stored
                shared[enqueued_slot] = enqueued_at
            if events and not fused:
                d.append_enqueued_events(cursor, ids[start:stop], queue, event_data, now)
        if fused and d.LISTEN_NOTIFY and position == 0:
            # One per batch: its later chunks commit in the same transaction.
            d.notify(cursor, events_channel(), [""])
        if partition is not None:
            _unblock_heads(cursor, d, {(queue, partition)})
    return InsertedJobs(ids, enqueued_at, limited, texts)


def pipelined(using: str) -> Any:
    """A block in which the chunks :func:`insert_jobs` sends with ``after`` do not wait for
    each other's answers where the driver can (PostgreSQL: psycopg's pipeline mode), so the
    database inserts one while the caller builds the next."""
    return driver(using).pipeline()


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


def _insert_new(cursor: Any, d: Driver, using: str, job: Job | NewRow, *, wake: bool = False) -> None:
    """Insert ``job`` after :func:`_admit` let it in (call inside a transaction); with ``wake``,
    its NOTIFY rides on the INSERT as in :func:`insert_job`."""
    wake = (
        wake
        and job.state == JobState.WAITING
        and d.LISTEN_NOTIFY
        and _first_notify_in_transaction(d.connection, job.queue)
    )
    _admit(cursor, d, job.queue, {job.partition_key: 1})
    _insert_job(cursor, d, job, wake=wake)
    _enqueued_event(cursor, d, job)
    _mark_saved(job, using)
    if job.partition_key is not None:
        _unblock_heads(cursor, d, {(job.queue, job.partition_key)})


def _insert_job(
    cursor: Any, d: Driver, job: Job | NewRow, *, wake: bool, once: bool = False, guarded: bool = False
) -> bool:
    """Run the INSERT of ``job`` (:meth:`Driver.insert_job`; with ``wake``, the NOTIFY rides on
    it); True when a row was inserted, and then ``job.enqueued_at`` is the time stored."""
    params = _insert_params(d, job)
    if guarded:
        params.append(job.queue)
    if wake:
        params.append(get_settings().NOTIFY_CHANNEL)
    events = d.FUSED_EFFECTS and events_enabled()
    if events:
        params.append(events_channel())
    inserted, stored = d.insert_job(cursor, params, notify=wake, once=once, guarded=guarded, events=events)
    if stored is not None:
        _set_enqueued_at(d, job, stored)
    return inserted

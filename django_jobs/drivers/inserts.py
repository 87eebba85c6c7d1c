"""The INSERT statements of new jobs, built once per shape: enqueue is a hot path, and
compiling Django's insert of every column costs more than the database's work. The portable shape
(SQLite's, and the base of the others) and PostgreSQL's, which casts its parameters, stamps
``enqueued_at`` with the database clock and carries the job's event and NOTIFY."""

from __future__ import annotations

import functools

from ..states import JobState
from .base import EVENT_COLUMNS, EVENT_TABLE, JOB_TABLE, QUEUE_TABLE
from .pg_sql import TXID, event_cte

INSERT_COLUMNS = (
    "id, backend, queue, task_path, args, kwargs, state, priority, available_at, options, max_attempts, "
    "enqueued_at, attempts, stalled_count, pending_children, errors, worker_ids, seq"
)
#: A queue with a size limit: its enqueues are admitted under a lock (engine.partitions._admit).
SIZE_LIMITED = "(max_size IS NOT NULL OR partition_max_size IS NOT NULL)"
MANY_ROW_PARAMS = 4  # id, args, kwargs, seq: what differs between the jobs of one batch
MANY_SHARED_PARAMS = 12  # the rest, bound once per statement


@functools.cache
def insert_sql(
    pg: bool, notify: bool, once: bool = False, guarded: bool = False, events: bool = False, iso: bool = False
) -> str:
    """The INSERT of one job (engine.insert_new_job), its parameters in the column order of
    engine.insert._insert_params.

    ``once``: the idempotency-key insert (engine.insert_job_once): nothing is inserted when the
    queue has a job with that key, and the new id is returned when one is.
    ``guarded``: nothing is inserted when the queue has a size limit (one more parameter, the
    queue's name, after the row's): the caller then admits the job under the queue's lock.
    ``events`` (PostgreSQL): the row's ``enqueued`` event and the events NOTIFY ride on it (one
    more parameter, the events channel, last); other callers write it with a second statement.

    ``enqueued_at`` NULL (PostgreSQL) means the database clock, ``now()``: the clock of the
    claims' ``started_at`` and the outcomes' ``finished_at``, and like theirs the transaction's
    start, so a job enqueued and run in one transaction has ``enqueued_at <= started_at``. The
    stored value comes back in the statement's result, no extra round trip: on PostgreSQL its
    first column (second with ``once``, after the id), elsewhere only with ``once`` (its
    callers give the time themselves). ``iso`` (PostgreSQL, not with ``once``): as ISO 8601 text
    (``to_json``), whatever the session's DateStyle, for the drivers' ``to_dt``.
    """

    def cast(t: str) -> str:
        return f"%s::{t}" if pg else "%s"

    enqueued = "COALESCE(%s::timestamptz, now())" if pg else "%s"
    stored = "to_json(new_job.enqueued_at) #>> '{}'" if iso else "new_job.enqueued_at"
    values = ", ".join(
        [cast("uuid"), "%s", "%s", "%s", cast("jsonb"), cast("jsonb"), "%s", "%s", cast("timestamptz"),
         cast("jsonb"), "%s", enqueued, "0", "0", "0", "'[]'", "'[]'", "%s", "%s", "%s", "%s", "%s", "%s"]
    )  # fmt: skip
    columns = f"{INSERT_COLUMNS}, trace_id, dedup_key, idempotency_key, partition_key, blocked"
    if guarded:
        unlimited = f"NOT EXISTS (SELECT 1 FROM {QUEUE_TABLE} WHERE name = %s AND {SIZE_LIMITED})"
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
        selected.append(stored)
        if notify:
            selected.append("pg_notify(%s, new_job.queue)")
        # At most one row: the events NOTIFY goes in the select list. event_notify's join,
        # which a statement of many rows needs for one NOTIFY, cost this one 12-15 us of the
        # server's CPU per enqueue (docs/benchmarks.md).
        selected.append("pg_notify(%s, '')")
        return (
            f"WITH new_job AS ({sql} RETURNING id, queue, task_path, state, enqueued_at), "
            f"{event_cte('new_job', "'enqueued'", data)} "
            f"SELECT {', '.join(selected)} FROM new_job"
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
        return (
            f"WITH new_job AS ({sql} RETURNING queue, enqueued_at) SELECT {stored}, pg_notify(%s, queue) FROM new_job"
        )
    if iso:
        return f"WITH new_job AS ({sql} RETURNING enqueued_at) SELECT {stored} FROM new_job"
    return f"{sql} RETURNING enqueued_at" if pg else sql


#: The parameters of :func:`plain_insert_sql`'s statement, in order; ``guarded`` adds the
#: queue's name once more, for the size-limit guard.
PLAIN_PARAMS = (
    "id", "queue", "task_path", "args", "kwargs", "priority", "available_at", "options", "max_attempts", "seq",
    "trace_id",
)  # fmt: skip
#: insert_sql's parameter positions (PostgreSQL, guarded, with both NOTIFYs) that
#: :func:`plain_insert_sql` writes as literals, and the value of each that is not an argument.
_PLAIN_LITERALS = {
    1: None,
    6: JobState.WAITING.value,
    11: None,
    14: None,
    15: None,
    16: None,
    17: False,
    19: None,
    20: None,
}


def pg_literal(value: str | bool | None) -> str:
    """``value`` as a PostgreSQL literal in a statement psycopg sends with parameters: an
    ``E''`` string (so ``standard_conforming_strings`` does not matter), ``%`` doubled (psycopg
    reads ``%`` as a placeholder's start)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if "\x00" in value:  # libpq would end the statement's text there
        raise ValueError(f"{value!r} holds a NUL character, which a PostgreSQL statement cannot carry")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''").replace("%", "%%") + "'"


@functools.lru_cache(maxsize=64)
def plain_insert_sql(backend: str, notify_channel: str | None, events_channel: str | None, guarded: bool) -> str:
    """:func:`insert_sql` (PostgreSQL) of ``enqueue()``'s plain insert, with what every plain job
    of one backend and settings shares written into the text as literals: the backend's alias,
    the state, the NULLs and the NOTIFY channels (``notify_channel`` None: no wake-up NOTIFY, one
    went in this transaction already; ``events_channel`` None: no event). ``guarded``: with the
    queue's size-limit guard (``SIZE_LIMITS_REFRESH = 0``; engine.size_limits).

    Its parameters are :data:`PLAIN_PARAMS`, 11 (12 guarded) instead of 21: psycopg converts and
    dumps each parameter on every call, and the 9 more were 6 % of a one-job enqueue's
    instructions. What differs between tasks stays a parameter, so all of them share one
    prepared statement. It returns ``enqueued_at`` as ISO text (``iso``; see drivers.pg_wire)."""
    notify, events = notify_channel is not None, events_channel is not None
    pieces = insert_sql(True, notify=notify, guarded=guarded, events=events, iso=True).split("%s")
    literals = {**_PLAIN_LITERALS, 1: backend, 19: notify_channel, 20: events_channel}
    positions = list(range(19 if guarded else 18)) + ([19] if notify else []) + ([20] if events else [])
    if len(positions) != len(pieces) - 1:
        raise AssertionError("insert_sql's parameters are not the ones plain_insert_sql knows")
    sql = [pieces[0]]
    for position, piece in zip(positions, pieces[1:], strict=True):
        sql.append((pg_literal(literals[position]) if position in literals else "%s") + piece)
    return "".join(sql)


def insert_many_sql(pg: bool, n: int, events: bool = False) -> str:
    """A multi-row INSERT of ``n`` jobs of one task (no NOTIFY: the caller sends one per batch).

    Only what differs between the jobs is a VALUES row; the columns they share are bound once
    and repeated by the SELECT. psycopg (client-side binding, Django's default) scans every
    placeholder of a statement this long on each execution, and with all 13 per row that scan
    cost more than the database's work: 4 per row tripled the rate on PostgreSQL (15,000 ->
    44,000 rows/s, 500-row statements) and gained a third on SQLite.

    ``enqueued_at`` as in :func:`insert_sql`: NULL is the database clock on PostgreSQL, where
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
    # PostgreSQL with events: the chunk's one "enqueued-many" event rides on the statement (two
    # more parameters after the rows: the queue and the data its jobs share, to which the
    # statement adds their ids, read from the rows' parameter in the order given).
    event = (
        f", ev AS (INSERT INTO {EVENT_TABLE} ({EVENT_COLUMNS}) SELECT {TXID}, %s, NULL, 'enqueued-many', "
        f"%s::jsonb || jsonb_build_object('jobs', jsonb_path_query_array(p.a, '$[*][0]')), clock_timestamp() FROM p)"
        if events and pg
        else ""
    )
    insert = f"INSERT INTO {JOB_TABLE} ({INSERT_COLUMNS}, trace_id, partition_key, blocked) SELECT {shared} FROM v"
    if pg:
        # The rows are one parameter, a JSON array of [id, args, kwargs, seq] (see
        # PostgreSQLDriver.insert_jobs): the statement's text is the same for every chunk, so it
        # is prepared once per connection and psycopg does not scan 2,000 placeholders per
        # chunk. One row back, not one per job: every row has the same enqueued_at.
        return (
            f"WITH p(a) AS (SELECT %s::jsonb), v(id, args, kwargs, seq) AS (SELECT (e->>0)::uuid, e->1, e->2, "
            f"(e->>3)::bigint FROM p, jsonb_array_elements(p.a) e){event}, "
            f"ins AS ({insert} RETURNING enqueued_at) SELECT enqueued_at FROM ins LIMIT 1"
        )
    return f"WITH v(id, args, kwargs, seq) AS (VALUES {', '.join([row] * n)}){event} {insert}"


# Full chunks are the common case, so only that size is kept; a cache keyed by every size a
# caller's last chunk happens to have would grow without bound.
insert_chunk_sql = functools.cache(insert_many_sql)

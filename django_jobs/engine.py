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

import functools
import json
import logging
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.utils import timezone

from .db import Dialect
from .models import Job, JobLog, Worker
from .states import FINISHED_STATES, JobState
from .uuid7 import uuid7

logger = logging.getLogger("django_jobs.engine")

JOB_TABLE = Job._meta.db_table

# Columns returned by a claim, in order; ClaimedJob mirrors them.
_CLAIM_COLUMNS = (
    "id",
    "backend",
    "queue",
    "task_path",
    "args",
    "kwargs",
    "priority",
    "attempts",
    "max_attempts",
    "options",
    "lease_token",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
    "available_at",
    "errors",
    "worker_ids",
    "seq",
    "parent_id",
)


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


def insert_job(
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
    now: datetime | None = None,
) -> Job:
    """Insert one job in the caller's transaction (waiting, or delayed until ``run_after``).

    ``lifo``: the job is claimed before the FIFO jobs of its priority, newest first
    (see :func:`ready_seq`).
    """
    now = now or timezone.now()
    delayed = run_after is not None and run_after > now
    job = Job(
        backend=backend,
        queue=queue,
        task_path=task_path,
        priority=priority,
        args=args,
        kwargs=kwargs,
        max_attempts=max_attempts,
        options=options,
        state=JobState.DELAYED if delayed else JobState.WAITING,
        available_at=run_after if delayed else now,
        enqueued_at=now,
    )
    job.seq = ready_seq(job.available_at, lifo)
    d = Dialect(using)
    conn = connections[using]
    wake = not delayed and d.pg and _first_notify_in_transaction(conn, queue)
    sql = _insert_sql(d.pg, notify=wake)
    params = [
        d.uuid(job.id),
        backend,
        queue,
        task_path,
        json.dumps(args),
        json.dumps(kwargs),
        job.state,
        priority,
        d.dt(job.available_at),
        json.dumps(options),
        max_attempts,
        d.dt(now),
        job.seq,
    ]
    if wake:
        from .conf import get_settings

        params.append(get_settings().NOTIFY_CHANNEL)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
    job._state.adding = False
    job._state.db = using
    return job


_INSERT_COLUMNS = (
    "id, backend, queue, task_path, args, kwargs, state, priority, available_at, options, max_attempts, "
    "enqueued_at, attempts, stalled_count, pending_children, errors, worker_ids, seq"
)


@functools.cache
def _insert_sql(pg: bool, notify: bool) -> str:
    """The INSERT of :func:`insert_job`, built once per vendor: enqueue is a hot path and
    compiling Django's 32-column insert costs more than the database's work."""

    def cast(t: str) -> str:
        return f"%s::{t}" if pg else "%s"

    values = ", ".join(
        [cast("uuid"), "%s", "%s", "%s", cast("jsonb"), cast("jsonb"), "%s", "%s", cast("timestamptz"),
         cast("jsonb"), "%s", cast("timestamptz"), "0", "0", "0", "'[]'", "'[]'", "%s"]
    )  # fmt: skip
    sql = f"INSERT INTO {JOB_TABLE} ({_INSERT_COLUMNS}) VALUES ({values})"
    if notify:
        # The INSERT and its NOTIFY in one statement: enqueue is a hot path and a separate
        # SELECT pg_notify would cost a round trip. Delivered on commit, like any NOTIFY.
        sql = f"WITH new_job AS ({sql} RETURNING queue) SELECT pg_notify(%s, queue) FROM new_job"
    return sql


#: Rows per INSERT statement of :func:`insert_jobs`. 500 rows x 4 parameters + 9 = 2,009 bound
#: variables: under SQLite's limit (32,766 by default since 3.32, our minimum is 3.35; a build
#: or connection set lower is honoured, see _rows_per_statement) and PostgreSQL's 65,535. Large
#: enough that the round trip per statement is a small part of its cost, small enough that one
#: statement's SQL and parameters stay around 100 KiB however many jobs the caller sends.
INSERT_CHUNK = 500
_MANY_ROW_PARAMS = 4  # id, args, kwargs, seq: what differs between the jobs of one batch
_MANY_SHARED_PARAMS = 9  # the rest, bound once per statement


def _insert_many_sql(pg: bool, n: int) -> str:
    """A multi-row INSERT of ``n`` jobs of one task (no NOTIFY: the caller sends one per batch).

    Only what differs between the jobs is a VALUES row; the columns they share are bound once
    and repeated by the SELECT. psycopg (client-side binding, Django's default) scans every
    placeholder of a statement this long on each execution, and with all 13 per row that scan
    cost more than the database's work: 4 per row tripled the rate on PostgreSQL (15,000 ->
    44,000 rows/s, 500-row statements) and gained a third on SQLite.
    """

    def cast(t: str) -> str:
        return f"%s::{t}" if pg else "%s"

    row = f"({cast('uuid')}, {cast('jsonb')}, {cast('jsonb')}, %s)"
    shared = ", ".join(
        ["v.id", "%s", "%s", "%s", "v.args", "v.kwargs", "%s", "%s", cast("timestamptz"), cast("jsonb"), "%s",
         cast("timestamptz"), "0", "0", "0", "'[]'", "'[]'", "v.seq"]
    )  # fmt: skip
    return (
        f"WITH v(id, args, kwargs, seq) AS (VALUES {', '.join([row] * n)}) "
        f"INSERT INTO {JOB_TABLE} ({_INSERT_COLUMNS}) SELECT {shared} FROM v"
    )


# Full chunks are the common case, so only that size is kept; a cache keyed by every size a
# caller's last chunk happens to have would grow without bound.
_insert_chunk_sql = functools.cache(_insert_many_sql)


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
    now: datetime,
    position: int = 0,
) -> list[uuid.UUID]:
    """Insert jobs of one task in the caller's transaction, one multi-row INSERT per
    :data:`INSERT_CHUNK` rows; return their ids in the order of ``rows``.

    ``rows``: ``(args JSON, kwargs JSON)`` per job, already validated by the caller. Every job
    gets the state :func:`insert_job` would give it (delayed until ``run_after`` when that is
    after ``now``, else waiting), ``enqueued_at = now`` and the same ``options``.
    ``position``: where ``rows[0]`` stands in the caller's whole batch. FIFO jobs of one batch
    share a seq and keep their order by id; LIFO jobs get ``seq - position`` so the last one
    given runs first, as if each were enqueued a microsecond after the one before it.

    Sends no NOTIFY: the caller wakes workers once per batch with :func:`notify`.
    """
    if not rows:
        return []
    d = Dialect(using)
    conn = connections[using]
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
        d.dt(now),
    ]
    ids = [uuid7() for _ in rows]
    per_statement = _rows_per_statement(conn)
    with conn.cursor() as cursor:
        for start in range(0, len(rows), per_statement):
            part = rows[start : start + per_statement]
            params: list[Any] = []
            for i, (args_json, kwargs_json) in enumerate(part, start):
                params += (d.uuid(ids[i]), args_json, kwargs_json, seq + step * (position + i))
            params += shared  # after the rows: the WITH comes first in the statement
            n = len(part)
            sql = _insert_chunk_sql(d.pg, n) if n == INSERT_CHUNK else _insert_many_sql(d.pg, n)
            cursor.execute(sql, params)
    return ids


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
    from .conf import get_settings

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


# -- claim ----------------------------------------------------------------------------------


def claim_jobs(
    *,
    using: str,
    queues: list[str] | None,
    limit: int,
    worker_id: str,
    lease_seconds: float,
    backend: str | None = None,
    job_ids: list[uuid.UUID] | None = None,
    now: datetime | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` waiting jobs of ``queues`` (``None`` = all) for ``worker_id``;
    with ``backend``, only jobs enqueued through that TASKS alias.

    One statement: select the ready ids in claim order, locking only those rows and skipping
    rows another worker holds (``FOR UPDATE SKIP LOCKED``; on SQLite the statement holds the
    database write lock instead), and mark them active with a fresh lease token and an expiry
    of database time + ``lease_seconds``. It commits before any user code runs.
    """
    if limit <= 0:
        return []
    d = Dialect(using)
    now_sql, now_params = d.now(now)
    lease_sql, lease_params = d.now_plus(now, lease_seconds)
    where = ["state = 'waiting'"]
    where_params: list[Any] = []
    # One queue: an equality, so the database walks django_jobs_ready_queue_idx in claim order.
    # All queues: it walks django_jobs_ready_idx in claim order. Several: the planner's choice.
    if queues and len(queues) == 1:
        where.append("queue = %s")
        where_params.append(queues[0])
    elif queues:
        sql, params = d.in_list("queue", queues)
        where.append(sql)
        where_params += params
    if backend is not None:
        where.append("backend = %s")
        where_params.append(backend)
    if job_ids is not None:  # the test kit runs one given job
        if not job_ids:
            return []
        sql, params = d.in_list("id", [d.uuid(j) for j in job_ids])
        where.append(sql)
        where_params += params
    select_ids = (
        f"SELECT id FROM {JOB_TABLE} WHERE {' AND '.join(where)} "
        f"ORDER BY priority DESC, seq, id LIMIT %s {d.skip_locked()}"
    )
    returning = ", ".join(_CLAIM_COLUMNS)
    sql = (
        f"UPDATE {JOB_TABLE} SET state = 'active', attempts = attempts + 1, "
        f"lease_token = {d.new_token()}, lease_expires_at = {lease_sql}, worker_id = %s, "
        f"worker_ids = {d.json_append_text('worker_ids', '%s')}, "
        f"started_at = COALESCE(started_at, {now_sql}), last_attempted_at = {now_sql} "
        f"WHERE {d.id_in(select_ids)} AND state = 'waiting' RETURNING {returning}"
    )
    params = [*lease_params, worker_id, worker_id, *now_params, *now_params, *where_params, limit]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    jobs = [_claimed(d, row) for row in rows]
    # RETURNING has no order: restore claim order so higher priorities start first.
    jobs.sort(key=lambda j: (-j.priority, j.seq, j.id))
    return jobs


def _claimed(d: Dialect, row: tuple[Any, ...]) -> ClaimedJob:
    (jid, backend, queue, path, args, kwargs, prio, attempts, max_attempts, options, token,
     enq, started, last, avail, errors, worker_ids, seq, parent) = row  # fmt: skip
    return ClaimedJob(
        id=d.to_uuid(jid),
        backend=backend,
        queue=queue,
        task_path=path,
        args=d.to_json(args),
        kwargs=d.to_json(kwargs),
        priority=prio,
        attempts=attempts,
        max_attempts=max_attempts,
        options=d.to_json(options),
        lease_token=d.to_uuid(token),
        enqueued_at=d.to_dt(enq),
        started_at=d.to_dt(started),
        last_attempted_at=d.to_dt(last),
        available_at=d.to_dt(avail),
        errors=d.to_json(errors),
        worker_ids=d.to_json(worker_ids),
        seq=seq,
        parent_id=d.to_uuid(parent) if parent is not None else None,
    )


# -- outcomes -------------------------------------------------------------------------------

_OUTCOME_STATES = {JobState.COMPLETED, JobState.FAILED, JobState.WAITING, JobState.DELAYED}


def record_outcomes(outcomes: list[Outcome], *, using: str, now: datetime | None = None) -> dict[uuid.UUID, str]:
    """Write a batch of attempt outcomes in one statement; return ``{job id: state written}`` for
    the jobs that were written (the state is ``cancelled`` where a cancel was requested).

    Each row is guarded on (id, ``active``, lease token): an outcome whose job was rescued,
    cancelled or released meanwhile matches nothing, is logged and dropped.
    """
    if not outcomes:
        return {}
    for o in outcomes:
        if o.state not in _OUTCOME_STATES:
            raise ValueError(f"not an outcome state: {o.state!r}")
    d = Dialect(using)
    now_sql, now_params = d.now(now)
    row_sql = "({}, {}, {}, {}, {}, {}, {}, {})".format(
        d.cast("%s", "uuid"),
        d.cast("%s", "uuid"),
        d.cast("%s", "text"),
        d.cast("%s", "jsonb"),
        d.cast("%s", "jsonb"),
        d.cast("%s", "timestamptz"),
        d.cast("%s", "integer"),
        d.cast("%s", "bigint"),
    )
    values: list[Any] = []
    for o in outcomes:
        values += [
            d.uuid(o.job_id),
            d.uuid(o.lease_token),
            str(o.state),
            o.return_value_json,
            json.dumps(o.error) if o.error is not None else None,
            d.dt(o.available_at),
            1 if o.uncount_attempt else 0,
            ready_seq(o.available_at) if o.available_at is not None else None,
        ]
    t = JOB_TABLE
    sql = (
        f"WITH v(id, token, state, rv, err, avail, uncount, avail_seq) AS (VALUES {', '.join([row_sql] * len(outcomes))}) "
        f"UPDATE {t} SET state = CASE WHEN {t}.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE v.state END, "
        f"return_value = v.rv, "
        f"attempts = {t}.attempts - v.uncount, "
        f"worker_ids = CASE WHEN v.uncount = 1 THEN {d.json_pop(t + '.worker_ids')} ELSE {t}.worker_ids END, "
        f"errors = CASE WHEN v.err IS NULL THEN {t}.errors ELSE {d.json_append(t + '.errors', 'v.err')} END, "
        f"available_at = COALESCE(v.avail, {t}.available_at), "
        f"seq = CASE WHEN v.avail_seq IS NULL THEN {t}.seq WHEN {t}.seq < 0 THEN -v.avail_seq ELSE v.avail_seq END, "
        f"finished_at = CASE WHEN v.state IN ('completed', 'failed') OR {t}.cancel_requested_at IS NOT NULL "
        f"THEN {now_sql} ELSE NULL END, "
        f"lease_token = NULL, lease_expires_at = NULL "
        f"FROM v WHERE {t}.id = v.id AND {t}.state = 'active' AND {t}.lease_token = v.token "
        f"RETURNING {t}.id, {t}.queue, {t}.state"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*values, *now_params])
        rows = cursor.fetchall()
    written = {d.to_uuid(r[0]): r[2] for r in rows}
    for o in outcomes:
        if o.job_id not in written:
            logger.warning(
                "Dropped the %s outcome of job %s: it is no longer active under this lease "
                "(rescued, cancelled or released meanwhile).",
                o.state,
                o.job_id,
            )
    requeued = sorted({r[1] for r in rows if r[2] == JobState.WAITING})
    if requeued:
        notify(using, requeued)
    return written


def release_jobs(
    *, using: str, worker_id: str, job_ids: list[uuid.UUID] | None = None, now: datetime | None = None
) -> int:
    """Return this worker's active jobs to ``waiting`` without counting the attempt (shutdown).

    The attempt and its worker id are taken back, so the next worker runs it as the same attempt.
    A job cancelled while it ran is not run again: it becomes ``cancelled``.
    """
    d = Dialect(using)
    now_sql, now_params = d.now(now)
    where = ["state = 'active'", "worker_id = %s"]
    params: list[Any] = [worker_id]
    if job_ids is not None:
        if not job_ids:
            return 0
        sql, p = d.in_list("id", [d.uuid(j) for j in job_ids])
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
        f"WHERE {' AND '.join(where)} RETURNING queue, state"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*now_params, *params])
        rows = [r for r in cursor.fetchall() if r[1] == JobState.WAITING]
    notify(using, sorted({r[0] for r in rows}))
    return len(rows)


class CancelResult(NamedTuple):
    #: The job's state afterwards (``active`` for a running job that was flagged).
    state: str
    #: What this call did: ``cancelled`` (was waiting/delayed), ``flagged`` (was running), or
    #: ``None`` (nothing: already finished, or already flagged).
    change: str | None
    queue: str


def cancel_job(*, using: str, job_id: uuid.UUID, now: datetime | None = None) -> CancelResult | None:
    """Cancel a job; say what happened (``None`` when there is no such job).

    A waiting, delayed or waiting-children job becomes ``cancelled`` at once. A running one is
    flagged (``cancel_requested_at``): the task sees ``context.is_cancelled()`` turn true, and
    whatever its attempt comes to is recorded as ``cancelled``. A finished job is left as it is.
    Both writes are guarded on the state, so a worker finishing at the same moment wins or loses
    cleanly: exactly one outcome is recorded.
    """
    now = now or timezone.now()
    jobs = Job.objects.using(using).filter(id=job_id)
    change = None
    # Two guarded writes; a worker may move the job between them (a release or rescue puts an
    # active job back to waiting, a claim makes a waiting one active), so try the pair again.
    for _ in range(3):
        if jobs.filter(state__in=[JobState.WAITING, JobState.DELAYED, JobState.WAITING_CHILDREN]).update(
            state=JobState.CANCELLED, finished_at=now, cancel_requested_at=now
        ):
            change = "cancelled"
            break
        if jobs.filter(state=JobState.ACTIVE, cancel_requested_at__isnull=True).update(cancel_requested_at=now):
            change = "flagged"
            break
        state = jobs.values_list("state", flat=True).first()
        if state is None or state in FINISHED_STATES or state == JobState.ACTIVE:
            break  # unknown, finished, or already flagged: nothing to do
    if change == "flagged":
        # Tell the job's worker now (it also polls). The payload cannot be a queue name: those
        # start with a letter or digit.
        conn = connections[using]
        if conn.vendor == "postgresql":
            from .conf import get_settings

            with conn.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [get_settings().NOTIFY_CHANNEL, f"{CANCEL_PREFIX}{job_id}"])
    row = jobs.values_list("state", "queue").first()
    return None if row is None else CancelResult(row[0], change, row[1])


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
    return bool(
        Job.objects.using(using)
        .filter(id=job_id, state__in=[JobState.FAILED, JobState.CANCELLED])
        .update(
            state=JobState.WAITING,
            available_at=now,
            # Ready now: a new seq from now, keeping the sign (a LIFO job stays LIFO).
            seq=Case(When(seq__lt=0, then=Value(-seq)), default=Value(seq), output_field=BigIntegerField()),
            finished_at=None,
            cancel_requested_at=None,
            max_attempts=Case(
                When(attempts__gte=F("max_attempts"), then=F("attempts") + 1),
                default=F("max_attempts"),
                output_field=PositiveIntegerField(),
            ),
        )
    )


def is_cancel_requested(*, using: str, job_id: uuid.UUID) -> bool:
    return Job.objects.using(using).filter(id=job_id, cancel_requested_at__isnull=False).exists()


def set_progress(*, using: str, job_id: uuid.UUID, lease_token: uuid.UUID, value: Any) -> bool:
    """Store a running job's progress, guarded on its lease; False when it is no longer ours."""
    return (
        Job.objects.using(using)
        .filter(id=job_id, state=JobState.ACTIVE, lease_token=lease_token)
        .update(progress=value)
        == 1
    )


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


def renew_leases(*, using: str, worker_id: str, lease_seconds: float, now: datetime | None = None) -> int:
    """Extend the lease of every job this worker holds; return how many."""
    d = Dialect(using)
    lease_sql, lease_params = d.now_plus(now, lease_seconds)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET lease_expires_at = {lease_sql} WHERE state = 'active' AND worker_id = %s",
            [*lease_params, worker_id],
        )
        return cursor.rowcount


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
        + " AND state = 'delayed' RETURNING queue"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*now_params, *scope_params, limit])
        rows = cursor.fetchall()
    notify(using, sorted({r[0] for r in rows}))
    return len(rows)


def make_due(*, using: str, job_ids: list[uuid.UUID], now: datetime | None = None) -> int:
    """Move the given delayed jobs to ``waiting`` now, whatever their time (the test kit's
    ``drain_queue``); guarded on ``delayed``. Returns how many moved."""
    from django.db.models import BigIntegerField, Case, Value, When

    if not job_ids:
        return 0
    now = now or timezone.now()
    seq = ready_seq(now)
    return (
        Job.objects.using(using)
        .filter(id__in=job_ids, state=JobState.DELAYED)
        .update(
            state=JobState.WAITING,
            available_at=now,
            seq=Case(When(seq__lt=0, then=Value(-seq)), default=Value(seq), output_field=BigIntegerField()),
        )
    )


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
        + f" AND state = 'active' AND lease_expires_at < {now_sql} RETURNING id, queue, backend, state"
    )
    params = [json.dumps(error), *now_params, *now_params, *scope_params, limit, *now_params]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = [RescuedJob(d.to_uuid(r[0]), r[1], r[2], r[3]) for r in cursor.fetchall()]
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

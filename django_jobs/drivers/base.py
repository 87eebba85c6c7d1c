"""The vendor seam: what the engine asks of a database, and how one spells it.

The engine (``django_jobs.engine``) holds the verbs and their rules (guards, effects, retries);
a :class:`Driver` holds what differs between databases: the capability flags below, the
spellings of values and SQL fragments, and the verbs whose statements differ in shape, named by
table and verb (``claim_jobs``, ``record_outcomes``, ``append_events``, ``lock_queue``...).
One subclass per database: :mod:`.postgresql`, :mod:`.sqlite`, :mod:`.mysql`. This base class
holds the portable SQL they share; a subclass overrides what its database spells otherwise.

Drivers import nothing above the models (they sit under the engine); the engine gets one with
:func:`django_jobs.drivers.driver`.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from ..conf import get_settings
from ..models import Event, Job, Lease, Metric, QueueState
from ..models.dedup import JobDedup, JobDedupNext
from ..states import UNFINISHED_PARTS, UNFINISHED_SQL
from .topics import TopicVerbs

JOB_TABLE = Job._meta.db_table
QUEUE_TABLE = QueueState._meta.db_table
EVENT_TABLE = Event._meta.db_table
DEDUP_TABLE = JobDedup._meta.db_table
DEDUP_NEXT_TABLE = JobDedupNext._meta.db_table
METRIC_TABLE = Metric._meta.db_table
LEASE_TABLE = Lease._meta.db_table
EVENT_COLUMNS = "txid, queue, job_id, kind, data, created_at"
#: What a claim returns of each job, in order (engine.ClaimedJob mirrors them): these columns,
#: then its JSON columns (CLAIM_JSON) as one JSON array, so the worker decodes one string per
#: job instead of five.
CLAIM_COLUMNS = (
    "id", "backend", "queue", "task_path", "priority", "attempts", "max_attempts", "lease_token", "enqueued_at",
    "started_at", "last_attempted_at", "available_at", "seq", "parent_id", "trace_id", "partition_key",
)  # fmt: skip
CLAIM_JSON = ("args", "kwargs", "options", "errors", "worker_ids")
#: The columns of one outcome row given to :meth:`Driver.record_outcomes`, in order.
OUTCOME_COLUMNS = "id, token, state, rv, err, avail, uncount, avail_seq, purge, purge_c, rt"
#: What :meth:`Driver.record_outcomes` returns of each written job, in order.
OUTCOME_RETURNING = "id, queue, state, parent_id, partition_key, attempts, last_attempted_at, finished_at"
#: Rows per multi-row statement (inserts, events); engine.INSERT_CHUNK says why 500.
CHUNK = 500


class Driver(TopicVerbs):
    """How one database does what the engine asks. Cheap to make: one per call of a verb."""

    __slots__ = ("connection", "using", "vendor")

    #: The ``connection.vendor`` this driver serves.
    VENDOR: ClassVar[str] = ""
    # -- capability flags (what the database can do; the engine asks these, never the vendor) --
    #: ``UPDATE ... RETURNING``: a claim or an outcome batch is one statement.
    RETURNING: ClassVar[bool] = True
    #: ``FOR UPDATE SKIP LOCKED``: concurrent claimers pass each other's rows.
    SKIP_LOCKED: ClassVar[bool] = False
    #: Row locks (``SELECT ... FOR UPDATE``); without them a write takes the database's lock.
    ROW_LOCKS: ClassVar[bool] = False
    #: ``LISTEN/NOTIFY``: workers wake on a notification; without it they poll.
    LISTEN_NOTIFY: ClassVar[bool] = False
    #: Partial indexes (``CREATE INDEX ... WHERE``).
    PARTIAL_INDEXES: ClassVar[bool] = True
    #: Transaction-level advisory locks.
    ADVISORY_LOCKS: ClassVar[bool] = False
    #: Jobs and leases are stamped with the database's clock (several hosts, one clock); without
    #: it, with this process's clock (one host).
    DATABASE_CLOCK: ClassVar[bool] = False
    #: A statement writes its own events and metrics (data-modifying CTEs): no second statement
    #: and no transaction around the pair.
    FUSED_EFFECTS: ClassVar[bool] = False
    #: A batch of jobs travels as one JSON parameter (a constant-shape statement), so a chunk is
    #: bounded by its characters of JSON as well as its rows.
    BATCH_AS_JSON: ClassVar[bool] = False
    #: The ``txid`` a new event is written with where the driver does not order events by its
    #: writer's transaction (see :meth:`events_horizon`).
    NEW_EVENT_TXID: ClassVar[int] = 0

    def __init__(self, using: str, connection: Any = None):
        """``connection``: ``connections[using]`` when the caller has it (one look-up less)."""
        self.using = using
        self.connection = connections[using] if connection is None else connection
        self.vendor = self.connection.vendor

    # -- cursors ----------------------------------------------------------------------------

    def cursor(self, *, hot: bool = False, generic: bool = False) -> Any:
        """A cursor for the engine's statements. ``hot``: a statement sent for every job (a
        driver may prepare it); ``generic``: the worker's claims and outcome batches."""
        return self.connection.cursor()

    def pipeline(self) -> Any:
        """A block whose statements need not wait for each other's answers (see
        :meth:`insert_jobs`'s ``fetch``): the database works on one while the caller builds the
        next. Errors are raised by the statement that reads an answer, or on leaving the block."""
        return contextlib.nullcontext()

    def effects_atomic(self) -> Any:
        """A transaction around a change and the events a second statement writes for it
        (nothing where the change's own statement writes them, or with events off)."""
        if self.FUSED_EFFECTS or not get_settings().EVENTS:
            return contextlib.nullcontext()
        return transaction.atomic(using=self.using)

    # -- values sent to the database ----------------------------------------------------------

    def uuid(self, value: uuid.UUID | None) -> Any:
        return None if value is None else value.hex

    def dt(self, value: datetime | None) -> Any:
        if value is None:
            return None
        return self.connection.ops.adapt_datetimefield_value(value)

    def now(self, value: datetime | None) -> tuple[str, list[Any]]:
        """SQL for "now": the database clock where :attr:`DATABASE_CLOCK`, unless a time is
        given (tests); this process's clock otherwise."""
        return "%s", [self.dt(value or timezone.now())]

    def now_plus(self, value: datetime | None, seconds: float) -> tuple[str, list[Any]]:
        """SQL for "now + seconds" (a lease expiry), on the same clock as :meth:`now`."""
        return "%s", [self.dt((value or timezone.now()) + timedelta(seconds=seconds))]

    def clock(self, cursor: Any) -> datetime:
        """The time now, read while the caller holds a lock (see engine.claim_gated_jobs)."""
        return timezone.now()

    def transaction_now(self, cursor: Any) -> datetime:
        """The database clock's time for this transaction (drivers with :attr:`DATABASE_CLOCK`)."""
        return timezone.now()

    def in_list(self, column: str, values: list[Any]) -> tuple[str, list[Any]]:
        return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)

    # -- sessions ------------------------------------------------------------------------------

    def limit_idle_transactions(self, seconds: float) -> None:
        """Have the database end this connection's session (rolling its transaction back and
        releasing its locks) when a transaction stays idle, waiting for the client's next
        statement, longer than ``seconds``: a process stopped in the middle of a transaction
        (SIGSTOP, a VM or GC pause) then holds its row locks that long at most. Nothing where
        the database has no such setting (SQLite; MySQL, where MariaDB has one)."""

    # -- SQL fragments ------------------------------------------------------------------------

    def json_append(self, column: str, value_sql: str) -> str:
        """``column`` (a JSON array) with one JSON value appended."""
        raise NotImplementedError

    def json_append_text(self, column: str, value_sql: str) -> str:
        """``column`` (a JSON array) with one string appended."""
        raise NotImplementedError

    def json_pop(self, column: str) -> str:
        """``column`` (a JSON array) without its last element."""
        raise NotImplementedError

    def json_array_text(self, columns: tuple[str, ...]) -> str:
        """The JSON columns ``columns`` as one JSON array, as text (one string to decode)."""
        raise NotImplementedError

    def quote(self, name: str) -> str:
        """A column name quoted (``key`` is a keyword somewhere)."""
        return self.connection.ops.quote_name(name)

    def cast(self, sql: str, pg_type: str) -> str:
        return sql

    def id_in(self, select_sql: str) -> str:
        """``id`` is among the ids ``select_sql`` returns, with the subquery run exactly once."""
        return f"id IN ({select_sql})"

    def fewer_than(self, from_where: str, n: int) -> str:
        """True while ``SELECT ... {from_where}`` (which may name the outer query's rows) has
        fewer than ``n`` rows; counting stops at ``n``."""
        return f"(SELECT COUNT(*) FROM (SELECT 1 {from_where} LIMIT {int(n)}) bounded) < {int(n)}"

    def false(self) -> str:
        return "0"

    def true(self) -> str:
        return "1"

    def not_blocked(self, alias: str) -> str:
        """A job is not blocked, spelled as the ready indexes' condition."""
        return f"{alias}.blocked = 0"

    def is_blocked(self, alias: str) -> str:
        return f"{alias}.blocked = 1"

    def unfinished_part(self, alias: str, state: str, blocked: bool | None) -> str:
        """One of states.UNFINISHED_PARTS, spelled with every term of its partial index's
        condition (SQLite reads a partial index only for a query that repeats each term)."""
        sql = f"{alias}.state = '{state}'"
        if blocked is None:
            return sql
        if blocked:
            return f"{sql} AND {self.is_blocked(alias)} AND {alias}.state IN {UNFINISHED_SQL}"
        return f"{sql} AND {self.not_blocked(alias)}"

    def queue_size(self, cursor: Any, queue: str, cap: int) -> int:
        """Unfinished jobs of ``queue``, counting no further than ``cap``: the parts of
        states.UNFINISHED_PARTS added up in one statement, each an index range of the partial
        index its rows are in, bounded by ``cap`` (the running part reads the running jobs of
        every queue: django_jobs_active_idx has no queue column, the workers' slots bound it)."""
        counts = " + ".join(
            f"(SELECT COUNT(*) FROM (SELECT 1 FROM {JOB_TABLE} j WHERE j.queue = %s AND "
            f"{self.unfinished_part('j', *part)} LIMIT %s) p{i})"
            for i, part in enumerate(UNFINISHED_PARTS)
        )
        cursor.execute(f"SELECT {counts}", [queue, cap] * len(UNFINISHED_PARTS))
        return min(cursor.fetchone()[0], cap)

    def skip_locked(self) -> str:
        return "FOR UPDATE SKIP LOCKED" if self.SKIP_LOCKED else ""

    def for_update(self) -> str:
        """Lock the rows read until the transaction ends (nothing without row locks: the
        transaction's first write takes the database's lock)."""
        return "FOR UPDATE" if self.ROW_LOCKS else ""

    # -- values read back -----------------------------------------------------------------------

    @staticmethod
    def to_uuid(value: Any) -> uuid.UUID | None:
        if value is None or isinstance(value, uuid.UUID):
            return value
        return uuid.UUID(value)

    @staticmethod
    def to_json(value: Any) -> Any:
        return json.loads(value) if isinstance(value, (str, bytes)) else value

    def to_dt(self, value: Any) -> datetime | None:
        if value is None:
            return None
        parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
        if parsed.tzinfo is None and settings.USE_TZ:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed

    # -- any table ----------------------------------------------------------------------------------

    def update_returning(
        self,
        cursor: Any,
        table: str,
        set_sql: str,
        set_params: list[Any],
        where_sql: str,
        where_params: list[Any],
        returning: str,
    ) -> list[tuple[Any, ...]]:
        """``UPDATE table SET set_sql WHERE where_sql`` and the ``returning`` columns of the rows
        it changed (as they are after it). Each assignment of ``set_sql`` reads the row as it
        was before the statement, whatever the order of the assignments."""
        cursor.execute(
            f"UPDATE {table} SET {set_sql} WHERE {where_sql} RETURNING {returning}", [*set_params, *where_params]
        )
        return cursor.fetchall()

    # -- wake-ups -----------------------------------------------------------------------------

    def notify(self, cursor: Any, channel: str, payloads: list[str]) -> None:
        """Send ``payloads`` on ``channel`` (delivered on commit); nothing where workers poll."""

    # -- events (django_jobs_events) ----------------------------------------------------------------

    def events_horizon(self, cursor: Any) -> int | None:
        """The ``txid`` below which no event can still appear (see eventlog.py): the oldest
        running writer's transaction id (PostgreSQL), the next batch to publish (MySQL); None
        where events are ordered by id alone (SQLite: the writes are serialised)."""
        return None

    def append_events(
        self,
        cursor: Any,
        events: list[tuple[str, uuid.UUID | None, str, dict[str, Any]]],
        created: datetime,
        channel: str,
    ) -> None:
        """Insert ``(queue, job id, kind, data)`` events in the caller's transaction."""
        for start in range(0, len(events), CHUNK):
            part = events[start : start + CHUNK]
            rows = ", ".join([f"({self.NEW_EVENT_TXID}, %s, %s, %s, %s, %s)"] * len(part))
            params: list[Any] = []
            for queue, job_id, kind, data in part:
                params += [queue, self.uuid(job_id), kind, json.dumps(data, default=str), self.dt(created)]
            cursor.execute(f"INSERT INTO {EVENT_TABLE} ({EVENT_COLUMNS}) VALUES {rows}", params)

    # -- queue names ----------------------------------------------------------------------------------

    def distinct_queues(self, cursor: Any, table: str) -> list[str]:
        """The distinct ``queue`` values of ``table`` (events, metrics), in order, by a loose
        index scan: one probe of an index leading with ``queue`` per queue, not a read of every
        row (these tables hold one row per event, or per queue and minute)."""
        cursor.execute(
            f"WITH RECURSIVE q(queue) AS (SELECT MIN(queue) FROM {table} UNION ALL "
            f"SELECT (SELECT MIN(t.queue) FROM {table} t WHERE t.queue > q.queue) FROM q WHERE q.queue IS NOT NULL) "
            f"SELECT queue FROM q WHERE queue IS NOT NULL"
        )
        return [row[0] for row in cursor.fetchall()]

    # -- metrics (django_jobs_metric) ---------------------------------------------------------------

    def add_metrics(self, cursor: Any, minute: datetime, counts: dict[str, list[int]]) -> None:
        """Add ``{queue: [completed, failed, retried, runtime_ms]}`` to the queues' row of ``minute``."""
        for queue in sorted(counts):
            completed, failed, retried, runtime_ms = counts[queue]
            cursor.execute(
                f"INSERT INTO {METRIC_TABLE} (queue, minute, completed, failed, retried, runtime_ms) "
                f"VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (queue, minute) DO UPDATE SET "
                f"completed = completed + excluded.completed, failed = failed + excluded.failed, "
                f"retried = retried + excluded.retried, runtime_ms = runtime_ms + excluded.runtime_ms",
                [queue, self.dt(minute), completed, failed, retried, runtime_ms],
            )

    # -- jobs: claim ------------------------------------------------------------------------------

    def claim_jobs(
        self,
        cursor: Any,
        *,
        where: str,
        params: list[Any],
        limit: int,
        lease_token: uuid.UUID,
        worker_id: str,
        now: datetime | None,
        lease_seconds: float,
        events_channel: str | None,
    ) -> list[tuple[Any, ...]]:
        """Mark active, for ``worker_id`` under ``lease_token`` with an expiry of now +
        ``lease_seconds``, up to ``limit`` waiting jobs ``j`` matching ``where`` (with
        ``params``) in claim order, locking only those rows and passing rows another worker
        holds; return their :data:`CLAIM_COLUMNS` and payload, in no particular order.
        ``events_channel``: a driver with :attr:`FUSED_EFFECTS` writes their ``active`` events
        in the same statement (others leave them to the caller)."""
        sql, all_params = self._claim_sql(where, params, limit, lease_token, worker_id, now, lease_seconds)
        cursor.execute(sql, all_params)
        return cursor.fetchall()

    def claim_returning(self) -> str:
        """What a claim returns of each job, for :meth:`claim_values`: :data:`CLAIM_COLUMNS`,
        then the :data:`CLAIM_JSON` columns as one JSON array."""
        return ", ".join([*CLAIM_COLUMNS, f"{self.json_array_text(CLAIM_JSON)} AS payload"])

    def claim_values(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """The fields of ``engine.ClaimedJob``, in its order, from a row of :meth:`claim_returning`."""
        (jid, backend, queue, path, prio, attempts, max_attempts, token, enq, started, last, avail, seq, parent,
         trace_id, partition, payload) = row  # fmt: skip
        args, kwargs, options, errors, worker_ids = json.loads(payload)
        return (
            self.to_uuid(jid), backend, queue, path, args, kwargs, prio, attempts, max_attempts, options,
            self.to_uuid(token), self.to_dt(enq), self.to_dt(started), self.to_dt(last), self.to_dt(avail), errors,
            worker_ids, seq, self.to_uuid(parent) if parent is not None else None, trace_id, partition,
        )  # fmt: skip

    def _claim_sql(
        self,
        where: str,
        params: list[Any],
        limit: int,
        lease_token: uuid.UUID,
        worker_id: str,
        now: datetime | None,
        lease_seconds: float,
    ) -> tuple[str, list[Any]]:
        """The claim as one ``UPDATE ... WHERE id IN (ready ids) RETURNING``. On a database
        without row locks the statement holds the database's write lock instead of skipping."""
        now_sql, now_params = self.now(now)
        lease_sql, lease_params = self.now_plus(now, lease_seconds)
        select_ids = (
            f"SELECT j.id FROM {JOB_TABLE} j WHERE {where} "
            f"ORDER BY j.priority DESC, j.seq, j.id LIMIT %s {self.skip_locked()}"
        )
        returning = self.claim_returning()
        sql = (
            f"UPDATE {JOB_TABLE} SET state = 'active', attempts = attempts + 1, "
            f"lease_token = %s, lease_expires_at = {lease_sql}, worker_id = %s, "
            f"worker_ids = {self.json_append_text('worker_ids', '%s')}, "
            f"started_at = COALESCE(started_at, {now_sql}), last_attempted_at = {now_sql} "
            # No "AND state = 'waiting'" here: the ids were read and locked as waiting by this very
            # statement, so it holds. Spelled out, it let PostgreSQL's planner AND the id list with
            # a partial index whose condition it implies (then the unfinished index, which held
            # every unfinished job) and read that whole index (the backlog: 20,000 entries, 1.3 of
            # 2.2 ms) for every claim when its statistics were stale.
            f"WHERE {self.id_in(select_ids)} RETURNING {returning}"
        )
        all_params = [
            self.uuid(lease_token), *lease_params, worker_id, worker_id, *now_params, *now_params, *params, limit
        ]  # fmt: skip
        return sql, all_params

    # -- queues: locks ----------------------------------------------------------------------------

    def lock_queue(self, cursor: Any, queue: str, columns: str, where: str = "") -> tuple[Any, ...] | None:
        """Lock ``queue``'s QueueState row until the transaction ends and return ``columns`` of
        it; None when it has no row (or the row does not match ``where``; nothing is locked).

        Without row locks: an UPDATE that changes nothing takes the database's write lock, which
        the transaction keeps (and, being a write first, waits for the lock instead of failing
        to upgrade a read)."""
        extra = f" AND {where}" if where else ""
        if self.ROW_LOCKS:
            cursor.execute(f"SELECT {columns} FROM {QUEUE_TABLE} WHERE name = %s{extra} FOR UPDATE", [queue])
        else:
            cursor.execute(f"UPDATE {QUEUE_TABLE} SET name = name WHERE name = %s{extra} RETURNING {columns}", [queue])
        return cursor.fetchone()

    def lock_rows(self, cursor: Any, table: str, ids: list[Any], columns: str) -> list[tuple[Any, ...]]:
        """Lock the rows of ``table`` (the job table, or one keyed by an integer) whose ``id`` is
        in ``ids`` until the transaction ends and return ``columns`` of those that exist, in no
        particular order; as :meth:`lock_queue`, a write that changes nothing takes the
        database's write lock where there are no row locks."""
        if not ids:
            return []
        jobs = table == JOB_TABLE
        marks = ", ".join([self.cast("%s", "uuid") if jobs else "%s"] * len(ids))
        params = [self.uuid(i) for i in ids] if jobs else list(ids)
        if self.ROW_LOCKS:
            cursor.execute(f"SELECT {columns} FROM {table} WHERE id IN ({marks}) ORDER BY id FOR UPDATE", params)
        else:
            touch = "seq" if jobs else "id"  # a column no index of the job table holds alone
            cursor.execute(f"UPDATE {table} SET {touch} = {touch} WHERE id IN ({marks}) RETURNING {columns}", params)
        return cursor.fetchall()

    def lock_admission(self, cursor: Any, queue: str, limited: str) -> tuple[Any, ...] | None:
        """Hold ``queue``'s admission lock until the transaction ends and return its
        ``(max_size, partition_max_size)``; None, locking nothing, when its row does not match
        ``limited`` (the queue has no size limit)."""
        return self.lock_queue(cursor, queue, "max_size, partition_max_size", limited)

    # -- jobs: ordered partitions -------------------------------------------------------------------

    def unblock_heads(self, cursor: Any, keys: list[tuple[str, str]]) -> int:
        """Clear ``blocked`` on the first ``partition_concurrency`` (default 1) unfinished jobs of
        each (queue, partition) in ``keys``; return how many were blocked."""
        freed = 0
        for queue, partition in keys:
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET blocked = {self.false()} WHERE id IN (SELECT id FROM {JOB_TABLE} "
                f"WHERE queue = %s AND partition_key = %s AND state IN {UNFINISHED_SQL} ORDER BY id LIMIT (SELECT "
                f"COALESCE(MAX(partition_concurrency), 1) FROM {QUEUE_TABLE} WHERE name = %s)) AND blocked",
                [queue, partition, queue],
            )
            freed += cursor.rowcount
        return freed

    # -- jobs: insert -----------------------------------------------------------------------------

    def insert_job_sql(self, *, notify: bool, once: bool, guarded: bool, events: bool) -> str:
        """The INSERT of one job (see drivers.inserts.insert_sql for the flags and the result)."""
        raise NotImplementedError

    def insert_job(
        self, cursor: Any, params: list[Any], *, notify: bool, once: bool, guarded: bool, events: bool
    ) -> tuple[bool, Any]:
        """Run the INSERT of one job (:meth:`insert_job_sql`); return whether a row was
        inserted and the ``enqueued_at`` stored (None: the one given, unchanged)."""
        cursor.execute(self.insert_job_sql(notify=notify, once=once, guarded=guarded, events=events), params)
        if once:  # (id, enqueued_at) when the row was inserted
            row = cursor.fetchone()
            return row is not None, None if row is None else row[1]
        inserted = cursor.rowcount == 1
        return inserted, cursor.fetchone()[0] if inserted and self.DATABASE_CLOCK else None

    def insert_plain_job(
        self,
        backend: str,
        params: list[Any],
        *,
        notify_channel: str | None,
        events_channel: str | None,
        guarded: bool = False,
    ) -> tuple[bool, Any]:
        """``enqueue()``'s plain insert (engine.insert_plain_job) of a job of ``backend``, where
        the driver has :attr:`FUSED_EFFECTS` and :attr:`DATABASE_CLOCK`: :meth:`insert_job`
        with the parameters of ``drivers.inserts.PLAIN_PARAMS`` (``guarded``: and the queue's
        name again, for the size-limit guard); its NOTIFY on
        ``notify_channel`` (None: none), its event and the events NOTIFY on ``events_channel``
        (None: no event). Returns what :meth:`insert_job` returns."""
        raise NotImplementedError

    def insert_jobs(
        self,
        cursor: Any,
        *,
        ids: list[uuid.UUID],
        texts: Sequence[str],
        part: list[tuple[str, str]],
        start: int,
        seq: int,
        offset: int,
        step: int,
        shared: list[Any],
        event: tuple[str, str] | None,
        fetch: bool = True,
    ) -> datetime | None:
        """Insert one chunk of a batch of jobs of one task: ``part`` (args JSON, kwargs JSON) of
        the jobs ``ids[start:]`` (``texts``: their ``str()``), the i-th with ``seq + offset +
        step * i``, the columns they share in ``shared``. ``event``: (queue, data JSON) of the
        chunk's ``enqueued-many`` event the statement writes (drivers with
        :attr:`FUSED_EFFECTS`). Return the ``enqueued_at`` the
        database stamped, or None when the caller gave it; ``fetch`` False: the caller gave it
        (a later chunk), so the answer is not waited for (see :meth:`pipeline`)."""
        raise NotImplementedError

    def append_enqueued_events(
        self, cursor: Any, ids: list[uuid.UUID], queue: str, data_json: str, created: datetime
    ) -> None:
        """The ``enqueued-many`` event of a chunk of jobs just inserted by :meth:`insert_jobs`:
        one row for the chunk, ``data_json`` plus ``jobs``, their ids in insert order."""
        data = {**json.loads(data_json), "jobs": [str(i) for i in ids]}
        self.append_events(cursor, [(queue, None, "enqueued-many", data)], created, "")

    # -- jobs: outcomes -----------------------------------------------------------------------------

    def record_outcomes(
        self, cursor: Any, rows: list[list[Any]], now: datetime | None, events_channel: str | None
    ) -> list[tuple[Any, ...]]:
        """Write outcome ``rows`` (:data:`OUTCOME_COLUMNS`: job id, lease token, state, return
        value JSON, error JSON, available_at, 1 to take the attempt back, the retry's seq,
        purge_at if it finished, purge_at if cancelled, run time ms), each guarded on (id,
        ``active``, lease token); return :data:`OUTCOME_RETURNING` of the rows written.
        ``events_channel``: a driver with :attr:`FUSED_EFFECTS` writes the batch's events and
        metrics in the same statement."""
        values = [
            v
            for r in rows
            for v in (self.uuid(r[0]), self.uuid(r[1]), *r[2:5], self.dt(r[5]), r[6], r[7], self.dt(r[8]),
                      self.dt(r[9]), r[10])
        ]  # fmt: skip
        row_sql = f"({', '.join(['%s'] * 11)})"
        now_sql, now_params = self.now(now)
        values_cte = f"WITH v({OUTCOME_COLUMNS}) AS (VALUES {', '.join([row_sql] * len(rows))})"
        cursor.execute(f"{values_cte} {self._outcome_update(now_sql)}", [*values, *now_params])
        return cursor.fetchall()

    def _outcome_assignments(self, now_sql: str, t: str = JOB_TABLE) -> list[tuple[str, str]]:
        """(column, expression) of the guarded UPDATE of an outcome batch from the rows of ``v``
        (row ``t``). No expression reads a column another assigns, so their order is free."""
        return [
            ("state", f"CASE WHEN {t}.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE v.state END"),
            ("return_value", "v.rv"),
            ("attempts", f"{t}.attempts - v.uncount"),
            ("worker_ids", f"CASE WHEN v.uncount = 1 THEN {self.json_pop(t + '.worker_ids')} ELSE {t}.worker_ids END"),
            ("errors", f"CASE WHEN v.err IS NULL THEN {t}.errors ELSE {self.json_append(t + '.errors', 'v.err')} END"),
            ("available_at", f"COALESCE(v.avail, {t}.available_at)"),
            ("seq", f"CASE WHEN v.avail_seq IS NULL THEN {t}.seq WHEN {t}.seq < 0 THEN -v.avail_seq ELSE v.avail_seq END"),
            ("finished_at", f"CASE WHEN v.state IN ('completed', 'failed') OR {t}.cancel_requested_at IS NOT NULL "
                            f"THEN {now_sql} ELSE NULL END"),
            ("purge_at", f"CASE WHEN {t}.cancel_requested_at IS NOT NULL THEN v.purge_c "
                         f"WHEN v.state IN ('completed', 'failed') THEN v.purge ELSE NULL END"),
            # The lease token stays: it tells a retried batch which rows its lost first try wrote.
            ("lease_expires_at", "NULL"),
        ]  # fmt: skip

    def _outcome_update(self, now_sql: str) -> str:
        """The guarded UPDATE of an outcome batch from the rows of ``v``."""
        t = JOB_TABLE
        sets = ", ".join(f"{column} = {expression}" for column, expression in self._outcome_assignments(now_sql))
        return (
            f"UPDATE {t} SET {sets} FROM v WHERE {t}.id = v.id AND {t}.state = 'active' AND {t}.lease_token = v.token "
            f"RETURNING {', '.join(f'{t}.{c}' for c in OUTCOME_RETURNING.split(', '))}"
        )

    # -- jobs: progress and logs ---------------------------------------------------------------------

    def set_progress(
        self, cursor: Any, *, job_id: uuid.UUID, lease_token: uuid.UUID, value_json: str, events_channel: str | None
    ) -> str | None:
        """Store a running job's progress, guarded on its lease; return its queue, or None when
        the job is no longer this attempt's. ``events_channel``: as for :meth:`claim_jobs`."""
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET progress = {self.cast('%s', 'jsonb')} WHERE id = %s AND state = 'active' "
            f"AND lease_token = %s RETURNING queue",
            [value_json, self.uuid(job_id), self.uuid(lease_token)],
        )
        row = cursor.fetchone()
        return None if row is None else row[0]

    def lock_job_log(self, cursor: Any, key: int) -> None:
        """Serialise the writers of one job's log until the transaction ends (nothing where the
        transaction's first write takes the database's lock)."""

    def deferred_foreign_keys(self, cursor: Any) -> Any:
        """Foreign keys checked at commit for the statements inside: a dedup key points to its
        job before the job's row is written (Django declares them deferred where it can)."""
        return contextlib.nullcontext()

    # -- dedup keys -----------------------------------------------------------------------------------

    def lock_dedup_key(
        self, cursor: Any, where: str, params: list[Any], now: datetime | None, *, write_locked: bool = False
    ) -> tuple[Any, Any, bool, bool] | None:
        """Lock the dedup key row matching ``where`` until the transaction ends; return (row id,
        holder job id, has an expiry, has expired), None when there is no such key.
        ``write_locked``: this transaction already wrote (without row locks it then holds the
        database's write lock, so a read is enough and a duplicate's commit writes nothing)."""
        if self.ROW_LOCKS:
            now_sql, now_params = self.now(now)
            cursor.execute(
                f"SELECT id, job_id, expire_at IS NOT NULL, (expire_at IS NOT NULL AND expire_at <= {now_sql}) "
                f"FROM {DEDUP_TABLE} WHERE {where} FOR UPDATE",
                [*now_params, *params],
            )
            return cursor.fetchone()
        # No row locks: a write takes the database's write lock for the transaction. A read
        # first would not do: a deferred transaction that read cannot always upgrade. The expiry
        # is compared here, not in RETURNING: SQLite 3.40.1 evaluates "expire_at IS NOT NULL" as
        # true for a NULL in the RETURNING of an UPDATE or DELETE on a table whose key is
        # declared "integer NOT NULL PRIMARY KEY", as Django declares it. The clock is this
        # process's anyway.
        if write_locked:
            cursor.execute(f"SELECT id, job_id, expire_at FROM {DEDUP_TABLE} WHERE {where}", params)
        else:
            cursor.execute(
                f"UPDATE {DEDUP_TABLE} SET job_id = job_id WHERE {where} RETURNING id, job_id, expire_at", params
            )
        row = cursor.fetchone()
        if row is None:
            return None
        expire_at = self.to_dt(row[2])
        return row[0], row[1], expire_at is not None, expire_at is not None and expire_at <= (now or timezone.now())

    def take_dedup_key(
        self, cursor: Any, key: list[Any], job_id: Any, expire_sql: str, expire_params: list[Any]
    ) -> bool:
        """Insert the dedup key ``key`` (backend, queue, key) for ``job_id``; False, writing
        nothing, when the key exists (the unique constraint decides: never check-then-insert)."""
        k = self.quote("key")
        cursor.execute(
            f"INSERT INTO {DEDUP_TABLE} (backend, queue, {k}, job_id, expire_at) "
            f"VALUES (%s, %s, %s, {self.cast('%s', 'uuid')}, {expire_sql}) "
            f"ON CONFLICT (backend, queue, {k}) DO NOTHING RETURNING id",
            [*key, job_id, *expire_params],
        )
        return cursor.fetchone() is not None

    def stash_dedup_next(
        self, cursor: Any, key: list[Any], payload_json: str, stashed_sql: str, stashed_params: list[Any]
    ) -> None:
        """Keep ``payload_json`` as the next job of dedup key ``key``, replacing an earlier one."""
        k = self.quote("key")
        cursor.execute(
            f"INSERT INTO {DEDUP_NEXT_TABLE} (backend, queue, {k}, payload, stashed_at) "
            f"VALUES (%s, %s, %s, {self.cast('%s', 'jsonb')}, {stashed_sql}) "
            f"ON CONFLICT (backend, queue, {k}) DO UPDATE SET payload = excluded.payload, "
            f"stashed_at = excluded.stashed_at",
            [*key, payload_json, *stashed_params],
        )

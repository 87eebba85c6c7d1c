"""PostgreSQL: every capability. Statements carry their own events, metrics and NOTIFY (data-
modifying CTEs), claims skip locked rows, and the hot statements are prepared."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import types
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.backends import utils as _db_utils
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings
from . import pg_wire
from .base import (
    CHUNK,
    CLAIM_COLUMNS,
    CLAIM_JSON,
    EVENT_COLUMNS,
    EVENT_TABLE,
    JOB_TABLE,
    METRIC_TABLE,
    OUTCOME_COLUMNS,
    QUEUE_TABLE,
    UNFINISHED_SQL,
    Driver,
)
from .inserts import insert_chunk_sql, insert_sql, plain_insert_sql
from .pg_sql import HORIZON_SQL, TXID, event_cte, event_notify
from .pg_topics import PgTopicVerbs

logger = logging.getLogger("django_jobs.db")

MIN_VERSION = 13  # gen_random_uuid() in core


#: What PostgreSQL's claim returns of each job besides its JSON array (claim_returning).
_CLAIM_TIMES = ("enqueued_at", "started_at", "last_attempted_at", "available_at")
_CLAIM_PLAIN = tuple(c for c in CLAIM_COLUMNS if c not in _CLAIM_TIMES)
_CLAIM_PAYLOAD = (*CLAIM_JSON, *_CLAIM_TIMES)


def _iso(column: str) -> str:
    """``column`` (a timestamptz) as ISO 8601 text, whatever the session's DateStyle (for _iso_time)."""
    return f"to_json({column}) #>> '{{}}'"


def _time_of(text: str | None, use_tz: bool) -> datetime | None:
    """A time from its JSON text (ISO 8601 with the session's offset: UTC under USE_TZ), as
    Django's loader gives it: aware in UTC, or naive in the session's time zone without USE_TZ."""
    if text is None:
        return None
    value = datetime.fromisoformat(text)
    if not use_tz:
        return value.replace(tzinfo=None)
    return value if value.tzinfo is UTC else value.astimezone(UTC)


#: :func:`_time_of` of a claimed job's times, cached: a claim's jobs share their start time, and
#: mostly their enqueue time (datetimes are immutable). An enqueue's time is new each time: not
#: cached (insert_plain_job).
_iso_time = functools.lru_cache(maxsize=1024)(_time_of)


def _outcomes_json(rows: list[list[Any]]) -> str:
    """The outcome batch's rows (``OUTCOME_COLUMNS``) as the statement's one JSON parameter.

    The ids and lease tokens go as 32 hex digits (``UUID.hex``; PostgreSQL's ``uuid`` input
    takes them), the timestamps as ISO text made once per distinct value (a batch's purge times
    are one value per state and queue). Left to ``json.dumps(default=str)``, each of the four
    was a Python call back from the C encoder, ``UUID.__str__`` the dearest: 7.9 against 2.0 µs
    per row, 9 % of the worker's CPU while draining (docs/benchmarks.md)."""
    texts: dict[datetime, str] = {}

    def ts(value: datetime | None) -> str | None:
        if value is None:
            return None
        text = texts.get(value)
        if text is None:
            text = texts[value] = value.isoformat()
        return text

    def ident(value: Any) -> str:
        return value.hex if type(value) is uuid.UUID else str(value)

    return json.dumps(
        [[ident(r[0]), ident(r[1]), r[2], r[3], r[4], ts(r[5]), r[6], r[7], ts(r[8]), ts(r[9]), r[10]] for r in rows],
        default=str,
    )


class PostgreSQLDriver(PgTopicVerbs, Driver):
    __slots__ = ()
    VENDOR = "postgresql"
    SKIP_LOCKED = True
    ROW_LOCKS = True
    LISTEN_NOTIFY = True
    ADVISORY_LOCKS = True
    DATABASE_CLOCK = True
    FUSED_EFFECTS = True
    BATCH_AS_JSON = True

    def cursor(self, *, hot: bool = False, generic: bool = False) -> Any:
        return prepared_cursor(self.connection, generic=generic) if hot else self.connection.cursor()

    # Values sent to the database: psycopg adapts UUIDs and aware datetimes itself.
    def uuid(self, value: uuid.UUID | None) -> Any:
        return value

    def dt(self, value: datetime | None) -> Any:
        return value

    def now(self, value: datetime | None) -> tuple[str, list[Any]]:
        return "COALESCE(%s::timestamptz, now())", [value]

    def now_plus(self, value: datetime | None, seconds: float) -> tuple[str, list[Any]]:
        return "(COALESCE(%s::timestamptz, now()) + make_interval(secs => %s))", [value, seconds]

    def clock(self, cursor: Any) -> datetime:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]

    def transaction_now(self, cursor: Any) -> datetime:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]

    def in_list(self, column: str, values: list[Any]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(%s)", [list(values)]

    def limit_idle_transactions(self, seconds: float) -> None:
        # set_config() rather than SET, which takes no parameter; for the session (a pooler in
        # transaction mode would hand the setting to other clients: run workers on a session pool).
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, false)", [str(math.ceil(seconds * 1000))]
            )

    def json_append(self, column: str, value_sql: str) -> str:
        return f"({column} || jsonb_build_array({value_sql}))"

    def json_append_text(self, column: str, value_sql: str) -> str:
        return f"({column} || jsonb_build_array({value_sql}::text))"

    def json_pop(self, column: str) -> str:
        return f"({column} - (jsonb_array_length({column}) - 1))"

    def json_array_text(self, columns: tuple[str, ...]) -> str:
        return f"jsonb_build_array({', '.join(columns)})::text"

    def cast(self, sql: str, pg_type: str) -> str:
        return f"{sql}::{pg_type}"

    def id_in(self, select_sql: str) -> str:
        # PostgreSQL may re-run a plain ``IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`` per
        # outer row, so LIMIT would stop bounding the update; ``ARRAY(...)`` is an InitPlan,
        # evaluated once.
        return f"id = ANY(ARRAY({select_sql}))"

    def false(self) -> str:
        return "false"

    def true(self) -> str:
        return "true"

    def not_blocked(self, alias: str) -> str:
        return f"NOT {alias}.blocked"

    def is_blocked(self, alias: str) -> str:
        return f"{alias}.blocked"

    def notify(self, cursor: Any, channel: str, payloads: list[str]) -> None:
        for payload in payloads:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])

    # -- events: in the change's own statement ---------------------------------------------------

    def events_horizon(self, cursor: Any) -> int | None:
        cursor.execute(HORIZON_SQL)
        return cursor.fetchone()[0]

    def append_events(
        self,
        cursor: Any,
        events: list[tuple[str, uuid.UUID | None, str, dict[str, Any]]],
        created: datetime,
        channel: str,
    ) -> None:
        # Stamped by the database (clock_timestamp()) and ordered by the writer's txid; the
        # events channel is notified once per statement (PostgreSQL folds a transaction's
        # identical notifications into one).
        for start in range(0, len(events), CHUNK):
            part = events[start : start + CHUNK]
            params: list[Any] = []
            for queue, job_id, kind, data in part:
                params += [queue, job_id, kind, json.dumps(data, default=str)]
            rows = ", ".join(["(%s, %s::uuid, %s, %s::jsonb)"] * len(part))
            cursor.execute(
                f"WITH ins AS (INSERT INTO {EVENT_TABLE} ({EVENT_COLUMNS}) SELECT {TXID}, v.q, v.j, v.k, v.d, "
                f"clock_timestamp() FROM (VALUES {rows}) v(q, j, k, d) RETURNING 1) "
                f"SELECT count(pg_notify(%s, '')) FROM (SELECT 1 FROM ins LIMIT 1) one",
                [*params, channel],
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
        sql, all_params = self._claim_sql(where, params, limit, lease_token, worker_id, now, lease_seconds)
        if events_channel is not None:
            # The "active" events ride on the claim.
            data = "jsonb_build_object('attempt', r.attempts, 'worker', r.worker_id)"
            sql = (
                f"WITH r AS ({sql}, worker_id), {event_cte('r', "'active'", data)} "
                f"SELECT {', '.join('r.' + c for c in (*_CLAIM_PLAIN, 'payload'))} FROM r, {event_notify('r')}"
            )
            all_params.append(events_channel)
        cursor.execute(sql, all_params)
        return cursor.fetchall()

    def to_dt(self, value: Any) -> datetime | None:
        if isinstance(value, str):  # a time the statement returned as ISO text (_iso)
            return _iso_time(value, settings.USE_TZ)
        return super().to_dt(value)

    def claim_returning(self) -> str:
        # The four times ride in the JSON array: psycopg's timestamptz loader took 1.55 µs per
        # value (the four, a sixth of the claim's CPU in the worker), and the times of one claim
        # repeat (see _iso_time).
        return ", ".join([*_CLAIM_PLAIN, f"jsonb_build_array({', '.join(_CLAIM_PAYLOAD)})::text AS payload"])

    def claim_values(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        (jid, backend, queue, path, prio, attempts, max_attempts, token, seq, parent, trace_id, partition,
         payload) = row  # fmt: skip
        args, kwargs, options, errors, worker_ids, enq, started, last, avail = json.loads(payload)
        tz = settings.USE_TZ
        return (
            jid, backend, queue, path, args, kwargs, prio, attempts, max_attempts, options, token, _iso_time(enq, tz),
            _iso_time(started, tz), _iso_time(last, tz), _iso_time(avail, tz), errors, worker_ids, seq, parent,
            trace_id, partition,
        )  # fmt: skip

    # -- jobs: insert -----------------------------------------------------------------------------

    def pipeline(self) -> Any:
        # psycopg's pipeline mode: a statement is sent without waiting for the answer of the one
        # before it. Errors surface on a fetch or on leaving the block, translated as Django's.
        return _pipeline(self.connection)

    def insert_job_sql(self, *, notify: bool, once: bool, guarded: bool, events: bool) -> str:
        return insert_sql(True, notify=notify, once=once, guarded=guarded, events=events)

    def insert_plain_job(
        self,
        backend: str,
        params: list[Any],
        *,
        notify_channel: str | None,
        events_channel: str | None,
        guarded: bool = False,
    ) -> tuple[bool, Any]:
        """:meth:`insert_job` of ``enqueue()``'s plain insert (:func:`plain_insert_sql`), on a
        cursor kept for it (:func:`kept_cursor`)."""
        sql = plain_insert_sql(backend, notify_channel, events_channel, guarded)
        connection = self.connection
        raw = kept_cursor(connection)
        if raw is None:
            with self.cursor(hot=True) as cursor:
                return self._insert_plain(cursor, sql, params)
        if observed(connection):
            return self._insert_plain(connection._prepare_cursor(raw), sql, params)
        # Nobody watches Django's cursor here: what its wrapper would do, without building one,
        # and the statement sent through libpq under the cursor (drivers.pg_wire).
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        with connection.wrap_database_errors:
            sent = raw.send_plain(sql, params)
            if sent is None:
                return self._insert_plain(raw, sql, params)
            return sent[0], _time_of(sent[1], settings.USE_TZ)

    @staticmethod
    def _insert_plain(cursor: Any, sql: str, params: list[Any]) -> tuple[bool, Any]:
        cursor.execute(sql, params)
        row = cursor.fetchone()  # enqueued_at as ISO text (and the NOTIFYs' voids) when the row was inserted
        return row is not None, None if row is None else _time_of(row[0], settings.USE_TZ)

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
        # The rows as one JSON array of [id, args, kwargs, seq]: the args and kwargs are JSON the
        # caller validated, spliced in as they are rather than parsed and dumped again.
        rows = (
            "["
            + ",".join(
                f'["{texts[i]}",{args_json},{kwargs_json},{seq + offset + step * i}]'
                for i, (args_json, kwargs_json) in enumerate(part, start)
            )
            + "]"
        )
        params: list[Any] = [rows, *(event or ()), *shared]  # the WITH comes first in the statement
        cursor.execute(insert_chunk_sql(True, CHUNK, event is not None), params)
        # The statement returns the enqueued_at it stored; later chunks reuse it, and do not
        # wait for their answer (in a pipeline, the next chunk is built while this one runs).
        return self.to_dt(cursor.fetchone()[0]) if fetch else None

    # -- jobs: outcomes -----------------------------------------------------------------------------

    def _outcome_update(self, now_sql: str) -> str:
        # The batch's rows are fetched through the primary key, one probe per outcome: the
        # generic plan of the prepared statement otherwise read every active job through
        # django_jobs_active_idx (whose size the statistics put at a row or two) and hashed them
        # to join the batch, a fifth of the server's CPU while draining with prefetch, and more
        # the more jobs the workers hold. The guard's 'active' comes from a sub-select, a value
        # the planner cannot match to that partial index's condition.
        t = JOB_TABLE
        update = super()._outcome_update(now_sql)
        guard = f"{t}.state = 'active'"
        assert update.count(guard) == 1
        return update.replace(guard, f"{t}.id = ANY(ARRAY(SELECT id FROM v)) AND {t}.state = (SELECT 'active')")

    def record_outcomes(
        self, cursor: Any, rows: list[list[Any]], now: datetime | None, events_channel: str | None
    ) -> list[tuple[Any, ...]]:
        now_sql, now_params = self.now(now)
        # The whole batch is one JSON parameter (serialised by json's C encoder) and the
        # statement's text is the same for every batch size, so psycopg parses it once. (A VALUES
        # list of 11 parameters a row was parsed and quoted anew for every batch: the completer's
        # largest cost.)
        values_cte = (
            f"WITH v({OUTCOME_COLUMNS}) AS (SELECT (e->>0)::uuid, (e->>1)::uuid, e->>2, (e->>3)::jsonb, "
            f"(e->>4)::jsonb, (e->>5)::timestamptz, (e->>6)::integer, (e->>7)::bigint, (e->>8)::timestamptz, "
            f"(e->>9)::timestamptz, (e->>10)::bigint FROM jsonb_array_elements(%s::jsonb) e)"
        )
        update = self._outcome_update(now_sql)
        params = [_outcomes_json(rows), *now_params]
        # The batch's events and its Metric counts ride on the same statement: no round trip
        # more, and they commit (or not) with the outcomes they count.
        events = events_channel is not None
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
            + (f"{event_cte('r', kind, data)}, " if events else "")
            + f"m AS (INSERT INTO {METRIC_TABLE} (queue, minute, completed, failed, retried, runtime_ms) "
            f"SELECT r.queue, date_trunc('minute', {now_sql}, 'UTC'), count(*) FILTER (WHERE r.state = 'completed'), "
            f"count(*) FILTER (WHERE r.state = 'failed'), "
            f"count(*) FILTER (WHERE r.state IN ('waiting', 'delayed') AND r.uncount = 0), "
            f"COALESCE(round(sum({runtime}) FILTER (WHERE {ended})), 0)::bigint "
            f"FROM r GROUP BY r.queue ORDER BY r.queue "
            f"ON CONFLICT (queue, minute) DO UPDATE SET completed = {METRIC_TABLE}.completed + EXCLUDED.completed, "
            f"failed = {METRIC_TABLE}.failed + EXCLUDED.failed, retried = {METRIC_TABLE}.retried + EXCLUDED.retried, "
            f"runtime_ms = {METRIC_TABLE}.runtime_ms + EXCLUDED.runtime_ms) "
            # The two times as ISO text, which to_dt reads (cached: one finish time per batch, one
            # start time per claim) faster than psycopg's timestamptz loader.
            f"SELECT r.id, r.queue, r.state, r.parent_id, r.partition_key, r.attempts, {_iso('r.last_attempted_at')}, "
            f"{_iso('r.finished_at')} FROM r" + (f", {event_notify('r')}" if events else "")
        )
        if events:
            params += now_params  # the run time in the event's data
        params += [*now_params, *now_params]  # the metric's minute and run time
        if events:
            params.append(events_channel)
        cursor.execute(sql, params)
        return cursor.fetchall()

    # -- jobs: progress and logs ---------------------------------------------------------------------

    def set_progress(
        self, cursor: Any, *, job_id: uuid.UUID, lease_token: uuid.UUID, value_json: str, events_channel: str | None
    ) -> str | None:
        update = (
            f"UPDATE {JOB_TABLE} SET progress = %s::jsonb WHERE id = %s AND state = 'active' "
            f"AND lease_token = %s RETURNING id, queue"
        )
        params: list[Any] = [value_json, job_id, lease_token]
        if events_channel is None:
            cursor.execute(update, params)
        else:
            # The update and its event in one statement, as on the other hot paths.
            data = "jsonb_build_object('progress', %s::jsonb)"
            cursor.execute(
                f"WITH r AS ({update}), {event_cte('r', "'progress'", data)} SELECT r.id, r.queue FROM r, "
                f"{event_notify('r')}",
                [*params, value_json, events_channel],
            )
        row = cursor.fetchone()
        return None if row is None else row[1]

    def lock_job_log(self, cursor: Any, key: int) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])

    # -- queues: locks ----------------------------------------------------------------------------

    def lock_admission(self, cursor: Any, queue: str, limited: str) -> tuple[Any, ...] | None:
        # An advisory lock, not the QueueState row's: the caller keeps it until its transaction
        # ends, and a long transaction must not hold up the claims (which lock the row).
        cursor.execute(f"SELECT 1 FROM {QUEUE_TABLE} WHERE name = %s AND {limited}", [queue])
        if cursor.fetchone() is None:
            return None
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"django_jobs.admit:{queue}"])
        cursor.execute(f"SELECT max_size, partition_max_size FROM {QUEUE_TABLE} WHERE name = %s", [queue])
        return cursor.fetchone()

    # -- jobs: ordered partitions -------------------------------------------------------------------

    def unblock_heads(self, cursor: Any, keys: list[tuple[str, str]]) -> int:
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


@contextlib.contextmanager
def _pipeline(connection: Any) -> Iterator[None]:
    connection.ensure_connection()
    raw = connection.connection
    if not hasattr(raw, "pipeline"):  # psycopg2
        yield
        return
    with connection.wrap_database_errors, raw.pipeline():
        yield


# -- statements sent thousands of times ----------------------------------------------------------


def prepared_cursor(connection: Any, *, generic: bool = False) -> Any:
    """A cursor for the statements every job sends (insert, claim, outcome batch).

    With ``PREPARED_STATEMENTS`` on (the default): a server-side-binding psycopg cursor whose
    statements are prepared, so the server parses and plans each statement's text once per
    connection, not once per call (planning was 0.6-0.8 ms of a claim or an outcome batch; the
    parameters change from call to call, the text does not). Django's own cursors bind on the
    client and never prepare (``prepare_threshold`` is None, for connection poolers). The cursor
    is wrapped like Django's, so error translation, ``execute_wrapper`` and the debug query log
    see these statements too. With the setting off (a PgBouncer older than 1.21 in transaction
    mode), with psycopg2, or once a pooler refused a prepared statement: Django's cursor.

    ``generic`` (the worker's claims and outcome batches): the connection plans prepared
    statements once (``plan_cache_mode = force_generic_plan``): PostgreSQL's "auto" mode kept
    re-planning them, a quarter of the server's CPU while draining. Their best plan does not
    depend on the values (ids, a token, a batch as one JSON array, LIMIT). Not asked for the
    insert, which runs on the project's own connections, where the setting would also reach its
    PL/pgSQL functions. Those connections also turn JIT off (``jit = off``): a generic plan is
    priced without its LIMIT's value, so on a backlog of some 40,000 jobs a claim's estimate
    passed ``jit_above_cost`` and every claim was JIT-compiled (20-30 ms instead of 1 ms, a
    100,000-job drain at a tenth of its speed). No statement of theirs gains from JIT.
    """
    global _refused_by_pooler
    if _refused_by_pooler or not get_settings().PREPARED_STATEMENTS:
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if not hasattr(raw, "prepare_threshold"):  # psycopg2: no server-side binding
        return connection.cursor()
    if generic and not getattr(raw, "_django_jobs_generic", False):
        if connection.get_autocommit() and not connection.in_atomic_block:  # no rollback takes it back
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), set_config('jit', 'off', false)"
                )
            raw._django_jobs_generic = True
    cursor = _prepared_cursor_class()(raw)
    if generic and _utc_connection(connection, raw):
        # The claims and outcome batches read several timestamps per job. Django loads each through
        # its Python loader (psycopg's, then a replace() of the zone); on a UTC connection
        # psycopg's own C loader returns the same aware datetime (zone datetime.timezone.utc).
        cursor.adapters.register_loader("timestamptz", _native_timestamptz_loader())
    return connection._prepare_cursor(cursor)


def _utc_connection(connection: Any, raw: Any) -> bool:
    """Django reads timestamps in UTC (USE_TZ, no per-database TIME_ZONE) and the session's
    zone is UTC: then psycopg's native loader gives what Django's gives."""
    return connection.timezone is UTC and raw.info.parameter_status("TimeZone") == "UTC"


@functools.cache
def _native_timestamptz_loader() -> type:
    from psycopg.types.datetime import TimestamptzLoader  # optional: the package imports without psycopg

    return TimestamptzLoader


def kept_cursor(connection: Any) -> Any:
    """The psycopg cursor of ``enqueue()``'s insert, kept open on the connection and reused, or
    None where prepared statements are off: use :func:`prepared_cursor` then. Unwrapped: wrap it
    (``connection._prepare_cursor``) when :func:`observed`, so the debug query log and execute
    wrappers see it. The caller must not close it. Making a psycopg cursor (its adapters, its
    loaders) and Django's wrapper was a tenth of the client's Python in a one-job enqueue.

    None too while the connection is shared between threads (``inc_thread_sharing()``, as
    ``LiveServerTestCase`` does): one thread's ``execute`` would replace the result another
    is about to fetch from the same cursor. A cursor per call has its own."""
    if _refused_by_pooler or not get_settings().PREPARED_STATEMENTS or connection.allow_thread_sharing:
        return None
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if not hasattr(raw, "prepare_threshold"):  # psycopg2
        return None
    cursor = getattr(raw, "_django_jobs_kept", None)
    if cursor is None or cursor.closed:
        cursor = raw._django_jobs_kept = _prepared_cursor_class()(raw)
        if _utc_connection(connection, raw):  # as prepared_cursor's: Django's loader was 2 % of the call
            cursor.adapters.register_loader("timestamptz", _native_timestamptz_loader())
    return cursor


def observed(connection: Any) -> bool:
    """Whether something may watch the statements of Django's cursors on ``connection``: an
    ``execute_wrapper``, the query log (``DEBUG``, ``assertNumQueries``, ``CaptureQueriesContext``),
    a ``make_cursor`` of the connection's own (its class's or set on it), or a tool that replaced
    ``CursorWrapper.execute`` or the methods it calls (APM agents do). Tools that replace
    ``connection.cursor()`` itself never saw this kept cursor. When none does, the plain insert
    runs on the psycopg cursor itself, inside Django's error translation, as the wrapper would
    run it; the wrapper's Python was 3 % of a one-job enqueue's instructions."""
    return bool(
        connection.execute_wrappers
        or connection.queries_logged
        or type(connection).make_cursor is not _DJANGO_MAKE_CURSOR
        or "make_cursor" in vars(connection)
        or not _django_cursor_wrapper()
    )


#: The methods of Django's CursorWrapper an execute passes through, which tools replace.
_WRAPPER_METHODS = ("execute", "_execute_with_wrappers", "_execute")


def _django_originals() -> dict[str, Any] | None:
    """Django's own :data:`_WRAPPER_METHODS` as this module found them, or None when one was
    already replaced then (its code is not Django's)."""
    found = {}
    for name in _WRAPPER_METHODS:
        method = _db_utils.CursorWrapper.__dict__.get(name)
        code = getattr(method, "__code__", None)
        if type(method) is not types.FunctionType or code is None or code.co_filename != _db_utils.__file__:
            return None
        found[name] = method
    return found


_DJANGO_ORIGINALS = _django_originals()


def _django_cursor_wrapper() -> bool:
    """Whether Django's CursorWrapper still runs an execute through Django's own code."""
    if _DJANGO_ORIGINALS is None:
        return False
    methods = _db_utils.CursorWrapper.__dict__
    return all(methods.get(name) is method for name, method in _DJANGO_ORIGINALS.items())


#: A pooler refused a prepared statement (it does not keep them across transactions): from
#: then on this process sends the hot statements unprepared, as Django sends its own.
_refused_by_pooler = False
_NEVER = 2**31 - 1
_PREPARED_CURSOR: type | None = None
_DJANGO_MAKE_CURSOR = BaseDatabaseWrapper.make_cursor


def _prepared_cursor_class() -> type:
    """psycopg's server-side-binding cursor, preparing every statement it runs (built on first
    use: the package imports without psycopg)."""
    global _PREPARED_CURSOR
    if _PREPARED_CURSOR is None:
        import psycopg  # optional: the package imports without psycopg
        from psycopg import errors

        refusals = (errors.InvalidSqlStatementName, errors.DuplicatePreparedStatement)

        def refused(conn: Any, exc: Exception) -> None:
            # "prepared statement ... does not exist / already exists": a pooler in transaction
            # mode hands each transaction another server connection.
            global _refused_by_pooler
            _refused_by_pooler = True
            pg_wire.forget(conn)
            logger.warning(
                "The database refused a prepared statement (%s); probably a connection pooler in "
                "transaction mode. This process now sends django-jobs' statements unprepared; set "
                "DJANGO_JOBS['PREPARED_STATEMENTS'] = False to say so from the start.",
                exc,
            )
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raise exc  # the transaction failed with it: the caller's to retry

        class PreparedCursor(psycopg.Cursor):
            def execute(self, query: Any, params: Any = None, *, prepare: bool | None = True, **kw: Any) -> Any:
                conn = self.connection
                # Django sets the threshold to None, which also ignores prepare=True; ours are
                # prepared only for the length of this call, so Django's statements on the same
                # connection are neither prepared nor counted by psycopg's cache.
                threshold, conn.prepare_threshold = conn.prepare_threshold, _NEVER
                try:
                    return super().execute(query, params, prepare=prepare and not _refused_by_pooler, **kw)
                except refusals as exc:
                    refused(conn, exc)
                    return super().execute(query, params, prepare=False, **kw)
                finally:
                    conn.prepare_threshold = threshold

            def send_plain(self, query: str, params: list[Any]) -> tuple[bool, str | None] | None:
                """:func:`drivers.pg_wire.send_plain` on this cursor's connection; None: not
                sent, run ``query`` on the cursor."""
                if _refused_by_pooler:
                    return None
                try:
                    return pg_wire.send_plain(self.connection, query, params)
                except refusals as exc:
                    refused(self.connection, exc)
                    return None

        _PREPARED_CURSOR = PreparedCursor
    return _PREPARED_CURSOR

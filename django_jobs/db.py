"""Vendor differences in one small place: SQL fragments, parameter adaptation, row decoding,
SQLite set-up, and which database errors are transient."""

from __future__ import annotations

import json
import logging
import sqlite3
import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.db.backends.signals import connection_created
from django.dispatch import receiver

logger = logging.getLogger("django_jobs.db")

SUPPORTED_VENDORS = ("postgresql", "sqlite", "mysql")  # Django's vendor "mysql" is MySQL and MariaDB
MIN_POSTGRESQL = 13  # gen_random_uuid() in core
MIN_SQLITE = (3, 35, 0)  # UPDATE ... RETURNING
MIN_MYSQL = (8, 0, 1)  # SELECT ... FOR UPDATE SKIP LOCKED
MIN_MARIADB = (10, 6)  # SELECT ... FOR UPDATE SKIP LOCKED

# SQLite reports a missing table as an OperationalError too; that one no retry will fix.
_PERMANENT_MESSAGES = ("no such table", "no such column", "syntax error", "has no column named")


def is_transient(exc: BaseException) -> bool:
    """True for errors a retry can fix: a dropped connection, a busy or locked database, a
    serialization failure or deadlock (PostgreSQL reports those as OperationalError too)."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    message = str(exc).lower()
    return not any(m in message for m in _PERMANENT_MESSAGES)


def vendor(using: str) -> str:
    return connections[using].vendor


def jobs_database_aliases() -> set[str]:
    from .conf import get_settings

    aliases = {get_settings().DATABASE}
    for alias, params in getattr(settings, "TASKS", {}).items():
        if str(params.get("BACKEND", "")).startswith("django_jobs."):
            aliases.add(get_settings(alias).DATABASE)
    return aliases


@receiver(connection_created)
def _configure_sqlite(sender: Any, connection: Any, **kwargs: Any) -> None:
    """SQLite: WAL lets readers run beside the one writer; the busy timeout makes a writer wait
    for the lock instead of failing with "database is locked"."""
    if connection.vendor != "sqlite":
        return
    from .conf import get_settings

    try:
        if connection.alias not in jobs_database_aliases():
            return
        conf = get_settings()
    except Exception:  # noqa: BLE001 - a misconfiguration is reported by the system checks
        return
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {int(conf.SQLITE_BUSY_TIMEOUT_MS)}")
        if conf.SQLITE_WAL and not connection.is_in_memory_db():
            cursor.execute("PRAGMA journal_mode = WAL")


def sqlite_version() -> tuple[int, ...]:
    return sqlite3.sqlite_version_info


# -- statements sent thousands of times -----------------------------------------------------


def hot_cursor(using: str, *, generic: bool = False) -> Any:
    """A cursor for the statements every job sends (insert, claim, outcome batch).

    On PostgreSQL with ``PREPARED_STATEMENTS`` on (the default): a server-side-binding psycopg
    cursor whose statements are prepared, so the server parses and plans each statement's text
    once per connection, not once per call (planning was 0.6-0.8 ms of a claim or an outcome
    batch; the parameters change from call to call, the text does not). Django's own cursors bind
    on the client and never prepare (``prepare_threshold`` is None, for connection poolers). The
    cursor is wrapped like Django's, so error translation, ``execute_wrapper`` and the debug
    query log see these statements too. Elsewhere, with the setting off (a PgBouncer older than
    1.21 in transaction mode), or once a pooler refused a prepared statement: Django's cursor.

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
    connection = connections[using]
    if connection.vendor != "postgresql" or _refused_by_pooler or not _prepare_statements():
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
    return connection._prepare_cursor(_prepared_cursor_class()(raw))


#: A pooler refused a prepared statement (it does not keep them across transactions): from
#: then on this process sends the hot statements unprepared, as Django sends its own.
_refused_by_pooler = False
_NEVER = 2**31 - 1


def _prepare_statements() -> bool:
    from .conf import get_settings

    return bool(get_settings().PREPARED_STATEMENTS)


_PREPARED_CURSOR: type | None = None


def _prepared_cursor_class() -> type:
    """psycopg's server-side-binding cursor, preparing every statement it runs (built on first
    use: the package imports without psycopg)."""
    global _PREPARED_CURSOR
    if _PREPARED_CURSOR is None:
        import psycopg
        from psycopg import errors

        refusals = (errors.InvalidSqlStatementName, errors.DuplicatePreparedStatement)

        class PreparedCursor(psycopg.Cursor):
            def execute(self, query: Any, params: Any = None, *, prepare: bool | None = True, **kw: Any) -> Any:
                global _refused_by_pooler
                conn = self.connection
                # Django sets the threshold to None, which also ignores prepare=True; ours are
                # prepared only for the length of this call, so Django's statements on the same
                # connection are neither prepared nor counted by psycopg's cache.
                threshold, conn.prepare_threshold = conn.prepare_threshold, _NEVER
                try:
                    return super().execute(query, params, prepare=prepare, **kw)
                except refusals as exc:
                    # "prepared statement ... does not exist / already exists": a pooler in
                    # transaction mode hands each transaction another server connection.
                    _refused_by_pooler = True
                    logger.warning(
                        "The database refused a prepared statement (%s); probably a connection pooler in "
                        "transaction mode. This process now sends django-jobs' statements unprepared; set "
                        "DJANGO_JOBS['PREPARED_STATEMENTS'] = False to say so from the start.",
                        exc,
                    )
                    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        raise  # the transaction failed with it: the caller's to retry
                    return super().execute(query, params, prepare=False, **kw)
                finally:
                    conn.prepare_threshold = threshold

        _PREPARED_CURSOR = PreparedCursor
    return _PREPARED_CURSOR


# -- parameter adaptation and row decoding -------------------------------------------------


class Dialect:
    """How one vendor spells the few things the engine's raw SQL needs."""

    def __init__(self, using: str):
        self.using = using
        self.connection = connections[using]
        self.vendor = self.connection.vendor
        self.pg = self.vendor == "postgresql"

    # Values sent to the database.
    def uuid(self, value: uuid.UUID | None) -> Any:
        if value is None:
            return None
        return value if self.pg else value.hex

    def dt(self, value: datetime | None) -> Any:
        if value is None or self.pg:
            return value
        return self.connection.ops.adapt_datetimefield_value(value)

    def now(self, value: datetime | None) -> tuple[str, list[Any]]:
        """SQL for "now": the database clock on PostgreSQL unless a time is given (tests)."""
        if self.pg:
            return "COALESCE(%s::timestamptz, now())", [value]
        from django.utils import timezone

        return "%s", [self.dt(value or timezone.now())]

    def now_plus(self, value: datetime | None, seconds: float) -> tuple[str, list[Any]]:
        """SQL for "now + seconds" (a lease expiry), on the same clock as :meth:`now`."""
        if self.pg:
            return "(COALESCE(%s::timestamptz, now()) + make_interval(secs => %s))", [value, seconds]
        from datetime import timedelta

        from django.utils import timezone

        return "%s", [self.dt((value or timezone.now()) + timedelta(seconds=seconds))]

    def in_list(self, column: str, values: list[Any]) -> tuple[str, list[Any]]:
        if self.pg:
            return f"{column} = ANY(%s)", [list(values)]
        return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)

    def json_append(self, column: str, value_sql: str) -> str:
        """``column`` (a JSON array) with one JSON value appended."""
        if self.pg:
            return f"({column} || jsonb_build_array({value_sql}))"
        return f"json_insert({column}, '$[#]', json({value_sql}))"

    def json_append_text(self, column: str, value_sql: str) -> str:
        if self.pg:
            return f"({column} || jsonb_build_array({value_sql}::text))"
        return f"json_insert({column}, '$[#]', {value_sql})"

    def json_pop(self, column: str) -> str:
        if self.pg:
            return f"({column} - (jsonb_array_length({column}) - 1))"
        return f"json_remove({column}, '$[#-1]')"

    def cast(self, sql: str, pg_type: str) -> str:
        return f"{sql}::{pg_type}" if self.pg else sql

    def id_in(self, select_sql: str) -> str:
        """``id`` is among the ids ``select_sql`` returns, with the subquery run exactly once.

        PostgreSQL may re-run a plain ``IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`` per
        outer row, so LIMIT would stop bounding the update; ``ARRAY(...)`` is an InitPlan,
        evaluated once. SQLite evaluates an uncorrelated IN subquery once.
        """
        if self.pg:
            return f"id = ANY(ARRAY({select_sql}))"
        return f"id IN ({select_sql})"

    def false(self) -> str:
        return "false" if self.pg else "0"

    def not_blocked(self, alias: str) -> str:
        """A job is not blocked, spelled as the ready indexes' condition (PostgreSQL ``NOT
        "blocked"``, SQLite ``"blocked" = 0``: SQLite uses a partial index only for a query that
        repeats its terms)."""
        return f"NOT {alias}.blocked" if self.pg else f"{alias}.blocked = 0"

    def is_blocked(self, alias: str) -> str:
        return f"{alias}.blocked" if self.pg else f"{alias}.blocked = 1"

    def skip_locked(self) -> str:
        # SQLite has no row locks: a single UPDATE statement holds the database write lock.
        return "FOR UPDATE SKIP LOCKED" if self.pg else ""

    # Values read back from raw SQL.
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

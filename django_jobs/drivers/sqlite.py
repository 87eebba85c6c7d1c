"""SQLite: the zero-setup database. No row locks: a claim is one UPDATE, which holds the
database's write lock for its length; events and metrics are a second statement in the same
transaction; workers poll. WAL and a busy timeout are set on each connection."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.backends.signals import connection_created
from django.dispatch import receiver

from ..conf import get_settings
from ..db import jobs_database_aliases
from .base import CHUNK, Driver
from .inserts import insert_chunk_sql, insert_many_sql, insert_sql

MIN_VERSION = (3, 35, 0)  # UPDATE ... RETURNING


class SQLiteDriver(Driver):
    __slots__ = ()
    VENDOR = "sqlite"

    def json_append(self, column: str, value_sql: str) -> str:
        return f"json_insert({column}, '$[#]', json({value_sql}))"

    def json_append_text(self, column: str, value_sql: str) -> str:
        return f"json_insert({column}, '$[#]', {value_sql})"

    def json_array_text(self, columns: tuple[str, ...]) -> str:
        return f"json_array({', '.join(f'json({c})' for c in columns)})"

    def json_pop(self, column: str) -> str:
        return f"json_remove({column}, '$[#-1]')"

    def insert_job_sql(self, *, notify: bool, once: bool, guarded: bool, events: bool) -> str:
        return insert_sql(False, notify=False, once=once, guarded=guarded)

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
        params: list[Any] = []
        for i, (args_json, kwargs_json) in enumerate(part, start):
            params += (ids[i].hex, args_json, kwargs_json, seq + offset + step * i)
        params += shared
        n = len(part)
        cursor.execute(insert_chunk_sql(False, n) if n == CHUNK else insert_many_sql(False, n), params)
        return None


def version() -> tuple[int, ...]:
    import sqlite3  # here: a project on another database need not load it (1 MiB)

    return sqlite3.sqlite_version_info


@receiver(connection_created)
def _configure(sender: Any, connection: Any, **kwargs: Any) -> None:
    """WAL lets readers run beside the one writer; the busy timeout makes a writer wait for the
    lock instead of failing with "database is locked"."""
    if connection.vendor != "sqlite":
        return
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

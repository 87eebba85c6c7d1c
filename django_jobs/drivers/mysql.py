"""MySQL 8.0+ and MariaDB 10.6+ (Django's vendor ``mysql``): SKIP LOCKED and row locks, but no
``RETURNING`` on UPDATE, no ``ON CONFLICT``, no partial indexes and no LISTEN/NOTIFY.

What a statement returns elsewhere takes three here, in one transaction: lock the rows
(``SELECT ... FOR UPDATE``, which also decides which rows the change takes), change them by
id, read them back. Workers poll instead of listening. Written to what MySQL 8.0 and MariaDB
10.6 share; tested on MariaDB.

Two traps this driver keeps away from the engine: an UPDATE assigns left to right, each
expression reading the columns already assigned (the engine orders its assignments so that
none reads a column assigned before it); and ``IN (SELECT ... LIMIT n)`` or a subquery on the
table being changed is refused, so :meth:`MySQLDriver.id_in` reads ids through a derived table.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from .base import (
    CHUNK,
    DEDUP_NEXT_TABLE,
    DEDUP_TABLE,
    EVENT_TABLE,
    JOB_TABLE,
    LEASE_TABLE,
    METRIC_TABLE,
    OUTCOME_COLUMNS,
    OUTCOME_RETURNING,
    QUEUE_TABLE,
    UNFINISHED_SQL,
    Driver,
)
from .inserts import INSERT_COLUMNS, SIZE_LIMITED
from .topics import PARTITION_TABLE

MIN_MYSQL = (8, 0, 1)  # SELECT ... FOR UPDATE SKIP LOCKED
MIN_MARIADB = (10, 6)  # SELECT ... FOR UPDATE SKIP LOCKED

#: The columns of a new job's row, in the order of engine.insert._insert_params.
_NEW_JOB_COLUMNS = f"{INSERT_COLUMNS}, trace_id, dedup_key, idempotency_key, partition_key, blocked"
_NEW_JOB_VALUES = "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0, 0, '[]', '[]', %s, %s, %s, %s, %s, %s"
_ENQUEUED_PARAM = 11  # enqueued_at's place in engine.insert._insert_params
#: All placeholders, so the client folds an executemany() into one multi-row INSERT (it does only
#: for a VALUES list of nothing but placeholders).
_MANY_VALUES = _NEW_JOB_VALUES.replace("0, 0, 0, '[]', '[]'", "%s, %s, %s, %s, %s")


#: The txid of an event no reader may see yet: written by every writer, replaced by a batch
#: number when published (:meth:`MySQLDriver.events_horizon`). Above every batch number, so
#: the order index keeps unpublished events after the published ones.
UNPUBLISHED = 1 << 62
#: The lease row whose counter numbers the published batches (models/lease.py).
EVENTS_LEASE = "events"
#: Events published per read of the log, at most.
PUBLISH_BATCH = 10_000


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class MySQLDriver(Driver):
    __slots__ = ()
    VENDOR = "mysql"
    RETURNING = False
    SKIP_LOCKED = True
    ROW_LOCKS = True
    PARTIAL_INDEXES = False
    NEW_EVENT_TXID = UNPUBLISHED

    # -- the event log (django_jobs_event) -----------------------------------------------------

    def events_horizon(self, cursor: Any) -> int | None:
        """Publish the events committed since the last read, then return the first batch number
        no reader may see yet.

        InnoDB hands out AUTO_INCREMENT ids before commit and has no horizon of running
        transactions to read, so event ids commit out of order with nothing to tell a reader
        which are still to come. Events are therefore written unpublished (``txid`` =
        :data:`UNPUBLISHED`) and a reader publishes them: it locks the committed ones
        (``SKIP LOCKED`` passes those whose transaction is still running), takes the next batch
        number from the ``events`` lease row and stamps them with it. The row lock makes
        publishers take turns, so batch numbers commit in order; an event that commits later
        gets a later batch, whatever its id. Pages are ordered by ``(txid, id)`` below the
        horizon: a cursor never passes an event that can still appear.

        Inside the caller's transaction nothing is published (its own uncommitted events would
        be, and a rollback would hand their batch number out again): the page holds what earlier
        reads published.
        """
        if not self.connection.in_atomic_block:
            with transaction.atomic(using=self.using):
                cursor.execute(
                    f"SELECT id FROM {EVENT_TABLE} WHERE txid = %s ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                    [UNPUBLISHED, PUBLISH_BATCH],
                )
                ids = [row[0] for row in cursor.fetchall()]
                if ids:
                    cursor.execute(
                        f"INSERT INTO {LEASE_TABLE} (name, holder, counter) VALUES (%s, '', 1) "
                        f"ON DUPLICATE KEY UPDATE counter = counter + 1",
                        [EVENTS_LEASE],
                    )
                    cursor.execute(f"SELECT counter FROM {LEASE_TABLE} WHERE name = %s", [EVENTS_LEASE])
                    batch = cursor.fetchone()[0]
                    for start in range(0, len(ids), CHUNK):
                        part = ids[start : start + CHUNK]
                        cursor.execute(
                            f"UPDATE {EVENT_TABLE} SET txid = %s WHERE id IN ({_marks(len(part))})", [batch, *part]
                        )
            if ids:
                return batch + 1  # committed; a later publisher's batch is read next time
        cursor.execute(f"SELECT counter FROM {LEASE_TABLE} WHERE name = %s", [EVENTS_LEASE])
        row = cursor.fetchone()
        return (row[0] if row else 0) + 1

    # -- SQL fragments --------------------------------------------------------------------------

    def json_append(self, column: str, value_sql: str) -> str:
        # JSON_EXTRACT(..., '$') makes the text a JSON value, so it is appended as one, not as a string.
        return f"JSON_ARRAY_APPEND({column}, '$', JSON_EXTRACT({value_sql}, '$'))"

    def json_append_text(self, column: str, value_sql: str) -> str:
        return f"JSON_ARRAY_APPEND({column}, '$', {value_sql})"

    def json_pop(self, column: str) -> str:
        return f"JSON_REMOVE({column}, CONCAT('$[', JSON_LENGTH({column}) - 1, ']'))"

    def json_array_text(self, columns: tuple[str, ...]) -> str:
        # Concatenated, not JSON_ARRAY(): MariaDB's JSON columns are text, which JSON_ARRAY would
        # quote as strings. Each column holds valid JSON, so the result is a valid array.
        return "CONCAT('[', " + ", ',', ".join(columns) + ", ']')"

    def id_in(self, select_sql: str) -> str:
        # Through a derived table: MySQL refuses LIMIT in an IN subquery, and a subquery on the
        # table an UPDATE or DELETE changes; a derived table is read (and materialised) first.
        return f"id IN (SELECT id FROM ({select_sql}) AS chosen)"

    def fewer_than(self, from_where: str, n: int) -> str:
        # A plain count: a derived table cannot name the outer query's rows here.
        return f"(SELECT COUNT(*) {from_where}) < {int(n)}"

    # -- any table --------------------------------------------------------------------------------

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
        # The assignments must not read a column assigned before them (see the module's doc).
        with transaction.atomic(using=self.using):
            cursor.execute(f"SELECT id FROM {table} WHERE {where_sql} FOR UPDATE", where_params)
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                return []
            cursor.execute(f"UPDATE {table} SET {set_sql} WHERE id IN ({_marks(len(ids))})", [*set_params, *ids])
            cursor.execute(f"SELECT {returning} FROM {table} WHERE id IN ({_marks(len(ids))})", ids)
            return list(cursor.fetchall())

    # -- sessions -----------------------------------------------------------------------------------

    def limit_idle_transactions(self, seconds: float) -> None:
        if not self.connection.mysql_is_mariadb:
            return  # MySQL has no such setting: a stopped worker keeps its locks until it resumes
        with self.connection.cursor() as cursor:  # whole seconds, at least 1
            cursor.execute("SET SESSION idle_transaction_timeout = %s", [max(1, math.ceil(seconds))])

    # -- topics -------------------------------------------------------------------------------------

    def bump_partition(
        self, cursor: Any, *, topic: str, name: str, n: int, now: datetime | None
    ) -> tuple[int, int, bool, datetime]:
        # One upsert, which takes the row's exclusive lock at once: a locking read of a missing
        # row followed by an insert (or INSERT IGNORE, which takes a shared lock on a duplicate)
        # deadlocks concurrent first publishers of a partition on InnoDB's gap and S->X locks.
        stamped = now or timezone.now()
        cursor.execute(
            f"INSERT INTO {PARTITION_TABLE} (topic, name, last_position, newest_at) VALUES (%s, %s, %s, %s) "
            "ON DUPLICATE KEY UPDATE last_position = last_position + VALUES(last_position), "
            "newest_at = VALUES(newest_at)",
            [topic, name, n, self.dt(stamped)],
        )
        created = cursor.rowcount == 1
        cursor.execute(f"SELECT id, last_position FROM {PARTITION_TABLE} WHERE topic = %s AND name = %s", [topic, name])
        pid, last = cursor.fetchone()
        return pid, last, created, stamped

    # -- metrics ------------------------------------------------------------------------------------

    def add_metrics(self, cursor: Any, minute: datetime, counts: dict[str, list[int]]) -> None:
        for queue in sorted(counts):
            completed, failed, retried, runtime_ms = counts[queue]
            cursor.execute(
                f"INSERT INTO {METRIC_TABLE} (queue, minute, completed, failed, retried, runtime_ms) "
                f"VALUES (%s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                f"completed = completed + VALUES(completed), failed = failed + VALUES(failed), "
                f"retried = retried + VALUES(retried), runtime_ms = runtime_ms + VALUES(runtime_ms)",
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
        # Lock the ready ids (passing rows other claims hold), mark them, read them back: one
        # short transaction, committed before any user code runs.
        with transaction.atomic(using=self.using):
            cursor.execute(
                f"SELECT j.id FROM {JOB_TABLE} j WHERE {where} ORDER BY j.priority DESC, j.seq, j.id "
                f"LIMIT %s FOR UPDATE SKIP LOCKED",
                [*params, limit],
            )
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                return []
            now_sql, now_params = self.now(now)
            lease_sql, lease_params = self.now_plus(now, lease_seconds)
            marks = _marks(len(ids))
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET state = 'active', attempts = attempts + 1, lease_token = %s, "
                f"lease_expires_at = {lease_sql}, worker_id = %s, worker_ids = {self.json_append_text('worker_ids', '%s')}, "
                f"started_at = COALESCE(started_at, {now_sql}), last_attempted_at = {now_sql} WHERE id IN ({marks})",
                [self.uuid(lease_token), *lease_params, worker_id, worker_id, *now_params, *now_params, *ids],
            )
            cursor.execute(
                f"SELECT {self.claim_returning()} FROM {JOB_TABLE} WHERE id IN ({marks})",
                ids,
            )
            return list(cursor.fetchall())

    # -- jobs: outcomes ---------------------------------------------------------------------------

    def record_outcomes(
        self, cursor: Any, rows: list[list[Any]], now: datetime | None, events_channel: str | None
    ) -> list[tuple[Any, ...]]:
        t = JOB_TABLE
        with transaction.atomic(using=self.using):
            # The rows this batch may write, locked: active under the outcome's lease.
            pairs = ", ".join(["(%s, %s)"] * len(rows))
            cursor.execute(
                f"SELECT id FROM {t} WHERE (id, lease_token) IN ({pairs}) AND state = 'active' FOR UPDATE",
                [v for r in rows for v in (self.uuid(r[0]), self.uuid(r[1]))],
            )
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                return []
            names = OUTCOME_COLUMNS.split(", ")
            first = "SELECT " + ", ".join(f"%s AS `{name}`" for name in names)  # purge is a keyword
            values = " UNION ALL ".join([first] + [f"SELECT {_marks(len(names))}"] * (len(rows) - 1))
            params = [
                v
                for r in rows
                for v in (self.uuid(r[0]), self.uuid(r[1]), *r[2:5], self.dt(r[5]), r[6], r[7], self.dt(r[8]),
                          self.dt(r[9]), r[10])
            ]  # fmt: skip
            now_sql, now_params = self.now(now)
            # A join, not FROM: the assignments are qualified (v has a state and an id of its own).
            sets = ", ".join(
                f"{t}.{column} = {expression}" for column, expression in self._outcome_assignments(now_sql)
            )
            cursor.execute(
                f"UPDATE {t} JOIN ({values}) v ON {t}.id = v.id SET {sets} "
                f"WHERE {t}.state = 'active' AND {t}.lease_token = v.token",
                [*params, *now_params],
            )
            cursor.execute(f"SELECT {OUTCOME_RETURNING} FROM {t} WHERE id IN ({_marks(len(ids))})", ids)
            return list(cursor.fetchall())

    # -- jobs: insert -----------------------------------------------------------------------------

    def insert_job(
        self, cursor: Any, params: list[Any], *, notify: bool, once: bool, guarded: bool, events: bool
    ) -> tuple[bool, Any]:
        # Nothing comes back: the caller gave the id and the time. With ``once`` a duplicate
        # idempotency key is ignored (the unique index decides; migrations 0005 make it plain).
        verb = "INSERT IGNORE" if once else "INSERT"
        if guarded:
            sql = (
                f"{verb} INTO {JOB_TABLE} ({_NEW_JOB_COLUMNS}) SELECT {_NEW_JOB_VALUES} FROM DUAL WHERE NOT EXISTS "
                f"(SELECT 1 FROM {QUEUE_TABLE} WHERE name = %s AND {SIZE_LIMITED})"
            )
        else:
            sql = f"{verb} INTO {JOB_TABLE} ({_NEW_JOB_COLUMNS}) VALUES ({_NEW_JOB_VALUES})"
        cursor.execute(sql, params)
        inserted = cursor.rowcount == 1
        return inserted, params[_ENQUEUED_PARAM] if inserted and once else None

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
        backend, queue, task_path, state, priority, available_at, options, max_attempts, enqueued_at, trace, partition, blocked = shared  # fmt: skip
        rows = [
            (ids[i].hex, backend, queue, task_path, args_json, kwargs_json, state, priority, available_at, options,
             max_attempts, enqueued_at, 0, 0, 0, "[]", "[]", seq + offset + step * i, trace, None, None, partition,
             blocked)
            for i, (args_json, kwargs_json) in enumerate(part, start)
        ]  # fmt: skip
        # The client folds the rows into one multi-row INSERT.
        cursor.executemany(f"INSERT INTO {JOB_TABLE} ({_NEW_JOB_COLUMNS}) VALUES ({_MANY_VALUES})", rows)
        return None

    # -- jobs: ordered partitions -------------------------------------------------------------------

    def unblock_heads(self, cursor: Any, keys: list[tuple[str, str]]) -> int:
        freed = 0
        for queue, partition in keys:
            cursor.execute(
                f"SELECT COALESCE(MAX(partition_concurrency), 1) FROM {QUEUE_TABLE} WHERE name = %s", [queue]
            )
            n = int(cursor.fetchone()[0])
            cursor.execute(
                f"SELECT id FROM {JOB_TABLE} WHERE queue = %s AND partition_key = %s AND state IN {UNFINISHED_SQL} "
                f"ORDER BY id LIMIT %s",
                [queue, partition, n],
            )
            ids = [row[0] for row in cursor.fetchall()]
            if ids:
                cursor.execute(
                    f"UPDATE {JOB_TABLE} SET blocked = 0 WHERE id IN ({_marks(len(ids))}) AND blocked = 1", ids
                )
                freed += cursor.rowcount
        return freed

    # -- jobs: progress -----------------------------------------------------------------------------

    def set_progress(
        self, cursor: Any, *, job_id: uuid.UUID, lease_token: uuid.UUID, value_json: str, events_channel: str | None
    ) -> str | None:
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET progress = %s WHERE id = %s AND state = 'active' AND lease_token = %s",
            [value_json, self.uuid(job_id), self.uuid(lease_token)],
        )
        if cursor.rowcount != 1:
            return None
        cursor.execute(f"SELECT queue FROM {JOB_TABLE} WHERE id = %s", [self.uuid(job_id)])
        return cursor.fetchone()[0]

    @contextlib.contextmanager
    def deferred_foreign_keys(self, cursor: Any) -> Iterator[None]:
        # MySQL checks a foreign key at once, never at commit: off for the statements inside. On
        # a cursor of its own, so the caller's cursor still reports its statement's row count.
        with self.connection.cursor() as own:
            own.execute("SET SESSION foreign_key_checks = 0")
            try:
                yield
            finally:
                own.execute("SET SESSION foreign_key_checks = 1")

    # -- dedup keys -----------------------------------------------------------------------------------

    def take_dedup_key(
        self, cursor: Any, key: list[Any], job_id: Any, expire_sql: str, expire_params: list[Any]
    ) -> bool:
        cursor.execute(
            f"INSERT IGNORE INTO {DEDUP_TABLE} (backend, queue, `key`, job_id, expire_at) "
            f"VALUES (%s, %s, %s, %s, {expire_sql})",
            [*key, job_id, *expire_params],
        )
        return cursor.rowcount == 1

    def stash_dedup_next(
        self, cursor: Any, key: list[Any], payload_json: str, stashed_sql: str, stashed_params: list[Any]
    ) -> None:
        cursor.execute(
            f"INSERT INTO {DEDUP_NEXT_TABLE} (backend, queue, `key`, payload, stashed_at) "
            f"VALUES (%s, %s, %s, %s, {stashed_sql}) "
            f"ON DUPLICATE KEY UPDATE payload = VALUES(payload), stashed_at = VALUES(stashed_at)",
            [*key, payload_json, *stashed_params],
        )

"""The SQL of bus mode (topics), shared by every driver: :class:`TopicVerbs` is a base of
:class:`~django_jobs.drivers.base.Driver`, so a database that spells one of these otherwise
overrides it in its own driver. The engine's verbs are in :mod:`django_jobs.engine.topics`.

Everything here is written so that the same statement holds on the three databases: the
partition's counter goes through ``update_returning`` (three statements in one transaction on
MariaDB/MySQL), the free partitions of a group are read with ``SKIP LOCKED`` where there is one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..models import ConsumerGroup, GroupCursor, TopicPartition

PARTITION_TABLE = TopicPartition._meta.db_table
CURSOR_TABLE = GroupCursor._meta.db_table
GROUP_TABLE = ConsumerGroup._meta.db_table


class TopicVerbs:
    """Bus-mode statements (mixed into Driver; ``self`` is a Driver)."""

    __slots__ = ()

    #: :meth:`publish_one` serves this database (one message in one statement); else the
    #: engine publishes through :meth:`bump_partition` and an INSERT.
    PUBLISH_ONE = False

    def publish_one(self: Any, cursor: Any, **message: Any) -> tuple[int, int] | None:
        """One message of a topic with no max_size in one round trip: ``(id, position)``, or
        None when the topic's row turns out to have a max_size (nothing written). Only where
        :attr:`PUBLISH_ONE` says so (PostgreSQL: drivers/pg_topics.py)."""
        raise NotImplementedError

    def bump_partition(
        self: Any, cursor: Any, *, topic: str, name: str, n: int, now: datetime | None
    ) -> tuple[int, int, bool, datetime]:
        """Take ``n`` positions of a partition, creating its row if it has none: ``(partition
        id, its new last position, created, the time stamped)``; ``now`` None stamps the
        driver's "now" (the database's clock where it has one), read back in the same round
        trip. The write locks the partition's row until the publishing transaction ends, so
        positions commit in the order they are handed out: a reader that saw position N
        committed never sees N-1 appear later (a group's cursor can pass it safely). An
        existing partition (the common case) is one ``UPDATE``; a new one an upsert, so that
        concurrent first publishers serialise on the row instead of failing."""
        now_sql, now_params = self.now(now)
        rows = self.update_returning(
            cursor,
            PARTITION_TABLE,
            f"last_position = last_position + %s, newest_at = {now_sql}",
            [n, *now_params],
            "topic = %s AND name = %s",
            [topic, name],
            "id, last_position, newest_at",
        )
        if rows:
            return rows[0][0], rows[0][1], False, self.to_dt(rows[0][2])
        cursor.execute(
            f"INSERT INTO {PARTITION_TABLE} (topic, name, last_position, newest_at) VALUES (%s, %s, %s, {now_sql}) "
            f"ON CONFLICT (topic, name) DO UPDATE SET last_position = {PARTITION_TABLE}.last_position + "
            "excluded.last_position, newest_at = excluded.newest_at RETURNING id, last_position, newest_at",
            [topic, name, n, *now_params],
        )
        pid, last, stamped = cursor.fetchone()
        return pid, last, last == n, self.to_dt(stamped)

    def free_partitions(
        self: Any, cursor: Any, *, topic: str, group: str, now: datetime, newest_before: datetime, limit: int
    ) -> list[int]:
        """Ids of a group's cursors that may be handed out now, the longest-waiting first: the
        group is not paused, the partition has messages past the cursor, no live lease, no
        pending retry, is not blocked, and its newest message is older than ``newest_before``
        (the window buffer).

        Why this shape: the partition's counter is read by a correlated subquery, not a join, so
        ``FOR UPDATE SKIP LOCKED`` locks only cursor rows (MariaDB has no ``FOR UPDATE OF``), and
        a publisher holding the partition's row does not hide the partition from consumers.
        The caller takes one of these rows with an update guarded on the same conditions, so
        without row locks (SQLite) two takers still cannot both win."""
        now_p = self.dt(now)
        cursor.execute(
            f"SELECT c.id FROM {CURSOR_TABLE} c "
            "WHERE c.topic = %s AND c.group_name = %s AND c.blocked = " + self.false() + " "
            "AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= %s) "
            "AND (c.retry_at IS NULL OR c.retry_at <= %s) "
            f"AND EXISTS (SELECT 1 FROM {PARTITION_TABLE} p WHERE p.id = c.partition_id "
            "AND p.last_position > c.position AND p.newest_at <= %s) "
            f"AND NOT EXISTS (SELECT 1 FROM {GROUP_TABLE} g WHERE g.topic = c.topic AND g.name = c.group_name "
            "AND g.paused = " + self.true() + ") "
            f"ORDER BY c.leased_at, c.id LIMIT %s {self.skip_locked()}",
            [topic, group, now_p, now_p, self.dt(newest_before), int(limit)],
        )
        return [row[0] for row in cursor.fetchall()]

    def group_backlogs(self: Any, cursor: Any, *, topic: str) -> dict[str, int]:
        """``{group: messages published and not yet consumed}`` of a topic's groups."""
        cursor.execute(
            f"SELECT c.group_name, SUM(p.last_position - c.position) FROM {CURSOR_TABLE} c "
            f"JOIN {PARTITION_TABLE} p ON p.id = c.partition_id WHERE c.topic = %s GROUP BY c.group_name",
            [topic],
        )
        return {group: int(backlog or 0) for group, backlog in cursor.fetchall()}


__all__ = ["CURSOR_TABLE", "PARTITION_TABLE", "TopicVerbs"]

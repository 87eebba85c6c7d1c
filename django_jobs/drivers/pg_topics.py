"""PostgreSQL's spelling of bus mode's hot statement: one publish in one round trip.

A mixin of :class:`~django_jobs.drivers.postgresql.PostgreSQLDriver`; the statements every
database shares are in :mod:`.topics`.
"""

from __future__ import annotations

from typing import Any

from ..models import Message, Topic
from .topics import CURSOR_TABLE, GROUP_TABLE, PARTITION_TABLE

MESSAGE_TABLE = Message._meta.db_table
TOPIC_TABLE = Topic._meta.db_table

#: One message into a partition of a topic that has no max_size and does not encrypt: the
#: partition's counter taken (its row created on the first publish, with a cursor for each
#: group of the topic), the message inserted at that position with its delay (the message's,
#: else the topic row's, else the declared one), and the topic's consumers woken, in one
#: statement. The guard reads the topic's row: when it has a max_size or encrypt (set at
#: runtime), nothing is written and no row comes back, and the caller takes the general path,
#: which admits the message under the topic's lock or encrypts it. Named parameters.
PUBLISH_ONE_SQL = f"""
WITH cfg AS (SELECT max_size, delay_seconds, encrypt FROM {TOPIC_TABLE} WHERE name = %(topic)s),
bump AS (
    INSERT INTO {PARTITION_TABLE} AS p (topic, name, last_position, newest_at)
    SELECT %(topic)s, %(partition)s, 1, now()
    WHERE NOT EXISTS (SELECT 1 FROM cfg WHERE max_size IS NOT NULL OR encrypt)
    ON CONFLICT (topic, name) DO UPDATE SET last_position = p.last_position + 1, newest_at = excluded.newest_at
    RETURNING p.id, p.last_position, p.newest_at
),
cur AS (
    INSERT INTO {CURSOR_TABLE} (partition_id, topic, group_name, position, leased_at, leased_by, attempts,
        blocked, last_error, expired_count, acked_count, dead_lettered_count)
    SELECT bump.id, g.topic, g.name, 0, bump.newest_at, '', 0, false, '', 0, 0, 0
    FROM bump JOIN {GROUP_TABLE} g ON g.topic = %(topic)s
    WHERE bump.last_position = 1
    ON CONFLICT (partition_id, group_name) DO NOTHING
),
msg AS (
    INSERT INTO {MESSAGE_TABLE} (partition_id, topic, position, payload, transaction_id, trace_id, created_at,
        available_at)
    SELECT bump.id, %(topic)s, bump.last_position, %(payload)s::jsonb, NULL, %(trace_id)s, bump.newest_at,
        bump.newest_at + make_interval(secs => COALESCE(%(delay)s::float8, (SELECT delay_seconds FROM cfg),
        %(declared_delay)s::float8, 0))
    FROM bump
    RETURNING id, position, created_at
)
SELECT msg.id, msg.position, pg_notify(%(channel)s, %(wake)s)::text FROM msg
"""


class PgTopicVerbs:
    """Bus-mode statements PostgreSQL spells in one round trip (mixed into its driver)."""

    __slots__ = ()

    #: :meth:`publish_one` serves this database.
    PUBLISH_ONE = True

    def publish_one(
        self: Any,
        cursor: Any,
        *,
        topic: str,
        partition: str,
        payload_json: str,
        trace_id: str,
        delay: float | None,
        declared_delay: float | None,
        channel: str,
        wake: str,
    ) -> tuple[int, int] | None:
        """Publish one message (see :data:`PUBLISH_ONE_SQL`): ``(id, position)``, or None when
        the topic's row has a max_size and nothing was written."""
        cursor.execute(
            PUBLISH_ONE_SQL,
            {
                "topic": topic,
                "partition": partition,
                "payload": payload_json,
                "trace_id": trace_id,
                "delay": delay,
                "declared_delay": declared_delay,
                "channel": channel,
                "wake": wake,
            },
        )
        row = cursor.fetchone()
        return None if row is None else (row[0], row[1])


__all__ = ["PUBLISH_ONE_SQL", "PgTopicVerbs"]

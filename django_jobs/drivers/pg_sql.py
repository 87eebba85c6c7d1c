"""PostgreSQL's fragments shared by its statements: how a statement writes its own events and
sends the events NOTIFY (data-modifying CTEs), so a hot statement records them without a
round trip."""

from __future__ import annotations

from .base import EVENT_COLUMNS, EVENT_TABLE

#: The writing transaction's id: readers order events by (txid, id); see eventlog.py.
TXID = "pg_current_xact_id()::text::bigint"


def event_cte(source: str, kind_sql: str, data_sql: str) -> str:
    """A data-modifying CTE writing one event per row of the CTE ``source`` (which has ``id``
    and ``queue`` columns)."""
    return (
        f"ev AS (INSERT INTO {EVENT_TABLE} ({EVENT_COLUMNS}) SELECT {TXID}, {source}.queue, {source}.id, "
        f"{kind_sql}, {data_sql}, clock_timestamp() FROM {source})"
    )


def event_notify(source: str) -> str:
    """A one-row FROM item sending the events NOTIFY (one ``%s``: the channel) when ``source``
    has rows; join it to the statement's final SELECT."""
    return f"(SELECT count(pg_notify(%s, '')) AS n FROM (SELECT 1 FROM {source} LIMIT 1) one) ev_notify"


#: The oldest transaction still running that may write to this database: the snapshot's
#: in-progress ids, less those of sessions seen in other databases (transaction ids are the whole
#: server's, so another database's long transaction would otherwise hold our events back). A
#: transaction whose database cannot be seen (another user's session without pg_read_all_stats,
#: a prepared transaction) counts as ours: the horizon errs on the side of waiting. With nothing
#: running, the snapshot's xmax: every older transaction has ended.
#: The reader's own transaction, when it has written, counts as running too: its events are
#: not committed, and may yet roll back.
HORIZON_SQL = """
SELECT LEAST(
    COALESCE(
        (SELECT min(x::text::bigint) FROM pg_snapshot_xip(pg_current_snapshot()) AS x
         WHERE x::text::bigint % 4294967296 NOT IN (
             SELECT backend_xid::text::bigint FROM pg_stat_activity
             WHERE backend_xid IS NOT NULL AND datname IS DISTINCT FROM current_database())),
        pg_snapshot_xmax(pg_current_snapshot())::text::bigint),
    pg_current_xact_id_if_assigned()::text::bigint)
"""

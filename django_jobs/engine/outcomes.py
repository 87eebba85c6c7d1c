"""Recording outcomes in batches, guarded on each attempt's lease token; releasing jobs back to
waiting; renewing the leases a worker holds."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError, connections, transaction
from django.utils import timezone

from .. import retention
from ..db import Dialect, hot_cursor, is_transient
from ..states import FINISHED_STATES, JobState
from .common import (
    JOB_TABLE,
    METRIC_TABLE,
    Outcome,
    _cancelled_error,
    _drop_broken_connection,
    events_channel,
    events_enabled,
    logger,
    ready_seq,
)
from .effects import (
    _finished_elsewhere,
    _outcome_events_and_metrics,
    _pg_event_cte,
    _pg_event_notify,
    notify,
    write_events,
)
from .flows import settle_dependencies
from .partitions import _unblock_heads

# -- outcomes -------------------------------------------------------------------------------

_OUTCOME_STATES = {JobState.COMPLETED, JobState.FAILED, JobState.WAITING, JobState.DELAYED}


def record_outcomes(outcomes: list[Outcome], *, using: str, now: datetime | None = None) -> dict[uuid.UUID, str]:
    """Write a batch of attempt outcomes in one statement; return ``{job id: state written}`` for
    the jobs that were written (the state is ``cancelled`` where a cancel was requested), and set
    each written outcome's ``finished_at`` (None unless the job finished).

    Each row is guarded on (id, ``active``, lease token): an outcome whose job was rescued,
    cancelled or released meanwhile matches nothing, is logged and dropped.

    Idempotent in what it reports: the written row keeps its lease token (rescue and release
    clear theirs), so when a batch is sent again because the answer to the first try was lost,
    the rows that try committed are found by (id, token) and reported as written, not dropped,
    and what follows their commit (freeing their partitions' next jobs) is done again.
    """
    if not outcomes:
        return {}
    for o in outcomes:
        if o.state not in _OUTCOME_STATES:
            raise ValueError(f"not an outcome state: {o.state!r}")
    d = Dialect(using)
    now_sql, now_params = d.now(now)
    # When retention lets the finished job go (purge_at), from this process's clock: a day's
    # policy does not care about the milliseconds between it and the database's.
    finished_at = now or timezone.now()
    purges: dict[tuple[str, str], datetime | None] = {}  # one finish time per batch: per (state, queue)

    def purge_at(state: str, o: Outcome) -> datetime | None:
        if o.retention is not None:
            return retention.purge_at(state, finished_at, queue=o.queue, task_retention=o.retention)
        key = (state, o.queue)
        if key not in purges:
            purges[key] = retention.purge_at(state, finished_at, queue=o.queue, task_retention=None)
        return purges[key]

    rows_out: list[list[Any]] = []
    for o in outcomes:
        rows_out.append(
            [
                o.job_id,
                o.lease_token,
                str(o.state),
                o.return_value_json,
                json.dumps(o.error) if o.error is not None else None,
                o.available_at,
                1 if o.uncount_attempt else 0,
                ready_seq(o.available_at) if o.available_at is not None else None,
                purge_at(o.state, o) if o.state in FINISHED_STATES else None,
                purge_at(JobState.CANCELLED, o),
                o.runtime_ms,
            ]
        )
    t = JOB_TABLE
    events = events_enabled()
    columns = "id, token, state, rv, err, avail, uncount, avail_seq, purge, purge_c, rt"
    values: list[Any]
    if d.pg:
        # The whole batch is one JSON parameter (serialised by json's C encoder) and the
        # statement's text is the same for every batch size, so psycopg parses it once. (A VALUES
        # list of 11 parameters a row was parsed and quoted anew for every batch: the completer's
        # largest cost.)
        values = [json.dumps(rows_out, default=str)]
        values_cte = (
            f"WITH v({columns}) AS (SELECT (e->>0)::uuid, (e->>1)::uuid, e->>2, (e->>3)::jsonb, (e->>4)::jsonb, "
            f"(e->>5)::timestamptz, (e->>6)::integer, (e->>7)::bigint, (e->>8)::timestamptz, (e->>9)::timestamptz, "
            f"(e->>10)::bigint FROM jsonb_array_elements(%s::jsonb) e)"
        )
    else:
        values = [
            v
            for r in rows_out
            for v in (d.uuid(r[0]), d.uuid(r[1]), *r[2:5], d.dt(r[5]), r[6], r[7], d.dt(r[8]), d.dt(r[9]), r[10])
        ]
        row_sql = f"({', '.join(['%s'] * 11)})"
        values_cte = f"WITH v({columns}) AS (VALUES {', '.join([row_sql] * len(outcomes))})"
    update = (
        f"UPDATE {t} SET state = CASE WHEN {t}.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE v.state END, "
        f"return_value = v.rv, "
        f"attempts = {t}.attempts - v.uncount, "
        f"worker_ids = CASE WHEN v.uncount = 1 THEN {d.json_pop(t + '.worker_ids')} ELSE {t}.worker_ids END, "
        f"errors = CASE WHEN v.err IS NULL THEN {t}.errors ELSE {d.json_append(t + '.errors', 'v.err')} END, "
        f"available_at = COALESCE(v.avail, {t}.available_at), "
        f"seq = CASE WHEN v.avail_seq IS NULL THEN {t}.seq WHEN {t}.seq < 0 THEN -v.avail_seq ELSE v.avail_seq END, "
        f"finished_at = CASE WHEN v.state IN ('completed', 'failed') OR {t}.cancel_requested_at IS NOT NULL "
        f"THEN {now_sql} ELSE NULL END, "
        f"purge_at = CASE WHEN {t}.cancel_requested_at IS NOT NULL THEN v.purge_c "
        f"WHEN v.state IN ('completed', 'failed') THEN v.purge ELSE NULL END, "
        # The lease token stays: it tells a retried batch which rows its lost first try wrote.
        f"lease_expires_at = NULL "
        f"FROM v WHERE {t}.id = v.id AND {t}.state = 'active' AND {t}.lease_token = v.token "
        f"RETURNING {t}.id, {t}.queue, {t}.state, {t}.parent_id, {t}.partition_key, {t}.attempts, "
        f"{t}.last_attempted_at, {t}.finished_at"
    )
    sql = f"{values_cte} {update}"
    params = [*values, *now_params]
    if d.pg:
        # The batch's events and its Metric counts ride on the same statement: no round trip
        # more, and they commit (or not) with the outcomes they count.
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
            + (f"{_pg_event_cte('r', kind, data)}, " if events else "")
            + f"m AS (INSERT INTO {METRIC_TABLE} (queue, minute, completed, failed, retried, runtime_ms) "
            f"SELECT r.queue, date_trunc('minute', {now_sql}, 'UTC'), count(*) FILTER (WHERE r.state = 'completed'), "
            f"count(*) FILTER (WHERE r.state = 'failed'), "
            f"count(*) FILTER (WHERE r.state IN ('waiting', 'delayed') AND r.uncount = 0), "
            f"COALESCE(round(sum({runtime}) FILTER (WHERE {ended})), 0)::bigint "
            f"FROM r GROUP BY r.queue ORDER BY r.queue "
            f"ON CONFLICT (queue, minute) DO UPDATE SET completed = {METRIC_TABLE}.completed + EXCLUDED.completed, "
            f"failed = {METRIC_TABLE}.failed + EXCLUDED.failed, retried = {METRIC_TABLE}.retried + EXCLUDED.retried, "
            f"runtime_ms = {METRIC_TABLE}.runtime_ms + EXCLUDED.runtime_ms) "
            f"SELECT r.id, r.queue, r.state, r.parent_id, r.partition_key, r.attempts, r.last_attempted_at, "
            f"r.finished_at FROM r" + (f", {_pg_event_notify('r')}" if events else "")
        )
        if events:
            params += now_params  # the run time in the event's data
        params += [*now_params, *now_params]  # the metric's minute and run time
        if events:
            params.append(events_channel())
    by_id = {o.job_id: o for o in outcomes}

    def children_that_ended(rows: list[tuple[Any, ...]]) -> list[tuple[uuid.UUID, str, Any]]:
        out = []
        for r in rows:
            if r[3] is not None and r[2] in FINISHED_STATES:
                o = by_id[d.to_uuid(r[0])]
                value = o.return_value_json if r[2] == JobState.COMPLETED else (o.error or _cancelled_error(o.job_id))
                out.append((o.job_id, r[2], value))
        return out

    # A child's final state and its parent's progress are one change: one transaction when the
    # batch has flow children (Outcome.has_parent); plain autocommit otherwise (the hot path).
    flows = any(o.has_parent for o in outcomes)
    # SQLite writes the events and metrics with more statements: one transaction with them.
    with transaction.atomic(using=using) if flows or not d.pg else contextlib.nullcontext():
        with hot_cursor(using, generic=True) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            if not d.pg:
                _outcome_events_and_metrics(cursor, d, rows, by_id, finished_at)
        ended = children_that_ended(rows)
        if flows:
            settle_dependencies(using=using, finished=ended, now=now)
    if ended and not flows:
        # An outcome built without has_parent: still move the parents on, at once.
        logger.warning(
            "Outcomes of flow children %s came without has_parent; settling them now.", [e[0] for e in ended]
        )
        with transaction.atomic(using=using):
            settle_dependencies(using=using, finished=ended, now=now)
    row_of = {d.to_uuid(r[0]): r for r in rows}
    missing = [o for o in outcomes if o.job_id not in row_of] if len(row_of) < len(outcomes) else []
    if missing:
        earlier = _written_before(d, using, missing)
        rows = rows + earlier
        row_of.update((d.to_uuid(r[0]), r) for r in earlier)
    written: dict[uuid.UUID, str] = {}
    for o in outcomes:
        r = row_of.get(o.job_id)
        if r is not None:
            written[o.job_id] = r[2]
            o.finished_at = d.to_dt(r[7])
        else:
            logger.warning(
                "Dropped the %s outcome of job %s: it is no longer active under this lease "
                "(rescued, cancelled or released meanwhile).",
                o.state,
                o.job_id,
            )
    requeued = {r[1] for r in rows if r[2] == JobState.WAITING}
    turns = {(r[1], r[4]) for r in rows if r[4] is not None and r[2] in FINISHED_STATES}
    if turns:
        # Their partitions' next jobs may run now: one transaction for the batch (one commit, not
        # one per partition). After the outcomes' own commit: a crash in between leaves them
        # blocked for the PartitionSweeper.
        # Freeing is idempotent: after a lost connection it is tried once more on a new one
        # (outside a transaction) rather than left to the leader's sweeper, whose worker may be
        # the one that just died.
        tries = 1 if connections[using].in_atomic_block else 2
        for attempt in range(tries):
            try:
                with transaction.atomic(using=using), connections[using].cursor() as cursor:
                    if _unblock_heads(cursor, d, turns):
                        requeued |= {q for q, _ in turns}
                break
            except (OperationalError, InterfaceError) as exc:
                # The outcomes are committed; only this hint failed (a lock conflict, a lost
                # connection). Raising would make the completer write them again.
                if not is_transient(exc):
                    raise
                _drop_broken_connection(using)
                if attempt == tries - 1:
                    logger.info(
                        "Freeing the next jobs of %d partition(s) failed (%s); the sweeper will.", len(turns), exc
                    )
    if requeued:
        try:
            notify(using, sorted(requeued))
        except (OperationalError, InterfaceError) as exc:
            # Only a wake-up hint after the commit: workers also poll. Raising would make the
            # completer send the batch again.
            if not is_transient(exc):
                raise
            logger.info("Waking the workers of %s failed (%s); they will poll.", sorted(requeued), exc)
            _drop_broken_connection(using)
    return written


def _written_before(d: Dialect, using: str, outcomes: list[Outcome]) -> list[tuple[Any, ...]]:
    """Rows, shaped as the outcome statement returns them, of ``outcomes`` that an earlier try
    of the same batch already wrote: no longer active, still holding the outcome's lease token,
    in a state that outcome leads to, with its return value and (last) error."""
    ids_sql, ids_params = d.in_list("id", [d.uuid(o.job_id) for o in outcomes])
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT id, queue, state, parent_id, partition_key, attempts, last_attempted_at, finished_at, "
            f"lease_token, return_value, errors FROM {JOB_TABLE} WHERE {ids_sql} AND state <> 'active'",
            ids_params,
        )
        found = cursor.fetchall()
    by_id = {o.job_id: o for o in outcomes}

    def wrote(row: tuple[Any, ...]) -> bool:
        o = by_id[d.to_uuid(row[0])]
        value, errors = d.to_json(row[9]), d.to_json(row[10]) or []
        return (
            d.to_uuid(row[8]) == o.lease_token
            and row[2] in _SAME_OUTCOME[o.state]
            and value == (json.loads(o.return_value_json) if o.return_value_json is not None else None)
            and (o.error is None or (bool(errors) and errors[-1] == o.error))
        )

    return [r[:8] for r in found if wrote(r)]


#: The states a row written by an outcome can be found in later: the outcome's own, ``waiting``
#: once a delayed retry is due, ``cancelled`` when a cancel was requested (or came later).
_SAME_OUTCOME = {
    JobState.COMPLETED: {JobState.COMPLETED, JobState.CANCELLED},
    JobState.FAILED: {JobState.FAILED, JobState.CANCELLED},
    JobState.WAITING: {JobState.WAITING, JobState.CANCELLED},
    JobState.DELAYED: {JobState.DELAYED, JobState.WAITING, JobState.CANCELLED},
}


def release_jobs(
    *,
    using: str,
    worker_id: str,
    job_ids: list[uuid.UUID] | None = None,
    lease_tokens: Collection[uuid.UUID] | None = None,
    now: datetime | None = None,
) -> int:
    """Return this worker's active jobs to ``waiting`` without counting the attempt (shutdown).

    ``job_ids``/``lease_tokens``: only those jobs, or the jobs of those claims (a claim whose
    answer was lost). Running it again changes nothing more, so a release whose own answer is
    lost can simply be repeated.

    The attempt and its worker id are taken back, so the next worker runs it as the same attempt.
    A job cancelled while it ran is not run again: it becomes ``cancelled``.
    """
    d = Dialect(using)
    now_sql, now_params = d.now(now)
    where = ["state = 'active'", "worker_id = %s"]
    params: list[Any] = [worker_id]
    for column, values in (("id", job_ids), ("lease_token", lease_tokens)):
        if values is None:
            continue
        if not values:
            return 0
        sql, p = d.in_list(column, [d.uuid(v) for v in values])
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
        f"WHERE {' AND '.join(where)} RETURNING queue, state, id, parent_id"
    )
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql, [*now_params, *params])
        returned = cursor.fetchall()
        write_events(cursor, d, [(r[0], d.to_uuid(r[2]), "released", {}) for r in returned if r[1] == JobState.WAITING])
        _finished_elsewhere(
            cursor, d, [d.to_uuid(r[2]) for r in returned if r[1] == JobState.CANCELLED], "finished", now
        )
        ended = [d.to_uuid(r[2]) for r in returned if r[1] == JobState.CANCELLED and r[3] is not None]
        settle_dependencies(
            using=using, finished=[(j, JobState.CANCELLED, _cancelled_error(j)) for j in ended], now=now
        )
    rows = [r for r in returned if r[1] == JobState.WAITING]
    notify(using, sorted({r[0] for r in rows}))
    return len(rows)


def renew_leases(
    *, using: str, lease_tokens: Collection[uuid.UUID], lease_seconds: float, now: datetime | None = None
) -> int:
    """Extend the leases of the active jobs claimed with ``lease_tokens``; return how many.

    By token, not by worker: a worker renews only the leases it knows it holds. A row that a
    claim took while its answer was lost is not renewed, so it is released or rescued instead of
    staying active under a live worker that never runs it.
    """
    if not lease_tokens:
        return 0
    d = Dialect(using)
    lease_sql, lease_params = d.now_plus(now, lease_seconds)
    tokens_sql, tokens_params = d.in_list("lease_token", [d.uuid(t) for t in lease_tokens])
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET lease_expires_at = {lease_sql} WHERE state = 'active' AND {tokens_sql}",
            [*lease_params, *tokens_params],
        )
        return cursor.rowcount

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

from ..db import is_transient
from ..drivers import Driver, driver
from ..spec import retention
from ..states import FINISHED_STATES, JobState
from .common import (
    JOB_TABLE,
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
    d = driver(using)
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
    fused = d.FUSED_EFFECTS and events_enabled()
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
    # Without FUSED_EFFECTS the events and metrics take more statements: one transaction with them.
    with transaction.atomic(using=using) if flows or not d.FUSED_EFFECTS else contextlib.nullcontext():
        with d.cursor(hot=True, generic=True) as cursor:
            rows = d.record_outcomes(cursor, rows_out, now, events_channel() if fused else None)
            if not d.FUSED_EFFECTS:
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


def _written_before(d: Driver, using: str, outcomes: list[Outcome]) -> list[tuple[Any, ...]]:
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
    d = driver(using)
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
    set_sql = (
        f"state = CASE WHEN cancel_requested_at IS NULL THEN 'waiting' ELSE 'cancelled' END, "
        f"finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE {now_sql} END, "
        # Before attempts: no assignment may read a column assigned before it (MySQL assigns
        # left to right).
        f"started_at = CASE WHEN attempts <= 1 AND cancel_requested_at IS NULL THEN NULL ELSE started_at END, "
        # A job handed back takes its attempt back; a cancelled one ends, its attempt counted.
        f"attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END, "
        f"worker_ids = CASE WHEN cancel_requested_at IS NULL THEN {d.json_pop('worker_ids')} ELSE worker_ids END, "
        f"lease_token = NULL, lease_expires_at = NULL"
    )
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        returned = d.update_returning(
            cursor, JOB_TABLE, set_sql, now_params, " AND ".join(where), params, "queue, state, id, parent_id"
        )
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
    d = driver(using)
    lease_sql, lease_params = d.now_plus(now, lease_seconds)
    tokens_sql, tokens_params = d.in_list("lease_token", [d.uuid(t) for t in lease_tokens])
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET lease_expires_at = {lease_sql} WHERE state = 'active' AND {tokens_sql}",
            [*lease_params, *tokens_params],
        )
        return cursor.rowcount

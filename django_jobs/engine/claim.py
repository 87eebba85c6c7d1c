"""Claiming: one statement takes up to ``limit`` ready jobs (SKIP LOCKED on PostgreSQL, the
write lock on SQLite) and leases them; gated queues are claimed under their queue row's lock."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from ..drivers import Driver, driver
from ..drivers.base import UNFINISHED_SQL
from ..models import JobStart
from .common import (
    JOB_TABLE,
    QUEUE_TABLE,
    START_TABLE,
    ClaimedJob,
    events_channel,
    events_enabled,
)
from .effects import write_events
from .partitions import _lock_queue

# -- claim ----------------------------------------------------------------------------------


#: A queue whose claims take its lock (:func:`claim_gated_jobs`): the fast claim skips its jobs.
_GATED_SQL = (
    "(q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL OR q.partition_rate_limit IS NOT NULL "
    "OR COALESCE(q.partition_concurrency, 1) > 1)"
)


def _partition_free(d: Driver, concurrency: int) -> str:
    """The claim condition of a partitioned candidate ``j`` (always true without a partition).

    ``concurrency`` 1: no earlier job of its (queue, partition) is unfinished (so partitions run
    in order: a failed job waiting for its retry blocks the ones after it) and none is running
    (a job whose enqueue committed after a later one started must not run beside it). Each is
    one probe of a partial index (django_jobs_unfinished_idx, django_jobs_part_active_idx).
    Exact without a lock: "unfinished" only shrinks, so a job every snapshot sees as blocked
    stays blocked until its predecessors are committed as finished.

    Above 1: ``j`` is among the first ``concurrency`` unfinished jobs of its partition and
    fewer than ``concurrency`` run (order is then no longer guaranteed).
    """
    same = "p.queue = j.queue AND p.partition_key = j.partition_key"
    earlier = f"FROM {JOB_TABLE} p WHERE {same} AND p.state IN {UNFINISHED_SQL} AND p.id < j.id"
    running = f"FROM {JOB_TABLE} p WHERE {same} AND p.state = 'active' AND p.partition_key IS NOT NULL"
    if concurrency == 1:
        return f"(j.partition_key IS NULL OR (NOT EXISTS (SELECT 1 {earlier}) AND NOT EXISTS (SELECT 1 {running})))"
    return (
        f"(j.partition_key IS NULL OR ({d.fewer_than(earlier, concurrency)} AND {d.fewer_than(running, concurrency)}))"
    )


def _claim_statement(
    d: Driver,
    *,
    now: datetime | None,
    lease_seconds: float,
    worker_id: str,
    where: list[str],
    where_params: list[Any],
    limit: int,
    lease_token: uuid.UUID,
    include_blocked: bool = False,
) -> dict[str, Any]:
    """What the claim asks of the driver (:meth:`Driver.claim_jobs`): the ready jobs matching
    ``where`` (about candidate ``j``), in claim order, marked active with ``lease_token`` and an
    expiry of database time + ``lease_seconds``.

    The caller picks the token before it sends the claim: should the answer be lost after the
    commit, the caller still knows which rows the claim took (``release_jobs(lease_tokens=)``)."""
    # "Not blocked" spelled as in the ready indexes' condition, so every database uses them.
    ready = ["j.state = 'waiting'"] if include_blocked else ["j.state = 'waiting'", d.not_blocked("j")]
    return {
        "where": " AND ".join([*ready, *where]), "params": where_params, "limit": limit, "lease_token": lease_token,
        "worker_id": worker_id, "now": now, "lease_seconds": lease_seconds,
    }  # fmt: skip


def _queue_scope(d: Driver, queues: list[str] | None, backend: str | None) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    # One queue: an equality, so the database walks django_jobs_ready_queue_idx in claim order.
    # All queues: it walks django_jobs_ready_idx in claim order. Several: the planner's choice.
    if queues and len(queues) == 1:
        where.append("j.queue = %s")
        params.append(queues[0])
    elif queues:
        sql, in_params = d.in_list("j.queue", queues)
        where.append(sql)
        params += in_params
    if backend is not None:
        where.append("j.backend = %s")
        params.append(backend)
    return where, params


def _run_claim(d: Driver, using: str, claim: dict[str, Any]) -> list[ClaimedJob]:
    fused = d.FUSED_EFFECTS and events_enabled()
    with d.effects_atomic(), d.cursor(hot=True, generic=True) as cursor:
        rows = d.claim_jobs(cursor, **claim, events_channel=events_channel() if fused else None)
        jobs = [_claimed(d, row) for row in rows]
        if not d.FUSED_EFFECTS:
            write_events(
                cursor,
                d,
                [(j.queue, j.id, "active", {"attempt": j.attempts, "worker": j.worker_ids[-1]}) for j in jobs],
                jobs[0].last_attempted_at if jobs else None,
            )
    # RETURNING has no order: restore claim order so higher priorities start first.
    jobs.sort(key=lambda j: (-j.priority, j.seq, j.id))
    return jobs


def claim_jobs(
    *,
    using: str,
    queues: list[str] | None,
    limit: int,
    worker_id: str,
    lease_seconds: float,
    backend: str | None = None,
    job_ids: list[uuid.UUID] | None = None,
    skip_gated: bool = True,
    lease_token: uuid.UUID | None = None,
    now: datetime | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` waiting jobs of ``queues`` (``None`` = all) for ``worker_id``;
    with ``backend``, only jobs enqueued through that TASKS alias. Every job claimed gets
    ``lease_token`` (a new one when None); a worker passes its own so it can tell which rows a
    claim took even when the claim's answer is lost.

    One statement (:func:`_claim_statement`), committed before any user code runs. It skips
    paused queues and queues with a concurrency or rate limit (:func:`claim_gated_jobs` claims
    those under their lock), and a partitioned job until it is its partition's turn.
    ``job_ids``: the test kit runs the given jobs, whatever their queue's flags.
    ``skip_gated=False``: the test kit's drain, one job at a time, claims limited queues too.
    """
    if limit <= 0:
        return []
    d = driver(using)
    where, where_params = _queue_scope(d, queues, backend)
    if job_ids is not None:
        if not job_ids:
            return []
        sql, params = d.in_list("j.id", [d.uuid(j) for j in job_ids])
        where.append(sql)
        where_params += params
    else:
        # Paused and gated queues are skipped here, in the claim itself: a pause or a limit holds
        # for every worker from the moment it commits. An uncorrelated NOT IN, so the database
        # reads the (small) table once per statement into a hashed set. Not a correlated NOT
        # EXISTS: PostgreSQL turns that into an anti-join it expects to remove nearly every row,
        # prices the LIMIT as a walk of the whole ready index and JIT-compiles every claim (0.5-1 s
        # per claim on a 100,000-job backlog, against 0.3 ms this way).
        skipped = f"(q.paused OR {_GATED_SQL})" if skip_gated else "q.paused"
        where.append(f"j.queue NOT IN (SELECT q.name FROM {QUEUE_TABLE} q WHERE {skipped})")
        where.append(_partition_free(d, 1))
    claim = _claim_statement(
        d, now=now, lease_seconds=lease_seconds, worker_id=worker_id, where=where, where_params=where_params,
        limit=limit, lease_token=lease_token or uuid.uuid4(), include_blocked=job_ids is not None,
    )  # fmt: skip
    return _run_claim(d, using, claim)


def gated_queues(*, using: str, queues: list[str] | None) -> list[str]:
    """The queues among ``queues`` (None: all) with a concurrency or rate limit, not paused."""
    d = driver(using)
    where, params = f"NOT q.paused AND {_GATED_SQL}", []
    if queues:
        sql, params = d.in_list("q.name", queues)
        where += f" AND {sql}"
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT q.name FROM {QUEUE_TABLE} q WHERE {where} ORDER BY q.name", params)
        return [row[0] for row in cursor.fetchall()]


_GATE_COLUMNS = (
    "paused, concurrency_limit, rate_limit, rate_window_seconds, partition_concurrency, partition_rate_limit, "
    "partition_rate_window_seconds"
)


def claim_gated_jobs(
    *,
    using: str,
    queue: str,
    limit: int,
    worker_id: str,
    lease_seconds: float,
    backend: str | None = None,
    lease_token: uuid.UUID | None = None,
    now: datetime | None = None,
) -> tuple[list[ClaimedJob], float | None]:
    """Claim up to ``limit`` jobs of ``queue``, which has a concurrency or rate limit; return
    them and, when a rate limit held some back, the seconds until its window lets one more start.
    ``lease_token``: as for :func:`claim_jobs`.

    One transaction holding the queue's row lock, so the claims of one queue run one after
    another across every worker and each counts what the one before it committed:

    * concurrency: at most ``concurrency_limit - running`` more;
    * rate: the start log (JobStart) keeps one row per start for one window; at most
      ``rate_limit`` minus the starts of the last ``rate_window_seconds`` more. A sliding window:
      no span of that length ever holds more starts than the limit;
    * per partition: the partition condition with ``partition_concurrency``; with a partition
      rate limit, a partition's starts in its window must stay under it, one job per partition
      per claim so the count cannot be passed within the statement.

    The time is read after the lock is held (PostgreSQL: ``clock_timestamp()``) and used for the
    window, the start log and the jobs' ``last_attempted_at``: the claims of a queue then carry
    increasing times, which is what makes the sliding window exact.
    """
    if limit <= 0:
        return [], None
    d = driver(using)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        row = _lock_queue(cursor, d, queue, _GATE_COLUMNS)
        if row is None or row[0]:
            return [], None
        _, concurrency, rate, window, part_conc, part_rate, part_window = row
        if now is None:
            now = d.clock(cursor)
        n, wake = limit, None
        if concurrency is not None:
            cursor.execute(f"SELECT COUNT(*) FROM {JOB_TABLE} WHERE queue = %s AND state = 'active'", [queue])
            n = min(n, concurrency - cursor.fetchone()[0])
        if rate is not None:
            since = now - timedelta(seconds=window)
            cursor.execute(
                f"DELETE FROM {START_TABLE} WHERE queue = %s AND partition_key = '' AND started_at <= %s",
                [queue, d.dt(since)],
            )
            cursor.execute(
                f"SELECT COUNT(*), MIN(started_at) FROM {START_TABLE} WHERE queue = %s AND partition_key = ''",
                [queue],
            )
            count, oldest = cursor.fetchone()
            if count >= rate:
                wake = (d.to_dt(oldest) + timedelta(seconds=window) - now).total_seconds()
            n = min(n, rate - count)
        if n <= 0:
            return [], wake
        where, where_params = _queue_scope(d, [queue], backend)
        where.append(_partition_free(d, part_conc or 1))
        if part_rate is not None:
            part_since = now - timedelta(seconds=part_window)
            cursor.execute(
                f"DELETE FROM {START_TABLE} WHERE queue = %s AND partition_key <> '' AND started_at <= %s",
                [queue, d.dt(part_since)],
            )
            where.append(
                f"(j.partition_key IS NULL OR ((SELECT COUNT(*) FROM {START_TABLE} s WHERE s.queue = j.queue "
                f"AND s.partition_key = j.partition_key) < %s AND NOT EXISTS (SELECT 1 FROM {JOB_TABLE} p "
                f"WHERE p.queue = j.queue AND p.partition_key = j.partition_key AND p.state = 'waiting' "
                f"AND p.id < j.id)))"
            )
            where_params.append(part_rate)
        claim = _claim_statement(
            d, now=now, lease_seconds=lease_seconds, worker_id=worker_id, where=where, where_params=where_params,
            limit=n, lease_token=lease_token or uuid.uuid4(),
        )  # fmt: skip
        jobs = _run_claim(d, using, claim)
        starts = [(queue, "") for _ in jobs] if rate is not None else []
        if part_rate is not None:
            starts += [(queue, j.partition_key) for j in jobs if j.partition_key is not None]
        if starts:
            JobStart.objects.using(using).bulk_create(
                [JobStart(queue=q, partition_key=p, started_at=now) for q, p in starts]
            )
        if part_rate is not None and len(jobs) < n:
            # Partitions held back by their rate: wake when the oldest of their starts leaves.
            cursor.execute(
                f"SELECT MIN(started_at) FROM {START_TABLE} WHERE queue = %s AND partition_key <> ''", [queue]
            )
            oldest = cursor.fetchone()[0]
            if oldest is not None:
                part_wake = (d.to_dt(oldest) + timedelta(seconds=part_window) - now).total_seconds()
                wake = part_wake if wake is None else min(wake, part_wake)
    return jobs, wake


def _claimed(d: Driver, row: tuple[Any, ...]) -> ClaimedJob:
    return ClaimedJob(*d.claim_values(row))

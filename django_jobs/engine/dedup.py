"""Deduplicated enqueues: one live job per key (``insert_job_once``), the stash of a job that
must wait for its key, and the sweeps that promote stashes and expire keys."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, NamedTuple

from django.db import OperationalError, connections, transaction

from ..db import is_transient
from ..drivers import Driver, driver
from ..exceptions import InvalidTaskOptions, JobsError, QueueFull
from ..models import Job
from ..models.dedup import JobDedup, JobDedupNext
from ..spec.newjob import NewJob
from ..states import FINISHED_STATES, JobState
from .common import JOB_TABLE, _backend_scope, _job_state, _mark_saved, _read_job, logger
from .effects import _enqueued_event, notify
from .insert import _insert_job, _insert_new, _new_job
from .partitions import _admit, _queue_size_limited, _unblock_heads

# -- deduplication --------------------------------------------------------------------------

DEDUP_TABLE = JobDedup._meta.db_table
DEDUP_NEXT_TABLE = JobDedupNext._meta.db_table
#: How often one enqueue starts over when the key it met was released before it could lock it
#: (its holder deleted, or the sweeper removing it as expired). Each try is a savepoint.
_DEDUP_TRIES = 10
_UNSTARTED = (JobState.WAITING, JobState.DELAYED)


def _key_where(d: Driver) -> str:
    return f"backend = %s AND queue = %s AND {d.quote('key')} = %s"


class DedupOutcome(NamedTuple):
    """What :func:`enqueue_deduplicated` did."""

    #: The job holding the key now: the new job, or (a duplicate) the one that held it.
    job: Job
    #: A new job was inserted: the key was free, its holder had finished, or it had expired.
    created: bool
    #: A new job: ``("took_over",)`` when the key had a finished or expired holder. A duplicate:
    #: any of ``replaced`` (the holder's arguments and run_after), ``extended`` (the key's
    #: expiry), ``stashed`` (kept to run after the running holder).
    changes: tuple[str, ...] = ()


def enqueue_deduplicated(
    job: NewJob,
    *,
    using: str,
    key: str,
    ttl: float | None = None,
    extend: bool = False,
    replace: bool = False,
    keep_last_if_active: bool = False,
    notify_workers: bool = True,
    now: datetime | None = None,
) -> DedupOutcome:
    """Insert ``job`` unless ``key`` (unique per backend and queue) is held; in the caller's
    transaction, inside a savepoint.

    The key is taken with ``INSERT ... ON CONFLICT DO NOTHING`` on the unique constraint, never
    checked first: of concurrent enqueues of a free key exactly one inserts it (on PostgreSQL the
    others wait on the unique index until it commits or rolls back; on SQLite the statement holds
    the write lock). On a conflict the key's row is locked (``FOR UPDATE``; SQLite's write lock)
    and the holder decides:

    * the key expired (``expire_at`` passed), or has no expiry and its job finished: this
      enqueue takes it over (a guarded UPDATE on the old job id and the reason) and inserts its
      job; a stash left for the key is dropped, this enqueue being newer;
    * else it is a duplicate: the holder is returned, after ``replace`` gave a waiting or
      delayed holder this enqueue's arguments and run_after (guarded on those states),
      ``keep_last_if_active`` stashed this enqueue while the holder runs (one per key, the last
      one wins, made a job by :func:`promote_dedup_stashes`; the key then holds until it is),
      or ``extend`` moved the key's expiry to ``ttl`` seconds from now.

    ``ttl``: seconds the key holds from now, whatever its job's state (None: while the job is
    unfinished). Expiry is on ``now``, or the database clock on PostgreSQL. ``notify_workers``:
    wake the queue's workers when a job became waiting (``enqueue_many`` wakes them once).
    Raises InvalidTaskOptions when ``replace`` meets a holder of another task.
    """
    d = driver(using)
    conn = connections[using]
    for _ in range(_DEDUP_TRIES):
        row = _new_job(job, now=now, dedup_key=key, database_clock=d.DATABASE_CLOCK)
        outermost = not conn.in_atomic_block
        try:
            with transaction.atomic(using=using), conn.cursor() as cursor:
                outcome = _enqueue_dedup_try(
                    cursor,
                    d,
                    using,
                    row,
                    ttl=ttl,
                    extend=extend,
                    replace=replace,
                    keep_last=keep_last_if_active,
                    wake=notify_workers,
                    now=now,
                )
        except OperationalError as exc:
            # MySQL: enqueues waiting on a key whose first insert rolled back can deadlock (each
            # holds a shared lock on the key and wants an exclusive one). The database ends one
            # transaction; when it was this try's own, the next try goes on. Inside the caller's
            # transaction the error is the caller's: that whole transaction is gone.
            if not (outermost and is_transient(exc)):
                raise
            logger.info("Dedup key %r: %s; trying again.", key, exc)
            continue
        if outcome is not None:
            break
    else:
        raise JobsError(
            f"Could not enqueue with dedup key {key!r} (queue {job.queue!r}) after {_DEDUP_TRIES} tries: the key was "
            "released every time before it could be read (are its jobs deleted as fast as they are enqueued?). "
            "Enqueue again."
        )
    if notify_workers and outcome.job.state == JobState.WAITING and "replaced" in outcome.changes:
        notify(using, [job.queue])  # a new job's NOTIFY rode on its INSERT
    return outcome


def _enqueue_dedup_try(
    cursor: Any,
    d: Driver,
    using: str,
    job: Job,
    *,
    ttl: float | None,
    extend: bool,
    replace: bool,
    keep_last: bool,
    wake: bool,
    now: datetime | None,
) -> DedupOutcome | None:
    """One try of :func:`enqueue_deduplicated`; None: the key vanished or its holder just
    finished, start over. ``wake``: a new waiting job notifies its queue's workers."""
    key_params = [job.backend, job.queue, job.dedup_key]
    expire_sql, expire_params = _dedup_expiry(d, ttl, now)
    # The key first, the job second: a duplicate (the common case under contention) then writes
    # nothing. The foreign key to the job is checked at commit (Django creates it deferred).
    with d.deferred_foreign_keys(cursor):
        taken = d.take_dedup_key(cursor, key_params, d.uuid(job.id), expire_sql, expire_params)
    if taken:
        _insert_new(cursor, d, using, job, wake=wake)
        return DedupOutcome(job, True)
    # On SQLite the INSERT took the write lock, even though it wrote nothing.
    held = _lock_dedup_key(cursor, d, job.backend, job.queue, job.dedup_key, now, sqlite_write_locked=True)
    if held is None:
        return None  # released between the INSERT and the lock
    key_id, holder_id, has_expiry, expired = held
    holder = _read_job(cursor, d, using, "id = %s", [d.uuid(holder_id)])
    if expired or holder is None or (not has_expiry and holder.state in FINISHED_STATES):
        # Guarded on the old holder and on the reason (the row is locked, so it holds).
        now_sql, now_params = d.now(now)
        reason = f"expire_at <= {now_sql}" if expired else "expire_at IS NULL" if holder is not None else "1 = 1"
        with d.deferred_foreign_keys(cursor):
            cursor.execute(
                f"UPDATE {DEDUP_TABLE} SET job_id = {d.cast('%s', 'uuid')}, expire_at = {expire_sql} "
                f"WHERE id = %s AND job_id = {d.cast('%s', 'uuid')} AND {reason}",
                [d.uuid(job.id), *expire_params, key_id, d.uuid(holder_id), *(now_params if expired else [])],
            )
        if cursor.rowcount != 1:
            logger.info("Dedup key %r changed hands while locked; trying again.", job.dedup_key)
            return None
        cursor.execute(f"DELETE FROM {DEDUP_NEXT_TABLE} WHERE {_key_where(d)}", key_params)
        _insert_new(cursor, d, using, job, wake=wake)
        return DedupOutcome(job, True, ("took_over",))
    changes: list[str] = []
    state = holder.state
    if replace and state in _UNSTARTED:
        if holder.task_path != job.task_path:
            raise InvalidTaskOptions(
                f"Dedup key {job.dedup_key!r} of queue {job.queue!r} is held by job {holder.id} of "
                f"{holder.task_path}; replace=True cannot give it the arguments of {job.task_path}. Use keys that "
                "name the task too, such as f'{task_name}:{id}'."
            )
        # Guarded on the states a holder may be replaced in; the UPDATE locks the row, so a claim
        # (SKIP LOCKED) cannot start it with the old arguments until this transaction ends.
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET args = {d.cast('%s', 'jsonb')}, kwargs = {d.cast('%s', 'jsonb')}, "
            f"state = %s, available_at = {d.cast('%s', 'timestamptz')}, seq = %s "
            f"WHERE id = {d.cast('%s', 'uuid')} AND state IN ('waiting', 'delayed')",
            [json.dumps(job.args), json.dumps(job.kwargs), job.state, d.dt(job.available_at), job.seq,
             d.uuid(holder.id)],
        )  # fmt: skip
        if cursor.rowcount == 1:
            changes.append("replaced")
        else:
            state = _job_state(cursor, d, holder.id)
    elif keep_last and state in _UNSTARTED and d.ROW_LOCKS:
        # Keep an unstarted holder unstarted while this transaction decides (a claim skips a
        # locked row); without row locks, claims wait for the write lock this transaction holds.
        cursor.execute(
            f"SELECT id FROM {JOB_TABLE} WHERE id = %s AND state IN ('waiting', 'delayed') FOR UPDATE",
            [d.uuid(holder.id)],
        )
        if cursor.fetchone() is None:
            state = _job_state(cursor, d, holder.id)
    if state is None or (not has_expiry and state in FINISHED_STATES):
        return None  # it finished (or went) meanwhile: the key is free to take over
    if keep_last and state == JobState.ACTIVE:
        _stash(cursor, d, job, ttl=ttl)
        # The key holds until the stash is a job, whatever its ttl (the seed's "persisted" key).
        cursor.execute(f"UPDATE {DEDUP_TABLE} SET expire_at = NULL WHERE id = %s", [key_id])
        changes.append("stashed")
    elif extend and has_expiry:
        cursor.execute(
            f"UPDATE {DEDUP_TABLE} SET expire_at = {expire_sql} WHERE id = %s AND expire_at IS NOT NULL",
            [*expire_params, key_id],
        )
        changes.append("extended")
    if changes:
        holder = _read_job(cursor, d, using, "id = %s", [d.uuid(holder.id)]) or holder
    return DedupOutcome(holder, False, tuple(changes))


def _dedup_expiry(d: Driver, ttl: float | None, now: datetime | None) -> tuple[str, list[Any]]:
    """SQL for a key's ``expire_at``: ``ttl`` seconds from now, or NULL."""
    if ttl is None:
        return "NULL", []
    return d.now_plus(now, ttl)


def _lock_dedup_key(
    cursor: Any,
    d: Driver,
    backend: str,
    queue: str,
    key: str | None,
    now: datetime | None,
    *,
    sqlite_write_locked: bool = False,
) -> tuple[int, uuid.UUID, bool, bool] | None:
    """Lock a dedup key's row; ``(row id, holder id, has an expiry, has expired)``, None when
    there is no such key. ``sqlite_write_locked``: this transaction already wrote (on SQLite it
    holds the write lock, so a read is enough and a duplicate's commit writes nothing)."""
    row = d.lock_dedup_key(cursor, _key_where(d), [backend, queue, key], now, write_locked=sqlite_write_locked)
    return None if row is None else (row[0], d.to_uuid(row[1]), row[2], row[3])


def _stash(cursor: Any, d: Driver, job: Job, *, ttl: float | None) -> None:
    """Keep ``job`` (unsaved) as its key's next job, replacing an earlier stash."""
    delayed = job.state == JobState.DELAYED
    payload = {
        "task_path": job.task_path,
        "args": job.args,
        "kwargs": job.kwargs,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "options": job.options,
        "run_after": job.available_at.isoformat() if delayed else None,
        "lifo": job.seq < 0,
        "trace_id": job.trace_id,
        "partition": job.partition_key,
        "ttl": ttl,
        # None: the database clock; the job then gets stashed_at (see _promote_stash).
        "enqueued_at": job.enqueued_at.isoformat() if job.enqueued_at is not None else None,
    }
    stashed_sql, stashed_params = d.now(job.enqueued_at)
    d.stash_dedup_next(
        cursor, [job.backend, job.queue, job.dedup_key], json.dumps(payload), stashed_sql, stashed_params
    )


def insert_job_once(job: NewJob, *, using: str, idempotency_key: str, now: datetime | None = None) -> tuple[Job, bool]:
    """Insert ``job`` unless its queue (of its backend) has one with ``idempotency_key``; return
    ``(job, inserted)``: the new job, or the existing one and False.

    One ``INSERT ... ON CONFLICT DO NOTHING`` on the partial unique index, then, on a conflict,
    a read of the row that won (on PostgreSQL a concurrent insert of the key is waited for). The
    key holds for as long as the job row exists, whatever its state.
    """
    d = driver(using)
    conn = connections[using]
    backend, queue = job.backend, job.queue
    for _ in range(_DEDUP_TRIES):
        row = _new_job(job, now=now, idempotency_key=idempotency_key, database_clock=d.DATABASE_CLOCK)
        # In autocommit the NOTIFY rides on the INSERT; in a transaction notify() sends it once per
        # queue, and only for a job that was inserted.
        wake = row.state == JobState.WAITING and d.LISTEN_NOTIFY and not conn.in_atomic_block
        with d.effects_atomic(), conn.cursor() as cursor:
            inserted = _insert_job(cursor, d, row, wake=wake, once=True, guarded=True)
            if inserted:
                _enqueued_event(cursor, d, row)
        where = "backend = %s AND queue = %s AND idempotency_key = %s"
        if not inserted and _queue_size_limited(using, queue):
            # The guard refused it: a limited queue admits under its lock (a duplicate first).
            with conn.cursor() as cursor:
                found = _read_job(cursor, d, using, where, [backend, queue, idempotency_key])
            if found is not None:
                return found, False
            try:
                with transaction.atomic(using=using), conn.cursor() as cursor:
                    _admit(cursor, d, queue, {row.partition_key: 1})
                    inserted = _insert_job(cursor, d, row, wake=wake, once=True)
                    if inserted:
                        _enqueued_event(cursor, d, row)
            except QueueFull:
                # The key's first job may have committed while we waited for the lock: a
                # duplicate returns it, full or not.
                with conn.cursor() as cursor:
                    found = _read_job(cursor, d, using, where, [backend, queue, idempotency_key])
                if found is not None:
                    return found, False
                raise
        if inserted:
            _mark_saved(row, using)
            if row.partition_key is not None:
                with conn.cursor() as cursor:
                    _unblock_heads(cursor, d, {(row.queue, row.partition_key)})
            if row.state == JobState.WAITING and not wake:
                notify(using, [queue])
            return row, True
        with conn.cursor() as cursor:
            found = _read_job(cursor, d, using, where, [backend, queue, idempotency_key])
        if found is not None:
            return found, False
        # The job that had the key was deleted after our INSERT met it: the key is free again.
    raise JobsError(
        f"Could not enqueue with idempotency key {idempotency_key!r} (queue {queue!r}) after {_DEDUP_TRIES} "
        "tries: the job holding it was deleted every time before it could be read. Enqueue again."
    )


def promote_dedup_stashes(*, using: str, limit: int, backend: str | None = None, now: datetime | None = None) -> int:
    """Turn up to ``limit`` stashed enqueues (``keep_last_if_active``) whose key's holder has
    finished (or is gone) into jobs (of ``backend``, or all); return how many.

    Each stash, in its own transaction (a savepoint inside the caller's): lock the key row,
    check again that its holder finished, lock the stash, insert its job, move the key to it
    (guarded on the old holder; with the stash's ``ttl`` as expiry) and delete the stash. A
    stash whose key another enqueue took meanwhile stays until that holder finishes.
    """
    d = driver(using)
    scope, scope_params = (" AND n.backend = %s", [backend]) if backend is not None else ("", [])
    finished = ", ".join(f"'{s}'" for s in sorted(FINISHED_STATES))
    key = d.quote("key")
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT n.backend, n.queue, n.{key} FROM {DEDUP_NEXT_TABLE} n "
            f"LEFT JOIN {DEDUP_TABLE} k ON k.backend = n.backend AND k.queue = n.queue AND k.{key} = n.{key} "
            f"LEFT JOIN {JOB_TABLE} j ON j.id = k.job_id "
            f"WHERE (k.id IS NULL OR j.state IN ({finished})){scope} ORDER BY n.id LIMIT %s",
            [*scope_params, limit],
        )
        candidates = cursor.fetchall()
    woken: set[str] = set()
    promoted = 0
    for cand_backend, queue, key in candidates:
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                job = _promote_stash(cursor, d, using, cand_backend, queue, key, now)
        except QueueFull as exc:
            logger.warning("Dedup key %r: its stashed enqueue waits, %s", key, exc)
            continue
        if job is not None:
            promoted += 1
            logger.info("Dedup key %r of queue %r: its stashed enqueue is job %s.", key, queue, job.id)
            if job.state == JobState.WAITING:
                woken.add(queue)
    notify(using, sorted(woken))
    return promoted


def _promote_stash(
    cursor: Any, d: Driver, using: str, backend: str, queue: str, key: str, now: datetime | None
) -> Job | None:
    held = _lock_dedup_key(cursor, d, backend, queue, key, now)
    if held is not None and _job_state(cursor, d, held[1]) not in (*FINISHED_STATES, None):
        return None  # its holder runs again (retried): the stash waits for it
    cursor.execute(
        f"SELECT id, payload, stashed_at FROM {DEDUP_NEXT_TABLE} WHERE {_key_where(d)} {d.for_update()}",
        [backend, queue, key],
    )
    stash = cursor.fetchone()
    if stash is None:
        return None  # promoted by another sweeper, or dropped by a takeover
    p = d.to_json(stash[1])
    # The stashed enqueue's time: in its payload, or (stamped by the database clock) stashed_at.
    enqueued_at = datetime.fromisoformat(p["enqueued_at"]) if p.get("enqueued_at") else d.to_dt(stash[2])
    stashed = NewJob(
        backend,
        p["task_path"],
        queue,
        p["priority"],
        p["args"],
        p["kwargs"],
        p["max_attempts"],
        p["options"],
        run_after=datetime.fromisoformat(p["run_after"]) if p.get("run_after") else None,
        lifo=bool(p.get("lifo")),
        trace_id=p.get("trace_id"),
        partition=p.get("partition"),
    )
    job = _new_job(stashed, now=now, dedup_key=key, enqueued_at=enqueued_at)
    expire_sql, expire_params = _dedup_expiry(d, p.get("ttl"), now)
    if held is not None:
        with d.deferred_foreign_keys(cursor):
            cursor.execute(
                f"UPDATE {DEDUP_TABLE} SET job_id = {d.cast('%s', 'uuid')}, expire_at = {expire_sql} "
                f"WHERE id = %s AND job_id = {d.cast('%s', 'uuid')}",
                [d.uuid(job.id), *expire_params, held[0], d.uuid(held[1])],
            )
        if cursor.rowcount != 1:
            return None
    else:
        with d.deferred_foreign_keys(cursor):
            taken = d.take_dedup_key(cursor, [backend, queue, key], d.uuid(job.id), expire_sql, expire_params)
        if not taken:
            return None  # an enqueue took the free key meanwhile: the stash waits for its job
    _insert_new(cursor, d, using, job)
    cursor.execute(f"DELETE FROM {DEDUP_NEXT_TABLE} WHERE id = %s", [stash[0]])
    return job


def delete_expired_dedup_keys(
    *, using: str, limit: int, backend: str | None = None, now: datetime | None = None
) -> int:
    """Delete up to ``limit`` dedup keys whose ``expire_at`` passed, and up to ``limit`` keys
    without expiry whose holder finished (of ``backend``, or all); return how many. Enqueues
    reclaim such keys too; this keeps the table small."""
    d = driver(using)
    now_sql, now_params = d.now(now)
    scope, scope_params = _backend_scope(backend)
    sql = (
        f"DELETE FROM {DEDUP_TABLE} WHERE "
        + d.id_in(
            f"SELECT id FROM {DEDUP_TABLE} WHERE expire_at <= {now_sql}{scope} "
            f"ORDER BY expire_at LIMIT %s {d.skip_locked()}"
        )
        + f" AND expire_at <= {now_sql}"
    )
    # Keys without an expiry (simple, keep-last-if-active) whose holder finished and that hold no
    # stash: free already, deleted so the table does not grow by one row per key ever used. The
    # DELETE re-checks the holder, so a key an enqueue took over meanwhile is kept.
    finished = "('completed', 'failed', 'cancelled')"
    held_by_finished = f"job_id IN (SELECT id FROM {JOB_TABLE} WHERE state IN {finished})"
    no_stash = (
        f"NOT EXISTS (SELECT 1 FROM {DEDUP_NEXT_TABLE} n WHERE n.backend = {DEDUP_TABLE}.backend "
        f"AND n.queue = {DEDUP_TABLE}.queue AND n.key = {DEDUP_TABLE}.key)"
    )
    stale_sql = (
        f"DELETE FROM {DEDUP_TABLE} WHERE "
        + d.id_in(
            f"SELECT id FROM {DEDUP_TABLE} WHERE expire_at IS NULL AND {held_by_finished} AND {no_stash}{scope} "
            f"LIMIT %s {d.skip_locked()}"
        )
        + f" AND expire_at IS NULL AND {held_by_finished} AND {no_stash}"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*now_params, *scope_params, limit, *now_params])
        deleted = cursor.rowcount
        cursor.execute(stale_sql, [*scope_params, limit])
        return deleted + cursor.rowcount

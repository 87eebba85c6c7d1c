"""Admission and ordered partitions: a queue's size limits (checked under the queue row's lock)
and the unblocking of a partition's next job when its head finishes."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connections, models

from ..drivers import Driver, driver
from ..drivers.base import UNFINISHED_SQL
from ..drivers.inserts import SIZE_LIMITED as _SIZE_LIMITED
from ..exceptions import QueueFull
from ..models import Job, QueueState
from ..states import FINISHED_STATES
from .common import JOB_TABLE, logger
from .effects import notify

#: True for a queue whose enqueues are counted against a size limit (see :func:`_admit`).


def _queue_size_limited(using: str, queue: str) -> bool:
    return (
        QueueState.objects.using(using)
        .filter(name=queue)
        .filter(models.Q(max_size__isnull=False) | models.Q(partition_max_size__isnull=False))
        .exists()
    )


def _lock_queue(cursor: Any, d: Driver, queue: str, columns: str, where: str = "") -> tuple[Any, ...] | None:
    """Lock ``queue``'s QueueState row until the transaction ends and return ``columns`` of it;
    None when the queue has no row (or it does not match ``where``, then nothing is locked)."""
    return d.lock_queue(cursor, queue, columns, where)


def _count_unfinished(cursor: Any, d: Driver, queue: str, partition: str | None, cap: int) -> int:
    """Unfinished jobs of ``queue`` (of one ``partition``), counting no further than ``cap``.

    Of a partition: an index range of django_jobs_unfinished_idx (partitioned rows only); of a
    whole queue: :meth:`Driver.queue_size` (the partial index of each unfinished state)."""
    if partition is None:
        return d.queue_size(cursor, queue, cap)
    cursor.execute(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM {JOB_TABLE} WHERE queue = %s AND partition_key = %s "
        f"AND state IN {UNFINISHED_SQL} LIMIT %s) s",
        [queue, partition, cap],
    )
    return cursor.fetchone()[0]


def _admit(cursor: Any, d: Driver, queue: str, adding: dict[str | None, int], *, batch_before: int = 0) -> bool:
    """Raise QueueFull when ``adding`` (``{partition or None: new jobs}``) would take ``queue``
    or one of its partitions past its max size. Call inside a transaction, before the INSERT.

    A queue without a size limit costs one primary-key probe and locks nothing (a plain
    ``enqueue()`` does not come here for it: engine.size_limits). A limited one
    is locked until the caller's transaction ends (PostgreSQL: a transaction-level advisory lock
    per queue; SQLite: the database write lock), so concurrent enqueuers count one after another
    and each sees the jobs the one before it committed (READ COMMITTED: each statement after the
    lock reads anew): the size never passes the limit, however many processes enqueue. ``batch_before``: jobs of the same batch
    this transaction already inserted (they are counted in the size; the message names them).
    True when the queue has a size limit (False: nothing was locked or counted).
    """
    row = d.lock_admission(cursor, queue, _SIZE_LIMITED)
    if row is None:
        return False
    max_size, partition_max = row
    total = sum(adding.values())
    if max_size is not None:
        size = _count_unfinished(cursor, d, queue, None, max_size)
        if size + total > max_size:
            raise QueueFull(queue=queue, size=size - batch_before, limit=max_size, adding=total + batch_before)
    if partition_max is not None:
        for partition, n in adding.items():
            if partition is None:
                continue
            size = _count_unfinished(cursor, d, queue, partition, partition_max)
            if size + n > partition_max:
                raise QueueFull(
                    queue=queue, partition=partition, size=size - batch_before, limit=partition_max,
                    adding=n + batch_before,
                )  # fmt: skip
    return True


def _unblock_heads(cursor: Any, d: Driver, partitions: set[tuple[str, str]]) -> int:
    """Clear ``blocked`` on the next job (earliest unfinished) of each (queue, partition) so
    claims see it; return how many were blocked. Inserts block a partitioned job and call this
    right after; a job reaching a final state calls it for its partition. A hint only: two
    enqueues racing a finish can leave a partition's next job blocked, which the
    PartitionSweeper (:func:`unblock_partitions`) clears within one of its intervals."""
    if not partitions:
        return 0
    return d.unblock_heads(cursor, sorted(partitions))


def unblock_partitions(*, using: str, limit: int) -> int:
    """Clear ``blocked`` on the next job(s) of up to ``limit`` partitions whose earliest
    unfinished job is blocked (so nothing of the partition could be claimed again); return how
    many jobs. The PartitionSweeper's run: one scan of django_jobs_blocked_idx (one entry per
    unfinished job that waits for its partition's turn) grouped by partition, with one probe of
    django_jobs_unfinished_idx per partition."""
    d = driver(using)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT b.queue, b.partition_key FROM {JOB_TABLE} b WHERE {d.is_blocked('b')} AND b.state IN {UNFINISHED_SQL} "
            f"GROUP BY b.queue, b.partition_key HAVING (SELECT {d.is_blocked('f')} FROM {JOB_TABLE} f WHERE "
            f"f.queue = b.queue AND f.partition_key = b.partition_key AND f.state IN {UNFINISHED_SQL} "
            f"ORDER BY f.id LIMIT 1) LIMIT %s",
            [limit],
        )
        stuck = {(q, p) for q, p in cursor.fetchall()}
    freed = _unblock_partitions(using, stuck)
    if freed:
        logger.debug("Unblocked the next job of %d partition(s) left without one.", freed)
    return freed


def _partitions_of(using: str, job_ids: list[uuid.UUID], *, unfinished: bool = False) -> set[tuple[str, str]]:
    """(queue, partition) of the partitioned jobs among ``job_ids`` (only unfinished ones)."""
    jobs = Job.objects.using(using).filter(id__in=job_ids, partition_key__isnull=False)
    if unfinished:
        jobs = jobs.exclude(state__in=FINISHED_STATES)
    return set(jobs.values_list("queue", "partition_key"))


def _unblock_partitions(using: str, keys: set[tuple[str, str]]) -> int:
    """Let the next jobs of these partitions run now (after a cancel, delete or retry changed
    which job is next, or when the sweeper finds one stuck) and wake their queues' workers."""
    if not keys:
        return 0
    with connections[using].cursor() as cursor:
        freed = _unblock_heads(cursor, driver(using), keys)
    if freed:
        notify(using, sorted({q for q, _ in keys}))
    return freed


def _unblock_partitions_of(using: str, job_ids: list[uuid.UUID]) -> None:
    _unblock_partitions(using, _partitions_of(using, job_ids))

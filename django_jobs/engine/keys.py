"""Key rotation: encrypted jobs re-encrypted with the first of ``ENCRYPTION_KEYS`` in batches
(``manage.py jobs rotate-keys``), beside running workers."""

from __future__ import annotations

import json
import uuid
from typing import Any, NamedTuple

from django.db import DatabaseError, connections, transaction

from ..db import is_transient
from ..drivers import driver
from ..exceptions import DecryptionFailed
from ..models import Job
from ..spec.encryption import errors_current, is_current, is_encrypted, rotate_errors, rotate_json
from .common import JOB_TABLE, logger

#: Times one batch is tried again after a transient error (a deadlock with a worker's outcome write).
_TRIES = 5
_COLUMNS = "id, args, kwargs, return_value, errors"


class RotatedBatch(NamedTuple):
    """What :func:`rotate_job_keys` did with one batch."""

    #: Encrypted jobs looked at (0: none left after ``after``).
    examined: int
    #: Jobs re-encrypted with the first key.
    rotated: int
    #: Jobs that no configured key decrypts (left as they are; their ids are logged).
    undecryptable: list[uuid.UUID]
    #: The last id of the batch, where the next one starts (None: nothing examined).
    last_id: uuid.UUID | None


def rotate_job_keys(*, using: str, limit: int, after: uuid.UUID | None = None) -> RotatedBatch:
    """Re-encrypt, with the first key, the next ``limit`` encrypted jobs (``options["encrypt"]``)
    after the id ``after``, in id order: their arguments, return value and error tracebacks.

    One transaction per batch: the batch's rows are locked (``FOR UPDATE``; the write lock on
    SQLite) and read again under the lock, so an outcome or a dedup replace written meanwhile is
    re-encrypted, not overwritten; a worker's write waits for the batch's commit. A job whose
    values the first key encrypted already is not written, so a run stopped half-way and started
    again only reads what it did. A transient database error (a deadlock) retries the batch.
    """
    ids = list(
        Job.objects.using(using)
        .filter(options__encrypt=True, **({"id__gt": after} if after is not None else {}))
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    if not ids:
        return RotatedBatch(0, 0, [], None)
    for attempt in range(1, _TRIES + 1):
        try:
            rotated, bad = _rotate(using, ids)
            break
        except DatabaseError as exc:
            if attempt == _TRIES or not is_transient(exc):
                raise
            logger.info("Key rotation of %d job(s) after %s: %s; trying again.", len(ids), after, exc)
    return RotatedBatch(len(ids), rotated, bad, ids[-1])


def _rotate(using: str, ids: list[uuid.UUID]) -> tuple[int, list[uuid.UUID]]:
    d = driver(using)
    rotated, bad = 0, []
    json_sql = d.cast("%s", "jsonb")
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        for row in d.lock_jobs(cursor, ids, _COLUMNS):
            job_id, (args, kwargs, value, errors) = d.to_uuid(row[0]), (d.to_json(v) for v in row[1:])
            try:
                new = _rotated(args, kwargs, value, errors)
            except DecryptionFailed:
                bad.append(job_id)
                logger.warning("Job %s: no key of ENCRYPTION_KEYS decrypts it; left as it is.", job_id)
                continue
            if new is None:
                continue  # the first key's already
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET args = {json_sql}, kwargs = {json_sql}, return_value = {json_sql}, "
                f"errors = {json_sql} WHERE id = {d.cast('%s', 'uuid')}",
                [*(json.dumps(v) for v in new), d.uuid(job_id)],
            )
            rotated += cursor.rowcount
    return rotated, bad


def _rotated(args: Any, kwargs: Any, value: Any, errors: Any) -> tuple[Any, Any, Any, Any] | None:
    """The four values re-encrypted with the first key; None when it encrypted them all already.
    Values that are not envelopes (a None return value, an error the engine wrote) stay."""
    sealed = [v for v in (args, kwargs, value) if is_encrypted(v)]
    if all(is_current(v) for v in sealed) and errors_current(errors):
        return None
    args, kwargs, value = (rotate_json(v) if is_encrypted(v) else v for v in (args, kwargs, value))
    return args, kwargs, value, rotate_errors(errors)


__all__ = ["RotatedBatch", "rotate_job_keys"]

"""Key rotation: what is stored encrypted, re-encrypted with the first of ``ENCRYPTION_KEYS`` in
batches (``manage.py jobs rotate-keys``), beside running workers: encrypted jobs, the values of
encrypted flow children copied to their dependency rows, stashed dedup enqueues, and in bus mode
encrypted messages, dead letters (payload, error, traceback) and the last errors on group
cursors."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.db.models import Q

from ..db import retry_transient
from ..drivers import Driver, driver
from ..exceptions import DecryptionFailed
from ..models import DeadLetter, GroupCursor, Job, JobDependency, Message
from ..models.dedup import JobDedupNext
from ..spec.encryption import (
    ENVELOPE,
    errors_current,
    is_current,
    is_encrypted,
    is_encrypted_text,
    rotate_errors,
    rotate_json,
    rotate_text,
    text_current,
)
from .common import JOB_TABLE, logger

#: Times one batch is tried again after a transient error (a deadlock with a worker's outcome write).
_TRIES = 5
#: What rotate_keys walks, in this order: each kind's table, the rows to look at, the columns
#: read and written under the lock.
KINDS = ("jobs", "flow values", "dedup stashes", "messages", "dead letters", "cursor errors")


class RotatedBatch(NamedTuple):
    """What one batch of :func:`rotate_encrypted` did."""

    #: Rows looked at (0: none left after ``after``).
    examined: int
    #: Rows re-encrypted with the first key (the others had it already).
    rotated: int
    #: Rows that no configured key decrypts, left as they are (their ids).
    undecryptable: list[Any]
    #: The last id of the batch, where the next one starts (None: nothing examined).
    last_id: Any


def rotate_encrypted(kind: str, *, using: str, limit: int, after: Any = None) -> RotatedBatch:
    """Re-encrypt with the first key the next ``limit`` rows of ``kind`` (one of :data:`KINDS`)
    after the id ``after``, in id order:

    * ``"jobs"``: encrypted jobs (``options["encrypt"]``): arguments, return value and the
      tracebacks of their errors;
    * ``"flow values"``: dependency rows holding an encrypted child's return value or error;
    * ``"dedup stashes"``: stashed ``keep_last_if_active`` enqueues of encrypted jobs;
    * ``"messages"``: bus-mode messages whose payload is an envelope;
    * ``"dead letters"``: dead letters whose payload, error or traceback is encrypted;
    * ``"cursor errors"``: group cursors whose last error is encrypted (a pending retry's, a
      blocked partition's).

    One transaction per batch: its rows are locked (``FOR UPDATE``; the write lock on SQLite) and
    read again under the lock, so an outcome or a new stash written meanwhile is re-encrypted,
    not overwritten; a worker's write waits for the batch's commit. A row whose values the first
    key encrypted already is not written, so a run stopped half-way and started again only reads
    what it did. A transient database error (a deadlock) retries the batch.
    """
    model, where, column_names, rotate = _KIND[kind]
    scope = model.objects.using(using).filter(where)
    if after is not None:
        scope = scope.filter(id__gt=after)
    ids = list(scope.order_by("id").values_list("id", flat=True)[:limit])
    if not ids:
        return RotatedBatch(0, 0, [], None)
    rotated, bad = retry_transient(
        lambda: _rotate(using, model._meta.db_table, ids, column_names, rotate),
        what=f"Key rotation of {len(ids)} {kind} after {after}",
        logger=logger,
        tries=_TRIES,
    )
    return RotatedBatch(len(ids), rotated, bad, ids[-1])


def _rotate(
    using: str, table: str, ids: list[Any], names: tuple[str, ...], rotate: Callable[..., tuple[Any, ...] | None]
) -> tuple[int, list[Any]]:
    d = driver(using)
    rotated, bad = 0, []
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        for row in d.lock_rows(cursor, table, ids, ", ".join(("id", *names))):
            row_id = d.to_uuid(row[0]) if table == JOB_TABLE else row[0]
            try:
                stored = zip(names, row[1:], strict=True)
                new = rotate(*(v if name in _TEXT_COLUMNS else d.to_json(v) for name, v in stored))
            except DecryptionFailed:
                bad.append(row_id)
                logger.warning("%s %s: no key of ENCRYPTION_KEYS decrypts it; left as it is.", table, row_id)
                continue
            if new is None:
                continue  # the first key's already
            rotated += _write(cursor, d, table, row_id, names, new)
    return rotated, bad


def _write(cursor: Any, d: Driver, table: str, row_id: Any, names: tuple[str, ...], values: tuple[Any, ...]) -> int:
    json_sql = d.cast("%s", "jsonb")
    key_sql, key = (d.cast("%s", "uuid"), d.uuid(row_id)) if table == JOB_TABLE else ("%s", row_id)
    sets = ", ".join(f"{name} = {'%s' if name in _TEXT_COLUMNS else json_sql}" for name in names)
    params = [v if name in _TEXT_COLUMNS else json.dumps(v) for name, v in zip(names, values, strict=True)]
    cursor.execute(f"UPDATE {table} SET {sets} WHERE id = {key_sql}", [*params, key])
    return cursor.rowcount


def _current(value: Any) -> bool:
    return not is_encrypted(value) or is_current(value)


def _again(value: Any) -> Any:
    return rotate_json(value) if is_encrypted(value) else value


def _job(args: Any, kwargs: Any, value: Any, errors: Any) -> tuple[Any, ...] | None:
    """A job's four values re-encrypted; None when the first key encrypted them all already.
    Values that are not envelopes (a None return value, an error the engine wrote) stay."""
    if all(_current(v) for v in (args, kwargs, value)) and errors_current(errors):
        return None
    return _again(args), _again(kwargs), _again(value), rotate_errors(errors)


def _flow_value(value: Any) -> tuple[Any] | None:
    """A dependency row's value: an encrypted child's return value, or its error record."""
    if is_encrypted(value):
        return None if is_current(value) else (rotate_json(value),)
    return None if errors_current([value]) else (rotate_errors([value])[0],)


def _stash(payload: Any) -> tuple[Any] | None:
    """A stashed enqueue's payload, its arguments re-encrypted."""
    if _current(payload.get("args")) and _current(payload.get("kwargs")):
        return None
    return ({**payload, "args": _again(payload.get("args")), "kwargs": _again(payload.get("kwargs"))},)


def _message(payload: Any) -> tuple[Any] | None:
    """A message's payload, when it is an envelope (a plain message is never encrypted here)."""
    return None if _current(payload) else (rotate_json(payload),)


def _dead_letter(payload: Any, error: str, traceback: str) -> tuple[Any, ...] | None:
    """A dead letter's payload (an envelope, or plain) and its error and traceback (encrypted
    texts, or plain)."""
    if _current(payload) and text_current(error) and text_current(traceback):
        return None
    return _again(payload), _again_text(error), _again_text(traceback)


def _cursor_error(last_error: str) -> tuple[str] | None:
    return None if text_current(last_error) else (rotate_text(last_error),)


def _again_text(value: str) -> str:
    return rotate_text(value) if is_encrypted_text(value) else value


#: Text columns (the others are JSON): read and written as they are.
_TEXT_COLUMNS = frozenset({"error", "traceback", "last_error"})
#: An encrypted text holds this (``spec.encryption.encrypt_text``); a LIKE finds the candidates.
_SEALED = f'{{"{ENVELOPE}":"'
_ENVELOPE_VALUE = Q(value__has_key=ENVELOPE) | Q(value__traceback__has_key=ENVELOPE)
_KIND: dict[str, tuple[Any, Q, tuple[str, ...], Callable[..., tuple[Any, ...] | None]]] = {
    "jobs": (Job, Q(options__encrypt=True), ("args", "kwargs", "return_value", "errors"), _job),
    "flow values": (JobDependency, _ENVELOPE_VALUE, ("value",), _flow_value),
    "dedup stashes": (JobDedupNext, Q(payload__options__encrypt=True), ("payload",), _stash),
    "messages": (Message, Q(payload__has_key=ENVELOPE), ("payload",), _message),
    "dead letters": (
        DeadLetter,
        Q(payload__has_key=ENVELOPE) | Q(error__contains=_SEALED) | Q(traceback__contains=_SEALED),
        ("payload", "error", "traceback"),
        _dead_letter,
    ),
    "cursor errors": (GroupCursor, Q(last_error__contains=_SEALED), ("last_error",), _cursor_error),
}


__all__ = ["KINDS", "RotatedBatch", "rotate_encrypted"]

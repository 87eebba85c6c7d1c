"""Bus mode's verbs on the message path: register a group, take a partition's next batch under
a lease, acknowledge it, fail it; a topic's settings in effect. Publishing is in
:mod:`.topic_publish`, the operator's verbs (seek, pause, lag, dead letters, retention) in
:mod:`.topic_control`.

The design (queen's ``partition_leases``, docs/explanation/bus-mode.md): a message is one row;
a group's progress in a partition is one :class:`~django_jobs.models.GroupCursor` row holding
the last position it consumed and the lease of the batch it is processing. Every change of a
cursor by a consumer is guarded on its lease token (and the position the batch started from),
so a worker that lost its lease (it expired and another worker took the partition, or an
operator moved the cursor) changes nothing: its acknowledgement is refused.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import Q

from ..conf import get_settings
from ..drivers import Driver, driver
from ..exceptions import JobsConfigurationError
from ..models import ConsumerGroup, DeadLetter, GroupCursor, Message, Topic, TopicPartition
from ..spec.backoff import compute_backoff
from ..spec.encryption import encrypt_text, error_label, is_encrypted, is_encrypted_text, shown_text
from ..spec.topics import DEFAULT_LEASE_SECONDS, validate_topic_declarations
from .common import logger
from .effects import write_events

#: Cursors a consumer looks at per acquire (the first it wins is taken).
ACQUIRE_CANDIDATES = 4


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's settings in effect: its Topic row, else ``DJANGO_JOBS["TOPICS"]``, else the default."""

    name: str
    max_size: int | None = None
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    delay_seconds: float | None = None
    max_wait_seconds: float | None = None
    window_buffer_seconds: float | None = None
    retention_seconds: float | None = None
    max_age_seconds: float | None = None
    #: Payloads are published encrypted, and failures' errors stored encrypted.
    encrypt: bool = False


_CONFIG_FIELDS = (
    "max_size",
    "lease_seconds",
    "delay_seconds",
    "max_wait_seconds",
    "window_buffer_seconds",
    "retention_seconds",
    "max_age_seconds",
    "encrypt",
)


_declared: tuple[Any, dict[str, dict[str, Any]]] | None = None


def declared_topic(name: str) -> dict[str, Any]:
    """``DJANGO_JOBS["TOPICS"][name]`` as Topic columns (validated once per settings object:
    override_settings makes a new one)."""
    global _declared
    settings = get_settings()
    cached = _declared
    if cached is None or cached[0] is not settings:
        cached = _declared = (settings, validate_topic_declarations(settings.TOPICS or {}))
    return cached[1].get(name, {})


def topic_config(name: str, *, using: str) -> TopicConfig:
    declared = declared_topic(name)
    row = Topic.objects.using(using).filter(name=name).values(*_CONFIG_FIELDS).first() or {}
    values = {f: row.get(f) if row.get(f) is not None else declared.get(f) for f in _CONFIG_FIELDS}
    if values["lease_seconds"] is None:
        values["lease_seconds"] = DEFAULT_LEASE_SECONDS
    values["encrypt"] = bool(values["encrypt"])
    return TopicConfig(name=name, **values)


@dataclass(frozen=True, slots=True)
class DeliveredMessage:
    """A message as a subscriber receives it."""

    id: int
    topic: str
    partition: str
    position: int
    payload: Any
    transaction_id: str | None
    trace_id: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Batch:
    """A partition's next messages, leased to one worker for one group. ``start`` is the cursor
    the batch was taken at (the acknowledgement moves it from there to ``end``)."""

    topic: str
    group: str
    cursor_id: int
    partition: str
    token: uuid.UUID
    start: int
    end: int
    attempt: int
    messages: tuple[DeliveredMessage, ...]
    lease_expires_at: datetime


def clock(d: Driver, cursor: Any, now: datetime | None) -> datetime:
    """``now``, or the database's clock where the driver has one (leases compared across hosts)."""
    return now if now is not None else d.clock(cursor)


def topic_event(
    d: Driver, cursor: Any, kind: str, topic: str, group: str, data: dict[str, Any], now: datetime | None
) -> None:
    """One bus-mode event (docs/reference/events.md) in the caller's transaction: the topic in
    ``queue``, no job id, the group in ``data``. Written only on the operator's and the failure
    paths (retried, blocked, dead-lettered, expired, seeked...), never per delivered message."""
    write_events(cursor, d, [(topic, None, kind, {"group": group, **data})], now)


def _first_line(error: str) -> str:
    """What an event says of a stored error: its last line, or for an encrypted one the
    exception's name and ``encrypted (not shown)``."""
    lines = [line for line in shown_text(error).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:200]


#: What is stored of a failure's message when the topic encrypts and no key is usable here.
NOT_STORED = (
    'its message was not stored: the topic is encrypted and DJANGO_JOBS["ENCRYPTION_KEYS"] has no usable key in '
    "this worker"
)


def stored_failure(error: str, traceback: str, *, encrypt: bool) -> tuple[str, str]:
    """A failure's error line and traceback as stored. In clear unless ``encrypt``: then both
    encrypted (``spec.encryption.encrypt_text``; the exception's name at the start of the error
    stays readable), as a handler's message may quote the payload. Without a usable key in this
    process neither is stored (:data:`NOT_STORED` after the exception's name): never in clear."""
    if not encrypt or is_encrypted_text(error):
        return error, traceback
    label = error_label(error)
    try:
        # Cut in clear: a cursor keeps 10,000 characters of its last error, and an encrypted one
        # cut there would decrypt no more (7,000 bytes of UTF-8 encrypt to about 9,500 characters).
        # ("replace": a lone surrogate in an exception's message cannot be encrypted as UTF-8.)
        cut = error.encode("utf-8", "replace")[:7_000].decode("utf-8", "ignore")
        whole = traceback.encode("utf-8", "replace").decode("utf-8")
        return encrypt_text(cut, label), encrypt_text(whole) if traceback else ""
    except JobsConfigurationError:  # no key, no cryptography, bad keys
        return (f"{label}: " if label else "") + NOT_STORED, ""


def batch_encrypted(batch: Batch, *, using: str) -> bool:
    """What a failure of ``batch`` is stored as: encrypted when its topic encrypts now, or when one of
    its messages is (a message says itself whether it is; the topic's setting may have changed)."""
    return any(is_encrypted(m.payload) for m in batch.messages) or topic_config(batch.topic, using=using).encrypt


# -- groups ----------------------------------------------------------------------------------------------


def ensure_group(topic: str, group: str, *, start_from: Any = "new", using: str, now: datetime | None = None) -> bool:
    """Register ``group`` on ``topic`` (once; True when this call created it) and give it a
    cursor in every partition that has none: at the partition's end (``"new"``), its start
    (``"beginning"``) or before its first message published at or after a datetime. A cursor
    made later, for a partition the group never saw, starts at the partition's start."""
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        now = clock(d, cursor, now)
        groups = ConsumerGroup.objects.using(using)
        created = not groups.filter(topic=topic, name=group).exists()
        if created:
            groups.bulk_create([ConsumerGroup(topic=topic, name=group, created_at=now)], ignore_conflicts=True)
        ensure_cursors(topic, group, start_from=start_from if created else "beginning", using=using, now=now)
    return created


def ensure_cursors(topic: str, group: str, *, start_from: Any = "beginning", using: str, now: datetime) -> int:
    """Cursors for the partitions of ``topic`` where ``group`` has none (see :func:`ensure_group`)."""
    have = GroupCursor.objects.using(using).filter(topic=topic, group_name=group).values("partition_id")
    missing = list(
        TopicPartition.objects.using(using).filter(topic=topic).exclude(id__in=have).values_list("id", "last_position")
    )
    if not missing:
        return 0
    cursors = []
    for pid, last in missing:
        cursors.append(
            GroupCursor(
                partition_id=pid,
                topic=topic,
                group_name=group,
                position=start_position(pid, last, start_from, using=using),
                leased_at=now,
            )
        )
    return len(GroupCursor.objects.using(using).bulk_create(cursors, ignore_conflicts=True))


def start_position(partition_id: int, last: int, at: Any, *, using: str) -> int:
    """The cursor that starts a partition at ``at``: "beginning", "end"/"new" or a datetime
    (before the partition's first message published at or after it)."""
    if at == "beginning":
        return 0
    if at in ("new", "end"):
        return last
    first = (
        Message.objects.using(using)
        .filter(partition_id=partition_id, created_at__gte=at)
        .order_by("position")
        .values_list("position", flat=True)
        .first()
    )
    return last if first is None else first - 1


# -- consume ----------------------------------------------------------------------------------------------


def acquire_batch(
    topic: str,
    group: str,
    *,
    batch_size: int,
    worker_id: str,
    using: str,
    config: TopicConfig | None = None,
    now: datetime | None = None,
) -> Batch | None:
    """Lease the partition of ``group`` that has waited longest for its turn and return its
    next messages (at most ``batch_size``, in order), or None when no partition is ready (or the
    group is paused). A partition is ready when it has messages past the group's cursor, no live
    lease (an expired one is taken over: that is how a dead worker's batch is delivered again),
    no pending retry, is not blocked, and its newest message is older than the window buffer.

    ``Batch.attempt`` counts the failed attempts and the expired leases of this batch, plus one:
    a handler whose batch has ``attempt > max_attempts`` gives it up without running it.

    Messages older than the topic's max wait at the head are skipped (the cursor passes them,
    counted in ``expired_count``); the batch stops before the first message not yet available
    (a delay), and the partition then waits until it is."""
    config = config or topic_config(topic, using=using)
    d = driver(using)
    started = time.monotonic()
    batch = _acquire(d, topic, group, batch_size=batch_size, worker_id=worker_id, using=using, config=config, now=now)
    took = time.monotonic() - started
    if batch is None or took < config.lease_seconds * RENEW_AFTER:
        return batch
    # The lease was reckoned from the clock read at the take's start, and the take then lasted a
    # good part of it (a slow database, a loaded or paused process), perhaps all of it: renew it
    # before the batch is handed out, as the worker's renewer would. The renewal is guarded on
    # the token, so a lease that ran out and was taken over meanwhile is found out, and the batch
    # is given up unrun rather than run by two workers at once.
    expires = renew_batch_lease(batch, lease_seconds=config.lease_seconds, using=using, now=now)
    if expires is None:
        logger.warning(
            "Topic %s group %s: taking partition %s's batch took %.1fs of its %gs lease, which ran out: another "
            "worker has it; given up unrun.",
            topic, group, batch.partition, took, config.lease_seconds,
        )  # fmt: skip
        return None
    return replace(batch, lease_expires_at=expires)


#: A lease is renewed once this share of it has run: by the worker's renewer while the handler
#: runs, and by acquire_batch when the take itself lasted that long.
RENEW_AFTER = 1 / 3


def _acquire(
    d: Driver,
    topic: str,
    group: str,
    *,
    batch_size: int,
    worker_id: str,
    using: str,
    config: TopicConfig,
    now: datetime | None,
) -> Batch | None:
    with transaction.atomic(using=using), d.cursor() as cursor:
        now = clock(d, cursor, now)
        newest_before = now - timedelta(seconds=config.window_buffer_seconds or 0.0)
        candidates = d.free_partitions(
            cursor, topic=topic, group=group, now=now, newest_before=newest_before, limit=ACQUIRE_CANDIDATES
        )
        for cursor_id in candidates:
            batch = _take(
                d, cursor, cursor_id, batch_size=batch_size, worker_id=worker_id, config=config, now=now, using=using
            )
            if batch is not None:
                return batch
    return None


def _take(
    d: Driver,
    db_cursor: Any,
    cursor_id: int,
    *,
    batch_size: int,
    worker_id: str,
    config: TopicConfig,
    now: datetime,
    using: str,
) -> Batch | None:
    token = uuid.uuid4()
    expires = now + timedelta(seconds=config.lease_seconds)
    cursors = GroupCursor.objects.using(using)
    # Guarded on what made the row free: another taker (or an operator) may have changed it.
    free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now)
    won = cursors.filter(free, id=cursor_id, blocked=False).update(
        # Taking over a lease that expired counts an attempt: its worker died (or stalled) with
        # the batch, and a batch that kills every worker must end in the dead letters. First
        # in the SET: MariaDB/MySQL assign left to right, and this reads the old token.
        attempts=models.Case(
            models.When(lease_token__isnull=False, then=models.F("attempts") + 1),
            default=models.F("attempts"),
            output_field=models.PositiveIntegerField(),
        ),
        lease_token=token,
        lease_expires_at=expires,
        leased_by=worker_id[:200],
        leased_at=now,
    )
    if not won:
        return None
    row = cursors.select_related("partition").get(id=cursor_id)
    messages = list(
        Message.objects.using(using)
        .filter(partition_id=row.partition_id, position__gt=row.position)
        .order_by("position")[:batch_size]
    )
    start = row.position
    if config.max_wait_seconds is not None:
        oldest = now - timedelta(seconds=config.max_wait_seconds)
        expired = 0
        while expired < len(messages) and messages[expired].created_at <= oldest:
            expired += 1
        if expired:
            start = messages[expired - 1].position
            cursors.filter(id=cursor_id, lease_token=token).update(
                position=start, expired_count=models.F("expired_count") + expired, attempts=0
            )
            logger.info("Topic %s group %s: %d expired message(s) skipped.", row.topic, row.group_name, expired)
            data = {"partition": row.partition.name, "positions": [row.position + 1, start], "count": expired}
            topic_event(d, db_cursor, "message-expired", row.topic, row.group_name, data, now)
            messages = messages[expired:]
    ready = []
    for m in messages:
        if m.available_at > now:
            break
        ready.append(m)
    if not ready:
        # Nothing to hand out now: free the partition, until its head is due if it is delayed.
        retry_at = messages[0].available_at if messages else None
        cursors.filter(id=cursor_id, lease_token=token).update(
            lease_token=None, lease_expires_at=None, retry_at=retry_at
        )
        return None
    name = row.partition.name
    return Batch(
        topic=row.topic,
        group=row.group_name,
        cursor_id=cursor_id,
        partition=name,
        token=token,
        start=start,
        end=ready[-1].position,
        attempt=row.attempts + 1,
        messages=tuple(
            DeliveredMessage(m.id, m.topic, name, m.position, m.payload, m.transaction_id, m.trace_id, m.created_at)
            for m in ready
        ),
        lease_expires_at=expires,
    )


def _held(batch: Batch, *, using: str) -> Any:
    """The batch's cursor row, if its lease is still the batch's."""
    return GroupCursor.objects.using(using).filter(id=batch.cursor_id, lease_token=batch.token, position=batch.start)


def ack_batch(batch: Batch, *, using: str) -> bool:
    """Move the group's cursor past ``batch`` and free the partition, counting its messages in
    the cursor's ``acked_count``; False (nothing changed) when the lease is no longer the
    batch's: a late acknowledgement is refused. Inside the handler's transaction
    (``atomic=True``) it commits with the handler's writes."""
    done = _held(batch, using=using).update(
        position=batch.end,
        lease_token=None,
        lease_expires_at=None,
        attempts=0,
        retry_at=None,
        last_error="",
        # The group's running total, in the statement that moves the cursor anyway: counting
        # adds no statement and no row shared by the group's workers (a per-minute counter row
        # would serialise every acknowledgement of the group on it).
        acked_count=models.F("acked_count") + len(batch.messages),
    )
    if not done:
        logger.warning(
            "Topic %s group %s partition %r: the lease of positions %d-%d was lost; the acknowledgement was "
            "refused (another worker has the batch).",
            batch.topic,
            batch.group,
            batch.partition,
            batch.start + 1,
            batch.end,
        )
    return bool(done)


def renew_batch_lease(
    batch: Batch, *, lease_seconds: float, using: str, now: datetime | None = None
) -> datetime | None:
    """Extend a held batch's lease to ``lease_seconds`` from now: the new expiry, or None when
    the lease is no longer the batch's (it was taken over, or an operator moved the cursor)."""
    d = driver(using)
    with d.cursor() as cursor:
        now = clock(d, cursor, now)
    expires = now + timedelta(seconds=lease_seconds)
    return expires if _held(batch, using=using).update(lease_expires_at=expires) else None


def release_batch(batch: Batch, *, using: str) -> bool:
    """Give a batch back unprocessed (shutdown): the partition is free at once, no attempt counted."""
    return bool(_held(batch, using=using).update(lease_token=None, lease_expires_at=None))


def fail_batch(
    batch: Batch,
    *,
    error: str,
    traceback: str = "",
    max_attempts: int,
    backoff: Any = "exponential",
    on_failure: str = "dead_letter",
    confidential: bool = True,
    using: str,
    now: datetime | None = None,
) -> str:
    """Record a failed attempt at ``batch``. Attempts left: the partition waits out the backoff
    and the same batch is delivered again (``"retry"``). None left: with ``on_failure="block"``
    the partition stops until an operator retries or skips it (``"blocked"``); otherwise its
    messages go to the group's dead letters and the cursor moves past them, counted in its
    ``dead_lettered_count`` (``"dead"``).
    ``"lost"``: the lease was no longer the batch's; nothing changed.

    ``error`` (one line, ``"ValueError: message"``) and ``traceback`` are stored encrypted when
    the batch is (:func:`batch_encrypted`, :func:`stored_failure`), and the events name the
    exception only; ``confidential=False`` for the worker's own words, which quote no payload
    (a stalled batch, a payload no key decrypts): stored in clear, so they say what to fix."""
    settings = get_settings()
    if confidential:
        error, traceback = stored_failure(error, traceback, encrypt=batch_encrypted(batch, using=using))
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        now = clock(d, cursor, now)
        held = _held(batch, using=using)
        free = {"lease_token": None, "lease_expires_at": None, "last_error": error[:10_000]}
        data = {
            "partition": batch.partition,
            "positions": [batch.start + 1, batch.end],
            "attempt": batch.attempt,
            "error": _first_line(error),
        }
        if batch.attempt < max_attempts:
            wait = compute_backoff(backoff, batch.attempt, base=settings.BACKOFF_BASE, cap=settings.BACKOFF_CAP)
            done = held.update(attempts=batch.attempt, retry_at=now + timedelta(seconds=wait), **free)
            if done:
                topic_event(d, cursor, "message-retried", batch.topic, batch.group, data, now)
            return "retry" if done else "lost"
        if on_failure == "block":
            done = held.update(attempts=batch.attempt, blocked=True, **free)
            if done:
                topic_event(d, cursor, "message-blocked", batch.topic, batch.group, data, now)
            return "blocked" if done else "lost"
        done = held.update(
            position=batch.end,
            attempts=0,
            retry_at=None,
            dead_lettered_count=models.F("dead_lettered_count") + len(batch.messages),
            **free,
        )
        if not done:
            return "lost"
        dead_letter(
            batch.group, batch.messages, error=error, traceback=traceback, attempts=batch.attempt, now=now, using=using
        )
        data["messages"] = [m.id for m in batch.messages]
        topic_event(d, cursor, "dead-lettered", batch.topic, batch.group, data, now)
        return "dead"


def dead_letter(
    group: str,
    messages: tuple[DeliveredMessage, ...] | list[DeliveredMessage],
    *,
    error: str,
    traceback: str,
    attempts: int,
    now: datetime,
    using: str,
) -> None:
    DeadLetter.objects.using(using).bulk_create(
        [
            DeadLetter(
                topic=m.topic,
                group_name=group,
                partition_name=m.partition,
                message_id=m.id,
                position=m.position,
                payload=m.payload,
                transaction_id=m.transaction_id,
                trace_id=m.trace_id,
                published_at=m.created_at,
                error=error,
                traceback=traceback,
                attempts=attempts,
                created_at=now,
            )
            for m in messages
        ]
    )


__all__ = [
    "RENEW_AFTER",
    "Batch",
    "DeliveredMessage",
    "TopicConfig",
    "NOT_STORED",
    "ack_batch",
    "acquire_batch",
    "batch_encrypted",
    "clock",
    "dead_letter",
    "ensure_cursors",
    "ensure_group",
    "fail_batch",
    "release_batch",
    "renew_batch_lease",
    "start_position",
    "stored_failure",
    "topic_config",
    "topic_event",
]

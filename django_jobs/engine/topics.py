"""Bus mode's verbs on the message path: publish, register a group, take a partition's next
batch under a lease, acknowledge it, fail it. The operator's verbs (seek, pause, lag, dead
letters, retention) are in :mod:`.topic_control`.

The design (queen's ``partition_leases``, docs/explanation/bus-mode.md): a message is one row;
a group's progress in a partition is one :class:`~django_jobs.models.GroupCursor` row holding
the last position it consumed and the lease of the batch it is processing. Every change of a
cursor by a consumer is guarded on its lease token (and the position the batch started from),
so a worker that lost its lease (it expired and another worker took the partition, or an
operator moved the cursor) changes nothing: its acknowledgement is refused.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, models, transaction
from django.db.models import Q

from ..conf import get_settings
from ..drivers import Driver, driver
from ..exceptions import TopicFull
from ..models import ConsumerGroup, DeadLetter, GroupCursor, Message, Topic, TopicPartition
from ..spec.backoff import compute_backoff
from ..spec.topics import DEFAULT_LEASE_SECONDS, NewMessage, validate_topic_declarations
from ..spec.tracing import trace_id_for_new_job
from .common import logger
from .effects import notify

#: The NOTIFY payload that wakes a topic's consumers (PostgreSQL).
TOPIC_NOTIFY_PREFIX = "topic:"
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


_CONFIG_FIELDS = (
    "max_size",
    "lease_seconds",
    "delay_seconds",
    "max_wait_seconds",
    "window_buffer_seconds",
    "retention_seconds",
    "max_age_seconds",
)


def topic_config(name: str, *, using: str) -> TopicConfig:
    declared = validate_topic_declarations(get_settings().TOPICS or {}).get(name, {})
    row = Topic.objects.using(using).filter(name=name).values(*_CONFIG_FIELDS).first() or {}
    values = {f: row.get(f) if row.get(f) is not None else declared.get(f) for f in _CONFIG_FIELDS}
    if values["lease_seconds"] is None:
        values["lease_seconds"] = DEFAULT_LEASE_SECONDS
    return TopicConfig(name=name, **values)


@dataclass(frozen=True, slots=True)
class Published:
    """What publishing one message gave: the message's id and place; ``duplicate`` when its
    transaction_id was published before (the values are then the first message's)."""

    id: int
    topic: str
    partition: str
    position: int
    transaction_id: str | None
    trace_id: str
    duplicate: bool = False


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


# -- publish ------------------------------------------------------------------------------------------


def publish_messages(
    topic: str, messages: list[NewMessage], *, using: str, now: datetime | None = None
) -> list[Published]:
    """Publish ``messages`` (validated by ``spec.topics.new_message``) in the caller's
    transaction (a transaction of their own otherwise), in order: within a partition they take
    consecutive positions. A message whose transaction_id the topic already has is not stored
    again: its result is the first message's, with ``duplicate=True``. Raises TopicFull (nothing
    published) when the topic's max size would be passed. Wakes the topic's consumers on commit
    (PostgreSQL)."""
    if not messages:
        return []
    config = topic_config(topic, using=using)
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        for _ in range(3):
            known = _known_transactions(topic, messages, using=using)
            fresh = _fresh(messages, known)
            if config.max_size is not None and fresh:
                _admit(d, cursor, config, len(fresh), using=using)
            if not any(m.transaction_id for m in fresh):
                stored = _store(d, cursor, topic, fresh, config, now, using=using)
                break
            try:
                # A concurrent publisher may commit the same transaction_id first: the unique
                # constraint refuses ours, and the next round finds theirs.
                with transaction.atomic(using=using):
                    stored = _store(d, cursor, topic, fresh, config, now, using=using)
                break
            except IntegrityError:
                continue
        else:  # pragma: no cover - three races lost in a row
            raise IntegrityError(f"publishing to topic {topic!r} kept conflicting on transaction ids")
        if stored:
            notify(using, [TOPIC_NOTIFY_PREFIX + topic])
    out: list[Published] = []
    by_txn: dict[str, Published] = {}
    stored_iter = iter(stored)
    for m in messages:
        if m.transaction_id is not None and m.transaction_id in known:
            first = known[m.transaction_id]
            out.append(_replace_dup(first))
            continue
        if m.transaction_id is not None and m.transaction_id in by_txn:
            out.append(_replace_dup(by_txn[m.transaction_id]))
            continue
        p = next(stored_iter)
        if m.transaction_id is not None:
            by_txn[m.transaction_id] = p
        out.append(p)
    return out


def _replace_dup(p: Published) -> Published:
    return Published(p.id, p.topic, p.partition, p.position, p.transaction_id, p.trace_id, duplicate=True)


def _known_transactions(topic: str, messages: list[NewMessage], *, using: str) -> dict[str, Published]:
    ids = sorted({m.transaction_id for m in messages if m.transaction_id is not None})
    if not ids:
        return {}
    rows = (
        Message.objects.using(using)
        .filter(topic=topic, transaction_id__in=ids)
        .values_list("id", "partition__name", "position", "transaction_id", "trace_id")
    )
    return {txn: Published(mid, topic, part, pos, txn, trace) for mid, part, pos, txn, trace in rows}


def _fresh(messages: list[NewMessage], known: dict[str, Published]) -> list[NewMessage]:
    """The messages to store: not published before, and each transaction_id once."""
    seen: set[str] = set()
    fresh = []
    for m in messages:
        if m.transaction_id is not None:
            if m.transaction_id in known or m.transaction_id in seen:
                continue
            seen.add(m.transaction_id)
        fresh.append(m)
    return fresh


def topic_size(d: Driver, cursor: Any, topic: str, *, using: str) -> int:
    """The size max_size bounds: the largest backlog of any of the topic's groups (messages
    published and not yet consumed by it); with no group yet, the messages stored."""
    backlogs = d.group_backlogs(cursor, topic=topic)
    if backlogs:
        return max(backlogs.values())
    return Message.objects.using(using).filter(topic=topic).count()


def _admit(d: Driver, cursor: Any, config: TopicConfig, adding: int, *, using: str) -> None:
    """Raise TopicFull unless ``adding`` more messages keep the topic within its max size. The
    topic's row is locked (SQLite: the write lock) so that concurrent publishers count in turn."""
    Topic.objects.using(using).bulk_create([Topic(name=config.name)], ignore_conflicts=True)
    list(Topic.objects.using(using).select_for_update().filter(name=config.name).values_list("name"))
    size = topic_size(d, cursor, config.name, using=using)
    assert config.max_size is not None
    if size + adding > config.max_size:
        raise TopicFull(topic=config.name, size=size, limit=config.max_size, adding=adding)


def _store(
    d: Driver,
    cursor: Any,
    topic: str,
    fresh: list[NewMessage],
    config: TopicConfig,
    now: datetime | None,
    *,
    using: str,
) -> list[Published]:
    by_partition: dict[str, list[int]] = {}
    for i, m in enumerate(fresh):
        by_partition.setdefault(m.partition, []).append(i)
    rows: list[Message | None] = [None] * len(fresh)
    # Partitions in a fixed order, so two transactions publishing to the same two partitions
    # lock their counters in the same order (no deadlock).
    for name in sorted(by_partition):
        indexes = by_partition[name]
        partition_id, last, created, stamped = d.bump_partition(cursor, topic=topic, name=name, n=len(indexes), now=now)
        if created:
            _add_cursors(topic, partition_id, stamped, using=using)
        first = last - len(indexes) + 1
        for offset, i in enumerate(indexes):
            m = fresh[i]
            delay = m.delay if m.delay is not None else (config.delay_seconds or 0.0)
            rows[i] = Message(
                partition_id=partition_id,
                topic=topic,
                position=first + offset,
                payload=m.payload,
                transaction_id=m.transaction_id,
                trace_id=trace_id_for_new_job(m.trace_id),
                created_at=stamped,
                available_at=stamped + timedelta(seconds=delay),
            )
    objs = [r for r in rows if r is not None]
    Message.objects.using(using).bulk_create(objs, batch_size=500)
    if any(o.pk is None for o in objs):  # no RETURNING (MariaDB/MySQL): read the ids back
        ids = _ids_of(objs, using=using)
        for o in objs:
            o.pk = ids[(o.partition_id, o.position)]
    names = {i: m.partition for i, m in enumerate(fresh)}
    return [Published(o.pk, topic, names[i], o.position, o.transaction_id, o.trace_id) for i, o in enumerate(objs)]


def _ids_of(objs: list[Message], *, using: str) -> dict[tuple[int, int], int]:
    ranges: dict[int, list[int]] = {}
    for o in objs:
        ranges.setdefault(o.partition_id, []).append(o.position)
    found: dict[tuple[int, int], int] = {}
    for pid, positions in ranges.items():
        rows = (
            Message.objects.using(using)
            .filter(partition_id=pid, position__gte=min(positions), position__lte=max(positions))
            .values_list("position", "id")
        )
        found.update({(pid, pos): mid for pos, mid in rows})
    return found


def _add_cursors(topic: str, partition_id: int, now: datetime, *, using: str) -> None:
    """A cursor in a new partition for each group of the topic: a group started before the
    partition existed consumes it from its first message."""
    groups = list(ConsumerGroup.objects.using(using).filter(topic=topic).values_list("name", flat=True))
    GroupCursor.objects.using(using).bulk_create(
        [GroupCursor(partition_id=partition_id, topic=topic, group_name=g, position=0, leased_at=now) for g in groups],
        ignore_conflicts=True,
    )


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

    Messages older than the topic's max wait at the head are skipped (the cursor passes them,
    counted in ``expired_count``); the batch stops before the first message not yet available
    (a delay), and the partition then waits until it is."""
    config = config or topic_config(topic, using=using)
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        now = clock(d, cursor, now)
        newest_before = now - timedelta(seconds=config.window_buffer_seconds or 0.0)
        candidates = d.free_partitions(
            cursor, topic=topic, group=group, now=now, newest_before=newest_before, limit=ACQUIRE_CANDIDATES
        )
        for cursor_id in candidates:
            batch = _take(cursor_id, batch_size=batch_size, worker_id=worker_id, config=config, now=now, using=using)
            if batch is not None:
                return batch
    return None


def _take(
    cursor_id: int, *, batch_size: int, worker_id: str, config: TopicConfig, now: datetime, using: str
) -> Batch | None:
    token = uuid.uuid4()
    expires = now + timedelta(seconds=config.lease_seconds)
    cursors = GroupCursor.objects.using(using)
    # Guarded on what made the row free: another taker (or an operator) may have changed it.
    free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now)
    won = cursors.filter(free, id=cursor_id, blocked=False).update(
        lease_token=token, lease_expires_at=expires, leased_by=worker_id[:200], leased_at=now
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
    """Move the group's cursor past ``batch`` and free the partition; False (nothing changed)
    when the lease is no longer the batch's: a late acknowledgement is refused. Inside the
    handler's transaction (``atomic=True``) it commits with the handler's writes."""
    done = _held(batch, using=using).update(
        position=batch.end, lease_token=None, lease_expires_at=None, attempts=0, retry_at=None, last_error=""
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


def renew_batch_lease(batch: Batch, *, lease_seconds: float, using: str, now: datetime | None = None) -> bool:
    """Extend a held batch's lease; False when it is no longer the batch's."""
    d = driver(using)
    with d.cursor() as cursor:
        now = clock(d, cursor, now)
    return bool(_held(batch, using=using).update(lease_expires_at=now + timedelta(seconds=lease_seconds)))


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
    using: str,
    now: datetime | None = None,
) -> str:
    """Record a failed attempt at ``batch``. Attempts left: the partition waits out the backoff
    and the same batch is delivered again (``"retry"``). None left: with ``on_failure="block"``
    the partition stops until an operator retries or skips it (``"blocked"``); otherwise its
    messages go to the group's dead letters and the cursor moves past them (``"dead"``).
    ``"lost"``: the lease was no longer the batch's; nothing changed."""
    settings = get_settings()
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        now = clock(d, cursor, now)
        held = _held(batch, using=using)
        free = {"lease_token": None, "lease_expires_at": None, "last_error": error[:10_000]}
        if batch.attempt < max_attempts:
            wait = compute_backoff(backoff, batch.attempt, base=settings.BACKOFF_BASE, cap=settings.BACKOFF_CAP)
            done = held.update(attempts=batch.attempt, retry_at=now + timedelta(seconds=wait), **free)
            return "retry" if done else "lost"
        if on_failure == "block":
            done = held.update(attempts=batch.attempt, blocked=True, **free)
            return "blocked" if done else "lost"
        done = held.update(position=batch.end, attempts=0, retry_at=None, **free)
        if not done:
            return "lost"
        dead_letter(
            batch.group, batch.messages, error=error, traceback=traceback, attempts=batch.attempt, now=now, using=using
        )
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
    "TOPIC_NOTIFY_PREFIX",
    "Batch",
    "DeliveredMessage",
    "Published",
    "TopicConfig",
    "ack_batch",
    "acquire_batch",
    "clock",
    "dead_letter",
    "ensure_cursors",
    "ensure_group",
    "fail_batch",
    "publish_messages",
    "release_batch",
    "renew_batch_lease",
    "start_position",
    "topic_config",
    "topic_size",
]

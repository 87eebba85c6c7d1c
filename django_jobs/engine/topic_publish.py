"""Bus mode's publish: messages into a topic's partitions, in the caller's transaction.

Positions come from the partition's counter (``Driver.bump_partition``), whose row lock orders
a partition's publishers so that a group's cursor never passes a message committing later (see
docs/explanation/bus-mode.md). A repeated transaction id is refused by the unique constraint
``(topic, transaction_id)``, and the publish returns the first message. A topic whose config
says ``encrypt`` stores each payload as an envelope (``spec.encryption``), encrypted before the
transaction starts: without a key nothing is published.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from ..conf import get_settings
from ..drivers import Driver, driver
from ..exceptions import EncryptionKeysMissing, TopicFull
from ..models import ConsumerGroup, GroupCursor, Message, Topic
from ..spec.encryption import encrypt_json, require_keys
from ..spec.topics import NewMessage
from ..spec.tracing import trace_id_for_new_job
from .effects import notify
from .topics import TopicConfig, declared_topic, topic_config

#: The NOTIFY payload that wakes a topic's consumers (PostgreSQL).
TOPIC_NOTIFY_PREFIX = "topic:"


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


def publish_one(topic: str, message: NewMessage, *, using: str) -> Published:
    """Publish one message (validated by ``spec.topics.new_message``) in the caller's
    transaction: :func:`publish_messages` of one message, in one round trip where the driver
    has ``PUBLISH_ONE`` and nothing calls for more (no transaction_id to look up, no max_size
    or encrypt declared; a max_size or encrypt set on the topic's row at runtime is seen by the
    statement, which then writes nothing, and the general path admits or encrypts the message)."""
    d = driver(using)
    if d.PUBLISH_ONE and message.transaction_id is None:
        declared = declared_topic(topic)
        if declared.get("max_size") is None and not declared.get("encrypt"):
            trace_id = trace_id_for_new_job(message.trace_id)
            with d.cursor(hot=True) as cursor:
                stored = d.publish_one(
                    cursor,
                    topic=topic,
                    partition=message.partition,
                    payload_json=json.dumps(message.payload),
                    trace_id=trace_id,
                    delay=message.delay,
                    declared_delay=declared.get("delay_seconds"),
                    channel=get_settings().NOTIFY_CHANNEL,
                    wake=TOPIC_NOTIFY_PREFIX + topic,
                )
            if stored is not None:
                return Published(stored[0], topic, message.partition, stored[1], None, trace_id)
    return publish_messages(topic, [message], using=using)[0]


def publish_messages(
    topic: str, messages: list[NewMessage], *, using: str, now: datetime | None = None
) -> list[Published]:
    """Publish ``messages`` (validated by ``spec.topics.new_message``) in the caller's
    transaction (a transaction of their own otherwise), in order: within a partition they take
    consecutive positions. A message whose transaction_id the topic already has is not stored
    again: its result is the first message's, with ``duplicate=True``. Raises TopicFull (nothing
    published) when the topic's max size would be passed. Wakes the topic's consumers on commit
    (PostgreSQL). A topic with ``encrypt`` stores the payloads encrypted (validated and sized in
    clear before); it raises EncryptionKeysMissing (CryptographyMissing...) and publishes
    nothing when they cannot be encrypted."""
    if not messages:
        return []
    config = topic_config(topic, using=using)
    if config.encrypt:
        messages = _encrypted(topic, messages)
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


def _encrypted(topic: str, messages: list[NewMessage]) -> list[NewMessage]:
    """``messages`` with their payloads as envelopes, encrypted with the first key."""
    try:
        require_keys()
    except EncryptionKeysMissing:
        raise EncryptionKeysMissing(
            f'Topic {topic!r} is to store its messages encrypted (encrypt=True), but DJANGO_JOBS["ENCRYPTION_KEYS"] '
            "is empty; nothing was published. Add a key (see docs/howto/encryption.md)."
        ) from None
    return [replace(m, payload=encrypt_json(m.payload)) for m in messages]


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


__all__ = ["TOPIC_NOTIFY_PREFIX", "Published", "publish_messages", "publish_one", "topic_size"]

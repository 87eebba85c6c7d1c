"""Bus mode's operator verbs: configure a topic, pause and resume a group, move its cursors
(seek), read its lag, retry or skip a blocked partition, replay dead letters, and prune the
messages retention lets go. The message path is :mod:`.topics`.

Moving a cursor clears its lease: the worker holding the partition then has its
acknowledgement refused (its batch started at the old position), and the partition is handed
out again from the new one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import Min, Q

from ..drivers import driver
from ..exceptions import InvalidSeek, PartitionNotBlocked
from ..models import ConsumerGroup, DeadLetter, DeadLetterState, GroupCursor, Message, Topic, TopicPartition
from ..spec.encryption import is_encrypted
from .topics import (
    DeliveredMessage,
    clock,
    dead_letter,
    ensure_group,
    start_position,
    stored_failure,
    topic_config,
    topic_event,
)

#: What moving a cursor resets besides its position.
_RESET = {"lease_token": None, "lease_expires_at": None, "attempts": 0, "retry_at": None, "blocked": False}


def configure_topic(name: str, columns: dict[str, Any], *, using: str) -> None:
    """Write a topic's runtime settings (``spec.topics.topic_columns``; None: back to its declaration)."""
    Topic.objects.using(using).update_or_create(name=name, defaults=columns)


def set_group_paused(topic: str, group: str, paused: bool, *, using: str, now: datetime | None = None) -> None:
    """Pause or resume a group: a paused group is handed no partition (batches already out finish)."""
    ensure_group(topic, group, using=using, now=now)
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        ConsumerGroup.objects.using(using).filter(topic=topic, name=group).update(paused=paused)
        topic_event(d, cursor, "group-paused" if paused else "group-resumed", topic, group, {}, now)


def seek_group(topic: str, group: str, to: Any, *, using: str, now: datetime | None = None) -> int:
    """Move ``group``'s cursors: ``"beginning"`` (every message still stored is delivered
    again), ``"end"`` (skip everything published so far), an aware datetime (from the first
    message published at or after it, in each partition) or a message id (from that message,
    in its partition only). Returns the cursors moved."""
    if not (
        to in ("beginning", "end")
        or (isinstance(to, datetime) and to.tzinfo is not None)
        or (isinstance(to, int) and not isinstance(to, bool))
    ):
        raise InvalidSeek(f'seek() takes "beginning", "end", an aware datetime or a message id; got {to!r}.')
    ensure_group(topic, group, using=using, now=now)
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        moved = _move_cursors(topic, group, to, using=using)
        shown = to.isoformat() if isinstance(to, datetime) else to
        topic_event(d, cursor, "group-seeked", topic, group, {"to": shown, "moved": moved}, now)
    return moved


def _move_cursors(topic: str, group: str, to: Any, *, using: str) -> int:
    cursors = GroupCursor.objects.using(using).filter(topic=topic, group_name=group)
    if isinstance(to, int):
        message = Message.objects.using(using).filter(id=to, topic=topic).values("partition_id", "position").first()
        if message is None:
            raise InvalidSeek(f"Topic {topic!r} has no message {to} (it may have been deleted by retention).")
        return cursors.filter(partition_id=message["partition_id"]).update(position=message["position"] - 1, **_RESET)
    if to == "beginning":
        return cursors.update(position=0, **_RESET)
    last = TopicPartition.objects.filter(id=models.OuterRef("partition_id")).values("last_position")
    if to == "end":
        return cursors.update(position=models.Subquery(last), **_RESET)
    moved = 0
    for cursor_id, pid, last_position in cursors.values_list("id", "partition_id", "partition__last_position"):
        position = start_position(pid, last_position, to, using=using)
        moved += cursors.filter(id=cursor_id).update(position=position, **_RESET)
    return moved


@dataclass(frozen=True, slots=True)
class PartitionLag:
    partition: str
    lag: int
    position: int
    last_position: int
    leased: bool
    lease_expires_at: datetime | None
    blocked: bool
    attempts: int
    expired: int
    last_error: str


def group_lag(topic: str, group: str, *, using: str) -> list[PartitionLag]:
    """Per partition of ``group``: messages published and not yet consumed, and its lease."""
    rows = (
        GroupCursor.objects.using(using)
        .filter(topic=topic, group_name=group)
        .order_by("partition__name")
        .values_list(
            "partition__name",
            "position",
            "partition__last_position",
            "lease_token",
            "lease_expires_at",
            "blocked",
            "attempts",
            "expired_count",
            "last_error",
        )
    )
    return [
        PartitionLag(name, max(0, last - pos), pos, last, token is not None, exp, blocked, attempts, expired, err)
        for name, pos, last, token, exp, blocked, attempts, expired, err in rows
    ]


def retry_blocked(topic: str, group: str, partition: str, *, using: str) -> None:
    """Unblock a partition blocked by a failure: its batch is delivered again, attempts from zero."""
    done = (
        GroupCursor.objects.using(using)
        .filter(topic=topic, group_name=group, partition__name=partition, blocked=True)
        .update(blocked=False, attempts=0, retry_at=None)
    )
    if not done:
        raise PartitionNotBlocked(f"Partition {partition!r} of topic {topic!r} is not blocked for group {group!r}.")


def skip_blocked(
    topic: str, group: str, partition: str, *, using: str, now: datetime | None = None, error: str = ""
) -> int:
    """Unblock a partition by moving its head message to the group's dead letters (counted in the
    cursor's ``dead_lettered_count``); returns its id."""
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        now = clock(d, cursor, now)
        row = (
            GroupCursor.objects.using(using)
            .select_for_update()
            .filter(topic=topic, group_name=group, partition__name=partition, blocked=True)
            .values("id", "partition_id", "position", "attempts", "last_error")
            .first()
        )
        if row is None:
            raise PartitionNotBlocked(f"Partition {partition!r} of topic {topic!r} is not blocked for group {group!r}.")
        head = (
            Message.objects.using(using)
            .filter(partition_id=row["partition_id"], position__gt=row["position"])
            .order_by("position")
            .first()
        )
        update: dict[str, Any] = {"blocked": False, "attempts": 0, "retry_at": None, "last_error": ""}
        if head is not None:
            update["position"] = head.position
            update["dead_lettered_count"] = models.F("dead_lettered_count") + 1
            delivered = DeliveredMessage(
                head.id,
                topic,
                partition,
                head.position,
                head.payload,
                head.transaction_id,
                head.trace_id,
                head.created_at,
            )
            dead_letter(
                group,
                [delivered],
                error=error or row["last_error"],
                traceback="",
                attempts=row["attempts"],
                now=now,
                using=using,
            )
            data = {"partition": partition, "positions": [head.position, head.position], "messages": [head.id]}
            topic_event(d, cursor, "dead-lettered", topic, group, {**data, "skipped": True}, now)
        GroupCursor.objects.using(using).filter(id=row["id"], blocked=True).update(**update)
        return head.id if head is not None else 0


def replay_dead_letters(topic: str, group: str, ids: list[int] | None = None, *, using: str) -> int:
    """Ask the group's workers to run its dead letters again (``ids``, or all): each is handed
    to the subscriber once more, outside partition order; on success it is deleted, on failure it
    stays dead with the new error. Returns how many were queued."""
    letters = DeadLetter.objects.using(using).filter(topic=topic, group_name=group, state=DeadLetterState.DEAD)
    if ids is not None:
        letters = letters.filter(id__in=list(ids))
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        queued = letters.update(state=DeadLetterState.REPLAY, lease_token=None, lease_expires_at=None)
        if queued:
            topic_event(d, cursor, "replay-requested", topic, group, {"count": queued}, None)
    return queued


def delete_dead_letters(topic: str, group: str, ids: list[int] | None = None, *, using: str) -> int:
    letters = DeadLetter.objects.using(using).filter(topic=topic, group_name=group)
    if ids is not None:
        letters = letters.filter(id__in=list(ids))
    return letters.delete()[0]


@dataclass(frozen=True, slots=True)
class Replay:
    """A dead letter handed to a worker to run again."""

    id: int
    token: uuid.UUID
    message: DeliveredMessage
    attempts: int


def claim_replay(
    topic: str, group: str, *, lease_seconds: float, using: str, now: datetime | None = None
) -> Replay | None:
    """Take one dead letter queued for replay (or whose replaying worker's lease ran out)."""
    d = driver(using)
    with transaction.atomic(using=using), d.cursor() as cursor:
        now = clock(d, cursor, now)
        ready = Q(state=DeadLetterState.REPLAY) | Q(state=DeadLetterState.REPLAYING, lease_expires_at__lte=now)
        letters = DeadLetter.objects.using(using).filter(ready, topic=topic, group_name=group)
        for letter in letters.order_by("id")[:4]:
            token = uuid.uuid4()
            won = letters.filter(id=letter.id).update(
                state=DeadLetterState.REPLAYING,
                lease_token=token,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
            )
            if won:
                message = DeliveredMessage(
                    letter.message_id,
                    topic,
                    letter.partition_name,
                    letter.position,
                    letter.payload,
                    letter.transaction_id,
                    letter.trace_id,
                    letter.published_at,
                )
                return Replay(letter.id, token, message, letter.attempts)
    return None


def settle_replay(
    replay: Replay, *, error: str | None, traceback: str = "", confidential: bool = True, using: str
) -> bool:
    """A replay's outcome: success deletes the dead letter, failure makes it dead again with the
    new error, stored encrypted when the message is or its topic encrypts (as ``fail_batch``
    stores a failure, ``confidential`` included). False when the replay's lease was lost."""
    held = DeadLetter.objects.using(using).filter(
        id=replay.id, state=DeadLetterState.REPLAYING, lease_token=replay.token
    )
    if error is None:
        return bool(held.delete()[0])
    if confidential:
        m = replay.message
        encrypt = is_encrypted(m.payload) or topic_config(m.topic, using=using).encrypt
        error, traceback = stored_failure(error, traceback, encrypt=encrypt)
    return bool(
        held.update(
            state=DeadLetterState.DEAD,
            lease_token=None,
            lease_expires_at=None,
            error=error,
            traceback=traceback,
            attempts=models.F("attempts") + 1,
        )
    )


def prune_messages(topic: str, *, using: str, now: datetime | None = None) -> int:
    """Delete the messages of ``topic`` that retention lets go: older than ``retention`` and
    consumed by every group (a topic without groups: older than ``retention``), and older than
    ``max_age`` in any case. Returns how many were deleted."""
    config = topic_config(topic, using=using)
    if config.retention_seconds is None and config.max_age_seconds is None:
        return 0
    d = driver(using)
    with d.cursor() as cursor:
        now = clock(d, cursor, now)
    messages = Message.objects.using(using)
    deleted = 0
    partitions = TopicPartition.objects.using(using).filter(topic=topic).values_list("id", flat=True)
    consumed = dict(
        GroupCursor.objects.using(using)
        .filter(topic=topic)
        .values("partition_id")
        .annotate(upto=Min("position"))
        .values_list("partition_id", "upto")
    )
    has_groups = ConsumerGroup.objects.using(using).filter(topic=topic).exists()
    for pid in partitions:
        if config.max_age_seconds is not None:
            cutoff = now - timedelta(seconds=config.max_age_seconds)
            deleted += messages.filter(partition_id=pid, created_at__lt=cutoff).delete()[0]
        if config.retention_seconds is not None:
            cutoff = now - timedelta(seconds=config.retention_seconds)
            old = messages.filter(partition_id=pid, created_at__lt=cutoff)
            if has_groups:
                old = old.filter(position__lte=consumed.get(pid, 0))
            deleted += old.delete()[0]
    return deleted


__all__ = [
    "PartitionLag",
    "Replay",
    "claim_replay",
    "configure_topic",
    "delete_dead_letters",
    "group_lag",
    "prune_messages",
    "replay_dead_letters",
    "retry_blocked",
    "seek_group",
    "set_group_paused",
    "settle_replay",
    "skip_blocked",
]

"""What the console shows of bus mode (topics, consumer groups, dead letters): read-only views
shared by the admin's topic pages and ``manage.py jobs topics|lag|dead-letters``.

Every figure is read from small tables: a topic's partitions (their position counters say how
many messages each received), the groups' cursors (one per partition and group: the lag is the
partition's last position less the cursor's), the groups and their dead letters. No query counts
the message table. Changes (pause, seek, retry, replay...) go through
:mod:`django_jobs.topics` and :mod:`django_jobs.engine.topic_control`, never through here.

Encrypted content is never shown, neither in clear nor as ciphertext: an encrypted payload is
:data:`ENCRYPTED_SHOWN` (:func:`shown_payload`), an encrypted error or traceback the exception's
name and the same words (:func:`shown_error`). No key is needed to show them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Max, Q, Sum
from django.utils import timezone

from .conf import get_settings
from .engine.topics import TopicConfig, topic_config
from .models import ConsumerGroup, DeadLetter, DeadLetterState, GroupCursor, Topic, TopicPartition
from .spec.encryption import SHOWN, is_encrypted, shown_text
from .spec.topics import validate_topic_declarations

__all__ = [
    "ENCRYPTED_SHOWN",
    "GroupDetail",
    "GroupRow",
    "PartitionRow",
    "TopicDetail",
    "TopicRow",
    "dead_letters",
    "group_detail",
    "is_encrypted",
    "shown_error",
    "shown_payload",
    "topic_detail",
    "topic_overview",
]

#: What the admin and the command show where a payload (or an error's message) is encrypted.
ENCRYPTED_SHOWN = SHOWN
#: Characters of a payload's JSON shown in a list before it is cut ("…").
PAYLOAD_SHOWN = 200


def shown_payload(value: Any, limit: int | None = PAYLOAD_SHOWN) -> str:
    """A payload as the console shows it: compact JSON cut to ``limit`` characters (None: whole),
    or :data:`ENCRYPTED_SHOWN` for an encrypted one, whose content is never shown. Not escaped:
    the templates escape it, a terminal shows it as it is."""
    if is_encrypted(value):
        return ENCRYPTED_SHOWN
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    if limit is not None and len(text) > limit:
        return text[: limit - 1] + "…"
    return text


def shown_error(value: str) -> str:
    """An error or traceback as the console shows it: as stored, or for an encrypted one the
    exception's name and :data:`ENCRYPTED_SHOWN` (``ValueError: encrypted (not shown)``)."""
    return shown_text(value)


@dataclass(frozen=True)
class GroupRow:
    """A consumer group of a topic: its lag over every partition and what holds it up."""

    topic: str
    name: str
    paused: bool = False
    #: Messages published and not yet consumed by the group, over every partition.
    lag: int = 0
    partitions: int = 0
    #: Partitions whose batch is leased to a worker now (the lease may have expired).
    leased: int = 0
    #: Partitions stopped by ``on_failure="block"`` until an operator acts.
    blocked: int = 0
    #: Dead letters per state (``dead``, ``replay``, ``replaying``).
    dead_letters: dict[str, int] = field(default_factory=dict)

    @property
    def dead(self) -> int:
        return sum(self.dead_letters.values())


@dataclass(frozen=True)
class TopicRow:
    """One topic of the overview."""

    name: str
    partitions: int = 0
    #: Messages published to it, over every partition (retention may have deleted some since).
    published: int = 0
    newest_at: datetime | None = None
    groups: list[GroupRow] = field(default_factory=list)
    #: It has a Topic row: runtime settings set in the admin or with ``configure()``.
    configured: bool = False
    #: Its messages are published encrypted (its ``encrypt`` setting in effect).
    encrypted: bool = False

    @property
    def lag(self) -> int:
        return sum(g.lag for g in self.groups)


@dataclass(frozen=True)
class TopicDetail:
    row: TopicRow
    config: TopicConfig


@dataclass(frozen=True)
class PartitionRow:
    """A group's cursor in one partition and the lease of the batch being processed there."""

    partition: str
    position: int
    last_position: int
    leased_by: str
    lease_expires_at: datetime | None
    leased: bool
    blocked: bool
    attempts: int
    retry_at: datetime | None
    expired: int
    #: As :func:`shown_error` shows it (never an encrypted error's message).
    last_error: str

    @property
    def lag(self) -> int:
        return max(0, self.last_position - self.position)

    def lease_expired(self, now: datetime) -> bool:
        return self.leased and self.lease_expires_at is not None and self.lease_expires_at <= now


@dataclass(frozen=True)
class GroupDetail:
    row: GroupRow
    created_at: datetime | None
    partitions: list[PartitionRow]
    now: datetime
    #: The topic publishes its messages encrypted now (older ones may be in clear, and the reverse).
    encrypted: bool = False


def _known_topics(using: str) -> list[str]:
    """Topics with a partition (something was published), a group, a Topic row or a declaration."""
    names = set(TopicPartition.objects.using(using).values_list("topic", flat=True).distinct())
    names |= set(ConsumerGroup.objects.using(using).values_list("topic", flat=True).distinct())
    names |= set(Topic.objects.using(using).values_list("name", flat=True))
    names |= set((get_settings().TOPICS or {}).keys())
    return sorted(names)


def _groups(using: str, topic: str | None = None) -> dict[str, list[GroupRow]]:
    """``{topic: [GroupRow]}`` in three grouped queries (cursors, groups, dead letters)."""
    cursors = GroupCursor.objects.using(using)
    groups = ConsumerGroup.objects.using(using)
    letters = DeadLetter.objects.using(using)
    if topic is not None:
        cursors, groups, letters = cursors.filter(topic=topic), groups.filter(topic=topic), letters.filter(topic=topic)
    per_cursor = {
        (r["topic"], r["group_name"]): r
        for r in cursors.values("topic", "group_name")
        .annotate(
            lag=Sum(F("partition__last_position") - F("position")),
            partitions=Count("id"),
            leased=Count("id", filter=Q(lease_token__isnull=False)),
            blocked=Count("id", filter=Q(blocked=True)),
        )
        .order_by()
    }
    dead: dict[tuple[str, str], dict[str, int]] = {}
    for t, g, state, n in letters.values_list("topic", "group_name", "state").annotate(n=Count("id")).order_by():
        dead.setdefault((t, g), {})[state] = n
    out: dict[str, list[GroupRow]] = {}
    for t, name, paused in groups.order_by("topic", "name").values_list("topic", "name", "paused"):
        c = per_cursor.get((t, name), {})
        out.setdefault(t, []).append(
            GroupRow(
                topic=t,
                name=name,
                paused=paused,
                lag=int(c.get("lag") or 0),
                partitions=c.get("partitions", 0),
                leased=c.get("leased", 0),
                blocked=c.get("blocked", 0),
                dead_letters=dead.get((t, name), {}),
            )
        )
    return out


def _partitions(using: str, topic: str | None = None) -> dict[str, dict[str, Any]]:
    rows = TopicPartition.objects.using(using)
    if topic is not None:
        rows = rows.filter(topic=topic)
    return {
        r["topic"]: r
        for r in rows.values("topic")
        .annotate(partitions=Count("id"), published=Sum("last_position"), newest_at=Max("newest_at"))
        .order_by()
    }


def topic_overview(*, using: str) -> list[TopicRow]:
    """Every topic (published to, with a group, a Topic row or declared in ``DJANGO_JOBS["TOPICS"]``),
    by name, with its groups and their lag: five grouped queries whatever the number of messages."""
    partitions = _partitions(using)
    groups = _groups(using)
    configured = dict(Topic.objects.using(using).values_list("name", "encrypt"))
    declared = _declared_encrypt()
    return [
        _topic_row(
            name,
            partitions.get(name, {}),
            groups.get(name, []),
            name in configured,
            encrypted=configured[name] if configured.get(name) is not None else declared.get(name, False),
        )
        for name in _known_topics(using)
    ]


def _declared_encrypt() -> dict[str, bool]:
    """``{topic: encrypt}`` as ``DJANGO_JOBS["TOPICS"]`` declares it (the setting in effect when
    the topic's row says nothing)."""
    declared = validate_topic_declarations(get_settings().TOPICS or {})
    return {name: bool(values.get("encrypt")) for name, values in declared.items()}


def _topic_row(name: str, p: dict[str, Any], groups: list[GroupRow], configured: bool, *, encrypted: bool) -> TopicRow:
    return TopicRow(
        name=name,
        partitions=p.get("partitions", 0),
        published=int(p.get("published") or 0),
        newest_at=p.get("newest_at"),
        groups=groups,
        configured=configured,
        encrypted=encrypted,
    )


def topic_detail(*, using: str, name: str) -> TopicDetail | None:
    """One topic's row and settings in effect; None for a topic the console does not know."""
    configured = Topic.objects.using(using).filter(name=name).exists()
    p = _partitions(using, name).get(name, {})
    groups = _groups(using, name).get(name, [])
    if not (configured or p or groups or name in (get_settings().TOPICS or {})):
        return None
    config = topic_config(name, using=using)
    return TopicDetail(row=_topic_row(name, p, groups, configured, encrypted=config.encrypt), config=config)


def group_detail(*, using: str, topic: str, group: str, now: datetime | None = None) -> GroupDetail | None:
    """One group: its figures and, per partition (by name), the cursor, lag, lease (who holds it,
    until when), pending retry, blocked flag and last error (:func:`shown_error`), and whether
    the topic encrypts. None for an unknown group."""
    found = ConsumerGroup.objects.using(using).filter(topic=topic, name=group).values("paused", "created_at").first()
    if found is None:
        return None
    rows = _groups(using, topic).get(topic, [])
    row = next((g for g in rows if g.name == group), GroupRow(topic=topic, name=group, paused=found["paused"]))
    cursors = (
        GroupCursor.objects.using(using)
        .filter(topic=topic, group_name=group)
        .order_by("partition__name")
        .values_list(
            "partition__name",
            "position",
            "partition__last_position",
            "leased_by",
            "lease_expires_at",
            "lease_token",
            "blocked",
            "attempts",
            "retry_at",
            "expired_count",
            "last_error",
        )  # fmt: skip
    )
    partitions = [
        PartitionRow(
            name,
            pos,
            last,
            by if token else "",
            exp if token else None,
            token is not None,
            blocked,
            attempts,
            retry_at,
            expired,
            shown_error(err),
        )  # fmt: skip
        for name, pos, last, by, exp, token, blocked, attempts, retry_at, expired, err in cursors
    ]
    return GroupDetail(
        row=row,
        created_at=found["created_at"],
        partitions=partitions,
        now=now or timezone.now(),
        encrypted=topic_config(topic, using=using).encrypt,
    )


def dead_letters(
    *, using: str, topic: str, group: str, limit: int = 100, state: str | None = None
) -> tuple[list[DeadLetter], bool]:
    """The group's newest ``limit`` dead letters (newest first) and whether there are more.
    ``state``: only those in it (``dead``, ``replay``, ``replaying``). The rows as stored: show
    their payload with :func:`shown_payload`, their error and traceback with :func:`shown_error`."""
    if state is not None and state not in DeadLetterState.values:
        raise ValueError(f"Unknown dead letter state {state!r}; one of {', '.join(DeadLetterState.values)}.")
    letters = DeadLetter.objects.using(using).filter(topic=topic, group_name=group)
    if state is not None:
        letters = letters.filter(state=state)
    rows = list(letters.order_by("-id")[: limit + 1])
    return rows[:limit], len(rows) > limit

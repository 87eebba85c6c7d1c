"""What the console shows of bus mode (topics, consumer groups, dead letters): read-only views
shared by the admin's topic pages and ``manage.py jobs topics|lag|dead-letters``.

Every figure is read from small tables: a topic's partitions (their position counters say how
many messages each received), the groups' cursors (one per partition and group: the lag is the
partition's last position less the cursor's; their counters say how many messages the group
acknowledged, dead-lettered and skipped as expired), the groups and their dead letters. No
query counts the message table.

Throughput (messages per minute) is the difference of those running totals between two
moments: the snapshots a worker records once a minute (:class:`~django_jobs.models.TopicMetric`,
``engine.topic_metrics``) and the totals read now. A figure needs a snapshot at least a minute
old: without a running worker there is none, and the rate is None ("–").

Changes (pause, seek, retry, replay...) go through :mod:`django_jobs.topics` and
:mod:`django_jobs.engine.topic_control`, never through here.

Encrypted content is never shown, neither in clear nor as ciphertext: an encrypted payload is
:data:`ENCRYPTED_SHOWN` (:func:`shown_payload`), an encrypted error or traceback the exception's
name and the same words (:func:`shown_error`). No key is needed to show them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from django.db.models import Count, F, Max, Q, Sum
from django.utils import timezone

from .conf import get_settings
from .console import RATE_MINUTES
from .engine.topics import TopicConfig, topic_config
from .models import ConsumerGroup, DeadLetter, DeadLetterState, GroupCursor, Topic, TopicMetric, TopicPartition
from .spec.encryption import SHOWN, is_encrypted, shown_text
from .spec.topics import validate_topic_declarations

__all__ = [
    "ENCRYPTED_SHOWN",
    "FLOW_MINUTES",
    "RATE_MINUTES",
    "Flow",
    "FlowMinute",
    "GroupDetail",
    "GroupRow",
    "PartitionRow",
    "Rates",
    "TopicDetail",
    "TopicRow",
    "dead_letters",
    "group_detail",
    "is_encrypted",
    "shown_error",
    "shown_payload",
    "shown_rate",
    "topic_counters",
    "topic_detail",
    "topic_overview",
]

#: What the admin and the command show where a payload (or an error's message) is encrypted.
ENCRYPTED_SHOWN = SHOWN
#: Characters of a payload's JSON shown in a list before it is cut ("…").
PAYLOAD_SHOWN = 200
#: The minutes of a throughput chart (the current one last).
FLOW_MINUTES = 60
#: A rate needs a snapshot at least this old (a shorter span says little).
MIN_RATE_SPAN = timedelta(minutes=1)


def shown_rate(value: float | None) -> str:
    """Messages per minute as the console shows them: one decimal, "–" when unknown (no
    snapshot a minute old yet: no worker records them)."""
    return "–" if value is None else f"{value:.1f}"


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


#: A series' running totals at one moment: published (a topic's), acknowledged, dead-lettered,
#: expired (a group's).
Totals = tuple[int, int, int, int]


@dataclass(frozen=True)
class Rates:
    """Messages per minute over the last :data:`RATE_MINUTES` minutes (measured from the newest
    snapshot that old, up to now; a younger install: its oldest snapshot of a minute or more)."""

    published: float = 0.0
    acked: float = 0.0
    dead_lettered: float = 0.0
    expired: float = 0.0
    #: The minutes the rates were measured over.
    minutes: float = 0.0

    @property
    def consumed(self) -> float:
        """Acknowledged, dead-lettered and expired per minute: what the group got through."""
        return self.acked + self.dead_lettered + self.expired


@dataclass(frozen=True)
class FlowMinute:
    """Messages of one minute: published (a topic's flow) or acknowledged, dead-lettered and
    expired (a group's). Fractional when snapshots are minutes apart (the difference is spread
    evenly over those minutes)."""

    start: datetime
    published: float = 0.0
    acked: float = 0.0
    dead_lettered: float = 0.0
    expired: float = 0.0

    @property
    def end(self) -> datetime:
        return self.start + timedelta(minutes=1)

    @property
    def consumed(self) -> float:
        return self.acked + self.dead_lettered + self.expired


@dataclass(frozen=True)
class Flow:
    """A topic's or a group's messages per minute over the last :data:`FLOW_MINUTES`, oldest
    first; the last minute is the current one, so far (from the newest snapshot to the totals
    read now). Minutes before the first snapshot are 0."""

    minutes: list[FlowMinute]

    @property
    def published(self) -> float:
        return sum(m.published for m in self.minutes)

    @property
    def acked(self) -> float:
        return sum(m.acked for m in self.minutes)

    @property
    def dead_lettered(self) -> float:
        return sum(m.dead_lettered for m in self.minutes)

    @property
    def expired(self) -> float:
        return sum(m.expired for m in self.minutes)

    @property
    def consumed(self) -> float:
        return self.acked + self.dead_lettered + self.expired


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
    #: Leased partitions whose lease has run out: their worker died or stalls.
    leases_expired: int = 0
    #: Running totals over every partition (from the cursors' counters; they never go down).
    acked: int = 0
    dead_lettered: int = 0
    expired: int = 0
    #: Messages per minute lately; None without a snapshot a minute old (no worker records them).
    rates: Rates | None = None

    @property
    def dead(self) -> int:
        return sum(self.dead_letters.values())

    @property
    def consumed(self) -> int:
        """Messages the group got through: acknowledged, dead-lettered or expired."""
        return self.acked + self.dead_lettered + self.expired

    @property
    def consumed_per_minute(self) -> float | None:
        return None if self.rates is None else self.rates.consumed


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
    #: Messages published per minute lately; None without a snapshot a minute old.
    rates: Rates | None = None

    @property
    def lag(self) -> int:
        return sum(g.lag for g in self.groups)

    @property
    def published_per_minute(self) -> float | None:
        return None if self.rates is None else self.rates.published


@dataclass(frozen=True)
class TopicDetail:
    row: TopicRow
    config: TopicConfig
    #: Messages published per minute, the last hour, and each group's messages consumed per
    #: minute (None: not asked for).
    flow: Flow | None = None
    group_flows: dict[str, Flow] = field(default_factory=dict)


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
    #: The group's messages per minute (acknowledged, dead-lettered, expired), the last hour, and
    #: the topic's published per minute lately (None: not asked for, or no snapshot yet).
    flow: Flow | None = None
    published: Rates | None = None


def _known_topics(using: str, configured: set[str]) -> list[str]:
    """Topics with a partition (something was published), a group, a Topic row (``configured``)
    or a declaration."""
    names = set(TopicPartition.objects.using(using).values_list("topic", flat=True).distinct())
    names |= set(ConsumerGroup.objects.using(using).values_list("topic", flat=True).distinct())
    names |= configured
    names |= set((get_settings().TOPICS or {}).keys())
    return sorted(names)


def _groups(
    using: str, now: datetime, topic: str | None = None, snapshots: dict[tuple[str, str], list[Point]] | None = None
) -> dict[str, list[GroupRow]]:
    """``{topic: [GroupRow]}`` in three grouped queries (cursors, groups, dead letters); each
    group's rates from ``snapshots`` (None: no rates)."""
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
            leases_expired=Count("id", filter=Q(lease_token__isnull=False, lease_expires_at__lte=now)),
            blocked=Count("id", filter=Q(blocked=True)),
            acked=Sum("acked_count"),
            dead_lettered=Sum("dead_lettered_count"),
            expired=Sum("expired_count"),
        )
        .order_by()
    }
    dead: dict[tuple[str, str], dict[str, int]] = {}
    for t, g, state, n in letters.values_list("topic", "group_name", "state").annotate(n=Count("id")).order_by():
        dead.setdefault((t, g), {})[state] = n
    out: dict[str, list[GroupRow]] = {}
    for t, name, paused in groups.order_by("topic", "name").values_list("topic", "name", "paused"):
        c = per_cursor.get((t, name), {})
        totals = (0, int(c.get("acked") or 0), int(c.get("dead_lettered") or 0), int(c.get("expired") or 0))
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
                leases_expired=c.get("leases_expired", 0),
                acked=totals[1],
                dead_lettered=totals[2],
                expired=totals[3],
                rates=None if snapshots is None else _rates(snapshots.get((t, name), []), Point(now, totals)),
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


def topic_overview(*, using: str, now: datetime | None = None) -> list[TopicRow]:
    """Every topic (published to, with a group, a Topic row or declared in ``DJANGO_JOBS["TOPICS"]``),
    by name, with its groups, their lag and the rates of the last :data:`RATE_MINUTES` minutes:
    eight queries whatever the number of messages (partitions, cursors, groups and dead letters
    grouped; the last minutes' snapshots; the topic names)."""
    now = now or timezone.now()
    snapshots = _snapshots(using, since=_minute(now) - timedelta(minutes=RATE_MINUTES + 1))
    partitions = _partitions(using)
    groups = _groups(using, now, snapshots=snapshots)
    configured = dict(Topic.objects.using(using).values_list("name", "encrypt"))
    declared = _declared_encrypt()
    return [
        _topic_row(
            name,
            partitions.get(name, {}),
            groups.get(name, []),
            name in configured,
            now,
            snapshots,
            encrypted=configured[name] if configured.get(name) is not None else declared.get(name, False),
        )
        for name in _known_topics(using, set(configured))
    ]


def _declared_encrypt() -> dict[str, bool]:
    """``{topic: encrypt}`` as ``DJANGO_JOBS["TOPICS"]`` declares it (the setting in effect when
    the topic's row says nothing)."""
    declared = validate_topic_declarations(get_settings().TOPICS or {})
    return {name: bool(values.get("encrypt")) for name, values in declared.items()}


def topic_counters(*, using: str, now: datetime | None = None) -> list[TopicRow]:
    """The topics that have partitions or groups, by name, with their published totals and their
    groups' figures and running totals, but no rates: four grouped queries (partitions, cursors,
    groups, dead letters), what a Prometheus scrape reads."""
    now = now or timezone.now()
    partitions = _partitions(using)
    groups = _groups(using, now)
    return [
        _topic_row(name, partitions.get(name, {}), groups.get(name, []), False, now, None)
        for name in sorted(set(partitions) | set(groups))
    ]


def _topic_row(
    name: str,
    p: dict[str, Any],
    groups: list[GroupRow],
    configured: bool,
    now: datetime,
    snapshots: dict[tuple[str, str], list[Point]] | None,
    *,
    encrypted: bool = False,
) -> TopicRow:
    published = int(p.get("published") or 0)
    rates = None if snapshots is None else _rates(snapshots.get((name, ""), []), Point(now, (published, 0, 0, 0)))
    return TopicRow(
        name=name,
        partitions=p.get("partitions", 0),
        published=published,
        newest_at=p.get("newest_at"),
        groups=groups,
        configured=configured,
        encrypted=encrypted,
        rates=rates,
    )


def topic_detail(*, using: str, name: str, now: datetime | None = None, throughput: bool = True) -> TopicDetail | None:
    """One topic's row and settings in effect and, with ``throughput``, its rates and the last
    hour's messages per minute, published and consumed by each group (one more query); None for
    a topic the console does not know."""
    now = now or timezone.now()
    configured = Topic.objects.using(using).filter(name=name).exists()
    snapshots = _snapshots(using, since=_flow_since(now), topic=name) if throughput else None
    p = _partitions(using, name).get(name, {})
    groups = _groups(using, now, name, snapshots=snapshots).get(name, [])
    if not (configured or p or groups or name in (get_settings().TOPICS or {})):
        return None
    config = topic_config(name, using=using)
    row = _topic_row(name, p, groups, configured, now, snapshots, encrypted=config.encrypt)
    if snapshots is None:
        return TopicDetail(row=row, config=config)
    return TopicDetail(
        row=row,
        config=config,
        flow=_flow(snapshots.get((name, ""), []), Point(now, (row.published, 0, 0, 0))),
        group_flows={
            g.name: _flow(snapshots.get((name, g.name), []), Point(now, (0, g.acked, g.dead_lettered, g.expired)))
            for g in groups
        },
    )


def group_detail(
    *, using: str, topic: str, group: str, now: datetime | None = None, throughput: bool = True
) -> GroupDetail | None:
    """One group: its figures and, per partition (by name), the cursor, lag, lease (who holds it,
    until when), pending retry, blocked flag and last error (:func:`shown_error`), and whether
    the topic encrypts; with ``throughput``, its messages per minute over the last hour and the
    topic's published rate (two more queries). None for an unknown group."""
    now = now or timezone.now()
    found = ConsumerGroup.objects.using(using).filter(topic=topic, name=group).values("paused", "created_at").first()
    if found is None:
        return None
    snapshots = None
    if throughput:
        snapshots = _snapshots(using, since=_flow_since(now), topic=topic, groups=("", group))
    rows = _groups(using, now, topic, snapshots=snapshots).get(topic, [])
    row = next((g for g in rows if g.name == group), GroupRow(topic=topic, name=group, paused=found["paused"]))
    flow = published = None
    if snapshots is not None:
        flow = _flow(snapshots.get((topic, group), []), Point(now, (0, row.acked, row.dead_lettered, row.expired)))
        total = _partitions(using, topic).get(topic, {}).get("published") or 0
        published = _rates(snapshots.get((topic, ""), []), Point(now, (int(total), 0, 0, 0)))
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
        now=now,
        encrypted=topic_config(topic, using=using).encrypt,
        flow=flow,
        published=published,
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


# -- throughput: differences of running totals ----------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """A series' running totals at a moment: a snapshot, or the totals read now."""

    at: datetime
    totals: Totals


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _flow_since(now: datetime) -> datetime:
    """The first snapshot minute a flow reads: its first minute's, and a few before it (the
    recorder may have missed minutes: the difference over the gap is spread across it)."""
    return _minute(now) - timedelta(minutes=FLOW_MINUTES - 1 + RATE_MINUTES)


def _snapshots(
    using: str, *, since: datetime, topic: str | None = None, groups: Iterable[str] | None = None
) -> dict[tuple[str, str], list[Point]]:
    """``{(topic, group or ""): [Point]}`` of the TopicMetric rows of minutes from ``since``
    on, oldest first: one query (the unique index for one topic, the minute index for all)."""
    rows = TopicMetric.objects.using(using).since(since, topic=topic)
    if groups is not None:
        rows = rows.filter(group_name__in=list(groups))
    out: dict[tuple[str, str], list[Point]] = {}
    fields = ("topic", "group_name", "taken_at", "published", "acked", "dead_lettered", "expired")
    for t, g, at, *totals in rows.values_list(*fields):
        out.setdefault((t, g), []).append(Point(at, (totals[0], totals[1], totals[2], totals[3])))
    return out


def _increase(older: Totals, newer: Totals) -> Totals:
    """What each total grew by; a total that went down (rows deleted by hand) grew by 0."""
    return (
        max(0, newer[0] - older[0]),
        max(0, newer[1] - older[1]),
        max(0, newer[2] - older[2]),
        max(0, newer[3] - older[3]),
    )


def _rates(snapshots: list[Point], live: Point) -> Rates | None:
    """Messages per minute from a snapshot to ``live``: the newest snapshot taken at least
    :data:`RATE_MINUTES` minutes before it, else (a young install) the oldest taken at least
    :data:`MIN_RATE_SPAN` before; None when there is neither."""
    window = live.at - timedelta(minutes=RATE_MINUTES)
    base = next((p for p in reversed(snapshots) if p.at <= window), None)
    if base is None:
        base = next((p for p in snapshots if p.at <= live.at - MIN_RATE_SPAN), None)
    if base is None:
        return None
    minutes = (live.at - base.at).total_seconds() / 60
    grown = _increase(base.totals, live.totals)
    return Rates(*(n / minutes for n in grown), minutes=minutes)


def _flow(snapshots: list[Point], live: Point) -> Flow:
    """The last :data:`FLOW_MINUTES` minutes of a series, the current one last. The growth
    between two consecutive points goes to the minute of the earlier one (the recorder reads at
    the start of each minute, so that minute is the one it covers), spread evenly over the
    minutes up to the later one when snapshots are missing; the growth since the newest
    snapshot goes to the current minute."""
    first = _minute(live.at) - timedelta(minutes=FLOW_MINUTES - 1)
    sums = [[0.0, 0.0, 0.0, 0.0] for _ in range(FLOW_MINUTES)]
    points = [*snapshots, live] if not snapshots or live.at >= snapshots[-1].at else snapshots
    for older, newer in pairwise(points):
        grown = _increase(older.totals, newer.totals)
        start = _minute(older.at)
        span = max(1, int((_minute(newer.at) - start).total_seconds() // 60))
        for i in range(span):
            index = int((start - first).total_seconds() // 60) + i
            if 0 <= index < FLOW_MINUTES:
                for k in range(4):
                    sums[index][k] += grown[k] / span
    return Flow([FlowMinute(first + timedelta(minutes=i), *sums[i]) for i in range(FLOW_MINUTES)])

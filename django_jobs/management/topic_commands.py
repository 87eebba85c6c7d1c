"""The bus-mode subcommands of ``manage.py jobs``: ``topics``, ``lag`` and ``dead-letters``.
Formatting only: the figures come from :mod:`django_jobs.console_topics`, the changes (replay,
delete) go through :func:`django_jobs.topic`'s group control. Encrypted payloads and errors are
shown as ``encrypted (not shown)`` (after the exception's name for an error), in ``--json`` too."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

import django_jobs

from ..console_topics import (
    Rates,
    dead_letters,
    group_detail,
    is_encrypted,
    shown_error,
    shown_payload,
    shown_rate,
    topic_detail,
    topic_overview,
)
from ..exceptions import JobsError
from ..spec.topics import validate_topic_name
from .text import moment, table

#: Characters of a payload a dead letters table shows (``--json`` gives it whole).
PAYLOAD_COLUMN = 60


def add_topic_parsers(sub: Any) -> None:
    """The three subcommands, on ``jobs``'s subparsers."""
    topics = sub.add_parser(
        "topics",
        help="Topics with their partitions, messages published, groups and lag, and messages published and "
        "consumed per minute (last 5 minutes).",
    )
    topics.add_argument("--json", action="store_true", dest="as_json", help="Print JSON.")
    lag = sub.add_parser("lag", help="A topic's lag per group and partition, the leases held and blocked partitions.")
    lag.add_argument("topic")
    lag.add_argument("--group", help="Only this consumer group.")
    lag.add_argument("--partition", help="Only this partition ('' for the default one).")
    lag.add_argument("--json", action="store_true", dest="as_json", help="Print JSON.")
    dead = sub.add_parser(
        "dead-letters", help="A group's dead letters (newest first); replay or delete some or all of them."
    )
    dead.add_argument("topic")
    dead.add_argument("--group", required=True, help="The consumer group.")
    dead.add_argument("--limit", type=int, default=50, help="Most dead letters listed (default 50).")
    acts = dead.add_mutually_exclusive_group()
    acts.add_argument("--replay", nargs="+", type=int, metavar="ID", help="Queue these dead letters for replay.")
    acts.add_argument("--replay-all", action="store_true", help="Queue every dead letter of the group for replay.")
    acts.add_argument("--delete", nargs="+", type=int, metavar="ID", help="Delete these dead letters.")
    acts.add_argument("--delete-all", action="store_true", help="Delete every dead letter of the group.")
    dead.add_argument("--json", action="store_true", dest="as_json", help="Print JSON.")


class TopicCommands:
    """``do_topics``, ``do_lag``, ``do_dead_letters`` of the jobs command (mixed into it)."""

    using: str
    stdout: Any
    _done: Any  # the command's: say what an action did unless -v 0

    def do_topics(self, as_json: bool = False, **_: Any) -> None:
        rows = topic_overview(using=self.using)
        if as_json:
            out = [
                {
                    "topic": t.name,
                    "partitions": t.partitions,
                    "published": t.published,
                    "published_per_minute": _per_minute(t.rates, "published"),
                    "newest_at": t.newest_at.isoformat() if t.newest_at else None,
                    "lag": t.lag,
                    "encrypted": t.encrypted,
                    "groups": [
                        {
                            "group": g.name,
                            "lag": g.lag,
                            "paused": g.paused,
                            "blocked": g.blocked,
                            "dead_letters": g.dead,
                            "acked": g.acked,
                            "dead_lettered": g.dead_lettered,
                            "expired": g.expired,
                            "consumed_per_minute": _per_minute(g.rates, "consumed"),
                            "acked_per_minute": _per_minute(g.rates, "acked"),
                            "dead_lettered_per_minute": _per_minute(g.rates, "dead_lettered"),
                            "expired_per_minute": _per_minute(g.rates, "expired"),
                        }
                        for g in t.groups
                    ],
                }
                for t in rows
            ]
            self.stdout.write(json.dumps(out, indent=2))
            return
        if not rows:
            self.stdout.write("No topics: nothing was published, no group subscribed, none is declared.")
            return
        head = [
            "topic",
            "partitions",
            "published",
            "published/min",
            "newest",
            "groups (lag)",
            "total lag",
            "consumed/min",
            "encrypted",
        ]
        body = [
            [
                t.name,
                str(t.partitions),
                str(t.published),
                shown_rate(t.published_per_minute),
                moment(t.newest_at),
                ", ".join(_group_cell(g) for g in t.groups) or "-",
                str(t.lag),
                ", ".join(f"{g.name} {shown_rate(g.consumed_per_minute)}" for g in t.groups) or "-",
                "yes" if t.encrypted else "no",
            ]
            for t in rows
        ]
        self.stdout.write(table(head, body))

    def do_lag(self, topic: str, group: str | None = None, partition: str | None = None, as_json: bool = False,
               **_: Any) -> None:  # fmt: skip
        _check(topic, "topic")
        detail = topic_detail(using=self.using, name=topic, throughput=False)
        if detail is None:
            raise CommandError(f"No topic {topic!r}.")
        names = [g.name for g in detail.row.groups]
        if group is not None:
            _check(group, "group")
            if group not in names:
                raise CommandError(f"No group {group!r} of topic {topic!r}; its groups: {', '.join(names) or 'none'}.")
            names = [group]
        now = timezone.now()
        groups = []
        for name in names:
            found = group_detail(using=self.using, topic=topic, group=name, now=now, throughput=False)
            assert found is not None  # listed just above; a group is never deleted
            parts = [p for p in found.partitions if partition is None or p.partition == partition]
            groups.append((found, parts))
        if as_json:
            out = {
                "topic": topic,
                "encrypted": detail.config.encrypt,
                "groups": [
                    {
                        "group": g.row.name,
                        "paused": g.row.paused,
                        "lag": sum(p.lag for p in parts),
                        "partitions": [
                            {
                                "partition": p.partition,
                                "position": p.position,
                                "last_position": p.last_position,
                                "lag": p.lag,
                                "leased_by": p.leased_by or None,
                                "lease_expires_at": p.lease_expires_at.isoformat() if p.lease_expires_at else None,
                                "blocked": p.blocked,
                                "attempts": p.attempts,
                                "last_error": p.last_error or None,
                            }
                            for p in parts
                        ],
                    }
                    for g, parts in groups
                ],
            }
            self.stdout.write(json.dumps(out, indent=2))
            return
        if not groups:
            self.stdout.write(f"Topic {topic!r} has no consumer group yet.")
            return
        lines = []
        if detail.config.encrypt:
            lines.append(f"Topic {topic!r} is encrypted: encrypted payloads and errors are not shown.")
        for g, parts in groups:
            flags = "  PAUSED" if g.row.paused else ""
            lines.append(f"group {g.row.name}: lag {sum(p.lag for p in parts)}{flags}")
            head = ["partition", "cursor", "last", "lag", "leased by", "lease expires", "attempts", "state"]
            body = [
                [
                    p.partition or "(default)",
                    str(p.position),
                    str(p.last_position),
                    str(p.lag),
                    p.leased_by if p.leased else "",
                    (moment(p.lease_expires_at) + (" (expired)" if p.lease_expired(now) else "")) if p.leased else "",
                    str(p.attempts),
                    f"BLOCKED: {_line(p.last_error)}" if p.blocked else "",
                ]
                for p in parts
            ]
            lines += [table(head, body) if body else "  (no partition matches)", ""]
        self.stdout.write("\n".join(lines).rstrip())

    def do_dead_letters(self, topic: str, group: str, limit: int = 50, as_json: bool = False, **options: Any) -> None:
        _check(topic, "topic")
        _check(group, "group")
        if limit < 1:
            raise CommandError(f"--limit must be >= 1; got {limit}.")
        if group_detail(using=self.using, topic=topic, group=group, throughput=False) is None:
            raise CommandError(f"No group {group!r} of topic {topic!r}.")
        control = django_jobs.topic(topic).group(group)
        for verb in ("replay", "delete"):
            ids = options.get(verb)
            every = options.get(f"{verb}_all")
            if ids or every:
                self._act(control, verb, None if every else ids)
                return
        letters, more = dead_letters(using=self.using, topic=topic, group=group, limit=limit)
        if as_json:
            out = [
                {
                    "id": d.id,
                    "partition": d.partition_name,
                    "message_id": d.message_id,
                    "position": d.position,
                    "state": d.state,
                    "attempts": d.attempts,
                    "error": shown_error(d.error),
                    "created_at": d.created_at.isoformat(),
                    "published_at": d.published_at.isoformat(),
                    "encrypted": is_encrypted(d.payload),
                    "payload": shown_payload(d.payload) if is_encrypted(d.payload) else d.payload,
                }
                for d in letters
            ]
            self.stdout.write(json.dumps(out, indent=2))
            return
        if not letters:
            self.stdout.write(f"Group {group!r} of topic {topic!r} has no dead letters.")
            return
        head = ["id", "partition", "message", "attempts", "dead since", "state", "error", "payload"]
        body = [
            [
                str(d.id),
                d.partition_name or "(default)",
                f"{d.message_id} #{d.position}",
                str(d.attempts),
                moment(d.created_at),
                d.state,
                _line(shown_error(d.error)),
                shown_payload(d.payload, PAYLOAD_COLUMN),
            ]
            for d in letters
        ]
        self.stdout.write(table(head, body))
        if more:
            self.stdout.write(f"(the newest {limit} are shown; --limit for more)")

    def _act(self, control: Any, verb: str, ids: list[int] | None) -> None:
        try:
            n = control.replay(ids) if verb == "replay" else control.delete_dead_letters(ids)
        except JobsError as exc:
            raise CommandError(str(exc)) from None
        done = "queued for replay" if verb == "replay" else "deleted"
        self._done(f"{n} dead letter(s) of group {control.name!r} {done}.")
        if ids is not None and n < len(set(ids)):
            why = "not found" if verb == "delete" else "not found or already queued"
            raise CommandError(f"{len(set(ids)) - n} of {len(set(ids))} dead letter(s) were {why}.")


def _check(name: str, what: str) -> None:
    try:
        validate_topic_name(name, what)
    except JobsError as exc:
        raise CommandError(str(exc)) from None


def _group_cell(g: Any) -> str:
    flags = [
        f for f, on in (("paused", g.paused), (f"{g.blocked} blocked", g.blocked), (f"{g.dead} dead", g.dead)) if on
    ]
    return f"{g.name} ({g.lag}{', ' + ', '.join(flags) if flags else ''})"


def _per_minute(rates: Rates | None, name: str) -> float | None:
    """A rate for ``--json``: to two decimals, None when unknown (no snapshot a minute old)."""
    return None if rates is None else round(getattr(rates, name), 2)


def _line(text: str, limit: int = 60) -> str:
    line = text.strip().splitlines()[-1] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


__all__ = ["TopicCommands", "add_topic_parsers"]

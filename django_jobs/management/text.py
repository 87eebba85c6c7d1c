"""How ``manage.py jobs`` writes tables, times and durations, and reads times, so that status,
list and show print every time the same way: to the second, in the current time zone, named."""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.management.base import CommandError

from .. import console

__all__ = ["ANSI_REDRAW", "due", "duration", "moment", "moment_ms", "parse_moment", "table"]

#: Cursor to the top left, then clear the screen: a terminal redraws a ``status --watch`` snapshot
#: in place (what ``watch(1)`` does), with no curses.
ANSI_REDRAW = "\x1b[H\x1b[2J"


def moment(value: datetime | None) -> str:
    """:func:`django_jobs.console.moment`; ``-`` for None."""
    return "-" if value is None else console.moment(value)


def moment_ms(value: datetime | None) -> str:
    """:func:`moment` to the millisecond, where the order of close events matters."""
    return "-" if value is None else console.moment(value, milliseconds=True)


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h04m``, ``3d02h`` (negative: ``0s``)."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def due(when: datetime, now: datetime) -> str:
    """How far a due time ``when`` is from ``now``, to the nearest second: ``in 3m05s``,
    ``due now`` or ``due 3m05s ago``."""
    seconds = round((when - now).total_seconds())
    if seconds == 0:
        return "due now"
    return f"in {duration(seconds)}" if seconds > 0 else f"due {duration(-seconds)} ago"


def table(head: list[str], body: list[list[str]]) -> str:
    """Left-aligned columns under a header and a rule, two spaces apart."""
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_moment(value: str | None, name: str) -> datetime | None:
    """An ISO 8601 time from the command line (naive: UTC), or a CommandError saying how."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--{name} must be an ISO 8601 time such as 2026-11-30T06:00; got {value!r}.") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)

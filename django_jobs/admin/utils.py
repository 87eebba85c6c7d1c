"""Helpers the admin modules share: the jobs' database, ids from URLs and forms, and the
formatting of what the job pages show."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from .. import console
from ..conf import get_settings
from ..spec.encryption import SHOWN, is_encrypted, shown_errors
from ..states import JobState


def database() -> str:
    """The database alias of the job tables (``DJANGO_JOBS["DATABASE"]``)."""
    return get_settings().DATABASE


def parse_uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value).strip())
    except ValueError:
        return None


def state_class(state: str) -> str:
    """The CSS class suffix of a state's badge (``dj-state-<it>``)."""
    return state if state in JobState.values else "unknown"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def shown_json(value: Any, encrypted: bool) -> str:
    """``value`` as the job pages show it: indented JSON, or "encrypted (not shown)" for an
    encrypted job's stored value (its arguments, its return value)."""
    return SHOWN if encrypted or is_encrypted(value) else pretty(value)


def progress_percent(value: Any) -> float | None:
    """A progress value as a percentage for the bar: a number 0..100, or a dict with
    ``percent`` or ``current`` and ``total``; None for anything else."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if number(value) and 0 <= value <= 100:
        return float(value)
    if isinstance(value, dict):
        if number(value.get("percent")) and 0 <= value["percent"] <= 100:
            return float(value["percent"])
        total = value.get("total")
        for key in PROGRESS_COUNT_KEYS:
            current = value.get(key)
            if number(current) and number(total) and total > 0:
                return max(0.0, min(100.0, 100.0 * current / total))
    return None


#: The keys a progress dict may count with, beside ``total`` (docs/reference/task-options.md#progress).
PROGRESS_COUNT_KEYS = ("current", "done")


def moment(value: Any, *, milliseconds: bool = False) -> str:
    """One format for every time the admin shows: local time (TIME_ZONE) to the second, or the
    millisecond where order matters (the timeline), with the zone's name; "" for None. Times
    stored as ISO text (an error's ``at``) are parsed first."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return console.moment(value, milliseconds=milliseconds)


def last_error(errors: Any) -> str:
    """The newest error as one line: its class's name and message (the traceback's last line)."""
    rows = error_rows(errors[-1:] if isinstance(errors, list) else [])
    if not rows:
        return ""
    row = rows[0]
    message = row["message"]
    name = row["exception"].rsplit(".", 1)[-1]
    return message if message.startswith(f"{name}:") or message == name else f"{name}: {message}".rstrip(": ")


def error_rows(errors: Any) -> list[dict[str, Any]]:
    """Each failed attempt's error, newest first: class, message (the traceback's last line),
    attempt, time and traceback. An encrypted job's traceback (and so its message) is
    :data:`~django_jobs.spec.encryption.SHOWN`."""
    rows = []
    for error in reversed(shown_errors(errors) if isinstance(errors, list) else []):
        if not isinstance(error, dict):
            rows.append({"exception": "", "message": pretty(error), "attempt": None, "at": None, "traceback": ""})
            continue
        traceback = str(error.get("traceback") or "")
        lines = [line for line in traceback.strip().splitlines() if line.strip()]
        rows.append(
            {
                "exception": error.get("exception_class_path") or "",
                "message": lines[-1] if lines else "",
                "attempt": error.get("attempt"),
                "at": error.get("at"),
                "traceback": traceback,
            }
        )
    return rows

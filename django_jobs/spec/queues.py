"""Queues as declared: a queue's name, and the flags and limits ``DJANGO_JOBS["QUEUES"]`` (or
``queue(...).configure(...)``) declares for it, validated and turned into QueueState columns.

Part of :mod:`django_jobs.spec` (no models); the control that writes them,
``django_jobs.queue("emails")``, is :mod:`django_jobs.queues`, a layer up.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..exceptions import InvalidQueueName, InvalidQueueSetting, JobsConfigurationError, JobsError

QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}\Z")  # \Z: "$" would let a final newline in


def validate_queue_name(name: Any) -> None:
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise InvalidQueueName(
            f"Invalid queue name {name!r}: use 1-100 characters of letters, digits, '_', '-', '.' "
            "and ':', starting with a letter or digit."
        )


#: The keys of a DJANGO_JOBS["QUEUES"] declaration.
DECLARABLE = (
    "paused",
    "concurrency",
    "rate_limit",
    "max_size",
    "partition_concurrency",
    "partition_rate_limit",
    "partition_max_size",
)


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidQueueSetting(f"{what} must be an integer >= 1, or None to remove the limit; got {value!r}.")
    return value


def _rate(value: Any, what: str) -> tuple[int, float] | None:
    """``None`` or ``(max_jobs, per_seconds)``, validated."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise InvalidQueueSetting(
            f"{what} must be (max_jobs, per_seconds), such as (20, 1.0), or None to remove it; got {value!r}."
        )
    max_jobs, per = value
    _count(max_jobs, f"{what}: max_jobs")
    if not isinstance(per, (int, float)) or isinstance(per, bool) or not math.isfinite(per) or per <= 0:
        raise InvalidQueueSetting(f"{what}: per_seconds must be a number of seconds > 0; got {per!r}.")
    return int(max_jobs), float(per)


def queue_columns(**limits: Any) -> dict[str, Any]:
    """QueueState columns for validated ``limits`` (keys of :data:`DECLARABLE`)."""
    columns: dict[str, Any] = {}
    for key, value in limits.items():
        if key == "paused":
            if not isinstance(value, bool):
                raise InvalidQueueSetting(f"paused must be True or False; got {value!r}.")
            columns["paused"] = value
        elif key in ("concurrency", "max_size", "partition_concurrency", "partition_max_size"):
            column = {"concurrency": "concurrency_limit"}.get(key, key)
            columns[column] = _count(value, key)
        elif key in ("rate_limit", "partition_rate_limit"):
            rate = _rate(value, key)
            columns[key] = rate[0] if rate else None
            columns[f"{key.removesuffix('_limit')}_window_seconds"] = rate[1] if rate else None
        else:
            raise InvalidQueueSetting(f"Unknown queue setting {key!r}; allowed: {', '.join(DECLARABLE)}.")
    return columns


def validate_queue_declarations(declared: Any) -> dict[str, dict[str, Any]]:
    """``DJANGO_JOBS["QUEUES"]`` validated and JSON-shaped (a rate limit as ``[max_jobs,
    per_seconds]``); JobsConfigurationError naming the queue and the key for anything invalid."""
    if declared is None:
        return {}
    if not isinstance(declared, dict):
        raise JobsConfigurationError(
            'QUEUES must be a dict such as {"emails": {"concurrency": 5, "rate_limit": (20, 1.0)}}; '
            f"got {type(declared).__name__}."
        )
    out: dict[str, dict[str, Any]] = {}
    for name, limits in declared.items():
        try:
            validate_queue_name(name)
        except JobsError as exc:
            raise JobsConfigurationError(f"QUEUES: {exc}") from None
        if not isinstance(limits, dict):
            raise JobsConfigurationError(f"QUEUES[{name!r}] must be a dict of limits; got {limits!r}.")
        try:
            queue_columns(**limits)
        except InvalidQueueSetting as exc:
            raise JobsConfigurationError(f"QUEUES[{name!r}]: {exc}") from None
        out[name] = {
            k: list(_rate(v, k)) if k.endswith("rate_limit") and v is not None else v for k, v in limits.items()
        }
    return out


__all__ = ["DECLARABLE", "QUEUE_NAME_RE", "queue_columns", "validate_queue_declarations", "validate_queue_name"]

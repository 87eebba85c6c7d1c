"""Backoff forms: a number (constant), a list (per attempt, last value reused) or "exponential"."""

from __future__ import annotations

import math
import random
from typing import Any

from django.utils.module_loading import import_string

from ..exceptions import InvalidTaskOptions


def validate_backoff(value: Any) -> None:
    """Raise ``ValueError`` saying what is allowed when ``value`` is not a backoff form."""
    if value is None or value == "exponential" or callable(value):
        return
    if _is_seconds(value):
        return
    if isinstance(value, (list, tuple)) and value and all(_is_seconds(v) for v in value):
        return
    raise ValueError(
        "backoff must be a number of seconds >= 0, a non-empty list of them, 'exponential', or a callable "
        f"(attempt, exception) -> seconds | None; got {value!r}."
    )


def _is_seconds(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def compute_backoff(backoff: Any, attempt: int, *, base: float, cap: float) -> float:
    """Seconds to wait before the next attempt, after ``attempt`` (1-based) failed."""
    if backoff is None:
        backoff = "exponential"
    if backoff == "exponential":
        # Full jitter (AWS architecture blog): spreads retries of a failing batch evenly.
        return random.uniform(0, min(cap, base * (2 ** min(attempt - 1, 62))))
    if isinstance(backoff, (list, tuple)):
        return float(backoff[min(attempt, len(backoff)) - 1])
    return float(backoff)


def backoff_path(backoff: Any) -> str:
    """The dotted path a worker imports a callable backoff from; it must be module-level."""
    path = f"{getattr(backoff, '__module__', '')}.{getattr(backoff, '__qualname__', '')}"
    try:
        found = import_string(path)
    except ImportError:
        found = None
    if found is not backoff:
        raise InvalidTaskOptions(
            f"A callable backoff must be a module-level function defined before the task (workers import it "
            f"by path); {backoff!r} is not importable as {path!r}."
        )
    return path

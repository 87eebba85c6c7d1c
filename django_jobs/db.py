"""What the package needs to know of its databases whatever their vendor: which aliases hold
jobs, and which database errors are transient. Vendor differences live in ``drivers/``."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections

from .conf import get_settings

# SQLite reports a missing table as an OperationalError too; that one no retry will fix.
_PERMANENT_MESSAGES = ("no such table", "no such column", "syntax error", "has no column named")


def is_transient(exc: BaseException) -> bool:
    """True for errors a retry can fix: a dropped connection, a busy or locked database, a
    serialization failure or deadlock (PostgreSQL reports those as OperationalError too)."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    message = str(exc).lower()
    return not any(m in message for m in _PERMANENT_MESSAGES)


def retry_transient[T](call: Callable[[], T], *, what: str, logger: logging.Logger, tries: int = 5) -> T:
    """Return ``call()``, calling it again (``tries`` times in all, after a pause of 10-50 ms)
    while it raises a transient database error: above all a deadlock, whose victim's transaction
    the database rolled back whole, so ``call`` (one transaction) can simply run again. The last
    error, or any other, propagates. ``what`` names the call in the INFO line of each retry."""
    for attempt in range(1, tries + 1):
        try:
            return call()
        except DatabaseError as exc:
            if attempt == tries or not is_transient(exc):
                raise
            logger.info("%s: %s; trying again (%d of %d).", what, exc, attempt + 1, tries)
            time.sleep(random.uniform(0.01, 0.05))
    raise AssertionError("unreachable")  # the loop returns or raises


def vendor(using: str) -> str:
    return connections[using].vendor


def jobs_database_aliases() -> set[str]:
    aliases = {get_settings().DATABASE}
    for alias, params in getattr(settings, "TASKS", {}).items():
        if str(params.get("BACKEND", "")).startswith("django_jobs."):
            aliases.add(get_settings(alias).DATABASE)
    return aliases

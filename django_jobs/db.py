"""What the package needs to know of its databases whatever their vendor: which aliases hold
jobs, and which database errors are transient. Vendor differences live in ``drivers/``."""

from __future__ import annotations

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections

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


def vendor(using: str) -> str:
    return connections[using].vendor


def jobs_database_aliases() -> set[str]:
    aliases = {get_settings().DATABASE}
    for alias, params in getattr(settings, "TASKS", {}).items():
        if str(params.get("BACKEND", "")).startswith("django_jobs."):
            aliases.add(get_settings(alias).DATABASE)
    return aliases

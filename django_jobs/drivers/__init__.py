"""One driver per database (see :mod:`.base`): ``driver(using)`` returns the one for a
database alias. Importable without any database client library: a driver imports its client
only when it first talks to the database."""

from __future__ import annotations

from django.db import connections

from .base import Driver
from .mysql import MySQLDriver
from .postgresql import PostgreSQLDriver
from .sqlite import SQLiteDriver

DRIVERS: dict[str, type[Driver]] = {d.VENDOR: d for d in (PostgreSQLDriver, SQLiteDriver, MySQLDriver)}


def driver(using: str) -> Driver:
    """The driver of database ``using``; ``NotImplementedError`` for a vendor without one (the
    system checks refuse such a database first)."""
    connection = connections[using]
    try:
        return DRIVERS[connection.vendor](using, connection)
    except KeyError:
        raise NotImplementedError(f"django-jobs has no driver for {connection.vendor!r} databases") from None


__all__ = ["DRIVERS", "Driver", "MySQLDriver", "PostgreSQLDriver", "SQLiteDriver", "driver"]

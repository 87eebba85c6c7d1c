"""What the worker's threads do when the database fails them.

An error a retry can fix (a dropped connection, a busy database; see
:func:`django_jobs.db.is_transient`) is logged and retried after a capped, jittered pause on a
fresh connection. Any other becomes :class:`~django_jobs.exceptions.WorkerCrashed`: retrying
would spin forever.
"""

from __future__ import annotations

import logging
import random
import threading

from django.db import connections

from ..exceptions import WorkerCrashed

logger = logging.getLogger("django_jobs.worker")


def db_trouble(
    what: str, exc: Exception, failures: int, *, worker_id: str, using: str, stopping: threading.Event
) -> None:
    """Log a transient database error, drop the connection and wait before the retry (less
    than 5 s, longer after each of ``failures`` in a row; a stop cuts it short)."""
    logger.warning(
        "Worker %s: %s failed (%s: %s); retrying.",
        worker_id,
        what,
        type(exc).__name__,
        str(exc).strip().splitlines()[0] if str(exc).strip() else "",
    )
    close_connection(using)
    delay = min(5.0, 0.05 * (2 ** min(failures, 8))) * random.uniform(0.5, 1.0)
    stopping.wait(delay)


def crashed(what: str, exc: BaseException) -> WorkerCrashed:
    return WorkerCrashed(
        f"{what[:1].upper()}{what[1:]} failed with {type(exc).__name__}: {str(exc).strip()}. Retrying cannot fix this; is the "
        "database migrated (`manage.py migrate`) and reachable with these settings?"
    )


def close_connection(using: str) -> None:
    try:
        connections[using].close()
    except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is dropped anyway
        logger.debug("closing a broken connection failed", exc_info=True)

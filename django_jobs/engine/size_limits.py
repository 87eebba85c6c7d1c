"""Which queues have a size limit (``max_size`` or ``partition_max_size``), as this process last
read them: the plain enqueue of a job to any other queue is a bare INSERT, with no probe of the
queue table (a job pays only for the features it uses; docs/benchmarks.md).

Each process reads the names of the limited queues of a database at most once per
``SIZE_LIMITS_REFRESH`` seconds (one small statement) and forgets them when it writes a
QueueState row itself (Django's ``post_save``/``post_delete``: the API, the admin, the declared
``QUEUES``). So a limit set in this process holds for its next enqueue, one set in another
process within ``SIZE_LIMITS_REFRESH`` seconds. Only a queue that goes from no size limit to
one waits for that: a queue known to be limited is admitted under its lock, where the limits are
read anew (``partitions._admit``), so a raised, lowered or removed limit holds at once.
``SIZE_LIMITS_REFRESH = 0`` keeps nothing: every plain enqueue probes the queue table in its
INSERT, and any limit holds from the moment it commits.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.db.models.signals import post_delete, post_save

from ..drivers.inserts import SIZE_LIMITED
from ..models import QueueState
from .common import QUEUE_TABLE

#: database alias -> (time.monotonic() of the read, the names of its limited queues)
_read: dict[str, tuple[float, frozenset[str]]] = {}
#: database alias -> how many times this process forgot its read: a read that started before a
#: forget is not kept (it may predate the write that caused it).
_forgotten: dict[str, int] = {}
_lock = threading.Lock()


def size_limited(connection: Any, queue: str, refresh: float) -> bool | None:
    """Whether ``queue`` of ``connection``'s database has a size limit, as read at most
    ``refresh`` seconds ago (read now on ``connection``, in its transaction, when older); None
    when ``refresh`` is 0: the caller's INSERT probes for itself."""
    if refresh <= 0:
        return None
    alias = connection.alias
    entry = _read.get(alias)
    now = time.monotonic()
    if entry is None or now - entry[0] >= refresh:
        generation = _forgotten.get(alias, 0)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT name FROM {QUEUE_TABLE} WHERE {SIZE_LIMITED}")
            entry = (now, frozenset(row[0] for row in cursor.fetchall()))
        with _lock:
            if _forgotten.get(alias, 0) == generation:
                _read[alias] = entry
    return queue in entry[1]


def forget(alias: str | None = None) -> None:
    """Drop what this process read of ``alias`` (None: of every database)."""
    with _lock:
        for name in [alias] if alias is not None else list(_read):
            _read.pop(name, None)
            _forgotten[name] = _forgotten.get(name, 0) + 1


def _written(sender: Any, using: str, **kwargs: Any) -> None:
    forget(using)


post_save.connect(_written, sender=QueueState, dispatch_uid="django_jobs.size_limits.saved")
post_delete.connect(_written, sender=QueueState, dispatch_uid="django_jobs.size_limits.deleted")

"""Reading the event log: ``django_jobs.events(after=cursor, queue=None)`` pages forward,
``django_jobs.follow_events()`` follows it live.

Events are written by the engine in the transaction that makes the change (docs/reference/
events.md lists the kinds and their data). Pages are ordered by ``(txid, id)`` and a cursor
names the last event a page returned, so a reader that stores its cursor never misses an event
nor sees one twice:

* PostgreSQL hands out ids before commit, so an event with a smaller id can commit after a
  reader passed it. Each event carries its transaction's id (``txid``); a page returns only
  events of transactions older than every transaction still running in this database, so
  nothing can later commit before the cursor. A running transaction holds the page back
  until it ends (typically milliseconds).
* SQLite has one writer at a time: ids commit in order and ``txid`` is 0.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Q
from django.tasks import task_backends

from .drivers import driver
from .engine import events_channel
from .exceptions import InvalidEventCursor
from .models import Event

__all__ = ["EventPage", "InvalidEventCursor", "events", "follow_events"]

_CURSOR_RE = re.compile(r"^(\d{1,19})\.(\d{1,19})$")
MAX_LIMIT = 10_000


@dataclass(frozen=True)
class EventPage:
    #: Event model instances, oldest first.
    events: list[Any]
    #: Pass as ``after=`` for the next page (the same cursor again when the page was empty).
    cursor: str


def _parse(after: str | None) -> tuple[int, int]:
    if after is None:
        return (-1, -1)
    match = _CURSOR_RE.match(after) if isinstance(after, str) else None
    if match is None:
        raise InvalidEventCursor(
            f'Event cursor {after!r} is malformed: pass the cursor of an earlier page, "latest" or None.'
        )
    return int(match[1]), int(match[2])


def _horizon(using: str) -> int | None:
    """Events of transactions below this id are all committed or gone (the writer's
    transaction id orders events where the driver has one); None elsewhere."""
    d = driver(using)
    with d.connection.cursor() as cursor:
        return d.events_horizon(cursor)


def events(
    after: str | None = None,
    *,
    queue: str | None = None,
    job: Any = None,
    kinds: list[str] | None = None,
    limit: int = 100,
    backend: str = "default",
) -> EventPage:
    """The next ``limit`` events after ``after`` (None: from the oldest kept; ``"latest"``: none,
    only a cursor at the end of the log, for a reader that wants what happens from now on).

    ``queue``, ``job`` (a result id) and ``kinds`` filter; the cursor still moves over the whole
    log, so the next call goes on from where this one stopped.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT}; got {limit!r}.")
    if isinstance(kinds, str):
        kinds = [kinds]
    using = task_backends[backend].database
    horizon = _horizon(using)
    rows = Event.objects.using(using)
    upper = None
    if horizon is not None:
        rows = rows.filter(txid__lt=horizon)
    else:
        # SQLite: the newest id now bounds both reads of this call, so an event that commits
        # between them is left for the next call rather than skipped by the cursor.
        upper = rows.order_by("-id").values_list("id", flat=True).first() or 0
    if after == "latest":
        last = rows.order_by("-txid", "-id").values_list("txid", "id").first()
        return EventPage([], f"{last[0]}.{last[1]}" if last else "0.0")
    txid, last_id = _parse(after)
    # txid >= t bounds the index range; the OR alone would make the database walk from the start.
    unread = rows.filter(txid__gte=txid).filter(Q(txid__gt=txid) | Q(txid=txid, id__gt=last_id))
    if upper is not None:
        unread = unread.filter(id__lte=upper)
    rows = unread
    if queue is not None:
        rows = rows.filter(queue=queue)
    if job is not None:
        try:
            rows = rows.filter(job_id=uuid.UUID(str(job)))
        except ValueError:
            raise ValueError(f"job must be a job id; got {job!r}.") from None
    if kinds:
        rows = rows.filter(kind__in=list(kinds))
    page = list(rows.order_by("txid", "id")[:limit])
    if page:
        cursor = f"{page[-1].txid}.{page[-1].id}"
    else:
        # Nothing (matching) yet: move past what was read, so a filtered reader does not walk
        # the same events again next time.
        last = unread.order_by("-txid", "-id").values_list("txid", "id").first() if queue or job or kinds else None
        cursor = f"{last[0]}.{last[1]}" if last else (after or "0.0")
    return EventPage(page, cursor)


def follow_events(
    after: str | None = "latest",
    *,
    queue: str | None = None,
    kinds: list[str] | None = None,
    poll: float = 1.0,
    backend: str = "default",
    stop: Any = None,
) -> Iterator[Any]:
    """Yield events as they commit, forever (or until ``stop()`` returns true). On PostgreSQL it
    LISTENs on the events channel and reads as soon as a transaction with events commits;
    elsewhere, and as a fallback, it polls every ``poll`` seconds."""
    using = task_backends[backend].database
    listener = None
    if driver(using).LISTEN_NOTIFY:
        listener = connections.create_connection(using)
        listener.ensure_connection()
        listener.connection.autocommit = True
        listener.connection.execute(f"LISTEN {events_channel()}")
    cursor = after
    try:
        while stop is None or not stop():
            page = events(cursor, queue=queue, kinds=kinds, limit=500, backend=backend)
            cursor = page.cursor
            yield from page.events
            if len(page.events) == 500:
                continue
            if listener is not None:
                for _ in listener.connection.notifies(timeout=poll, stop_after=1):
                    pass
            else:
                time.sleep(poll)
    finally:
        if listener is not None:
            listener.close()

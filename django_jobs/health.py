"""Health checks for probes and monitors: ``manage.py jobs health`` and :func:`django_jobs.views.health`.

Four checks, each a few cheap reads (docs/howto/health-checks.md):

* ``database``: the jobs database of the backend answers a one-row read of the worker table.
* ``workers``: at least ``min_workers`` workers of the backend (on ``host``, or on any host)
  heartbeat; a heartbeat older than three leases is stale, as in :func:`console.workers`.
* ``wait``: in every queue that is not paused, the oldest ready job has waited at most its
  threshold (``max_wait``, or that queue's own). One GROUP BY over the ready rows.
* ``rescues`` (only with ``max_rescues``): at most that many ``stalled`` events in the last
  ``window_minutes``. It reads the event log, so it needs the EVENTS setting on.

Nothing here counts the job table's history, and nothing in a report names a job or its
arguments: a report holds counts, ages, queue names and the host name asked for.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import Error as DatabaseError
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend
from django.utils import timezone

from .backend import JobsBackend
from .conf import get_settings
from .console import workers
from .exceptions import InvalidHealthOption, InvalidQueueName
from .models import Event, Job, QueueState, Worker
from .spec.queues import validate_queue_name

__all__ = ["Check", "Health", "HealthOptions", "check_health", "health_options", "this_host"]

#: The defaults of the options (docs/howto/health-checks.md).
MIN_WORKERS = 1
MAX_WAIT_SECONDS = 300.0
WINDOW_MINUTES = 15.0
#: Upper bounds that catch a typo (a wait in milliseconds, a window in seconds).
MOST_WORKERS = 100_000
MOST_WAIT_SECONDS = 30 * 86_400.0
MOST_WINDOW_MINUTES = 7 * 1440.0
#: The event kind the rescues check counts: one per job whose lease expired (docs/reference/events.md).
RESCUE_KINDS = ["stalled"]


def this_host() -> str:
    """This machine's name as a worker started here registers it (``engine.register_worker``)."""
    return socket.gethostname()[:255]


@dataclass(frozen=True)
class HealthOptions:
    """Validated thresholds; build them with :func:`health_options`."""

    min_workers: int = MIN_WORKERS
    #: The host whose workers count; None: every host.
    host: str | None = None
    #: Seconds the oldest ready job of a queue may wait; None: no limit.
    max_wait: float | None = MAX_WAIT_SECONDS
    #: Per-queue overrides of ``max_wait`` (None: no limit for that queue).
    max_wait_per_queue: dict[str, float | None] = field(default_factory=dict)
    #: Most ``stalled`` events allowed in the window; None: the rescues check is off.
    max_rescues: int | None = None
    window_minutes: float = WINDOW_MINUTES

    def wait_limit(self, queue: str) -> float | None:
        return self.max_wait_per_queue.get(queue, self.max_wait)


def health_options(
    *,
    min_workers: Any = MIN_WORKERS,
    host: Any = None,
    max_wait: Iterable[Any] = (),
    max_rescues: Any = None,
    window: Any = None,
    backend: str = "default",
) -> HealthOptions:
    """Validate the options as given on a command line or in a query string (strings or numbers).

    ``max_wait`` items are ``SECONDS``, ``QUEUE=SECONDS`` or either with ``off`` for the seconds;
    ``window`` (minutes) needs ``max_rescues``, which needs the EVENTS setting on. Raises
    :class:`~django_jobs.exceptions.InvalidHealthOption` saying which option is wrong and what it takes.
    """
    limits: dict[str | None, float | None] = {}
    for item in max_wait:
        queue, _, seconds = str(item).rpartition("=")
        name = queue or None
        if name is not None:
            try:
                validate_queue_name(name)
            except InvalidQueueName as exc:
                raise InvalidHealthOption(f"max-wait {item!r}: {exc}") from None
        if name in limits:
            raise InvalidHealthOption(
                f"max-wait is given twice for {'queue ' + repr(name) if name else 'every queue'}."
            )
        if seconds.strip().lower() == "off":
            limits[name] = None
        else:
            limits[name] = _number(seconds, f"max-wait {item!r}", "seconds (or off)", MOST_WAIT_SECONDS)
    if host is not None and (not isinstance(host, str) or not 1 <= len(host) <= 255 or not host.isprintable()):
        raise InvalidHealthOption(f"host must be a host name of 1-255 printable characters; got {host!r}.")
    if max_rescues is None and window is not None:
        raise InvalidHealthOption("window needs max-rescues: it is the time over which rescues are counted.")
    if max_rescues is not None and not get_settings(backend).EVENTS:
        raise InvalidHealthOption("max-rescues reads the event log: turn the EVENTS setting on, or leave it out.")
    return HealthOptions(
        min_workers=_integer(min_workers, "min-workers", MOST_WORKERS),
        host=host,
        max_wait=limits.pop(None, MAX_WAIT_SECONDS),
        max_wait_per_queue=limits,  # type: ignore[arg-type]  # None was popped
        max_rescues=None if max_rescues is None else _integer(max_rescues, "max-rescues", MOST_WORKERS),
        window_minutes=WINDOW_MINUTES
        if window is None
        else _number(window, f"window {window!r}", "minutes", MOST_WINDOW_MINUTES),
    )


def _integer(value: Any, name: str, most: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        number = -1
    if not 0 <= number <= most:
        raise InvalidHealthOption(f"{name} must be a whole number from 0 to {most:,}; got {value!r}.")
    return number


def _number(text: Any, name: str, unit: str, most: float) -> float:
    try:
        number = float(str(text).strip())
    except ValueError:
        number = math.nan
    if not 0 < number <= most:  # False for NaN too
        raise InvalidHealthOption(f"{name}: give a number of {unit} above 0 and at most {most:,g}.")
    return number


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``message`` is one line for a person, ``data`` its figures (JSON)."""

    name: str
    ok: bool
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    #: The database error's own first line, for the command's output and the view's log only:
    #: it may name hosts and users, so :meth:`Health.as_json` leaves it out.
    cause: str = ""


@dataclass(frozen=True)
class Health:
    backend: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[str]:
        """One line per failed check, naming it and what failed."""
        return [f"{c.name}: {c.message}" + (f": {c.cause}" if c.cause else "") for c in self.checks if not c.ok]

    def as_json(self) -> dict[str, Any]:
        """``{"status": "ok" | "fail", "backend": alias, "checks": {name: {"ok", "message", ...}}}``."""
        return {
            "status": "ok" if self.ok else "fail",
            "backend": self.backend,
            "checks": {c.name: {"ok": c.ok, "message": c.message, **c.data} for c in self.checks},
        }


def database_of(backend: str) -> str:
    """The database alias of a django-jobs backend; InvalidHealthOption for any other alias."""
    try:
        found = task_backends[backend]
    except InvalidTaskBackend:
        found = None
    if not isinstance(found, JobsBackend):
        raise InvalidHealthOption(f"backend {backend!r} is not a django-jobs backend in TASKS.")
    return found.database


def check_health(options: HealthOptions, *, backend: str = "default", now: datetime | None = None) -> Health:
    """Run the checks on ``backend``'s database. When the database does not answer, the other
    checks are not run. Raises InvalidHealthOption for an alias that is not a django-jobs backend."""
    using = database_of(backend)
    try:
        Worker.objects.using(using).order_by().exists()
    except DatabaseError as exc:
        message = f"database {using!r} unreachable ({type(exc).__name__})"
        return Health(backend, [Check("database", False, message, cause=_first_line(exc))])
    now = now or timezone.now()
    checks = [Check("database", True, f"database {using!r} answers")]
    steps = [_workers, _wait] + ([_rescues] if options.max_rescues is not None else [])
    for step in steps:
        try:
            checks.append(step(options, using, backend, now))
        except DatabaseError as exc:
            name = step.__name__.strip("_")
            checks.append(Check(name, False, f"could not be read ({type(exc).__name__})", cause=_first_line(exc)))
    return Health(backend, checks)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:500]


def _workers(options: HealthOptions, using: str, backend: str, now: datetime) -> Check:
    found = workers(using=using, backend=backend, now=now)
    rows = [w for w in found.rows if options.host is None or w.hostname == options.host]
    fresh = sum(1 for w in rows if not w.stale)
    where = f"on {options.host}" if options.host else "on any host"
    data = {"host": options.host, "fresh": fresh, "stale": len(rows) - fresh, "min": options.min_workers,
            "stale_after_seconds": found.stale_after.total_seconds()}  # fmt: skip
    ok = fresh >= options.min_workers
    heartbeat = f"heartbeat within {found.stale_after.total_seconds():g}s"
    message = f"{fresh} worker(s) {where} {'' if ok else 'only '}{heartbeat}, {options.min_workers} required"
    return Check("workers", ok, message, data)


def _wait(options: HealthOptions, using: str, backend: str, now: datetime) -> Check:
    oldest = Job.objects.using(using).oldest_ready_by_queue(backend)
    paused = {name for name, state in QueueState.objects.using(using).by_name().items() if state.paused}
    queues: dict[str, dict[str, Any]] = {}
    late = []
    for name in sorted(oldest):
        age = max(now - oldest[name], timedelta(0)).total_seconds()
        limit = options.wait_limit(name)
        ok = name in paused or limit is None or age <= limit
        queues[name] = {"oldest_seconds": round(age, 3), "max_seconds": limit, "paused": name in paused, "ok": ok}
        if not ok:
            late.append(f"{name} {age:.0f}s > {limit:g}s")
    if late:
        return Check("wait", False, "oldest ready job waited too long in " + ", ".join(late), {"queues": queues})
    return Check("wait", True, f"{len(queues)} queue(s) with ready jobs, none waited too long", {"queues": queues})


def _rescues(options: HealthOptions, using: str, backend: str, now: datetime) -> Check:
    since = now - timedelta(minutes=options.window_minutes)
    count = Event.objects.using(using).count_since(RESCUE_KINDS, since)
    assert options.max_rescues is not None  # the step runs only then
    ok = count <= options.max_rescues
    data = {"count": count, "max": options.max_rescues, "window_minutes": options.window_minutes}
    message = (
        f"{count} job(s) stalled in the last {options.window_minutes:g} min, at most {options.max_rescues} allowed"
    )
    return Check("rescues", ok, message, data)

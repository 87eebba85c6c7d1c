"""Schedules as declared: a cron expression or a fixed interval, a timezone, a start, an end, a
limit and the job template, validated; and the ticks they give (the next runs, in UTC).

Declared in code (``DJANGO_JOBS["SCHEDULES"]``, a backend's ``OPTIONS["SCHEDULES"]``,
``@task(schedule=...)``) or at run time (``django_jobs.schedule()``, the admin). Part of
:mod:`django_jobs.spec` (no models): the Schedule model validates its form here, the backend
registers a task's ``schedule=``; saving, syncing and firing schedules is
:mod:`django_jobs.schedules`, a layer up. See docs/howto/schedules.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.tasks import Task
from django.utils import timezone as dj_timezone
from django.utils.module_loading import autodiscover_modules

from ..conf import get_settings
from ..exceptions import InvalidSchedule, JobsError
from .payload import check_json
from .queues import validate_queue_name
from .tasks import resolve_task

__all__ = [
    "CATCH_UPS", "SPEC_KEYS", "declaration_fields", "declared_schedules", "first_tick", "next_runs",
    "register_task_schedule", "ticks_after", "validate_spec", "zone",
]  # fmt: skip

#: Keys a schedule declaration may have (DJANGO_JOBS["SCHEDULES"][name] and schedule()).
SPEC_KEYS = frozenset(
    {"task", "cron", "every", "offset", "timezone", "args", "kwargs", "queue", "priority", "options", "start",
     "end", "limit", "catch_up", "enabled"}
)  # fmt: skip
CATCH_UPS = ("latest", "all", "none")


# -- validation ----------------------------------------------------------------------------------


def validate_spec(
    *,
    cron: str | None,
    every: float | None,
    offset: float = 0,
    timezone: str = "UTC",
    start: datetime | None = None,
    end: datetime | None = None,
    task_path: str | None = None,
    catch_up: str = "latest",
    limit: Any = None,
) -> None:
    """Raise InvalidSchedule with the reason when the schedule cannot work."""
    if (cron is None) == (every is None):
        raise InvalidSchedule("Give exactly one of cron (an expression) or every (seconds).")
    if cron is not None:
        _check_cron(cron)
    if every is not None and (
        not isinstance(every, (int, float)) or isinstance(every, bool) or not math.isfinite(every) or every <= 0
    ):
        raise InvalidSchedule(f"every must be a number of seconds > 0; got {every!r}.")
    if not isinstance(offset, (int, float)) or isinstance(offset, bool) or not math.isfinite(offset) or offset < 0:
        raise InvalidSchedule(f"offset must be a number of seconds >= 0; got {offset!r}.")
    zone(timezone)
    for name, value in (("start", start), ("end", end)):
        if value is not None and (not isinstance(value, datetime) or dj_timezone.is_naive(value)):
            raise InvalidSchedule(f"{name} must be an aware datetime; got {value!r}.")
    if start is not None and end is not None and end <= start:
        raise InvalidSchedule(f"end ({end.isoformat()}) must be after start ({start.isoformat()}).")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise InvalidSchedule(f"limit must be an integer >= 1 or None; got {limit!r}.")
    if catch_up not in CATCH_UPS:
        raise InvalidSchedule(f"catch_up must be one of {', '.join(CATCH_UPS)}; got {catch_up!r}.")
    if task_path is not None:
        try:
            resolve_task(task_path)
        except JobsError as exc:
            raise InvalidSchedule(str(exc)) from None


def _check_cron(expr: Any) -> None:
    if not isinstance(expr, str) or len(expr.split()) not in (5, 6):
        raise InvalidSchedule(
            f"cron must be 5 fields (minute hour day month weekday) or 6 with seconds first; got {expr!r}."
        )
    try:
        _croniter()(expr, datetime(2026, 1, 1, tzinfo=UTC), second_at_beginning=True).get_next(datetime)
    except Exception as exc:  # noqa: BLE001 - croniter raises several types for a bad expression
        raise InvalidSchedule(f"Invalid cron expression {expr!r}: {exc}") from None


def _croniter() -> Any:
    """croniter's class, imported on first use: it and dateutil, which it imports, are 2.5 MiB
    of every process's memory (a worker's included), which a project without a cron schedule
    need not hold."""
    from croniter import croniter  # on first use (the docstring says why)

    return croniter


def zone(name: Any) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise InvalidSchedule(f"timezone must be an IANA name such as 'Europe/Paris'; got {name!r}.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(f"Unknown timezone {name!r}; use an IANA name such as 'Europe/Paris' or 'UTC'.") from None


# -- ticks ---------------------------------------------------------------------------------------


def ticks_after(sched: Any, after: datetime) -> Iterator[datetime]:
    """The schedule's ticks strictly after ``after``, in order, as aware UTC datetimes, within
    its start and end (its limit is the caller's business)."""
    start, end = sched.start_at, sched.end_at
    if start is not None and after < start:
        after = start - timedelta(microseconds=1)
    if sched.cron:
        source = _cron_ticks(sched.cron, zone(sched.timezone), after)
    else:
        source = _interval_ticks(sched.every_seconds, sched.offset_seconds or 0.0, start, after)
    for tick in source:
        if end is not None and tick > end:
            return
        yield tick


def _cron_ticks(expr: str, tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    start = after.astimezone(tz)
    it = _croniter()(expr, start, second_at_beginning=True)
    # Starting from a tick already fired: its wall time counts as seen.
    previous_wall = start.replace(tzinfo=None)
    while True:
        local = it.get_next(datetime)
        # On a fall-back night a wall-clock time happens twice (02:30 +02:00, then +01:00):
        # fire it once. On a spring-forward night croniter moves a missing time to the first
        # existing one (02:30 -> 03:00), so it runs once too.
        wall = local.replace(tzinfo=None)
        if wall == previous_wall:
            continue
        previous_wall = wall
        yield local.astimezone(UTC)


def _interval_ticks(every: float, offset: float, start: datetime | None, after: datetime) -> Iterator[datetime]:
    anchor = (start or datetime(1970, 1, 1, tzinfo=UTC)) + timedelta(seconds=offset)
    step = timedelta(seconds=every)
    if after < anchor:
        k = 0
    else:
        k = int((after - anchor) / step) + 1
    while True:
        tick = anchor + k * step
        if tick > after:
            yield tick.astimezone(UTC)
        k += 1


def first_tick(sched: Any, now: datetime) -> datetime | None:
    """The first tick a new (or re-timed) schedule fires: the first one after ``now``."""
    return next(ticks_after(sched, now), None)


#: The timing fields :func:`next_runs` reads (Schedule columns), and the defaults of missing ones.
_TIMING_DEFAULTS: dict[str, Any] = {
    "cron": None,
    "every_seconds": None,
    "offset_seconds": 0.0,
    "timezone": "UTC",
    "start_at": None,
    "end_at": None,
    "limit": None,
    "iterations": 0,
    "next_run_at": None,
}


def next_runs(sched: Any, n: int = 5, now: datetime | None = None) -> list[datetime]:
    """The next ``n`` times the schedule fires, as aware UTC datetimes (a preview: the admin).

    ``sched``: a Schedule row, or a dict (or any object) with its timing fields: ``cron`` or
    ``every_seconds``, and optionally ``offset_seconds``, ``timezone``, ``start_at``, ``end_at``,
    ``limit``, ``iterations``, ``next_run_at``. A saved schedule's next run is its
    ``next_run_at`` (possibly overdue); without one the runs start at the first tick after
    ``now``, as a new schedule's would. Within its start and end and what is left of its
    limit. Raises InvalidSchedule when the timing cannot work. An unsaved or disabled schedule
    gets its times all the same (whether it fires is the caller's to say).
    """
    if isinstance(sched, dict):
        fields = {**_TIMING_DEFAULTS, **sched}
    else:
        fields = {name: getattr(sched, name, default) for name, default in _TIMING_DEFAULTS.items()}
    validate_spec(
        cron=fields["cron"] or None,
        every=fields["every_seconds"],
        offset=fields["offset_seconds"] or 0,
        timezone=fields["timezone"],
        start=fields["start_at"],
        end=fields["end_at"],
    )
    timing = SimpleNamespace(**fields)
    now = now or dj_timezone.now()
    left = n if fields["limit"] is None else min(n, max(fields["limit"] - (fields["iterations"] or 0), 0))
    runs: list[datetime] = []
    following = fields["next_run_at"] or first_tick(timing, now)
    while following is not None and len(runs) < left:
        runs.append(following)
        following = next(ticks_after(timing, following), None)
    return runs


#: Schedules declared with ``@task(schedule=...)``: {backend: {name: declaration}}, filled as
#: task modules are imported.
_TASK_SCHEDULES: dict[str, dict[str, dict[str, Any]]] = {}


def register_task_schedule(task: Any) -> None:
    """Record the ``schedule=`` of a task made by ``@task`` (called by JobTask on creation).

    ``schedule`` is a cron expression (str), an interval (seconds or a timedelta), or a dict of
    the SCHEDULES options without ``task`` (plus an optional ``name``; default: the task's
    dotted path). Validated here, so a bad one fails at import with InvalidSchedule. Copies
    made by ``.using()`` keep the decorator's declaration (the first one registered wins).
    """
    spec = task.schedule
    if isinstance(spec, str):
        raw: dict[str, Any] = {"cron": spec}
    elif isinstance(spec, (int, float, timedelta)) and not isinstance(spec, bool):
        raw = {"every": spec}
    elif isinstance(spec, dict):
        raw = dict(spec)
    else:
        raise InvalidSchedule(
            f"{task.module_path}: schedule must be a cron expression ('*/5 * * * *'), an interval (seconds or a "
            f"timedelta) or a dict of schedule options; got {spec!r}."
        )
    if "task" in raw:
        raise InvalidSchedule(f"{task.module_path}: schedule= must not name a task; it runs the decorated one.")
    name = raw.pop("name", None) or task.module_path
    raw["task"] = task.module_path
    declaration_fields(name, raw, resolve=False)
    declared = _TASK_SCHEDULES.setdefault(task.backend, {})
    if name not in declared:
        declared[name] = raw


def declared_schedules(backend: str) -> dict[str, Any]:
    """The schedules declared in code for ``backend``: those of ``@task(schedule=...)`` (task
    modules of installed apps are imported first), then its ``OPTIONS["SCHEDULES"]``, else (for
    the ``"default"`` backend only) ``DJANGO_JOBS["SCHEDULES"]``; a settings entry wins over a
    task's of the same name. A global declaration belongs to one backend, so projects with several
    backends do not fire each tick once per backend."""
    autodiscover_modules("tasks")  # each app's tasks.py, where @task(schedule=...) is declared
    options = (getattr(settings, "TASKS", {}).get(backend) or {}).get("OPTIONS") or {}
    if "SCHEDULES" in options:
        from_settings = options["SCHEDULES"] or {}
    else:
        from_settings = (get_settings().SCHEDULES or {}) if backend == "default" else {}
    return {**_TASK_SCHEDULES.get(backend, {}), **from_settings}


def declaration_fields(name: Any, raw: Any, *, resolve: bool = True) -> dict[str, Any]:
    """Validated model fields of one declaration (``resolve=False``: the task is being defined,
    so its path cannot be imported yet)."""
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise InvalidSchedule(f"A schedule name is 1-200 characters; got {name!r}.")
    if not isinstance(raw, dict):
        raise InvalidSchedule(f"Schedule {name!r} must be a dict of options; got {type(raw).__name__}.")
    unknown = set(raw) - SPEC_KEYS
    if unknown:
        raise InvalidSchedule(f"Schedule {name!r}: unknown option(s) {sorted(unknown)}; allowed: {sorted(SPEC_KEYS)}.")
    task = raw.get("task")
    task_path = task.module_path if isinstance(task, Task) else task
    if not isinstance(task_path, str):
        raise InvalidSchedule(f"Schedule {name!r} needs task: a @task function or its dotted path.")
    args, kwargs = raw.get("args", []), raw.get("kwargs", {})
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        raise InvalidSchedule(f"Schedule {name!r}: args must be a list and kwargs a dict.")
    try:
        check_json(list(args), "args")
        check_json(kwargs, "kwargs")
        if raw.get("queue") is not None:
            validate_queue_name(raw["queue"])
    except JobsError as exc:
        raise InvalidSchedule(f"Schedule {name!r}: {exc}") from None
    options = raw.get("options", {}) or {}
    if not isinstance(options, dict) or set(options) - {"max_attempts", "backoff", "timeout", "lifo", "partition"}:
        raise InvalidSchedule(
            f"Schedule {name!r}: options may hold max_attempts, backoff, timeout, lifo and partition; got {options!r}."
        )
    priority = raw.get("priority")
    if priority is not None and (
        not isinstance(priority, int) or isinstance(priority, bool) or not -100 <= priority <= 100
    ):
        raise InvalidSchedule(f"Schedule {name!r}: priority must be an integer -100..100; got {priority!r}.")
    every = raw.get("every")
    if isinstance(every, timedelta):
        every = every.total_seconds()
    try:
        validate_spec(
            cron=raw.get("cron"),
            every=every,
            offset=raw.get("offset", 0),
            timezone=raw.get("timezone", "UTC"),
            start=raw.get("start"),
            end=raw.get("end"),
            task_path=task_path if resolve else None,
            catch_up=raw.get("catch_up", "latest"),
            limit=raw.get("limit"),
        )
    except InvalidSchedule as exc:
        raise InvalidSchedule(f"Schedule {name!r}: {exc}") from None
    return {
        "task_path": task_path,
        "args": list(args),
        "kwargs": dict(kwargs),
        "queue": raw.get("queue"),
        "priority": priority,
        "options": dict(options),
        "cron": raw.get("cron"),
        "every_seconds": float(every) if every is not None else None,
        "offset_seconds": float(raw.get("offset", 0)),
        "timezone": raw.get("timezone", "UTC"),
        "start_at": raw.get("start"),
        "end_at": raw.get("end"),
        "limit": raw.get("limit"),
        "catch_up": raw.get("catch_up", "latest"),
        "enabled": bool(raw.get("enabled", True)),
    }

"""Schedules: enqueue a job at every tick of a cron expression or a fixed interval.

Declared in code (``DJANGO_JOBS["SCHEDULES"]``, synced to the ``Schedule`` table when a worker
starts) or at run time (:func:`schedule`, the admin). Every worker runs the ``Scheduler``
service; each tick is fired once however many do: a compare-and-set on ``next_run_at`` in the
same transaction as the job's insert, and a unique ``Job.scheduler_key`` per (schedule, tick).
What a declaration may say, and the ticks it gives, is :mod:`django_jobs.spec.schedules`
(re-exported here). See docs/howto/schedules.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone as dj_timezone

from . import engine
from .conf import get_settings
from .exceptions import InvalidSchedule
from .models import Schedule
from .spec.newjob import NewJob
from .spec.options import job_fields
from .spec.schedules import (
    _TASK_SCHEDULES,  # noqa: F401 - the registry, importable from here as before (tests reset it)
    CATCH_UPS,
    SPEC_KEYS,
    declaration_fields,
    declared_schedules,
    first_tick,
    next_runs,
    register_task_schedule,
    ticks_after,
    validate_spec,
    zone,
)
from .spec.tasks import resolve_task
from .spec.tracing import new_trace_id

__all__ = [
    "CATCH_UPS", "SPEC_KEYS", "InvalidSchedule", "declaration_fields", "declared_schedules", "first_tick", "next_runs",
    "register_task_schedule", "run_now", "schedule", "sync_schedules", "ticks_after", "unschedule", "validate_spec",
    "zone",
]  # fmt: skip

logger = logging.getLogger("django_jobs.schedules")

#: Most ticks one run of the scheduler fires for one schedule (catch_up="all" after downtime).
MAX_TICKS_PER_RUN = 1000


# -- the public API ------------------------------------------------------------------------------


def run_now(sched: Any, *, now: datetime | None = None) -> Any:
    """Enqueue one job from ``sched``'s template at once, outside its ticks, and return the Job.

    The job is what a tick would enqueue (task, arguments, queue, priority, options) without a
    ``scheduler_key``, so it never takes the unique key of a tick; the schedule's ``next_run_at``,
    ``iterations`` and ``limit`` are left alone. Raises QueueFull when the queue is at its size
    limit, TaskNotFound when the task path does not resolve.
    """
    now = now or dj_timezone.now()
    return engine.insert_job(_job_for(sched), using=_database(sched.backend), now=now)


def schedule(name: str, task: Any, **spec: Any) -> Any:
    """Create or update the schedule ``name`` at run time and return its ``Schedule`` row.

    ``task``: a ``@task`` function (or its dotted path). ``spec``: ``cron`` (5 fields, or 6 with
    seconds first) or ``every`` (seconds) with ``offset``; ``timezone`` (IANA name, default
    UTC); ``args``, ``kwargs``, ``queue``, ``priority``, ``options`` (django-jobs task options);
    ``start``, ``end`` (aware datetimes), ``limit`` (ticks); ``catch_up`` ("latest", "all",
    "none"); ``enabled``; ``backend`` (default "default"). Raises InvalidSchedule, saving nothing.
    A worker's sync leaves a schedule edited here alone even when it is also declared in code.
    """
    backend = spec.pop("backend", "default")
    fields = declaration_fields(name, {"task": task, **spec})
    return _save(backend, name, fields, source="runtime")


def unschedule(name: str, *, backend: str = "default") -> bool:
    """Delete the schedule ``name``; False when there was none. Jobs it enqueued stay."""
    deleted, _ = Schedule.objects.using(_database(backend)).filter(backend=backend, name=name).delete()
    return bool(deleted)


def sync_schedules(backend: str = "default", now: datetime | None = None) -> dict[str, int]:
    """Bring the code declarations (``SCHEDULES`` of ``backend``) into the table (worker start).

    New ones are created. A declaration that changed since its last sync updates its row, unless
    the row was edited at run time since (then the runtime edit stays, with a warning). Rows
    declared in code before but not any more are disabled, not deleted (their history stays).
    """
    declared = declared_schedules(backend)
    using = _database(backend)
    counts = {"created": 0, "updated": 0, "kept_runtime_edit": 0, "disabled": 0}
    now = now or dj_timezone.now()
    for name, raw in declared.items():
        fields = declaration_fields(name, raw)
        digest = hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()
        row = Schedule.objects.using(using).filter(backend=backend, name=name).first()
        if row is None:
            _save(backend, name, fields, source="code", code_hash=digest, now=now)
            counts["created"] += 1
        elif row.code_hash != digest:
            if row.edited_at is not None and (row.synced_at is None or row.edited_at > row.synced_at):
                logger.warning(
                    "Schedule %r changed in code, but it was edited at run time since the last sync; keeping the "
                    "runtime version (delete its row to take the code's at the next worker start).",
                    name,
                )
                counts["kept_runtime_edit"] += 1
                continue
            _save(backend, name, fields, source="code", code_hash=digest, now=now)
            counts["updated"] += 1
    gone = (
        Schedule.objects.using(using)
        .filter(backend=backend, source="code", enabled=True)
        .exclude(name__in=list(declared))
    )
    # Forget the declaration's hash: put back in code, it is synced (and enabled) again.
    counts["disabled"] = gone.update(enabled=False, code_hash=None)
    return counts


def _database(backend: str) -> str:
    return get_settings(backend).DATABASE


def _save(
    backend: str,
    name: str,
    fields: dict[str, Any],
    *,
    source: str,
    code_hash: str | None = None,
    now: datetime | None = None,
) -> Any:
    now = now or dj_timezone.now()
    using = _database(backend)
    with transaction.atomic(using=using):
        row = Schedule.objects.using(using).select_for_update().filter(backend=backend, name=name).first()
        timing = ("cron", "every_seconds", "offset_seconds", "timezone", "start_at", "end_at")
        retimed = row is None or any(getattr(row, f) != fields[f] for f in timing)
        row = row or Schedule(backend=backend, name=name)
        for key, value in fields.items():
            setattr(row, key, value)
        row.source = source
        if source == "code":
            row.code_hash, row.synced_at = code_hash, now
        else:
            row.edited_at = now
        if retimed:
            row.next_run_at = first_tick(row, now)
        row.save(using=using)
    return row


# -- firing (the Scheduler service) ----------------------------------------------------------------


def fire_due(*, backend: str, now: datetime | None = None, grace: float = 60.0, limit: int = 100) -> dict[str, int]:
    """Fire the due ticks of ``backend``'s enabled schedules; return counts.

    Ticks due within ``grace`` seconds are late and all fire; older ones were missed (the
    workers were down) and the schedule's ``catch_up`` decides: ``latest`` fires the latest
    missed tick once, ``all`` fires each (at most MAX_TICKS_PER_RUN per run), ``none`` none.
    """
    now = now or dj_timezone.now()
    using = _database(backend)
    counts = {"fired": 0, "skipped": 0, "refused": 0, "lost_race": 0, "failed": 0}
    due_rows = list(
        Schedule.objects.using(using)
        .filter(backend=backend, enabled=True, next_run_at__lte=now)
        .order_by("next_run_at")[:limit]
    )
    for sched in due_rows:
        try:
            _fire(sched, using, now, grace, counts)
        except Exception:  # noqa: BLE001 - one broken schedule must not stop the others
            counts["failed"] += 1
            logger.exception("Schedule %r (%s) could not fire its tick %s; skipping that tick.", sched.name,
                             sched.task_path, sched.next_run_at)  # fmt: skip
            nxt = next(ticks_after(sched, max(now, sched.next_run_at)), None)
            engine.advance_schedule(using=using, schedule_id=sched.pk, due=sched.next_run_at, next_run_at=nxt, job=None)
    return counts


def _fire(sched: Any, using: str, now: datetime, grace: float, counts: dict[str, int]) -> None:
    """Fire (or skip, by its catch-up policy) one schedule's due ticks, from its next_run_at."""
    ticks = [sched.next_run_at]
    for tick in ticks_after(sched, sched.next_run_at):
        if tick > now or len(ticks) > MAX_TICKS_PER_RUN:
            following = tick
            break
        ticks.append(tick)
    else:
        following = None
    missed = [t for t in ticks if t < now - timedelta(seconds=grace)]
    late = [t for t in ticks if t >= now - timedelta(seconds=grace)]
    keep = set(late)
    if missed and sched.catch_up == "all":
        keep |= set(missed)
    elif missed and sched.catch_up == "latest":
        keep.add(missed[-1])
    fired = sched.iterations
    for i, tick in enumerate(ticks):
        nxt = natural = ticks[i + 1] if i + 1 < len(ticks) else following
        fire = tick in keep
        if fire and sched.limit is not None and fired >= sched.limit:
            fire, nxt = False, None  # the limit is reached: the schedule is done
        if fire and nxt is not None and sched.limit is not None and fired + 1 >= sched.limit:
            nxt = None
        job, key = (_job_for(sched), _tick_key(sched, tick)) if fire else (None, None)
        done = engine.advance_schedule(
            using=using, schedule_id=sched.pk, due=tick, next_run_at=nxt, job=job, scheduler_key=key,
            next_if_refused=natural, now=now,
        )  # fmt: skip
        if done is None:
            counts["lost_race"] += 1
            break  # another worker fired it; its run carries on from here
        counts[done] += 1
        fired += int(done == "fired")
        if done == "refused":
            nxt = natural  # a refused tick does not count against the limit
        if nxt is None:
            break


def _job_for(sched: Any) -> NewJob:
    """The job a schedule's tick (or :func:`run_now`) enqueues: the template, as enqueue would
    store it, due at once."""
    task = resolve_task(sched.task_path)
    changes: dict[str, Any] = {"backend": sched.backend, **sched.options}
    if sched.queue:
        changes["queue_name"] = sched.queue
    if sched.priority is not None:
        changes["priority"] = sched.priority
    task = task.using(**changes)
    max_attempts, options = job_fields(task, default_max_attempts=get_settings(sched.backend).MAX_ATTEMPTS)
    job = NewJob.for_task(
        task,
        backend=sched.backend,
        args=list(sched.args),
        kwargs=dict(sched.kwargs),
        max_attempts=max_attempts,
        options=options,
        trace_id=new_trace_id(),
    )
    # Due at the tick: a run_after the task carries (a module-level .using()) is not waited for.
    return job if job.run_after is None else replace(job, run_after=None)


def _tick_key(sched: Any, tick: datetime) -> str:
    """The ``scheduler_key`` of ``sched``'s job for ``tick``: unique, so a tick fires once."""
    return f"{sched.pk}@{tick.astimezone(UTC).isoformat()}"

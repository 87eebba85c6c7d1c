"""What the operations commands show (``manage.py jobs``): read-only views of queues and jobs.

The command formats these; the admin dashboards of the operations console build on the same.
The reads themselves are the models' (QuerySet methods, :func:`~django_jobs.models.known_queues`);
this module puts their rows together. Writes (retry, cancel, pause) go through
:mod:`django_jobs.api` and :mod:`django_jobs.queues`.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from .conf import get_settings
from .models import Event, Job, JobLog, Metric, QueueState, Worker, known_queues, queue_exists
from .states import UNFINISHED_STATES, JobState

__all__ = [
    "Bucket",
    "Dashboard",
    "Outcomes",
    "QueueDashboard",
    "QueueRow",
    "QueueStats",
    "TaskRow",
    "Throughput",
    "WorkerRow",
    "Workers",
    "dashboard",
    "attempt_runs",
    "job_detail",
    "list_jobs",
    "queue_dashboard",
    "queue_overview",
    "queue_stats",
    "throughput",
    "workers",
]


@dataclass(frozen=True)
class QueueRow:
    """One queue of the overview: unfinished jobs per state, flags and limits."""

    name: str
    counts: dict[str, int] = field(default_factory=dict)
    paused: bool = False
    concurrency: int | None = None
    rate_limit: tuple[int, float] | None = None
    max_size: int | None = None
    #: When the queue's longest-waiting ready job became ready (None: nothing waits).
    oldest_waiting_at: datetime | None = None


def moment(value: datetime, *, milliseconds: bool = False) -> str:
    """``2026-11-30 06:00:03 UTC`` (``06:00:03.042`` with ``milliseconds``): the one time format
    of the admin and the jobs command. To the second, in the current time zone (``TIME_ZONE``
    unless another is activated), named as the zone names itself (``UTC``, ``CET``,
    ``UTC+02:00``). A naive datetime (``USE_TZ = False``) is taken as Django takes it: in the
    current time zone."""
    if timezone.is_aware(value):
        value = timezone.localtime(value)
        zone = value.tzname() or value.strftime("%z")
    else:
        zone = timezone.get_current_timezone_name()
    fraction = f".{value.microsecond // 1000:03d}" if milliseconds else ""
    return f"{value:%Y-%m-%d %H:%M:%S}{fraction} {zone}"


def queue_overview(*, using: str, backend: str) -> list[QueueRow]:
    """Every queue with unfinished jobs of ``backend`` or a QueueState row, by name. Counts only
    unfinished states (one read over the partial indexes of those states): finished history, which
    grows without bound, is never counted."""
    unfinished = Job.objects.using(using).unfinished_by_queue(backend)
    states = QueueState.objects.using(using).by_name()
    names = known_queues(using=using, states=states, recent=(), unfinished=unfinished, declared=False)
    return [_queue_row(name, unfinished.get(name), states.get(name)) for name in names]


def _queue_row(name: str, unfinished: tuple[dict[str, int], datetime | None] | None, state: Any) -> QueueRow:
    counts, oldest = unfinished or ({}, None)
    return QueueRow(
        name=name,
        counts={s: counts.get(s, 0) for s in UNFINISHED_STATES},
        paused=bool(state and state.paused),
        concurrency=state.concurrency_limit if state else None,
        rate_limit=(state.rate_limit, state.rate_window_seconds) if state and state.rate_limit else None,
        max_size=state.max_size if state else None,
        oldest_waiting_at=oldest,
    )


def list_jobs(
    *,
    using: str,
    backend: str,
    queue: str | None = None,
    state: str | None = None,
    task: str | None = None,
    limit: int = 20,
    priority: int | None = None,
    trace: str | None = None,
    partition: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Any]:
    """The newest ``limit`` jobs matching the filters, as the admin's list filters them
    (``since``/``until``: enqueued in that range). ValueError for an unknown state."""
    if state is not None and state not in JobState.values:
        raise ValueError(f"Unknown state {state!r}; one of {', '.join(JobState.values)}.")
    jobs = Job.objects.using(using).filter(backend=backend)
    jobs = jobs.matching(
        queue=queue,
        state=state,
        task=task,
        priority=priority,
        trace=trace,
        partition=partition,
        since=since,
        until=until,
    )
    return list(jobs.order_by("-id")[:limit])  # ids are UUIDv7: newest first, by the primary key


#: The event kinds that end an attempt (their data carries the attempt and its run time).
ATTEMPT_ENDS = ("completed", "failed", "retried", "snoozed", "cancelled")


@dataclass(frozen=True)
class AttemptRun:
    """One attempt's run, from the event that ended it: when it ran by the database's clock
    (the event's time, less the run time the worker measured), what it came to."""

    attempt: int | None
    kind: str
    ended_at: datetime
    runtime_ms: int | None
    error: str | None

    @property
    def started_at(self) -> datetime | None:
        return None if self.runtime_ms is None else self.ended_at - timedelta(milliseconds=self.runtime_ms)


def attempt_runs(*, using: str, job_id: Any) -> list[AttemptRun]:
    """The runs of a job's attempts, oldest first, read from its events (django_jobs_event_job_idx):
    the jobs of one claim share the claim's ``started_at``, but each ran at its own time. Empty
    with ``EVENTS`` off."""
    events = Event.objects.using(using).filter(job_id=job_id, kind__in=ATTEMPT_ENDS).order_by("txid", "id")
    runs = []
    for e in events[:100]:
        data = e.data if isinstance(e.data, dict) else {}
        runtime = data.get("runtime_ms")
        runs.append(
            AttemptRun(
                attempt=data.get("attempt"),
                kind=e.kind,
                ended_at=e.created_at,
                runtime_ms=runtime if isinstance(runtime, int) else None,
                error=data.get("error"),
            )  # fmt: skip
        )
    return runs


def job_detail(*, using: str, job_id: str) -> tuple[Any, list[Any]] | None:
    """``(job, log lines)`` of one job; None for an unknown or malformed id."""
    try:
        pk = uuid.UUID(str(job_id))
    except ValueError:
        return None
    job = Job.objects.using(using).filter(id=pk).first()
    if job is None:
        return None
    return job, list(JobLog.objects.using(using).of_job(pk))


# -- the operations dashboards ---------------------------------------------------------------------
#
# Finished jobs are counted from Metric (one row per queue and minute, written with the outcome
# batches), never with a COUNT over the job table: its finished history has millions of rows. The
# unfinished states are counted through their partial index, so every query below costs what the
# backlog, the last day's metric rows or the live workers cost, whatever the history holds.

#: The window of the jobs/min figure: the last five whole minutes (the current one is partial).
RATE_MINUTES = 5


@dataclass(frozen=True)
class Outcomes:
    """Jobs finished in a window (sums of Metric rows)."""

    completed: int = 0
    failed: int = 0
    #: Attempts that ended in a retry.
    retried: int = 0
    #: Run time of the completed and failed jobs' last attempts, summed.
    runtime_ms: int = 0

    @property
    def finished(self) -> int:
        return self.completed + self.failed

    @property
    def failure_rate(self) -> float | None:
        """``failed / (completed + failed)``, 0..1; None when nothing finished."""
        return self.failed / self.finished if self.finished else None

    @property
    def avg_runtime_ms(self) -> float | None:
        """Mean run time of a finished job; None when nothing finished."""
        return self.runtime_ms / self.finished if self.finished else None


@dataclass(frozen=True)
class QueueStats:
    """One queue of the dashboard: its overview row and what finished lately."""

    row: QueueRow
    now: datetime
    #: The last :data:`RATE_MINUTES` whole minutes and the current one, the last 60 minutes and
    #: the last 1440 (each window ends with the current minute).
    recent: Outcomes = Outcomes()
    hour: Outcomes = Outcomes()
    day: Outcomes = Outcomes()

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def jobs_per_minute(self) -> float:
        """Completed plus failed jobs per minute over the last :data:`RATE_MINUTES` whole minutes
        and the current one so far: a burst counts at once, not a minute later."""
        into = (self.now - _floor_minute(self.now)).total_seconds() / 60
        return self.recent.finished / (RATE_MINUTES + into)

    @property
    def oldest_waiting_age(self) -> timedelta | None:
        """How long the queue's longest-waiting ready job has been ready (None: nothing waits)."""
        if self.row.oldest_waiting_at is None:
            return None
        return max(self.now - self.row.oldest_waiting_at, timedelta(0))


@dataclass(frozen=True)
class Bucket:
    """Jobs finished in ``minutes`` minutes from ``start``."""

    start: datetime
    minutes: int
    completed: int = 0
    failed: int = 0

    @property
    def end(self) -> datetime:
        return self.start + timedelta(minutes=self.minutes)


@dataclass(frozen=True)
class Throughput:
    """Completed and failed jobs per bucket, oldest first; the last bucket ends with the current
    minute."""

    buckets: list[Bucket]
    bucket_minutes: int

    @property
    def heading(self) -> str:
        """``Last 24 hours, per 15 minutes``; a shorter span says so (``Last 2 hours, per 5
        minutes``)."""
        span = self.minutes
        if span % 60:
            text = f"Last {span} minutes"
        else:
            hours = span // 60
            text = "Last hour" if hours == 1 else f"Last {hours} hours"
        per = "minute" if self.bucket_minutes == 1 else f"{self.bucket_minutes} minutes"
        return f"{text}, per {per}"

    @property
    def completed(self) -> int:
        return sum(b.completed for b in self.buckets)

    @property
    def failed(self) -> int:
        return sum(b.failed for b in self.buckets)

    @property
    def minutes(self) -> int:
        return self.bucket_minutes * len(self.buckets)


@dataclass(frozen=True)
class WorkerRow:
    """One registered worker process and the jobs it runs."""

    id: str
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age: timedelta
    #: Its heartbeat is older than the reaper's limit: the process is probably gone.
    stale: bool
    running: int


@dataclass(frozen=True)
class Workers:
    rows: list[WorkerRow]
    #: A heartbeat older than this marks a worker stale (three leases, the reaper's limit).
    stale_after: timedelta
    #: Active jobs whose worker has no row (the rescuer re-queues them when their lease expires).
    running_elsewhere: int = 0


@dataclass(frozen=True)
class Dashboard:
    """The queues overview: every queue, the throughput of all queues, the live workers."""

    now: datetime
    queues: list[QueueStats]
    hour: Throughput
    day: Throughput
    workers: Workers


@dataclass(frozen=True)
class TaskRow:
    """Unfinished jobs of one task in one queue, per state."""

    task_path: str
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class QueueDashboard:
    """One queue's page: its figures, its throughput and its unfinished jobs per task."""

    stats: QueueStats
    hour: Throughput
    day: Throughput
    tasks: list[TaskRow]


def dashboard(*, using: str, backend: str, now: datetime | None = None) -> Dashboard:
    """Everything the queues overview shows, in six queries whatever the number of jobs.

    Queues listed: those with unfinished jobs of ``backend``, a QueueState row, or Metric rows in
    the last day. ``hour`` has 60 one-minute buckets and ``day`` 96 quarter-hours (less on a new
    install: :func:`_day`), of all queues.
    """
    now = now or timezone.now()
    per_minute = _per_minute(using, None, _first_minute(now, 1440), now)
    return Dashboard(
        now=now,
        queues=queue_stats(using=using, backend=backend, now=now),
        hour=_bucketed(per_minute, now, minutes=60, bucket=1),
        day=_day(per_minute, now),
        workers=workers(using=using, backend=backend, now=now),
    )


def queue_stats(*, using: str, backend: str, now: datetime | None = None) -> list[QueueStats]:
    """Every queue's figures, by name, in three queries whatever the number of jobs: unfinished
    jobs per state (through the unfinished index), the QueueState rows, and the outcomes of the
    last day's Metric rows summed per window. Queues listed: those with unfinished jobs of
    ``backend``, a QueueState row, or Metric rows in the last day."""
    now = now or timezone.now()
    unfinished = Job.objects.using(using).unfinished_by_queue(backend)
    states = QueueState.objects.using(using).by_name()
    windows = _outcomes_by_queue(using, now)
    names = known_queues(using=using, states=states, recent=windows, unfinished=unfinished, declared=False)
    return [
        QueueStats(row=_queue_row(name, unfinished.get(name), states.get(name)), now=now, **windows.get(name, {}))
        for name in names
    ]


def queue_dashboard(*, using: str, backend: str, name: str, now: datetime | None = None) -> QueueDashboard | None:
    """One queue's figures, throughput (last hour by minute, last day by quarter-hour) and
    unfinished jobs per task; None for a queue that has no jobs, no QueueState row and no
    metrics (see :func:`queue_exists`)."""
    now = now or timezone.now()
    state = QueueState.objects.using(using).filter(name=name).first()
    per_task: dict[str, dict[str, int]] = {}
    counts: dict[str, int] = {}
    oldest: datetime | None = None
    rows = Job.objects.using(using).unfinished_by_task(backend, name)
    for task_path, job_state, n, first in rows:
        per_task.setdefault(task_path, {})[job_state] = n
        counts[job_state] = counts.get(job_state, 0) + n
        if job_state == JobState.WAITING and (oldest is None or first < oldest):
            oldest = first
    per_minute = _per_minute(using, name, _first_minute(now, 1440), now)
    if state is None and not counts and not per_minute and not queue_exists(using=using, backend=backend, name=name):
        return None
    minute = _floor_minute(now)
    stats = QueueStats(
        row=_queue_row(name, (counts, oldest), state),
        now=now,
        recent=_sum(per_minute, minute - timedelta(minutes=RATE_MINUTES), minute + timedelta(minutes=1)),
        hour=_sum(per_minute, _first_minute(now, 60), minute + timedelta(minutes=1)),
        day=_sum(per_minute, _first_minute(now, 1440), minute + timedelta(minutes=1)),
    )
    tasks = [
        TaskRow(task_path=path, counts={s: c.get(s, 0) for s in UNFINISHED_STATES}) for path, c in per_task.items()
    ]
    tasks.sort(key=lambda t: (-t.total, t.task_path))
    return QueueDashboard(
        stats=stats,
        hour=_bucketed(per_minute, now, minutes=60, bucket=1),
        day=_day(per_minute, now),
        tasks=tasks,
    )


def throughput(
    *, using: str, queue: str | None = None, minutes: int = 60, bucket: int = 1, now: datetime | None = None
) -> Throughput:
    """Completed and failed jobs of ``queue`` (None: all queues) over the last ``minutes``
    minutes, in buckets of ``bucket`` minutes, from Metric. The last bucket ends with the current
    minute; ``minutes`` is rounded up to a whole number of buckets."""
    if not isinstance(bucket, int) or bucket < 1 or not isinstance(minutes, int) or minutes < 1:
        raise ValueError(f"minutes and bucket must be integers >= 1; got {minutes!r} and {bucket!r}.")
    now = now or timezone.now()
    minutes = math.ceil(minutes / bucket) * bucket
    per_minute = _per_minute(using, queue, _first_minute(now, minutes), now)
    return _bucketed(per_minute, now, minutes=minutes, bucket=bucket)


def workers(*, using: str, backend: str, now: datetime | None = None) -> Workers:
    """The registered workers of ``backend`` with how many jobs each runs (one GROUP BY over the
    active jobs). A worker whose heartbeat is older than three leases is marked stale: the reaper
    removes such rows and the rescuer re-queues their jobs."""
    now = now or timezone.now()
    stale_after = timedelta(seconds=3 * get_settings(backend).LEASE_SECONDS)
    running = Job.objects.using(using).running_by_worker(backend)
    rows = []
    for w in Worker.objects.using(using).filter(backend=backend).order_by("started_at", "id"):
        age = max(now - w.heartbeat_at, timedelta(0))
        rows.append(
            WorkerRow(
                id=w.id,
                hostname=w.hostname,
                pid=w.pid,
                queues=list(w.queues or []),
                concurrency=w.concurrency,
                started_at=w.started_at,
                heartbeat_at=w.heartbeat_at,
                heartbeat_age=age,
                stale=age > stale_after,
                running=running.pop(w.id, 0),
            )
        )
    return Workers(rows=rows, stale_after=stale_after, running_elsewhere=sum(running.values()))


def _floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _first_minute(now: datetime, minutes: int) -> datetime:
    """The first minute of the ``minutes``-minute window that ends with the current minute."""
    return _floor_minute(now) - timedelta(minutes=minutes - 1)


def _per_minute(using: str, queue: str | None, since: datetime, now: datetime) -> dict[datetime, Outcomes]:
    """Metric sums per minute from ``since`` to the current minute, of one queue or all (at most
    one row per minute: 1440 for a day)."""
    rows = Metric.objects.using(using).per_minute(
        queue=queue, since=since, until=_floor_minute(now) + timedelta(minutes=1)
    )
    return {
        _floor_minute(minute): Outcomes(completed=c or 0, failed=f or 0, retried=r or 0, runtime_ms=ms or 0)
        for minute, c, f, r, ms in rows
    }


def _sum(per_minute: dict[datetime, Outcomes], since: datetime, until: datetime) -> Outcomes:
    """The outcomes of the minutes in ``[since, until)``."""
    picked = [o for minute, o in per_minute.items() if since <= minute < until]
    return Outcomes(
        completed=sum(o.completed for o in picked),
        failed=sum(o.failed for o in picked),
        retried=sum(o.retried for o in picked),
        runtime_ms=sum(o.runtime_ms for o in picked),
    )


#: The day chart's buckets (minutes), the first that keeps it within 96 bars.
DAY_BUCKETS = (1, 5, 15)


def _day(per_minute: dict[datetime, Outcomes], now: datetime) -> Throughput:
    """The last 24 hours in 96 quarter-hours; while the rows reach back less far (a new
    install), the span they cover, rounded up to whole hours (at least two), in finer buckets:
    a day of empty quarter-hours around one thin bar says nothing."""
    if not per_minute:
        return _bucketed(per_minute, now, minutes=1440, bucket=15)
    have = int((_floor_minute(now) - min(per_minute)).total_seconds() // 60) + 1
    minutes = min(1440, max(120, -(-have // 60) * 60))
    bucket = next(b for b in DAY_BUCKETS if minutes // b <= 96)
    return _bucketed(per_minute, now, minutes=minutes, bucket=bucket)


def _bucketed(per_minute: dict[datetime, Outcomes], now: datetime, *, minutes: int, bucket: int) -> Throughput:
    first = _first_minute(now, minutes)
    count = minutes // bucket
    completed, failed = [0] * count, [0] * count
    for minute, outcome in per_minute.items():
        index = int((minute - first).total_seconds() // 60) // bucket
        if 0 <= index < count:
            completed[index] += outcome.completed
            failed[index] += outcome.failed
    return Throughput(
        buckets=[
            Bucket(
                start=first + timedelta(minutes=i * bucket), minutes=bucket, completed=completed[i], failed=failed[i]
            )
            for i in range(count)
        ],
        bucket_minutes=bucket,
    )


def _outcomes_by_queue(using: str, now: datetime) -> dict[str, dict[str, Outcomes]]:
    """``{queue: {"recent", "hour", "day": Outcomes}}`` of the queues with Metric rows in the last
    day, in one query (conditional sums over the last day's rows, found by the minute index)."""
    minute = _floor_minute(now)
    windows = {
        "recent": Q(minute__gte=minute - timedelta(minutes=RATE_MINUTES)),
        "hour": Q(minute__gte=_first_minute(now, 60)),
        "day": Q(),
    }
    sums = Metric.objects.using(using).sums_by_queue(
        windows=windows, since=_first_minute(now, 1440), until=minute + timedelta(minutes=1)
    )
    return {
        queue: {window: Outcomes(**by_column) for window, by_column in per_window.items()}
        for queue, per_window in sums.items()
    }

"""One settings object for django-jobs.

Values come from, in increasing precedence: the defaults below, the ``DJANGO_JOBS`` setting,
and the ``OPTIONS`` of the backend in ``TASKS``. Read them through :func:`get_settings`; the
cache is dropped on ``setting_changed`` so ``override_settings`` works in tests.

A leaf of the layers: it imports only :mod:`django_jobs.exceptions`, so every layer (the
drivers, the engine, :mod:`django_jobs.spec`) can read settings. The settings that hold
declarations (``QUEUES``, ``RETENTION``, ``BACKOFF``) are validated by the spec modules that
define those declarations, which read settings themselves:
:func:`django_jobs.spec.settings.settings_problems` adds their problems to
:meth:`JobsSettings.validate`'s.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import JobsConfigurationError


@dataclass(frozen=True)
class JobsSettings:
    """Documented in docs/reference/settings.md; keep the two in step."""

    #: Database alias the job tables live in.
    DATABASE: str = "default"
    #: Default ``max_attempts`` for tasks that do not set one.
    MAX_ATTEMPTS: int = 1
    #: Default backoff: seconds, a list of seconds per attempt, or "exponential".
    BACKOFF: Any = "exponential"
    #: "exponential" backoff: base delay in seconds and the cap (full jitter up to the cap).
    BACKOFF_BASE: float = 1.0
    BACKOFF_CAP: float = 3600.0
    #: Seconds a claimed job's lease lasts; workers renew it every third of this.
    LEASE_SECONDS: float = 30.0
    #: A job whose lease expired more than this many times is failed instead of re-queued.
    MAX_STALLED: int = 1
    #: Most lines ``context.log()`` keeps per job; the last kept line says the log was truncated.
    LOG_MAX_LINES: int = 1000
    #: Longest log line kept (characters); longer ones are cut.
    LOG_MAX_LINE_CHARS: int = 10_000
    #: Largest JSON payload (args + kwargs, UTF-8 bytes) accepted by enqueue.
    MAX_PAYLOAD_BYTES: int = 1024 * 1024
    #: Furthest ahead a job's run_after may be (seconds or a timedelta; None: no bound but
    #: the year 9999). Catches typos that would park a job for centuries.
    MAX_RUN_AFTER: float | timedelta | None = timedelta(days=3653)
    #: Idle poll interval of workers (seconds, jittered); NOTIFY wakes them sooner on PostgreSQL.
    POLL_INTERVAL: float = 1.0
    #: How often the promoter moves due delayed jobs to waiting (seconds).
    PROMOTE_INTERVAL: float = 0.5
    #: How often the leader looks for expired leases and dead workers (seconds).
    RESCUE_INTERVAL: float = 5.0
    #: Rows per promoter/rescuer batch.
    SERVICE_BATCH_SIZE: int = 1000
    #: Dotted paths of middleware factories wrapping each job's execution, outermost first
    #: (docs/howto/middleware.md).
    MIDDLEWARE: tuple[str, ...] | list[str] = ()
    #: Schedules declared in code: {name: {"task": ..., "cron" or "every": ..., ...}}, synced to
    #: the Schedule table when a worker starts (docs/howto/schedules.md).
    SCHEDULES: dict[str, Any] | None = None
    #: Queue flags and limits declared in code: {queue: {"concurrency": 5, "rate_limit": (20, 1.0),
    #: "max_size": 10_000, "paused": False, "partition_concurrency": ..., ...}}, synced to the
    #: QueueState table when a worker starts (docs/howto/queue-control.md).
    QUEUES: dict[str, Any] | None = None
    #: Topic settings declared in code (bus mode): {topic: {"max_size": ..., "lease": 30,
    #: "delay": ..., "max_wait": ..., "window_buffer": ..., "retention": ..., "max_age": ...}};
    #: ``topic(name).configure(...)`` overrides them at runtime (docs/howto/bus-mode.md).
    TOPICS: dict[str, Any] | None = None
    #: Seconds after which a schedule's due tick counts as missed (downtime) rather than late;
    #: missed ticks follow the schedule's catch_up policy, late ones all run.
    MISFIRE_GRACE: float = 60.0
    #: Write an Event row for every lifecycle step (docs/reference/events.md); False saves a row
    #: and an index entry per step for the highest throughput.
    EVENTS: bool = True
    #: Events kept per queue; the pruner trims older ones.
    EVENTS_MAX_PER_QUEUE: int = 10_000
    #: How long finished jobs are kept: {"completed": age, "failed": age, "cancelled": age,
    #: "queues": {queue: {...}}}; an age is seconds or a timedelta (0: delete at once), None keeps
    #: forever, or {"age": ..., "count": n} also keeps at most n (docs/howto/retention.md).
    #: States left out keep the default of one day.
    RETENTION: dict[str, Any] | None = None
    #: Per-minute Metric rows are kept this many days.
    METRICS_KEEP_DAYS: float = 7.0
    #: How often the leader's pruner runs (seconds), and the rows it deletes per transaction.
    PRUNE_INTERVAL: float = 5.0
    PRUNE_BATCH_SIZE: int = 1000
    #: PostgreSQL: prepare the statements every job sends (insert, claim, outcome batch) on each
    #: connection. Turn off behind a connection pooler that cannot keep prepared statements
    #: (PgBouncer before 1.21 in transaction mode).
    PREPARED_STATEMENTS: bool = True
    #: Fernet keys for jobs stored encrypted (``encrypt=True``): the first encrypts, every one
    #: decrypts, so a new key goes first and an old one stays until ``jobs rotate-keys`` ran
    #: (docs/howto/encryption.md). Validated by check E009.
    ENCRYPTION_KEYS: tuple[str | bytes, ...] | list[str | bytes] = ()
    #: Seconds a process keeps the names of the queues with a size limit (``max_size``,
    #: ``partition_max_size``) before it reads them again; an enqueue to any other queue is then
    #: a bare INSERT. A queue's first size limit, set in another process, holds within this
    #: long; 0: every enqueue probes, and it holds at once (docs/howto/backpressure.md).
    SIZE_LIMITS_REFRESH: float = 1.0
    #: LISTEN/NOTIFY channel (PostgreSQL).
    NOTIFY_CHANNEL: str = "django_jobs"
    #: SQLite: switch the database to WAL and wait this long (ms) on a locked database.
    SQLITE_WAL: bool = True
    SQLITE_BUSY_TIMEOUT_MS: int = 30_000

    def validate(self) -> list[str]:
        """Return a list of human-readable problems of the plain settings (empty when valid).

        The declarations (``QUEUES``, ``RETENTION``, ``BACKOFF``) are checked by
        :func:`django_jobs.spec.settings.settings_problems`, which also returns these (check E002)."""
        problems = []
        # At most 56 characters: the events channel is NOTIFY_CHANNEL + "_events", and PostgreSQL
        # refuses a channel longer than 63.
        if not isinstance(self.NOTIFY_CHANNEL, str) or not re.match(r"^[a-z_][a-z0-9_]{0,55}\Z", self.NOTIFY_CHANNEL):
            problems.append(
                "NOTIFY_CHANNEL must be a lower-case SQL identifier (letters, digits, '_') of at most 56 characters."
            )
        if not isinstance(self.MAX_ATTEMPTS, int) or self.MAX_ATTEMPTS < 1:
            problems.append("MAX_ATTEMPTS must be an integer >= 1.")
        if not _positive(self.LEASE_SECONDS) or self.LEASE_SECONDS < 1:
            problems.append("LEASE_SECONDS must be a number >= 1.")
        if not isinstance(self.MAX_STALLED, int) or self.MAX_STALLED < 0:
            problems.append("MAX_STALLED must be an integer >= 0.")
        for name in ("LOG_MAX_LINES", "LOG_MAX_LINE_CHARS"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer.")
        if not isinstance(self.MAX_PAYLOAD_BYTES, int) or self.MAX_PAYLOAD_BYTES < 1:
            problems.append("MAX_PAYLOAD_BYTES must be a positive integer.")
        if self.MAX_RUN_AFTER is not None and not (
            (_positive(self.MAX_RUN_AFTER) and self.MAX_RUN_AFTER <= timedelta.max.total_seconds())
            or (isinstance(self.MAX_RUN_AFTER, timedelta) and self.MAX_RUN_AFTER > timedelta(0))
        ):
            problems.append("MAX_RUN_AFTER must be a positive number of seconds, a positive timedelta, or None.")
        for name in ("POLL_INTERVAL", "PROMOTE_INTERVAL", "RESCUE_INTERVAL", "BACKOFF_BASE", "BACKOFF_CAP"):
            if not _positive(getattr(self, name)):
                problems.append(f"{name} must be a positive number of seconds.")
        if not isinstance(self.MIDDLEWARE, (list, tuple)) or not all(isinstance(p, str) for p in self.MIDDLEWARE):
            problems.append("MIDDLEWARE must be a list of dotted paths (strings).")
        if self.SCHEDULES is not None and not isinstance(self.SCHEDULES, dict):
            problems.append("SCHEDULES must be a dict of {name: declaration}.")
        for name in ("EVENTS", "PREPARED_STATEMENTS"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be True or False.")
        for name, most in (("EVENTS_MAX_PER_QUEUE", 10**9), ("PRUNE_BATCH_SIZE", 10_000)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
                problems.append(f"{name} must be an integer from 1 to {most:,}.")
        for name, most in (("PRUNE_INTERVAL", 86_400), ("METRICS_KEEP_DAYS", 36_500)):
            value = getattr(self, name)
            if not _positive(value) or not value <= most:
                problems.append(f"{name} must be a positive number up to {most:,}.")
        refresh = self.SIZE_LIMITS_REFRESH
        if isinstance(refresh, bool) or not isinstance(refresh, (int, float)) or not 0 <= refresh <= 3600:
            problems.append("SIZE_LIMITS_REFRESH must be a number of seconds from 0 to 3,600.")
        if not _positive(self.MISFIRE_GRACE):
            problems.append("MISFIRE_GRACE must be a positive number of seconds.")
        if not isinstance(self.SERVICE_BATCH_SIZE, int) or self.SERVICE_BATCH_SIZE < 1:
            problems.append("SERVICE_BATCH_SIZE must be a positive integer.")
        return problems


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


SETTING_NAMES = frozenset(f.name for f in fields(JobsSettings))
#: Settings that concern the whole process, not one backend: only DJANGO_JOBS may set them.
GLOBAL_ONLY = frozenset(
    {"NOTIFY_CHANNEL", "SQLITE_WAL", "SQLITE_BUSY_TIMEOUT_MS", "EVENTS", "EVENTS_MAX_PER_QUEUE", "RETENTION",
     "METRICS_KEEP_DAYS", "PREPARED_STATEMENTS", "ENCRYPTION_KEYS", "SIZE_LIMITS_REFRESH"}
)  # fmt: skip


@functools.cache
def _global_settings() -> JobsSettings:
    user = getattr(django_settings, "DJANGO_JOBS", {}) or {}
    if not isinstance(user, dict):
        raise JobsConfigurationError("DJANGO_JOBS must be a dict of settings.")
    unknown = set(user) - SETTING_NAMES
    if unknown:
        raise JobsConfigurationError(
            f"Unknown DJANGO_JOBS setting(s) {sorted(unknown)}; allowed: {sorted(SETTING_NAMES)}."
        )
    return JobsSettings(**user)


@functools.cache
def _backend_settings(alias: str) -> JobsSettings:
    base = _global_settings()
    params = getattr(django_settings, "TASKS", {}).get(alias, {})
    options = {k: v for k, v in (params.get("OPTIONS") or {}).items() if k in SETTING_NAMES}
    return replace(base, **options) if options else base


def get_settings(alias: str | None = None) -> JobsSettings:
    """The effective settings: for a backend alias (with its OPTIONS), or the global ones."""
    return _backend_settings(alias) if alias else _global_settings()


@receiver(setting_changed)
def _reset(setting: str, **kwargs: Any) -> None:
    if setting in {"DJANGO_JOBS", "TASKS", "DATABASES"}:
        _global_settings.cache_clear()
        _backend_settings.cache_clear()

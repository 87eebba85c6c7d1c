"""What every engine module shares: table names, the claimed-job and outcome values, a new
job's row (``NewRow``; the job asked for, ``NewJob``, is :mod:`django_jobs.spec.newjob`'s),
reading a job back, and the settings the hot paths consult."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections

from ..conf import get_settings
from ..drivers import Driver
from ..drivers.base import CHUNK
from ..models import Event, Job, JobStart, Metric, QueueState
from ..spec.newjob import NewJob  # noqa: F401 - its import path before it moved to the spec layer

logger = logging.getLogger("django_jobs.engine")

JOB_TABLE = Job._meta.db_table
QUEUE_TABLE = QueueState._meta.db_table
START_TABLE = JobStart._meta.db_table
EVENT_TABLE = Event._meta.db_table
METRIC_TABLE = Metric._meta.db_table


@dataclass(slots=True)
class ClaimedJob:
    """An active job as the worker sees it, straight from the claim statement."""

    id: uuid.UUID
    backend: str
    queue: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    attempts: int
    max_attempts: int
    options: dict[str, Any]
    lease_token: uuid.UUID
    enqueued_at: datetime
    started_at: datetime
    last_attempted_at: datetime
    available_at: datetime
    errors: list[dict[str, Any]]
    worker_ids: list[str]
    #: Claim order within a priority (negative: LIFO); see :func:`ready_seq`.
    seq: int = 0
    #: The job's parent in a flow (the flows feature fills it); None for a job on its own.
    parent_id: uuid.UUID | None = None
    #: The pipeline the job belongs to (``django_jobs.trace``); None only for rows from before
    #: trace ids were stored.
    trace_id: str | None = None
    #: ``.using(partition=...)``: the jobs of one (queue, partition) run one at a time, in order.
    partition_key: str | None = None


#: :attr:`Outcome.written_as` of an outcome its attempt's transaction tried to write and the
#: guard refused (the lease was lost): nothing was stored.
DROPPED = ""


@dataclass(slots=True)
class Outcome:
    """What one attempt of a job came to; :func:`record_outcomes` writes a batch of them.

    ``state`` is the state the job moves to: ``completed``, ``failed``, ``waiting`` (retry now)
    or ``delayed`` (retry at ``available_at``).
    """

    job_id: uuid.UUID
    lease_token: uuid.UUID
    state: str
    return_value_json: str | None = None
    error: dict[str, Any] | None = None
    available_at: datetime | None = None
    #: Snooze: take the attempt and its worker id back (the attempt does not count).
    uncount_attempt: bool = False
    #: The job's queue and the number of the attempt, for signals and logs (not written).
    queue: str = ""
    attempt: int = 0
    #: The job is a child in a flow: its final state must move its parent on (same transaction).
    has_parent: bool = False
    #: The task's ``retention`` (the job's options): when the finished job may be pruned.
    retention: dict[str, Any] | None = None
    #: How long the attempt ran (ms; the executor measures it). None: from its claim to now.
    runtime_ms: int | None = None
    #: Set by :func:`record_outcomes` on a written outcome: when the job finished (None: it did not).
    finished_at: datetime | None = field(default=None, compare=False)
    #: The claimed job and the exception the attempt raised, kept in this process (never pickled
    #: to or from a child process) so ``task_finished`` can be sent once the outcome is stored.
    job: ClaimedJob | None = field(default=None, repr=False, compare=False)
    exc: BaseException | None = field(default=None, repr=False, compare=False)
    #: Set when the attempt's own transaction already wrote this outcome (``atomic=True``, see
    #: django_jobs.worker.atomic): the state stored, or :data:`DROPPED` when the guard refused
    #: it and the transaction was rolled back. None: the completer writes it.
    written_as: str | None = field(default=None, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in self.__slots__}
        state["job"] = state["exc"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


# -- enqueue --------------------------------------------------------------------------------


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def ready_seq(available_at: datetime, lifo: bool = False) -> int:
    """The ``seq`` of a job that becomes ready at ``available_at``: microseconds since the Unix
    epoch, negated for a LIFO job.

    Claim order is ``priority DESC, seq, id``. A FIFO job's seq grows with the moment it became
    ready, so FIFO order is the order of ``available_at`` (then id), as before ``seq`` existed.
    A LIFO job's is negative, so it sorts ahead of every FIFO job of its priority and, among LIFO
    jobs, the newest comes first (the seed schema's signed ``job_seq``). Computed here, not by a
    database sequence, so both vendors agree and a rescheduled job can get a new one from its
    new time.
    """
    if available_at.tzinfo is None:  # USE_TZ = False: Django's naive datetimes are UTC to us
        available_at = available_at.replace(tzinfo=UTC)
    micros = (available_at - _EPOCH) // _MICROSECOND
    return -micros if lifo else micros


@dataclass(slots=True)
class NewRow:
    """A new job's row as its INSERT writes it: the columns set at enqueue (the others start at
    the table's defaults: no attempt, no error, no lease, no parent), made from the
    :class:`~django_jobs.spec.newjob.NewJob` asked for by :func:`~.insert._new_row`. Lighter
    than a model instance; :func:`~.insert._as_job` makes the unsaved ``Job`` of it."""

    id: uuid.UUID
    backend: str
    queue: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    state: str
    priority: int
    available_at: datetime
    options: dict[str, Any]
    max_attempts: int
    #: None until inserted when the database clock stamps it (PostgreSQL, see :func:`_new_row`).
    enqueued_at: datetime | None
    seq: int
    trace_id: str
    dedup_key: str | None
    idempotency_key: str | None
    partition_key: str | None
    blocked: bool


def _mark_saved(job: Job | NewRow, using: str) -> None:
    if isinstance(job, Job):  # a NewRow is no model instance: nothing to mark
        job._state.adding = False
        job._state.db = using


#: Rows per INSERT statement of :func:`insert_jobs`. 500 rows x 4 parameters + 10 = 2,010 bound
#: variables: under SQLite's limit (32,766 by default since 3.32, our minimum is 3.35; a build
#: or connection set lower is honoured, see _rows_per_statement) and PostgreSQL's 65,535. Large
#: enough that the round trip per statement is a small part of its cost, small enough that one
#: statement's SQL and parameters stay around 100 KiB however many jobs the caller sends.
INSERT_CHUNK = CHUNK


def events_enabled() -> bool:
    return get_settings().EVENTS


def events_channel() -> str:
    """The NOTIFY channel of events (PostgreSQL): each transaction that writes events sends one
    notification on it (PostgreSQL folds a transaction's identical notifications into one)."""
    return f"{get_settings().NOTIFY_CHANNEL}_events"


#: The columns :func:`_read_job` reads: what a result and the dedup decisions need.
_READ_COLUMNS = (
    "id, backend, queue, task_path, args, kwargs, state, priority, available_at, seq, options, attempts, "
    "max_attempts, progress, return_value, errors, worker_ids, enqueued_at, started_at, last_attempted_at, "
    "finished_at, trace_id, dedup_key, idempotency_key"
)


def _read_job(cursor: Any, d: Driver, using: str, where: str, params: list[Any]) -> Job | None:
    """One job row read with raw SQL (the ORM's query compilation cost more than the query on
    the duplicate path), or None."""
    cursor.execute(f"SELECT {_READ_COLUMNS} FROM {JOB_TABLE} WHERE {where}", params)
    row = cursor.fetchone()
    if row is None:
        return None
    (jid, backend, queue, path, args, kwargs, state, priority, available, seq, options, attempts, max_attempts,
     progress, return_value, errors, worker_ids, enqueued, started, last, finished, trace_id, dedup_key,
     idempotency_key) = row  # fmt: skip
    job = Job(
        id=d.to_uuid(jid),
        backend=backend,
        queue=queue,
        task_path=path,
        args=d.to_json(args),
        kwargs=d.to_json(kwargs),
        state=state,
        priority=priority,
        available_at=d.to_dt(available),
        seq=seq,
        options=d.to_json(options),
        attempts=attempts,
        max_attempts=max_attempts,
        progress=d.to_json(progress),
        return_value=d.to_json(return_value),
        errors=d.to_json(errors),
        worker_ids=d.to_json(worker_ids),
        enqueued_at=d.to_dt(enqueued),
        started_at=d.to_dt(started),
        last_attempted_at=d.to_dt(last),
        finished_at=d.to_dt(finished),
        trace_id=trace_id,
        dedup_key=dedup_key,
        idempotency_key=idempotency_key,
    )
    _mark_saved(job, using)
    return job


def _job_state(cursor: Any, d: Driver, job_id: uuid.UUID) -> str | None:
    cursor.execute(f"SELECT state FROM {JOB_TABLE} WHERE id = {d.cast('%s', 'uuid')}", [d.uuid(job_id)])
    row = cursor.fetchone()
    return None if row is None else row[0]


def _drop_broken_connection(using: str) -> None:
    """After a transient error outside a transaction, close the connection so the next statement
    opens a new one instead of failing on the broken one."""
    conn = connections[using]
    if not conn.in_atomic_block:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is dropped anyway
            logger.debug("closing a broken connection failed", exc_info=True)


def _cancelled_error(job_id: uuid.UUID) -> dict[str, str]:
    return {
        "exception_class_path": "django_jobs.exceptions.JobCancelled",
        "traceback": f"django_jobs.exceptions.JobCancelled: job {job_id} was cancelled.\n",
    }


#: NOTIFY payload prefix of "this running job was cancelled" (followed by the job id).
CANCEL_PREFIX = "!cancel:"


# -- retention ------------------------------------------------------------------------------

_FINISHED_SQL = "('completed', 'failed', 'cancelled')"


def _backend_scope(backend: str | None) -> tuple[str, list[Any]]:
    return (" AND backend = %s", [backend]) if backend is not None else ("", [])

"""Tasks of tests/test_task_atomic.py: ``atomic=True`` jobs that write a LogEntry, enqueue a job
and publish a message, with a crash injected where told.

``crash`` with ``marker``: die once (or raise once), at that point, leaving the marker so the
next run goes through. ``probe``: a JSON-lines file every run is recorded in first (outside the
database, so runs that were rolled back are counted too). ``hold``: after the writes, wait until
that file exists.
"""

from __future__ import annotations

import os
import re
import time

from django.contrib.admin.models import ADDITION, LogEntry
from django.db import connection, transaction
from django.tasks import task

import django_jobs
from tests.tasks import noop, record

#: The queue the atomic jobs run in; the jobs they enqueue go to ``booked`` (no worker runs it).
QUEUE = "atomic"
OUT = "booked"


def _die(marker: str) -> None:
    with open(marker, "w"):
        pass
    os._exit(1)


_JOB_UPDATE = re.compile(r"\bUPDATE\s+[`\"]?django_jobs_job[`\"]?\s", re.IGNORECASE)


def _die_after_outcome_update(marker: str):
    """An execute wrapper that kills the process right after the job's outcome UPDATE ran,
    before the transaction commits (the first UPDATE of the job table once armed)."""

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if _JOB_UPDATE.search(sql):
            _die(marker)
        return result

    return wrapper


def _book(context, n: int, user: int, crash: str | None, marker: str | None, probe: str | None, hold: str | None):
    if probe:
        record(probe, n=n, attempt=context.attempt, pid=os.getpid())
    armed = bool(crash) and not os.path.exists(marker)
    if armed and crash == "before_writes":
        _die(marker)
    LogEntry.objects.create(user_id=user, action_flag=ADDITION, object_repr=f"book-{n}")
    noop.using(queue_name=OUT).enqueue()
    django_jobs.topic(OUT).publish({"n": n})
    if armed and crash == "after_writes":
        _die(marker)
    if armed and crash == "raise":
        with open(marker, "w"):
            pass
        raise RuntimeError("failing once after the writes")
    if armed and crash == "after_outcome":
        connection.execute_wrappers.append(_die_after_outcome_update(marker))
    if armed and crash == "after_commit":
        transaction.on_commit(lambda: _die(marker))
    while hold and not os.path.exists(hold):
        time.sleep(0.02)
    return n


@task(atomic=True, queue_name=QUEUE, max_attempts=3, backoff=0, takes_context=True)
def book(context, n: int, user: int, crash=None, marker=None, probe=None, hold=None) -> int:
    """Writes a LogEntry, enqueues a job and publishes a message: all of it exactly once."""
    return _book(context, n, user, crash, marker, probe, hold)


@task(queue_name=QUEUE, max_attempts=3, backoff=0, takes_context=True)
def book_plainly(context, n: int, user: int, crash=None, marker=None, probe=None, hold=None) -> int:
    """:func:`book` without ``atomic``: its writes commit as they go."""
    return _book(context, n, user, crash, marker, probe, hold)


@task(atomic=True, queue_name=QUEUE, timeout=1, max_attempts=1, takes_context=True)
def book_slowly(context, n: int, user: int, seconds: float, probe: str) -> int:
    """Writes, then runs past its timeout of 1 s."""
    record(probe, n=n, event="start")
    LogEntry.objects.create(user_id=user, action_flag=ADDITION, object_repr=f"slow-{n}")
    noop.using(queue_name=OUT).enqueue()
    django_jobs.topic(OUT).publish({"n": n})
    time.sleep(seconds)
    record(probe, n=n, event="end")
    return n


@task(atomic=True, queue_name=QUEUE)
def returns_non_json_after_writing(user: int):
    LogEntry.objects.create(user_id=user, action_flag=ADDITION, object_repr="non-json")
    return object()

"""Subscribers of the bus-mode process tests (tests/test_bus_worker.py). What a handler does is
told by its message's payload: ``probe`` (a JSON-lines file each delivery is recorded in),
``hold`` (wait until that file exists, after recording), ``fail_group`` with ``fail_while``
(the named group fails while that file exists), and for the atomic ``ledger`` subscriber
``crash`` with ``marker`` (die once, at that point, leaving the marker)."""

from __future__ import annotations

import os
import time

from django.contrib.admin.models import ADDITION, LogEntry
from django.db import connection, transaction

import django_jobs
from tests.tasks import noop, record


def _deliver(message, context, group: str) -> None:
    p = message.payload
    record(
        p["probe"],
        pid=os.getpid(),
        group=group,
        partition=context.partition,
        n=p["n"],
        position=message.position,
        attempt=context.attempt,
        replay=context.replay,
        t=time.monotonic(),
    )


def _behave(messages, context, group: str) -> None:
    for m in messages:
        _deliver(m, context, group)
    p = messages[0].payload
    hold = p.get("hold")
    while hold and not os.path.exists(hold):
        time.sleep(0.02)
    for m in messages:
        if m.payload.get("fail_group") == group and os.path.exists(m.payload.get("fail_while", "")):
            raise RuntimeError(f"told to fail message {m.payload['n']}")


@django_jobs.subscriber("orders", group="billing", batch=2, max_attempts=2, backoff=0, start_from="beginning")
def billing(messages, context):
    _behave(messages, context, "billing")


@django_jobs.subscriber("orders", group="email", max_attempts=2, backoff=0, start_from="beginning")
def email(message, context):
    _behave([message], context, "email")


@django_jobs.subscriber("blocking", group="ops", on_failure="block", max_attempts=1, start_from="beginning")
def ops(message, context):
    _behave([message], context, "ops")


@django_jobs.subscriber("spread", group="sorter", batch=3, concurrency=2, start_from="beginning")
def sorter(messages, context):
    for m in messages:
        _deliver(m, context, "sorter")


def _die(marker: str) -> None:
    with open(marker, "w"):
        pass
    os._exit(1)


def _die_after_cursor_update(marker):
    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("UPDATE") and "django_jobs_group_cursor" in sql:
            _die(marker)
        return result

    return wrapper


@django_jobs.subscriber("ledger", group="books", atomic=True, max_attempts=5, backoff=0, start_from="beginning")
def books(message, context):
    """Writes a LogEntry, enqueues a job and publishes a message: all of it exactly once."""
    p = message.payload
    crash, marker = p.get("crash"), p.get("marker")
    armed = bool(crash) and not os.path.exists(marker)
    if armed and crash == "before_writes":
        _die(marker)
    LogEntry.objects.create(user_id=p["user"], action_flag=ADDITION, object_repr=f"ledger-{p['n']}")
    noop.using(queue_name="ledger").enqueue()
    django_jobs.topic("ledger-out").publish({"n": p["n"]})
    if armed and crash == "after_writes":
        _die(marker)
    if armed and crash == "raise":
        with open(marker, "w"):
            pass
        raise RuntimeError("failing once after the writes")
    if armed and crash == "after_ack":
        connection.execute_wrappers.append(_die_after_cursor_update(marker))
    if armed and crash == "after_commit":
        transaction.on_commit(lambda: _die(marker))

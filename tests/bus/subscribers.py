"""Subscribers of the bus-mode process tests (tests/test_bus_worker.py). What a handler does is
told by its message's payload: ``probe`` (a JSON-lines file each delivery is recorded in),
``hold`` (wait until that file exists, after recording), ``fail_group`` with ``fail_while``
(the named group fails while that file exists), and for the atomic ``ledger`` subscriber
``crash`` with ``marker`` (die, or stop, once at that point, leaving the marker).

``JOBS_TEST_STOP_IN_TAKE=<marker>`` in a worker's environment: the first take of a batch, in
whichever worker that has it, creates the marker (its pid and ``time.monotonic()``) and SIGSTOPs
its process right after the take's cursor ``UPDATE``, inside the take's transaction."""

from __future__ import annotations

import os
import signal
import threading
import time

from django.contrib.admin.models import ADDITION, LogEntry
from django.db import connection, transaction
from django.db.backends.signals import connection_created

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


@django_jobs.subscriber("takeover", group="relay", batch=2, start_from="beginning")
def relay(messages, context):
    _behave(messages, context, "relay")


def _die(marker: str) -> None:
    with open(marker, "w"):
        pass
    os._exit(1)


def _stop(marker: str) -> bool:
    """Stop this process here, once among the workers sharing ``marker``: False if another
    process did already. Signalled to this thread, so this very thread stops (a signal to the
    process waits for the thread it was queued to, and this one would run on meanwhile)."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} {time.monotonic()}\n".encode())
    os.close(fd)
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    return True


def _after_cursor_update(marker, act):
    """An execute wrapper calling ``act(marker)`` after the first UPDATE of a group cursor (in a
    handler: its acknowledgement), then no more."""
    done = []

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not done and sql.lstrip().upper().startswith("UPDATE") and "django_jobs_group_cursor" in sql:
            done.append(True)
            act(marker)
        return result

    return wrapper


def _stop_in_take(marker):
    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        # The take's guarded UPDATE: the only cursor update counting an attempt in a CASE.
        if "django_jobs_group_cursor" in sql and "CASE WHEN" in sql and sql.lstrip().upper().startswith("UPDATE"):
            _stop(marker)
        return result

    return wrapper


if os.environ.get("JOBS_TEST_STOP_IN_TAKE"):

    def _wrap_new_connection(sender, connection, **kwargs):
        connection.execute_wrappers.append(_stop_in_take(os.environ["JOBS_TEST_STOP_IN_TAKE"]))

    connection_created.connect(_wrap_new_connection, weak=False)


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
    django_jobs.topic("ledger-out").publish({"n": p["n"]})  # locks ledger-out's partition row
    if armed and crash == "after_writes":
        _die(marker)
    if armed and crash == "stop_after_writes":
        _stop(marker)
    if armed and crash == "raise":
        with open(marker, "w"):
            pass
        raise RuntimeError("failing once after the writes")
    if armed and crash == "after_ack":
        connection.execute_wrappers.append(_after_cursor_update(marker, _die))
    if armed and crash == "stop_after_ack":
        connection.execute_wrappers.append(_after_cursor_update(marker, _stop))
    if armed and crash == "after_commit":
        transaction.on_commit(lambda: _die(marker))

"""Tasks the tests enqueue. Module-level, so subprocess workers can import them too.

Side effects go to the ``Probe`` model-free channel: a JSON-lines file named by the
``JOBS_TEST_PROBE`` env var or the path given as an argument, so subprocess workers can report.
"""

import asyncio
import json
import os
import time

from django.tasks import task


def record(path: str, **data) -> None:
    """Append one JSON line to ``path``: one ``write`` of an O_APPEND file, so the lines of
    threads and processes never interleave, and nothing is locked. (A lock would be held by a
    process SIGSTOPped while it writes, and every other writer would wait for its SIGCONT.)"""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(data) + "\n").encode())
    finally:
        os.close(fd)


def read_records(path: str) -> list[dict]:
    """The lines ``record`` wrote to ``path``; a last line still being written is left out."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        text = fh.read()
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


@task
def noop() -> None:
    return None


@task
def add(a, b):
    return a + b


@task
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task
def returns_tuple(a, b):
    return (a, b)


@task
def mark(path: str, key) -> str:
    """Records that it ran (with the worker's pid) and returns ``key``."""
    record(path, key=key, pid=os.getpid())
    return key


@task
def sleep_then_mark(path: str, key, seconds: float) -> str:
    record(path, key=key, event="start", pid=os.getpid())
    time.sleep(seconds)
    record(path, key=key, event="end", pid=os.getpid())
    return key


@task(max_attempts=3, backoff=0, takes_context=True)
def fail_until(context, path: str, succeed_on: int) -> int:
    """Fails until attempt ``succeed_on``; records every attempt."""
    record(path, attempt=context.attempt, pid=os.getpid())
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(max_attempts=2, backoff=0)
def always_fails(message: str = "boom"):
    raise ValueError(message)


@task
def returns_non_json():
    return {1, 2, 3}


@task
async def async_add(a, b):
    await asyncio.sleep(0.01)
    return a + b


@task(takes_context=True)
def context_info(context):
    return {
        "attempt": context.attempt,
        "job_id": context.job_id,
        "queue": context.queue,
        "max_attempts": context.max_attempts,
    }


@task(priority=10)
def high_priority(path: str, key) -> None:
    record(path, key=key)


not_a_task = "just a string"


# -- backend contract tests (tests/test_backend.py) -------------------------------------------


@task(backend="limited")
def limited_echo(*args, **kwargs):
    """On the ``limited`` backend: QUEUES default/emails, MAX_ATTEMPTS=2, MAX_PAYLOAD_BYTES=1024."""
    return {"args": list(args), "kwargs": kwargs}


@task(backend="limited", max_attempts=5, backoff=[1, 2, 4])
def limited_configured():
    return None


@task(max_attempts=4, backoff="exponential")
def exponential_retries():
    return None


# -- worker and fault tests (tests/test_worker.py, test_faults.py, test_runworker_command.py) ---


@task(max_attempts=3, backoff=0, takes_context=True)
def fail_until_timed(context, path: str, key, succeed_on: int) -> int:
    """Like ``fail_until``, and records when each attempt started and the row's ``available_at``
    then (which the previous failure's backoff set), so tests can measure each retry delay."""
    from django_jobs.models import Job

    job = Job.objects.get(id=context.job_id)
    record(
        path,
        key=key,
        attempt=context.attempt,
        at=time.time(),
        available_at=job.available_at.isoformat(),
        errors_at=[e["at"] for e in job.errors],
    )
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
def context_details(context) -> dict:
    """Returns what a task with ``takes_context=True`` receives."""
    cls = type(context)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "attempt": context.attempt,
        "job_id": context.job_id,
        "result_id": context.task_result.id,
        "queue": context.queue,
        "max_attempts": context.max_attempts,
        "is_last_attempt": context.is_last_attempt,
        "parent_id": context.parent_id,
    }


@task
def exits():
    """Calls sys.exit(): recorded as the attempt's failure, never kills or loops the worker."""
    import sys

    sys.exit(3)


# -- handler actions (issue 3) ---------------------------------------------------------------


def stop_after_two(attempt, exc):
    """A callable backoff: retry at once after attempt 1, stop after attempt 2."""
    return None if attempt >= 2 else 0


@task(takes_context=True, max_attempts=3, backoff=0)
def acts(context, path: str, action: str):
    """Records each attempt, then does ``action`` on the first attempt and succeeds after."""
    from django_jobs import Fail

    record(path, attempt=context.attempt, action=action)
    first = len(read_records(path)) == 1
    if action == "fail":
        context.fail("given up on purpose")
    if action == "fail-exception":
        raise Fail(KeyError("missing"))
    if action == "retry" and first:
        context.retry("try again", delay=0)
    if action == "retry-backoff" and first:
        context.retry()
    if action == "snooze" and first:
        context.snooze(0.3)
    return context.attempt


@task(max_attempts=3, backoff=0)
def raises_action(path: str, action: str):
    """The same actions as exceptions, for a task without context."""
    from django_jobs import Fail, Retry, Snooze

    record(path, action=action)
    first = len(read_records(path)) == 1
    if action == "fail":
        raise Fail("no context needed")
    if action == "retry" and first:
        raise Retry(delay=0)
    if action == "snooze" and first:
        raise Snooze(0.3)
    return "done"


@task(max_attempts=5, backoff=stop_after_two)
def always_fails_with_callable_backoff(path: str):
    record(path, event="attempt")
    raise RuntimeError("still broken")


@task(takes_context=True)
def reports_progress(context, path: str):
    """Sets progress, then waits (up to 20 s) for the test to create ``path`` + '.go'."""
    context.set_progress(42)
    deadline = time.monotonic() + 20
    while not os.path.exists(path + ".go") and time.monotonic() < deadline:
        time.sleep(0.02)
    context.set_progress({"step": "done", "pct": 100})
    return "ok"


@task(takes_context=True)
def chatty(context, threads: int, lines: int):
    """Logs ``lines`` numbered lines from each of ``threads`` threads at once."""
    import threading

    def write(t):
        from django.db import connection

        for i in range(lines):
            context.log(f"t{t} {i}")
        connection.close()  # each thread had its own connection

    workers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return threads * lines


@task(takes_context=True)
def until_cancelled(context, path: str):
    """Runs until cancelled (up to 20 s); records when it noticed."""
    record(path, event="start")
    deadline = time.monotonic() + 20
    while not context.is_cancelled():
        if time.monotonic() > deadline:
            return "never cancelled"
        time.sleep(0.02)
    record(path, event="noticed", at=time.time())
    return "stopped"


# -- LIFO and enqueue_many (tests/contract/test_lifo_and_bulk.py) ---------------------------------------


@task(lifo=True)
def lifo_mark(path: str, key) -> str:
    """``mark`` as a LIFO task: claimed before FIFO jobs of its priority, newest first."""
    record(path, key=key, pid=os.getpid())
    return key


@task(retention={"completed": {"count": 2}})
def keeps_two_latest(value=None):
    """Declared in the app's tasks.py, which a worker and ``jobs prune`` import: the pruner
    knows its count limit in any process."""
    return value


# -- lost answers (tests/test_lost_answers.py) -------------------------------------------------

if os.environ.get("JOBS_TEST_FINISHED_PROBE"):
    # A subprocess worker records every task_finished it sends (connected when the worker imports
    # this module, before it runs the first task of it or of a module importing it).
    from django.tasks.signals import task_finished

    def _record_task_finished(sender, task_result, **kwargs) -> None:
        record(
            os.environ["JOBS_TEST_FINISHED_PROBE"],
            event="task_finished",
            id=str(task_result.id),
            status=str(task_result.status),
            pid=os.getpid(),
        )

    task_finished.connect(_record_task_finished, dispatch_uid="tests.tasks.record_task_finished")

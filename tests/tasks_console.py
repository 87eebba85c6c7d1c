"""Tasks for the event log, metrics and retention tests (tests/test_events.py,
tests/contract/test_metrics.py, test_retention.py). Module-level, so subprocess workers can import them too."""

import time

from django.tasks import task

from django_jobs import Dedup
from tests.tasks import record


@task
def ok(value=None):
    return value


@task
def sleeps_ms(ms: int) -> int:
    """Runs about ``ms`` milliseconds: what the metrics' runtime_ms must account for."""
    time.sleep(ms / 1000)
    return ms


@task(max_attempts=1)
def fails(message: str = "boom"):
    raise ValueError(message)


@task(max_attempts=2, backoff=0, takes_context=True)
def fails_first_attempt(context, path: str = "", key: str = "") -> int:
    """Fails attempt 1 (a retry), completes attempt 2; records the attempt that completed."""
    if context.attempt < 2:
        raise RuntimeError(f"attempt {context.attempt} fails")
    if path:
        record(path, key=key, attempt=context.attempt)
    return context.attempt


@task(takes_context=True)
def reports_progress(context, value) -> bool:
    return context.set_progress(value)


@task(takes_context=True)
def logs_lines(context, n: int) -> int:
    for i in range(n):
        context.log(f"line {i}")
    return n


@task
def snoozes() -> None:
    from django_jobs import Snooze

    raise Snooze(3600)


@task(takes_context=True)
def records_and_completes(context, path: str, key: str) -> str:
    record(path, key=key, attempt=context.attempt)
    return key


# -- retention ---------------------------------------------------------------------------------


@task(retention={"completed": 120})
def kept_two_minutes(value=None):
    return value


@task(retention={"completed": None, "failed": None})
def kept_forever(value=None):
    return value


@task(retention={"completed": 0})
def purged_at_once(value=None):
    return value


@task(retention={"completed": True})
def purged_true(value=None):
    return value


@task(retention={"completed": {"count": 2}})
def keeps_two(value=None):
    return value


@task(dedup=Dedup(lambda args, kwargs: f"retained:{args[0]}"), retention={"completed": 0})
def deduped_purged(item: int) -> int:
    return item


@task(retention={"completed": 0}, takes_context=True)
def gather_purged(context) -> dict:
    """A flow parent purged as soon as it completes."""
    return context.children_results()

"""Tasks for timeouts, cancellation, middleware and signals (tests/test_timeouts_cancel.py)."""

import asyncio
import contextvars
import os
import time

from django.tasks import task

from tests.tasks import record

#: Set by tests.tasks_control.tenant_middleware; read by tasks to show what a middleware set.
current_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("current_tenant", default=None)


@task(timeout=0.5)
def sleeps(path: str, seconds: float) -> str:
    """A sync task that ignores its timeout: it sleeps, then records that it finished."""
    record(path, event="start", pid=os.getpid())
    time.sleep(seconds)
    record(path, event="end")
    return "finished"


@task(timeout=0.5, max_attempts=2, backoff=0)
def sleeps_twice(path: str, seconds: float) -> str:
    record(path, event="start")
    time.sleep(seconds)
    return "finished"


@task(timeout=0.5)
async def async_sleeps(path: str, seconds: float) -> str:
    record(path, event="start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record(path, event="cancelled")
        raise
    return "finished"


@task(timeout=0.5)
def spins(path: str) -> None:
    """CPU-bound and never ending: only a killed process stops it."""
    record(path, event="start", pid=os.getpid())
    while True:
        pass


@task
def pid_of_runner(path: str) -> int:
    record(path, event="ran", pid=os.getpid())
    return os.getpid()


@task
def crashes_interpreter() -> None:
    os._exit(9)


@task
async def async_until_cancelled(path: str) -> str:
    record(path, event="start")
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        record(path, event="cancelled")
        raise
    return "never cancelled"


@task
def reads_tenant() -> str | None:
    return current_tenant.get()


@task
async def async_reads_tenant() -> str | None:
    return current_tenant.get()


@task(max_attempts=3)
def fails_once_then_snoozes(path: str) -> None:
    from django_jobs import Retry, Snooze

    if not os.path.exists(path):
        record(path, event="retry")
        raise Retry(delay=0)
    raise Snooze(3600)


# -- middleware (DJANGO_JOBS["MIDDLEWARE"]) ------------------------------------------------------

#: Calls seen by the middlewares below, in order: ("outer"|"inner", "before"|"after"|"error", ...).
CALLS: list[tuple] = []


def outer_middleware(call_next):
    def handler(context):
        CALLS.append(("outer", "before", context.job_id))
        try:
            value = call_next(context)
        except Exception as exc:
            CALLS.append(("outer", "error", type(exc).__name__))
            raise
        CALLS.append(("outer", "after", value))
        return value

    return handler


def inner_middleware(call_next):
    def handler(context):
        CALLS.append(("inner", "before", context.task_result.task.name))
        value = call_next(context)
        CALLS.append(("inner", "after", value))
        return value

    return handler


def tenant_middleware(call_next):
    def handler(context):
        token = current_tenant.set(f"tenant-of-{context.queue}")
        try:
            return call_next(context)
        finally:
            current_tenant.reset(token)

    return handler


def raising_middleware(call_next):
    def handler(context):
        raise RuntimeError("middleware refused")

    return handler


def not_a_factory_result(call_next):
    return "not callable"


@task
def ignores_cancel(path: str) -> str:
    """Never looks at context.is_cancelled(): only killing its process stops it early."""
    record(path, event="start", pid=os.getpid())
    time.sleep(30)
    return "finished"


def factory_that_raises(call_next):
    raise KeyError("missing configuration")


# -- the async mode (tests/test_worker_async.py) --------------------------------------------------


def parked_executor_threads() -> int:
    """How many of this worker's executor threads are waiting on a coroutine (in the executor's
    ``_invoke``): the async mode parks none."""
    import sys
    import threading

    names = {t.ident: t.name for t in threading.enumerate()}
    parked = 0
    for ident, frame in sys._current_frames().items():
        if not names.get(ident, "").startswith("jobs-exec"):
            continue
        while frame is not None:
            if frame.f_code.co_name == "_invoke" and frame.f_code.co_filename.endswith("executor.py"):
                parked += 1
                break
            frame = frame.f_back
    return parked


@task
async def async_sleep_then_mark(path: str, key: str, seconds: float) -> str:
    import threading

    record(path, key=key, event="start", pid=os.getpid(), parked=parked_executor_threads(),
           thread=threading.current_thread().name)  # fmt: skip
    await asyncio.sleep(seconds)
    record(path, key=key, event="end", pid=os.getpid())
    return key


@task(timeout=1)
async def async_ignores_cancel(path: str) -> str:
    """Swallows the CancelledError of its timeout and goes on: its late result is discarded."""
    record(path, event="start")
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        record(path, event="cancelled")
    await asyncio.sleep(3)
    record(path, event="end")
    return "late"

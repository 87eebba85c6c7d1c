"""Demo tasks: plain Django @task functions; django-jobs options are extra keyword arguments."""

import asyncio

from django.core.cache import cache
from django.tasks import task


@task
def add(a: int, b: int) -> int:
    """Succeeds."""
    return a + b


@task(max_attempts=3, backoff=1, takes_context=True)
def flaky(context, name: str) -> str:
    """Fails on its first attempt, succeeds on the second."""
    if context.attempt == 1:
        raise ConnectionError(f"{name}: the upstream service is down (attempt 1)")
    return f"{name} ok on attempt {context.attempt}"


@task(queue_name="reports")
def delayed_report(title: str) -> dict:
    """Enqueued with run_after 3 seconds ahead: it waits, delayed, until then."""
    return {"title": title, "pages": 3}


@task(max_attempts=2, backoff=0)
def broken(order_id: int) -> None:
    """Fails for good (twice)."""
    raise ValueError(f"order {order_id} has no customer")


@task
async def ping(host: str) -> str:
    """An async task: runs on the worker's event loop."""
    await asyncio.sleep(0.05)
    return f"pong from {host}"


__all__ = ["add", "flaky", "delayed_report", "broken", "ping", "cache"]

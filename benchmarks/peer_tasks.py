"""The tasks ``benchmarks/peers.py`` adds to those of ``benchmarks/tasks.py``: I/O-bound jobs
that wait without using the CPU, as a blocking call and as a coroutine. pgqueuer's side runs the
same two (``benchmarks/pgqueuer_side.py``: ``sleep_sync``, ``sleep_async``)."""

import asyncio
import time

from django.tasks import task


@task
def sleep_sync(seconds: float) -> None:
    """Blocks its thread for ``seconds`` (``time.sleep``): a job waiting on blocking I/O."""
    time.sleep(seconds)


@task
async def sleep_async(seconds: float) -> None:
    """Awaits ``asyncio.sleep(seconds)``: a job waiting on asynchronous I/O."""
    await asyncio.sleep(seconds)

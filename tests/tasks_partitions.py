"""Tasks for the partition tests (tests/contract/test_partitions.py). Module-level, so subprocess workers
import them too; they report through the JSON-lines probe (tests.tasks.record)."""

import os
import time

from django.tasks import task

from tests.tasks import record


@task
def seq_mark(path: str, partition, seq: int) -> int:
    """Records that job ``seq`` of ``partition`` ran."""
    record(path, partition=partition, seq=seq)
    return seq


@task(takes_context=True)
def context_partition(context) -> dict:
    """Returns what the context says about the job's partition and queue."""
    return {"partition": context.partition, "queue": context.queue}


@task(takes_context=True)
def leaf(context, path: str, key: str) -> str:
    """A flow node: records its key and partition."""
    record(path, key=key, partition=context.partition)
    return key


@task(max_attempts=2, backoff=0.1, takes_context=True)
def step(context, path: str, partition: str, seq: int, fail_first: bool, seconds: float) -> int:
    """One job of a partition for the real-process tests: records its start and its end with the
    system-wide monotonic clock (CLOCK_MONOTONIC, shared by every process of the machine) and
    the pid; with ``fail_first``, the first attempt fails (after recording its end) so the retry,
    0.1 s later, is ``delayed`` meanwhile and must keep blocking its partition."""
    base = {"partition": partition, "seq": seq, "attempt": context.attempt, "pid": os.getpid()}
    record(path, event="start", t=time.monotonic(), **base)
    time.sleep(seconds)
    failing = fail_first and context.attempt == 1
    record(path, event="end", ok=not failing, t=time.monotonic(), **base)
    if failing:
        raise RuntimeError(f"{partition}/{seq}: attempt 1 fails on purpose")
    return seq

"""Tasks for the queue limits tests (tests/contract/test_limits.py). Module-level, so subprocess workers
import them too."""

import os
import threading
import time

from django.tasks import task

from tests.tasks import record


@task
def quick() -> None:
    return None


@task
def span(path: str, key: int, seconds: float) -> int:
    """Records when it started and ended (wall clock, shared by the processes of one host) and
    who ran it, sleeping ``seconds`` in between."""
    who = {"pid": os.getpid(), "thread": threading.get_ident()}
    record(path, key=key, event="start", at=time.time(), **who)
    time.sleep(seconds)
    record(path, key=key, event="end", at=time.time(), **who)
    return key

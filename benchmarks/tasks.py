"""The tasks the benchmark enqueues."""

import os
import time

from django.tasks import task


@task
def noop() -> None:
    """Does nothing: the benchmark measures the queue, not the work."""
    return None


def _append(directory: str, line: str) -> None:
    """One line appended to this process's file in ``directory``: one ``write`` of an O_APPEND
    file, so the threads of a process never interleave and nothing is locked."""
    fd = os.open(os.path.join(directory, f"{os.getpid()}.tsv"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@task(max_attempts=2, backoff=0, takes_context=True)
def probe(context, out: str, partition: str | None, seq: int, fail_mod: int = 0, sleep: float = 0.0) -> None:
    """For benchmarks/limits.py: records its attempt, a start line before its work and an end
    line after (``S``/``E``, partition, seq, attempt, time.time(), pid[, ok|fail]) in
    ``out/<pid>.tsv``; sleeps ``sleep`` seconds; with ``fail_mod``, the jobs whose
    ``seq % fail_mod == 3`` fail their first attempt (max_attempts=2, no backoff)."""
    pid, attempt = os.getpid(), context.attempt
    _append(out, f"S\t{partition}\t{seq}\t{attempt}\t{time.time():.6f}\t{pid}\n")
    if sleep:
        time.sleep(sleep)
    failing = bool(fail_mod) and seq % fail_mod == 3 and attempt == 1
    _append(out, f"E\t{partition}\t{seq}\t{attempt}\t{time.time():.6f}\t{pid}\t{'fail' if failing else 'ok'}\n")
    if failing:
        raise RuntimeError(f"seq {seq} fails its first attempt")


@task
def nap(seconds: float) -> None:
    """Sleeps ``seconds``: work that takes time, so workers drain slower than enqueuers fill."""
    time.sleep(seconds)

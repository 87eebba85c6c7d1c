"""``runworker --isolation process``: each executor slot runs its jobs in a child process.

The child is a fresh interpreter (``spawn``: forking a process that holds threads and database
connections is unsafe) that sets Django up, then runs jobs one at a time through the same
:class:`~django_jobs.worker.executor.Executor` as a thread would, and answers with the
:class:`~django_jobs.engine.Outcome`. The parent thread waits for the answer; at the job's
deadline, or when the job is cancelled, it kills the child (SIGKILL: nothing in the task can
delay it), records the attempt, and starts a new child for the next job.

Trade-off: a child costs an interpreter and a Django start-up (about half a second and
30-50 MiB) and each job a pipe round trip (about 0.1 ms), so use it for CPU-bound code or code
that may not finish, not for many tiny jobs.
"""

from __future__ import annotations

import logging
import multiprocessing
import os

from django.db import connections

from ..child import child_main

logger = logging.getLogger("django_jobs.worker")

#: Seconds a child gets to set Django up and say it is ready.
START_TIMEOUT = 60.0


class ChildProcess:
    """One child process and the pipe to it. Used by one executor thread at a time."""

    def __init__(self, *, worker_id: str, index: int):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        # Children read the same settings module; tests (and users with per-run databases)
        # change database names at run time, so hand those over explicitly.
        names = {alias: connections[alias].settings_dict["NAME"] for alias in connections}
        self.process = ctx.Process(
            target=child_main,  # in a module that imports no models before django.setup()
            args=(child_conn, worker_id, names, os.getpid()),
            name=f"jobs-child-{index}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()
        if not self.conn.poll(START_TIMEOUT):
            self.kill()
            raise RuntimeError(f"A job child process did not start within {START_TIMEOUT:.0f}s.")
        try:
            ready = self.conn.recv()
        except (EOFError, OSError):
            ready = "it exited during start-up; its traceback is on the worker's stderr"
        if ready != "ready":
            self.kill()
            raise RuntimeError(f"A job child process failed to start: {ready}")

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.join(5)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.conn.close()

    def close(self) -> None:
        """Ask the child to exit after its current job; kill it if it does not within 2 s."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(2)
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()

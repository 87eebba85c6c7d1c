"""The entry point of ``--isolation process`` children (see :mod:`django_jobs.worker.isolation`).

A module of its own: a spawned child imports the target's module before Django is set up, so
this one imports nothing that touches models at import time.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any


def child_main(conn: Connection, worker_id: str, db_names: dict[str, Any], parent_pid: int) -> None:
    """The child's loop: receive a ClaimedJob, run it, send its Outcome; None or EOF ends it.
    An ``atomic=True`` job runs in a transaction of this process and writes its own completion
    (django_jobs.worker.atomic)."""
    # The worker decides when a child ends (it kills it): a Ctrl-C or SIGTERM sent to the whole
    # process group must not cut a job short while the worker lets running jobs finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import django

        django.setup()
        from django.db import close_old_connections, connections

        for alias, name in db_names.items():
            connections.settings[alias]["NAME"] = name
        # Only now, after django.setup(): the executor imports the models (see the docstring).
        from .worker.atomic import execute_atomic
        from .worker.executor import Attempt, Executor, event_loop_thread, job_timeout
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure to the parent
        conn.send(f"{type(exc).__name__}: {exc}")
        return

    def orphan_watch() -> None:
        # A child whose worker was killed must not run on: leases hand its job to another worker.
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=orphan_watch, daemon=True).start()
    executor = Executor(worker_id=worker_id, loop_getter=event_loop_thread("jobs-child-asyncio"))
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        close_old_connections()
        try:
            attempt = Attempt(job, timeout=job_timeout(job))
            if "atomic" in job.options:
                # Its transaction is this process's: the worker killing it (timeout, cancel)
                # rolls it back. A completion comes back written (Outcome.written_as).
                outcome = execute_atomic(executor, job, attempt)
            else:
                outcome = executor.execute(job, attempt)
        finally:
            close_old_connections()
        if outcome is not None:
            # The worker process sends task_finished (with a result of its own): drop this
            # process's started result, or every job run here would stay in memory.
            executor.forget(outcome)
        conn.send(outcome)

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
import threading
import time

from django.db import connections

from .. import engine
from ..child import child_main
from ..exceptions import ChildProcessDied, JobCancelled, JobTimeout
from .executor import Attempt, Executor
from .stats import WorkerStats

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


class Children:
    """The child processes of one worker's executor slots, so shutdown can stop those still
    running jobs. Each executor thread runs its jobs through :meth:`run`, which starts, reuses
    or replaces the slot's child."""

    def __init__(self, *, worker_id: str, executor: Executor, stats: WorkerStats):
        self.worker_id = worker_id
        self._executor = executor
        self.stats = stats
        self._children: set[ChildProcess] = set()
        self._children_lock = threading.Lock()
        self._killing_children = threading.Event()

    def run(
        self, attempt: Attempt, child: ChildProcess | None, index: int
    ) -> tuple[engine.Outcome | None, ChildProcess | None]:
        """Run ``attempt`` in this slot's child process (started, as ``jobs-child-<index>``, or
        replaced as needed); kill the child at the deadline or on cancel. Returns the outcome
        and the child to reuse."""
        job = attempt.job
        if attempt.cancelled.is_set():  # cancelled after the claim: do not start it
            return self._executor.give_up(
                attempt, JobCancelled(f"Job {job.id} was cancelled before it started.")
            ), child
        if child is None or not child.alive:
            if child is not None:
                self.forget(child)
                child.kill()
            try:
                child = ChildProcess(worker_id=self.worker_id, index=index)
            except (RuntimeError, OSError) as exc:
                logger.error("Worker %s: %s", self.worker_id, exc)
                return self._executor.give_up(
                    attempt, ChildProcessDied(f"A job child process failed to start: {exc}")
                ), None
            with self._children_lock:
                self._children.add(child)
        attempt.start()  # after the child's start-up, which does not count against the job's time
        try:
            child.conn.send(job)
        except (OSError, ValueError) as exc:
            child.kill()
            return self._executor.give_up(
                attempt, ChildProcessDied(f"Could not hand the job to its child: {exc}")
            ), None
        while True:
            if self._killing_children.is_set():
                # Shutting down after the grace period: the child is killed and the job released.
                return None, None
            try:
                if child.conn.poll(0.05):
                    outcome = child.conn.recv()
                    if outcome is not None:
                        outcome.job = job  # not pickled: task_finished is sent from here
                    return (outcome if attempt.settle() else None), child
            except (EOFError, OSError, ValueError):  # the child died, or shutdown closed the pipe
                if self._killing_children.is_set():
                    return None, None
                break
            if attempt.cancelled.is_set():
                child.kill()
                logger.debug("Job %s was cancelled; killed its child process.", job.id)
                return self._executor.give_up(attempt, JobCancelled(f"Job {job.id} was cancelled while it ran; its "
                                                                    "child process was killed.")), None  # fmt: skip
            if attempt.deadline is not None and time.monotonic() >= attempt.deadline:
                child.kill()
                self.stats.timed_out += 1
                logger.warning("Job %s ran past its timeout of %gs; killed its child process.", job.id, attempt.timeout)
                return self._executor.give_up(attempt, JobTimeout(
                    f"{job.task_path} ran longer than its timeout of {attempt.timeout:g}s; its child process was "
                    "killed.")), None  # fmt: skip
            if not child.alive:
                if child.conn.poll(0):
                    continue  # it answered, then exited: read the answer
                break
        self.forget(child)
        child.process.join(2)  # the pipe closes a moment before the process can be reaped
        code = child.process.exitcode
        child.kill()
        logger.error("The child process running job %s died (exit code %s).", job.id, code)
        return self._executor.give_up(attempt, ChildProcessDied(
            f"The child process running {job.task_path} died (exit code {code}) before it answered; "
            "the code it ran crashed the interpreter or was killed.")), None  # fmt: skip

    def forget(self, child: ChildProcess) -> None:
        with self._children_lock:
            self._children.discard(child)

    def kill_all(self) -> None:
        """Kill every child (shutdown, after the grace period); the threads waiting on them give
        their jobs up without an outcome."""
        self._killing_children.set()
        with self._children_lock:
            children = list(self._children)
        for child in children:
            child.kill()

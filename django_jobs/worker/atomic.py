"""``atomic=True`` jobs: the task and the job's completion in one transaction.

The thread that runs an atomic job's attempt (an executor thread, or the child process with
``--isolation process``) runs it inside ``transaction.atomic()`` on the jobs database and,
still inside it, writes the job's completed outcome itself with
:func:`~django_jobs.engine.record_outcomes`, guarded like every outcome on (``active``, lease
token). So the task's ORM writes on that database, the jobs it enqueues, the messages it
publishes and the job's completion commit together or not at all:

* the task raises (or returns a value that is not JSON): the transaction is rolled back and
  the failure (retry, snooze, fail) goes to the completer like any attempt's;
* the guard refuses (the job was released or rescued meanwhile: its lease is lost): the
  transaction is rolled back, the task's writes with it, and the outcome is dropped with a
  warning;
* the worker gave the attempt up meanwhile (its timeout): the thread writes nothing and rolls
  back; the give-up's failed outcome stands (and would make the guard refuse anyway);
* the process dies before the commit: the database rolls back; the lease expires and the job
  runs again. Once the commit is done, nothing runs again.

The outcome comes back marked :attr:`~django_jobs.engine.Outcome.written_as`: the completer
does not write it again, only what follows a write (counts, the outcome's log line, the lease
bookkeeping, ``task_finished``). A plain job never comes here: the runner asks the job's
options once.
"""

from __future__ import annotations

import logging

from django.db import transaction

from .. import engine
from ..states import JobState
from ..tracing import running as running_trace
from .executor import Attempt, Begun, Executor, with_runtime

logger = logging.getLogger("django_jobs.worker")


class _RollBack(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Leave the transaction without committing; ``outcome``: what the attempt came to."""

    def __init__(self, outcome: engine.Outcome | None):
        super().__init__()
        self.outcome = outcome


def execute_atomic(executor: Executor, job: engine.ClaimedJob, attempt: Attempt) -> engine.Outcome | None:
    """Run one attempt of the atomic ``job`` and record its completion in the same transaction
    (see the module's doc). Returns its outcome: written already (``written_as`` set: the state
    stored, or :data:`~django_jobs.engine.DROPPED` when the guard refused it), or a failure for
    the completer to write; None when the worker gave the attempt up meanwhile. Never raises
    but for KeyboardInterrupt."""
    return with_runtime(attempt, _execute_atomic(executor, job, attempt))


def _execute_atomic(executor: Executor, job: engine.ClaimedJob, attempt: Attempt) -> engine.Outcome | None:
    begun = executor.begin(job, attempt)
    if not isinstance(begun, Begun):
        return begun  # cancelled before it started, or a task that does not resolve: nothing ran
    using = begun.context.database
    completed: engine.Outcome | None = None  # the outcome this thread settled the attempt with
    committed: list[bool] = []
    try:
        with running_trace(job.trace_id), transaction.atomic(using=using):
            # First of the transaction's on_commit callbacks: it runs once the commit is done,
            # before any the task registered, so one of those that raises cannot hide the commit.
            transaction.on_commit(lambda: committed.append(True), using=using)
            try:
                value = executor.chain_for(job.backend)(begun.context)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - a task's failure (SystemExit too) is recorded
                raise _RollBack(executor.conclude(job, attempt, begun.task, exc=exc)) from None
            outcome = executor.conclude(job, attempt, begun.task, value=value)
            if outcome is None:
                # The worker gave the attempt up (its timeout) and recorded that: nothing commits.
                logger.warning("Job %s: its transaction was rolled back, the task's writes included.", job.id)
                raise _RollBack(None)
            if outcome.state != JobState.COMPLETED:
                raise _RollBack(outcome)  # the return value was refused: the attempt failed
            completed = with_runtime(attempt, outcome)  # its run time is written with it
            written = engine.record_outcomes([outcome], using=using)
            state = written.get(outcome.job_id)
            if state is None:
                # The lease was lost (released or rescued meanwhile): record_outcomes logged it.
                logger.warning(
                    "Job %s: its outcome was refused (lease lost); its transaction was rolled back, the "
                    "task's writes included.",
                    job.id,
                )
                outcome.written_as = engine.DROPPED
                raise _RollBack(outcome)
            outcome.written_as = state
    except _RollBack as rolled:
        return rolled.outcome
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the write, the commit or an on_commit callback raised
        if committed:
            # The commit was done; a callback the task registered with on_commit raised.
            logger.exception("Job %s committed, then one of its on_commit callbacks raised.", job.id)
            return completed
        if completed is None:  # the transaction could not begin: the task did not run
            return executor.conclude(job, attempt, begun.task, exc=exc)
        # The outcome's write or the commit failed: rolled back (or, an answer lost, committed:
        # then the guard refuses this failure and the completed job stands).
        completed.written_as = None
        logger.warning("Job %s: recording its completion failed (%r); the attempt counts as failed.", job.id, exc)
        return with_runtime(attempt, executor.failure(job, exc))
    return completed


__all__ = ["execute_atomic"]

"""The worker's log line per stored outcome, on the ``django_jobs.worker.jobs`` logger.

One line per attempt that was written: a job that completed, failed for good or was cancelled
gets one line saying so; an attempt that failed and will run again gets one retry line with
the error's class and message; a snooze gets one line. The traceback of a failed attempt
follows at DEBUG only. An outcome the worker dropped (it lost the job to a rescue or a cancel)
is not an outcome and gets no line here; the completer warns about it.

=========================  =======  ===================================================================
state written              level    line
=========================  =======  ===================================================================
``completed``              INFO     ``Job <id> <task> completed on attempt 1/3 in 2.1 ms``
``delayed``/``waiting``    INFO     ``Job <id> <task> attempt 1/3 failed in 2.1 ms (ValueError: …); retrying in 10s``
``delayed`` (snoozed)      INFO     ``Job <id> <task> snoozed on attempt 1/3; runs again in 30s``
``cancelled``              INFO     ``Job <id> <task> cancelled on attempt 1/3 in 2.1 ms``
``failed``                 ERROR    ``Job <id> <task> failed on attempt 3/3 in 2.1 ms: ValueError: …``
=========================  =======  ===================================================================

An encrypted job's (``encrypt=True``) lines name the error's class only, never its message or
traceback, which may quote the arguments.

A job that failed for good is an ERROR, the level Django's own ``django.tasks`` logger gives
it, so alerts on ERROR records still see it when runworker quiets that logger.
"""

from __future__ import annotations

import logging

from django.utils import timezone

from ..engine import Outcome
from ..spec.encryption import is_encrypted
from ..states import JobState

job_logger = logging.getLogger("django_jobs.worker.jobs")


def log_outcome(o: Outcome, state: str) -> None:
    """Log the line for outcome ``o``, stored as ``state``, and its traceback at DEBUG."""
    if not job_logger.isEnabledFor(logging.INFO if state != JobState.FAILED else logging.ERROR):
        return
    job = o.job
    task = job.task_path if job is not None else "?"
    of = f"{o.attempt}/{job.max_attempts}" if job is not None else str(o.attempt)
    took = "" if o.runtime_ms is None else f" in {o.runtime_ms} ms" if o.runtime_ms else " in <1 ms"
    if state == JobState.COMPLETED:
        job_logger.info("Job %s %s completed on attempt %s%s", o.job_id, task, of, took)
    elif state == JobState.FAILED:
        job_logger.error("Job %s %s failed on attempt %s%s: %s", o.job_id, task, of, took, error_summary(o))
    elif state == JobState.CANCELLED:
        job_logger.info("Job %s %s cancelled on attempt %s%s", o.job_id, task, of, took)
    elif o.uncount_attempt:
        job_logger.info("Job %s %s snoozed on attempt %s; runs again %s", o.job_id, task, of, _when(o))
    else:
        job_logger.info(
            "Job %s %s attempt %s failed%s (%s); retrying %s", o.job_id, task, of, took, error_summary(o), _when(o)
        )
    if o.error is not None and job_logger.isEnabledFor(logging.DEBUG) and not _encrypted(o):
        job_logger.debug("Job %s attempt %s:\n%s", o.job_id, o.attempt, str(o.error.get("traceback", "")).rstrip())


def error_summary(o: Outcome) -> str:
    """``Class: message`` of the attempt's error, on one line (the exception itself when this
    process has it, else the last line of the stored traceback, as from a child process). An
    encrypted job's: the class only."""
    if _encrypted(o):
        name = (
            type(o.exc).__name__ if o.exc is not None else str((o.error or {}).get("exception_class_path", "an error"))
        )
        return f"{name.rpartition('.')[2]} (its message is not logged: the job is encrypted)"
    if o.exc is not None:
        message = " ".join(str(o.exc).split())
        return f"{type(o.exc).__name__}: {message}" if message else type(o.exc).__name__
    error = o.error or {}
    lines = str(error.get("traceback", "")).strip().splitlines()
    if lines:
        return lines[-1].strip()
    return str(error.get("exception_class_path", "an error")).rpartition(".")[2]


def _encrypted(o: Outcome) -> bool:
    if o.job is not None and o.job.options.get("encrypt"):
        return True
    return o.error is not None and is_encrypted(o.error.get("traceback"))


def _when(o: Outcome) -> str:
    if o.available_at is None:
        return "now"
    seconds = (o.available_at - timezone.now()).total_seconds()
    return "now" if seconds < 0.05 else f"in {seconds:.1f}s"

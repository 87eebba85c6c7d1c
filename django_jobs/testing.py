"""The test kit: assertions on enqueued jobs, and running jobs inline through the real worker
pipeline (Oban's ``Oban.Testing``, River's ``rivertest``; the seed's "dispatchSync" and "work
until empty").

Everything here runs in the calling thread on the jobs database, so it works inside a test's
transaction (``@pytest.mark.django_db``, ``django.test.TestCase``) as well as outside one::

    from django_jobs.testing import assert_enqueued, perform_job

    def test_signup_sends_welcome_email(client):
        client.post("/signup/", {"email": "ada@example.com"})
        [job] = assert_enqueued(send_welcome_email, kwargs={"email": "ada@example.com"})
        result = perform_job(send_welcome_email, email="ada@example.com")
        assert result.status == "SUCCESSFUL"

See docs/howto/testing.md.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.tasks import Task, task_backends
from django.utils import timezone

from . import engine
from .backend import JobResult, JobsBackend
from .exceptions import JobTimeout
from .models import Job
from .states import JobState
from .worker.atomic import execute_atomic
from .worker.executor import Attempt, Executor, job_timeout, outcome_for

__all__ = ["DrainResult", "assert_enqueued", "drain_queue", "enqueued_jobs", "perform_job", "refute_enqueued"]

#: The worker id recorded on jobs the test kit runs.
TEST_WORKER_ID = "django_jobs.testing"


# -- assertions ----------------------------------------------------------------------------------


def enqueued_jobs(
    task: Task | None = None,
    *,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    backend: str = "default",
) -> list[JobResult]:
    """Jobs not run yet (waiting or delayed), oldest first, as ``JobResult``s; only those of
    ``task``, with exactly these ``args`` (compared as a list) / ``kwargs`` / ``queue`` when given."""
    jobs_backend = task_backends[backend]
    qs = Job.objects.using(jobs_backend.database).filter(
        backend=backend, state__in=[JobState.WAITING, JobState.DELAYED]
    )
    if task is not None:
        _require_task(task, "enqueued_jobs")
        qs = qs.filter(task_path=task.module_path)
    if queue is not None:
        qs = qs.filter(queue=queue)
    if isinstance(args, (str, bytes, dict)):
        raise TypeError(f"args must be a list or tuple of positional arguments; got {type(args).__name__}.")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict; got {type(kwargs).__name__}.")
    # Compare with what was stored: the JSON round trip turns tuples into lists.
    want_args = json.loads(json.dumps(list(args))) if args is not None else None
    if kwargs is not None:
        kwargs = json.loads(json.dumps(kwargs))
    results = []
    for job in qs.order_by("enqueued_at", "id"):
        result = jobs_backend._result_from_job(job)  # an encrypted job's arguments decrypted
        if want_args is not None and result.args != want_args:
            continue
        if kwargs is not None and result.kwargs != kwargs:
            continue
        results.append(result)
    return results


def assert_enqueued(
    task: Task,
    *,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    count: int | None = None,
    backend: str = "default",
) -> list[JobResult]:
    """Assert that ``task`` has a job not run yet matching what is given (exactly ``count`` of
    them when given); return the matches. The AssertionError lists what is enqueued instead."""
    _require_task(task, "assert_enqueued")
    found = enqueued_jobs(task, args=args, kwargs=kwargs, queue=queue, backend=backend)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    wanted = _describe(args, kwargs, queue)
    expected = f"{count} job(s)" if count is not None else "a job"
    raise AssertionError(
        f"Expected {expected} of {task.module_path}{wanted} enqueued, found {len(found)}. "
        f"Enqueued for this task: {_listing(task, backend)}"
    )


def refute_enqueued(
    task: Task,
    *,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    backend: str = "default",
) -> None:
    """Assert that ``task`` has no job not run yet matching what is given."""
    _require_task(task, "refute_enqueued")
    found = enqueued_jobs(task, args=args, kwargs=kwargs, queue=queue, backend=backend)
    if found:
        raise AssertionError(
            f"Expected no job of {task.module_path}{_describe(args, kwargs, queue)} enqueued, found "
            f"{len(found)}: {_listing(task, backend)}"
        )


def _require_task(task: Any, where: str) -> None:
    if not isinstance(task, Task):
        raise TypeError(f"{where}() takes a @task function (a django.tasks.Task); got {type(task).__name__}.")


def _describe(args: Any, kwargs: Any, queue: Any) -> str:
    parts = []
    if args is not None:
        parts.append(f"args={list(args)!r}")
    if kwargs is not None:
        parts.append(f"kwargs={kwargs!r}")
    if queue is not None:
        parts.append(f"queue={queue!r}")
    return f" with {', '.join(parts)}" if parts else ""


def _listing(task: Task, backend: str) -> str:
    jobs = enqueued_jobs(task, backend=backend)
    if not jobs:
        return "none."
    shown = [f"(args={r.args!r}, kwargs={r.kwargs!r}, queue={r.task.queue_name!r})" for r in jobs[:10]]
    more = f" and {len(jobs) - 10} more" if len(jobs) > 10 else ""
    return "; ".join(shown) + more + "."


# -- running jobs ------------------------------------------------------------------------------


@dataclass
class DrainResult:
    """What :func:`drain_queue` ran, by what each attempt came to."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    retried: int = 0
    snoozed: int = 0
    _snoozed: set[uuid.UUID] = field(default_factory=set, repr=False, compare=False)

    @property
    def total(self) -> int:
        return self.completed + self.failed + self.cancelled + self.retried + self.snoozed


def perform_job(task: Task, *args: Any, **kwargs: Any) -> JobResult:
    """Enqueue ``task(*args, **kwargs)`` (validated and JSON round-tripped like any enqueue) and
    run ONE attempt of it now, in this thread, through the worker's executor: middleware,
    ``JobContext``, signals and backoff included. Returns the stored result: SUCCESSFUL, FAILED,
    or READY when a retry or snooze is scheduled (the error is in ``result.errors``)."""
    _require_task(task, "perform_job")
    backend = task.get_backend()
    if not isinstance(backend, JobsBackend):
        raise TypeError(
            f"perform_job() runs jobs of django_jobs.backend.JobsBackend; {task.module_path} uses "
            f"{type(backend).__name__} (TASKS[{task.backend!r}])."
        )
    result = task.enqueue(*args, **kwargs)
    job_id = uuid.UUID(result.id)
    engine.make_due(using=backend.database, job_ids=[job_id])  # run_after is not waited for
    claimed = engine.claim_jobs(
        using=backend.database,
        queues=None,
        limit=1,
        worker_id=TEST_WORKER_ID,
        lease_seconds=3600,
        backend=backend.alias,
        job_ids=[job_id],
    )
    if not claimed:  # only a deduplicated enqueue returns a job that is not ours to start
        state = Job.objects.using(backend.database).values_list("state", flat=True).get(id=job_id)
        raise RuntimeError(
            f"perform_job() ran nothing: the enqueue was a duplicate of job {job_id}, which is {state}, not "
            "waiting. Use a dedup or idempotency key that is free, or drain_queue() to run what is enqueued."
        )
    _run(claimed[0], backend.database, DrainResult())
    return backend.get_result(result.id)


def drain_queue(
    queue: str | None = None,
    *,
    with_retries: bool = True,
    with_scheduled: bool = False,
    backend: str = "default",
    max_rounds: int = 100,
) -> DrainResult:
    """Run every ready job of ``queue`` (all queues when None) in this thread until none is left.

    ``with_retries``: a retry waiting for its backoff runs at once instead. ``with_scheduled``:
    jobs delayed by ``run_after`` (and snoozed ones) run too. Each round first makes the stashed
    enqueue of a ``keep_last_if_active`` dedup key a job once its holder finished, as the worker's
    dedup sweeper would. Concurrency and rate limits are not applied (jobs run one at a time
    here); pauses are, and a partition's jobs run in order, one per round. Raises RuntimeError
    after ``max_rounds`` rounds in a row that started none of the jobs that were ready when the
    drain began (a job that keeps retrying, snoozing or enqueueing another).
    """
    if not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds must be an integer >= 1; got {max_rounds!r}.")
    jobs_backend = task_backends[backend]
    using = jobs_backend.database
    counts = DrainResult()
    rounds = 0
    seen: set[uuid.UUID] = set()
    scope = Job.objects.using(using).filter(backend=backend, state__in=["waiting", "delayed"])
    waiting_at_start = set((scope.filter(queue=queue) if queue else scope).values_list("id", flat=True))
    while rounds < max_rounds:
        rounds += 1
        engine.promote_dedup_stashes(using=using, limit=1000, backend=backend)
        engine.unblock_partitions(using=using, limit=1000)  # as the worker's partition sweeper would
        _make_due(
            using, backend, queue, with_retries=with_retries, with_scheduled=with_scheduled, snoozed=counts._snoozed
        )
        claimed = engine.claim_jobs(
            using=using,
            queues=[queue] if queue else None,
            limit=100,
            worker_id=TEST_WORKER_ID,
            lease_seconds=3600,
            backend=backend,
            skip_gated=False,
        )
        if not claimed:
            return counts
        fresh = ({job.id for job in claimed} & waiting_at_start) - seen
        if fresh:
            # Progress through what was enqueued before the drain (a partition's jobs come one per
            # round); jobs the drain itself creates (a job enqueueing another) count as rounds.
            seen |= fresh
            rounds = 0
        for job in claimed:
            _run(job, using, counts)
    hint = "with_scheduled=False (snoozed jobs then stay delayed)" if with_scheduled else "with_retries=False"
    raise RuntimeError(
        f"drain_queue() still found jobs to run after {max_rounds} rounds: a job keeps retrying or snoozing. "
        f"Pass {hint}, or a larger max_rounds."
    )


def _make_due(
    using: str, backend: str, queue: str | None, *, with_retries: bool, with_scheduled: bool, snoozed: set[uuid.UUID]
) -> None:
    """Move delayed jobs to waiting: those whose time has come (as the promoter would), retries
    (``with_retries``), and jobs delayed by run_after or a snooze (``with_scheduled``).

    A retry is told from a scheduled job by the error its failed attempt recorded; ``snoozed``
    holds the jobs this drain saw snooze (a job snoozed after an earlier failure has an error too).
    """
    qs = Job.objects.using(using).filter(backend=backend, state=JobState.DELAYED)
    if queue:
        qs = qs.filter(queue=queue)
    now = timezone.now()
    ids = []
    for job_id, errors, available_at in qs.values_list("id", "errors", "available_at"):
        is_retry = bool(errors) and job_id not in snoozed
        if available_at <= now or (with_retries and is_retry) or (with_scheduled and not is_retry):
            ids.append(job_id)
    engine.make_due(using=using, job_ids=ids)


def _run(job: engine.ClaimedJob, using: str, counts: DrainResult) -> None:
    attempt = Attempt(job, timeout=job_timeout(job))
    if "atomic" in job.options:  # as the worker runs it: the task and its completion in one transaction
        outcome = execute_atomic(_executor(), job, attempt)
    else:
        outcome = _executor().execute(job, attempt)
    if outcome is None:  # cannot happen without a watchdog; keep the job from staying active
        outcome = outcome_for(job, state=JobState.FAILED)
    if outcome.written_as is None:
        written = engine.record_outcomes([outcome], using=using)
    else:  # written by its own transaction (or refused: nothing stored)
        written = {job.id: outcome.written_as} if outcome.written_as else {}
    state = written.get(job.id)
    if state is not None:
        _executor().send_finished(outcome, state)  # after the write, as a worker sends it
    else:
        _executor().forget(outcome)  # not stored: no task_finished, drop its started result
    if state == JobState.COMPLETED:
        counts.completed += 1
    elif state == JobState.FAILED:
        counts.failed += 1
    elif state == JobState.CANCELLED:
        counts.cancelled += 1
    elif outcome.uncount_attempt:
        counts.snoozed += 1
        counts._snoozed.add(job.id)
    elif state is not None:
        counts.retried += 1


_state = threading.local()


def _run_async_here(coro: Any, attempt: Attempt) -> Any:
    """Run an async task's coroutine from this thread with asgiref's ``async_to_sync``: the ORM
    calls inside it (``sync_to_async``, thread-sensitive) come back to this thread and its
    connection, so they see the test's data, transaction and all."""
    from asgiref.sync import async_to_sync

    async def run() -> Any:
        if attempt.timeout:
            return await asyncio.wait_for(coro, attempt.timeout)
        return await coro

    try:
        return async_to_sync(run)()
    except TimeoutError as exc:
        if attempt.remaining() == 0:
            raise JobTimeout(f"The task ran longer than its timeout of {attempt.timeout:g}s.") from exc
        raise


def _executor() -> Executor:
    """One executor per thread; async tasks run from the calling thread (see _run_async_here)."""
    executor = getattr(_state, "executor", None)
    if executor is None:
        executor = Executor(worker_id=TEST_WORKER_ID, run_async=_run_async_here)
        _state.executor = executor
    return executor

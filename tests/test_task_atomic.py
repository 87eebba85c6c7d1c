"""``atomic=True`` tasks: the task's ORM writes, the jobs it enqueues, the messages it publishes
and the job's completion commit in one transaction. Real ``manage.py runworker`` processes with
a crash injected at each point (before the writes, after them, a raise, after the outcome's
UPDATE but before the COMMIT, after the COMMIT), a lost lease, a timeout (thread and child
process), flows, the test kit, and the validation of the option.
"""

from __future__ import annotations

import os
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.tasks import TaskResultStatus, task
from django.tasks.signals import task_finished, task_started

from django_jobs import engine, flow
from django_jobs.backend import JOB_OPTIONS
from django_jobs.exceptions import InvalidTaskOptions
from django_jobs.models import Event, Job, Message
from django_jobs.testing import perform_job
from tests import tasks, tasks_atomic
from tests.conftest import read_log, wait_until
from tests.tasks import read_records

DB = pytest.mark.django_db(transaction=True)
SHORT_LEASE = {"JOBS_TEST_LEASE": "2"}
ARGS = ("-q", tasks_atomic.QUEUE, "--sleep", "0.1", "--grace", "2")


@pytest.fixture
def user():
    return User.objects.create(username="books")


def effects() -> tuple[list[str], int, list[int]]:
    """What the tasks left: the LogEntry reprs, the jobs they enqueued, the messages' n."""
    reprs = sorted(LogEntry.objects.values_list("object_repr", flat=True))
    enqueued = Job.objects.filter(queue=tasks_atomic.OUT).count()
    published = sorted(Message.objects.filter(topic=tasks_atomic.OUT).values_list("payload__n", flat=True))
    return reprs, enqueued, published


def completed_events(job_id) -> int:
    return Event.objects.filter(job_id=job_id, kind="completed").count()


def all_completed(ids) -> bool:
    return Job.objects.filter(id__in=list(ids), state="completed").count() == len(ids)


# -- the option -------------------------------------------------------------------------------


@DB
def test_atomic_is_stored_in_the_jobs_options(user):
    atomic = tasks_atomic.book.enqueue(1, user.pk)
    turned_off = tasks_atomic.book.using(atomic=False).enqueue(2, user.pk)
    turned_on = tasks_atomic.book_plainly.using(atomic=True).enqueue(3, user.pk)
    plain = tasks_atomic.book_plainly.enqueue(4, user.pk)
    options = dict(Job.objects.filter(queue=tasks_atomic.QUEUE).values_list("id", "options"))
    assert options[uuid.UUID(atomic.id)].get("atomic") is True
    assert options[uuid.UUID(turned_on.id)].get("atomic") is True
    assert "atomic" not in options[uuid.UUID(turned_off.id)]
    assert "atomic" not in options[uuid.UUID(plain.id)]


@pytest.mark.parametrize("value", [1, "yes", 0])
def test_atomic_must_be_true_or_false(value):
    with pytest.raises(InvalidTaskOptions, match=r"atomic must be True or False; got .*docs/howto/atomic-tasks.md"):
        task(atomic=value)(tasks_atomic._book)
    with pytest.raises(InvalidTaskOptions, match="atomic must be True or False"):
        tasks.noop.using(atomic=value)


def test_atomic_refuses_an_async_def_task():
    with pytest.raises(InvalidTaskOptions, match=r"atomic=True needs a plain def task; .*async_add is an async def"):
        tasks.async_add.using(atomic=True)

    async def declared():  # the decorator refuses it before anything else looks at it
        return None

    declared.__qualname__ = declared.__name__  # module level, as Django requires
    with pytest.raises(InvalidTaskOptions, match="atomic=True needs a plain def task"):
        task(atomic=True)(declared)
    assert tasks.async_add.using(atomic=False).atomic is False


# -- exactly once, whatever the crash point ---------------------------------------------------


@DB
@pytest.mark.slow
@pytest.mark.parametrize("crash", ["before_writes", "after_writes", "raise", "after_outcome", "after_commit"])
def test_atomic_task_writes_exactly_once_whatever_the_crash_point(worker_process, tmp_path, user, crash):
    marker = str(tmp_path / "crashed")
    first_job = tasks_atomic.book.enqueue(1, user.pk, crash=crash, marker=marker)
    others = [tasks_atomic.book.enqueue(n, user.pk) for n in (2, 3)]
    ids = [first_job.id, *(r.id for r in others)]
    first = worker_process(*ARGS, env=SHORT_LEASE)
    if crash != "raise":
        assert first.wait(60) != 0, read_log(first)  # it died at the crash point
        assert os.path.exists(marker)
        if crash in ("before_writes", "after_writes", "after_outcome"):  # nothing of job 1 committed
            assert Job.objects.get(id=first_job.id).state in ("active", "waiting")
            assert effects() == ([], 0, [])
        second = worker_process(*ARGS, env=SHORT_LEASE)
    else:
        second = first
    wait_until(lambda: all_completed(ids), timeout=60, message=f"all three completed: {read_log(second)}")
    assert effects() == (["book-1", "book-2", "book-3"], 3, [1, 2, 3])
    for job_id in ids:
        job = Job.objects.get(id=job_id)
        assert (job.state, job.return_value) == ("completed", int(job.args[0]))
        assert completed_events(job_id) == 1
        # A run that died before its commit was rescued, its attempt not counted; a raise is one.
        assert job.attempts == (2 if crash == "raise" and job_id == first_job.id else 1)
    assert len(Job.objects.get(id=first_job.id).errors) == (1 if crash == "raise" else 0)


@DB
@pytest.mark.slow
def test_a_plain_task_killed_after_its_writes_writes_them_again(worker_process, tmp_path, user):
    """The contrast: without atomic the writes commit as they go (at least once)."""
    marker = str(tmp_path / "crashed")
    result = tasks_atomic.book_plainly.enqueue(1, user.pk, crash="after_writes", marker=marker)
    first = worker_process(*ARGS, env=SHORT_LEASE)
    assert first.wait(60) != 0
    worker_process(*ARGS, env=SHORT_LEASE)
    wait_until(lambda: all_completed([result.id]), timeout=60, message="completed on the second worker")
    assert effects() == (["book-1", "book-1"], 2, [1, 1])


# -- what makes the transaction roll back -------------------------------------------------------


@DB
def test_a_lost_lease_rolls_the_tasks_writes_back(thread_worker, user, probe):
    """The job is released (its lease lost) after it started: its outcome is refused, the
    transaction rolled back with the task's writes; it runs again and writes once."""
    result = tasks_atomic.book.enqueue(1, user.pk, probe=probe)
    released = []
    finished = []

    def release_once(sender, task_result, **kwargs):
        if task_result.id == result.id and not released:
            released.append(engine.release_jobs(using="default", worker_id="lost-lease"))

    def on_finished(sender, task_result, **kwargs):
        finished.append(task_result.status)

    task_started.connect(release_once)
    task_finished.connect(on_finished)
    try:
        w = thread_worker(queues=[tasks_atomic.QUEUE], worker_id="lost-lease")
        wait_until(lambda: all_completed([result.id]), timeout=30, message="completed on its second run")
        stats = w.stop()
    finally:
        task_started.disconnect(release_once)
        task_finished.disconnect(on_finished)
    assert released == [1]
    assert [r["n"] for r in read_records(probe)] == [1, 1]  # it ran twice
    assert effects() == (["book-1"], 1, [1])  # and wrote once
    job = Job.objects.get(id=result.id)
    assert (job.state, job.attempts, job.errors) == ("completed", 1, [])
    assert completed_events(result.id) == 1
    # The dropped outcome sent nothing; the written one went through the usual steps once.
    assert finished == [TaskResultStatus.SUCCESSFUL]
    assert (stats.completed, stats.failed, stats.retried) == (1, 0, 0)


@DB
def test_a_thread_that_outlives_its_timeout_does_not_commit(thread_worker, user, probe):
    result = tasks_atomic.book_slowly.enqueue(1, user.pk, 2.0, probe)
    w = thread_worker(queues=[tasks_atomic.QUEUE])
    wait_until(lambda: Job.objects.get(id=result.id).state == "failed", timeout=30, message="timed out")
    wait_until(lambda: any(r.get("event") == "end" for r in read_records(probe)), timeout=30, message="its end")
    w.stop()
    for t in w.worker._executor_threads:  # the thread given up, which rolled its transaction back
        t.join(10)
    job = Job.objects.get(id=result.id)
    assert job.errors[-1]["exception_class_path"] == "django_jobs.exceptions.JobTimeout"
    assert effects() == ([], 0, [])


@DB
def test_a_failed_attempt_rolls_its_writes_back(user):
    """The test kit runs atomic jobs as the worker does: a return value that is not JSON fails
    the attempt, and what it wrote is rolled back."""
    result = perform_job(tasks_atomic.returns_non_json_after_writing, user.pk)
    assert result.status == TaskResultStatus.FAILED
    assert "NonJSONReturnValue" in result.errors[0].exception_class_path
    assert not LogEntry.objects.filter(object_repr="non-json").exists()
    done = perform_job(tasks_atomic.book, 7, user.pk)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 7)
    assert effects() == (["book-7"], 1, [7])


# -- the worker's other paths -------------------------------------------------------------------


@DB
def test_an_atomic_flow_child_moves_its_parent_on(thread_worker, user):
    root = flow(
        tasks.noop.using(queue_name=tasks_atomic.QUEUE),
        children=[flow(tasks_atomic.book, args=(n, user.pk)) for n in (1, 2)],
    ).enqueue()
    stats = thread_worker(queues=[tasks_atomic.QUEUE], stop_when_empty=True).join(timeout=30)
    assert Job.objects.get(id=root.id).state == "completed"
    assert effects() == (["book-1", "book-2"], 2, [1, 2])
    assert stats.completed == 3


@DB
@pytest.mark.slow
def test_isolation_process_runs_the_transaction_in_the_child_and_killing_it_rolls_back(worker_process, user, probe):
    done = tasks_atomic.book.enqueue(1, user.pk)
    slow = tasks_atomic.book_slowly.enqueue(2, user.pk, 30.0, probe)
    proc = worker_process(*ARGS, "--isolation", "process", env=SHORT_LEASE)
    wait_until(lambda: all_completed([done.id]), timeout=60, message=f"completed: {read_log(proc)}")
    wait_until(lambda: Job.objects.get(id=slow.id).state == "failed", timeout=60, message=f"killed: {read_log(proc)}")
    assert effects() == (["book-1"], 1, [1])  # nothing of the killed one
    assert "killed its child process" in read_log(proc)
    assert completed_events(done.id) == 1


def test_atomic_is_listed_among_the_task_options():
    with pytest.raises(TypeError, match=r"Allowed: .*\batomic\b"):
        tasks.noop.using(transactional=True)
    assert "atomic" in JOB_OPTIONS

"""Timeouts (thread and process isolation), cancelling running jobs (sync, async, child
process), middleware, and the job signals. Real workers in threads, real child processes."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.core import checks
from django.utils import timezone

import django_jobs
from django_jobs import engine
from django_jobs.models import Job
from django_jobs.services import Rescuer
from django_jobs.signals import job_cancelled, job_rescued, job_retried, job_snoozed, job_stalled
from django_jobs.worker.runner import InvalidWorkerOption
from tests import tasks, tasks_control
from tests.conftest import wait_until
from tests.factories import jobs_settings, records_of
from tests.tasks import read_records


def error_classes(job_id) -> list[str]:
    return [e["exception_class_path"] for e in Job.objects.get(id=job_id).errors]


def middleware(*paths: str):
    return jobs_settings(MIDDLEWARE=list(paths))


class Received:
    """Collects the kwargs a signal was sent with."""

    def __init__(self, signal):
        self.signal = signal
        self.calls: list[dict] = []

    def __call__(self, sender, **kwargs):
        self.calls.append({"sender": sender, **kwargs})

    def __enter__(self):
        self.signal.connect(self, weak=False)
        return self

    def __exit__(self, *exc):
        self.signal.disconnect(self)


# -- timeouts, thread isolation ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_sync_job_past_its_timeout_is_failed_and_its_slot_freed(thread_worker, probe):
    slow = tasks_control.sleeps.enqueue(probe, 4)
    worker = thread_worker(concurrency=1)
    wait_until(lambda: records_of(probe, "start"), timeout=20)
    # The only slot is stuck in time.sleep: the next job runs only if the timeout freed it.
    quick = tasks.mark.enqueue(probe, "after")
    wait_until(lambda: Job.objects.get(id=quick.id).state == "completed", timeout=10)
    job = Job.objects.get(id=slow.id)
    assert job.state == "failed"
    assert error_classes(slow.id) == ["django_jobs.exceptions.JobTimeout"]
    assert "timeout of 0.5s" in job.errors[0]["traceback"]
    # The abandoned thread finishes later; its outcome must not overwrite the recorded failure.
    wait_until(lambda: records_of(probe, "end"), timeout=10)
    time.sleep(0.3)
    stats = worker.stop()
    assert Job.objects.get(id=slow.id).state == "failed"
    assert stats.timed_out == 1 and stats.failed == 1 and stats.completed == 1


@pytest.mark.django_db(transaction=True)
def test_a_timed_out_attempt_is_retried_while_attempts_remain(thread_worker, probe):
    result = tasks_control.sleeps_twice.enqueue(probe, 2)
    worker = thread_worker(concurrency=1)
    wait_until(lambda: Job.objects.get(id=result.id).state == "failed", timeout=20)
    worker.stop()
    job = Job.objects.get(id=result.id)
    assert job.attempts == 2
    assert error_classes(result.id) == ["django_jobs.exceptions.JobTimeout"] * 2


@pytest.mark.django_db(transaction=True)
def test_an_async_job_past_its_timeout_is_cancelled(thread_worker, probe):
    result = tasks_control.async_sleeps.enqueue(probe, 10)
    worker = thread_worker(concurrency=1)
    wait_until(lambda: Job.objects.get(id=result.id).state == "failed", timeout=20)
    wait_until(lambda: records_of(probe, "cancelled"), timeout=5, message="the coroutine to see CancelledError")
    stats = worker.stop()
    assert error_classes(result.id) == ["django_jobs.exceptions.JobTimeout"]
    assert "coroutine was cancelled" in Job.objects.get(id=result.id).errors[0]["traceback"]
    assert stats.failed == 1


def test_timeout_option_is_validated():
    for bad in (0, -1, "5", True, float("nan")):
        with pytest.raises(django_jobs.exceptions.InvalidTaskOptions, match="timeout"):
            tasks.noop.using(timeout=bad).enqueue()


@pytest.mark.django_db
def test_timeout_from_using_is_stored_with_the_job():
    result = tasks.noop.using(timeout=2.5).enqueue()
    assert Job.objects.get(id=result.id).options["timeout"] == 2.5


# -- timeouts, process isolation -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_process_isolation_runs_jobs_in_a_child_and_kills_it_at_the_deadline(thread_worker, probe):
    spinning = tasks_control.spins.enqueue(probe)
    worker = thread_worker(concurrency=1, isolation="process")
    wait_until(lambda: Job.objects.get(id=spinning.id).state == "failed", timeout=60)
    [start] = records_of(probe, "start")
    assert start["pid"] != os.getpid(), "the job ran in a child process"
    wait_until(lambda: not _alive(start["pid"]), timeout=10, message="the spinning child to be killed")
    assert error_classes(spinning.id) == ["django_jobs.exceptions.JobTimeout"]
    # The slot gets a fresh child for the next job.
    after = tasks_control.pid_of_runner.enqueue(probe)
    wait_until(lambda: Job.objects.get(id=after.id).state == "completed", timeout=60)
    pid = Job.objects.get(id=after.id).return_value
    assert pid not in (os.getpid(), start["pid"])
    stats = worker.stop()
    assert stats.timed_out == 1


@pytest.mark.django_db(transaction=True)
def test_process_isolation_records_a_child_that_dies_and_carries_on(thread_worker, probe):
    crash = tasks_control.crashes_interpreter.enqueue()
    ok = tasks.add.enqueue(2, 3)
    thread_worker(concurrency=1, isolation="process", stop_when_empty=True).join(timeout=90)
    assert Job.objects.get(id=crash.id).state == "failed"
    assert error_classes(crash.id) == ["django_jobs.exceptions.ChildProcessDied"]
    assert "exit code 9" in Job.objects.get(id=crash.id).errors[0]["traceback"]
    assert Job.objects.get(id=ok.id).return_value == 5


def test_isolation_option_is_validated():
    with pytest.raises(InvalidWorkerOption, match="isolation must be one of thread, process"):
        from django_jobs.worker import Worker

        Worker(isolation="fork")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child stays a zombie until reaped; count zombies as dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- cancelling running jobs ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_running_async_job_is_cancelled_and_ends_cancelled(thread_worker, probe):
    result = tasks_control.async_until_cancelled.enqueue(probe)
    worker = thread_worker(concurrency=1)
    wait_until(lambda: records_of(probe, "start"), timeout=20)
    asked = time.monotonic()
    django_jobs.cancel(result.id)
    wait_until(lambda: records_of(probe, "cancelled"), timeout=5, message="the coroutine to be cancelled")
    seen_after = time.monotonic() - asked
    wait_until(lambda: Job.objects.get(id=result.id).state == "cancelled", timeout=5)
    stats = worker.stop()
    assert seen_after < 2.0
    assert stats.cancelled == 1
    assert error_classes(result.id) == ["django_jobs.exceptions.JobCancelled"]


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_job_in_a_child_process_kills_the_child(thread_worker, probe):
    result = tasks_control.ignores_cancel.enqueue(probe)
    worker = thread_worker(concurrency=1, isolation="process")
    wait_until(lambda: records_of(probe, "start"), timeout=60)
    django_jobs.cancel(result.id)
    wait_until(lambda: Job.objects.get(id=result.id).state == "cancelled", timeout=10)
    [start] = records_of(probe, "start")
    wait_until(lambda: not _alive(start["pid"]), timeout=10, message="the child to be killed")
    worker.stop()
    assert error_classes(result.id) == ["django_jobs.exceptions.JobCancelled"]


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_a_timeout_records_exactly_one_outcome(thread_worker, probe):
    """The watchdog's timeout and the cancel flag meet in the guarded outcome write."""
    result = tasks_control.sleeps.enqueue(probe, 1.5)
    worker = thread_worker(concurrency=1)
    wait_until(lambda: records_of(probe, "start"), timeout=20)
    django_jobs.cancel(result.id)
    wait_until(lambda: Job.objects.get(id=result.id).state in ("cancelled", "failed"), timeout=10)
    wait_until(lambda: records_of(probe, "end"), timeout=10)
    time.sleep(0.3)
    worker.stop()
    job = Job.objects.get(id=result.id)
    assert job.state == "cancelled" and job.attempts == 1 and len(job.errors) == 1


# -- middleware ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_middleware_wraps_each_execution_outermost_first(thread_worker):
    tasks_control.CALLS.clear()
    with middleware("tests.tasks_control.outer_middleware", "tests.tasks_control.inner_middleware"):
        ok = tasks.add.enqueue(1, 2)
        bad = tasks.always_fails.enqueue("no")
        thread_worker(concurrency=1, stop_when_empty=True).join()
    ok_calls = [c for c in tasks_control.CALLS if c[2] in (str(ok.id), "add", 3)]
    assert ok_calls == [
        ("outer", "before", str(ok.id)),
        ("inner", "before", "add"),
        ("inner", "after", 3),
        ("outer", "after", 3),
    ]
    assert ("outer", "error", "ValueError") in tasks_control.CALLS
    assert Job.objects.get(id=bad.id).state == "failed"


@pytest.mark.django_db(transaction=True)
def test_a_raising_middleware_is_recorded_like_a_task_error(thread_worker):
    with middleware("tests.tasks_control.raising_middleware"):
        result = tasks.add.enqueue(1, 2)
        thread_worker(concurrency=1, stop_when_empty=True).join()
    job = Job.objects.get(id=result.id)
    assert job.state == "failed"
    assert error_classes(result.id) == ["builtins.RuntimeError"]
    assert "middleware refused" in job.errors[0]["traceback"]


@pytest.mark.django_db(transaction=True)
def test_what_a_middleware_sets_in_a_contextvar_reaches_sync_and_async_tasks(thread_worker):
    with middleware("tests.tasks_control.tenant_middleware"):
        sync = tasks_control.reads_tenant.using(queue_name="acme").enqueue()
        coro = tasks_control.async_reads_tenant.using(queue_name="acme").enqueue()
        thread_worker(concurrency=2, stop_when_empty=True).join()
    assert Job.objects.get(id=sync.id).return_value == "tenant-of-acme"
    assert Job.objects.get(id=coro.id).return_value == "tenant-of-acme"


@pytest.mark.django_db
def test_a_broken_middleware_setting_stops_the_worker_and_fails_the_check():
    from django_jobs.worker import Worker

    with middleware("tests.tasks_control.no_such_thing"):
        with pytest.raises(InvalidWorkerOption, match="does not import"):
            Worker()
        ids = [m.id for m in checks.run_checks() if m.id.startswith("django_jobs")]
        assert "django_jobs.E006" in ids
    with middleware("tests.tasks_control.not_a_factory_result"):
        with pytest.raises(InvalidWorkerOption, match="must return a callable"):
            Worker()
    with middleware("tests.tasks_control.factory_that_raises"):
        with pytest.raises(InvalidWorkerOption, match="raised while being set up: KeyError"):
            Worker()
    with middleware("tests.tasks_control.CALLS"):
        with pytest.raises(InvalidWorkerOption, match="is not callable"):
            Worker()
    with jobs_settings(MIDDLEWARE="tests.tasks_control.x"):
        ids = [m.id for m in checks.run_checks() if m.id.startswith("django_jobs")]
        assert "django_jobs.E002" in ids


# -- signals -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_retried_and_snoozed_signals_carry_the_job_and_the_next_run(thread_worker, probe):
    with Received(job_retried) as retried, Received(job_snoozed) as snoozed:
        result = tasks_control.fails_once_then_snoozes.using(queue_name="sig").enqueue(probe)
        worker = thread_worker(concurrency=1, queues=["sig"])
        wait_until(lambda: snoozed.calls, timeout=20)
        worker.stop()
    [r] = retried.calls
    assert (r["job_id"], r["queue"], r["backend"], r["attempt"]) == (result.id, "sig", "default", 1)
    assert r["error"]["exception_class_path"] == "django_jobs.exceptions.Retry"
    assert r["run_at"] <= timezone.now()
    [s] = snoozed.calls
    assert s["job_id"] == result.id and s["run_at"] > timezone.now() + timedelta(minutes=50)
    assert r["sender"] is type(tasks.noop.get_backend())


@pytest.mark.django_db(transaction=True)
def test_cancelled_signal_for_a_waiting_and_a_running_job(thread_worker, probe):
    with Received(job_cancelled) as cancelled:
        waiting = tasks.noop.using(run_after=timedelta(hours=1)).enqueue()
        django_jobs.cancel(waiting.id)
        running = tasks.until_cancelled.enqueue(probe)
        worker = thread_worker(concurrency=1)
        wait_until(lambda: records_of(probe, "start"), timeout=20)
        django_jobs.cancel(running.id)
        wait_until(lambda: len(cancelled.calls) == 2, timeout=10)
        worker.stop()
    assert [(c["job_id"], c["was_running"]) for c in cancelled.calls] == [(waiting.id, False), (running.id, True)]


@pytest.mark.django_db
def test_stalled_and_rescued_signals_from_the_rescuer():
    first = tasks.noop.enqueue()
    second = tasks.noop.enqueue()
    third = tasks.noop.enqueue()
    claimed = engine.claim_jobs(using="default", queues=None, limit=3, worker_id="gone", lease_seconds=30)
    assert len(claimed) == 3
    # The second job already stalled once: with MAX_STALLED=1 it fails this time.
    Job.objects.filter(id=second.id).update(stalled_count=1)
    # The third was cancelled while it ran: its worker died, and it must not run again.
    django_jobs.cancel(third.id)
    from django_jobs.conf import get_settings

    rescuer = Rescuer(using="default", settings=get_settings("default"), worker_id="w", backend="default", interval=1)
    with Received(job_stalled) as stalled, Received(job_rescued) as rescued, Received(job_cancelled) as cancelled:
        counts = rescuer.run_once(now=timezone.now() + timedelta(seconds=60))
    assert counts == {"requeued": 1, "failed": 1, "cancelled": 1}
    assert sorted((c["job_id"], c["state"]) for c in stalled.calls) == sorted(
        [(first.id, "waiting"), (second.id, "failed"), (third.id, "cancelled")]
    )
    assert [c["job_id"] for c in rescued.calls] == [first.id]
    assert [(c["job_id"], c["was_running"]) for c in cancelled.calls] == [(third.id, True)]
    assert Job.objects.get(id=third.id).finished_at is not None


@pytest.mark.django_db
def test_a_job_cancelled_while_running_is_not_released_back_to_waiting_at_shutdown():
    running = tasks.noop.enqueue()
    other = tasks.noop.enqueue()
    engine.claim_jobs(using="default", queues=None, limit=2, worker_id="w", lease_seconds=30)
    django_jobs.cancel(running.id)
    assert engine.release_jobs(using="default", worker_id="w") == 1
    job = Job.objects.get(id=running.id)
    assert (job.state, job.attempts, job.worker_ids) == ("cancelled", 1, ["w"])
    assert job.finished_at is not None
    assert Job.objects.get(id=other.id).state == "waiting"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_cancel_arrives_by_notify_without_waiting_for_a_poll(thread_worker, probe, monkeypatch):
    """With the poll slowed to a minute, only the NOTIFY can deliver the cancel within a second."""
    from django_jobs.worker import maintainer

    monkeypatch.setattr(maintainer, "CANCEL_POLL_INTERVAL", 60.0)
    result = tasks.until_cancelled.enqueue(probe)
    worker = thread_worker(concurrency=1)
    wait_until(lambda: records_of(probe, "start"), timeout=20)
    wait_until(lambda: worker.worker._listener.connected.is_set(), timeout=10)
    time.sleep(0.6)  # past the worker's first (start-up) poll
    asked = time.time()
    django_jobs.cancel(result.id)
    wait_until(lambda: Job.objects.get(id=result.id).state == "cancelled", timeout=10)
    worker.stop()
    [noticed] = records_of(probe, "noticed")
    assert noticed["at"] - asked < 1.0


@pytest.mark.django_db
def test_a_job_cancelled_after_its_claim_is_not_started(probe):
    from django_jobs.worker.executor import Attempt, Executor

    result = tasks.mark.enqueue(probe, "never")
    [job] = engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w", lease_seconds=30)
    attempt = Attempt(job, watched=True)
    django_jobs.cancel(result.id)
    attempt.cancel()  # what the worker does on the NOTIFY or poll
    outcome = Executor(worker_id="w").execute(job, attempt)
    assert read_records(probe) == [], "the task did not run"
    assert outcome.error["exception_class_path"] == "django_jobs.exceptions.JobCancelled"
    assert engine.record_outcomes([outcome], using="default") == {job.id: "cancelled"}


@pytest.mark.django_db(transaction=True)
def test_timed_out_threads_are_replaced_not_multiplied(thread_worker, probe):
    import threading

    def executor_threads():
        return [t for t in threading.enumerate() if t.name.startswith("jobs-exec")]

    before = len(executor_threads())
    results = [tasks_control.sleeps.enqueue(probe, 1.0) for _ in range(3)]
    worker = thread_worker(concurrency=1)
    wait_until(lambda: all(Job.objects.get(id=r.id).state == "failed" for r in results), timeout=30)
    wait_until(lambda: len(records_of(probe, "end")) == 3, timeout=10, message="the abandoned threads to finish")
    # Each abandoned thread ends once its task returns; one thread holds the one slot.
    wait_until(lambda: len(executor_threads()) == before + 1, timeout=5, message="one executor thread")
    stats = worker.stop()
    assert stats.timed_out == 3


@pytest.mark.django_db(transaction=True)
def test_a_child_ignores_a_ctrl_c_sent_to_the_process_group(thread_worker, probe):
    import signal

    result = tasks_control.sleeps.using(timeout=30).enqueue(probe, 1.5)
    worker = thread_worker(concurrency=1, isolation="process")
    wait_until(lambda: records_of(probe, "start"), timeout=60)
    [start] = records_of(probe, "start")
    os.kill(start["pid"], signal.SIGINT)
    os.kill(start["pid"], signal.SIGTERM)
    wait_until(lambda: Job.objects.get(id=result.id).state == "completed", timeout=20)
    worker.stop()


@pytest.mark.django_db(transaction=True)
def test_shutdown_kills_a_child_still_running_after_the_grace_and_releases_its_job(thread_worker, probe):
    result = tasks_control.ignores_cancel.enqueue(probe)
    worker = thread_worker(concurrency=1, isolation="process", grace=0.5)
    wait_until(lambda: records_of(probe, "start"), timeout=60)
    [start] = records_of(probe, "start")
    stats = worker.stop()
    assert stats.released == 1
    job = Job.objects.get(id=result.id)
    assert (job.state, job.attempts, job.errors) == ("waiting", 0, [])
    wait_until(lambda: not _alive(start["pid"]), timeout=10, message="the child to be killed")

"""The async mode: attempts of ``async def`` tasks run as tasks on the worker's event loop and
park no executor thread (django_jobs/worker/coroutines.py). Real ``manage.py runworker``
processes on the test database, reporting through the probe file; the signal tests run a real
Worker in a thread of the test process, where receivers can be connected.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from django.tasks.signals import task_finished, task_started

import django_jobs
from django_jobs.models import Job, Worker
from tests import tasks_control
from tests.conftest import read_log, wait_until
from tests.factories import count_states, records_of
from tests.tasks import read_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SHORT_LEASE = {"JOBS_TEST_LEASE": "2"}


def most_running_at_once(probe: str) -> int:
    """The most jobs between their start and end records at once (the probe is in write order)."""
    running = most = 0
    for r in read_records(probe):
        if r.get("event") == "start":
            running += 1
            most = max(most, running)
        elif r.get("event") == "end":
            running -= 1
    return most


def completed(ids) -> bool:
    return Job.objects.filter(id__in=list(ids), state="completed").count() == len(ids)


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, read_log(proc)


def test_async_jobs_run_on_the_event_loop_and_park_no_executor_thread(worker_process, probe):
    ids = [tasks_control.async_sleep_then_mark.enqueue(probe, f"a{i}", 1.0).id for i in range(12)]
    proc = worker_process("-c", "6")
    wait_until(lambda: completed(ids), timeout=60, message="12 async jobs to complete")
    stop(proc)

    starts = records_of(probe, "start")
    assert len(starts) == 12
    assert {r["thread"] for r in starts} == {"jobs-asyncio"}
    assert [r["parked"] for r in starts] == [0] * 12, "an executor thread waited on a coroutine"
    # -c bounds the coroutines running at once, as it bounds threads.
    assert most_running_at_once(probe) == 6
    assert {Job.objects.get(id=i).return_value for i in ids} == {f"a{i}" for i in range(12)}


def test_a_backend_with_middleware_keeps_async_jobs_on_threads(worker_process, probe):
    # A middleware is a plain function blocking in call_next: it needs a thread (the control
    # of the test above: the probe sees the parked thread).
    ids = [tasks_control.async_sleep_then_mark.enqueue(probe, f"m{i}", 0.5).id for i in range(4)]
    proc = worker_process("-c", "4", env={"JOBS_TEST_MIDDLEWARE": "tests.tasks_control.tenant_middleware"})
    wait_until(lambda: completed(ids), timeout=60, message="4 async jobs to complete")
    stop(proc)
    starts = records_of(probe, "start")
    assert len(starts) == 4
    assert all(r["parked"] >= 1 for r in starts), starts


def test_sigterm_drains_running_async_jobs_and_starts_no_other(worker_process, probe):
    ids = {f"d{i}": tasks_control.async_sleep_then_mark.enqueue(probe, f"d{i}", 1.5).id for i in range(6)}
    proc = worker_process("-c", "4", "--grace", "10")
    wait_until(lambda: len(records_of(probe, "start")) == 4, timeout=30, message="4 jobs to start")

    stop(proc)

    started = {r["key"] for r in records_of(probe, "start")}
    ended = [r["key"] for r in records_of(probe, "end")]
    assert len(started) == 4 and sorted(ended) == sorted(started), "every running job ran to its end, once"
    for key, job_id in ids.items():
        job = Job.objects.get(id=job_id)
        if key in started:
            assert (job.state, job.attempts) == ("completed", 1)
        else:
            assert (job.state, job.attempts, job.lease_token) == ("waiting", 0, None)
    assert not Worker.objects.exists()


def test_sigterm_after_a_short_grace_cancels_the_coroutine_and_releases_its_job(worker_process, probe):
    result = tasks_control.async_until_cancelled.enqueue(probe)  # awaits 30 s
    proc = worker_process("--grace", "1")
    wait_until(lambda: records_of(probe, "start"), timeout=30, message="the job to start")

    stop(proc)

    assert records_of(probe, "cancelled"), "the coroutine was cancelled, not dropped with the loop"
    job = Job.objects.get(id=result.id)
    # Released, not failed: the interrupted attempt is not counted.
    assert (job.state, job.attempts, job.worker_ids, job.errors, job.lease_token) == ("waiting", 0, [], [], None)
    assert "releasing them" in read_log(proc)
    assert "arrived after shutdown" not in read_log(proc)


def test_sigkill_mid_async_job_another_worker_reruns_it(worker_process, probe):
    long = tasks_control.async_sleep_then_mark.enqueue(probe, "long", 3)
    a = worker_process("-c", "2", "--worker-id", "worker-a", env=SHORT_LEASE)
    wait_until(lambda: records_of(probe, "start"), timeout=30, message="worker A to start the job")

    os.killpg(a.pid, signal.SIGKILL)
    a.wait(10)
    assert Job.objects.get(id=long.id).state == "active"
    b = worker_process("-c", "2", "--worker-id", "worker-b", env=SHORT_LEASE)
    wait_until(lambda: completed([long.id]), timeout=60, message="B to rerun the job")
    stop(b)

    job = Job.objects.get(id=long.id)
    assert (job.state, job.stalled_count, job.attempts, job.worker_ids) == ("completed", 1, 1, ["worker-b"])
    assert [r["pid"] for r in records_of(probe, "start")] == [a.pid, b.pid]
    assert [r["pid"] for r in records_of(probe, "end")] == [b.pid]


def test_a_running_async_job_keeps_its_lease(worker_process, probe):
    # The job outlives the 2 s lease three times over: B would rescue it if A stopped renewing.
    result = tasks_control.async_sleep_then_mark.enqueue(probe, "kept", 6)
    a = worker_process("-c", "2", "--worker-id", "worker-a", env=SHORT_LEASE)
    wait_until(lambda: records_of(probe, "start"), timeout=30, message="worker A to start the job")
    b = worker_process("-c", "2", "--worker-id", "worker-b", env=SHORT_LEASE)
    wait_until(lambda: completed([result.id]), timeout=60, message="A to finish the job")
    stop(a)
    stop(b)
    job = Job.objects.get(id=result.id)
    assert (job.stalled_count, job.worker_ids) == (0, ["worker-a"])
    assert [(r["event"], r["pid"]) for r in read_records(probe)] == [("start", a.pid), ("end", a.pid)]


def test_timeouts_and_cancels_cancel_coroutines_while_the_others_run_on(worker_process, tmp_path):
    timed, cancelled, others = (str(tmp_path / f"{n}.jsonl") for n in ("timed", "cancelled", "others"))
    slow = tasks_control.async_sleeps.enqueue(timed, 10)  # timeout 0.5 s
    doomed = tasks_control.async_until_cancelled.enqueue(cancelled)
    proc = worker_process("-c", "4")
    wait_until(lambda: records_of(cancelled, "start"), timeout=30, message="the job to cancel to start")
    django_jobs.cancel(doomed.id)
    rest = [tasks_control.async_sleep_then_mark.enqueue(others, f"o{i}", 0.2).id for i in range(6)]

    wait_until(lambda: Job.objects.get(id=doomed.id).state == "cancelled", timeout=20)
    wait_until(lambda: Job.objects.get(id=slow.id).state == "failed", timeout=20)
    wait_until(lambda: completed(rest), timeout=30, message="the other jobs to complete")
    stop(proc)

    assert records_of(timed, "cancelled") and records_of(cancelled, "cancelled"), "both coroutines were cancelled"
    slow_job, doomed_job = Job.objects.get(id=slow.id), Job.objects.get(id=doomed.id)
    assert [e["exception_class_path"] for e in slow_job.errors] == ["django_jobs.exceptions.JobTimeout"]
    assert "the coroutine was cancelled" in slow_job.errors[0]["traceback"]
    assert [e["exception_class_path"] for e in doomed_job.errors] == ["django_jobs.exceptions.JobCancelled"]


def test_a_coroutine_that_swallows_its_timeout_frees_its_slot_and_its_result_is_dropped(worker_process, probe):
    result = tasks_control.async_ignores_cancel.enqueue(probe)  # timeout 1 s, then runs 3 s more
    proc = worker_process("-c", "1")
    wait_until(lambda: records_of(probe, "start"), timeout=30, message="the job to start")
    nxt = tasks_control.async_sleep_then_mark.enqueue(probe, "next", 0)
    wait_until(lambda: completed([nxt.id]), timeout=30, message="the next job to complete")
    wait_until(lambda: "after the worker had given it up" in read_log(proc), timeout=20)
    stop(proc)

    # The only slot was freed at the deadline, while the coroutine still ran.
    order = [(r.get("key"), r["event"]) for r in read_records(probe)]
    assert order == [(None, "start"), (None, "cancelled"), ("next", "start"), ("next", "end"), (None, "end")]
    job = Job.objects.get(id=result.id)
    assert (job.state, job.return_value) == ("failed", None)
    assert [e["exception_class_path"] for e in job.errors] == ["django_jobs.exceptions.JobTimeout"]


def test_task_signals_of_an_async_job_are_sent_off_the_loop_and_finished_after_the_commit(thread_worker, probe):
    seen: list[tuple] = []

    def on_started(sender, task_result, **kwargs):
        # The ORM works here: Django refuses it inside a running event loop.
        state = Job.objects.get(id=task_result.id).state
        seen.append(("started", threading.current_thread().name, state))

    def on_finished(sender, task_result, **kwargs):
        state = Job.objects.get(id=task_result.id).state
        seen.append(("finished", threading.current_thread().name, state, task_result.return_value))

    task_started.connect(on_started, weak=False)
    task_finished.connect(on_finished, weak=False)
    try:
        result = tasks_control.async_sleep_then_mark.enqueue(probe, "sig", 0.1)
        worker = thread_worker(concurrency=2)
        wait_until(lambda: len(seen) == 2, timeout=20, message="both signals")
        worker.stop()
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    assert [r["thread"] for r in records_of(probe, "start")] == ["jobs-asyncio"]
    (started, started_on, state_then), (finished, finished_on, state_after, value) = seen
    assert (started, state_then) == ("started", "active")
    assert started_on != "jobs-asyncio"
    assert (finished, finished_on, state_after, value) == ("finished", "jobs-completer", "completed", "sig")
    assert count_states([result.id]) == {"completed": 1}

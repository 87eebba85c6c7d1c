"""The worker as a Python object (``django_jobs.worker.Worker``), run in threads of the test process.

Runs on SQLite and PostgreSQL. Side effects of tasks go to the probe file (tests.tasks.record);
outcomes are read back from the job table.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.tasks.signals import task_finished, task_started
from django.utils import timezone

from django_jobs.backend import JobsBackend
from django_jobs.exceptions import InvalidQueueName
from django_jobs.models import Job
from django_jobs.models import Worker as WorkerRow
from django_jobs.worker import InvalidWorkerOption, Worker
from tests import tasks
from tests.conftest import wait_until
from tests.factories import count_states, insert_job, jobs_settings
from tests.tasks import read_records

pytestmark = pytest.mark.django_db(transaction=True)


def all_finished(ids) -> bool:
    return Job.objects.filter(id__in=list(ids), state__in=["completed", "failed", "cancelled"]).count() == len(ids)


def wait_until_or_none(condition, timeout: float) -> object:
    """Like wait_until, but returns None on timeout so the test can clean up before asserting."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return value


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


# -- throughput and exactly-once ------------------------------------------------------------


def test_eight_threads_run_three_hundred_jobs_each_exactly_once(thread_worker, probe):
    ids = [tasks.mark.enqueue(probe, f"k{i}").id for i in range(300)]

    stats = thread_worker(concurrency=8, stop_when_empty=True).join(timeout=120)

    keys = Counter(r["key"] for r in read_records(probe))
    duplicated = sorted(k for k, n in keys.items() if n > 1)
    lost = sorted({f"k{i}" for i in range(300)} - set(keys))
    assert (len(keys), lost, duplicated) == (300, [], []), f"300 jobs: {len(lost)} lost, {len(duplicated)} duplicated"
    assert count_states(ids) == {"completed": 300}
    assert Job.objects.filter(id__in=ids, attempts=1).count() == 300
    assert (stats.completed, stats.failed, stats.retried) == (300, 0, 0)


def test_two_workers_share_the_jobs_and_run_each_exactly_once(thread_worker, probe):
    first = thread_worker(concurrency=4, worker_id="first")
    second = thread_worker(concurrency=4, worker_id="second")
    wait_until(lambda: set(WorkerRow.objects.values_list("id", flat=True)) == {"first", "second"}, timeout=20)
    with transaction.atomic():
        # 10 ms each: a run long enough that both workers' polls find work.
        ids = [tasks.sleep_then_mark.enqueue(probe, f"k{i}", 0.01).id for i in range(200)]

    wait_until(lambda: all_finished(ids), timeout=60)
    stats = first.stop(), second.stop()

    keys = Counter(r["key"] for r in read_records(probe) if r["event"] == "end")
    assert (len(keys), max(keys.values())) == (200, 1)
    assert count_states(ids) == {"completed": 200}
    by_worker = Counter(w for [w] in Job.objects.filter(id__in=ids).values_list("worker_ids", flat=True))
    assert by_worker.keys() == {"first", "second"}, by_worker
    assert [s.completed for s in stats] == [by_worker["first"], by_worker["second"]]


def test_worker_takes_only_jobs_of_its_queues(thread_worker, probe):
    alpha = tasks.mark.using(queue_name="alpha").enqueue(probe, "alpha")
    beta = tasks.mark.using(queue_name="beta").enqueue(probe, "beta")
    default = tasks.mark.enqueue(probe, "default")

    # stop_when_empty looks at its own queues only: the beta job does not keep it running.
    stats = thread_worker(queues=["alpha", "default"], stop_when_empty=True).join()

    assert sorted(r["key"] for r in read_records(probe)) == ["alpha", "default"]
    assert count_states([alpha.id, default.id]) == {"completed": 2}
    assert Job.objects.get(id=beta.id).state == "waiting"
    assert stats.completed == 2


def test_concurrency_runs_that_many_jobs_at_once(thread_worker, probe):
    for i in range(8):
        tasks.sleep_then_mark.enqueue(probe, f"c{i}", 1.0)

    thread_worker(concurrency=8, stop_when_empty=True).join()

    running = peak = 0
    for r in read_records(probe):
        running += 1 if r["event"] == "start" else -1
        peak = max(peak, running)
    assert peak == 8


def test_worker_claims_no_more_jobs_than_it_has_free_slots(thread_worker, probe):
    ids = [tasks.sleep_then_mark.enqueue(probe, f"f{i}", 1.0).id for i in range(6)]

    worker = thread_worker(concurrency=2)
    wait_until(lambda: len(read_records(probe)) == 2, timeout=20)
    active_while_two_run = count_states(ids)
    worker.stop()

    assert active_while_two_run == {"active": 2, "waiting": 4}


def test_async_task_runs_on_the_event_loop_and_returns(thread_worker):
    results = [tasks.async_add.enqueue(i, 10) for i in range(5)]

    stats = thread_worker(concurrency=2, stop_when_empty=True).join()

    for i, result in enumerate(results):
        result.refresh()
        assert result.status == "SUCCESSFUL"
        assert result.return_value == i + 10
    assert stats.completed == 5


def test_task_that_takes_context_gets_a_job_context(thread_worker):
    result = tasks.context_details.using(queue_name="ctx", max_attempts=3).enqueue()

    thread_worker(queues=["ctx"], stop_when_empty=True).join()

    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.return_value == {
        "class": "django_jobs.context.JobContext",
        "attempt": 1,
        "job_id": result.id,
        "result_id": result.id,
        "queue": "ctx",
        "max_attempts": 3,
        "is_last_attempt": False,
        "parent_id": None,
    }


def test_jobs_run_by_priority_then_in_enqueue_order(thread_worker, probe):
    for i in range(3):
        tasks.mark.enqueue(probe, f"p0-{i}")
    for i in range(2):
        tasks.mark.using(priority=-5).enqueue(probe, f"p-5-{i}")
    for i in range(3):
        tasks.high_priority.enqueue(probe, f"p10-{i}")
    for i in range(2):
        tasks.mark.using(priority=5).enqueue(probe, f"p5-{i}")

    thread_worker(concurrency=1, stop_when_empty=True).join()

    order = [r["key"] for r in read_records(probe)]
    assert order == ["p10-0", "p10-1", "p10-2", "p5-0", "p5-1", "p0-0", "p0-1", "p0-2", "p-5-0", "p-5-1"]


def test_delayed_job_does_not_run_before_its_time(thread_worker, probe):
    run_after = timezone.now() + timedelta(seconds=1.5)
    result = tasks.mark.using(run_after=run_after).enqueue(probe, "later")
    now_job = tasks.mark.enqueue(probe, "now")
    assert Job.objects.get(id=result.id).state == "delayed"

    worker = thread_worker(concurrency=2)
    wait_until(lambda: Job.objects.get(id=now_job.id).state == "completed", timeout=20)
    assert Job.objects.get(id=result.id).state == "delayed"
    wait_until(lambda: Job.objects.get(id=result.id).state == "completed", timeout=20)
    worker.stop()

    job = Job.objects.get(id=result.id)
    assert job.started_at >= run_after
    assert [r["key"] for r in read_records(probe)] == ["now", "later"]


# -- retries and backoff forms ----------------------------------------------------------------


def retry_delays(probe: str, key: str) -> list[tuple[float, float]]:
    """For attempts 2..n of ``key``: (backoff the failure set, seconds from that failure to the
    attempt's start). The backoff is the row's available_at minus the failure's timestamp."""
    attempts = sorted((r for r in read_records(probe) if r["key"] == key), key=lambda r: r["attempt"])
    out = []
    for prev, cur in zip(attempts, attempts[1:], strict=False):
        assert cur["attempt"] == prev["attempt"] + 1
        failed_at = ts(cur["errors_at"][-1])
        backoff = (ts(cur["available_at"]) - failed_at).total_seconds()
        waited = cur["at"] - failed_at.timestamp()
        out.append((backoff, waited))
    return out


def test_retry_with_a_number_backoff_waits_that_long(thread_worker, probe):
    result = tasks.fail_until_timed.using(backoff=0.5).enqueue(probe, "n", 2)

    stats = thread_worker(stop_when_empty=True).join()

    job = Job.objects.get(id=result.id)
    assert (job.state, job.attempts, len(job.errors)) == ("completed", 2, 1)
    assert job.last_attempted_at >= ts(job.errors[0]["at"]) + timedelta(seconds=0.5)
    [(backoff, waited)] = retry_delays(probe, "n")
    assert 0.5 <= backoff < 0.6
    assert waited >= 0.5
    assert (stats.completed, stats.failed, stats.retried) == (1, 0, 1)


def test_retry_with_a_list_backoff_uses_one_value_per_attempt(thread_worker, probe):
    result = tasks.fail_until_timed.using(backoff=[0.2, 0.6], max_attempts=4).enqueue(probe, "l", 4)

    stats = thread_worker(stop_when_empty=True).join()

    job = Job.objects.get(id=result.id)
    assert (job.state, job.attempts, len(job.errors)) == ("completed", 4, 3)
    delays = retry_delays(probe, "l")
    # The last value is reused once the list runs out.
    assert [round(b, 1) for b, _ in delays] == [0.2, 0.6, 0.6], delays
    for backoff, waited in delays:
        assert waited >= backoff
    assert (stats.completed, stats.failed, stats.retried) == (1, 0, 3)


def test_retry_with_exponential_backoff_is_jittered_below_base_times_two_to_the_attempt(thread_worker, probe):
    with jobs_settings(BACKOFF_BASE=0.1, BACKOFF_CAP=0.3):
        for i in range(4):
            tasks.fail_until_timed.using(backoff="exponential", max_attempts=4).enqueue(probe, f"e{i}", 4)
        stats = thread_worker(concurrency=4, stop_when_empty=True).join()

    assert Job.objects.filter(state="completed", attempts=4).count() == 4
    all_backoffs = []
    for i in range(4):
        delays = retry_delays(probe, f"e{i}")
        assert len(delays) == 3
        # attempt 1 failed: <= 0.1 * 2**0; attempt 2: <= 0.1 * 2**1; attempt 3: 0.4 capped to 0.3.
        for (backoff, waited), limit in zip(delays, [0.1, 0.2, 0.3], strict=True):
            assert 0 <= backoff <= limit + 0.01, delays
            assert waited >= backoff
        all_backoffs += [b for b, _ in delays]
    assert len({round(b, 3) for b in all_backoffs}) > 3, f"no jitter: {all_backoffs}"
    assert (stats.completed, stats.failed, stats.retried) == (4, 0, 12)


def test_always_failing_task_ends_failed_with_one_error_and_worker_id_per_attempt(thread_worker):
    result = tasks.always_fails.enqueue("kaput")

    worker = thread_worker(stop_when_empty=True)
    stats = worker.join()

    job = Job.objects.get(id=result.id)
    assert (job.state, job.attempts) == ("failed", 2)
    assert [e["exception_class_path"] for e in job.errors] == ["builtins.ValueError", "builtins.ValueError"]
    assert "ValueError: kaput" in job.errors[-1]["traceback"]
    assert job.worker_ids == [worker.worker.worker_id] * 2
    assert job.finished_at is not None
    result.refresh()
    assert result.status == "FAILED"
    assert len(result.errors) == 2
    assert (stats.completed, stats.failed, stats.retried) == (0, 1, 1)


def test_non_json_return_value_is_a_recorded_failure(thread_worker):
    result = tasks.returns_non_json.enqueue()

    stats = thread_worker(stop_when_empty=True).join()

    job = Job.objects.get(id=result.id)
    assert job.state == "failed"
    assert job.return_value is None
    assert [e["exception_class_path"] for e in job.errors] == ["django_jobs.exceptions.NonJSONReturnValue"]
    assert "not JSON" in job.errors[0]["traceback"]
    assert (stats.completed, stats.failed) == (0, 1)


def test_job_whose_task_path_does_not_resolve_fails_and_the_worker_goes_on(thread_worker, probe):
    bad = [insert_job(task_path=path, max_attempts=3).id for path in ("tests.tasks.not_a_task", "nope.missing")]
    good = [tasks.mark.enqueue(probe, f"g{i}").id for i in range(5)]

    worker = thread_worker(concurrency=2)
    wait_until(lambda: all_finished(bad + good), timeout=20)
    assert worker.thread.is_alive()
    stats = worker.stop()

    assert count_states(good) == {"completed": 5}
    for job_id, needle in zip(bad, ["is a str, not a Task", "does not resolve"], strict=True):
        job = Job.objects.get(id=job_id)
        assert (job.state, job.attempts) == ("failed", 1), "an unknown task is not retried"
        [error] = job.errors
        assert error["exception_class_path"] == "django_jobs.exceptions.TaskNotFound"
        assert needle in error["traceback"]
    assert (stats.completed, stats.failed) == (5, 2)


# -- stopping ----------------------------------------------------------------------------------


def test_stop_when_empty_exits_once_everything_is_done(thread_worker, probe):
    ids = [tasks.mark.enqueue(probe, f"s{i}").id for i in range(10)]
    ids.append(tasks.fail_until_timed.using(backoff=0.3).enqueue(probe, "retry", 2).id)

    stats = thread_worker(concurrency=3, stop_when_empty=True).join()

    # The retry was delayed when the ready set first ran dry; the worker waited for it.
    assert count_states(ids) == {"completed": 11}
    assert (stats.completed, stats.retried) == (11, 1)
    assert not Job.objects.filter(state__in=["waiting", "delayed", "active"]).exists()


def test_stop_when_empty_ignores_jobs_of_another_backend(thread_worker, probe):
    mine = tasks.mark.enqueue(probe, "mine")
    other = tasks.limited_echo.enqueue("not mine")  # TASKS["limited"], same queue and database
    assert Job.objects.get(id=other.id).backend == "limited"

    worker = thread_worker(backend="default", stop_when_empty=True)
    wait_until(lambda: Job.objects.get(id=mine.id).state == "completed", timeout=20)
    finished = wait_until_or_none(lambda: not worker.thread.is_alive(), timeout=5)
    still_waiting = Job.objects.get(id=other.id).state
    worker.stop()

    assert still_waiting == "waiting", "the worker took a job of another backend"
    assert finished, "stop_when_empty did not stop: it waits for a job it will never claim"


def test_max_jobs_processes_exactly_that_many_then_stops(thread_worker, probe):
    ids = [tasks.mark.enqueue(probe, f"m{i}").id for i in range(12)]

    stats = thread_worker(concurrency=3, max_jobs=5).join()

    assert count_states(ids) == {"completed": 5, "waiting": 7}
    assert len(read_records(probe)) == 5
    assert stats.completed == 5


def test_max_time_stops_the_worker(thread_worker):
    t0 = time.monotonic()
    stats = thread_worker(max_time=0.5).join(timeout=20)

    assert time.monotonic() - t0 >= 0.5
    assert stats.elapsed >= 0.5
    assert stats.processed == 0


def test_stop_from_another_thread_lets_the_running_job_finish(thread_worker, probe):
    result = tasks.sleep_then_mark.enqueue(probe, "slow", 0.5)
    waiting = [tasks.mark.using(priority=-1).enqueue(probe, f"w{i}").id for i in range(3)]
    worker = thread_worker(concurrency=1)
    wait_until(lambda: any(r.get("event") == "start" for r in read_records(probe)), timeout=20)

    stopper = threading.Thread(target=worker.worker.stop)
    stopper.start()
    stopper.join(5)
    assert worker.worker.stopping
    stats = worker.join(timeout=20)

    assert Job.objects.get(id=result.id).state == "completed"
    assert [(r["key"], r.get("event")) for r in read_records(probe)] == [("slow", "start"), ("slow", "end")]
    assert (stats.completed, stats.released) == (1, 0)
    # Stopped means no new claims: the queued jobs are still there, their attempts not spent.
    assert count_states(waiting) == {"waiting": 3}
    assert Job.objects.filter(id__in=waiting, attempts=0).count() == 3


# -- signals -------------------------------------------------------------------------------------


def test_task_started_and_task_finished_are_sent_by_the_worker(thread_worker):
    seen = []

    def on_started(sender, task_result, **kwargs):
        seen.append(("started", sender, task_result.id, str(task_result.status), sys.exc_info()[0]))

    def on_finished(sender, task_result, **kwargs):
        seen.append(("finished", sender, task_result.id, str(task_result.status), sys.exc_info()[0]))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        ok = tasks.add.enqueue(1, 2)
        bad = tasks.always_fails.using(max_attempts=1).enqueue()
        thread_worker(concurrency=1, stop_when_empty=True).join()
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)

    assert {s[1] for s in seen} == {JobsBackend}
    by_job = {
        job_id: [(kind, status, exc) for kind, _, jid, status, exc in seen if jid == job_id]
        for job_id in (ok.id, bad.id)
    }
    assert by_job[ok.id] == [("started", "RUNNING", None), ("finished", "SUCCESSFUL", None)]
    # A failure is announced from inside the except block, so receivers can log the traceback.
    assert by_job[bad.id] == [("started", "RUNNING", None), ("finished", "FAILED", ValueError)]


# -- options -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency must be an integer 1..1000"),
        ({"concurrency": "8"}, "concurrency must be an integer"),
        ({"sleep": -1}, "sleep must be a number of seconds > 0"),
        ({"sleep": 0}, "sleep must be a number of seconds > 0"),
        ({"max_jobs": 0}, "max_jobs must be an integer >= 1"),
        ({"max_time": -5}, "max_time must be a number of seconds > 0"),
        ({"grace": -1}, "grace must be a number of seconds >= 0"),
        ({"backend": "nope"}, "No task backend 'nope'"),
        ({"queues": []}, "queues must name at least one queue"),
        ({"queues": ["bad name"]}, "Invalid queue name 'bad name'"),
    ],
)
def test_invalid_worker_options_are_rejected(options, message):
    with pytest.raises(InvalidWorkerOption) as info:
        Worker(**options)
    assert message in str(info.value)


def test_bad_queue_name_is_rejected_by_the_worker():
    with pytest.raises((InvalidWorkerOption, InvalidQueueName), match="Invalid queue name 'bad name'"):
        Worker(queues=["default", "bad name"])


def test_star_means_every_queue_and_queue_names_are_deduplicated():
    assert Worker(queues=["*"]).queues is None
    assert Worker(queues=["b", "a", "b"]).queues == ["a", "b"]


def test_unmigrated_database_stops_the_worker_with_a_clear_error(thread_worker):
    from django.db import connection

    from django_jobs.exceptions import WorkerCrashed

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_jobs_job RENAME TO django_jobs_job_away")
    try:
        worker = thread_worker(concurrency=1)
        worker.thread.join(30)
        assert not worker.thread.is_alive(), "a permanent database error must stop the worker, not spin"
        assert isinstance(worker.error, WorkerCrashed)
        assert "migrate" in str(worker.error)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE django_jobs_job_away RENAME TO django_jobs_job")


def test_a_raising_signal_receiver_neither_fails_nor_repeats_the_job(thread_worker, probe):
    from django.tasks.signals import task_started

    def explode(sender, **kwargs):
        raise RuntimeError("receiver bug")

    task_started.connect(explode)
    try:
        result = tasks.mark.enqueue(probe, "once")
        worker = thread_worker(concurrency=1, stop_when_empty=True)
        worker.join()
    finally:
        task_started.disconnect(explode)
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert [r["key"] for r in read_records(probe)] == ["once"]


def test_a_task_calling_sys_exit_fails_once_and_the_worker_goes_on(thread_worker, probe):
    bad = tasks.exits.enqueue()
    good = tasks.mark.enqueue(probe, "after")
    stats = thread_worker(concurrency=1, stop_when_empty=True).join()
    bad.refresh()
    good.refresh()
    assert bad.status == "FAILED"
    assert [e.exception_class_path for e in bad.errors] == ["builtins.SystemExit"]
    assert len(bad.worker_ids) == 1, "recorded once, not released and re-run"
    assert good.status == "SUCCESSFUL"
    assert (stats.completed, stats.failed) == (1, 1)

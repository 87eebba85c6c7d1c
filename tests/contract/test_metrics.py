"""Per-minute Metric rows: record_outcomes counts completed, failed and retried attempts and
sums run times per (queue, minute), in the statement (PostgreSQL) or transaction (SQLite) that
writes the outcomes. Jobs run through the real pipeline: ``drain_queue`` and real workers
(threads and a process) finishing jobs at the same time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from django_jobs import engine
from django_jobs.models import Event, Job, Metric
from django_jobs.testing import drain_queue
from tests import tasks_console
from tests.conftest import read_log, wait_until
from tests.factories import claim

pytestmark = pytest.mark.django_db(transaction=True)


def totals(queue: str) -> tuple[int, int, int, int]:
    """(completed, failed, retried, runtime_ms) of ``queue`` over all its minutes."""
    sums = Metric.objects.filter(queue=queue).aggregate(
        c=Sum("completed"), f=Sum("failed"), r=Sum("retried"), ms=Sum("runtime_ms")
    )
    return (sums["c"] or 0, sums["f"] or 0, sums["r"] or 0, sums["ms"] or 0)


def claim_all(queue: str, worker_id: str = "w-metrics"):
    return claim(queues=[queue], worker_id=worker_id)


def test_drained_jobs_are_counted_per_outcome():
    for i in range(3):
        tasks_console.ok.using(queue_name="m-basic").enqueue(i)
    for _ in range(2):
        tasks_console.fails.using(queue_name="m-basic").enqueue()  # max_attempts=1: failed
        tasks_console.fails_first_attempt.using(queue_name="m-basic").enqueue()  # retried, then completed

    drain_queue("m-basic")

    completed, failed, retried, _ = totals("m-basic")
    assert (completed, failed, retried) == (5, 2, 2)


def test_each_queue_has_its_own_rows():
    tasks_console.ok.using(queue_name="m-one").enqueue()
    tasks_console.ok.using(queue_name="m-two").enqueue()
    tasks_console.fails.using(queue_name="m-two").enqueue()
    drain_queue()
    assert totals("m-one")[:3] == (1, 0, 0)
    assert totals("m-two")[:3] == (1, 1, 0)
    assert set(Metric.objects.values_list("queue", flat=True)) == {"m-one", "m-two"}


def test_runtime_ms_of_jobs_a_worker_ran_is_their_run_time(thread_worker):
    for _ in range(4):
        tasks_console.sleeps_ms.using(queue_name="m-runtime-w").enqueue(60)
    before = timezone.now()
    thread_worker(queues=["m-runtime-w"], concurrency=1, stop_when_empty=True).join(timeout=60)
    elapsed_ms = (timezone.now() - before).total_seconds() * 1000

    completed, _, _, runtime_ms = totals("m-runtime-w")
    assert completed == 4
    # (+ 20 ms: each run time is rounded to a millisecond, and the clocks are read a moment apart)
    assert 4 * 55 <= runtime_ms <= elapsed_ms + 20, f"4 runs of 60 ms, one after another: {runtime_ms} ms"
    for e in Event.objects.filter(queue="m-runtime-w", kind="completed"):
        assert 55 <= e.data["runtime_ms"] <= 60 + 1000


def test_runtime_ms_of_drained_jobs_is_their_run_time_not_their_wait_after_the_claim():
    """drain_queue claims up to 100 jobs, then runs them one after another: a job's run time is
    from its start to its end, not from the claim (the 4th of 4 x 60 ms jobs ran 60 ms, it did
    not run 240 ms). The sum cannot pass the wall time of the drain."""
    for _ in range(4):
        tasks_console.sleeps_ms.using(queue_name="m-runtime").enqueue(60)
    before = timezone.now()
    drain_queue("m-runtime")
    elapsed_ms = (timezone.now() - before).total_seconds() * 1000

    completed, _, _, runtime_ms = totals("m-runtime")
    assert completed == 4
    # (+ 20 ms: each run time is rounded to a millisecond, and the clocks are read a moment apart)
    assert 4 * 55 <= runtime_ms <= elapsed_ms + 20, f"4 runs of 60 ms, one after another: {runtime_ms} ms"
    for e in Event.objects.filter(queue="m-runtime", kind="completed"):
        assert 55 <= e.data["runtime_ms"] <= 60 + 1000, e.data


def test_failed_jobs_add_their_run_time_and_retried_attempts_do_not():
    for _ in range(2):
        tasks_console.fails_first_attempt.using(queue_name="m-rt-retry").enqueue()
    tasks_console.fails.using(queue_name="m-rt-retry").enqueue()
    jobs = claim_all("m-rt-retry")
    start = min(j.last_attempted_at for j in jobs)
    now = start + timedelta(seconds=2)
    outcomes = [
        engine.Outcome(job_id=jobs[0].id, lease_token=jobs[0].lease_token, state="delayed",
                       available_at=now + timedelta(hours=1), error={"exception_class_path": "x.Y", "traceback": ""}),
        engine.Outcome(job_id=jobs[1].id, lease_token=jobs[1].lease_token, state="failed",
                       error={"exception_class_path": "x.Y", "traceback": ""}),
        engine.Outcome(job_id=jobs[2].id, lease_token=jobs[2].lease_token, state="completed", return_value_json="1"),
    ]  # fmt: skip
    engine.record_outcomes(outcomes, using="default", now=now)

    completed, failed, retried, runtime_ms = totals("m-rt-retry")
    assert (completed, failed, retried) == (1, 1, 1)
    expected = sum((now - j.last_attempted_at).total_seconds() * 1000 for j in jobs[1:])
    assert abs(runtime_ms - expected) <= 2, "completed + failed only, ~2 s each"


def test_the_row_is_the_minute_the_outcome_was_written_and_batches_of_a_minute_add_up():
    minute = datetime(2031, 5, 6, 7, 8, tzinfo=UTC)
    tasks_console.ok.using(queue_name="m-minute").enqueue_many([(i,) for i in range(5)])
    jobs = claim_all("m-minute")
    done = [engine.Outcome(job_id=j.id, lease_token=j.lease_token, state="completed") for j in jobs]
    engine.record_outcomes(done[:2], using="default", now=minute + timedelta(seconds=1))
    engine.record_outcomes(done[2:4], using="default", now=minute + timedelta(seconds=59, microseconds=999_000))
    engine.record_outcomes(done[4:], using="default", now=minute + timedelta(seconds=60))

    rows = list(Metric.objects.filter(queue="m-minute").order_by("minute").values_list("minute", "completed"))
    assert rows == [(minute, 4), (minute + timedelta(minutes=1), 1)]


def test_minutes_are_utc_whatever_the_time_zone_of_now():
    from zoneinfo import ZoneInfo

    tasks_console.ok.using(queue_name="m-tz").enqueue()
    [job] = claim_all("m-tz")
    local = datetime(2031, 5, 6, 9, 30, 15, tzinfo=ZoneInfo("Asia/Kolkata"))  # 04:00:15 UTC
    engine.record_outcomes(
        [engine.Outcome(job_id=job.id, lease_token=job.lease_token, state="completed")], using="default", now=local
    )
    assert Metric.objects.get(queue="m-tz").minute == datetime(2031, 5, 6, 4, 0, tzinfo=UTC)


def test_drained_jobs_land_in_the_current_minute():
    before = timezone.now()
    tasks_console.ok.using(queue_name="m-now").enqueue()
    drain_queue("m-now")
    after = timezone.now()
    [row] = Metric.objects.filter(queue="m-now")
    assert row.minute.second == 0 and row.minute.microsecond == 0
    assert before.replace(second=0, microsecond=0) <= row.minute <= after


def test_snoozes_and_cancelled_attempts_count_nothing():
    tasks_console.snoozes.using(queue_name="m-none").enqueue()
    drain_queue("m-none", with_scheduled=False)
    cancelled = tasks_console.ok.using(queue_name="m-none").enqueue()
    [job] = claim_all("m-none")
    assert str(job.id) == cancelled.id
    engine.cancel_job(using="default", job_id=job.id)
    engine.record_outcomes(
        [engine.Outcome(job_id=job.id, lease_token=job.lease_token, state="completed")], using="default"
    )
    assert Job.objects.get(id=job.id).state == "cancelled"
    assert totals("m-none")[:3] == (0, 0, 0)


def test_a_stale_outcome_counts_nothing():
    tasks_console.ok.using(queue_name="m-stale").enqueue()
    [job] = claim_all("m-stale")
    engine.record_outcomes(
        [engine.Outcome(job_id=job.id, lease_token=uuid.uuid4(), state="completed")], using="default"
    )
    assert not Metric.objects.filter(queue="m-stale").exists()


def test_concurrent_workers_sum_exactly(thread_worker, worker_process, probe):
    """Three worker threads and a worker process finish jobs of one queue at the same time; the
    per-minute counts add up to exactly what ran."""
    queue = "m-conc"
    ok = tasks_console.ok.using(queue_name=queue).enqueue_many([(i,) for i in range(150)])
    slow = tasks_console.sleeps_ms.using(queue_name=queue).enqueue_many([(50,) for _ in range(30)])
    failing = tasks_console.fails.using(queue_name=queue).enqueue_many([() for _ in range(30)])
    retrying = tasks_console.fails_first_attempt.using(queue_name=queue).enqueue_many(
        [(probe, f"r{i}") for i in range(30)]
    )
    ids = [r.id for r in ok + slow + failing + retrying]
    assert len(ids) == 240

    proc = worker_process("--queue", queue, "-c", "2", "--worker-id", "m-proc")
    workers = [thread_worker(queues=[queue], concurrency=4, worker_id=f"m-thread-{i}") for i in range(3)]
    try:
        wait_until(
            lambda: Job.objects.filter(id__in=ids, state__in=["completed", "failed"]).count() == 240,
            timeout=120,
            message="240 jobs to finish",
        )
    finally:
        for w in workers:
            w.stop()
        proc.terminate()
        proc.wait(30)
    ran_by = set(Event.objects.filter(queue=queue, kind="active").values_list("data__worker", flat=True))
    assert len(ran_by) >= 2, f"the jobs were shared between workers: {ran_by} ({read_log(proc)[-2000:]})"

    completed, failed, retried, runtime_ms = totals(queue)
    assert (completed, failed, retried) == (210, 30, 30)
    assert runtime_ms >= 30 * 50, "the 30 runs of 50 ms alone"
    kinds = {k: Event.objects.filter(queue=queue, kind=k).count() for k in ("completed", "failed", "retried")}
    assert kinds == {"completed": 210, "failed": 30, "retried": 30}, "the events agree with the counts"

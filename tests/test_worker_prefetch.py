"""Prefetch: while its jobs are short, a worker claims up to ``concurrency * prefetch`` jobs at
once, still running at most ``concurrency`` at a time; jobs claimed behind a long one go back to
the queue for other workers (producer.SHORT_JOB, producer.PREFETCH_HOLD)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

import django_jobs
from django_jobs.models import Event, Job
from django_jobs.worker import Worker, producer
from django_jobs.worker.runner import InvalidWorkerOption
from tests import tasks
from tests.tasks import read_records

pytestmark = pytest.mark.django_db(transaction=True)


def claim_sizes(ids) -> list[int]:
    """Jobs per claim: the jobs of one claim share its time (``last_attempted_at``)."""
    per_claim = Counter(Job.objects.filter(id__in=ids).values_list("last_attempted_at", flat=True))
    return sorted(per_claim.values())


def running_at_once(records: list[dict]) -> int:
    """The most jobs between their start and end records at any moment (records in file order)."""
    running = peak = 0
    for r in records:
        running += 1 if r["event"] == "start" else -1
        peak = max(peak, running)
    return peak


def drain_sleepers(thread_worker, probe, n: int, seconds: float, **options) -> tuple[list[int], list[dict]]:
    """Run ``n`` jobs sleeping ``seconds`` each with a worker of ``options`` until the queue is
    empty; each completes once. Returns the claim sizes and the jobs' start and end records."""
    ids = [tasks.sleep_then_mark.enqueue(probe, f"k{i}", seconds).id for i in range(n)]

    stats = thread_worker(stop_when_empty=True, **options).join(timeout=60)

    assert stats.completed == n
    sizes = claim_sizes(ids)
    assert sum(sizes) == n
    assert Job.objects.filter(id__in=ids, state="completed", attempts=1).count() == n
    return sizes, read_records(probe)


def test_short_jobs_are_claimed_several_per_thread_and_run_one_per_thread(thread_worker, probe):
    sizes, records = drain_sleepers(thread_worker, probe, 60, 0.0, concurrency=2, prefetch=4)

    assert max(sizes) > 2, f"never claimed beyond the 2 threads: {sizes}"
    assert max(sizes) <= 8, f"claimed more than concurrency x prefetch: {sizes}"
    assert running_at_once(records) <= 2


def test_long_jobs_are_claimed_in_halves_and_still_fill_every_slot(thread_worker, probe):
    # Jobs of 0.3 s run long (producer.SHORT_JOB): each claim takes half of the free slots, at
    # least LONG_CLAIM, the next at once. One claim of all 24 slots would start the jobs together,
    # and they would end together and wait together for the next claim.
    sizes, records = drain_sleepers(thread_worker, probe, 48, 0.3, concurrency=24, prefetch=4)

    assert max(sizes) <= 12, f"a claim took more than half of the 24 free slots: {sizes}"
    assert len(sizes) >= 4, f"fewer claims than halving makes: {sizes}"
    # The smaller claims follow each other at once: all 24 threads ran jobs together.
    assert running_at_once(records) == 24


def test_async_jobs_count_towards_the_run_average_and_long_ones_are_claimed_in_halves(thread_worker):
    # async_add awaits 10 ms on the event loop: long. Its runs count towards the average the
    # producer judges short and long jobs by, as an executor thread's do.
    ids = [tasks.async_add.enqueue(i, 1).id for i in range(48)]

    w = thread_worker(concurrency=24, stop_when_empty=True)
    stats = w.join(timeout=60)

    assert stats.completed == 48
    sizes = claim_sizes(ids)
    assert max(sizes) <= 12, f"a claim took more than half of the 24 free slots: {sizes}"
    assert w.worker._producer._run_avg >= 0.01


def test_prefetch_1_claims_only_for_free_threads(thread_worker, probe):
    ids = [tasks.mark.enqueue(probe, f"k{i}").id for i in range(20)]

    thread_worker(concurrency=1, prefetch=1, stop_when_empty=True).join(timeout=60)

    assert claim_sizes(ids) == [1] * 20


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_jobs_claimed_behind_a_long_one_go_back_to_the_queue(thread_worker, probe, monkeypatch):
    # Short jobs first, so the worker measures its jobs as short and prefetches (a generous
    # SHORT_JOB: a slow machine's first jobs must not keep the average above it).
    monkeypatch.setattr(producer, "SHORT_JOB", 0.5)
    warm = [tasks.mark.enqueue(probe, f"warm{i}").id for i in range(5)]
    first = thread_worker(concurrency=1, prefetch=4, worker_id="first")
    wait_for(lambda: Job.objects.filter(id__in=warm, state="completed").count() == 5)
    # One claim takes all four: the long job runs, the three others wait behind it.
    with transaction.atomic():
        long = tasks.sleep_then_mark.enqueue(probe, "long", 3.0)
        behind = [tasks.sleep_then_mark.enqueue(probe, f"behind{i}", 0.0).id for i in range(3)]
    wait_for(lambda: Job.objects.filter(id=long.id, state="active").exists())
    second = thread_worker(concurrency=1, prefetch=1, worker_id="second")

    wait_for(lambda: Job.objects.filter(id__in=behind, state="completed").count() == 3)

    assert Job.objects.get(id=long.id).state == "active", "the three waited for the long job"
    released = {
        str(j) for j in Event.objects.filter(job_id__in=behind, kind="released").values_list("job_id", flat=True)
    }
    assert released == set(behind), "the first worker claimed them with the long job and handed them back"
    for job in Job.objects.filter(id__in=behind):
        assert job.attempts == 1, "a hand-back takes the attempt back"
        assert job.worker_ids == ["second"], job.worker_ids
    wait_for(lambda: Job.objects.filter(id=long.id, state="completed").exists())
    first.stop()
    second.stop()
    assert first.error is None and second.error is None
    assert first.stats.released == 3, "counted in the worker's summary"


def test_a_limited_queue_is_not_starved_by_prefetched_jobs(thread_worker, probe):
    # Jobs of a limited queue are claimed for threads not running a job: while the unlimited
    # queue's backlog keeps the worker full of prefetched jobs, they must still get their turn.
    django_jobs.queue("limited").set_concurrency(1)
    backlog = [tasks.sleep_then_mark.enqueue(probe, f"b{i}", 0.002).id for i in range(400)]
    limited = [tasks.sleep_then_mark.using(queue_name="limited").enqueue(probe, f"l{i}", 0.0).id for i in range(5)]

    thread_worker(concurrency=2, prefetch=4, stop_when_empty=True).join(timeout=120)

    last_backlog = max(Job.objects.filter(id__in=backlog).values_list("finished_at", flat=True))
    last_limited = max(Job.objects.filter(id__in=limited).values_list("finished_at", flat=True))
    assert Job.objects.filter(id__in=[*backlog, *limited], state="completed").count() == 405
    assert last_limited < last_backlog, "the limited queue waited for the whole backlog"


def test_max_jobs_counts_exactly_with_prefetch(thread_worker, probe):
    ids = [tasks.mark.enqueue(probe, f"k{i}").id for i in range(40)]

    stats = thread_worker(concurrency=2, prefetch=4, max_jobs=11).join(timeout=60)

    assert stats.completed == 11
    assert Job.objects.filter(id__in=ids, state="completed").count() == 11
    assert Job.objects.filter(id__in=ids, state="waiting", attempts=0).count() == 29


def test_a_prefetched_job_cancelled_while_it_waits_ends_cancelled_without_running(thread_worker, probe, monkeypatch):
    monkeypatch.setattr(producer, "SHORT_JOB", 0.5)
    monkeypatch.setattr(producer, "PREFETCH_HOLD", 1.0)  # the cancel reaches it while it waits
    warm = [tasks.mark.enqueue(probe, f"warm{i}").id for i in range(3)]
    worker = thread_worker(concurrency=1, prefetch=4)
    wait_for(lambda: Job.objects.filter(id__in=warm, state="completed").count() == 3)
    with transaction.atomic():
        long = tasks.sleep_then_mark.enqueue(probe, "long", 4.0)
        behind = tasks.sleep_then_mark.enqueue(probe, "behind", 0.0)
    wait_for(lambda: Job.objects.filter(id=long.id, state="active").exists())
    assert Job.objects.get(id=behind.id).state == "active", "claimed with the long job"

    django_jobs.cancel(behind.id)

    wait_for(lambda: Job.objects.get(id=behind.id).state == "cancelled")
    assert Job.objects.get(id=long.id).state == "active", "ended when it was handed back, not after the long job"
    worker.stop()
    assert worker.error is None
    assert "behind" not in [r["key"] for r in read_records(probe)]
    assert worker.stats.cancelled == 1


def test_a_stopping_worker_does_not_start_its_prefetched_jobs(thread_worker, probe, monkeypatch):
    monkeypatch.setattr(producer, "SHORT_JOB", 0.5)
    monkeypatch.setattr(producer, "PREFETCH_HOLD", 30.0)  # only the stop hands them back
    warm = [tasks.mark.enqueue(probe, f"warm{i}").id for i in range(3)]
    worker = thread_worker(concurrency=1, prefetch=4, grace=10)
    wait_for(lambda: Job.objects.filter(id__in=warm, state="completed").count() == 3)
    with transaction.atomic():
        long = tasks.sleep_then_mark.enqueue(probe, "long", 0.5)
        behind = [tasks.sleep_then_mark.enqueue(probe, f"behind{i}", 0.0).id for i in range(3)]
    # Started, not only claimed: "active" comes with the claim, and the job may still wait in
    # the prefetched list for a moment (on a database without NOTIFY the claim lands at a poll).
    wait_for(lambda: any(r["key"] == "long" and r.get("event") == "start" for r in read_records(probe)))

    worker.stop()

    assert worker.error is None
    assert Job.objects.get(id=long.id).state == "completed", "the running job finished in the grace period"
    assert [r["key"] for r in read_records(probe) if r["key"].startswith("behind")] == []
    assert Job.objects.filter(id__in=behind, state="waiting", attempts=0).count() == 3


@pytest.mark.parametrize("value", [0, -1, 101, 1.5, "4"])
def test_a_bad_prefetch_is_refused(value):
    with pytest.raises(InvalidWorkerOption, match="prefetch"):
        Worker(prefetch=value)


def test_runworker_refuses_a_bad_prefetch():
    with pytest.raises(CommandError, match="prefetch"):
        call_command("runworker", "--prefetch", "0")

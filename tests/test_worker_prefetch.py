"""Prefetch: while its jobs are short, a worker claims up to ``concurrency * prefetch`` jobs at
once, still running at most ``concurrency`` at a time; jobs claimed behind a long one go back to
the queue for other workers (runner.SHORT_JOB, runner.PREFETCH_HOLD)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from django_jobs.models import Event, Job
from django_jobs.worker import Worker
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


def test_short_jobs_are_claimed_several_per_thread_and_run_one_per_thread(thread_worker, probe):
    ids = [tasks.sleep_then_mark.enqueue(probe, f"k{i}", 0.0).id for i in range(60)]

    stats = thread_worker(concurrency=2, prefetch=4, stop_when_empty=True).join(timeout=60)

    assert stats.completed == 60
    sizes = claim_sizes(ids)
    assert sum(sizes) == 60
    assert max(sizes) > 2, f"never claimed beyond the 2 threads: {sizes}"
    assert max(sizes) <= 8, f"claimed more than concurrency x prefetch: {sizes}"
    assert running_at_once(read_records(probe)) <= 2
    assert Job.objects.filter(id__in=ids, state="completed", attempts=1).count() == 60


def test_prefetch_1_claims_only_for_free_threads(thread_worker, probe):
    ids = [tasks.mark.enqueue(probe, f"k{i}").id for i in range(20)]

    thread_worker(concurrency=1, prefetch=1, stop_when_empty=True).join(timeout=60)

    assert claim_sizes(ids) == [1] * 20


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_jobs_claimed_behind_a_long_one_go_back_to_the_queue(thread_worker, probe):
    # Short jobs first, so the worker measures its jobs as short and prefetches.
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


@pytest.mark.parametrize("value", [0, -1, 101, 1.5, "4"])
def test_a_bad_prefetch_is_refused(value):
    with pytest.raises(InvalidWorkerOption, match="prefetch"):
        Worker(prefetch=value)


def test_runworker_refuses_a_bad_prefetch():
    with pytest.raises(CommandError, match="prefetch"):
        call_command("runworker", "--prefetch", "0")

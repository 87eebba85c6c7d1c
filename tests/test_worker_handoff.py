"""How the worker hands claimed jobs to its executor threads: a claim at a time to one thread,
spread over the idle ones when a job runs long; one TaskResult per attempt for its signals."""

from __future__ import annotations

import re

import pytest
from django.tasks.signals import task_finished, task_started

from django_jobs.models import Job
from tests import tasks
from tests.tasks import read_records

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_long_job_does_not_hold_back_the_jobs_claimed_with_it(thread_worker, probe):
    # Enqueued first, so the thread given the claim runs the long job first.
    tasks.sleep_then_mark.enqueue(probe, "long", 1.0)
    short = [tasks.sleep_then_mark.enqueue(probe, f"short{i}", 0.0) for i in range(3)]

    thread_worker(concurrency=4, stop_when_empty=True).join(timeout=30)

    ends = [r["key"] for r in read_records(probe) if r["event"] == "end"]
    assert ends[-1] == "long", f"the short jobs waited for the long one: {ends}"
    assert Job.objects.filter(id__in=[r.id for r in short], state="completed").count() == 3


def test_many_short_jobs_run_on_few_threads_and_each_exactly_once(thread_worker, probe):
    ids = [tasks.mark.enqueue(probe, f"k{i}").id for i in range(200)]

    stats = thread_worker(concurrency=8, stop_when_empty=True).join(timeout=60)

    keys = [r["key"] for r in read_records(probe)]
    assert sorted(keys) == sorted(f"k{i}" for i in range(200))
    assert Job.objects.filter(id__in=ids, state="completed").count() == 200
    assert stats.completed == 200


def test_task_finished_sends_the_result_task_started_sent_finished(thread_worker):
    started, finished = {}, {}

    def on_started(sender, task_result, **kwargs):
        started[task_result.id] = (task_result, str(task_result.status))

    def on_finished(sender, task_result, **kwargs):
        finished[task_result.id] = (task_result, str(task_result.status), len(task_result.errors))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        ok = tasks.add.enqueue(1, 2)
        bad = tasks.always_fails.using(max_attempts=1).enqueue()
        thread_worker(concurrency=2, stop_when_empty=True).join()
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)

    for result, status in ((ok, "SUCCESSFUL"), (bad, "FAILED")):
        assert started[result.id][1] == "RUNNING"
        assert finished[result.id][0] is started[result.id][0], "one TaskResult per attempt"
        assert finished[result.id][1] == status
    assert finished[ok.id][0].return_value == 3
    assert (finished[ok.id][2], finished[bad.id][2]) == (0, 1)


def test_the_worker_reports_how_long_finished_jobs_stayed_active(thread_worker, probe):
    # The completer writes an outcome a few ms after its job ended (bounds kept loose for a
    # loaded machine); each of the 6 outcomes is counted once.
    for i in range(6):
        tasks.sleep_then_mark.enqueue(probe, f"k{i}", 0.05)

    stats = thread_worker(concurrency=2, stop_when_empty=True).join(timeout=30)

    assert stats.completed == 6

    match = re.fullmatch(
        r"finished jobs were active until their outcome committed for ([\d.]+) ms \(median\), ([\d.]+) ms "
        r"\(p99\), ([\d.]+) ms at most; at most (\d+) at once",
        stats.outcome_window,
    )
    assert match, stats.outcome_window
    median, p99, most, at_once = float(match[1]), float(match[2]), float(match[3]), int(match[4])
    assert 0 < median <= p99 <= most < 1000, stats.outcome_window
    assert 1 <= at_once <= 6, stats.outcome_window


def test_the_producer_claims_nothing_more_while_the_completer_is_behind(thread_worker, monkeypatch):
    # Finished jobs stay active until their outcome is written. A completer that cannot write
    # (a reconnect, a slow database) must not let the producer go on claiming: the jobs that
    # would run again if the worker died then stay bounded by OUTCOME_BACKLOG.
    import threading
    import time

    from django_jobs import engine
    from django_jobs.worker import producer, runner

    monkeypatch.setattr(producer, "OUTCOME_BACKLOG", 10)
    gate = threading.Event()
    write = engine.record_outcomes

    def stalled(outcomes, **kwargs):
        gate.wait(30)
        return write(outcomes, **kwargs)

    monkeypatch.setattr(engine, "record_outcomes", stalled)
    ids = [tasks.noop.enqueue().id for _ in range(100)]
    worker = thread_worker(concurrency=4, stop_when_empty=True)
    time.sleep(1.5)
    held = Job.objects.filter(state="active").count()
    gate.set()
    stats = worker.join(timeout=60)

    held_at_most = 4 * runner.DEFAULT_PREFETCH  # claimed jobs (running or waiting for a thread)
    assert 10 <= held <= 10 + 2 * held_at_most, f"{held} jobs active while no outcome could be written"
    assert stats.completed == 100
    assert Job.objects.filter(id__in=ids, state="completed").count() == 100

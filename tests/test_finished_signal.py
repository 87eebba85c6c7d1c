"""Django's ``task_finished`` contract: sent once the outcome is stored, so a receiver that reads
the result back sees the final status; its result carries the stored (normalised) values.

Django's ``ImmediateBackend`` and the reference database backend send it after the result is
saved; receivers that call ``get_result()`` or ``refresh()`` rely on that.
"""

from __future__ import annotations

import sys

import pytest
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished

from django_jobs.testing import perform_job
from tests import tasks
from tests.factories import insert_job

pytestmark = pytest.mark.django_db(transaction=True)


class Reader:
    """A task_finished receiver that reads the result back, as a Django user's receiver would."""

    def __init__(self):
        self.seen: list[dict] = []

    def __call__(self, sender, task_result, **kwargs):
        stored = task_result.task.get_result(task_result.id)
        signalled = task_result.status
        task_result.refresh()
        self.seen.append(
            {
                "id": task_result.id,
                "signalled": signalled,
                "stored": stored.status,
                "refreshed": task_result.status,
                "return_value": stored.return_value if stored.status == TaskResultStatus.SUCCESSFUL else None,
                "signal_finished_at": task_result.finished_at,
                "stored_finished_at": stored.finished_at,
                "exc": sys.exc_info()[0],
                "stored_errors": len(stored.errors),
            }
        )

    def __enter__(self):
        task_finished.connect(self)
        return self

    def __exit__(self, *exc):
        task_finished.disconnect(self)


def test_a_receiver_of_task_finished_reads_the_final_status_from_a_worker(thread_worker):
    with Reader() as reader:
        ok = tasks.add.enqueue(1, 2)
        bad = tasks.always_fails.using(max_attempts=1).enqueue()
        thread_worker(concurrency=2, stop_when_empty=True).join()
    by_id = {s["id"]: s for s in reader.seen}
    assert set(by_id) == {ok.id, bad.id} and len(reader.seen) == 2, "one signal per job"
    assert (by_id[ok.id]["signalled"], by_id[ok.id]["stored"], by_id[ok.id]["refreshed"]) == (
        TaskResultStatus.SUCCESSFUL,
    ) * 3
    assert (by_id[bad.id]["signalled"], by_id[bad.id]["stored"], by_id[bad.id]["refreshed"]) == (
        TaskResultStatus.FAILED,
    ) * 3
    for seen in reader.seen:
        assert seen["signal_finished_at"] == seen["stored_finished_at"] is not None
    assert by_id[bad.id]["exc"] is ValueError, "a failure is signalled while its exception is handled"
    assert by_id[ok.id]["exc"] is None


def test_a_retried_attempt_is_signalled_ready_after_its_retry_is_stored(thread_worker, probe):
    with Reader() as reader:
        result = tasks.fail_until.enqueue(probe, 2)
        thread_worker(concurrency=1, stop_when_empty=True).join()
    mine = [s for s in reader.seen if s["id"] == result.id]
    assert [s["signalled"] for s in mine] == [TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL]
    # The retry was stored before its signal: the receiver reads the first attempt's error. (The
    # status it reads may already be the second attempt's RUNNING: the retry is claimable at once.)
    assert mine[0]["stored_errors"] == 1
    assert mine[1]["stored"] == mine[1]["refreshed"] == TaskResultStatus.SUCCESSFUL


def test_task_finished_carries_the_stored_return_value_a_tuple_arrives_as_a_list(thread_worker):
    returned = []

    def receiver(sender, task_result, **kwargs):
        returned.append(task_result.return_value)

    task_finished.connect(receiver)
    try:
        result = tasks.returns_tuple.enqueue(1, "two")
        thread_worker(concurrency=1, stop_when_empty=True).join()
    finally:
        task_finished.disconnect(receiver)
    assert returned == [[1, "two"]]
    assert result.task.get_result(result.id).return_value == [1, "two"]


def test_perform_job_sends_task_finished_after_the_outcome_is_written():
    with Reader() as reader:
        result = perform_job(tasks.returns_tuple, 3, 4)
    assert result.return_value == [3, 4]
    [seen] = reader.seen
    assert (seen["signalled"], seen["stored"], seen["refreshed"]) == (TaskResultStatus.SUCCESSFUL,) * 3
    assert seen["return_value"] == [3, 4]


def test_signals_of_a_deferred_job_carry_its_run_after(thread_worker):
    from datetime import timedelta

    from django.tasks.signals import task_started
    from django.utils import timezone

    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.task.run_after)

    task_started.connect(receiver)
    task_finished.connect(receiver)
    try:
        result = tasks.add.using(run_after=timezone.now() + timedelta(milliseconds=300)).enqueue(1, 1)
        thread_worker(concurrency=1, stop_when_empty=True).join()
    finally:
        task_started.disconnect(receiver)
        task_finished.disconnect(receiver)
    assert result.task.run_after is not None
    assert seen == [result.task.run_after] * 2


def test_a_job_whose_task_no_longer_builds_does_not_stop_the_worker_writing_outcomes(thread_worker, probe):
    """The stored queue is one the task's backend no longer accepts: the job fails, no
    task_finished can be built for it, and the worker goes on writing the next outcomes."""

    stale = insert_job(backend="limited", task_path="tests.tasks.limited_echo", queue="retired")
    later = [tasks.limited_echo.enqueue(i) for i in range(3)]
    stats = thread_worker(backend="limited", concurrency=1, stop_when_empty=True).join(timeout=30)
    from django_jobs.models import Job

    assert Job.objects.get(id=stale.id).state == "failed"
    assert {Job.objects.get(id=r.id).state for r in later} == {"completed"}
    assert (stats.completed, stats.failed) == (3, 1)

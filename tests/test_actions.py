"""Handler actions: context.fail/retry/snooze, the Fail/Retry/Snooze exceptions, callable
backoff and set_progress, run by a real worker on a real database."""

import os

import pytest
from django.tasks import task

from django_jobs import Fail, Retry, Snooze
from django_jobs.exceptions import InvalidTaskArguments, InvalidTaskOptions
from django_jobs.models import Job
from tests import tasks
from tests.conftest import wait_until
from tests.tasks import read_records

pytestmark = pytest.mark.django_db(transaction=True)


def run_all(thread_worker):
    return thread_worker(concurrency=2, stop_when_empty=True).join()


def test_context_fail_fails_for_good_with_attempts_left(thread_worker, probe):
    result = tasks.acts.enqueue(probe, "fail")
    run_all(thread_worker)
    result.refresh()
    assert result.status == "FAILED"
    assert len(read_records(probe)) == 1, "no retry although 2 attempts remained"
    assert result.errors[0].exception_class_path == "django_jobs.exceptions.Fail"
    assert "given up on purpose" in result.errors[0].traceback


def test_fail_with_an_exception_records_that_exception(thread_worker, probe):
    result = tasks.acts.enqueue(probe, "fail-exception")
    run_all(thread_worker)
    result.refresh()
    assert result.status == "FAILED"
    assert [e.exception_class_path for e in result.errors] == ["builtins.KeyError"]


@pytest.mark.parametrize("action", ["retry", "retry-backoff"])
def test_context_retry_counts_an_attempt_and_runs_again(thread_worker, probe, action):
    result = tasks.acts.enqueue(probe, action)
    run_all(thread_worker)
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.return_value == 2
    assert [r["attempt"] for r in read_records(probe)] == [1, 2]
    assert len(result.errors) == 1 and result.errors[0].exception_class_path == "django_jobs.exceptions.Retry"
    assert len(result.worker_ids) == 2


def test_context_snooze_runs_later_without_counting_the_attempt(thread_worker, probe):
    result = tasks.acts.enqueue(probe, "snooze")
    run_all(thread_worker)
    result.refresh()
    job = Job.objects.get(id=result.id)
    assert result.status == "SUCCESSFUL"
    assert result.return_value == 1, "the snoozed attempt does not count"
    assert job.attempts == 1 and len(result.worker_ids) == 1
    assert result.errors == []
    first, second = read_records(probe)
    assert (first["attempt"], second["attempt"]) == (1, 1)
    assert (result.started_at - result.enqueued_at).total_seconds() >= 0
    assert (result.last_attempted_at - result.started_at).total_seconds() >= 0.3


@pytest.mark.parametrize(
    ("action", "status", "runs"),
    [("fail", "FAILED", 1), ("retry", "SUCCESSFUL", 2), ("snooze", "SUCCESSFUL", 2)],
)
def test_actions_as_exceptions_work_without_context(thread_worker, probe, action, status, runs):
    result = tasks.raises_action.enqueue(probe, action)
    run_all(thread_worker)
    result.refresh()
    assert result.status == status
    assert len(read_records(probe)) == runs
    job = Job.objects.get(id=result.id)
    assert job.attempts == (1 if action in ("fail", "snooze") else 2)


def test_retry_on_the_last_attempt_fails(thread_worker, probe):
    result = tasks.raises_action.using(max_attempts=1).enqueue(probe, "retry")
    run_all(thread_worker)
    result.refresh()
    assert result.status == "FAILED"
    assert len(read_records(probe)) == 1


def test_callable_backoff_returning_none_stops_retrying(thread_worker, probe):
    result = tasks.always_fails_with_callable_backoff.enqueue(probe)
    assert Job.objects.get(id=result.id).options == {"backoff_path": "tests.tasks.stop_after_two"}
    run_all(thread_worker)
    result.refresh()
    assert result.status == "FAILED"
    assert len(read_records(probe)) == 2, "attempt 1 retried at once, attempt 2 stopped by the backoff"
    assert len(result.errors) == 2


def test_callable_backoff_must_be_importable():
    with pytest.raises(InvalidTaskOptions, match="module-level"):
        task(backoff=lambda attempt, exc: 1)(tasks.noop.func)


@pytest.mark.parametrize("bad", [-1, 101, float("nan"), "half", True, [1]])
def test_invalid_progress_is_rejected(bad):
    from django_jobs.context import JobContext

    context = JobContext(task_result=tasks.noop.enqueue(), job_id="x", queue="default", max_attempts=1)
    with pytest.raises(InvalidTaskArguments):
        context.set_progress(bad)


def test_progress_is_visible_while_the_job_runs(thread_worker, probe):
    result = tasks.reports_progress.enqueue(probe)
    worker = thread_worker(concurrency=1)
    wait_until(lambda: tasks.reports_progress.get_result(result.id).progress == 42, timeout=20)
    assert tasks.reports_progress.get_result(result.id).status == "RUNNING"
    open(probe + ".go", "w").close()
    wait_until(lambda: tasks.reports_progress.get_result(result.id).status == "SUCCESSFUL", timeout=20)
    worker.stop()
    result.refresh()
    assert result.progress == {"step": "done", "pct": 100}
    assert os.path.exists(probe + ".go")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Snooze(0), "Snooze needs"),
        (lambda: Snooze("1"), "Snooze needs"),
        (lambda: Retry(delay=-1), "Retry delay"),
    ],
)
def test_action_arguments_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_fail_message_is_kept():
    assert str(Fail("why")) == "why"


def test_a_callable_backoff_setting_applies_to_tasks_without_their_own(thread_worker, probe):
    from django.test import override_settings

    with override_settings(
        DJANGO_JOBS={"BACKOFF": tasks.stop_after_two, "POLL_INTERVAL": 0.2, "PROMOTE_INTERVAL": 0.2}
    ):
        result = tasks.fail_until.using(max_attempts=5, backoff=None).enqueue(probe, 99)
        Job.objects.filter(id=result.id).update(options={})  # no task-level backoff stored
        run_all(thread_worker)
    result.refresh()
    assert result.status == "FAILED"
    assert len(read_records(probe)) == 2, "the setting's callable stopped the retries after attempt 2"

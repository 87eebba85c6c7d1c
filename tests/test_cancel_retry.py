"""django_jobs.cancel() and django_jobs.retry(): guarded transitions in the engine."""

import time
import uuid
from datetime import timedelta

import pytest
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils import timezone

import django_jobs
from django_jobs import engine
from django_jobs.api import JobNotRetryable
from django_jobs.models import Job
from tests import tasks
from tests.conftest import wait_until
from tests.tasks import read_records


@pytest.mark.django_db
@pytest.mark.parametrize("delayed", [False, True])
def test_cancel_of_a_waiting_or_delayed_job_is_immediate(delayed):
    task = tasks.noop.using(run_after=timedelta(hours=1)) if delayed else tasks.noop
    result = task.enqueue()
    cancelled = django_jobs.cancel(result.id)
    assert cancelled.status == "FAILED"
    job = Job.objects.get(id=result.id)
    assert job.state == "cancelled" and job.finished_at is not None
    assert engine.claim_jobs(using="default", queues=None, limit=10, worker_id="w", lease_seconds=30) == []


@pytest.mark.django_db
@pytest.mark.parametrize("bad", [str(uuid.uuid4()), "not-an-id"])
def test_cancel_and_retry_of_an_unknown_id_raise_task_result_does_not_exist(bad):
    with pytest.raises(TaskResultDoesNotExist):
        django_jobs.cancel(bad)
    with pytest.raises(TaskResultDoesNotExist):
        django_jobs.retry(bad)


@pytest.mark.django_db
def test_cancel_of_a_finished_job_leaves_it_as_it_is():
    result = tasks.noop.enqueue()
    [job] = engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w", lease_seconds=30)
    engine.record_outcomes(
        [engine.Outcome(job_id=job.id, lease_token=job.lease_token, state="completed", return_value_json="1")],
        using="default",
    )
    assert django_jobs.cancel(result.id).status == "SUCCESSFUL"
    assert Job.objects.get(id=result.id).state == "completed"


@pytest.mark.django_db
def test_a_cancel_racing_a_completion_records_exactly_one_outcome():
    """The worker's outcome and the cancel flag meet in one guarded UPDATE: the job ends
    cancelled (the flag won) with exactly one attempt recorded, never both or neither."""
    result = tasks.noop.enqueue()
    [job] = engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w", lease_seconds=30)
    assert django_jobs.cancel(result.id).status == "RUNNING"
    written = engine.record_outcomes(
        [engine.Outcome(job_id=job.id, lease_token=job.lease_token, state="completed", return_value_json="1")],
        using="default",
    )
    assert written == {job.id: "cancelled"}
    stored = Job.objects.get(id=result.id)
    assert stored.state == "cancelled" and stored.finished_at is not None and stored.attempts == 1
    # A second write under the same lease matches nothing.
    assert (
        engine.record_outcomes(
            [engine.Outcome(job_id=job.id, lease_token=job.lease_token, state="failed")], using="default"
        )
        == {}
    )


@pytest.mark.django_db(transaction=True)
def test_a_running_job_sees_is_cancelled_within_a_second_and_ends_cancelled(thread_worker, probe):
    result = tasks.until_cancelled.enqueue(probe)
    worker = thread_worker(concurrency=1)
    wait_until(lambda: any(r["event"] == "start" for r in read_records(probe)), timeout=20)
    asked = time.time()
    assert django_jobs.cancel(result.id).status == "RUNNING"
    wait_until(lambda: Job.objects.get(id=result.id).state == "cancelled", timeout=20)
    worker.stop()
    [noticed] = [r for r in read_records(probe) if r["event"] == "noticed"]
    assert noticed["at"] - asked < 1.0, "is_cancelled() turned true within a second"
    assert tasks.until_cancelled.get_result(result.id).status == "FAILED"


@pytest.mark.django_db(transaction=True)
def test_retry_requeues_a_failed_job_with_one_more_attempt(thread_worker):
    result = tasks.always_fails.enqueue("once more")
    thread_worker(concurrency=1, stop_when_empty=True).join()
    assert Job.objects.get(id=result.id).state == "failed"
    requeued = django_jobs.retry(result.id)
    assert requeued.status == "READY"
    job = Job.objects.get(id=result.id)
    assert (job.state, job.attempts, job.max_attempts, job.finished_at) == ("waiting", 2, 3, None)
    thread_worker(concurrency=1, stop_when_empty=True).join()
    job.refresh_from_db()
    assert (job.state, job.attempts, len(job.errors), len(job.worker_ids)) == ("failed", 3, 3, 3)


@pytest.mark.django_db
def test_retry_requeues_a_cancelled_job_and_refuses_other_states():
    result = tasks.noop.enqueue()
    with pytest.raises(JobNotRetryable, match="only failed or cancelled"):
        django_jobs.retry(result.id)
    django_jobs.cancel(result.id)
    assert django_jobs.retry(result.id).status == "READY"
    job = Job.objects.get(id=result.id)
    assert job.state == "waiting" and job.cancel_requested_at is None
    assert job.available_at <= timezone.now()

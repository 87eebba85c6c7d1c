"""Queue control: pause/resume (claims skip paused queues, for every worker), counts, drain,
clean, obliterate. Contract tests on both databases; pause with a real worker thread."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest
from django.utils import timezone

import django_jobs
from django_jobs import flow
from django_jobs.exceptions import InvalidQueueName
from django_jobs.models import Job, JobDependency, QueueState
from django_jobs.queues import QueueBusy
from django_jobs.testing import drain_queue
from tests import factories, tasks
from tests.conftest import wait_until

#: The factory as these tests claim: up to 10 jobs, as worker "w".
claim = partial(factories.claim, limit=10, worker_id="w")


@pytest.mark.django_db
def test_a_paused_queue_keeps_accepting_jobs_but_no_claim_takes_them():
    emails = django_jobs.queue("emails")
    emails.pause()
    assert emails.is_paused
    paused_job = tasks.noop.using(queue_name="emails").enqueue()
    other = tasks.noop.enqueue()
    assert [str(j.id) for j in claim()] == [other.id]
    assert claim(queues=["emails"]) == []
    assert Job.objects.get(id=paused_job.id).state == "waiting"
    emails.resume()
    assert not emails.is_paused
    assert [str(j.id) for j in claim(queues=["emails"])] == [paused_job.id]


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_stops_and_resumes_taking_a_paused_queue(thread_worker):
    q = django_jobs.queue("reports")
    q.pause()
    result = tasks.add.using(queue_name="reports").enqueue(2, 3)
    worker = thread_worker(concurrency=1, queues=["reports", "other"])
    # The worker is running and claiming: a job of its other queue completes...
    proof = tasks.noop.using(queue_name="other").enqueue()
    wait_until(lambda: Job.objects.get(id=proof.id).state == "completed", timeout=10)
    # ...while the paused queue's job, enqueued first, still waits.
    assert Job.objects.get(id=result.id).state == "waiting"
    q.resume()
    wait_until(lambda: Job.objects.get(id=result.id).state == "completed", timeout=10)
    worker.stop()


@pytest.mark.django_db
def test_counts_report_the_unfinished_states():
    q = django_jobs.queue("counted")
    t = tasks.noop.using(queue_name="counted")
    t.enqueue()
    t.enqueue()
    t.using(run_after=timedelta(hours=1)).enqueue()
    claim(limit=1, queues=["counted"])
    flow(t, children=[flow(t)]).enqueue()
    assert q.counts() == {"waiting": 2, "delayed": 1, "active": 1, "waiting-children": 1}


@pytest.mark.django_db
def test_drain_deletes_waiting_and_delayed_jobs_and_releases_flow_parents():
    q = django_jobs.queue("drained")
    t = tasks.noop.using(queue_name="drained")
    t.enqueue()
    t.using(run_after=timedelta(hours=1)).enqueue()
    keep = tasks.noop.enqueue()
    root = flow(tasks.noop, children=[flow(t)]).enqueue()
    assert q.drain() == 3
    assert Job.objects.filter(queue="drained").count() == 0
    assert Job.objects.filter(id=keep.id).exists()
    # The deleted child counted as cancelled: its parent (failure_policy "fail") is not left waiting.
    assert Job.objects.get(id=root.id).state == "failed"
    assert not JobDependency.objects.filter(status="pending").exists()


@pytest.mark.django_db
def test_clean_deletes_old_finished_jobs_of_one_state_up_to_a_limit():
    q = django_jobs.queue("default")
    for _ in range(3):
        tasks.noop.enqueue()
    tasks.always_fails.enqueue()
    drain_queue()
    Job.objects.update(finished_at=timezone.now() - timedelta(days=2))
    assert q.clean("completed", older_than=timedelta(days=1), limit=2) == 2
    assert q.clean("completed", older_than=timedelta(days=3)) == 0
    assert q.clean("completed", older_than=timedelta(days=1)) == 1
    assert Job.objects.filter(state="failed").count() == 1
    with pytest.raises(ValueError, match="state must be one of completed, failed, cancelled"):
        q.clean("waiting", older_than=timedelta(0))
    with pytest.raises(ValueError, match="older_than must be a timedelta"):
        q.clean("failed", older_than=5)


@pytest.mark.django_db
def test_obliterate_refuses_while_jobs_run_unless_forced():
    q = django_jobs.queue("doomed")
    t = tasks.noop.using(queue_name="doomed")
    t.enqueue()
    t.enqueue()
    claim(limit=1, queues=["doomed"])
    q.pause()
    with pytest.raises(QueueBusy, match="has 1 running job"):
        q.obliterate()
    assert Job.objects.filter(queue="doomed").count() == 2
    assert q.obliterate(force=True) == 2
    assert not Job.objects.filter(queue="doomed").exists()
    assert not QueueState.objects.filter(name="doomed").exists()


def test_a_bad_queue_name_is_refused():
    with pytest.raises(InvalidQueueName):
        django_jobs.queue("has space")

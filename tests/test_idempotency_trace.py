"""Idempotency keys and trace ids. Contract tests: they run on SQLite and PostgreSQL; the
concurrent idempotent enqueue uses real processes."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_jobs
from django_jobs import Dedup, engine
from django_jobs.exceptions import InvalidTaskOptions
from django_jobs.models import Job
from django_jobs.states import JobState
from django_jobs.testing import drain_queue, perform_job
from django_jobs.tracing import current_trace_id
from tests import tasks_dedup
from tests.conftest import wait_until
from tests.contract.test_dedup import _results, _start

db = pytest.mark.django_db
committing = pytest.mark.django_db(transaction=True)

HEX32 = re.compile(r"^[0-9a-f]{32}$")


# -- idempotency keys ------------------------------------------------------------------------


@db
def test_a_second_enqueue_with_the_key_returns_the_first_job(django_capture_on_commit_callbacks, enqueued_results):
    task = tasks_dedup.refresh.using(idempotency_key="ORDER-2024-001234")
    with django_capture_on_commit_callbacks(execute=True):
        first = task.enqueue(1)
        second = task.enqueue(2)
    assert not first.duplicate
    assert second.duplicate and second.id == first.id and second.args == [1]
    assert [r.id for r in enqueued_results] == [first.id]
    [job] = Job.objects.all()
    assert job.idempotency_key == "ORDER-2024-001234"


@db
def test_the_key_holds_for_as_long_as_the_job_row_exists_whatever_its_state():
    task = tasks_dedup.refresh.using(idempotency_key="once")
    first = task.enqueue()
    [running] = engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w", lease_seconds=30)
    engine.record_outcomes(
        [engine.Outcome(job_id=running.id, lease_token=running.lease_token, state="completed", return_value_json="0")],
        using="default",
    )
    again = task.enqueue()
    assert again.duplicate and again.id == first.id and again.status == "SUCCESSFUL"
    Job.objects.filter(id=first.id).delete()
    fresh = task.enqueue()
    assert not fresh.duplicate and fresh.id != first.id


@db
def test_the_same_key_in_another_queue_or_backend_is_another_job():
    a = tasks_dedup.refresh.using(idempotency_key="k").enqueue()
    b = tasks_dedup.refresh.using(idempotency_key="k", queue_name="emails").enqueue()
    c = tasks_dedup.refresh.using(idempotency_key="k", backend="limited").enqueue()
    assert len({a.id, b.id, c.id}) == 3 and not (a.duplicate or b.duplicate or c.duplicate)


@db
def test_an_idempotent_enqueue_inside_a_transaction_rolls_back_with_it():
    with transaction.atomic():
        tasks_dedup.refresh.using(idempotency_key="k").enqueue(1)
        transaction.set_rollback(True)
    assert not tasks_dedup.refresh.using(idempotency_key="k").enqueue(2).duplicate


@db
def test_a_delayed_idempotent_job_is_stored_delayed():
    later = timezone.now() + timedelta(hours=1)
    result = tasks_dedup.refresh.using(idempotency_key="k", run_after=later).enqueue()
    assert Job.objects.get(id=result.id).state == JobState.DELAYED


@db
def test_enqueue_many_rejects_an_idempotency_key_and_stores_nothing():
    with pytest.raises(InvalidTaskOptions, match="one idempotency key cannot name many jobs"):
        tasks_dedup.refresh.using(idempotency_key="k").enqueue_many([(1,), (2,)])
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "idempotency_key must not be empty"),
        ("x" * 256, "idempotency_key is 256 characters, over 255"),
        (5, "idempotency_key must be a string"),
        ("a\x00", "idempotency_key contains a NUL character"),
    ],
)
def test_invalid_idempotency_keys_are_rejected(key, message):
    with pytest.raises(InvalidTaskOptions, match=re.escape(message)):
        tasks_dedup.refresh.using(idempotency_key=key)


def test_idempotency_key_and_dedup_together_are_rejected():
    with pytest.raises(InvalidTaskOptions, match=r"cannot have both dedup and idempotency_key.*using\(dedup=False\)"):
        tasks_dedup.nightly_report.using(idempotency_key="k")
    tasks_dedup.nightly_report.using(dedup=False, idempotency_key="k")  # allowed once dedup is off


@db
def test_a_plain_enqueue_keeps_the_insert_without_on_conflict():
    with CaptureQueriesContext(connection) as queries:
        tasks_dedup.refresh.enqueue()
    [insert] = [q["sql"] for q in queries if "INSERT INTO django_jobs_job" in q["sql"]]
    assert "ON CONFLICT" not in insert


@db
def test_the_database_refuses_a_second_job_with_the_key_in_the_queue():
    tasks_dedup.refresh.using(idempotency_key="k").enqueue()
    job = Job.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(
            task_path=job.task_path, available_at=job.available_at, enqueued_at=job.enqueued_at, idempotency_key="k"
        )


@committing
def test_four_processes_enqueueing_one_key_at_once_make_exactly_one_job(tmp_path):
    procs = [_start(tmp_path, i, "idem", "ORDER-1") for i in range(4)]
    wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 4, timeout=60, message="4 processes ready")
    (tmp_path / "go").touch()
    results = _results(tmp_path, procs)
    assert sum(r["errors"] for r in results) == 0, [r["messages"] for r in results]
    assert (sum(r["new"] for r in results), sum(r["duplicate"] for r in results)) == (1, 3)
    [job] = Job.objects.all()
    assert job.idempotency_key == "ORDER-1"


# -- trace ids -----------------------------------------------------------------------------------


@db
def test_every_job_gets_a_new_trace_id_stored_and_returned():
    results = [tasks_dedup.refresh.enqueue() for _ in range(3)]
    assert all(HEX32.match(r.trace_id) for r in results)
    assert len({r.trace_id for r in results}) == 3
    assert {r.trace_id for r in results} == set(Job.objects.values_list("trace_id", flat=True))
    assert tasks_dedup.refresh.get_result(results[0].id).trace_id == results[0].trace_id


@db
def test_an_explicit_trace_id_wins():
    result = tasks_dedup.refresh.using(trace_id="req-42:web.1").enqueue()
    assert result.trace_id == "req-42:web.1" == Job.objects.get().trace_id
    assert perform_job(tasks_dedup.enqueue_with_trace, "other-trace").return_value == "other-trace"


@db
def test_jobs_enqueued_by_a_running_job_inherit_its_trace_id():
    root = tasks_dedup.pipeline_step.using(trace_id="pipeline-1").enqueue(2)
    assert drain_queue().completed == 3
    values = [r.return_value for r in django_jobs.trace("pipeline-1")]
    assert [v["trace_id"] for v in values] == ["pipeline-1"] * 3
    assert [v["child_trace_id"] for v in values] == ["pipeline-1", "pipeline-1", None]
    assert root.id == django_jobs.trace("pipeline-1")[0].id
    assert current_trace_id() is None  # reset after each job


@db
def test_an_async_task_passes_its_trace_id_to_the_jobs_it_enqueues():
    result = perform_job(tasks_dedup.async_step)
    assert result.return_value == {"trace_id": result.trace_id, "child_trace_id": result.trace_id}


@committing
def test_a_worker_runs_a_pipeline_under_one_trace_id(thread_worker):
    root = tasks_dedup.pipeline_step.enqueue(3)
    w = thread_worker(concurrency=2)
    wait_until(lambda: Job.objects.filter(state=JobState.COMPLETED).count() == 4, timeout=20)
    w.stop()
    pipeline = django_jobs.trace(root.trace_id)
    assert [r.id for r in pipeline][0] == root.id and len(pipeline) == 4
    assert [r.return_value["trace_id"] for r in pipeline] == [root.trace_id] * 4
    # Each step's child is the next job of the pipeline: enqueue order.
    assert [r.return_value["child_id"] for r in pipeline[:-1]] == [r.id for r in pipeline[1:]]


@db
def test_the_claim_returns_the_trace_id():
    result = tasks_dedup.refresh.using(trace_id="t-1").enqueue()
    [claimed] = engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w", lease_seconds=30)
    assert (str(claimed.id), claimed.trace_id) == (result.id, "t-1")


@db
def test_enqueue_many_jobs_share_one_trace_id():
    results = tasks_dedup.refresh.enqueue_many([(1,), (2,), (3,)])
    assert len({r.trace_id for r in results}) == 1 and HEX32.match(results[0].trace_id)
    assert set(Job.objects.values_list("trace_id", flat=True)) == {results[0].trace_id}
    assert [r.id for r in django_jobs.trace(results[0].trace_id)] == [r.id for r in results]
    given = tasks_dedup.refresh.using(trace_id="batch-7").enqueue_many([(4,)])
    assert given[0].trace_id == "batch-7"


@db
def test_a_duplicate_carries_the_holders_trace_id():
    first = tasks_dedup.refresh.using(dedup=Dedup("k"), trace_id="first").enqueue()
    second = tasks_dedup.refresh.using(dedup=Dedup("k"), trace_id="second").enqueue()
    assert second.duplicate and second.trace_id == first.trace_id == "first"


@db
def test_trace_lists_only_that_backends_jobs_in_enqueue_order():
    a = tasks_dedup.refresh.using(trace_id="t").enqueue(1)
    tasks_dedup.refresh.using(trace_id="t", backend="limited").enqueue(2)
    b = tasks_dedup.other_refresh.using(trace_id="t").enqueue(3)
    tasks_dedup.refresh.using(trace_id="other").enqueue(4)
    assert [r.id for r in django_jobs.trace("t")] == [a.id, b.id]
    assert [r.args for r in django_jobs.trace("t", backend="limited")] == [[2]]
    assert django_jobs.trace("nothing-here") == []


@pytest.mark.parametrize("bad", ["", "x" * 65, "a b", "é", "a/b", 5, uuid.UUID(int=1)])
def test_invalid_trace_ids_are_rejected(bad):
    with pytest.raises(InvalidTaskOptions, match="trace_id must be 1-64 characters of letters, digits"):
        tasks_dedup.refresh.using(trace_id=bad)
    with pytest.raises(ValueError, match="trace_id must be 1-64 characters"):
        django_jobs.trace(bad)


def test_a_trace_id_of_64_allowed_characters_is_accepted():
    tasks_dedup.refresh.using(trace_id="A-z_0.9:" * 8)

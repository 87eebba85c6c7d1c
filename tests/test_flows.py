"""Flows: parent/child trees enqueued atomically, parents released exactly once, failure
policies, cancelling, attaching, invalid trees. Contract tests on both databases; the
concurrency cases use real worker processes."""

from __future__ import annotations

import os
import signal
import uuid

import pytest
from django.db import transaction

import django_jobs
from django_jobs import engine, flow
from django_jobs.exceptions import InvalidFlow, InvalidTaskArguments
from django_jobs.flows import MAX_DEPTH
from django_jobs.models import Job, JobDependency
from django_jobs.testing import drain_queue
from tests import tasks, tasks_flows
from tests.conftest import wait_until
from tests.factories import claim_job, records_of, state_of
from tests.tasks import read_records

SHORT_LEASE = {"JOBS_TEST_LEASE": "2"}


# -- shape and order -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_flow_is_stored_atomically_and_the_parent_waits_for_its_children(probe):
    root = flow(
        tasks_flows.gather,
        args=(probe, "root"),
        children=[
            flow(tasks_flows.leaf.using(queue_name="a"), args=(probe, "a")),
            flow(tasks_flows.leaf.using(queue_name="b"), args=(probe, "b"), kwargs={"value": [1, 2]}),
        ],
    ).enqueue()
    parent = Job.objects.get(id=root.id)
    assert (parent.state, parent.pending_children) == ("waiting-children", 2)
    assert root.status == "READY"
    children = Job.objects.filter(parent_id=root.id).order_by("queue")
    assert [(c.queue, c.state) for c in children] == [("a", "waiting"), ("b", "waiting")]
    assert JobDependency.objects.filter(parent_id=root.id, status="pending").count() == 2

    drain_queue()
    parent.refresh_from_db()
    assert parent.state == "completed"
    ids = {c.queue: str(c.id) for c in children}
    assert parent.return_value == {"results": {ids["a"]: "a", ids["b"]: [1, 2]}, "failures": []}
    # The parent ran after both children.
    assert [e["event"] for e in read_records(probe)] == ["leaf", "leaf", "parent"]


@pytest.mark.django_db
def test_nested_flows_run_from_the_leaves_up(probe):
    root = flow(
        tasks_flows.gather,
        args=(probe, "root"),
        children=[
            flow(
                tasks_flows.gather,
                args=(probe, "middle"),
                children=[flow(tasks_flows.leaf, args=(probe, "leaf"))],
            )
        ],
    ).enqueue()
    assert Job.objects.filter(state="waiting-children").count() == 2
    drain_queue()
    assert state_of(root) == "completed"
    assert [(e["event"], e["name"]) for e in read_records(probe)] == [
        ("leaf", "leaf"),
        ("parent", "middle"),
        ("parent", "root"),
    ]


@pytest.mark.django_db
def test_a_child_finishing_twice_is_counted_once():
    root = flow(tasks.noop, children=[flow(tasks.noop), flow(tasks.noop)]).enqueue()
    first = Job.objects.filter(parent_id=root.id).first()
    for _ in range(2):
        with transaction.atomic():
            engine.settle_dependencies(using="default", finished=[(first.id, "completed", "null")])
    parent = Job.objects.get(id=root.id)
    assert (parent.state, parent.pending_children) == ("waiting-children", 1)


@pytest.mark.django_db(transaction=True)
def test_enqueue_inside_a_rolled_back_transaction_leaves_nothing(probe):
    with pytest.raises(RuntimeError), transaction.atomic():
        flow(tasks_flows.gather, args=(probe, "r"), children=[flow(tasks.noop)]).enqueue()
        raise RuntimeError("roll back")
    assert Job.objects.count() == 0 and JobDependency.objects.count() == 0


# -- failure policies ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_fail_policy_fails_the_parent_naming_the_child(probe):
    root = flow(
        tasks_flows.gather,
        args=(probe, "root"),
        children=[flow(tasks_flows.breaks, args=(probe, "x")), flow(tasks_flows.leaf, args=(probe, "ok"))],
    ).enqueue()
    drain_queue()
    parent = Job.objects.get(id=root.id)
    child = Job.objects.get(parent_id=root.id, task_path="tests.tasks_flows.breaks")
    assert parent.state == "failed" and parent.finished_at is not None
    [error] = parent.errors
    assert error["exception_class_path"] == "django_jobs.exceptions.ChildFailed"
    assert error["child_id"] == str(child.id)
    assert "x broke" in error["traceback"]
    assert records_of(probe, "parent") == []


@pytest.mark.django_db
def test_ignore_policy_runs_the_parent_which_sees_the_failure(probe):
    root = flow(
        tasks_flows.gather,
        args=(probe, "root"),
        children=[
            flow(tasks_flows.breaks, args=(probe, "x"), failure_policy="ignore"),
            flow(tasks_flows.leaf, args=(probe, "ok")),
        ],
    ).enqueue()
    drain_queue()
    assert state_of(root) == "completed"
    broken = str(Job.objects.get(parent_id=root.id, task_path="tests.tasks_flows.breaks").id)
    [parent_run] = records_of(probe, "parent")
    assert parent_run["failures"] == [broken]
    assert list(parent_run["results"].values()) == ["ok"]


@pytest.mark.django_db
def test_remove_policy_drops_the_dependency(probe):
    root = flow(
        tasks_flows.gather,
        args=(probe, "root"),
        children=[flow(tasks_flows.breaks, args=(probe, "x"), failure_policy="remove")],
    ).enqueue()
    drain_queue()
    assert state_of(root) == "completed"
    [parent_run] = records_of(probe, "parent")
    assert parent_run["failures"] == [] and parent_run["results"] == {}
    assert JobDependency.objects.get(parent_id=root.id).status == "removed"


@pytest.mark.django_db
def test_continue_policy_starts_the_parent_at_once(probe):
    root = flow(
        tasks_flows.gather,
        args=(probe, "root"),
        children=[
            flow(tasks_flows.breaks.using(queue_name="first"), args=(probe, "x"), failure_policy="continue"),
            flow(tasks_flows.leaf.using(queue_name="later"), args=(probe, "later")),
        ],
    ).enqueue()
    drain_queue("first")
    assert state_of(root) == "waiting", "released by the failure, before its other child ran"
    drain_queue("default")
    [parent_run] = records_of(probe, "parent")
    assert len(parent_run["failures"]) == 1 and parent_run["results"] == {}
    drain_queue("later")  # the other child still runs; the parent is not released again
    assert len(records_of(probe, "parent")) == 1


@pytest.mark.django_db
def test_a_failed_parent_fails_its_own_parent_in_turn():
    root = flow(
        tasks.noop,
        children=[flow(tasks.noop, children=[flow(tasks.always_fails)])],
    ).enqueue()
    drain_queue()
    middle = Job.objects.get(parent_id=root.id)
    assert middle.state == "failed" and state_of(root) == "failed"
    assert Job.objects.get(id=root.id).errors[0]["child_id"] == str(middle.id)


@pytest.mark.django_db
def test_a_child_that_is_retried_does_not_release_or_fail_its_parent_until_it_ends():
    root = flow(tasks.noop, children=[flow(tasks.always_fails.using(max_attempts=3, backoff=3600))]).enqueue()
    drain_queue(with_retries=False)
    assert state_of(root) == "waiting-children"
    drain_queue()
    assert state_of(root) == "failed"


# -- cancel --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancelling_a_parent_cancels_its_unfinished_children_all_the_way_down():
    root = flow(
        tasks.noop,
        children=[flow(tasks.noop, children=[flow(tasks.noop)]), flow(tasks.add, args=(1, 2))],
    ).enqueue()
    done = Job.objects.get(parent_id=root.id, task_path="tests.tasks.add")
    drain_queue_only(done.id)
    django_jobs.cancel(root.id)
    cancelled = set(Job.objects.filter(state="cancelled").values_list("id", flat=True))
    middle = Job.objects.get(parent_id=root.id, task_path="tests.tasks.noop")
    grandchild = Job.objects.get(parent_id=middle.id)
    assert cancelled == {uuid.UUID(root.id), middle.id, grandchild.id}
    assert Job.objects.get(id=done.id).state == "completed"


def drain_queue_only(job_id):
    job = claim_job(job_id, worker_id="t")
    from django_jobs.testing import _run

    _run(job, "default", __import__("django_jobs.testing", fromlist=["DrainResult"]).DrainResult())


@pytest.mark.django_db
def test_cancelling_a_child_applies_its_failure_policy():
    root = flow(tasks.noop, children=[flow(tasks.noop, failure_policy="ignore"), flow(tasks.noop)]).enqueue()
    ignored = Job.objects.filter(parent_id=root.id).order_by("id").first()
    django_jobs.cancel(ignored.id)
    assert JobDependency.objects.get(child_id=ignored.id).status == "ignored"
    assert Job.objects.get(id=root.id).pending_children == 1
    drain_queue()
    assert state_of(root) == "completed"


# -- attach --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_child_can_be_attached_to_a_parent_still_waiting_for_children(probe):
    root = flow(tasks_flows.gather, args=(probe, "root"), children=[flow(tasks.noop)]).enqueue()
    extra = flow(tasks_flows.leaf, args=(probe, "late")).enqueue(parent=root)
    assert Job.objects.get(id=root.id).pending_children == 2
    assert Job.objects.get(id=extra.id).parent_id == uuid.UUID(root.id)
    drain_queue()
    [parent_run] = records_of(probe, "parent")
    assert parent_run["results"][extra.id] == "late"


@pytest.mark.django_db
def test_attaching_to_a_missing_or_finished_parent_is_refused_and_inserts_nothing():
    done = tasks.noop.enqueue()
    drain_queue()
    before = Job.objects.count()
    with pytest.raises(InvalidFlow, match="is completed, no longer waiting for children"):
        flow(tasks.noop).enqueue(parent=done.id)
    with pytest.raises(InvalidFlow, match="No job"):
        flow(tasks.noop).enqueue(parent=str(uuid.uuid4()))
    with pytest.raises(InvalidFlow, match="parent must be a job's result or result id"):
        flow(tasks.noop).enqueue(parent="nope")
    assert Job.objects.count() == before


# -- invalid trees -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_invalid_trees_raise_a_clear_error_and_insert_nothing():
    shared = flow(tasks.noop)
    with pytest.raises(InvalidFlow, match="already appears in this tree"):
        flow(tasks.noop, children=[shared, shared]).enqueue()

    parent = flow(tasks.noop, children=[flow(tasks.noop)])
    child = parent.children[0]
    object.__setattr__(child, "children", (parent,))  # a cycle, which frozen nodes otherwise prevent
    with pytest.raises(InvalidFlow, match="cycle"):
        parent.enqueue()

    deep = flow(tasks.noop)
    for _ in range(MAX_DEPTH):
        deep = flow(tasks.noop, children=[deep])
    with pytest.raises(InvalidFlow, match=f"deeper than {MAX_DEPTH} levels"):
        deep.enqueue()

    with pytest.raises(InvalidTaskArguments, match=r"child 0\.1 \(tests\.tasks\.echo\): args\[0\] is a set"):
        flow(
            tasks.noop, children=[flow(tasks.noop, children=[flow(tasks.noop), flow(tasks.echo, args=({1},))])]
        ).enqueue()

    with pytest.raises(InvalidFlow, match="all its tasks must use the same backend"):
        flow(tasks.noop, children=[flow(tasks.noop.using(backend="limited"))]).enqueue()

    with pytest.raises(InvalidFlow, match=r"has dedup; jobs of a flow are not deduplicated.*dedup=False"):
        flow(tasks.noop, children=[flow(tasks.noop.using(dedup=django_jobs.Dedup("k")))]).enqueue()
    with pytest.raises(InvalidFlow, match="has idempotency_key"):
        flow(tasks.noop.using(idempotency_key="order-1")).enqueue()
    with pytest.raises(InvalidFlow, match="failure_policy must be one of fail, ignore, remove, continue"):
        flow(tasks.noop, failure_policy="explode")
    with pytest.raises(InvalidFlow, match="each child must be made with flow"):
        flow(tasks.noop, children=[tasks.noop])
    with pytest.raises(InvalidFlow, match="takes a @task function"):
        flow(print)
    assert Job.objects.count() == 0 and JobDependency.objects.count() == 0


# -- concurrency, real worker processes ----------------------------------------------------------


def _wide_flow(probe: str, n: int):
    return flow(
        tasks_flows.gather,
        args=(probe, "root"),
        children=[flow(tasks_flows.leaf.using(queue_name="kids"), args=(probe, f"c{i}")) for i in range(n)],
    ).enqueue()


@pytest.mark.django_db(transaction=True)
def test_a_parent_of_200_children_finishing_together_on_3_workers_is_released_exactly_once(worker_process, probe):
    root = _wide_flow(probe, 200)
    workers = [worker_process("-c", "4", "--queue", "kids,default") for _ in range(3)]
    wait_until(lambda: state_of(root) == "completed", timeout=120, message="the parent to complete")
    for w in workers:
        os.killpg(w.pid, signal.SIGTERM)
        w.wait(30)
    parents = records_of(probe, "parent")
    assert len(parents) == 1, "the parent ran exactly once"
    assert len(parents[0]["results"]) == 200
    assert len(records_of(probe, "leaf")) == 200
    assert Job.objects.filter(state="completed").count() == 201


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_flow_still_releases_the_parent_exactly_once(worker_process, probe):
    root = flow(
        tasks_flows.gather,
        args=(probe, "root"),
        children=[flow(tasks_flows.slow_leaf.using(queue_name="kids"), args=(probe, f"c{i}", 0.2)) for i in range(200)],
    ).enqueue()
    doomed = worker_process("-c", "4", "--queue", "kids,default", env=SHORT_LEASE)
    others = [worker_process("-c", "4", "--queue", "kids,default", env=SHORT_LEASE) for _ in range(2)]
    wait_until(lambda: len(records_of(probe, "start")) >= 40, timeout=60, message="the flow to be under way")
    # Killed while it runs children (on a loaded machine it may start after the others took the
    # first 40): worker ids are "<host>-<pid>-<random>".
    wait_until(
        lambda: Job.objects.filter(state="active", worker_id__contains=f"-{doomed.pid}-").exists(),
        timeout=60,
        message="the doomed worker to run children",
    )
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(10)
    wait_until(lambda: state_of(root) == "completed", timeout=120, message="the parent to complete")
    for w in others:
        os.killpg(w.pid, signal.SIGTERM)
        w.wait(30)
    parents = records_of(probe, "parent")
    assert len(parents) == 1, "the parent ran exactly once"
    assert len(parents[0]["results"]) == 200, "no child lost"
    assert Job.objects.filter(state="completed").count() == 201
    # The kill interrupted children mid-run; they were rescued and ran again elsewhere.
    assert Job.objects.filter(stalled_count__gte=1).exists()


@pytest.mark.django_db
def test_the_admin_shows_a_parents_children(admin_client):
    root = flow(tasks.noop, children=[flow(tasks.noop.using(queue_name="kids"))]).enqueue()
    child = Job.objects.get(parent_id=root.id)
    page = admin_client.get(f"/admin/django_jobs/job/{root.id}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "children (flow)" in body.lower() and str(child.id) in body


# -- review fixes --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_parent_with_a_run_after_ahead_is_released_to_delayed():
    from datetime import timedelta

    root = flow(tasks.noop.using(run_after=timedelta(hours=1)), children=[flow(tasks.noop)]).enqueue()
    drain_queue()
    parent = Job.objects.get(id=root.id)
    assert parent.state == "delayed" and parent.pending_children == 0
    assert parent.available_at > parent.enqueued_at + timedelta(minutes=59)


@pytest.mark.django_db
def test_an_outcome_built_without_has_parent_still_moves_the_parent_on():
    root = flow(tasks.noop, children=[flow(tasks.noop)]).enqueue()
    [job] = engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w", lease_seconds=30)
    outcome = engine.Outcome(job_id=job.id, lease_token=job.lease_token, state="completed", return_value_json="7")
    engine.record_outcomes([outcome], using="default")
    assert state_of(root) == "waiting"


@pytest.mark.django_db
def test_retrying_a_parent_with_unfinished_children_is_refused():
    from django_jobs.api import JobNotRetryable

    root = flow(tasks.noop, children=[flow(tasks.always_fails), flow(tasks.noop.using(queue_name="later"))]).enqueue()
    drain_queue("default")
    assert state_of(root) == "failed"
    with pytest.raises(JobNotRetryable, match="still has 1 unfinished flow child"):
        django_jobs.retry(root.id)
    drain_queue("later")
    assert django_jobs.retry(root.id).status == "READY"


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_parent_sends_job_cancelled_for_every_job_cancelled_with_it():
    from django_jobs.signals import job_cancelled

    seen = []

    def receiver(sender, job_id, was_running, **kwargs):
        seen.append((job_id, was_running))

    root = flow(tasks.noop, children=[flow(tasks.noop), flow(tasks.noop, children=[flow(tasks.noop)])]).enqueue()
    job_cancelled.connect(receiver)
    try:
        django_jobs.cancel(root.id)
    finally:
        job_cancelled.disconnect(receiver)
    assert len(seen) == 4 and {w for _, w in seen} == {False}
    assert set(Job.objects.values_list("state", flat=True)) == {"cancelled"}
    # Their dependency rows are settled, so a retry of the root is possible.
    assert not JobDependency.objects.filter(status="pending").exists()


@pytest.mark.django_db
def test_more_bad_flow_input_is_refused_clearly():
    with pytest.raises(InvalidFlow, match="args must be a list or tuple"):
        flow(tasks.noop, args=5)
    with pytest.raises(InvalidFlow, match="args must be a list or tuple"):
        flow(tasks.noop, args={1, 2})
    with pytest.raises(InvalidFlow, match="children must be a list or tuple"):
        flow(tasks.noop, children=None)
    waiting = flow(tasks.noop.using(backend="limited"), children=[flow(tasks.noop.using(backend="limited"))]).enqueue()
    with pytest.raises(InvalidFlow, match="belongs to backend 'limited'"):
        flow(tasks.noop).enqueue(parent=waiting)

"""Partitions (``task.using(partition=...)``): the jobs of one (queue, partition) run one at a
time and in enqueue order, on any worker, while other partitions and unpartitioned jobs run in
parallel.

Engine contract tests on SQLite and PostgreSQL drive claims directly with ``now`` as a parameter;
the gated path (partition concurrency and rate limits) goes through ``claim_gated_jobs``; the
real-process tests run three ``manage.py runworker`` processes and check, from the times the
tasks record on the machine's monotonic clock, that no partition ever ran two jobs at once or
out of order, and that nothing was lost or run twice (also with one worker SIGKILLed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from functools import partial

import pytest
from django.db import connection, transaction
from django.tasks import task
from django.utils import timezone

import django_jobs
from django_jobs import Dedup, engine, flow
from django_jobs.exceptions import InvalidFlow, InvalidTaskOptions
from django_jobs.models import Job, JobDependency
from django_jobs.models.dedup import JobDedupNext
from django_jobs.testing import drain_queue, perform_job
from tests import factories, tasks, tasks_partitions
from tests.conftest import read_log, wait_until
from tests.factories import claim_gated, insert_job, state_of
from tests.tasks import read_records

db = pytest.mark.django_db
committing = pytest.mark.django_db(transaction=True)

T0 = timezone.now().replace(microsecond=250_000) - timedelta(days=1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def make_job(partition: str | None, **fields) -> Job:
    return insert_job(partition=partition, **{"now": T0, **fields})


#: The factories on this module's clock: at ``T0`` unless ``now`` says otherwise.
claim = partial(factories.claim, now=T0)
finish = partial(factories.finish, now=T0)


def ids(claimed: list[engine.ClaimedJob]) -> set[uuid.UUID]:
    return {c.id for c in claimed}


def sweep() -> int:
    """One run of the leader's partition sweeper (PartitionSweeper.run_once): frees the next job
    of a partition that a cancel, a delete or a race left without a claimable one."""
    return engine.unblock_partitions(using="default", limit=100)


ERROR = {"exception_class_path": "builtins.RuntimeError", "traceback": "RuntimeError: boom\n"}


# -- claim order: one job of a partition at a time, in enqueue order ------------------------------


@db
def test_only_the_head_of_each_partition_is_claimable_beside_other_partitions_and_unpartitioned_jobs():
    p = [make_job("p") for _ in range(3)]
    q = [make_job("q") for _ in range(2)]
    free = [make_job(None) for _ in range(2)]
    assert [j.partition_key for j in p] == ["p", "p", "p"]

    claimed = claim()
    assert ids(claimed) == {p[0].id, q[0].id, free[0].id, free[1].id}
    assert all(c.partition_key == {p[0].id: "p", q[0].id: "q"}.get(c.id) for c in claimed)
    assert claim() == []  # p[1] and q[1] wait for their heads, which run
    assert [state_of(j.id) for j in (p[1], p[2], q[1])] == ["waiting"] * 3


@db
def test_the_next_job_of_a_partition_is_claimable_only_once_the_head_completed():
    p = [make_job("p") for _ in range(4)]
    for i, job in enumerate(p):
        [head] = claim(now=at(i))
        assert head.id == job.id, f"job {i} of the partition should be its head"
        assert claim(now=at(i)) == []  # still running: nothing else of the partition starts
        finish(head, now=at(i))
    assert claim(now=at(10)) == []
    assert [state_of(j.id) for j in p] == ["completed"] * 4


@db
def test_a_head_retried_later_stays_delayed_and_keeps_blocking_its_partition():
    first = make_job("p", max_attempts=2)
    second = make_job("p")
    other = make_job("q")
    [head, q_head] = sorted(claim(), key=lambda c: c.partition_key)
    assert (head.id, q_head.id) == (first.id, other.id)

    finish(head, "delayed", error=ERROR, available_at=at(60))
    assert state_of(first.id) == "delayed"
    finish(q_head)
    assert claim(now=at(30)) == []  # the failed head waits for its backoff; its partition with it

    assert engine.promote_due_jobs(using="default", limit=10, now=at(61)) == 1
    [again] = claim(now=at(61))
    assert (again.id, again.attempts) == (first.id, 2)
    assert claim(now=at(61)) == []
    finish(again, now=at(62))
    assert [c.id for c in claim(now=at(62))] == [second.id]


@db
def test_a_head_retried_at_once_runs_again_before_the_next_job():
    first = make_job("p", max_attempts=3)
    second = make_job("p")
    [head] = claim()
    finish(head, "waiting", error=ERROR, available_at=at(1))
    # Retried at once, its seq is now later than the second job's, but the partition is in id order.
    [again] = claim(now=at(1))
    assert (again.id, again.attempts) == (first.id, 2)
    finish(again, now=at(2))
    assert [c.id for c in claim(now=at(2))] == [second.id]


@db
def test_a_head_that_failed_for_good_unblocks_its_partition():
    first, second = make_job("p", max_attempts=1), make_job("p")
    [head] = claim()
    finish(head, "failed", error=ERROR)
    assert state_of(first.id) == "failed"
    assert [c.id for c in claim()] == [second.id]


@db
def test_a_cancelled_waiting_head_unblocks_its_partition():
    first, second = make_job("p"), make_job("p")
    django_jobs.cancel(str(first.id))
    assert state_of(first.id) == "cancelled"
    sweep()  # a cancel frees the next job through the sweeper
    assert [c.id for c in claim()] == [second.id]


@db
def test_a_running_head_that_is_cancelled_blocks_until_its_attempt_ends():
    first, second = make_job("p"), make_job("p")
    [head] = claim()
    django_jobs.cancel(str(first.id))
    assert state_of(first.id) == "active"  # flagged; the attempt still runs
    assert claim() == []
    finish(head)  # whatever the attempt returns, it ends cancelled
    assert state_of(first.id) == "cancelled"
    assert [c.id for c in claim()] == [second.id]


@db
def test_a_scheduled_head_blocks_its_partition_until_it_ran_or_was_cancelled():
    scheduled = make_job("p", run_after=at(3600))
    after = make_job("p")
    assert state_of(scheduled.id) == "delayed"
    assert claim(now=at(1)) == []
    django_jobs.cancel(str(scheduled.id))
    sweep()
    assert [c.id for c in claim(now=at(1))] == [after.id]


@db
def test_a_later_job_with_a_higher_priority_still_waits_for_the_partitions_head():
    low = make_job("p", priority=0)
    high = make_job("p", priority=50)
    [head] = claim()
    assert head.id == low.id
    finish(head)
    assert [c.id for c in claim()] == [high.id]


@db
def test_a_stalled_head_goes_back_first_then_failed_for_good_frees_its_partition():
    first, second = make_job("p", max_attempts=3), make_job("p")
    [head] = claim(now=at(0))  # its lease expires at 30
    assert head.id == first.id
    [back] = engine.rescue_stalled_jobs(using="default", max_stalled=1, limit=10, now=at(31))
    assert (back.id, state_of(first.id)) == (first.id, "waiting")
    sweep()
    [again] = claim(now=at(32))  # still the earliest: it runs before the next job
    assert again.id == first.id
    assert claim(now=at(32)) == []
    [failed] = engine.rescue_stalled_jobs(using="default", max_stalled=1, limit=10, now=at(100))
    assert (failed.id, state_of(first.id)) == (first.id, "failed")
    sweep()
    assert [c.id for c in claim(now=at(101))] == [second.id]


@db
def test_a_deleted_head_frees_its_partition():
    first, second = make_job("p"), make_job("p")
    assert engine.delete_jobs(using="default", job_ids=[first.id]) == 1
    sweep()
    assert [c.id for c in claim()] == [second.id]


@db
def test_lifo_jobs_of_a_partition_still_run_in_enqueue_order(probe):
    for key in range(3):
        tasks.lifo_mark.using(partition="p").enqueue(probe, key)
    tasks.lifo_mark.enqueue(probe, "free")  # without a partition, LIFO as usual
    assert drain_queue().completed == 4
    assert [r["key"] for r in read_records(probe)] == ["free", 0, 1, 2]


@db
def test_partitions_are_per_queue():
    a1, a2 = make_job("p", queue="a"), make_job("p", queue="a")
    b1, b2 = make_job("p", queue="b"), make_job("p", queue="b")
    claimed = {c.queue: c for c in claim()}
    assert {q: c.id for q, c in claimed.items()} == {"a": a1.id, "b": b1.id}
    finish(claimed["a"])
    assert [c.id for c in claim()] == [a2.id]  # queue b's partition p still runs b1
    finish(claimed["b"])
    assert [c.id for c in claim(queues=["b"])] == [b2.id]


@db
def test_a_failed_job_retried_goes_back_to_its_place_after_the_job_running_now():
    """django_jobs.retry() keeps the job's id: it runs before the later jobs still waiting, but
    never beside the one running now."""
    failed, running_next, _later = make_job("p"), make_job("p"), make_job("p")
    [head] = claim()
    finish(head, "failed", error=ERROR)
    [nxt] = claim()
    assert nxt.id == running_next.id
    django_jobs.retry(str(failed.id))
    assert state_of(failed.id) == "waiting"
    assert claim() == []  # the partition runs `running_next`
    finish(nxt)
    assert [c.id for c in claim()] == [failed.id]  # not `waiting`, which is later


@db
def test_a_failed_job_retried_while_its_successor_waits_runs_before_it():
    failed, _successor = make_job("p"), make_job("p")
    [head] = claim()
    finish(head, "failed", error=ERROR)  # `successor` is the partition's next now
    django_jobs.retry(str(failed.id))
    assert [c.id for c in claim()] == [failed.id]
    assert claim() == []


@db
def test_a_cancelled_job_retried_behind_a_waiting_successor_runs_first_and_does_not_stall_the_partition():
    """A job cancelled while it waited behind the head, re-queued with django_jobs.retry() once the
    partition moved on: it is the earliest again, so it runs first, then the rest follow."""
    head, middle, last = make_job("p"), make_job("p"), make_job("p")
    [running] = claim()
    django_jobs.cancel(str(middle.id))
    finish(running)  # the partition's next is now `last`
    django_jobs.retry(str(middle.id))
    assert state_of(middle.id) == "waiting"
    order = []
    for _ in range(4):
        sweep()  # the leader's sweeper runs every PROMOTE_INTERVAL
        for c in claim():
            order.append(c.id)
            finish(c)
    assert order == [middle.id, last.id], "the partition stalled (or ran out of order)"
    assert state_of(head.id) == "completed"


@contextlib.contextmanager
def enqueued_in_an_open_transaction(partition: str):
    """A job of ``partition`` inserted by another connection whose transaction stays open for the
    block and commits at its end; yields a dict holding that job under "job"."""
    inserted, release, failed = threading.Event(), threading.Event(), []
    early: dict[str, Job] = {}

    def enqueue_in_a_long_transaction():
        try:
            with transaction.atomic():
                early["job"] = make_job(partition)
                inserted.set()
                assert release.wait(20)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failed.append(exc)
            inserted.set()
        finally:
            connection.close()

    thread = threading.Thread(target=enqueue_in_a_long_transaction)
    thread.start()
    try:
        assert inserted.wait(20) and not failed
        yield early
    finally:
        release.set()
        thread.join(20)
    assert not failed, failed


@pytest.mark.needs("ROW_LOCKS")
@committing
def test_a_job_committed_late_with_an_earlier_id_does_not_run_beside_the_active_one():
    """Out-of-order commit: job A gets the smaller id but its transaction commits after job B was
    inserted and claimed. A must wait while B runs (the "none is running" half of the rule)."""
    with enqueued_in_an_open_transaction("p") as early:
        late = make_job("p")
        assert early["job"].id < late.id
        [running] = claim()  # A is not committed yet: B is the head this snapshot sees
        assert running.id == late.id
    assert state_of(early["job"].id) == "waiting"
    assert claim() == [], "the late-committed job must not run while its partition runs a job"
    finish(running)
    assert [c.id for c in claim()] == [early["job"].id]


@pytest.mark.needs("ROW_LOCKS")
@committing
def test_an_enqueue_committing_while_its_partitions_head_finishes_does_not_stall_the_partition():
    """The race the sweeper is for: job A's transaction is open while the head finishes and a
    later job B becomes the partition's next. Once A commits, A runs (it is earlier), then B."""
    first = make_job("p")
    [running] = claim()
    with enqueued_in_an_open_transaction("p") as early:
        late = make_job("p")
        finish(running)  # A is not committed yet: B is the next job this moment sees
    assert first.id < early["job"].id < late.id
    order = []
    for _ in range(4):
        sweep()
        for c in claim():
            order.append(c.id)
            finish(c)
    assert order == [early["job"].id, late.id], "the partition stalled (or ran out of order)"


# -- validation -------------------------------------------------------------------------------------


BAD_PARTITIONS = {
    "empty": "",
    "too-long": "x" * 256,
    "int": 5,
    "bytes": b"customer-1",
    "list": ["customer-1"],
    "nul": "customer\x00-1",
}


@db
@pytest.mark.parametrize("bad", BAD_PARTITIONS.values(), ids=BAD_PARTITIONS.keys())
def test_an_invalid_partition_is_refused_and_nothing_is_enqueued(bad):
    with pytest.raises(InvalidTaskOptions, match="partition must be a string of 1-255 characters without NUL"):
        tasks.noop.using(partition=bad).enqueue()
    with pytest.raises(InvalidTaskOptions, match="partition must be a string"):
        task(partition=bad)(tasks_partitions.seq_mark.func)
    assert not Job.objects.exists()


@db
@pytest.mark.parametrize("good", ["x" * 255, "é" * 255, "customer 456/ü:1"])
def test_a_partition_of_up_to_255_characters_is_stored_as_given(good):
    result = tasks.noop.using(partition=good).enqueue()
    assert Job.objects.get(id=result.id).partition_key == good
    assert perform_job(tasks_partitions.context_partition.using(partition=good)).return_value["partition"] == good


# -- gated path: partition concurrency and partition rate limits ------------------------------------


@db
def test_partition_concurrency_two_runs_at_most_two_of_a_partition_among_its_first_two():
    django_jobs.queue("pc").set_partition_concurrency(2)
    p = [make_job("p", queue="pc", max_attempts=2) for _ in range(5)]
    q = make_job("q", queue="pc")
    free = make_job(None, queue="pc")
    assert engine.gated_queues(using="default", queues=None) == ["pc"]
    assert claim() == [], "the fast claim skips a queue whose partitions run more than one at a time"

    claimed, wake = claim_gated("pc", now=at(0))
    assert ids(claimed) == {p[0].id, p[1].id, q.id, free.id}
    assert wake is None
    assert claim_gated("pc", now=at(0))[0] == []  # two of p run

    by_id = {c.id: c for c in claimed}
    finish(by_id[p[1].id], now=at(1))  # the second finishes first: order is not kept above 1
    [third] = claim_gated("pc", now=at(1))[0]
    assert third.id == p[2].id
    finish(by_id[p[0].id], "delayed", error=ERROR, available_at=at(600), now=at(2))
    # Unfinished in order: p0 (delayed), p2 (running), p3, p4: p3 is not among the first two.
    assert claim_gated("pc", now=at(2))[0] == []
    finish(third, now=at(3))
    [fourth] = claim_gated("pc", now=at(3))[0]
    assert fourth.id == p[3].id
    assert claim_gated("pc", now=at(3))[0] == []  # p0 and p3 are the first two unfinished


@db
def test_raising_the_partition_concurrency_lets_a_waiting_backlog_run_two_at_once():
    """The limit is read by each claim: a partition whose head already runs gets a second job
    started once the limit is 2 (after a sweeper run at most), not only once the head finished."""
    p = [make_job("p", queue="raise") for _ in range(3)]
    [head] = claim()
    assert head.id == p[0].id
    django_jobs.queue("raise").set_partition_concurrency(2)
    sweep()
    assert [c.id for c in claim_gated("raise", now=at(1))[0]] == [p[1].id]
    assert claim_gated("raise", now=at(1))[0] == []


@db
def test_partition_rate_limit_gives_each_partition_its_own_sliding_window():
    django_jobs.queue("rl").set_partition_rate_limit(2, per_seconds=10)
    a = [make_job("a", queue="rl") for _ in range(5)]
    free = [make_job(None, queue="rl") for _ in range(3)]

    def run(seconds: float) -> list[uuid.UUID]:
        claimed, _ = claim_gated("rl", now=at(seconds))
        for c in claimed:
            finish(c, now=at(seconds + 0.1))
        return sorted(c.id for c in claimed)

    assert run(0) == sorted([a[0].id, *(j.id for j in free)])  # unpartitioned jobs have no window
    assert run(1) == [a[1].id]
    b = [make_job("b", queue="rl", now=at(4)) for _ in range(4)]
    assert run(5) == [b[0].id]  # a has used its 2 starts; b has its own window
    claimed, wake = claim_gated("rl", now=at(6))
    assert [c.id for c in claimed] == [b[1].id]
    assert wake == pytest.approx(4.0)  # a's first start (at 0) leaves its window at 10
    finish(claimed[0], now=at(6.1))

    assert claim_gated("rl", now=at(9.999))[0] == []
    assert run(10.001) == [a[2].id]  # a's start at 0 left the window; b's at 5 and 6 did not
    assert claim_gated("rl", now=at(10.9))[0] == []  # a: starts at 1 and 10.001
    assert run(11.001) == [a[3].id]
    assert run(15.001) == [b[2].id]
    assert run(16.001) == [b[3].id]
    assert claim_gated("rl", now=at(20.0))[0] == []  # a: 10.001 and 11.001 still in the window
    assert run(20.002) == [a[4].id]
    assert Job.objects.filter(queue="rl").exclude(state="completed").count() == 0


@db
def test_a_partition_rate_limit_starts_one_job_per_partition_per_claim():
    django_jobs.queue("rc").configure(partition_concurrency=3, partition_rate_limit=(2, 10.0))
    p = [make_job("p", queue="rc") for _ in range(4)]
    assert [c.id for c in claim_gated("rc", now=at(0))[0]] == [p[0].id]
    assert [c.id for c in claim_gated("rc", now=at(0.5))[0]] == [p[1].id]
    claimed, wake = claim_gated("rc", now=at(1))
    assert claimed == [] and wake == pytest.approx(9.0)  # the rate holds p[2] back, not the concurrency
    assert [c.id for c in claim_gated("rc", now=at(10.001))[0]] == [p[2].id]


# -- enqueue paths -----------------------------------------------------------------------------------


@db
def test_enqueue_many_into_a_partition_keeps_the_order_of_its_items():
    n = engine.INSERT_CHUNK + 20  # more than one multi-row INSERT
    results = tasks_partitions.seq_mark.using(partition="bulk").enqueue_many([("unused", "bulk", i) for i in range(n)])
    job_ids = [uuid.UUID(r.id) for r in results]
    assert job_ids == sorted(job_ids), "the partition's order is id order: it must be the item order"
    rows = dict(Job.objects.filter(partition_key="bulk").values_list("id", "args"))
    assert [rows[i][2] for i in job_ids] == list(range(n))
    for expected in job_ids[:3]:
        [head] = claim()
        assert head.id == expected
        finish(head)
    [head] = claim()
    assert head.id == job_ids[3]


@db
def test_a_deduplicated_enqueue_into_a_partition_takes_its_place_in_the_partitions_order():
    before = make_job("p")
    dedup = tasks.noop.using(partition="p", dedup=Dedup("report"))
    first = dedup.enqueue()
    again = dedup.enqueue()
    after = make_job("p")
    assert (again.duplicate, again.id) == (True, first.id)
    assert Job.objects.filter(partition_key="p").count() == 3
    assert Job.objects.get(id=first.id).partition_key == "p"
    order = []
    while claimed := claim():
        [head] = claimed
        order.append(head.id)
        finish(head)
    assert order == [before.id, uuid.UUID(first.id), after.id]


@db
def test_a_kept_last_dedup_enqueue_keeps_its_partition_when_it_is_promoted():
    dedup = tasks.noop.using(partition="p", dedup=Dedup("sync", keep_last_if_active=True))
    holder = dedup.enqueue()
    [running] = claim()
    assert running.id == uuid.UUID(holder.id)
    stashed = dedup.enqueue()
    assert stashed.duplicate and JobDedupNext.objects.count() == 1
    finish(running)
    engine.promote_dedup_stashes(using="default", limit=10)
    [promoted] = Job.objects.filter(dedup_key="sync").exclude(id=holder.id)
    assert (promoted.partition_key, promoted.state) == ("p", "waiting")
    assert [c.id for c in claim()] == [promoted.id]


@db
def test_an_idempotency_key_with_a_partition_keeps_one_job_in_the_partition():
    keyed = tasks.noop.using(partition="p", idempotency_key="order-42")
    first = keyed.enqueue()
    again = keyed.enqueue()
    assert (again.duplicate, again.id) == (True, first.id)
    assert list(Job.objects.values_list("id", "partition_key")) == [(uuid.UUID(first.id), "p")]
    later = make_job("p")
    [head] = claim()
    assert head.id == uuid.UUID(first.id)
    finish(head)
    assert [c.id for c in claim()] == [later.id]


# -- flows ---------------------------------------------------------------------------------------------


def _leaf(partition: str | None = None, queue: str = "default"):
    return tasks_partitions.leaf.using(partition=partition, queue_name=queue)


FLOWS_INTO_AN_ANCESTORS_PARTITION = {
    "child": lambda probe: flow(_leaf("p"), args=(probe, "root"), children=[flow(_leaf("p"), args=(probe, "c"))]),
    "grandchild": lambda probe: flow(
        _leaf("p"),
        args=(probe, "root"),
        children=[flow(_leaf("q"), args=(probe, "c"), children=[flow(_leaf("p"), args=(probe, "gc"))])],
    ),
}


@db
@pytest.mark.parametrize("make", FLOWS_INTO_AN_ANCESTORS_PARTITION.values(), ids=FLOWS_INTO_AN_ANCESTORS_PARTITION)
def test_a_flow_child_in_an_ancestors_queue_and_partition_is_refused_and_nothing_is_inserted(make, probe):
    with pytest.raises(InvalidFlow, match="is in partition 'p' of queue 'default', like one of its parents"):
        make(probe).enqueue()
    assert not Job.objects.exists() and not JobDependency.objects.exists()


@db
def test_a_flow_child_attached_to_a_parent_in_its_partition_is_refused(probe):
    """``enqueue(parent=...)`` makes the new root a child of an existing job: the same deadlock as
    a child in its parent's (queue, partition) if it were let in."""
    parent = flow(_leaf("p"), args=(probe, "parent"), children=[flow(_leaf(), args=(probe, "c"))]).enqueue()
    with pytest.raises(InvalidFlow, match="partition 'p'"):
        flow(_leaf("p"), args=(probe, "attached")).enqueue(parent=parent)
    assert Job.objects.count() == 2
    assert Job.objects.get(id=parent.id).pending_children == 1


@db
def test_flow_children_in_other_partitions_or_queues_run_and_then_their_parent(probe):
    root = flow(
        _leaf("p"),
        args=(probe, "root"),
        children=[
            flow(_leaf("q"), args=(probe, "q-child")),
            flow(_leaf("p", queue="other"), args=(probe, "p-other-queue")),
            flow(_leaf(), args=(probe, "free-child")),
        ],
    ).enqueue()
    assert Job.objects.get(id=root.id).state == "waiting-children"
    result = drain_queue()
    assert (result.completed, result.failed) == (4, 0)
    ran = [(r["key"], r["partition"]) for r in read_records(probe)]
    assert ran[-1] == ("root", "p")
    assert sorted(ran[:-1]) == [("free-child", None), ("p-other-queue", "p"), ("q-child", "q")]


@db
def test_a_parent_waiting_for_its_children_blocks_the_later_jobs_of_its_partition(probe):
    root = flow(_leaf("p"), args=(probe, "root"), children=[flow(_leaf("q"), args=(probe, "child"))]).enqueue()
    later = _leaf("p").enqueue(probe, "later")
    now = timezone.now() + timedelta(seconds=1)  # these jobs were enqueued at the real time
    [child] = claim(now=now)
    assert child.partition_key == "q"  # `later` waits behind the parent, which waits for its child
    assert claim(now=now) == []
    finish(child, return_value_json='"child"', has_parent=True, now=now)
    assert state_of(root.id) == "waiting"
    [parent] = claim(now=now)
    assert parent.id == uuid.UUID(root.id)  # now the head; `later` still waits behind it
    assert claim(now=now) == []
    finish(parent, now=now)
    assert [c.id for c in claim(now=now)] == [uuid.UUID(later.id)]


# -- the job's view and the test kit --------------------------------------------------------------


@db
def test_job_context_partition_names_the_jobs_partition():
    assert perform_job(tasks_partitions.context_partition.using(partition="customer-456")).return_value == {
        "partition": "customer-456",
        "queue": "default",
    }
    assert perform_job(tasks_partitions.context_partition).return_value["partition"] is None


@db
def test_drain_queue_runs_150_jobs_of_a_partition_in_order(probe):
    """A partition gives one job per round: 150 rounds, more than max_rounds=100, which counts
    only rounds that start no new job."""
    for i in range(150):
        tasks_partitions.seq_mark.using(partition="long").enqueue(probe, "long", i)
        if i % 10 == 0:
            tasks_partitions.seq_mark.using(partition="short").enqueue(probe, "short", i // 10)
    result = drain_queue()
    assert (result.completed, result.failed) == (165, 0)
    seen = defaultdict(list)
    for r in read_records(probe):
        seen[r["partition"]].append(r["seq"])
    assert seen == {"long": list(range(150)), "short": list(range(15))}


@committing
def test_a_worker_runs_the_next_job_of_a_partition_whose_waiting_head_was_cancelled(thread_worker, probe):
    task_p = tasks_partitions.seq_mark.using(partition="p")
    head = task_p.enqueue(probe, "p", 0)
    nxt = task_p.enqueue(probe, "p", 1)
    django_jobs.cancel(head.id)
    worker = thread_worker(concurrency=2)
    wait_until(lambda: state_of(nxt.id) == "completed", timeout=15, message="the job after the cancelled head")
    worker.stop()
    assert read_records(probe) == [{"partition": "p", "seq": 1}]


# -- real worker processes ----------------------------------------------------------------------------


PARTITIONS = 20
PER_PARTITION = 30


def _fails_first(p: int, seq: int) -> bool:
    return (seq + p) % 10 == 0  # 10%: 3 jobs per partition, the head of two partitions among them


def _enqueue_partitions(probe: str, partitions: int, per_partition: int, seconds: float) -> dict:
    """The jobs, interleaved across partitions as a busy site would enqueue them; {(p, seq): id}."""
    ids = {}
    with transaction.atomic():
        for seq in range(per_partition):
            for p in range(partitions):
                name = f"customer-{p}"
                result = tasks_partitions.step.using(partition=name).enqueue(
                    probe, name, seq, _fails_first(p, seq), seconds
                )
                ids[(name, seq)] = result.id
    return ids


def _attempts_by_partition(records: list[dict], kill_t: float | None = None, victim: int | None = None) -> dict:
    """{partition: [attempt dicts sorted by start]}; an attempt is its start record plus ``end``
    (its end time; for a start of the killed process that has no end, the kill time) and ``ok``
    (None for an interrupted attempt)."""
    ends = {(r["partition"], r["seq"], r["attempt"], r["pid"]): r for r in records if r["event"] == "end"}
    out = defaultdict(list)
    for r in records:
        if r["event"] != "start":
            continue
        end = ends.get((r["partition"], r["seq"], r["attempt"], r["pid"]))
        if end is None:
            assert r["pid"] == victim and kill_t is not None, f"an attempt never ended: {r}"
            out[r["partition"]].append({**r, "end": kill_t, "ok": None})
        else:
            out[r["partition"]].append({**r, "end": end["t"], "ok": end["ok"]})
    for attempts in out.values():
        attempts.sort(key=lambda a: a["t"])
    return out


def _check_serial(attempts_of: dict) -> dict:
    """Per partition, each attempt starts after the one before it ended and the jobs start in
    seq order; returns the figures."""
    overlaps, out_of_order, gaps = 0, 0, []
    for partition, attempts in attempts_of.items():
        for before, after in zip(attempts, attempts[1:], strict=False):
            if after["t"] <= before["end"]:
                overlaps += 1
            gaps.append(after["t"] - before["end"])
            if after["seq"] < before["seq"] or (after["seq"] > before["seq"] and before["ok"] is False):
                out_of_order += 1  # a later job started before an earlier one, or instead of its retry
        assert overlaps == 0, f"{partition}: two jobs of the partition overlapped: {attempts}"
        assert out_of_order == 0, (
            f"{partition}: jobs started out of order: {[(a['seq'], a['attempt']) for a in attempts]}"
        )
    return {"overlaps": overlaps, "out_of_order": out_of_order, "min_gap_s": round(min(gaps), 4)}


def _max_parallel_partitions(attempts_of: dict) -> int:
    edges = sorted((t, d) for atts in attempts_of.values() for a in atts for t, d in ((a["t"], 1), (a["end"], -1)))
    running = best = 0
    for _, d in edges:
        running += d
        best = max(best, running)
    return best


def _stop(workers) -> None:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(30) == 0, read_log(w)


@pytest.mark.slow
@committing
def test_three_worker_processes_run_every_partition_in_order_one_job_at_a_time(worker_process, probe, capsys):
    """The issue's figure, scaled down: 20 partitions x 30 jobs, 10% failing once (retried after
    0.1 s of backoff, delayed meanwhile), on 3 worker processes of 4 threads."""
    ids = _enqueue_partitions(probe, PARTITIONS, PER_PARTITION, seconds=0.02)
    started = time.monotonic()
    # Three runworker processes on SQLite too: E005 refuses only `runworker -p N` there (they
    # contend for the write lock, which is slower, not wrong).
    workers = [worker_process("-c", "4", "--sleep", "0.05", "--worker-id", f"part-{i}") for i in range(3)]
    wait_until(
        lambda: Job.objects.filter(state="completed").count() == len(ids),
        timeout=100,
        interval=0.2,
        message="every partitioned job to complete",
    )
    _stop(workers)
    for w in workers:
        log = read_log(w)
        assert "Dropped" not in log and "database is locked" not in log, log  # no outcome lost, no lock errors

    jobs = {str(j.id): j for j in Job.objects.all()}
    assert Counter(j.state for j in jobs.values()) == {"completed": len(ids)}
    for (name, seq), job_id in ids.items():
        expected = 2 if _fails_first(int(name.split("-")[1]), seq) else 1
        assert (jobs[job_id].attempts, jobs[job_id].partition_key) == (expected, name)

    records = read_records(probe)
    ok_runs = Counter((r["partition"], r["seq"]) for r in records if r["event"] == "end" and r["ok"])
    failed_runs = Counter((r["partition"], r["seq"]) for r in records if r["event"] == "end" and not r["ok"])
    lost = [k for k in ids if ok_runs[k] == 0]
    duplicated = [k for k in ids if ok_runs[k] > 1]
    assert (lost, duplicated) == ([], [])
    assert failed_runs == Counter({k: 1 for k in ids if _fails_first(int(k[0].split("-")[1]), k[1])})

    attempts_of = _attempts_by_partition(records)
    for name, attempts in attempts_of.items():
        p = int(name.split("-")[1])
        expected = [(s, a) for s in range(PER_PARTITION) for a in ((1, 2) if _fails_first(p, s) else (1,))]
        assert [(a["seq"], a["attempt"]) for a in attempts] == expected, name
    figures = _check_serial(attempts_of)
    figures |= {
        "jobs": len(ids),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "retried": sum(failed_runs.values()),
        "pids": len({r["pid"] for r in records}),
        "max_partitions_at_once": _max_parallel_partitions(attempts_of),
        "span_s": round(max(a["end"] for atts in attempts_of.values() for a in atts) - started, 2),
    }
    with capsys.disabled():
        print(f"\npartition figure ({connection.vendor}): {figures}")
    assert figures["pids"] >= 2, figures  # the partitions were spread over the processes
    assert figures["max_partitions_at_once"] >= 2, figures  # and ran in parallel


@pytest.mark.slow
@pytest.mark.needs("ROW_LOCKS")
@committing
def test_a_sigkilled_worker_leaves_its_partitions_blocked_until_the_lease_expires_then_they_resume_in_order(
    worker_process, probe, capsys
):
    partitions, per_partition = 16, 15
    ids = _enqueue_partitions(probe, partitions, per_partition, seconds=0.15)
    short_lease = {"JOBS_TEST_LEASE": "2"}
    workers = [
        worker_process("-c", "4", "--sleep", "0.05", "--worker-id", f"part-{i}", env=short_lease) for i in range(3)
    ]
    victim = workers[0]

    def victim_is_mid_job() -> bool:
        records = read_records(probe)
        done = sum(1 for r in records if r["event"] == "end" and r["ok"])
        starts = Counter((r["seq"], r["partition"], r["attempt"]) for r in records if r["pid"] == victim.pid)
        return done >= len(ids) // 4 and any(n == 1 for n in starts.values())  # a start without its end

    wait_until(victim_is_mid_job, timeout=60, interval=0.01, message="the victim to run a job a quarter in")
    os.killpg(victim.pid, signal.SIGKILL)
    kill_t = time.monotonic()
    victim.wait(10)
    wait_until(
        lambda: Job.objects.filter(state="completed").count() == len(ids),
        timeout=100,
        interval=0.2,
        message="the survivors to complete every job",
    )
    _stop(workers[1:])

    jobs = {str(j.id): j for j in Job.objects.all()}
    assert Counter(j.state for j in jobs.values()) == {"completed": len(ids)}
    rescued = {k for k, job_id in ids.items() if jobs[job_id].stalled_count > 0}
    assert rescued, "the kill interrupted no job: the test did not test the rescue"
    assert all(jobs[ids[k]].stalled_count == 1 for k in rescued)

    records = read_records(probe)
    attempts_of = _attempts_by_partition(records, kill_t=kill_t, victim=victim.pid)
    lost, duplicated, resumed_after = [], [], []
    for name, seq in ids:
        mine = [a for a in attempts_of[name] if a["seq"] == seq]
        counted = mine
        if (name, seq) in rescued:
            # The attempt the kill interrupted did not count (even if it got as far as recording
            # its end, its outcome died with the process): the victim's last one of this job, unless
            # the victim was killed between claiming the job and starting it.
            # That attempt runs again under its own number (a stall is not an attempt); when the
            # kill came between the claim and the start, the victim's last start is an earlier
            # attempt whose outcome was written, and it counts.
            on_victim = [a for a in mine if a["pid"] == victim.pid]
            if on_victim:
                last = on_victim[-1]
                if any(a["t"] > kill_t and a["attempt"] == last["attempt"] for a in mine):
                    counted = [a for a in mine if a is not last]
            assert any(a["t"] > kill_t for a in counted), f"{name}/{seq} was not run again: {mine}"
            resumed_after.append(min(a["t"] for a in counted if a["t"] > kill_t) - kill_t)
        elif any(a["ok"] is None for a in mine):
            pytest.fail(f"{name}/{seq} was interrupted by the kill but not rescued: {mine}")
        ok = sum(1 for a in counted if a["ok"])
        lost += [(name, seq)] * (ok == 0)
        duplicated += [(name, seq)] * (ok > 1)
        p = int(name.split("-")[1])
        assert [a["attempt"] for a in counted] == ([1, 2] if _fails_first(p, seq) else [1]), (name, seq, mine)
    assert (lost, duplicated) == ([], [])

    # The victim's rescued attempts count as running until the kill: nothing of their partition
    # may start before, and the partition goes on with the rescued job itself.
    figures = _check_serial(attempts_of)
    for name, attempts in attempts_of.items():
        for before, after in zip(attempts, attempts[1:], strict=False):
            if (name, before["seq"]) in rescued and before["pid"] == victim.pid:
                assert after["seq"] == before["seq"], f"{name}: the partition went on without its rescued job"
    figures |= {
        "jobs": len(ids),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "rescued": len(rescued),
        "victim_starts": sum(1 for r in records if r["event"] == "start" and r["pid"] == victim.pid),
        "rescued_rerun_after_kill_s": [round(min(resumed_after), 2), round(max(resumed_after), 2)],
    }
    with capsys.disabled():
        print(f"\npartition kill figure: {figures}")

"""The event log: every lifecycle step writes an Event row in the transaction of the change, and
``django_jobs.events()`` / ``follow_events()`` read it forward with cursors that never miss or
repeat an event.

Jobs run through the real pipeline (``drain_queue``, engine calls, worker threads). The tests
commit (``transaction=True``): on PostgreSQL a page only holds events of transactions older than
every running one, so a reader inside the test's own open transaction would see none of them.
"""

from __future__ import annotations

import importlib
import threading
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

import django_jobs
from django_jobs import engine, flow
from django_jobs.eventlog import MAX_LIMIT, InvalidEventCursor
from django_jobs.exceptions import JobsError
from django_jobs.models import Event, Job, Metric
from django_jobs.testing import drain_queue
from tests import tasks, tasks_console, tasks_dedup, tasks_flows
from tests.conftest import wait_until
from tests.factories import VISIBLE, claim_job, finish, jobs_settings, pg_session, settled

pytestmark = pytest.mark.django_db(transaction=True)

PG = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def kinds_of(job_id) -> list[str]:
    """The kinds of a job's events, in log order."""
    return list(
        Event.objects.filter(job_id=uuid.UUID(str(job_id))).order_by("txid", "id").values_list("kind", flat=True)
    )


def events_of(job_id, kind: str | None = None) -> list[Event]:
    rows = Event.objects.filter(job_id=uuid.UUID(str(job_id))).order_by("txid", "id")
    return list(rows.filter(kind=kind) if kind else rows)


def the_event(job_id, kind: str) -> Event:
    found = events_of(job_id, kind)
    assert len(found) == 1, f"expected one {kind!r} event of job {job_id}, got {[e.kind for e in events_of(job_id)]}"
    return found[0]


def read_all(after=None, **filters) -> list[Event]:
    settled()
    page = django_jobs.events(after, limit=MAX_LIMIT, **filters)
    return page.events


def collect(cursor: str | None, n: int, **filters) -> tuple[list[Event], str]:
    """Read pages from ``cursor`` until ``n`` events came (polling: see :func:`settled`)."""
    got: list[Event] = []

    def more() -> bool:
        nonlocal cursor
        page = django_jobs.events(cursor, **filters)
        got.extend(page.events)
        cursor = page.cursor
        return len(got) >= n

    wait_until(more, timeout=VISIBLE, message=f"{n} events")
    return got, cursor


# -- each lifecycle step -------------------------------------------------------------------------


def test_a_job_that_completes_writes_enqueued_active_completed_with_their_data():
    result = tasks_console.ok.using(queue_name="ev-run").enqueue(1)
    drain_queue("ev-run")

    assert kinds_of(result.id) == ["enqueued", "active", "completed"]
    enqueued = the_event(result.id, "enqueued")
    assert enqueued.data == {"task": "tests.tasks_console.ok", "state": "waiting"}
    assert enqueued.queue == "ev-run"
    active = the_event(result.id, "active")
    assert active.data == {"attempt": 1, "worker": "django_jobs.testing"}
    completed = the_event(result.id, "completed")
    assert completed.data["attempt"] == 1
    assert isinstance(completed.data["runtime_ms"], int) and completed.data["runtime_ms"] >= 0
    assert "error" not in completed.data
    for e in events_of(result.id):
        assert e.created_at is not None and abs(e.created_at - timezone.now()) < timedelta(minutes=1)
        # PostgreSQL: the writer's transaction id; MySQL: unpublished, or a published batch;
        # SQLite: 0 (one writer at a time).
        assert (e.txid == 0) if connection.vendor == "sqlite" else (e.txid > 0)


def test_a_failing_job_writes_retried_then_failed_with_the_error_class():
    result = tasks.always_fails.using(queue_name="ev-fail").enqueue("nope")  # max_attempts=2, backoff 0
    drain_queue("ev-fail")

    assert kinds_of(result.id) == ["enqueued", "active", "retried", "active", "failed"]
    retried = the_event(result.id, "retried")
    assert retried.data["attempt"] == 1 and retried.data["error"] == "builtins.ValueError"
    failed = the_event(result.id, "failed")
    assert failed.data["attempt"] == 2 and failed.data["error"] == "builtins.ValueError"
    assert isinstance(failed.data["runtime_ms"], int)
    assert [e.data["attempt"] for e in events_of(result.id, "active")] == [1, 2]


def test_a_snoozed_job_writes_snoozed_and_its_attempt_is_taken_back():
    result = tasks_console.snoozes.using(queue_name="ev-snooze").enqueue()
    drain_queue("ev-snooze", with_scheduled=False)

    assert kinds_of(result.id) == ["enqueued", "active", "snoozed"]
    assert Job.objects.get(id=result.id).state == "delayed"
    assert the_event(result.id, "snoozed").data["attempt"] == 0, "the attempt was taken back"


def test_progress_writes_a_progress_event_with_the_value():
    result = tasks_console.reports_progress.using(queue_name="ev-progress").enqueue({"done": 3, "of": 4})
    drain_queue("ev-progress")

    assert kinds_of(result.id) == ["enqueued", "active", "progress", "completed"]
    assert the_event(result.id, "progress").data == {"progress": {"done": 3, "of": 4}}


def test_a_delayed_job_is_promoted_by_the_promoter_and_by_make_due():
    later = tasks_console.ok.using(queue_name="ev-delay", run_after=timedelta(hours=1))
    by_promoter = later.enqueue(1)
    assert the_event(by_promoter.id, "enqueued").data["state"] == "delayed"

    assert engine.promote_due_jobs(using="default", limit=10, now=timezone.now() + timedelta(hours=2)) == 1
    assert kinds_of(by_promoter.id) == ["enqueued", "promoted"]
    assert the_event(by_promoter.id, "promoted").data == {}

    third = later.enqueue(3)
    assert engine.make_due(using="default", job_ids=[uuid.UUID(third.id)]) == 1
    assert kinds_of(third.id) == ["enqueued", "promoted"]
    assert the_event(third.id, "promoted").data == {"now": True}


def test_a_flow_writes_enqueued_for_every_job_and_promoted_when_the_parent_is_released(probe):
    root = flow(
        tasks_flows.gather.using(queue_name="ev-flow"),
        args=(probe, "root"),
        children=[flow(tasks_flows.leaf.using(queue_name="ev-flow"), args=(probe, f"c{i}")) for i in range(2)],
    ).enqueue()
    children = list(Job.objects.filter(parent_id=root.id).values_list("id", flat=True))
    assert the_event(root.id, "enqueued").data == {"task": "tests.tasks_flows.gather", "state": "waiting-children"}
    for child in children:
        assert the_event(child, "enqueued").data["state"] == "waiting"

    drain_queue("ev-flow")

    assert kinds_of(root.id) == ["enqueued", "promoted", "active", "completed"]
    assert the_event(root.id, "promoted").data == {"from": "waiting-children"}


def test_a_parent_released_early_by_continue_is_promoted_once_however_many_children_finish_after(probe):
    """failure_policy="continue" releases the parent when a child fails; a child finishing later,
    before the parent ran, leaves the parent where it is: no second "promoted" event."""
    root = flow(
        tasks_flows.gather.using(queue_name="ev-cont"),
        args=(probe, "root"),
        children=[
            flow(tasks_flows.breaks.using(queue_name="ev-cont-first"), args=(probe, "x"), failure_policy="continue"),
            flow(tasks_flows.leaf.using(queue_name="ev-cont-later"), args=(probe, "later")),
        ],
    ).enqueue()
    drain_queue("ev-cont-first")
    assert Job.objects.get(id=root.id).state == "waiting"
    drain_queue("ev-cont-later")  # the parent is still waiting: nothing happened to it

    assert kinds_of(root.id) == ["enqueued", "promoted"]


def test_a_parent_failed_by_its_child_writes_failed():
    root = flow(tasks.noop.using(queue_name="ev-pfail"), children=[flow(tasks_console.fails)]).enqueue()
    drain_queue()

    assert kinds_of(root.id) == ["enqueued", "failed"]
    assert Job.objects.get(id=root.id).state == "failed"


def test_enqueue_many_writes_one_enqueued_many_event_for_its_jobs_in_order():
    results = tasks_console.ok.using(queue_name="ev-many").enqueue_many([(i,) for i in range(7)])

    rows = list(Event.objects.filter(queue="ev-many").order_by("txid", "id"))
    assert [(r.kind, r.job_id) for r in rows] == [("enqueued-many", None)]
    assert rows[0].data == {"task": "tests.tasks_console.ok", "state": "waiting", "jobs": [r.id for r in results]}
    # events(job=...) reads a job's own rows: a job of a batch has none for its enqueue.
    assert kinds_of(results[3].id) == []


def test_enqueue_many_of_more_than_a_chunk_writes_one_event_per_chunk_naming_every_job():
    n = engine.INSERT_CHUNK + 3
    results = tasks_console.ok.using(queue_name="ev-chunk", run_after=timedelta(hours=1)).enqueue_many(
        [(i,) for i in range(n)]
    )
    rows = list(Event.objects.filter(queue="ev-chunk").order_by("txid", "id"))
    assert [r.kind for r in rows] == ["enqueued-many", "enqueued-many"]
    assert [len(r.data["jobs"]) for r in rows] == [engine.INSERT_CHUNK, 3]
    assert [j for r in rows for j in r.data["jobs"]] == [r.id for r in results]
    assert {r.data["state"] for r in rows} == {"delayed"}


@pytest.mark.skipif(not PG, reason="column compression is PostgreSQL's")
def test_an_enqueued_many_event_is_compressed_with_lz4_where_the_server_has_it():
    # Migration 0017: pglz's compression of the chunk's ids was 4 % of the server's CPU.
    lz4_available = importlib.import_module("django_jobs.migrations.0017_event_data_lz4").lz4_available
    with connection.cursor() as cursor:
        if connection.pg_version < 140000:
            pytest.skip("pg_column_compression() and lz4 columns are PostgreSQL 14's")
        expected = "lz4" if lz4_available(cursor) else "pglz"
    results = tasks_console.ok.using(queue_name="ev-lz4").enqueue_many([(i,) for i in range(engine.INSERT_CHUNK)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_column_compression(data) FROM django_jobs_event WHERE queue = 'ev-lz4'")
        assert [r[0] for r in cursor.fetchall()] == [expected]
    [event] = Event.objects.filter(queue="ev-lz4")
    assert event.data["jobs"] == [r.id for r in results]


def test_deduplicated_and_idempotent_enqueues_write_enqueued_only_for_the_new_job():
    first = tasks_dedup.sync_user.enqueue(7)
    duplicate = tasks_dedup.sync_user.enqueue(7, field="x")
    assert duplicate.duplicate and duplicate.id == first.id
    assert kinds_of(first.id) == ["enqueued"]

    once = tasks_console.ok.using(queue_name="ev-idem", idempotency_key="order-1")
    a, b = once.enqueue(1), once.enqueue(2)
    assert b.duplicate and a.id == b.id
    assert kinds_of(a.id) == ["enqueued"]


def test_an_enqueue_of_a_size_limited_queue_writes_its_event():
    django_jobs.queue("ev-sized").set_max_size(10)
    result = tasks_console.ok.using(queue_name="ev-sized").enqueue()
    once = tasks_console.ok.using(queue_name="ev-sized", idempotency_key="k").enqueue()
    assert kinds_of(result.id) == ["enqueued"]
    assert kinds_of(once.id) == ["enqueued"]


def test_a_scheduled_tick_writes_enqueued_for_its_job():
    from django_jobs import schedules

    row = schedules.schedule("ev-tick", tasks_console.ok, every=60, queue="ev-sched")
    from django_jobs.models import Schedule

    due = timezone.now() - timedelta(seconds=1)
    Schedule.objects.filter(pk=row.pk).update(next_run_at=due)
    # Fired as of that tick: the every-60 s grid's next tick may fall within the last second.
    assert schedules.fire_due(backend="default", now=due)["fired"] == 1
    job = Job.objects.get(queue="ev-sched")
    assert kinds_of(job.id) == ["enqueued"]


def test_cancel_of_a_waiting_job_writes_cancelled():
    result = tasks_console.ok.using(queue_name="ev-cancel").enqueue()
    django_jobs.cancel(result.id)
    assert kinds_of(result.id) == ["enqueued", "cancelled"]


def test_cancel_of_a_running_job_writes_cancel_requested_then_cancelled_when_its_attempt_ends():
    result = tasks_console.ok.using(queue_name="ev-cancel-run").enqueue()
    job = claim_job(result.id)
    assert engine.cancel_job(using="default", job_id=job.id).change == "flagged"
    assert kinds_of(result.id) == ["enqueued", "active", "cancel-requested"]

    # The attempt's outcome is recorded as cancelled.
    finish(job, return_value_json="null", queue=job.queue, attempt=job.attempts)
    assert Job.objects.get(id=result.id).state == "cancelled"
    assert kinds_of(result.id) == ["enqueued", "active", "cancel-requested", "cancelled"]


def test_cancelling_a_parent_writes_cancelled_for_its_children_and_cancel_requested_for_running_ones():
    root = flow(
        tasks.noop.using(queue_name="ev-cascade"),
        children=[
            flow(tasks.noop.using(queue_name="ev-cascade")),
            flow(tasks.add.using(queue_name="ev-cascade"), args=(1, 2)),
        ],
    ).enqueue()
    waiting_child = Job.objects.get(parent_id=root.id, task_path="tests.tasks.noop")
    running_child = Job.objects.get(parent_id=root.id, task_path="tests.tasks.add")
    claim_job(running_child.id)

    django_jobs.cancel(root.id)

    assert kinds_of(root.id) == ["enqueued", "cancelled"]
    assert kinds_of(waiting_child.id) == ["enqueued", "cancelled"]
    assert kinds_of(running_child.id) == ["enqueued", "active", "cancel-requested"]


def test_retry_of_a_failed_job_writes_retried_manual():
    result = tasks_console.fails.using(queue_name="ev-retry").enqueue()
    drain_queue("ev-retry")
    assert engine.retry_job(using="default", job_id=uuid.UUID(result.id))

    assert kinds_of(result.id) == ["enqueued", "active", "failed", "retried"]
    assert events_of(result.id)[-1].data == {"manual": True}


def test_delete_writes_removed():
    result = tasks_console.ok.using(queue_name="ev-delete").enqueue()
    assert engine.delete_jobs(using="default", job_ids=[uuid.UUID(result.id)]) == 1
    assert kinds_of(result.id) == ["enqueued", "removed"]
    assert not Job.objects.filter(id=result.id).exists()


def test_pause_and_resume_write_queue_events_without_a_job():
    control = django_jobs.queue("ev-pause")
    control.pause()
    control.resume()
    rows = list(Event.objects.filter(queue="ev-pause").order_by("txid", "id"))
    assert [(r.kind, r.job_id, r.data) for r in rows] == [("paused", None, {}), ("resumed", None, {})]


def test_release_at_shutdown_writes_released_and_a_cancelled_release_writes_cancelled():
    released = tasks_console.ok.using(queue_name="ev-release").enqueue(1)
    flagged = tasks_console.ok.using(queue_name="ev-release").enqueue(2)
    claim_job(released.id, worker_id="w-rel")
    claim_job(flagged.id, worker_id="w-rel")
    engine.cancel_job(using="default", job_id=uuid.UUID(flagged.id))

    assert engine.release_jobs(using="default", worker_id="w-rel") == 1

    assert kinds_of(released.id) == ["enqueued", "active", "released"]
    assert kinds_of(flagged.id) == ["enqueued", "active", "cancel-requested", "cancelled"]


def test_a_stalled_job_writes_stalled_and_rescued_or_failed():
    rescued = tasks_console.ok.using(queue_name="ev-stall").enqueue(1)
    claim_job(rescued.id, lease_seconds=1)
    later = timezone.now() + timedelta(seconds=30)
    [row] = engine.rescue_stalled_jobs(using="default", max_stalled=1, limit=10, now=later)
    assert row.state == "waiting"
    assert kinds_of(rescued.id) == ["enqueued", "active", "stalled", "rescued"]

    claim_job(rescued.id, lease_seconds=1)
    [row] = engine.rescue_stalled_jobs(using="default", max_stalled=1, limit=10, now=later + timedelta(seconds=30))
    assert row.state == "failed"
    assert kinds_of(rescued.id)[-3:] == ["active", "stalled", "failed"]


def test_the_worker_writes_the_events_of_the_jobs_it_runs(thread_worker):
    ids = [tasks_console.ok.using(queue_name="ev-worker").enqueue(i).id for i in range(10)]
    thread_worker(queues=["ev-worker"], concurrency=3, stop_when_empty=True, worker_id="ev-w").join(timeout=60)

    for job_id in ids:
        assert kinds_of(job_id) == ["enqueued", "active", "completed"]
        assert the_event(job_id, "active").data == {"attempt": 1, "worker": "ev-w"}


# -- in the transaction of the change ------------------------------------------------------------


def test_an_enqueue_rolled_back_leaves_no_event():
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        tasks_console.ok.using(queue_name="ev-rb").enqueue(1)
        tasks_console.ok.using(queue_name="ev-rb").enqueue_many([(2,), (3,)])
        flow(tasks.noop.using(queue_name="ev-rb"), children=[flow(tasks.noop.using(queue_name="ev-rb"))]).enqueue()
        django_jobs.queue("ev-rb").pause()
        assert (
            Event.objects.filter(queue="ev-rb").count() == 5
        )  # visible inside the transaction (one enqueued-many for the two)
        raise Rollback

    assert not Job.objects.filter(queue="ev-rb").exists()
    assert not Event.objects.filter(queue="ev-rb").exists()


def test_events_of_an_enqueue_commit_with_it():
    with transaction.atomic():
        result = tasks_console.ok.using(queue_name="ev-commit").enqueue(1)
    assert kinds_of(result.id) == ["enqueued"]


def test_an_outcome_that_lost_its_lease_writes_no_event_and_no_metric():
    result = tasks_console.ok.using(queue_name="ev-lost").enqueue()
    job = claim_job(result.id, lease_seconds=1)
    engine.rescue_stalled_jobs(using="default", max_stalled=5, limit=10, now=timezone.now() + timedelta(seconds=30))

    written = engine.record_outcomes(
        [engine.Outcome(job_id=job.id, lease_token=job.lease_token, state="completed", return_value_json="1")],
        using="default",
    )
    assert written == {}
    assert "completed" not in kinds_of(result.id)
    assert not Metric.objects.filter(queue="ev-lost").exists()


# -- EVENTS = False ------------------------------------------------------------------------------


def test_events_false_writes_no_event_but_metrics_still_count(probe):
    with jobs_settings(EVENTS=False):
        ok = tasks_console.ok.using(queue_name="ev-off").enqueue()
        tasks_console.ok.using(queue_name="ev-off").enqueue_many([(1,), (2,)])
        tasks_console.ok.using(queue_name="ev-off", idempotency_key="k").enqueue()
        tasks_dedup.refresh.using(queue_name="ev-off", dedup=django_jobs.Dedup("ev-off-key")).enqueue()
        failed = tasks_console.fails.using(queue_name="ev-off").enqueue()
        tasks_console.reports_progress.using(queue_name="ev-off").enqueue(50)
        flow(tasks.noop.using(queue_name="ev-off"), children=[flow(tasks.noop.using(queue_name="ev-off"))]).enqueue()
        tasks_console.ok.using(queue_name="ev-off", run_after=timedelta(hours=1)).enqueue()
        drain_queue("ev-off", with_scheduled=True)
        engine.retry_job(using="default", job_id=uuid.UUID(failed.id))
        cancelled = tasks_console.ok.using(queue_name="ev-off").enqueue()
        django_jobs.cancel(cancelled.id)
        django_jobs.queue("ev-off").pause()
        django_jobs.queue("ev-off").resume()
        engine.delete_jobs(using="default", job_ids=[uuid.UUID(ok.id)])

    assert Event.objects.count() == 0
    metric = Metric.objects.get(queue="ev-off")
    assert (metric.completed, metric.failed) == (9, 1)


# -- reading: pages and cursors ------------------------------------------------------------------


def make_events(n: int, queue: str = "ev-page") -> list[str]:
    """``n`` jobs enqueued one transaction each: ``n`` events."""
    return [tasks_console.ok.using(queue_name=queue).enqueue(i).id for i in range(n)]


def test_pages_return_every_event_once_in_log_order():
    make_events(10, "ev-a")
    tasks_console.ok.using(queue_name="ev-b").enqueue_many([(i,) for i in range(5)])
    make_events(8, "ev-a")
    expected = list(Event.objects.order_by("txid", "id").values_list("id", flat=True))
    assert len(expected) == 19  # the five of enqueue_many in one enqueued-many event
    settled()

    seen, cursor, pages = [], None, 0
    while True:
        page = django_jobs.events(cursor, limit=4)
        pages += 1
        assert len(page.events) <= 4
        if not page.events:
            assert page.cursor == cursor
            break
        seen += [e.id for e in page.events]
        cursor = page.cursor
    assert seen == expected, "every event once, in (txid, id) order"
    assert pages == 6  # 5 pages of events (4 x 4 + 3) and an empty one


def test_a_reader_that_stored_its_cursor_gets_only_what_came_after():
    make_events(3)
    first, cursor = collect(None, 3)
    assert len(first) == 3
    later = make_events(2)
    second, cursor = collect(cursor, 2)
    assert [str(e.job_id) for e in second] == later
    settled()
    assert django_jobs.events(cursor).events == []


def test_filters_by_queue_job_and_kinds_page_without_missing_or_repeating():
    a = make_events(6, "ev-fa")
    make_events(5, "ev-fb")
    make_events(6, "ev-fa")
    drain_queue("ev-fa")
    expected = list(Event.objects.filter(queue="ev-fa").order_by("txid", "id").values_list("id", flat=True))
    assert len(expected) == 36
    settled()

    seen, cursor = [], None
    while True:
        page = django_jobs.events(cursor, queue="ev-fa", limit=5)
        if not page.events:
            break
        assert all(e.queue == "ev-fa" for e in page.events)
        seen += [e.id for e in page.events]
        cursor = page.cursor
    assert seen == expected

    job_events = django_jobs.events(None, job=a[0]).events
    assert [e.kind for e in job_events] == ["enqueued", "active", "completed"]
    assert django_jobs.events(None, job=uuid.UUID(a[0])).events == job_events

    completed = read_all(kinds=["completed", "failed"])
    assert len(completed) == 12 and {e.kind for e in completed} == {"completed"}
    both = read_all(queue="ev-fb", kinds=["enqueued"])
    assert len(both) == 5


def test_a_filtered_reader_that_matched_nothing_moves_its_cursor_past_what_it_read():
    make_events(4, "ev-other")
    end = settled()
    page = django_jobs.events(None, queue="ev-mine")
    assert page.events == []
    assert page.cursor == end

    mine = make_events(1, "ev-mine")
    make_events(1, "ev-other")
    settled()
    page = django_jobs.events(page.cursor, queue="ev-mine")
    assert [str(e.job_id) for e in page.events] == mine


def test_latest_is_a_cursor_at_the_end_of_the_log():
    empty = django_jobs.events("latest")
    assert empty.events == [] and empty.cursor == "0.0"
    assert django_jobs.events(empty.cursor).events == [], "0.0 on an empty log"

    make_events(3)
    end = settled()
    latest = django_jobs.events("latest")
    assert latest.events == [] and latest.cursor == end
    new = make_events(2)
    got, _ = collect(latest.cursor, 2)
    assert [str(e.job_id) for e in got] == new


def test_the_zero_cursor_of_an_empty_log_reads_what_comes_later():
    cursor = django_jobs.events("latest").cursor
    new = make_events(2)
    got, _ = collect(cursor, 2)
    assert [str(e.job_id) for e in got] == new


@pytest.mark.parametrize("bad", ["", "abc", "1", "1.", ".1", "1.2.3", "-1.5", "1.-5", " 1.2", "1.2 ", "1,2", "x.y"])
def test_a_malformed_cursor_is_refused_clearly(bad):
    with pytest.raises(InvalidEventCursor, match="malformed"):
        django_jobs.events(bad)


@pytest.mark.parametrize("bad", [12, 1.5, b"1.2", ("1", "2")])
def test_a_cursor_that_is_not_a_string_is_refused(bad):
    with pytest.raises(InvalidEventCursor):
        django_jobs.events(bad)


def test_invalid_event_cursor_is_a_jobs_error_and_a_value_error():
    assert issubclass(InvalidEventCursor, JobsError) and issubclass(InvalidEventCursor, ValueError)


@pytest.mark.parametrize("bad", [0, -1, MAX_LIMIT + 1, "10", 2.0, True, None])
def test_a_bad_limit_is_a_value_error(bad):
    with pytest.raises(ValueError, match="limit"):
        django_jobs.events(None, limit=bad)


def test_limit_bounds_are_accepted():
    make_events(2)
    settled()
    assert len(django_jobs.events(None, limit=1).events) == 1
    assert len(django_jobs.events(None, limit=MAX_LIMIT).events) == 2


def test_a_job_filter_that_is_not_an_id_is_a_value_error():
    with pytest.raises(ValueError, match="job"):
        django_jobs.events(None, job="not-a-uuid")


def test_events_are_read_from_the_backends_database():
    make_events(1)
    settled()
    assert len(django_jobs.events(None, backend="limited").events) == 1


# -- following -----------------------------------------------------------------------------------


class Follower:
    """``django_jobs.follow_events(**kwargs)`` consumed by a thread of its own."""

    def __init__(self, **kwargs):
        self.stop = threading.Event()
        self.got: list[Event] = []
        self.error: BaseException | None = None
        kwargs.setdefault("poll", 0.1)
        self.thread = threading.Thread(target=self._run, args=(kwargs,), daemon=True)

    def _run(self, kwargs):
        try:
            for event in django_jobs.follow_events(stop=self.stop.is_set, **kwargs):
                self.got.append(event)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "follow_events() did not stop"


def test_follow_events_yields_events_committed_by_another_thread():
    make_events(2, "ev-follow-old")
    start = settled()
    writer_ids: list[str] = []

    def write():
        try:
            writer_ids.extend(make_events(5, "ev-follow"))
            writer_ids.extend(r.id for r in tasks_console.ok.using(queue_name="ev-follow").enqueue_many([(1,), (2,)]))
        finally:
            connections.close_all()

    with Follower(after=start) as follower:
        writer = threading.Thread(target=write)
        writer.start()
        writer.join(30)
        wait_until(lambda: len(follower.got) >= 6 or follower.error, timeout=VISIBLE, message="6 events followed")
    assert follower.error is None, follower.error
    assert [e.kind for e in follower.got] == ["enqueued"] * 5 + ["enqueued-many"]
    followed = [str(e.job_id) for e in follower.got[:5]] + follower.got[5].data["jobs"]
    assert followed == writer_ids, "every event once, in order"


def test_follow_events_starts_at_the_end_of_the_log_by_default():
    make_events(2, "ev-follow-old")
    settled()
    with Follower() as follower:
        # The generator takes "latest" when it first runs: keep writing until it yields.
        new: list[str] = []

        def seen_one() -> bool:
            new.extend(make_events(1, "ev-follow-new"))
            return bool(follower.got) or bool(follower.error)

        wait_until(seen_one, timeout=VISIBLE, interval=0.2)
    assert follower.error is None
    assert {e.queue for e in follower.got} == {"ev-follow-new"}
    assert {str(e.job_id) for e in follower.got} <= set(new)


def test_follow_events_filters_by_queue_and_kinds():
    make_events(3, "ev-fq")
    make_events(3, "ev-fq-other")
    drain_queue()
    with Follower(after=None, queue="ev-fq", kinds=["completed"]) as follower:
        wait_until(lambda: len(follower.got) >= 3 or follower.error, timeout=VISIBLE)
    assert follower.error is None
    assert [(e.queue, e.kind) for e in follower.got] == [("ev-fq", "completed")] * 3


# -- PostgreSQL: NOTIFY and the open-transaction horizon -----------------------------------------


def listener():
    conn = connections.create_connection("default")
    conn.ensure_connection()
    conn.connection.autocommit = True
    conn.connection.execute(f"LISTEN {engine.events_channel()}")
    return conn


def notifications(conn, timeout: float = 1.0) -> list[str]:
    """What arrived on the events channel, waiting ``timeout`` s after the last one for more."""
    got = []
    while True:
        batch = list(conn.connection.notifies(timeout=timeout, stop_after=1))
        if not batch:
            return got
        got += [n.channel for n in batch]


@pytest.mark.postgres
def test_a_transaction_enqueueing_five_jobs_sends_one_events_notification():
    conn = listener()
    try:
        with transaction.atomic():
            for i in range(5):
                tasks_console.ok.using(queue_name="ev-notify").enqueue(i)
        assert notifications(conn) == ["django_jobs_events"]

        for i in range(3):  # autocommit: three transactions, three notifications
            tasks_console.ok.using(queue_name="ev-notify").enqueue(i)
        assert notifications(conn) == ["django_jobs_events"] * 3

        tasks_console.ok.using(queue_name="ev-notify").enqueue_many([(i,) for i in range(4)])
        assert notifications(conn) == ["django_jobs_events"]

        with transaction.atomic():
            django_jobs.queue("ev-notify").pause()
            django_jobs.queue("ev-notify").resume()
            tasks_console.ok.using(queue_name="ev-notify").enqueue_many([(1,), (2,)])
        assert notifications(conn) == ["django_jobs_events"]
    finally:
        conn.close()


@pytest.mark.postgres
def test_claims_and_outcomes_notify_the_events_channel():
    tasks_console.ok.using(queue_name="ev-notify-run").enqueue_many([(i,) for i in range(3)])
    conn = listener()
    try:
        jobs = engine.claim_jobs(using="default", queues=["ev-notify-run"], limit=10, worker_id="w", lease_seconds=30)
        assert len(jobs) == 3
        assert notifications(conn) == ["django_jobs_events"], "one claim statement, one notification"
        engine.record_outcomes(
            [engine.Outcome(job_id=j.id, lease_token=j.lease_token, state="completed", queue=j.queue) for j in jobs],
            using="default",
        )
        assert notifications(conn) == ["django_jobs_events"], "one outcome batch, one notification"
        assert engine.claim_jobs(using="default", queues=["ev-notify-run"], limit=10, worker_id="w",
                                 lease_seconds=30) == []  # fmt: skip
        assert notifications(conn, timeout=0.5) == [], "a claim of nothing writes no event and sends nothing"
    finally:
        conn.close()


@pytest.mark.postgres
def test_a_rolled_back_transaction_sends_no_events_notification():
    conn = listener()
    try:
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            tasks_console.ok.using(queue_name="ev-notify-rb").enqueue()
            1 / 0  # noqa: B018
        assert notifications(conn, timeout=0.5) == []
    finally:
        conn.close()


@pytest.mark.postgres
def test_events_false_sends_no_events_notification():
    conn = listener()
    try:
        with jobs_settings(EVENTS=False):
            tasks_console.ok.using(queue_name="ev-notify-off").enqueue()
            tasks_console.ok.using(queue_name="ev-notify-off").enqueue_many([(1,), (2,)])
            drain_queue("ev-notify-off")
        assert notifications(conn, timeout=0.5) == []
    finally:
        conn.close()


@pytest.mark.postgres
def test_the_events_channel_follows_notify_channel():
    with jobs_settings(NOTIFY_CHANNEL="jobs_elsewhere"):
        conn = listener()
        try:
            assert engine.events_channel() == "jobs_elsewhere_events"
            tasks_console.ok.using(queue_name="ev-notify-ch").enqueue()
            assert notifications(conn) == ["jobs_elsewhere_events"]
        finally:
            conn.close()


class OpenTransaction:
    """A second real connection holding a transaction open (with a transaction id, as any
    transaction that wrote has) until ``commit()``; it enqueues a job inside it."""

    def __init__(self, queue: str):
        self.queue = queue
        self.started = threading.Event()
        self.release = threading.Event()
        self.job_id: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            with transaction.atomic():
                self.job_id = tasks_console.ok.using(queue_name=self.queue).enqueue("held").id
                self.started.set()
                self.release.wait(30)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        assert self.started.wait(10), "the holding transaction did not start"
        return self

    def commit(self):
        self.release.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        if self.error:
            raise self.error

    def __exit__(self, *exc):
        self.release.set()
        self.thread.join(10)


@pytest.mark.postgres
def test_an_open_transaction_holds_back_events_committed_after_it_until_it_ends():
    before = make_events(2, "ev-hz")
    start = settled()
    assert [str(e.job_id) for e in django_jobs.events(None).events] == before

    with OpenTransaction("ev-hz") as held:
        after = make_events(3, "ev-hz")  # committed while `held` runs, with later txids
        assert Event.objects.filter(job_id__in=[uuid.UUID(i) for i in after]).count() == 3, "they are committed"
        blocked = django_jobs.events(start)
        assert blocked.events == [], "events committed after a running transaction began are held back"
        assert blocked.cursor == start, "and the cursor does not move past them"
        assert django_jobs.events("latest").cursor == start
        assert django_jobs.events(start, queue="ev-hz").cursor == start, "nor does a filtered reader's"
        held.commit()

    got, cursor = collect(start, 4)
    assert [str(e.job_id) for e in got] == [held.job_id, *after], "all of them, the held one first"
    settled()
    assert django_jobs.events(cursor).events == []


@pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL/MariaDB publish events in batches")
def test_mysql_an_open_transaction_holds_back_only_its_own_events():
    """Ids commit out of order; what commits while a transaction runs is published at once, in a
    batch of its own, and the held transaction's event comes in a later batch when it commits,
    though its id is smaller."""
    start = settled()
    with OpenTransaction("ev-my") as held:
        after = make_events(3, "ev-my")
        got, cursor = collect(start, 3)
        assert [str(e.job_id) for e in got] == after, "committed events are not held back"
        held.commit()
    got, cursor = collect(cursor, 1)
    assert [str(e.job_id) for e in got] == [held.job_id], "the held event comes once it committed"
    first_id = Event.objects.get(job_id=uuid.UUID(held.job_id)).id
    assert first_id < min(Event.objects.filter(job_id__in=[uuid.UUID(i) for i in after]).values_list("id", flat=True))
    settled()
    assert django_jobs.events(cursor).events == []


@pytest.mark.needs("ROW_LOCKS")  # writers that run side by side (PostgreSQL, MySQL)
def test_a_reader_polling_through_open_transactions_misses_nothing():
    """A reader keeps polling while transactions commit out of txid order; the union of its
    pages is every event exactly once."""
    cursor = settled()
    seen: list[int] = []

    def poll():
        nonlocal cursor
        page = django_jobs.events(cursor, limit=3)
        seen.extend(e.id for e in page.events)
        cursor = page.cursor

    holders = [OpenTransaction("ev-poll") for _ in range(3)]
    try:
        for h in holders:
            h.__enter__()
            make_events(2, "ev-poll")
            poll()
        for h in reversed(holders):  # newest first: the txids commit out of order
            h.commit()
            poll()
            make_events(1, "ev-poll")
            poll()
    finally:
        for h in holders:
            h.__exit__()
    expected = sorted(Event.objects.filter(queue="ev-poll").values_list("id", flat=True))
    assert len(expected) == 3 + 6 + 3

    def all_read() -> bool:
        poll()
        return len(seen) >= len(expected)

    wait_until(all_read, timeout=VISIBLE)
    assert sorted(seen) == expected and len(seen) == len(set(seen))


@pytest.mark.needs("ROW_LOCKS")
def test_readers_paging_while_writers_commit_each_see_every_event_once():
    """Four writer threads enqueue while two readers page the log at once (on MySQL/MariaDB both
    readers publish, taking turns on the publisher's row): each reader's pages, put together,
    hold every event exactly once, in the log's order."""
    start = settled()
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for n in range(40):
                tasks_console.ok.using(queue_name="ev-race").enqueue(i * 100 + n)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            connections.close_all()

    def read(seen: list) -> None:
        cursor = start
        try:
            while True:
                done = stop.is_set()  # read once more after the writers ended
                page = django_jobs.events(cursor, limit=7, queue="ev-race")
                seen.extend((e.txid, e.id) for e in page.events)
                cursor = page.cursor
                if done and not page.events:
                    break
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            connections.close_all()

    seen_by = [[], []]
    readers = [threading.Thread(target=read, args=(seen,)) for seen in seen_by]
    writers = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(120)
    settled()
    stop.set()
    for t in readers:
        t.join(120)
    assert not errors, errors
    expected = set(Event.objects.filter(queue="ev-race").values_list("id", flat=True))
    assert len(expected) == 160
    for seen in seen_by:
        ids = [i for _, i in seen]
        assert len(ids) == len(set(ids)), "an event was read twice"
        assert set(ids) == expected, f"missed {len(expected - set(ids))} events"
        assert seen == sorted(seen), "pages follow the log's (txid, id) order"


@pytest.mark.needs("ROW_LOCKS")
def test_a_reader_inside_its_own_writing_transaction_sees_its_events_only_after_commit():
    cursor = settled()
    with transaction.atomic():
        result = tasks_console.ok.using(queue_name="ev-own").enqueue()
        assert django_jobs.events(cursor).events == []
    got, _ = collect(cursor, 1)
    assert [str(e.job_id) for e in got] == [result.id]


@pytest.mark.postgres
def test_a_transaction_of_another_database_does_not_hold_back_the_events():
    other = pg_session("postgres")
    try:
        start = settled()
        with other.transaction():
            other.execute("SELECT pg_current_xact_id()")  # it has a transaction id, as any writer has
            result = tasks_console.ok.using(queue_name="ev-otherdb").enqueue()
            got = django_jobs.events(start).events
        assert [str(e.job_id) for e in got] == [result.id]
    finally:
        other.close()

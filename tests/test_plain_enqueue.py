"""``enqueue()`` of a plain task: the lean insert keeps Django's guarantees.

On PostgreSQL the insert runs on a psycopg cursor kept between calls, unwrapped when nothing
watches Django's cursors (no execute wrapper, no query log, Django's own ``CursorWrapper``) and
wrapped otherwise; either way Django's error translation and broken-transaction check hold.
``task_enqueued`` goes to each receiver robustly, at once in autocommit, on commit in a
transaction. A job enqueued alone takes its own id as its trace id.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import DatabaseError, IntegrityError, connection, connections, transaction
from django.db.backends import utils as db_utils
from django.db.transaction import TransactionManagementError
from django.tasks.signals import task_enqueued
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs.drivers.inserts import PLAIN_PARAMS, pg_literal, plain_insert_sql
from django_jobs.drivers.postgresql import observed
from django_jobs.models import Job
from tests import tasks

PG = connection.vendor == "postgresql"
pg_only = pytest.mark.skipif(not PG, reason="the kept, unwrapped insert cursor is PostgreSQL's")
INSERT = "INSERT INTO django_jobs_job"


@pytest.mark.django_db
def test_a_job_enqueued_alone_takes_its_own_id_as_trace_id():
    result = tasks.noop.enqueue()
    assert result.trace_id == uuid.UUID(result.id).hex
    assert Job.objects.get(pk=result.id).trace_id == result.trace_id
    explicit = tasks.noop.using(trace_id="order-17").enqueue()
    assert explicit.trace_id == "order-17"


@pg_only
@pytest.mark.django_db
def test_an_execute_wrapper_alone_sees_the_insert():
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        tasks.noop.enqueue()
    assert len([s for s in seen if INSERT in s]) == 1


@pg_only
@pytest.mark.django_db
def test_the_query_log_alone_sees_the_insert():
    with CaptureQueriesContext(connection) as captured:
        tasks.noop.enqueue()
    assert len([q for q in captured.captured_queries if INSERT in q["sql"]]) == 1


@pg_only
@pytest.mark.django_db
def test_a_tool_that_replaced_django_cursor_execute_sees_the_insert(monkeypatch):
    """APM agents replace ``CursorWrapper.execute``; the insert then goes through it."""
    seen: list[str] = []
    original = db_utils.CursorWrapper.execute

    def traced(self, sql, params=None):
        seen.append(sql)
        return original(self, sql, params)

    tasks.noop.enqueue()  # the cursor is kept from here on
    monkeypatch.setattr(db_utils.CursorWrapper, "execute", traced)
    tasks.noop.enqueue()
    assert len([s for s in seen if INSERT in s]) == 1
    monkeypatch.undo()
    tasks.noop.enqueue()
    assert len([s for s in seen if INSERT in s]) == 1  # Django's own again: unwrapped
    assert Job.objects.count() == 3


@pg_only
@pytest.mark.django_db
def test_an_insert_error_is_django_s_exception_on_the_unwrapped_cursor():
    """The database's refusal arrives as Django's IntegrityError, as through Django's cursor."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_jobs_job ADD CONSTRAINT test_no_add CHECK (task_path <> 'tests.tasks.add')")
    tasks.noop.enqueue()
    assert not observed(connections["default"])  # the unwrapped path
    with pytest.raises(IntegrityError, match="test_no_add"), transaction.atomic():
        tasks.add.enqueue(1, 2)
    tasks.noop.enqueue()  # the connection and the kept cursor still work
    assert sorted(Job.objects.values_list("task_path", flat=True)) == ["tests.tasks.noop"] * 2


@pg_only
@pytest.mark.django_db
def test_an_enqueue_in_a_broken_transaction_raises_as_django_does():
    tasks.noop.enqueue()
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False), connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
        with pytest.raises(TransactionManagementError):
            tasks.noop.enqueue()


@pytest.fixture
def raising_then_recording() -> Iterator[list[str]]:
    """Two task_enqueued receivers: the first raises, the second records each job id (returned)."""
    got: list[str] = []

    def bad(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    def good(sender, task_result, **kwargs):
        got.append(task_result.id)

    task_enqueued.connect(bad)
    task_enqueued.connect(good)
    try:
        yield got
    finally:
        task_enqueued.disconnect(bad)
        task_enqueued.disconnect(good)


def _failures_logged(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "django_jobs.backend" and "raised for job" in r.getMessage() and r.exc_info
    ]


@pytest.mark.django_db(transaction=True)
def test_in_autocommit_task_enqueued_reaches_every_receiver_robustly(raising_then_recording, caplog):
    """A receiver that raises is logged; the next still runs; the job is stored and returned."""
    with caplog.at_level(logging.ERROR):
        result = tasks.noop.enqueue()
    assert raising_then_recording == [result.id]
    assert Job.objects.filter(pk=result.id).exists()
    assert [m for m in _failures_logged(caplog) if result.id in m]


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_reaches_every_receiver_robustly(raising_then_recording, caplog):
    with caplog.at_level(logging.ERROR), transaction.atomic():
        results = tasks.noop.enqueue_many([(), ()])
    assert raising_then_recording == [r.id for r in results]
    assert len(_failures_logged(caplog)) == 2


@pytest.mark.django_db(transaction=True)
def test_in_a_transaction_task_enqueued_waits_for_the_commit():
    got: list[str] = []

    def good(sender, task_result, **kwargs):
        got.append(task_result.id)

    task_enqueued.connect(good)
    try:
        with transaction.atomic():
            result = tasks.noop.enqueue()
            assert got == []
        assert got == [result.id]
        with transaction.atomic():
            tasks.noop.enqueue()
            transaction.set_rollback(True)
        assert got == [result.id]  # rolled back: never sent
    finally:
        task_enqueued.disconnect(good)


@pg_only
@pytest.mark.django_db
@pytest.mark.parametrize("value", ["plain", "it's", "back\\slash", "100%", "%s", "%(x)s", "mix '\\% end", ""])
def test_a_literal_in_the_plain_insert_reads_back_as_written(value):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {pg_literal(value)}, %s", [1])
        assert cursor.fetchone() == (value, 1)


def test_a_nul_character_cannot_become_a_literal():
    with pytest.raises(ValueError, match="NUL"):
        pg_literal("de\x00fault")


@pg_only
@pytest.mark.django_db
def test_a_connection_s_own_make_cursor_or_a_replaced_execute_step_counts_as_watched(monkeypatch):
    conn = connections["default"]
    tasks.noop.enqueue()
    assert not observed(conn)
    monkeypatch.setattr(conn, "make_cursor", conn.make_cursor)  # set on the instance
    assert observed(conn)
    monkeypatch.undo()
    assert not observed(conn)
    for name in ("_execute", "_execute_with_wrappers"):
        original = getattr(db_utils.CursorWrapper, name)
        monkeypatch.setattr(db_utils.CursorWrapper, name, lambda self, *a, _o=original, **k: _o(self, *a, **k))
        assert observed(conn)
        monkeypatch.undo()
    assert not observed(conn)


def test_the_plain_insert_has_one_placeholder_per_parameter():
    for notify, events, guarded in itertools.product(("django_jobs", None), ("django_jobs_events", None), (0, 1)):
        sql = plain_insert_sql("de'fault", notify, events, bool(guarded))
        assert sql.count("%s") == len(PLAIN_PARAMS) + guarded
        assert ("django_jobs_queuestate" in sql) == bool(guarded)
        assert "E'de''fault'" in sql
        assert ("pg_notify(E'django_jobs'" in sql) == (notify is not None)
        assert ("INSERT INTO django_jobs_event" in sql) == (events is not None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("delayed", [False, True], ids=["plain", "general"])
def test_an_enqueue_in_manual_transaction_management_raises_before_inserting(delayed):
    """Autocommit off and no atomic block: Django's on_commit would refuse; nothing is inserted."""
    task = tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)) if delayed else tasks.noop
    transaction.set_autocommit(False)
    try:
        with pytest.raises(TransactionManagementError, match="manual transaction management"):
            task.enqueue()
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert Job.objects.count() == 0


@pg_only
@pytest.mark.django_db(transaction=True)
def test_a_connection_shared_between_threads_gives_each_insert_a_cursor_of_its_own():
    """``inc_thread_sharing()`` (as ``LiveServerTestCase`` does): threads enqueue through one
    connection at once, and each reads its own insert's answer, not another thread's."""
    import threading

    from django_jobs.drivers.postgresql import kept_cursor

    shared = connections["default"]
    tasks.noop.enqueue()
    assert kept_cursor(shared) is not None
    shared.inc_thread_sharing()
    try:
        assert kept_cursor(shared) is None
        results: list = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def enqueue_on_the_shared_connection() -> None:
            connections["default"] = shared
            try:
                barrier.wait(10)
                results.extend(tasks.noop.enqueue() for _ in range(150))
            except BaseException as exc:  # noqa: BLE001 - asserted in the test thread
                errors.append(exc)

        threads = [threading.Thread(target=enqueue_on_the_shared_connection) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        shared.dec_thread_sharing()
    assert not errors, errors
    stored = dict(Job.objects.filter(id__in=[r.id for r in results]).values_list("id", "enqueued_at"))
    assert len(results) == 600 and len(stored) == 600
    assert Job.objects.filter(task_path=results[0].task.module_path).count() == 601, "no job inserted twice"
    assert all(r.enqueued_at == stored[uuid.UUID(r.id)] for r in results), "each result has its own row's time"


def test_the_waiting_result_built_through_the_slots_equals_the_dataclass_s():
    """``_waiting_result`` sets each field through its slot; the result equals the dataclass's."""
    from django_jobs.backend import _NORMALIZED, _READY, _new_result, _waiting_result
    from django_jobs.engine.insert import id_text

    hex_id = uuid.uuid4().hex
    assert id_text(hex_id) == str(uuid.UUID(hex_id))
    now = timezone.now()
    fast = _waiting_result(tasks.add, "default", id_text(hex_id), now, [1], {"b": 2}, "t" * 32)
    token = _NORMALIZED.set(True)
    try:
        slow = _new_result(tasks.add, "default", id_text(hex_id), _READY, now, [1], {"b": 2}, "t" * 32)
    finally:
        _NORMALIZED.reset(token)
    assert fast == slow
    assert (fast.id, fast.enqueued_at, fast.args, fast.kwargs, fast.trace_id) == (
        id_text(hex_id),
        now,
        [1],
        {"b": 2},
        "t" * 32,
    )
    assert fast.errors == [] and fast.errors is not slow.errors

"""``enqueue()``'s plain insert through libpq (``drivers.pg_wire``): in autocommit the statement
goes under psycopg's cursor, prepared under a name of ours; everywhere else the cursor sends it.
Either way the job, its answer and its errors are the ones the cursor path gives."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import override_settings

from django_jobs.drivers import pg_wire, postgresql
from django_jobs.models import Job
from tests import tasks

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="libpq is PostgreSQL's")


@pytest.fixture
def wire() -> Iterator[list[bool | str]]:
    """Records, per call of ``pg_wire.send_plain``, whether it sent the statement ("raised":
    the call raised)."""
    sent: list[bool | str] = []
    original = pg_wire.send_plain

    def recording(*args):
        try:
            answer = original(*args)
        except Exception:
            sent.append("raised")
            raise
        sent.append(answer is not None)
        return answer

    pg_wire.send_plain = recording
    try:
        yield sent
    finally:
        pg_wire.send_plain = original


@pytest.mark.django_db(transaction=True)
def test_an_autocommit_enqueue_goes_through_libpq_and_reads_back_as_the_orm(wire):
    result = tasks.noop.enqueue()
    assert wire == [True]
    stored = Job.objects.get(pk=result.id)
    assert result.enqueued_at == stored.enqueued_at and result.enqueued_at.tzinfo is not None
    assert result.trace_id == stored.trace_id == uuid.UUID(result.id).hex
    assert (stored.state, stored.task_path, stored.queue) == ("waiting", "tests.tasks.noop", "default")


@pytest.mark.django_db(transaction=True)
def test_arguments_and_options_reach_the_row_through_libpq(wire):
    result = tasks.add.using(priority=7).enqueue(1, b=["é", {"x": None}])
    assert wire == [True]
    stored = Job.objects.get(pk=result.id)
    assert (stored.args, stored.kwargs, stored.priority) == ([1], {"b": ["é", {"x": None}]}, 7)


@pytest.mark.django_db(transaction=True)
def test_without_use_tz_the_enqueue_time_is_the_orm_s_naive_one(wire):
    with override_settings(USE_TZ=False):
        result = tasks.noop.enqueue()
        stored = Job.objects.get(pk=result.id)
        assert result.enqueued_at == stored.enqueued_at and result.enqueued_at.tzinfo is None
    assert wire == [True]


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_the_cursor_sends_it_and_a_rollback_takes_the_job_back(wire):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.noop.enqueue()
        raise RuntimeError("roll back")
    assert wire == [False]
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["DEALLOCATE ALL", "DISCARD ALL"])
def test_a_statement_the_server_no_longer_has_is_prepared_again(wire, how, caplog):
    """psycopg sends DEALLOCATE ALL after a rollback or DDL when it holds prepared statements of
    its own, which takes ours too: the next enqueue prepares it again and inserts one job."""
    tasks.noop.enqueue()
    with connection.cursor() as cursor:
        cursor.execute(how)
    with caplog.at_level(logging.WARNING, logger="django_jobs.db"):
        tasks.noop.enqueue()
        tasks.noop.enqueue()
    assert wire == [True, True, True]
    assert Job.objects.count() == 3
    assert not postgresql._refused_by_pooler and not caplog.records


@pytest.mark.django_db(transaction=True)
def test_a_statement_gone_twice_in_a_row_is_a_pooler_and_the_cursor_sends_it_unprepared(monkeypatch, wire, caplog):
    """A pooler in transaction mode: a statement prepared on one server connection is unknown on
    the next. The enqueue still inserts its job once, unprepared, and this process stops preparing."""
    monkeypatch.setattr(postgresql, "_refused_by_pooler", False)
    monkeypatch.setattr(pg_wire, "_prepared", lambda conn, sql, kinds, again: b"_django_jobs_never_prepared")
    with caplog.at_level(logging.WARNING, logger="django_jobs.db"):
        result = tasks.noop.enqueue()
    assert wire == ["raised"]  # and the cursor sent it
    assert list(Job.objects.values_list("id", flat=True)) == [uuid.UUID(result.id)]
    assert postgresql._refused_by_pooler
    assert "refused a prepared statement" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_an_error_through_libpq_is_django_s_exception_and_the_connection_goes_on(wire):
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_jobs_job ADD CONSTRAINT test_no_add CHECK (task_path <> 'tests.tasks.add')")
    try:
        with pytest.raises(IntegrityError, match="test_no_add"):
            tasks.add.enqueue(1, 2)
        tasks.noop.enqueue()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE django_jobs_job DROP CONSTRAINT test_no_add")
    assert wire == ["raised", True]
    assert list(Job.objects.values_list("task_path", flat=True)) == ["tests.tasks.noop"]


@pytest.mark.django_db(transaction=True)
def test_a_parameter_of_a_type_it_does_not_know_leaves_the_statement_to_the_cursor():
    connection.ensure_connection()
    raw = connection.connection
    assert pg_wire.send_plain(raw, "SELECT %s::text", [True]) is None
    assert pg_wire.send_plain(raw, "SELECT %s::text", [1.5]) is None
    assert pg_wire.send_plain(raw, "SELECT %s::text", ["ok"]) == (True, "ok")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "value",
    [datetime(2026, 6, 1, 12, 0, 0, 250_000), datetime(2026, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=-5)))],
    ids=["naive", "aware"],
)
def test_a_time_reaches_the_server_as_psycopg_sends_it_whatever_the_session_zone(value):
    """A naive time is read in the session's zone, an aware one at its offset, as psycopg's
    dumpers have them."""
    connection.ensure_connection()
    raw = connection.connection
    sql = "SELECT to_json(%s::timestamptz) #>> '{}'"
    try:
        raw.execute("SET TIME ZONE 'Europe/Paris'")
        wire = pg_wire.send_plain(raw, sql, [value])
        cursor = raw.execute(sql, [value]).fetchone()[0]
    finally:
        raw.execute("SET TIME ZONE 'UTC'")
    assert wire == (True, cursor)


def test_placeholders_become_numbered_and_doubled_percent_signs_single():
    assert pg_wire._numbered("SELECT %s, '100%%', %s || E'%%s'") == b"SELECT $1, '100%', $2 || E'%s'"

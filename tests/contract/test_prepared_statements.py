"""The hot statements (insert, claim, outcome batch, enqueue_many) are prepared on PostgreSQL
with a generic plan, and not at all with PREPARED_STATEMENTS off (a PgBouncer before 1.21)."""

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test import override_settings

from django_jobs import engine
from django_jobs.drivers.postgresql import _outcomes_json
from django_jobs.models import Job
from tests import tasks
from tests.factories import claim, record

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"),
]


def prepared() -> dict[str, tuple[int, int]]:
    """{statement text: (generic plans, custom plans)} of this connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


def drain_one_by_one(n: int) -> None:
    for _ in range(n):
        tasks.noop.enqueue()
        [job] = claim(limit=1, worker_id="w")
        assert record(job, queue=job.queue) == {job.id: "completed"}


def test_the_hot_statements_are_prepared_once_and_planned_generically():
    connection.close()  # a connection of its own: nothing prepared yet
    drain_one_by_one(8)
    tasks.noop.enqueue_many(() for _ in range(3))
    statements = prepared()
    insert = [s for s in statements if s.startswith("WITH new_job AS (INSERT INTO django_jobs_job")]
    claim = [s for s in statements if "SET state = 'active'" in s]
    outcome = [s for s in statements if "jsonb_array_elements" in s and "UPDATE django_jobs_job" in s]
    many = [s for s in statements if "jsonb_array_elements" in s and "INSERT INTO django_jobs_job" in s]
    assert len(insert) == len(claim) == len(outcome) == len(many) == 1, list(statements)
    # Eight runs of one text: one statement; the worker's claim and outcome batch planned once
    # (force_generic_plan), never re-planned.
    for text in (claim[0], outcome[0]):
        generic, custom = statements[text]
        assert (generic, custom) == (8, 0), (text[:60], generic, custom)
    assert sum(statements[insert[0]]) == 8
    assert Job.objects.filter(state="completed").count() == 8


def test_with_the_setting_off_nothing_is_prepared():
    connection.close()
    with override_settings(DJANGO_JOBS={"PREPARED_STATEMENTS": False}):
        drain_one_by_one(3)
        tasks.noop.enqueue_many(() for _ in range(3))
    assert prepared() == {}
    assert Job.objects.filter(state="completed").count() == 3


def test_the_generic_plan_setting_is_set_by_the_worker_statements_in_autocommit_only():
    from django.db import transaction

    connection.close()
    with transaction.atomic():  # a claim inside a transaction that rolls back does not set it
        tasks.noop.enqueue()
        engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w", lease_seconds=30)
        transaction.set_rollback(True)
    tasks.noop.enqueue()  # nor does an insert, which runs on the project's connections
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "auto"
    drain_one_by_one(2)
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "force_generic_plan"


def test_the_worker_statements_are_never_jit_compiled():
    # A generic plan is priced without its LIMIT's value: on a backlog of some 40,000 jobs the
    # claim's estimate passed jit_above_cost and JIT compiled every claim (20-30 ms each, a
    # 100,000-job drain at a tenth of its speed). The worker's connections turn JIT off.
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SET jit_above_cost = 0")  # as a large backlog's estimate would pass it
        cursor.execute("SHOW jit")
        server_jit = cursor.fetchone()[0]
    drain_one_by_one(2)
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"
        cursor.execute("SELECT pg_jit_available()")
        if server_jit == "on" and cursor.fetchone()[0]:  # the claim would have been compiled
            cursor.execute("SET jit = on")
            cursor.execute("EXPLAIN (ANALYZE) SELECT count(*) FROM django_jobs_job WHERE state = 'waiting'")
            assert any(row[0].startswith("JIT:") for row in cursor.fetchall())


def test_djangos_own_statements_stay_unprepared_and_uncounted():
    connection.close()
    drain_one_by_one(2)
    raw = connection.connection
    assert raw.prepare_threshold is None, "Django's setting is back after each of ours"
    for _ in range(6):
        Job.objects.filter(state="completed").count()  # Django's cursor: never prepared
    texts = prepared()
    assert not [t for t in texts if "__count" in t], list(texts)


def test_a_pooler_refusing_prepared_statements_makes_the_process_send_them_unprepared(monkeypatch, caplog):
    from django_jobs.drivers import postgresql as db

    connection.close()
    drain_one_by_one(1)  # the claim and the outcome batch are prepared on this connection
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a pooler's next server connection looks like
    monkeypatch.setattr(db, "_refused_by_pooler", False)
    drain_one_by_one(2)  # the claim refused ("does not exist"), sent again unprepared: it runs
    assert db._refused_by_pooler is True
    assert "refused a prepared statement" in caplog.text
    assert Job.objects.filter(state="completed").count() == 3


def test_the_outcome_batch_reads_its_jobs_through_the_primary_key_whatever_the_statistics_say():
    # The statistics were taken with no job active (autovacuum's usual picture of a queue that
    # drains): the generic plan read every active job through django_jobs_active_idx and hashed
    # them, a cost that grows with the jobs the workers hold, not with the batch.
    connection.close()
    tasks.noop.enqueue_many(() for _ in range(2000))  # enough rows that a plan reads an index
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_jobs_job")
    jobs = claim(limit=5, worker_id="w")
    assert record(jobs[0], queue=jobs[0].queue) == {jobs[0].id: "completed"}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, cardinality(parameter_types) FROM pg_prepared_statements "
            "WHERE statement LIKE '%jsonb_array_elements%' AND statement LIKE '%UPDATE django_jobs_job%'"
        )
        [(name, n)] = cursor.fetchall()
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"EXPLAIN EXECUTE {name}({', '.join(['NULL'] * n)})")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET plan_cache_mode")
    assert "django_jobs_job_pkey" in plan and "django_jobs_active_idx" not in plan, plan


def test_claims_and_outcomes_read_the_times_django_reads():
    """The worker's statements load timestamps with psycopg's native loader on a UTC session:
    the values and their zone are those the ORM gives for the same row."""
    import datetime as dt

    tasks.noop.enqueue()
    [job] = claim(limit=1, worker_id="w")
    row = Job.objects.get(pk=job.id)
    for name in ("enqueued_at", "started_at", "last_attempted_at", "available_at"):
        value = getattr(job, name)
        assert value == getattr(row, name), name
        assert value.tzinfo is dt.UTC and getattr(row, name).tzinfo is dt.UTC, name
    record(job, queue=job.queue)
    assert Job.objects.get(pk=job.id).state == "completed"


def test_the_outcome_batch_parameter_reads_back_as_the_values_given():
    """The batch travels as JSON text: ids as 32 hex digits, timestamps as ISO text made once per
    value; PostgreSQL must read back exactly what the worker meant, microseconds and all."""
    job_id, token = uuid.uuid4(), uuid.uuid4()
    purge = datetime(2026, 12, 4, 9, 52, 23, 693366, tzinfo=UTC)
    elsewhere = purge.astimezone(timezone(timedelta(hours=5, minutes=30)))  # the same instant
    text = _outcomes_json([[job_id, token, "completed", "null", None, elsewhere, 0, None, purge, purge, 1.5]])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (e->>0)::uuid, (e->>1)::uuid, (e->>5)::timestamptz, (e->>8)::timestamptz, "
            "(e->>9)::timestamptz, (e->>10)::float FROM jsonb_array_elements(%s::jsonb) e",
            [text],
        )
        assert cursor.fetchall() == [(job_id, token, purge, purge, purge, 1.5)]

"""The job table's checks on PostgreSQL are domain types of its columns, not table CHECKs
(migration 0019): PostgreSQL 15 plans a table's CHECKs again for every INSERT and UPDATE, a
domain's once per connection. The values refused are the same on every database
(tests/contract/test_engine.py::test_check_constraints_reject_out_of_range_values and the
counters below)."""

from __future__ import annotations

import importlib

import pytest
from django.db import DataError, IntegrityError, connection, transaction

from django_jobs.models import Job
from tests.factories import insert_job as make_job
from tests.factories import job_row

pytestmark = pytest.mark.django_db

MIGRATION = importlib.import_module("django_jobs.migrations.0019_checks_as_domains")
on_postgresql = pytest.mark.skipif(connection.vendor != "postgresql", reason="domains are PostgreSQL's")


def _fetch(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


@on_postgresql
def test_the_job_table_has_no_table_check():
    """A later migration that brings a table CHECK back (Django's AlterField of one of these
    columns would) makes every enqueue plan it again."""
    assert (
        _fetch("SELECT conname FROM pg_constraint WHERE conrelid = 'django_jobs_job'::regclass AND contype = 'c'") == []
    )


@on_postgresql
def test_each_checked_column_has_its_domain_as_the_migration_made_it():
    types = dict(
        _fetch(
            "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = 'django_jobs_job'::regclass AND a.attnum > 0"
        )
    )
    assert {column: types[column] for column in MIGRATION.COLUMNS} == {
        column: domain for column, (domain, _) in MIGRATION.COLUMNS.items()
    }
    found = dict(
        _fetch(
            "SELECT t.typname, format_type(t.typbasetype, t.typtypmod) || ' ' || pg_get_constraintdef(c.oid) "
            "FROM pg_type t JOIN pg_constraint c ON c.contypid = t.oid WHERE t.typname LIKE 'django_jobs_%'"
        )
    )
    assert set(found) == set(MIGRATION.DOMAINS)
    assert found["django_jobs_state"].startswith("character varying(20) CHECK")
    for state in ("waiting", "delayed", "active", "completed", "failed", "waiting-children", "cancelled"):
        assert f"'{state}'" in found["django_jobs_state"]
    assert found["django_jobs_priority"] == "smallint CHECK (((VALUE >= '-100'::integer) AND (VALUE <= 100)))"
    assert found["django_jobs_max_attempts"] == "integer CHECK ((VALUE >= 1))"
    assert found["django_jobs_count"] == "integer CHECK ((VALUE >= 0))"


@pytest.mark.parametrize("column", ["attempts", "stalled_count", "pending_children"])
def test_a_counter_below_zero_is_refused(column):
    """MariaDB/MySQL store the counters unsigned: there the refusal is an out-of-range DataError."""
    job = make_job()
    with pytest.raises((IntegrityError, DataError)), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE django_jobs_job SET {column} = -1 WHERE id = %s",
            [Job._meta.pk.get_db_prep_value(job.id, connection)],
        )
    assert getattr(job_row(job.id), column) == 0


def test_the_values_at_the_bounds_are_stored():
    job = make_job()
    Job.objects.filter(id=job.id).update(priority=-100, max_attempts=1, attempts=0, state="waiting-children")
    row = job_row(job.id)
    assert (row.priority, row.max_attempts, row.attempts, row.state) == (-100, 1, 0, "waiting-children")


@on_postgresql
@pytest.mark.parametrize(
    ("where", "index"),
    [
        (
            "queue = 'q' AND partition_key = 'p' AND state IN ('waiting', 'delayed', 'active', 'waiting-children')",
            "django_jobs_unfinished_idx",
        ),
        (
            "queue = 'q' AND blocked AND state IN ('waiting', 'delayed', 'active', 'waiting-children')",
            "django_jobs_blocked_idx",
        ),
        ("queue = 'q' AND state IN ('completed', 'failed', 'cancelled')", "django_jobs_finished_q_idx"),
        ("state = 'active' AND lease_expires_at < now()", "django_jobs_active_idx"),
        ("state = 'waiting' AND NOT blocked AND queue = 'q'", "django_jobs_ready_queue_idx"),
    ],
)
def test_the_partial_indexes_still_match_their_queries_over_the_domain_columns(where, index):
    """Changing a column's type to a domain made PostgreSQL rebuild the conditions of the
    partial indexes that name it (``ARRAY[...]::text[]`` became ``ARRAY[(...)::text, ...]``):
    a query spelled as the engine spells it must still be proved to fall inside each one."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN SELECT id FROM django_jobs_job WHERE {where}")
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert f"using {index} " in plan, plan

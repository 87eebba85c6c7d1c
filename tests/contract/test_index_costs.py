"""Pay for what you use, in index entries: which partial indexes of the job table a row is in,
read from the real schema (each index's own condition evaluated against the row), for a plain
job in each state and for the jobs of the features that own an index; and that the counts those
indexes serve (a queue's size, its per-state counts) still see every unfinished job, partitioned
ones waiting for their turn included.

PostgreSQL and SQLite (MySQL/MariaDB build no partial index: every index holds every row there).
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest
from django.db import connection

import django_jobs
from django_jobs import QueueFull, flow
from django_jobs.drivers import driver
from django_jobs.models import Job
from tests import factories, tasks_limits

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor == "mysql", reason="MySQL/MariaDB have no partial indexes"),
]

claim = partial(factories.claim, limit=10, worker_id="w")
LATER = timedelta(hours=1)


def _job_indexes() -> dict[str, str | None]:
    """``{index name: its condition, or None}`` of the job table's indexes, from the catalog."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'django_jobs_job'::regclass"
            )
            return dict(cursor.fetchall())
        cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'django_jobs_job'")
        out = {}
        for name, sql in cursor.fetchall():
            _, _, condition = (sql or "").partition(" WHERE ")
            out[name] = condition or None
        return out


def partial_indexes_of(result) -> set[str]:
    """The partial indexes of the job table whose condition the row of ``job_id`` meets: the
    partial indexes it has an entry in. ``result``: a TaskResult or a claimed job."""
    job_id = Job.objects.get(id=result.id).id
    hit = set()
    with connection.cursor() as cursor:
        for name, condition in _job_indexes().items():
            if condition is None:
                continue
            key = job_id.hex if connection.vendor == "sqlite" else job_id
            cursor.execute(f"SELECT 1 FROM django_jobs_job WHERE id = %s AND ({condition})", [key])
            if cursor.fetchone():
                hit.add(name)
    return hit


def test_a_plain_job_is_in_only_the_partial_indexes_of_its_state():
    task = tasks_limits.quick.using(queue_name="plain")
    waiting = task.enqueue()
    assert partial_indexes_of(waiting) == {"django_jobs_ready_idx", "django_jobs_ready_queue_idx"}
    [running] = claim(queues=["plain"])
    assert partial_indexes_of(running) == {"django_jobs_active_idx"}
    delayed = task.using(run_after=LATER).enqueue()
    assert partial_indexes_of(delayed) == {"django_jobs_delayed_idx", "django_jobs_delayed_q_idx"}


def test_the_partition_index_holds_partitioned_jobs_only():
    task = tasks_limits.quick.using(queue_name="parts")
    assert "django_jobs_unfinished_idx" in partial_indexes_of(task.using(partition="p").enqueue())
    assert "django_jobs_unfinished_idx" not in partial_indexes_of(task.enqueue())


def test_a_flow_parent_waiting_for_its_children_is_in_the_parent_wait_index():
    in_q = tasks_limits.quick.using(queue_name="flows")
    parent = flow(in_q, children=[flow(in_q)]).enqueue()
    assert Job.objects.get(id=parent.id).state == "waiting-children"
    assert partial_indexes_of(parent) == {"django_jobs_parent_wait_idx"}


def test_a_queue_s_size_and_counts_see_every_part_of_the_unfinished_jobs():
    """Each part of states.UNFINISHED_PARTS, a blocked partitioned job included, takes room."""
    q = django_jobs.queue("sized")
    task = tasks_limits.quick.using(queue_name="sized")
    task.using(partition="p").enqueue()  # the partition's head: waiting, ready
    task.using(partition="p").enqueue()  # waiting for its turn: blocked
    task.enqueue()  # waiting, claimed next
    [_running] = claim(queues=["sized"], limit=1)
    task.using(run_after=LATER).enqueue()  # delayed
    flow(task, children=[flow(task)]).enqueue()  # waiting-children, and its waiting child
    assert Job.objects.filter(queue="sized", blocked=True).count() == 1
    assert q.counts() == {"waiting": 3, "delayed": 1, "active": 1, "waiting-children": 1}
    q.set_max_size(6)
    with pytest.raises(QueueFull, match="6 unfinished job"):
        task.enqueue()
    q.set_max_size(7)
    task.enqueue()
    with pytest.raises(QueueFull, match="7 unfinished job"):
        task.enqueue()


def _full_scans(sql: str, params: list | tuple = ()) -> list[str]:
    """The plan lines of ``sql`` that read the whole job table (with sequential scans priced
    out on PostgreSQL, so a plan that has an index to use takes it whatever the statistics)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + sql, params)
            return [row[0] for row in cursor.fetchall() if "Seq Scan on django_jobs_job" in row[0]]
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        lines = [row[-1] for row in cursor.fetchall()]
        return [line for line in lines if line.startswith("SCAN django_jobs_job") and "INDEX" not in line]


class _Recorder:
    """A cursor that keeps what is executed on it and answers a count of 0."""

    def __init__(self):
        self.executed = []

    def execute(self, sql, params):
        self.executed.append((sql, params))

    def fetchone(self):
        return (0,)


def test_a_queue_s_size_and_counts_read_partial_indexes_only():
    """The reads of a queue's size (max_size), its counts (admin, console) and the admin's
    choices: no statement reads the whole job table, whose finished history grows unbounded."""
    tasks_limits.quick.using(queue_name="scanned").enqueue()
    size = _Recorder()
    driver("default").queue_size(size, "scanned", 100)
    reads = []  # as executed: placeholders and parameters (SQLite plans differ for literals)

    def keep(execute, sql, params, many, context):
        reads.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        Job.objects.unfinished_by_queue("default")
        Job.objects.unfinished_by_task("default", "scanned")
        Job.objects.unfinished_values()
        Job.objects.filter(queue="no such queue").has_unfinished()  # all five parts asked
    statements = [*size.executed, *reads]
    assert len(statements) == 1 + 3 + 5
    for sql, params in statements:
        assert _full_scans(sql, params) == [], sql

"""A plain job pays nothing for the size limits and the flows it does not use (issue 13).

* Its INSERT reads no queue row: each process keeps the names of the queues with a size limit
  for ``SIZE_LIMITS_REFRESH`` seconds (engine.size_limits) and forgets them when it writes a
  QueueState row. A queue known to be limited is admitted under its lock, where the limits are
  read anew, so only a queue's first limit, set in another process, waits for the refresh.
* The job table has no foreign key (``parent_id``): its check fired at every commit, a NULL
  included. The engine checks a child's parent itself; deletes unlink children (Django's
  collector through the ORM, the engine before its raw deletes: test_retention.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

import django_jobs
from django_jobs import QueueFull, flow
from django_jobs.engine import size_limits
from django_jobs.models import Job, QueueState
from django_jobs.queues import sync_queues
from tests import tasks
from tests.conftest import ROOT, subprocess_env

QUEUE_TABLE = QueueState._meta.db_table


def refresh(seconds: float):
    return override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, "SIZE_LIMITS_REFRESH": seconds})


def queue_reads(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if QUEUE_TABLE in q["sql"]]


def unfinished(queue: str) -> int:
    return Job.objects.filter(queue=queue).count()


@pytest.mark.django_db
def test_a_plain_enqueue_to_a_queue_without_a_size_limit_reads_no_queue_row():
    django_jobs.queue("sl-other").set_max_size(10)  # a limited queue elsewhere changes nothing
    task = tasks.noop.using(queue_name="sl-plain")
    task.enqueue()  # this process reads the limited queues' names, at most once per refresh
    with CaptureQueriesContext(connection) as captured:
        for _ in range(3):
            task.enqueue()
    assert len(captured.captured_queries) >= 3
    assert queue_reads(captured) == []
    assert unfinished("sl-plain") == 4


@pytest.mark.django_db
def test_with_no_refresh_every_enqueue_probes_its_queue_row():
    task = tasks.noop.using(queue_name="sl-probe")
    with refresh(0), CaptureQueriesContext(connection) as captured:
        for _ in range(3):
            task.enqueue()
    assert len(queue_reads(captured)) == 3
    assert unfinished("sl-probe") == 3


def _via_api(queue: str, n: int) -> None:
    django_jobs.queue(queue).set_max_size(n)


def _via_orm(queue: str, n: int) -> None:  # what the admin's change form does
    row, _ = QueueState.objects.get_or_create(name=queue)
    row.max_size = n
    row.save()


def _via_settings(queue: str, n: int) -> None:
    sync_queues(using="default", declared={queue: {"max_size": n}})


@pytest.mark.django_db
@pytest.mark.parametrize("set_limit", [_via_api, _via_orm, _via_settings], ids=["api", "orm", "declared"])
def test_a_limit_set_in_this_process_holds_for_its_next_enqueue(set_limit):
    task = tasks.noop.using(queue_name="sl-here")
    with refresh(3600):
        task.enqueue()  # read: no queue is limited
        set_limit("sl-here", 1)
        with pytest.raises(QueueFull):
            task.enqueue()
        with pytest.raises(QueueFull):
            task.using(priority=5).enqueue()  # the general path too
    assert unfinished("sl-here") == 1


SET_MAX_SIZE = """
import sys
import django
django.setup()
import django_jobs
django_jobs.queue(sys.argv[1]).set_max_size(None if sys.argv[2] == "none" else int(sys.argv[2]))
"""


def set_max_size_elsewhere(queue: str, n: int | None) -> None:
    """Another process sets the limit: this one gets no signal of it."""
    subprocess.run(
        [sys.executable, "-c", SET_MAX_SIZE, queue, "none" if n is None else str(n)],
        cwd=ROOT, env=subprocess_env(), check=True, timeout=60,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("seconds", [0, 0.5], ids=["no-refresh", "after-the-refresh"])
def test_a_first_limit_set_by_another_process_holds(seconds):
    """With no refresh at once (the INSERT probes); else once the names are read again (the
    other process takes longer than the refresh to start)."""
    task = tasks.noop.using(queue_name=f"sl-first-{seconds}")
    with refresh(seconds):
        task.enqueue()  # read now, where there is a refresh: the queue has no limit
        set_max_size_elsewhere(f"sl-first-{seconds}", 1)
        with pytest.raises(QueueFull):
            task.enqueue()
    assert unfinished(f"sl-first-{seconds}") == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_limit_raised_or_removed_by_another_process_holds_at_once():
    """A queue known to be limited is admitted under its lock, which reads the limits anew."""
    task = tasks.noop.using(queue_name="sl-known")
    with refresh(3600):
        django_jobs.queue("sl-known").set_max_size(1)
        task.enqueue()
        with pytest.raises(QueueFull):
            task.enqueue()
        set_max_size_elsewhere("sl-known", 2)
        task.enqueue()
        with pytest.raises(QueueFull):
            task.enqueue()
        set_max_size_elsewhere("sl-known", None)
        for _ in range(3):
            task.enqueue()
    assert unfinished("sl-known") == 5


@pytest.mark.django_db
def test_a_read_that_a_write_overtook_is_not_kept(monkeypatch):
    """A QueueState write in this process while another thread reads the names: the read may
    predate the write, so it answers its own enqueue but is not kept for the next one."""
    size_limits.forget()
    django_jobs.queue("sl-race").set_max_size(3)
    cursor = connection.cursor

    def overtaken():
        size_limits.forget(connection.alias)  # the write's post_save, between read and keep
        return cursor()

    monkeypatch.setattr(connection, "cursor", overtaken)
    assert size_limits.size_limited(connection, "sl-race", 60) is True
    assert connection.alias not in size_limits._read
    monkeypatch.undo()
    assert size_limits.size_limited(connection, "sl-race", 60) is True
    assert "sl-race" in size_limits._read[connection.alias][1]
    assert size_limits.size_limited(connection, "sl-race", 0) is None


@pytest.mark.django_db
def test_the_job_table_has_no_foreign_key():
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    assert [name for name, c in constraints.items() if c["foreign_key"]] == []


@pytest.mark.django_db
def test_deleting_a_parent_through_the_orm_unlinks_its_children():
    root = flow(tasks.noop, children=[flow(tasks.noop)]).enqueue()
    child = Job.objects.get(parent_id=root.id)
    Job.objects.filter(id=root.id).delete()
    assert Job.objects.get(id=child.id).parent_id is None

"""``manage.py jobs``: status, list, show, retry, cancel, pause, resume, with clear errors."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import django_jobs
from django_jobs.models import Job
from django_jobs.testing import drain_queue
from tests import tasks


def jobs(*args: str) -> str:
    out = io.StringIO()
    call_command("jobs", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_status_counts_unfinished_jobs_per_queue_with_flags_and_limits():
    tasks.noop.using(queue_name="emails").enqueue()
    tasks.noop.using(queue_name="emails").enqueue()
    tasks.noop.using(queue_name="reports").enqueue()
    q = django_jobs.queue("emails")
    q.pause()
    q.set_concurrency(3)
    q.set_rate_limit(20, 1)
    out = jobs("status")
    emails = next(line for line in out.splitlines() if line.startswith("emails"))
    fields = emails.split()
    assert fields[:8] == ["emails", "2", "0", "0", "0", "0", "0", "0"]
    assert fields[-3:] == ["yes", "3", "20/1s"] and fields[-4].endswith("s"), "oldest wait, then the flags"
    reports = next(line for line in out.splitlines() if line.startswith("reports"))
    assert reports.split()[:8] == ["reports", "1", "0", "0", "0", "0", "0", "0"]
    drain_queue("reports")
    after = next(line for line in jobs("status").splitlines() if line.startswith("reports"))
    assert after.split()[:7] == ["reports", "0", "0", "0", "0", "1", "0"], "one done in the last hour, none waiting"
    assert "No live workers." in jobs("status")


@pytest.mark.django_db
def test_list_filters_and_show_prints_errors_and_arguments():
    ok = tasks.add.enqueue(2, 3)
    bad = tasks.always_fails.enqueue("<boom>")
    drain_queue()
    listed = jobs("list", "--state", "failed")
    assert bad.id in listed and ok.id not in listed
    assert ok.id in jobs("list", "--task", "tests.tasks.add")
    shown = jobs("show", bad.id)
    assert "state       failed" in shown and '"<boom>"' in shown and "ValueError: <boom>" in shown
    assert "result      5" in jobs("show", ok.id)
    with pytest.raises(CommandError, match="Unknown state 'nope'"):
        jobs("list", "--state", "nope")


@pytest.mark.django_db
def test_retry_and_cancel_act_and_unknown_ids_exit_with_an_error():
    bad = tasks.always_fails.enqueue("x")
    drain_queue()
    waiting = tasks.noop.enqueue()
    out = jobs("retry", bad.id)
    assert f"{bad.id}: re-queued" in out
    assert Job.objects.get(id=bad.id).state == "waiting"
    jobs("cancel", waiting.id)
    assert Job.objects.get(id=waiting.id).state == "cancelled"
    missing = str(uuid.uuid4())
    with pytest.raises(CommandError, match="1 of 2 job"):
        jobs("cancel", missing, bad.id)
    assert Job.objects.get(id=bad.id).state == "cancelled", "the known one is still acted on"
    with pytest.raises(CommandError, match="No job with id 'not-an-id'"):
        jobs("show", "not-an-id")


@pytest.mark.django_db
def test_pause_and_resume_a_queue_and_reject_a_bad_name():
    jobs("pause", "emails")
    assert django_jobs.queue("emails").is_paused
    jobs("resume", "emails")
    assert not django_jobs.queue("emails").is_paused
    with pytest.raises(CommandError, match="Invalid queue name 'bad name!'"):
        jobs("pause", "bad name!")
    with pytest.raises(CommandError, match="not a django-jobs backend"):
        jobs("--backend", "nope", "status")


@pytest.mark.django_db
def test_list_filters_like_the_admin_by_priority_trace_partition_and_enqueue_time():
    high = tasks.noop.using(priority=5, queue_name="emails").enqueue()
    traced = tasks.noop.using(trace_id="pipeline-7", partition="customer-1").enqueue()
    assert jobs("list", "--priority", "5").count(high.id) == 1 and traced.id not in jobs("list", "--priority", "5")
    assert traced.id in jobs("list", "--trace", "pipeline-7") and high.id not in jobs("list", "--trace", "pipeline-7")
    assert traced.id in jobs("list", "--partition", "customer-1")
    assert "No jobs match." in jobs("list", "--since", "2999-01-01T00:00")
    assert high.id in jobs("list", "--until", "2999-01-01T00:00+00:00")
    with pytest.raises(CommandError, match="ISO 8601"):
        jobs("list", "--since", "yesterday")

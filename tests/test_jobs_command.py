"""``manage.py jobs``: status, list, show, retry, cancel, pause, resume, with clear errors."""

from __future__ import annotations

import io
import re
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

import django_jobs
from django_jobs.models import Job
from django_jobs.testing import drain_queue
from tests import tasks
from tests.factories import claim, insert_job, record


def jobs(*args: str) -> str:
    out = io.StringIO()
    call_command("jobs", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def rows(out: str) -> list[dict[str, str]]:
    """The rows of a table the command printed, as ``{column: cell}`` (cells are left-aligned
    under their header; a header such as "runs at" has single spaces, columns two)."""
    head, _rule, *body = out.splitlines()
    starts = [(m.start(), m.group()) for m in re.finditer(r"\S(?:\S| (?! ))*", head)]
    ends = [start for start, _ in starts[1:]] + [None]
    return [{name: line[start:end].strip() for (start, name), end in zip(starts, ends, strict=True)} for line in body]


def utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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


@pytest.mark.django_db
def test_show_says_when_a_delayed_job_runs_to_the_second_with_its_zone_and_how_far_from_now():
    later = tasks.noop.using(run_after=timedelta(days=2, minutes=30)).enqueue()
    fixed = tasks.noop.using(run_after=datetime(2031, 1, 15, 6, 0, 3, 750000, tzinfo=UTC)).enqueue()
    row = Job.objects.get(id=later.id)
    assert row.state == "delayed"
    assert f"runs at     {utc(row.available_at)} (in 2d00h)" in jobs("show", later.id)
    shown = jobs("show", fixed.id)
    assert re.search(r"^runs at     2031-01-15 06:00:03 UTC \(in \d+d\d\dh\)$", shown, re.M), shown
    with timezone.override("Asia/Kolkata"):  # UTC+05:30, no summer time
        assert "runs at     2031-01-15 11:30:03 IST (in " in jobs("show", fixed.id)
    overdue = insert_job(now=timezone.now() - timedelta(hours=4), run_after=timezone.now() - timedelta(hours=3))
    assert overdue.state == "delayed", "not promoted yet"
    assert re.search(r"^runs at     .+ UTC \(due 3h00m ago\)$", jobs("show", str(overdue.id)), re.M)
    waiting = tasks.noop.enqueue()
    assert "runs at" not in jobs("show", waiting.id), "only a delayed job waits for a time"


@pytest.mark.django_db
def test_list_shows_priority_and_the_run_at_of_delayed_jobs_in_the_same_format_as_show():
    delayed = tasks.noop.using(priority=7, run_after=datetime(2031, 1, 15, 6, 0, 3, tzinfo=UTC)).enqueue()
    waiting = tasks.noop.using(priority=-3).enqueue()
    by_id = {r["id"]: r for r in rows(jobs("list"))}
    assert list(by_id[delayed.id]) == ["id", "task", "queue", "state", "priority", "attempts", "enqueued", "runs at"]
    assert by_id[delayed.id]["priority"] == "7" and by_id[delayed.id]["state"] == "delayed"
    assert by_id[delayed.id]["runs at"] == "2031-01-15 06:00:03 UTC"
    assert by_id[waiting.id]["priority"] == "-3" and by_id[waiting.id]["runs at"] == ""
    enqueued = Job.objects.get(id=waiting.id).enqueued_at
    assert by_id[waiting.id]["enqueued"] == utc(enqueued)
    assert f"enqueued    {utc(enqueued)}" in jobs("show", waiting.id), "one format in list and show"
    with timezone.override("Asia/Kolkata"):
        assert rows(jobs("list", "--state", "delayed"))[0]["runs at"] == "2031-01-15 11:30:03 IST"


@pytest.mark.django_db
def test_djangos_common_options_are_taken_after_every_subcommand_as_before_it():
    assert jobs("pause", "emails") == "Queue 'emails' paused: running jobs finish, no new one starts.\n"
    assert jobs("resume", "emails", "-v", "0") == "", "-v 0 leaves out the confirmation"
    assert jobs("-v", "0", "pause", "emails") == "", "and the subcommand keeps what was given before it"
    assert jobs("resume", "emails", "--verbosity", "1") == "Queue 'emails' resumed.\n"
    waiting = tasks.noop.enqueue()
    assert jobs("cancel", waiting.id, "-v", "0") == "" and Job.objects.get(id=waiting.id).state == "cancelled"
    for action in (["status"], ["list"], ["show", waiting.id], ["retry", waiting.id], ["pause", "q"], ["prune"]):
        jobs(*action, "--traceback", "--no-color", "--skip-checks", "--settings", "tests.settings", "--pythonpath", ".")
    with pytest.raises(CommandError, match="--no-color and --force-color options can't be used together"):
        jobs("--force-color", "list", "--no-color")
    with pytest.raises(CommandError, match="argument -v/--verbosity: invalid choice"):
        jobs("status", "-v", "7")
    with pytest.raises(CommandError, match="unrecognized arguments: --nope"):
        jobs("status", "--nope")


@pytest.mark.django_db
@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_status_watch_refuses_an_interval_that_is_not_a_positive_number_of_seconds(seconds):
    with pytest.raises(CommandError, match=r"--watch must be a number of seconds > 0; got"):
        jobs("status", "--watch", seconds)


@pytest.mark.django_db(transaction=True)
def test_show_gives_the_jobs_of_one_claim_their_own_run_times():
    """Jobs claimed together share the claim's started_at; each attempt's own run (the event that
    ended it, less the run time the worker measured) tells them apart."""
    ids = [tasks.noop.using(queue_name="claimed-together").enqueue().id for _ in range(2)]
    first, second = sorted(claim(limit=2, queues=["claimed-together"]), key=lambda j: str(j.id))
    time.sleep(0.04)
    assert record(first, runtime_ms=40)
    time.sleep(0.03)
    assert record(second, runtime_ms=30)
    shown = {str(j.id): jobs("show", str(j.id)) for j in (first, second)}
    assert set(shown) == set(ids)
    started = {re.search(r"^started +(.*?)  \(claimed", text, re.M).group(1) for text in shown.values()}
    assert len(started) == 1, "one claim, one started_at"
    runs = {}
    for job_id, text in shown.items():
        match = re.search(r"^  1  completed  ran (\S+ \S+) \S+ - (\S+ \S+) \S+ \((\d+) ms\)", text, re.M)
        assert match, text
        runs[job_id] = [datetime.fromisoformat(match.group(1)), datetime.fromisoformat(match.group(2))]
        assert runs[job_id][1] - runs[job_id][0] == timedelta(milliseconds=int(match.group(3)))
    a, b = runs[str(first.id)], runs[str(second.id)]
    assert b[0] >= a[1] - timedelta(milliseconds=2), f"the second ran after the first: {a} {b}"
    assert a[0] != b[0]

"""The queues console in the admin: the overview dashboard, the per-queue page, its controls and
their permissions, escaping, bad input, and the overview's bounded queries."""

from __future__ import annotations

import html
import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_jobs
from django_jobs import console, engine
from django_jobs.admin.queues import QueueStateAdmin
from django_jobs.models import Job, Metric, QueueState, Worker
from django_jobs.queues import QueueLimits
from django_jobs.testing import drain_queue
from tests import tasks
from tests.conftest import wait_until
from tests.factories import queue_action, queue_page, staff_user

OVERVIEW = "/admin/django_jobs/queuestate/"


def minute(ago: int) -> timezone.datetime:
    """The start of the minute ``ago`` minutes before the current one (UTC, as Metric stores it)."""
    return timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=ago)


def metric(queue: str, ago: int, completed: int = 0, failed: int = 0, runtime_ms: int = 0) -> None:
    Metric.objects.create(queue=queue, minute=minute(ago), completed=completed, failed=failed, runtime_ms=runtime_ms)


@pytest.fixture
def same_minute() -> None:
    """Start the test early in a minute, so the rows it writes "n minutes ago" are still n minutes
    ago when the page reads them (the pages take the current time; tests cannot pass one)."""
    wait_until(lambda: timezone.now().second < 45, timeout=20, interval=0.2, message="the start of a minute")


def enqueue(queue: str, n: int = 1, **options) -> list[str]:
    return [tasks.noop.using(queue_name=queue, **options).enqueue().id for _ in range(n)]


def text(fragment: str) -> str:
    """The text of an HTML fragment: tags dropped, entities decoded, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def row(body: str, attr: str, value: str) -> str:
    """The ``<tr>`` whose ``attr`` is ``value``."""
    found = re.search(rf'<tr[^>]*{attr}="{re.escape(html.escape(value))}"[^>]*>(.*?)</tr>', body, re.S)
    assert found, f"no row {attr}={value!r}"
    return found.group(1)


def cell(fragment: str, attr: str, value: str) -> str:
    found = re.search(rf'<td[^>]*{attr}="{value}"[^>]*>(.*?)</td>', fragment, re.S)
    assert found, f"no cell {attr}={value!r}"
    return text(found.group(1))


def csrf_token(body: str, form_action: str) -> str:
    """The CSRF token inside the form that posts to ``form_action``."""
    form = re.search(rf'<form[^>]*action="{re.escape(form_action)}"[^>]*>(.*?)</form>', body, re.S)
    assert form, f"no form posting to {form_action}"
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.group(1))
    assert token, f"the form posting to {form_action} has no CSRF token"
    return token.group(1)


# -- the overview ------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("same_minute")
def test_overview_lists_each_queue_with_unfinished_counts_metrics_and_limits(admin_client):
    enqueue("emails", 2)
    enqueue("emails", 1, run_after=timedelta(hours=1))
    enqueue("reports", 1)
    django_jobs.queue("emails").configure(paused=True, concurrency=3, rate_limit=(20, 1.0), max_size=100)
    # emails: 12 finished in the 5 whole minutes before this one and 7 in this one: 19 over 5 to
    # 6 minutes, by the second of this minute it reads (3.2 to 3.8 a minute); in the 60 minutes up
    # to this one, 41 finished, 10 failed (24.4%), 28 s of run time (683 ms each); 193 in the
    # 1440 minutes up to this one. Each window's first and first-outside minutes have a row.
    metric("emails", 0, completed=7)
    metric("emails", 1, completed=6, failed=2, runtime_ms=8_000)
    metric("emails", 3, completed=4, failed=0, runtime_ms=2_000)
    metric("emails", 6, completed=3)
    metric("emails", 30, completed=10, failed=8, runtime_ms=18_000)
    metric("emails", 59, completed=1)
    metric("emails", 60, completed=50)
    metric("emails", 120, completed=100, runtime_ms=1_000)
    metric("emails", 1439, completed=2)
    metric("emails", 1440, completed=999, failed=999)
    metric("metrics-only", 600, completed=7)
    metric("ancient", 2 * 1440, completed=5)
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    body = response.content.decode()

    emails = row(body, "data-queue", "emails")
    assert [cell(emails, "data-state", s) for s in ("waiting", "delayed", "active", "waiting-children")] == [
        "2", "1", "0", "0",
    ]  # fmt: skip
    figures = {
        f: cell(emails, "data-figure", f)
        for f in ("completed-hour", "failed-hour", "failure-rate", "avg-runtime", "completed-day", "failed-day",
                  "jobs-per-minute", "paused", "concurrency", "rate-limit", "max-size")
    }  # fmt: skip
    assert 19 / 6 - 0.05 <= float(figures.pop("jobs-per-minute")) <= 19 / 5 + 0.05
    assert figures == {
        "completed-hour": "31",
        "failed-hour": "10",
        "failure-rate": "24.4%",
        "avg-runtime": "683 ms",
        "completed-day": "183",
        "failed-day": "10",
        "paused": "paused",
        "concurrency": "3",
        "rate-limit": "20 / 1 s",
        "max-size": "100",
    }
    assert cell(emails, "data-figure", "oldest-waiting").endswith(" s"), "two jobs wait"
    assert f'href="{queue_page("emails")}"' in emails
    assert 'href="/admin/django_jobs/job/?queue=emails&amp;state=waiting"' in emails
    assert 'href="/admin/django_jobs/job/?queue=emails&amp;state=failed"' in emails

    reports = row(body, "data-queue", "reports")
    assert cell(reports, "data-state", "waiting") == "1"
    assert cell(reports, "data-figure", "failure-rate") == "–" and cell(reports, "data-figure", "paused") == "no"
    only = row(body, "data-queue", "metrics-only")
    assert cell(only, "data-figure", "completed-day") == "7" and cell(only, "data-figure", "oldest-waiting") == "–"
    assert 'data-queue="ancient"' not in body, "metrics older than a day do not list a queue"
    assert 'href="/admin/django_jobs/queuestate/add/"' in body, "settings for a queue with no row yet"


@pytest.mark.django_db
def test_overview_counts_no_finished_job_and_lists_a_queue_only_for_unfinished_jobs_state_or_metrics(admin_client):
    enqueue("history", 3)
    drain_queue("history")
    Metric.objects.filter(queue="history").delete()  # what the completer wrote, if it writes metrics
    assert Job.objects.filter(queue="history", state="completed").count() == 3
    body = admin_client.get(OVERVIEW).content.decode()
    assert 'data-queue="history"' not in body
    assert "No queues yet" in body


@pytest.mark.django_db
def test_dashboard_figures_follow_the_given_now():
    [job_id] = enqueue("emails")
    waiting_since = Job.objects.get(id=job_id).available_at
    Metric.objects.create(queue="emails", minute=minute(0), completed=5)
    later = minute(0) + timedelta(minutes=3, seconds=30)
    data = console.dashboard(using="default", backend="default", now=later)
    [emails] = data.queues
    assert emails.oldest_waiting_age == later - waiting_since
    assert emails.recent.completed == 5 and emails.jobs_per_minute == pytest.approx(5 / 5.5), (
        "3 minutes on, the minute is among the last 5 whole ones; 5 jobs over 5.5 minutes"
    )
    assert emails.hour.completed == 5 and emails.day.completed == 5
    assert sum(b.completed for b in data.hour.buckets) == 5 and len(data.hour.buckets) == 60
    assert data.hour.buckets[-4].completed == 5, "the bucket three minutes before the last"
    burst = console.dashboard(using="default", backend="default", now=later - timedelta(minutes=3)).queues[0]
    assert burst.recent.completed == 5 and burst.jobs_per_minute == pytest.approx(5 / 5.5), (
        "the current minute counts at once: right after a burst the rate is not 0"
    )
    before = console.dashboard(using="default", backend="default", now=minute(0) - timedelta(seconds=1)).queues[0]
    assert before.recent == console.Outcomes() and before.jobs_per_minute == 0
    next_day = console.dashboard(using="default", backend="default", now=timezone.now() + timedelta(days=1, minutes=1))
    assert next_day.queues[0].day.completed == 0 and next_day.day.completed == 0


@pytest.mark.django_db
def test_throughput_buckets_minutes_of_all_queues_or_one():
    now = timezone.now()
    base = now.replace(second=0, microsecond=0)
    Metric.objects.create(queue="a", minute=base - timedelta(minutes=2), completed=3, failed=1)
    Metric.objects.create(queue="b", minute=base - timedelta(minutes=2), completed=2)
    Metric.objects.create(queue="b", minute=base - timedelta(minutes=20), failed=4)
    Metric.objects.create(queue="b", minute=base - timedelta(minutes=61), completed=100)
    hour = console.throughput(using="default", now=now)
    assert [b.minutes for b in hour.buckets] == [1] * 60 and hour.buckets[-1].start == base
    assert (hour.buckets[-3].completed, hour.buckets[-3].failed) == (5, 1)
    assert (hour.completed, hour.failed) == (5, 5), "the row 61 minutes ago is outside the hour"
    only_a = console.throughput(using="default", queue="a", now=now)
    assert (only_a.completed, only_a.failed) == (3, 1)
    quarters = console.throughput(using="default", minutes=1440, bucket=15, now=now)
    assert len(quarters.buckets) == 96 and quarters.buckets[-1].end == base + timedelta(minutes=1)
    assert (quarters.completed, quarters.failed) == (105, 5)
    assert quarters.buckets[-1].completed == 5 and quarters.buckets[-2].failed == 4
    assert len(console.throughput(using="default", minutes=50, bucket=15, now=now).buckets) == 4, "rounded up"
    with pytest.raises(ValueError, match="integers >= 1"):
        console.throughput(using="default", bucket=0)


@pytest.mark.django_db
@pytest.mark.usefixtures("same_minute")
def test_overview_charts_are_inline_svg_with_the_minutes_data(admin_client):
    metric("emails", 2, completed=3, failed=1)
    metric("reports", 2, completed=2)
    metric("reports", 200, completed=40)
    body = admin_client.get(OVERVIEW).content.decode()
    start = timezone.localtime(minute(2))
    title = f"<title>{start:%H:%M}–{start + timedelta(minutes=1):%H:%M}: 5 completed, 1 failed</title>"
    hour_svg = re.search(r'<svg[^>]*id="chart-all-hour".*?</svg>', body, re.S).group(0)
    assert 'role="img"' in hour_svg
    assert 'aria-label="Jobs finished per minute, all queues, last hour: 5 completed, 1 failed"' in hour_svg
    assert title in hour_svg and hour_svg.count('class="bar"') == 60
    assert "Completed (5)" in hour_svg and "Failed (1)" in hour_svg, "the legend"
    bar = re.search(rf'<g class="bar">{re.escape(title)}(.*?)</g>', hour_svg, re.S).group(1)
    # The highest bar (6 jobs) sets the scale (a round maximum): 5/6 and 1/6 of the 168-unit plot.
    assert re.search(r'<rect class="done"[^>]*height="140.0"', bar), bar
    assert re.search(r'<rect class="fail"[^>]*height="28.0"', bar), bar
    assert re.findall(r">(\d+)</text>", hour_svg)[:3] == ["0", "3", "6"], "the y axis labels"
    assert f">{timezone.localtime(minute(59)):%H:%M}</text>" in hour_svg, "the first x axis label"
    day_svg = re.search(r'<svg[^>]*id="chart-all-day".*?</svg>', body, re.S).group(0)
    # The rows reach back 200 minutes: the day chart spans 4 hours in 5-minute buckets.
    assert 'aria-label="Jobs finished, all queues, last 4 hours, per 5 minutes: 45 completed, 1 failed"' in day_svg
    assert day_svg.count('class="bar"') == 48 and ": 40 completed, 0 failed</title>" in day_svg
    assert "<h3>Last 4 hours, per 5 minutes</h3>" in body
    scripts = re.findall(r"<script[^>]*>", body.split('id="content"')[1])
    assert len(scripts) == 1 and "src=" not in scripts[0], (
        "the charts need no script; the one there is the live updates'"
    )
    assert "dj-live-toggle" in body.split('id="content"')[1]


@pytest.mark.django_db
def test_workers_table_shows_running_jobs_per_worker_and_marks_stale_heartbeats(admin_client):
    now = timezone.now()
    Worker.objects.create(
        id="w-fresh", hostname="host-a", pid=101, queues=["emails", "default"], concurrency=4,
        started_at=now - timedelta(hours=1), heartbeat_at=now - timedelta(seconds=5),
    )  # fmt: skip
    Worker.objects.create(
        id="w-stale", hostname="host-b", pid=202, queues=["*"], concurrency=2,
        started_at=now - timedelta(hours=2), heartbeat_at=now - timedelta(minutes=10),
    )  # fmt: skip
    enqueue("emails", 4)
    engine.claim_jobs(using="default", queues=["emails"], limit=3, worker_id="w-fresh", lease_seconds=30)
    engine.claim_jobs(using="default", queues=["emails"], limit=1, worker_id="w-gone", lease_seconds=30)
    body = admin_client.get(OVERVIEW).content.decode()
    fresh, stale = row(body, "data-worker", "w-fresh"), row(body, "data-worker", "w-stale")
    assert cell(fresh, "data-figure", "running") == "3" and cell(stale, "data-figure", "running") == "0"
    assert "host-a" in fresh and "emails, default" in fresh and "101" in fresh
    assert ">stale<" not in fresh and ">stale<" in stale and "(10 min" in text(stale)
    assert "1 active job(s) belong to no registered worker" in text(body)
    assert cell(row(body, "data-queue", "emails"), "data-state", "active") == "4"


@pytest.mark.django_db
def test_overview_queries_are_bounded_and_never_count_finished_jobs(admin_client):
    enqueue("emails", 2)
    metric("emails", 1, completed=1)
    admin_client.get(OVERVIEW)  # warm the session and content-type caches
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(OVERVIEW).status_code == 200
    for i in range(10):
        enqueue(f"q{i}", 5)
        enqueue(f"q{i}", 2, run_after=timedelta(hours=1))
        metric(f"q{i}", 3, completed=2, failed=1)
    drain_queue("q0")
    drain_queue("q1")
    enqueue("fails", 3)
    tasks.always_fails.using(queue_name="fails").enqueue()
    drain_queue("fails")
    Worker.objects.create(id="w", hostname="h", pid=1, queues=["*"], concurrency=1, started_at=timezone.now(),
                          heartbeat_at=timezone.now())  # fmt: skip
    with CaptureQueriesContext(connection) as many:
        body = admin_client.get(OVERVIEW).content.decode()
    assert 'data-queue="q9"' in body
    assert len(many) == len(few) <= 10, [q["sql"] for q in many]
    on_jobs = [q["sql"] for q in many if re.search(r'FROM ["`]django_jobs_job["`]', q["sql"])]
    assert len(on_jobs) == 2, on_jobs  # unfinished per queue and state; active per worker
    for sql in on_jobs:
        for finished in ("completed", "failed", "cancelled"):
            assert f"'{finished}'" not in sql, sql
        assert "'active'" in sql or "'waiting-children'" in sql, sql


# -- the per-queue page --------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("same_minute")
def test_queue_page_shows_counts_tasks_chart_limits_and_controls(admin_client):
    enqueue("emails", 2)
    tasks.add.using(queue_name="emails").enqueue(1, 2)
    django_jobs.queue("emails").configure(concurrency=2, rate_limit=(5, 10.0))
    metric("emails", 2, completed=4, failed=1, runtime_ms=2500)
    metric("other", 2, completed=50)
    response = admin_client.get(queue_page("emails"))
    assert response.status_code == 200
    body = response.content.decode()
    figures = row(body, "data-queue", "emails")
    assert cell(figures, "data-state", "waiting") == "3"
    assert (
        cell(figures, "data-figure", "completed-hour") == "4"
        and cell(figures, "data-figure", "failure-rate") == "20.0%"
    )
    assert cell(figures, "data-figure", "avg-runtime") == "500 ms"
    tasks_table = re.search(r'<table id="jobs-tasks">.*?</table>', body, re.S).group(0)
    assert "tests.tasks.noop" in tasks_table and "tests.tasks.add" in tasks_table
    assert 'href="/admin/django_jobs/job/?queue=emails&amp;task=tests.tasks.add"' in tasks_table
    assert 'aria-label="Jobs of queue emails finished per minute, last hour: 4 completed, 1 failed"' in body
    assert cell(body, "data-figure", "rate-limit") == "5 / 10 s" and cell(body, "data-figure", "concurrency") == "2"
    for verb in ("pause", "limits"):
        assert f'action="{queue_action("emails", verb)}"' in body
    assert f'href="{queue_action("emails", "drain")}"' in body and f'action="{queue_action("emails", "clean")}"' in body
    assert 'value="2"' in body and 'value="10.0"' in body, "the limits form holds the current values"
    assert 'href="/admin/django_jobs/queuestate/emails/change/"' in body


@pytest.mark.django_db
def test_queue_page_is_a_404_for_an_unknown_or_impossible_queue(admin_client):
    enqueue("emails")
    assert admin_client.get(queue_page("nope")).status_code == 404
    assert admin_client.get(queue_page("%3Cscript%3E")).status_code == 404
    assert admin_client.get(queue_action("nope", "pause")).status_code == 404
    assert admin_client.post(queue_action("nope", "pause")).status_code == 404
    assert not QueueState.objects.filter(name="nope").exists()
    assert admin_client.post(queue_action("emails", "explode")).status_code == 404
    enqueue("old")
    drain_queue("old")
    Metric.objects.filter(queue="old").delete()
    Job.objects.filter(queue="old").update(finished_at=timezone.now() - timedelta(days=30))
    assert admin_client.get(queue_page("old")).status_code == 200, "a queue with only finished jobs can be cleaned"


@pytest.mark.django_db
def test_pause_and_resume_post_from_the_page_and_get_is_not_allowed(admin_client):
    enqueue("emails")
    response = admin_client.get(queue_action("emails", "pause"))
    assert response.status_code == 405 and not django_jobs.queue("emails").is_paused
    response = admin_client.post(queue_action("emails", "pause"), follow=True)
    assert response.redirect_chain == [(queue_page("emails"), 302)]
    assert django_jobs.queue("emails").is_paused
    body = response.content.decode()
    assert "Queue “emails” paused" in body and 'id="jobs-paused"' in body
    assert f'action="{queue_action("emails", "resume")}"' in body
    response = admin_client.post(queue_action("emails", "resume"), follow=True)
    assert not django_jobs.queue("emails").is_paused and "Queue “emails” resumed." in response.content.decode()


@pytest.mark.django_db
def test_limits_form_saves_through_the_engine(admin_client):
    enqueue("emails")
    form = {"concurrency_limit": "4", "rate_limit": "10", "rate_window_seconds": "2.5", "max_size": "500"}
    response = admin_client.post(queue_action("emails", "limits"), form, follow=True)
    assert response.redirect_chain == [(queue_page("emails"), 302)]
    assert django_jobs.queue("emails").limits == QueueLimits(concurrency=4, rate_limit=(10, 2.5), max_size=500)
    assert "Limits of queue “emails” saved: concurrency 4, rate 10 per 2.5 s, max size 500." in text(
        response.content.decode()
    )
    empty = {"concurrency_limit": "", "rate_limit": "", "rate_window_seconds": "", "max_size": ""}
    admin_client.post(queue_action("emails", "limits"), empty)
    assert django_jobs.queue("emails").limits == QueueLimits()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rate_limit": "5"}, "Set both rate_limit and rate_window_seconds"),
        ({"concurrency_limit": "0"}, "concurrency_limit must be at least 1"),
        ({"max_size": "-3"}, "greater than or equal to 0"),
        ({"concurrency_limit": "many"}, "Enter a whole number."),
        ({"rate_limit": "5", "rate_window_seconds": "nan"}, "Enter a number."),
        ({"rate_limit": "5", "rate_window_seconds": "0"}, "rate_window_seconds must be &gt; 0"),
        ({"max_size": "99999999999999999999999"}, "less than or equal to"),
    ],
)
def test_invalid_limits_rerender_the_page_with_errors_and_save_nothing(admin_client, changes, message):
    enqueue("emails")
    django_jobs.queue("emails").set_concurrency(7)
    form = {"concurrency_limit": "", "rate_limit": "", "rate_window_seconds": "", "max_size": "", **changes}
    response = admin_client.post(queue_action("emails", "limits"), form)
    assert response.status_code == 200
    body = response.content.decode()
    assert message in body and 'class="errorlist' in body
    assert django_jobs.queue("emails").limits == QueueLimits(concurrency=7)


@pytest.mark.django_db
def test_clean_confirms_with_a_count_then_deletes_old_finished_jobs_of_the_state(admin_client):
    old_done = enqueue("emails", 3)
    tasks.always_fails.using(queue_name="emails").enqueue()
    drain_queue("emails")
    Job.objects.filter(queue="emails").update(finished_at=timezone.now() - timedelta(hours=5))
    recent = enqueue("emails")
    drain_queue("emails")
    waiting = enqueue("emails")
    other = enqueue("other")
    drain_queue("other")
    Job.objects.filter(id__in=other).update(finished_at=timezone.now() - timedelta(hours=5))

    response = admin_client.get(queue_action("emails", "clean"), {"state": "completed", "older_than_hours": "2"})
    assert response.status_code == 200
    body = response.content.decode()
    summary = text(re.search(r'id="jobs-confirm-summary">(.*?)</p>', body, re.S).group(1))
    assert "completed jobs of queue “emails” that finished more than 2 hour(s) ago: 3 job(s)" in summary
    assert 'type="hidden" name="state" value="completed"' in body and "csrfmiddlewaretoken" in body
    assert Job.objects.filter(id__in=old_done).count() == 3, "a GET deletes nothing"

    response = admin_client.post(
        queue_action("emails", "clean"), {"state": "completed", "older_than_hours": "2"}, follow=True
    )
    assert response.redirect_chain == [(queue_page("emails"), 302)]
    assert "Deleted 3 completed job(s) of queue “emails”" in response.content.decode()
    assert not Job.objects.filter(id__in=old_done).exists()
    assert Job.objects.filter(id__in=recent).exists(), "finished less than 2 hours ago"
    assert Job.objects.filter(queue="emails", state="failed").count() == 1, "another state"
    assert Job.objects.filter(id__in=waiting + other).count() == 2, "unfinished, or another queue"


@pytest.mark.django_db
def test_clean_works_in_bounded_batches_and_says_when_more_remain(admin_client, monkeypatch):
    enqueue("emails", 5)
    drain_queue("emails")
    Job.objects.filter(queue="emails").update(finished_at=timezone.now() - timedelta(hours=1))
    monkeypatch.setattr(QueueStateAdmin, "clean_batch_size", 2)
    monkeypatch.setattr(QueueStateAdmin, "clean_max_batches", 2)
    form = {"state": "completed", "older_than_hours": "0"}
    response = admin_client.post(queue_action("emails", "clean"), form, follow=True)
    assert Job.objects.filter(queue="emails").count() == 1
    assert "Deleted 4 completed job(s)" in response.content.decode() and "More remain" in response.content.decode()
    response = admin_client.post(queue_action("emails", "clean"), form, follow=True)
    assert not Job.objects.filter(queue="emails").exists() and "More remain" not in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "params",
    [
        {"state": "waiting", "older_than_hours": "1"},
        {"state": "completed", "older_than_hours": "soon"},
        {"state": "completed", "older_than_hours": "-1"},
        {"state": "completed", "older_than_hours": "1e300"},
        {"state": "completed", "older_than_hours": "inf"},
        {"older_than_hours": "1"},
    ],
)
def test_clean_with_bad_input_shows_errors_and_deletes_nothing(admin_client, params):
    enqueue("emails", 2)
    drain_queue("emails")
    Job.objects.update(finished_at=timezone.now() - timedelta(days=3))
    response = admin_client.get(queue_action("emails", "clean"), params)
    assert response.status_code == 200 and 'class="errorlist' in response.content.decode()
    assert "jobs-confirm-summary" not in response.content.decode()
    response = admin_client.post(queue_action("emails", "clean"), params)
    assert response.status_code == 200 and 'class="errorlist' in response.content.decode()
    assert Job.objects.filter(queue="emails").count() == 2


@pytest.mark.django_db
def test_drain_confirms_with_counts_then_deletes_waiting_and_delayed_jobs_only(admin_client):
    finished = enqueue("emails")
    drain_queue("emails")
    waiting = enqueue("emails", 2)
    delayed = enqueue("emails", 1, run_after=timedelta(hours=1))
    [active] = enqueue("emails")
    claimed = engine.claim_jobs(
        using="default", queues=["emails"], limit=1, worker_id="w", lease_seconds=30, job_ids=[uuid.UUID(active)]
    )
    assert [str(c.id) for c in claimed] == [active]
    elsewhere = enqueue("elsewhere")
    response = admin_client.get(queue_action("emails", "drain"))
    assert response.status_code == 200
    summary = text(re.search(r'id="jobs-confirm-summary">(.*?)</p>', response.content.decode(), re.S).group(1))
    assert summary.startswith("This deletes the 2 waiting and 1 delayed job(s) of queue “emails”")
    assert Job.objects.filter(id__in=waiting + delayed).count() == 3, "a GET deletes nothing"
    response = admin_client.post(queue_action("emails", "drain"), follow=True)
    assert response.redirect_chain == [(queue_page("emails"), 302)]
    assert "deleted 3 waiting and delayed job(s)" in response.content.decode()
    assert sorted(map(str, Job.objects.filter(queue="emails").values_list("id", flat=True))) == sorted(
        finished + [active]
    ), "the running and the finished job stay"
    assert Job.objects.filter(id__in=elsewhere).exists()


# -- permissions and CSRF ------------------------------------------------------------------------


@pytest.mark.django_db
def test_viewer_without_control_queue_sees_no_controls_and_forged_posts_are_refused(client):
    client.force_login(staff_user("view_queuestate", name="operator"))
    enqueue("emails", 2)
    drain_target = enqueue("emails", 1, run_after=timedelta(hours=1))
    enqueue("old", 1)
    drain_queue("old")
    Job.objects.filter(queue="old").update(finished_at=timezone.now() - timedelta(days=3))
    overview = client.get(OVERVIEW)
    assert overview.status_code == 200 and "/add/" not in overview.content.decode()
    body = client.get(queue_page("emails")).content.decode()
    assert 'id="jobs-controls"' not in body and "/pause/" not in body and "/drain/" not in body
    assert 'method="post" action="/admin/django_jobs/' not in body and "/change/" not in body
    for verb, data in [
        ("pause", {}),
        ("resume", {}),
        ("limits", {"concurrency_limit": "1", "rate_limit": "", "rate_window_seconds": "", "max_size": ""}),
        ("drain", {}),
    ]:
        assert client.post(queue_action("emails", verb), data).status_code == 403, verb
    assert client.post(queue_action("old", "clean"), {"state": "completed", "older_than_hours": "0"}).status_code == 403
    assert client.get(queue_action("emails", "drain")).status_code == 403
    assert client.get(queue_action("old", "clean"), {"state": "completed", "older_than_hours": "0"}).status_code == 403
    assert django_jobs.queue("emails").limits == QueueLimits()
    assert Job.objects.filter(id__in=drain_target).exists() and Job.objects.filter(queue="emails").count() == 3
    assert Job.objects.filter(queue="old").count() == 1


@pytest.mark.django_db
def test_control_queue_permission_shows_the_controls_and_lets_them_act(client):
    client.force_login(staff_user("view_queuestate", "control_queue", name="operator"))
    enqueue("emails")
    body = client.get(queue_page("emails")).content.decode()
    assert 'id="jobs-controls"' in body and f'action="{queue_action("emails", "pause")}"' in body
    assert "/change/" not in body, "no change permission: no link to the full form"
    assert client.post(queue_action("emails", "pause")).status_code == 302
    assert django_jobs.queue("emails").is_paused


@pytest.mark.django_db
def test_viewing_needs_a_view_permission(client):
    enqueue("emails")
    client.force_login(staff_user("control_queue", name="no-view"))
    assert client.get(OVERVIEW).status_code == 403
    assert client.get(queue_page("emails")).status_code == 403
    job_viewer = Client()
    job_viewer.force_login(staff_user("view_job", name="job-viewer"))
    assert job_viewer.get(OVERVIEW).status_code == 200
    body = job_viewer.get(queue_page("emails")).content.decode()
    assert "?queue=emails&amp;state=waiting" in body
    queue_viewer = Client()
    queue_viewer.force_login(staff_user("view_queuestate", name="queue-viewer"))
    assert "?queue=emails&amp;state=waiting" not in queue_viewer.get(OVERVIEW).content.decode(), (
        "no link to a jobs list the user may not see"
    )
    anonymous = Client().get(OVERVIEW)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    assert Client().post(queue_action("emails", "pause")).status_code == 302
    assert not django_jobs.queue("emails").is_paused


@pytest.mark.django_db
def test_actions_need_the_csrf_token(admin_user):
    enqueue("emails")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    body = client.get(queue_page("emails")).content.decode()
    assert client.post(queue_action("emails", "pause")).status_code == 403
    assert not django_jobs.queue("emails").is_paused
    assert (
        client.post(
            queue_action("emails", "pause"), {"csrfmiddlewaretoken": csrf_token(body, queue_action("emails", "pause"))}
        ).status_code
        == 302
    )
    assert django_jobs.queue("emails").is_paused


# -- escaping and malformed input ----------------------------------------------------------------


@pytest.mark.django_db
def test_markup_in_queue_names_and_task_paths_is_escaped(admin_client):
    evil_queue = "<script>alert('q')</script>"
    metric(evil_queue, 1, completed=1)
    QueueState.objects.create(name="<b>bold")  # a raw insert: enqueue refuses such names
    enqueue("emails")
    job = Job.objects.get(queue="emails")
    Job.objects.create(
        task_path="<script>alert('t')</script>", queue="emails", available_at=job.available_at,
        enqueued_at=job.enqueued_at,
    )  # fmt: skip
    body = admin_client.get(OVERVIEW).content.decode()
    assert "<script>alert" not in body and "&lt;script&gt;alert(&#x27;q&#x27;)&lt;/script&gt;" in body
    assert "<b>bold" not in body and "&lt;b&gt;bold" in body
    assert 'href="/admin/django_jobs/queuestate/%3C' not in body, "no link to a page that is a 404"
    body = admin_client.get(queue_page("emails")).content.decode()
    assert "<script>alert" not in body and "&lt;script&gt;alert(&#x27;t&#x27;)&lt;/script&gt;" in body
    assert "task=%3Cscript%3Ealert%28%27t%27%29%3C%2Fscript%3E" in body


@pytest.mark.django_db
def test_malformed_parameters_never_give_a_server_error(admin_client):
    enqueue("emails")
    assert admin_client.get(OVERVIEW, {"backend": "nope"}).status_code == 200
    assert admin_client.get(OVERVIEW, {"backend": "limited"}).status_code == 200
    assert admin_client.get(queue_page("emails"), {"backend": ["x", "y"]}).status_code == 200
    assert admin_client.get(queue_action("emails", "clean"), {"older_than_hours": "\x00"}).status_code == 200
    assert admin_client.post(queue_action("emails", "limits"), {"concurrency_limit": "\x00"}).status_code == 200
    assert admin_client.get(queue_page("a" * 300)).status_code == 404
    assert admin_client.get(queue_action("emails", "pause") + "extra/").status_code in (302, 404)


@pytest.mark.django_db
def test_a_second_backend_shows_its_own_jobs(admin_client):
    enqueue("emails", 2)
    tasks.limited_echo.using(queue_name="emails").enqueue(1)
    default = row(admin_client.get(OVERVIEW).content.decode(), "data-queue", "emails")
    assert cell(default, "data-state", "waiting") == "2"
    body = admin_client.get(OVERVIEW, {"backend": "limited"}).content.decode()
    assert cell(row(body, "data-queue", "emails"), "data-state", "waiting") == "1"
    assert 'href="/admin/django_jobs/queuestate/emails/dashboard/?backend=limited"' in body


@pytest.mark.django_db
def test_a_queue_named_like_an_admin_page_keeps_its_edit_form(admin_client):
    """The dashboard lives at <name>/dashboard/, so a queue called "queue" or "change" still
    has its plain edit form at <name>/change/."""
    django_jobs.queue("queue").pause()
    assert admin_client.get("/admin/django_jobs/queuestate/queue/change/").status_code == 200
    assert b"queue" in admin_client.get(queue_page("queue")).content


@pytest.mark.django_db
def test_every_queues_page_links_to_the_full_form_a_queue_without_settings_to_the_add_form_named(admin_client):
    enqueue("fresh")
    body = admin_client.get(queue_page("fresh")).content.decode()
    assert 'id="jobs-edit-link"' in body and "/admin/django_jobs/queuestate/add/?name=fresh" in body
    form = admin_client.get("/admin/django_jobs/queuestate/add/?name=fresh").content.decode()
    assert 'value="fresh"' in form, "the name filled in"
    assert "A queue needs no row to exist" in form, "the add form says a queue needs no settings to be used"
    django_jobs.queue("fresh").pause()
    body = admin_client.get(queue_page("fresh")).content.decode()
    assert "/admin/django_jobs/queuestate/fresh/change/" in body


@pytest.mark.django_db
def test_the_day_chart_of_a_new_install_spans_the_hours_it_has_in_finer_buckets():
    now = timezone.now()
    base = now.replace(second=0, microsecond=0)
    Metric.objects.create(queue="a", minute=base - timedelta(minutes=3), completed=4)
    day = console.dashboard(using="default", backend="default", now=now).day
    assert (day.minutes, day.bucket_minutes, day.heading) == (120, 5, "Last 2 hours, per 5 minutes")
    assert day.completed == 4
    Metric.objects.create(queue="a", minute=base - timedelta(hours=5, minutes=10), completed=1)
    day = console.dashboard(using="default", backend="default", now=now).day
    assert (day.minutes, day.bucket_minutes, day.heading) == (360, 5, "Last 6 hours, per 5 minutes")
    Metric.objects.create(queue="a", minute=base - timedelta(hours=20), completed=1)
    day = console.dashboard(using="default", backend="default", now=now).day
    assert (day.minutes, day.bucket_minutes, day.heading) == (1260, 15, "Last 21 hours, per 15 minutes")
    Metric.objects.all().delete()
    day = console.dashboard(using="default", backend="default", now=now).day
    assert (day.minutes, day.bucket_minutes) == (1440, 15), "nothing yet: the whole day, empty"


@pytest.mark.django_db
def test_the_sidebar_offers_no_add_beside_queues_but_the_add_form_stays_reachable(admin_client):
    index = admin_client.get("/admin/").content.decode()
    assert "/admin/django_jobs/queuestate/add/" not in index, "a queue needs no row to be used"
    assert "/admin/django_jobs/schedule/add/" in index
    assert admin_client.get("/admin/django_jobs/queuestate/add/").status_code == 200
    assert "Set up a queue's limits" in admin_client.get(OVERVIEW).content.decode()

"""The admin console in a real browser: Chromium (through Playwright) against a live server, on
the test database, logged in through the admin's login form.

Each test walks pages the way an operator does (links, buttons, forms, the actions dropdown)
and checks the database after each change; every page also fails its test on a console error,
an uncaught exception, a dialog or a request to another origin (tests/browser.py). The data
comes from real engine calls: jobs enqueued and run with ``drain_queue``, so completed and
failed jobs carry results, errors, tracebacks, logs and events.

Screenshots (1400x900, whole page) go to ``test-artifacts/screenshots/``: overview.png,
queue.png, jobs.png, job.png and overview-dark.png.
"""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import quote, urlsplit

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import Sum
from django.tasks import task
from django.test import override_settings
from django.utils import timezone

import django_jobs
from django_jobs.models import Job, Metric, QueueState, Schedule, Worker
from django_jobs.testing import drain_queue
from tests import browser as browser_fixtures
from tests import tasks
from tests.browser import PASSWORD, login, screenshot
from tests.factories import job_page, queue_page, state_of

# The fixtures of tests/browser.py: one Chromium and one live server for the module, a page per test.
browser = browser_fixtures.browser
live_server_url = browser_fixtures.live_server_url
page = browser_fixtures.page

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = "/admin/django_jobs/queuestate/"
JOBS = "/admin/django_jobs/job/"
SCHEDULES = "/admin/django_jobs/schedule/"
XSS = "<script>alert(1)</script>"


@pytest.fixture(scope="module", autouse=True)
def fast_password_hashing():
    """The login form checks the password as always, with a hasher that takes a millisecond
    instead of the default's second per login."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@task(takes_context=True, max_attempts=2, backoff=0)
def logs_then_fails(context, text: str):
    context.log(f"attempt {context.attempt}: working on {text}")
    context.set_progress({"current": 3, "total": 4})
    raise ValueError(f"bad input {text}")


# -- data, made by the engine ---------------------------------------------------------------------


def ids(results) -> list[str]:
    return [str(r.id) for r in results]


def seed() -> dict[str, list[str]]:
    """Queue "emails": 3 completed, 2 failed (two attempts each), 2 waiting, 1 delayed; queue
    "reports": 1 waiting, 1 delayed; throughput rows for the last hour and day."""
    done = ids(tasks.add.using(queue_name="emails").enqueue(i, i) for i in range(3))
    failed = ids(tasks.always_fails.using(queue_name="emails").enqueue(f"bad {i}") for i in range(2))
    drain_queue("emails")
    waiting = ids(tasks.noop.using(queue_name="emails").enqueue() for _ in range(2))
    delayed = ids([tasks.noop.using(queue_name="emails", run_after=timedelta(hours=1)).enqueue()])
    reports = ids([tasks.echo.using(queue_name="reports").enqueue("monthly")])
    reports += ids([tasks.echo.using(queue_name="reports", run_after=timedelta(hours=2)).enqueue("yearly")])
    now = timezone.now().replace(second=0, microsecond=0)
    # Minutes 2..50 ago (the engine wrote this minute's row): inside the hour whatever the clock.
    for ago in range(2, 51):
        Metric.objects.create(
            queue="emails", minute=now - timedelta(minutes=ago), completed=3 + ago % 7, failed=int(ago % 5 == 0),
            runtime_ms=(3 + ago % 7) * 40,
        )  # fmt: skip
        if ago % 3 == 0:
            Metric.objects.create(queue="reports", minute=now - timedelta(minutes=ago), completed=2, runtime_ms=900)
    for ago in range(90, 24 * 60, 37):
        Metric.objects.create(queue="emails", minute=now - timedelta(minutes=ago), completed=ago % 11, failed=ago % 2)
    assert {state_of(i) for i in done} == {"completed"} and {state_of(i) for i in failed} == {"failed"}
    return {"done": done, "failed": failed, "waiting": waiting, "delayed": delayed, "reports": reports}


def superuser(page) -> User:
    user = User.objects.create_superuser("root", password=PASSWORD)
    login(page, "root")
    return user


def viewer(page) -> User:
    """A staff user who may only look: view_job, view_queuestate, view_schedule."""
    user = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    codenames = ["view_job", "view_queuestate", "view_schedule"]
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_jobs", codename__in=codenames))
    login(page, "viewer")
    return user


def messages(page) -> str:
    return " | ".join(page.locator("ul.messagelist li").all_inner_texts())


def listed(page) -> list[str]:
    """The job ids of the changelist's rows, in order."""
    return [box.get_attribute("value") for box in page.locator("#result_list input.action-select").all()]


def cell(page, queue: str, attr: str, value: str) -> str:
    return page.locator(f'tr[data-queue="{queue}"] td[{attr}="{value}"]').inner_text().strip()


ACTION_TIMEOUT_MS = 60_000


def run_action(page, action: str, *, select=(), whole_page: bool = False, across: bool = False) -> str:
    """Tick ``select`` (job ids) or the whole page, optionally "select all" across the results,
    pick ``action`` in the dropdown, press Run; return the messages of the next page."""
    for job_id in select:
        page.check(f'#result_list input.action-select[value="{job_id}"]')
    if whole_page:
        page.check("#action-toggle")
    if across:
        page.click("div.actions span.question a")
        assert page.locator("div.actions span.all").is_visible(), "the selection covers every page"
    page.select_option("div.actions select[name=action]", action)
    # An action on every matching job answers after it acted on all of them: with three suites
    # sharing two cores (make test), 105 of them have taken longer than Playwright's default 10 s.
    with page.expect_navigation(timeout=ACTION_TIMEOUT_MS):
        page.click("div.actions button[name=index]", timeout=ACTION_TIMEOUT_MS)
    if action == "delete_jobs":  # a confirmation page first, as Django's own delete
        assert page.locator("#dj-delete-summary").is_visible()
        with page.expect_navigation(timeout=ACTION_TIMEOUT_MS):
            page.click("#content input[type=submit]", timeout=ACTION_TIMEOUT_MS)
    return messages(page)


def luminance(css_color: str) -> float:
    """Relative luminance (WCAG) of an ``rgb(...)``/``rgba(...)`` colour."""
    r, g, b = (int(v) / 255 for v in re.findall(r"[\d.]+", css_color)[:3])

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def style(page, selector: str, prop: str) -> str:
    return page.locator(selector).first.evaluate(f"el => getComputedStyle(el).{prop}")


# -- the queues -----------------------------------------------------------------------------------


def test_overview_shows_each_queue_with_its_figures_and_the_charts(page):
    seed()
    superuser(page)
    page.goto(OVERVIEW)
    screenshot(page, "overview")

    assert page.locator("#jobs-queues tbody tr").count() == 2
    assert cell(page, "emails", "data-state", "waiting") == "2"
    assert cell(page, "emails", "data-state", "delayed") == "1"
    assert cell(page, "reports", "data-state", "waiting") == "1"
    since = timezone.now() - timedelta(minutes=55)
    hour = Metric.objects.filter(queue="emails", minute__gte=since).aggregate(c=Sum("completed"), f=Sum("failed"))
    assert cell(page, "emails", "data-figure", "completed-hour") == str(hour["c"])
    assert cell(page, "emails", "data-figure", "failed-hour") == str(hour["f"])
    assert cell(page, "emails", "data-figure", "paused") == "no"

    for chart in ("#chart-all-hour", "#chart-all-day"):
        svg = page.locator(chart)
        assert svg.is_visible()
        box = svg.bounding_box()
        # 420..720 px wide by the console's CSS; 300 px is the SVG's default size, unreadable.
        assert box["width"] >= 400 and box["height"] > 100, f"{chart} renders {box['width']:.0f} px wide"
        bars = svg.locator("rect.done")
        assert bars.count() > 10, f"{chart} draws the completed bars"
        heights = [float(h) for h in bars.evaluate_all("els => els.map(e => e.getBBox().height)")]
        assert max(heights) > 50, "the tallest bar fills most of the plot"
        assert svg.locator("rect.fail").count() > 0
        sizes = svg.locator("text").evaluate_all("els => els.map(e => e.getBoundingClientRect().height)")
        assert min(sizes) >= 10, f"{chart}'s legend and axis labels are drawn {min(sizes):.1f} px tall"
    assert "No worker is registered" in page.locator("#content-main").inner_text()
    assert not page.watched.console_errors and not page.watched.foreign_requests()
    assert style(page, "#header", "backgroundColor") not in ("", "rgba(0, 0, 0, 0)"), "the admin's CSS applies"


def test_overview_in_dark_mode_keeps_the_charts_readable(page):
    seed()
    superuser(page)
    page.emulate_media(color_scheme="dark")
    page.goto(OVERVIEW)
    screenshot(page, "overview-dark")

    body_bg = style(page, "body", "backgroundColor")
    assert luminance(body_bg) < 0.05, f"the admin's dark theme applies (body background {body_bg})"
    chart_text = style(page, "#chart-all-hour text", "fill")
    assert contrast(chart_text, body_bg) >= 3, f"chart labels {chart_text} on {body_bg}"
    for bar in ("rect.done", "rect.fail"):
        fill = style(page, f"#chart-all-hour {bar}", "fill")
        assert contrast(fill, body_bg) >= 2, f"{bar} {fill} on {body_bg}"
    cell_color = style(page, 'tr[data-queue="emails"] td[data-figure="completed-day"]', "color")
    assert contrast(cell_color, body_bg) >= 4.5, f"table figures {cell_color} on {body_bg}"


def test_queue_page_pauses_resumes_sets_limits_cleans_and_drains(page):
    data = seed()
    superuser(page)
    page.goto(OVERVIEW)
    with page.expect_navigation():
        page.click('#jobs-queues tr[data-queue="emails"] th a')
    assert urlsplit(page.url).path == queue_page("emails")
    assert cell(page, "emails", "data-state", "waiting") == "2"
    assert page.locator("#chart-queue-hour rect.done").count() > 10
    assert "tests.tasks.noop" in page.locator("#jobs-tasks").inner_text()
    screenshot(page, "queue")

    with page.expect_navigation():
        page.click("input[name=pause]")
    assert page.locator("#jobs-paused").is_visible() and "paused" in messages(page)
    assert QueueState.objects.get(name="emails").paused
    with page.expect_navigation():
        page.click("input[name=resume]")
    assert page.locator("#jobs-paused").count() == 0
    assert not QueueState.objects.get(name="emails").paused

    page.fill("#jobs-limits-form input[name=concurrency_limit]", "3")
    page.fill("#jobs-limits-form input[name=max_size]", "500")
    with page.expect_navigation():
        page.click("#jobs-limits-form input[type=submit]")
    assert QueueState.objects.values_list("concurrency_limit", "max_size").get(name="emails") == (3, 500)
    assert page.locator('#jobs-limits td[data-figure="concurrency"]').inner_text().strip() == "3"

    # Clean: the completed jobs finished more than an hour ago (two of the three).
    old = data["done"][:2]
    Job.objects.filter(id__in=old).update(finished_at=timezone.now() - timedelta(hours=3))
    page.select_option("#jobs-clean-form select[name=state]", "completed")
    page.fill("#jobs-clean-form input[name=older_than_hours]", "1")
    with page.expect_navigation():
        page.click("#jobs-clean-form input[type=submit]")
    assert "/dashboard/clean/" in page.url
    assert "2 job(s)" in page.locator("#jobs-confirm-summary").inner_text()
    assert Job.objects.filter(id__in=old).count() == 2, "the confirmation page deletes nothing"
    with page.expect_navigation():
        page.click("input[value='Yes, delete them']")
    assert urlsplit(page.url).path == queue_page("emails")
    assert "Deleted 2 completed job(s)" in messages(page)
    assert not Job.objects.filter(id__in=old).exists()
    assert Job.objects.filter(id=data["done"][2]).exists() and Job.objects.filter(state="failed").count() == 2

    # Drain: waiting and delayed jobs of this queue go; the other queue's stay.
    with page.expect_navigation():
        page.click("#jobs-drain-link")
    summary = page.locator("#jobs-confirm-summary").inner_text()
    assert "2 waiting and 1 delayed" in summary, summary
    with page.expect_navigation():
        page.click("input[value='Yes, drain the queue']")
    assert not Job.objects.filter(id__in=data["waiting"] + data["delayed"]).exists()
    assert Job.objects.filter(id__in=data["reports"]).count() == 2
    assert cell(page, "emails", "data-state", "waiting") == "0"


# -- the jobs -------------------------------------------------------------------------------------


def test_jobs_changelist_filters_by_state_and_queue_and_searches(page):
    data = seed()
    superuser(page)
    page.goto(JOBS)
    assert set(listed(page)) == set(data["done"] + data["failed"] + data["waiting"] + data["delayed"] + data["reports"])
    screenshot(page, "jobs")

    with page.expect_navigation():
        page.locator('#changelist-filter details[data-filter-title="state"]').get_by_role(
            "link", name="Failed", exact=True
        ).click()
    assert "state=failed" in page.url
    assert set(listed(page)) == set(data["failed"])
    assert set(page.locator("#result_list td.field-state_badge").all_inner_texts()) == {"failed"}

    page.goto(JOBS)
    with page.expect_navigation():
        page.locator('#changelist-filter details[data-filter-title="queue"]').get_by_role(
            "link", name="reports", exact=True
        ).click()
    assert "queue=reports" in page.url
    assert set(listed(page)) == set(data["reports"])
    # A second filter narrows the first.
    with page.expect_navigation():
        page.locator('#changelist-filter details[data-filter-title="state"]').get_by_role(
            "link", name="Delayed", exact=True
        ).click()
    assert "queue=reports" in page.url and "state=delayed" in page.url
    assert listed(page) == data["reports"][1:]

    page.goto(JOBS)
    page.fill("#searchbar", "always_fails")
    with page.expect_navigation():
        page.press("#searchbar", "Enter")
    assert set(listed(page)) == set(data["failed"])
    page.fill("#searchbar", f"id:{data['done'][0]}")
    with page.expect_navigation():
        page.press("#searchbar", "Enter")
    assert listed(page) == [data["done"][0]]


def test_jobs_actions_retry_cancel_run_now_and_delete_the_selection(page):
    data = seed()
    superuser(page)

    page.goto(JOBS + "?state=failed")
    note = run_action(page, "retry_jobs", select=[data["failed"][0]])
    assert "Retried 1 job" in note, note
    assert state_of(data["failed"][0]) == "waiting" and state_of(data["failed"][1]) == "failed"

    page.goto(JOBS + "?state=waiting&queue=emails")
    note = run_action(page, "cancel_jobs", select=data["waiting"])
    assert "Cancelled 2 jobs" in note, note
    assert {state_of(i) for i in data["waiting"]} == {"cancelled"}

    page.goto(JOBS + "?state=delayed")
    note = run_action(page, "run_jobs_now", whole_page=True)
    assert "2 jobs will run now" in note, note
    assert state_of(data["delayed"][0]) == "waiting" and state_of(data["reports"][1]) == "waiting"

    page.goto(JOBS + "?state=completed")
    note = run_action(page, "delete_jobs", select=data["done"][:2])
    assert "Deleted 2 jobs" in note, note
    assert Job.objects.filter(id__in=data["done"]).count() == 1


def test_select_all_across_pages_acts_on_every_matching_job(page):
    seed()
    bulk = ids(tasks.noop.using(queue_name="bulk").enqueue_many([()] * 105))
    superuser(page)
    page.goto(JOBS + "?queue=bulk")
    assert len(listed(page)) == 100 and page.locator("a[rel=next]").is_visible()

    note = run_action(page, "cancel_jobs", whole_page=True, across=True)
    assert "Cancelled 105 jobs" in note, note
    assert set(Job.objects.filter(id__in=bulk).values_list("state", flat=True)) == {"cancelled"}
    assert Job.objects.exclude(queue="bulk").filter(state="cancelled").count() == 0, "only the filtered jobs"

    page.goto(JOBS + "?queue=bulk&state=cancelled")
    note = run_action(page, "delete_jobs", whole_page=True, across=True)
    assert "Deleted 105 jobs" in note, note
    assert not Job.objects.filter(queue="bulk").exists()
    assert Job.objects.count() == 10, "the other queues' jobs stay"


def test_job_page_shows_arguments_result_errors_log_and_timeline_and_its_buttons_act(page):
    failing = logs_then_fails.using(queue_name="emails").enqueue("order 42")
    done = tasks.add.enqueue(20, 22)
    drain_queue()
    superuser(page)

    page.goto(job_page(done.id))
    assert "tests.tasks.add [completed]" in page.locator("#content h1").inner_text()
    assert page.locator(".module", has_text="Arguments").locator("pre").first.inner_text() == "[\n  20,\n  22\n]"
    assert page.locator(".module", has_text="Result and progress").locator("pre").first.inner_text() == "42"
    assert [b.get_attribute("data-action") for b in page.locator(".dj-buttons [data-action]").all()] == ["delete"]
    with page.expect_navigation():
        page.click(".dj-buttons [data-action=delete]")
    assert "Delete job" in page.locator("#dj-delete-summary").inner_text()
    assert Job.objects.filter(pk=done.id).exists(), "the confirmation page deletes nothing"
    with page.expect_navigation():
        page.click("#content input[type=submit]")
    assert urlsplit(page.url).path == JOBS and "was deleted" in messages(page)
    assert not Job.objects.filter(pk=done.id).exists()

    page.goto(JOBS + "?state=failed")
    with page.expect_navigation():
        page.click(f'#result_list a[href*="{failing.id}"]')
    assert urlsplit(page.url).path == job_page(failing.id)
    errors = page.locator("#errors")
    assert errors.locator("h2").inner_text() == "Errors (2)"
    assert "ValueError: bad input order 42" in errors.inner_text()
    traceback = errors.locator("details[open] pre")
    assert traceback.is_visible() and "Traceback (most recent call last)" in traceback.inner_text()
    log = page.locator("#logs pre").inner_text()
    assert "attempt 1: working on order 42" in log and "attempt 2: working on order 42" in log
    kinds = page.locator("#timeline tbody tr td:nth-child(2)").all_inner_texts()
    assert kinds[0] == "enqueued" and "active" in kinds and kinds[-1] == "failed", kinds
    assert page.locator(".dj-progress progress").get_attribute("value") == "75.0"
    screenshot(page, "job")

    with page.expect_navigation():
        page.click(".dj-buttons button[data-action=retry]")
    assert "was re-queued" in messages(page)
    assert state_of(failing.id) == "waiting"
    assert page.locator(".dj-buttons button[data-action=retry]").count() == 0
    with page.expect_navigation():
        page.click(".dj-buttons button[data-action=cancel]")
    assert "was cancelled" in messages(page)
    assert state_of(failing.id) == "cancelled"
    assert "cancelled" in page.locator("#timeline").inner_text()


def test_markup_in_job_arguments_shows_as_text_and_runs_nothing(page):
    job = tasks.echo.using(queue_name="emails").enqueue(XSS, note=XSS)
    drain_queue()
    superuser(page)

    page.goto(JOBS + "?q=echo")
    assert listed(page) == [job.id]
    page.goto(job_page(job.id))
    args = page.locator(".module", has_text="Arguments").locator("pre")
    assert XSS in args.nth(0).inner_text() and XSS in args.nth(1).inner_text()
    assert XSS in page.locator(".module", has_text="Result and progress").locator("pre").first.inner_text()
    assert page.locator("#content-main script").count() == 0

    page.goto(f"{JOBS}?q={quote(XSS)}")  # the search term comes back in the search box
    assert page.input_value("#searchbar") == XSS and listed(page) == []
    assert page.watched.dialogs == []


# -- schedules ------------------------------------------------------------------------------------


def test_schedule_list_and_form_preview_five_runs_and_run_now_enqueues_a_job(page):
    sched = django_jobs.schedule("nightly report", tasks.add, cron="0 3 * * *", args=[1, 2], queue="reports")
    superuser(page)
    page.goto(SCHEDULES)
    row = page.locator("#result_list tbody tr", has_text="nightly report")
    assert "0 3 * * *" in row.inner_text() and "tests.tasks.add" in row.inner_text()
    with page.expect_navigation():
        row.get_by_role("link", name="nightly report").click()

    runs = page.locator("#next-runs li.dj-run")
    assert runs.count() == 5
    assert all("03:00:00" in text for text in runs.all_inner_texts()), runs.all_inner_texts()
    assert "Of the saved schedule" in page.locator("#next-runs").inner_text()

    page.fill("#id_cron", "*/15 * * * *")
    with page.expect_navigation():
        page.click("input[name=_preview]")
    assert "Of the fields as entered" in page.locator("#next-runs").inner_text()
    minutes = {re.search(r" \d\d:(\d\d):", t).group(1) for t in runs.all_inner_texts()}
    assert runs.count() == 5 and minutes <= {"00", "15", "30", "45"}, runs.all_inner_texts()
    assert Schedule.objects.get(pk=sched.pk).cron == "0 3 * * *", "a preview saves nothing"

    page.goto(f"{SCHEDULES}{sched.pk}/change/")
    with page.expect_navigation():
        page.click("#run-now-form button[type=submit]")
    assert "enqueued job" in messages(page)
    job = Job.objects.get(task_path="tests.tasks.add")
    assert (job.queue, job.args, job.state) == ("reports", [1, 2], "waiting")
    with page.expect_navigation():
        page.click(f'ul.messagelist a[href*="{job.pk}"]')
    assert urlsplit(page.url).path == job_page(job.pk)


def overflowing(page) -> list[str]:
    """The header cells of the page's result list whose right edge passes the edge of the
    list's area (or the window's), or whose text is cut (wider than the cell shows)."""
    return page.evaluate(
        """() => {
            const table = document.querySelector('#result_list');
            const box = table.parentElement.getBoundingClientRect();  // the list's own area
            const right = Math.min(box.right, document.documentElement.clientWidth);
            return [...table.querySelectorAll('thead th')]
                .filter(th => th.getBoundingClientRect().right > right + 1 || th.scrollWidth > th.clientWidth + 1)
                .map(th => th.innerText.trim() || th.className);
        }"""
    )


def test_the_jobs_and_schedules_lists_fit_1280_pixels_with_the_sidebar_open(page):
    data = seed()
    django_jobs.schedule(
        "nightly report with a long name", tasks.add, cron="0 3 * * *", args=[1, 2], timezone="Europe/Paris"
    )
    superuser(page)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(JOBS)
    assert page.locator("#nav-sidebar").is_visible(), "the sidebar is open"
    assert overflowing(page) == [], "every column inside the window"
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    failed_row = page.locator("#result_list tbody tr", has=page.locator(f'input[value="{data["failed"][0]}"]'))
    assert "ValueError: bad 0" in failed_row.inner_text(), "a failed job shows its error in the list"
    delayed_row = page.locator("#result_list tbody tr", has=page.locator(f'input[value="{data["delayed"][0]}"]'))
    assert re.search(r"runs at \d{4}-\d\d-\d\d\s+\d\d:\d\d:\d\d UTC", delayed_row.inner_text())
    screenshot(page, "jobs-1280")
    page.goto(SCHEDULES)
    assert overflowing(page) == [], "every column inside the window"
    row = page.locator("#result_list tbody tr", has_text="nightly report").inner_text()
    assert re.search(r"\d\d:\d\d:\d\d CES?T", row) and "Europe/Paris" in row, "the next run in its zone, named"
    assert re.search(r"\d\d:\d\d:\d\d UTC", row), "and in UTC"
    Worker.objects.create(
        id="web-1.example.internal:4242:0123456789abcdef", hostname="web-1.example.internal", pid=4242,
        queues=["emails", "reports", "default"], concurrency=8, started_at=timezone.now(), heartbeat_at=timezone.now(),
    )  # fmt: skip
    page.goto("/admin/django_jobs/worker/")
    assert overflowing(page) == [], "the workers list too"
    page.goto(OVERVIEW)
    wide = page.evaluate(
        """() => [...document.querySelectorAll('.jobs-scroll')].filter(b => b.scrollWidth > b.clientWidth + 1).length"""
    )
    assert wide == 0, "the overview's tables need no sideways scrolling at 1280 px"


def test_every_documented_progress_shape_draws_a_visible_bar(page):
    superuser(page)
    shapes = [({"done": 3, "total": 4}, 75), ({"current": 1, "total": 4}, 25), ({"percent": 40}, 40), (60, 60)]
    for progress, percent in shapes:
        job_id = tasks.noop.enqueue().id
        Job.objects.filter(pk=job_id).update(progress=progress)
        page.goto(job_page(job_id))
        bar = page.locator("[data-live=result] progress")
        assert bar.is_visible(), progress
        assert float(bar.get_attribute("value")) == percent, progress
        assert bar.bounding_box()["width"] > 100, "a bar one can read"


LIVE_WAIT_MS = 15_000  # a few refresh intervals, with three suites sharing two cores


def test_the_overview_and_a_running_jobs_page_update_themselves_without_a_reload_and_pause(page):
    seed()
    superuser(page)
    page.goto(OVERVIEW)
    page.evaluate("window.__loaded_once = true")  # gone if the page reloads
    assert cell(page, "reports", "data-state", "waiting") == "1"
    tasks.echo.using(queue_name="reports").enqueue("one more")
    page.wait_for_function(
        """() => document.querySelector('tr[data-queue="reports"] td[data-state="waiting"]').innerText.trim() === "2" """,
        timeout=LIVE_WAIT_MS,
    )
    assert page.evaluate("window.__loaded_once === true"), "the count changed without a reload"
    assert "updated" in page.locator("#dj-live-status").inner_text()

    page.click("#dj-live-toggle")  # pause
    assert page.locator("#dj-live-toggle").inner_text() == "Resume live updates"
    tasks.echo.using(queue_name="reports").enqueue("while paused")
    page.wait_for_timeout(7_000)  # more than an interval
    assert cell(page, "reports", "data-state", "waiting") == "2", "paused: nothing moves"
    page.click("#dj-live-toggle")  # resume: at once
    page.wait_for_function(
        """() => document.querySelector('tr[data-queue="reports"] td[data-state="waiting"]').innerText.trim() === "3" """,
        timeout=LIVE_WAIT_MS,
    )

    # A job's page follows it while it can change, and stops once it finished.
    result = tasks.echo.using(queue_name="live").enqueue("watched")
    page.goto(job_page(result.id))
    page.evaluate("window.__loaded_once = true")
    assert "waiting" in page.locator("[data-live=job]").inner_text()
    drain_queue("live")
    page.wait_for_function(
        "() => document.querySelector('[data-live=job]').innerText.includes('completed')", timeout=LIVE_WAIT_MS
    )
    assert page.evaluate("window.__loaded_once === true")
    assert "ended" in page.locator("#dj-live-status").inner_text()
    assert "completed" in page.locator("[data-live=timeline]").inner_text(), "the timeline moved too"
    page.goto(job_page(result.id))
    assert page.locator("#dj-live").count() == 0, "a finished job's page does not poll"
    assert not page.watched.console_errors and not page.watched.foreign_requests()


# -- permissions ----------------------------------------------------------------------------------


def test_staff_with_view_permissions_only_sees_no_buttons_or_actions(page):
    data = seed()
    sched = django_jobs.schedule("hourly", tasks.noop, cron="0 * * * *")
    viewer(page)

    page.goto(OVERVIEW)
    assert cell(page, "emails", "data-state", "waiting") == "2"
    page.goto(queue_page("emails"))
    assert page.locator("#jobs-queue-figures").is_visible()
    assert page.locator("#jobs-controls, input[name=pause], #jobs-limits-form, #jobs-drain-link").count() == 0

    page.goto(JOBS)
    assert len(listed(page)) == 0 and page.locator("#result_list tbody tr").count() == 10
    assert page.locator("select[name=action], #action-toggle").count() == 0

    page.goto(job_page(data["failed"][0]))
    assert "ValueError" in page.locator("#errors").inner_text()
    assert page.locator(".dj-buttons, .dj-buttons button").count() == 0

    page.goto(f"{SCHEDULES}{sched.pk}/change/")
    assert page.locator("#next-runs li.dj-run").count() == 5
    assert page.locator("#run-now-form, input[name=_save], input[name=_preview]").count() == 0

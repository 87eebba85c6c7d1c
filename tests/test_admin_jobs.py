"""The operations console's job pages: the jobs changelist (no COUNT, filters, search, paging,
actions on a selection and on every filtered job), the job page and its buttons, permissions,
CSRF, escaping, schedules (preview, run now, enable/disable) and workers."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.models import DELETION, LogEntry
from django.db import connection
from django.tasks import task
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_jobs
from django_jobs import engine, schedules
from django_jobs.admin import jobs as jobs_admin
from django_jobs.models import Event, Job, Schedule
from django_jobs.testing import drain_queue
from tests import factories, tasks
from tests.factories import get_page, insert_job, listed, staff_client, state_of, superuser_client

CHANGELIST = "/admin/django_jobs/job/"
XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


# Tasks of these tests (module level, so their dotted paths resolve).
@task(takes_context=True)
def logs_then_fails(context, text: str):
    context.log(f"starting {text}")
    context.set_progress({"current": 3, "total": 4})
    raise ValueError(f"bad input {text}")


@task
def returns(value):
    return value


@task(takes_context=True)
def logs_lines(context, n: int):
    for i in range(n):
        context.log(f"line {i}")


# -- helpers ------------------------------------------------------------------------------------


def page(client: Client, url: str = CHANGELIST, **params) -> str:
    return get_page(client, url, params)


def failed_job(message: str = "boom"):
    result = tasks.always_fails.enqueue(message)
    drain_queue()
    assert state_of(result) == "failed"
    return result


def completed_job():
    result = tasks.add.enqueue(1, 2)
    drain_queue()
    assert state_of(result) == "completed"
    return result


def act(client: Client, action: str, ids, query: str = "", across: bool = False, confirm: bool = True):
    """POST an action of the changelist (``confirm``: past the delete action's confirmation)."""
    data = {"action": action, "index": "0", "select_across": "1" if across else "0"}
    if confirm:
        data["post"] = "yes"
    data["_selected_action"] = [str(getattr(i, "id", i)) for i in ids]
    return client.post(CHANGELIST + query, data)


def messages_of(response) -> list[str]:
    """The messages this request added (not those left over from earlier ones)."""
    return [str(m) for m in response.wsgi_request._messages._queued_messages]


def job_queries(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "django_jobs_job" in q["sql"]]


# -- the changelist -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_changelist_lists_jobs_newest_first_with_state_badges():
    first = tasks.noop.enqueue()
    second = tasks.add.using(queue_name="emails", priority=5).enqueue(1, 2)
    client = superuser_client()
    body = page(client)
    assert body.index(second.id) < body.index(first.id), "newest first"
    assert '<span class="dj-state dj-state-waiting">waiting</span>' in body
    assert "tests.tasks.add" in body and "emails" in body and "0/1" in body
    assert 'value="delete_selected"' not in body, "Django's ORM delete is replaced by the engine's"
    for action in ("retry_jobs", "cancel_jobs", "run_jobs_now", "delete_jobs"):
        assert f'value="{action}"' in body


@pytest.mark.django_db
def test_the_changelist_never_counts_the_job_table(admin_client):
    failed_job()
    tasks.noop.using(queue_name="emails").enqueue()
    pages = [
        {},
        {"state": "failed"},
        {"queue": "emails"},
        {"task": "tests.tasks.noop"},
        {"priority": "0"},
        {"q": "noop"},
        {"q": str(uuid.uuid4())},
        {"_facets": "1"},
        {"all": ""},
        {"finished_at__range__gte_0": "2020-01-01", "finished_at__range__gte_1": "00:00:00"},
    ]
    for params in pages:
        with CaptureQueriesContext(connection) as ctx:
            page(admin_client, **params)
        queries = job_queries(ctx)
        assert queries, "the page did read jobs"
        counts = [sql for sql in queries if "COUNT(" in sql.upper()]
        assert not counts, (params, counts)
        assert any("LIMIT 101" in sql for sql in queries), "one page (and one row more) is read, no more"
        for sql in queries:
            if "DISTINCT" in sql.upper() and '"django_jobs_job"' in sql:
                assert "waiting" in sql, f"a DISTINCT over the whole job table: {sql}"


@pytest.mark.django_db
def test_each_filter_narrows_the_list(admin_client):
    failed = failed_job()
    done = completed_job()
    emails = tasks.noop.using(queue_name="emails").enqueue()
    urgent = tasks.noop.using(priority=7).enqueue()
    traced = tasks.noop.using(trace_id="trace-abc").enqueue()
    everything = {failed.id, done.id, emails.id, urgent.id, traced.id}
    assert listed(page(admin_client)) == everything
    assert listed(page(admin_client, state="failed")) == {failed.id}
    assert listed(page(admin_client, queue="emails")) == {emails.id}
    assert listed(page(admin_client, task="tests.tasks.add")) == {done.id}
    assert listed(page(admin_client, priority="7")) == {urgent.id}
    assert listed(page(admin_client, trace="trace-abc")) == {traced.id}
    assert listed(page(admin_client, state="waiting", queue="emails")) == {emails.id}

    body = page(admin_client)
    for choice in ("?queue=emails", "?task=tests.tasks.add", "?state=failed", "?priority=7"):
        assert choice in body, f"{choice} is offered"
    assert "?trace=" not in body, "the trace filter shows only when set"
    assert "?task=tests.tasks.echo" in body, "a registered task without jobs is offered too"


@pytest.mark.django_db
def test_the_date_range_filters_narrow_the_list(admin_client):
    done = completed_job()
    waiting = tasks.noop.enqueue()
    today = datetime.now(UTC).date()

    def between(field, start, end):
        return {
            f"{field}__range__gte_0": start.isoformat(),
            f"{field}__range__gte_1": "00:00:00",
            f"{field}__range__lte_0": end.isoformat(),
            f"{field}__range__lte_1": "23:59:59",
        }

    day = timedelta(days=1)
    assert listed(page(admin_client, **between("finished_at", today - day, today + day))) == {done.id}
    assert listed(page(admin_client, **between("started_at", today - day, today + day))) == {done.id}
    assert listed(page(admin_client, **between("enqueued_at", today - day, today + day))) == {done.id, waiting.id}
    assert listed(page(admin_client, **between("enqueued_at", today + day, today + 2 * day))) == set()
    assert "enqueued" in page(admin_client) and "admindatefilter" in page(admin_client)


MALFORMED = [
    {"state": "';DROP TABLE django_jobs_job;--"},
    {"state": "nope"},
    {"priority": "abc"},
    {"priority": "1000"},
    {"foo__bar": "1"},
    {"p": "-3"},
    {"p": "999"},
    {"queue": "a\x00b"},
    {"task": "\x00"},
    {"trace": "\x00"},
]


@pytest.mark.django_db
@pytest.mark.parametrize("params", MALFORMED, ids=[repr(p) for p in MALFORMED])
def test_malformed_parameters_redirect_with_the_admins_error_flag(admin_client, params):
    tasks.noop.enqueue()
    response = admin_client.get(CHANGELIST, params)
    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")


ODD = [
    {"p": "abc"},
    {"o": "abc"},
    {"o": "4"},
    {"q": "id:not-a-uuid"},
    {"q": "not a uuid at all"},
    {"q": XSS},
    {"enqueued_at__range__gte_0": "not-a-date", "enqueued_at__range__gte_1": "25:99"},
    {"finished_at__range__lte_0": "2026-13-45"},
    {"trace": XSS},
    {"q": "a\x00b"},
]


@pytest.mark.django_db
@pytest.mark.parametrize("params", ODD, ids=[str(i) for i in range(len(ODD))])
def test_odd_parameters_render_the_list_without_error(admin_client, params):
    tasks.noop.enqueue()
    body = page(admin_client, **params)
    assert "<script>alert" not in body


@pytest.mark.django_db
def test_a_raw_lookup_value_the_database_refuses_is_not_a_server_error(admin_client):
    tasks.noop.enqueue()
    response = admin_client.get(CHANGELIST, {"task_path": "x\x00"})  # PostgreSQL: no NUL in text
    assert response.status_code in (200, 302)
    if response.status_code == 302:
        assert response["Location"].endswith("?e=1")


@pytest.mark.django_db
def test_a_lookup_across_a_relation_is_refused_with_400(admin_client):
    assert admin_client.get(CHANGELIST, {"parent__task_path": "x"}).status_code == 400


@pytest.mark.django_db
def test_search_by_id_trace_keys_and_task(admin_client):
    a = tasks.noop.using(trace_id="0190aaaa0000700080000000000000aa").enqueue()
    b = tasks.add.using(idempotency_key="order-17").enqueue(1, 1)
    c = tasks.noop.using(partition="customer-9").enqueue()
    d = tasks.noop.using(dedup=django_jobs.Dedup(key="nightly-report")).enqueue()
    assert listed(page(admin_client, q=a.id)) == {a.id}
    assert listed(page(admin_client, q=f"  {b.id} ")) == {b.id}
    assert listed(page(admin_client, q="0190aaaa0000700080000000000000aa")) == {a.id}, "a trace id (a UUID's hex)"
    assert listed(page(admin_client, q="order-17")) == {b.id}
    assert listed(page(admin_client, q="key:order-17")) == {b.id}
    assert listed(page(admin_client, q="partition:customer-9")) == {c.id}
    assert listed(page(admin_client, q="customer-9")) == {c.id}
    assert listed(page(admin_client, q="nightly-report")) == {d.id}
    assert listed(page(admin_client, q="dedup:nightly-report")) == {d.id}
    assert listed(page(admin_client, q="tasks.ad")) == {b.id}, "a task path containing it"
    assert listed(page(admin_client, q="task:tasks.noop")) == {a.id, c.id, d.id}
    assert listed(page(admin_client, q="tests.tasks.add")) == {b.id}, "a known task path"
    assert listed(page(admin_client, q="task:tests.tasks.noop")) == {a.id, c.id, d.id}
    assert listed(page(admin_client, q="task:Tasks.NOOP")) == {a.id, c.id, d.id}, "in any case"
    assert listed(page(admin_client, q=f"id:{c.id}")) == {c.id}
    assert listed(page(admin_client, q="id:nope")) == set()
    assert listed(page(admin_client, q="nothing-matches")) == set()


@pytest.mark.django_db
def test_pages_link_to_the_next_and_previous_page_without_a_total(admin_client, monkeypatch):
    monkeypatch.setattr(admin.site._registry[Job], "list_per_page", 3)
    ids = [tasks.noop.enqueue().id for _ in range(7)][::-1]  # newest first
    first = page(admin_client)
    assert [i for i in ids if i in listed(first)] == ids[:3]
    assert 'rel="next"' in first and 'rel="prev"' not in first
    assert "jobs 1&ndash;3" in first
    second = page(admin_client, p="2")
    assert listed(second) == set(ids[3:6]) and 'rel="prev"' in second and 'rel="next"' in second
    third = page(admin_client, p="3")
    assert listed(third) == {ids[6]} and 'rel="next"' not in third
    assert "?p=3" in second, "the next link"


@pytest.mark.django_db
def test_changelist_escapes_task_paths_and_queues(admin_client):
    insert_job(task_path=f"tests.{XSS}", queue="q", args=[XSS])
    body = page(admin_client)
    assert "<script>alert(1)</script>" not in body
    assert XSS_ESCAPED in body
    body = page(admin_client, task=f"tests.{XSS}")
    assert "<script>alert(1)</script>" not in body and len(listed(body)) == 1
    [job_id] = listed(body)
    body = page(admin_client, f"{CHANGELIST}{job_id}/change/")
    assert "<script>alert(1)</script>" not in body and f"tests.{XSS_ESCAPED}" in body


# -- actions ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_retry_action_requeues_the_selected_failed_jobs_only(admin_client):
    a, b, other = failed_job(), failed_job(), failed_job()
    done = completed_job()
    response = act(admin_client, "retry_jobs", [a, b, done])
    assert response.status_code == 302
    assert (state_of(a), state_of(b), state_of(other), state_of(done)) == ("waiting", "waiting", "failed", "completed")
    assert messages_of(response) == ["Retried 2 jobs; 1 was not failed or cancelled and was left as it is."]


@pytest.mark.django_db
def test_actions_on_every_filtered_job_walk_it_in_batches(admin_client, monkeypatch):
    monkeypatch.setattr(jobs_admin, "BATCH_SIZE", 2)
    in_queue = [tasks.noop.using(queue_name="bulk").enqueue() for _ in range(5)]
    elsewhere = [tasks.noop.enqueue() for _ in range(2)]
    response = act(admin_client, "cancel_jobs", in_queue[:1], query="?queue=bulk", across=True)
    assert response.status_code == 302
    assert [state_of(j) for j in in_queue] == ["cancelled"] * 5
    assert [state_of(j) for j in elsewhere] == ["waiting"] * 2, "only the filtered jobs"
    assert messages_of(response) == ["Cancelled 5 jobs."]

    response = act(admin_client, "retry_jobs", in_queue[:1], query="?queue=bulk&state=cancelled", across=True)
    assert [state_of(j) for j in in_queue] == ["waiting"] * 5
    assert messages_of(response) == ["Retried 5 jobs."]

    response = act(admin_client, "delete_jobs", in_queue[:1], query="?queue=bulk", across=True)
    assert not Job.objects.filter(queue="bulk").exists()
    assert Job.objects.filter(pk__in=[j.id for j in elsewhere]).count() == 2
    assert messages_of(response) == ["Deleted 5 jobs."]


@pytest.mark.django_db
def test_select_across_honours_the_search_too(admin_client):
    keep = tasks.noop.enqueue()
    hit = tasks.add.enqueue(1, 2)
    act(admin_client, "cancel_jobs", [hit], query="?q=tasks.add", across=True)
    assert (state_of(hit), state_of(keep)) == ("cancelled", "waiting")


@pytest.mark.django_db
def test_cancel_action_leaves_finished_jobs_and_says_so(admin_client):
    done = completed_job()
    waiting = tasks.noop.enqueue()
    response = act(admin_client, "cancel_jobs", [waiting, done])
    assert (state_of(waiting), state_of(done)) == ("cancelled", "completed")
    assert messages_of(response) == ["Cancelled 1 job; 1 was already finished or asked to stop and was left as it is."]


@pytest.mark.django_db
def test_run_now_action_makes_delayed_jobs_ready(admin_client):
    later = [tasks.noop.using(run_after=timedelta(hours=2)).enqueue() for _ in range(2)]
    waiting = tasks.noop.enqueue()
    untouched = tasks.noop.using(run_after=timedelta(hours=2)).enqueue()
    response = act(admin_client, "run_jobs_now", [*later, waiting])
    assert [state_of(j) for j in later] == ["waiting", "waiting"]
    assert state_of(untouched) == "delayed" and state_of(waiting) == "waiting"
    assert messages_of(response) == ["2 jobs will run now; 1 was not delayed and was left as it is."]
    act(admin_client, "run_jobs_now", [untouched], query="?state=delayed", across=True)
    assert state_of(untouched) == "waiting"


@pytest.mark.django_db
def test_delete_action_deletes_through_the_engine_with_logs(admin_client):
    job = Job.objects.get(pk=tasks.noop.enqueue().id)
    kept = tasks.noop.enqueue()
    logs_then_fails.enqueue("x")
    drain_queue()
    logged = Job.objects.get(task_path__endswith="logs_then_fails")
    assert logged.logs.exists()
    response = act(admin_client, "delete_jobs", [job.pk, logged.pk])
    assert messages_of(response) == ["Deleted 2 jobs."]
    assert not Job.objects.filter(pk__in=[job.pk, logged.pk]).exists()
    assert Job.objects.filter(pk=kept.id).exists()


@pytest.mark.django_db
def test_a_malformed_id_in_the_selection_is_a_400(admin_client):
    job = tasks.noop.enqueue()
    response = act(admin_client, "cancel_jobs", [job.id, "not-a-uuid"])
    assert response.status_code == 400
    assert state_of(job) == "waiting"


# -- permissions and CSRF -----------------------------------------------------------------------


@pytest.mark.django_db
def test_staff_sees_only_the_actions_and_buttons_it_may_use():
    failed = failed_job()
    viewer = staff_client("view_job", name="viewer")
    body = page(viewer)
    assert failed.id in body
    assert not any(f'value="{a}"' in body for a in jobs_admin.JOB_ACTIONS), "no action offered"
    job_page = page(viewer, f"{CHANGELIST}{failed.id}/change/")
    assert "data-action=" not in job_page, "no button"

    retrier = staff_client("view_job", "retry_job", name="retrier")
    body = page(retrier)
    assert 'value="retry_jobs"' in body
    assert not any(f'value="{a}"' in body for a in ("cancel_jobs", "run_jobs_now", "delete_jobs"))
    job_page = page(retrier, f"{CHANGELIST}{failed.id}/change/")
    assert 'data-action="retry"' in job_page and 'data-action="delete"' not in job_page

    deleter = staff_client("view_job", "delete_job", name="deleter")
    job_page = page(deleter, f"{CHANGELIST}{failed.id}/change/")
    assert 'data-action="delete"' in job_page and 'data-action="retry"' not in job_page


@pytest.mark.django_db
def test_a_forged_action_post_is_403_and_changes_nothing():
    failed = failed_job()
    waiting = tasks.noop.enqueue()
    retrier = staff_client("view_job", "retry_job")
    for action, job in (("cancel_jobs", waiting), ("delete_jobs", waiting), ("run_jobs_now", waiting)):
        response = act(retrier, action, [job])
        assert response.status_code == 403, action
    assert state_of(waiting) == "waiting"
    assert act(retrier, "retry_jobs", [failed]).status_code == 302
    assert state_of(failed) == "waiting", "the permitted one works"
    assert act(retrier, "delete_selected", [waiting]).status_code == 302, "Django's own: no action taken"
    viewer = staff_client("view_job", name="viewer")
    assert act(viewer, "cancel_jobs", [waiting], query="?queue=default", across=True).status_code == 403
    assert state_of(waiting) == "waiting"


@pytest.mark.django_db
def test_a_forged_post_to_a_job_button_is_403_and_changes_nothing():
    failed = failed_job()
    waiting = tasks.noop.enqueue()
    delayed = tasks.noop.using(run_after=timedelta(hours=1)).enqueue()
    viewer = staff_client("view_job", "retry_job")
    assert viewer.post(f"{CHANGELIST}{waiting.id}/cancel/").status_code == 403
    assert viewer.post(f"{CHANGELIST}{waiting.id}/delete/").status_code == 403
    assert viewer.post(f"{CHANGELIST}{delayed.id}/run-now/").status_code == 403
    assert (state_of(waiting), state_of(delayed)) == ("waiting", "delayed")
    nobody = staff_client(name="nobody")
    assert nobody.post(f"{CHANGELIST}{failed.id}/retry/").status_code == 403
    assert nobody.get(f"{CHANGELIST}{failed.id}/change/").status_code == 403
    assert state_of(failed) == "failed"
    assert viewer.post(f"{CHANGELIST}{failed.id}/retry/").status_code == 302
    assert state_of(failed) == "waiting"


@pytest.mark.django_db
def test_csrf_is_enforced_on_buttons_and_actions(admin_user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    waiting = tasks.noop.enqueue()
    assert client.post(f"{CHANGELIST}{waiting.id}/cancel/").status_code == 403
    data = {"action": "cancel_jobs", "index": "0", "_selected_action": [waiting.id]}
    assert client.post(CHANGELIST, data).status_code == 403
    assert state_of(waiting) == "waiting"
    body = page(client, f"{CHANGELIST}{waiting.id}/change/")
    form = re.search(
        r'<form method="post" action="([^"]+/cancel/)">.*?name="csrfmiddlewaretoken" value="([^"]+)"', body, re.S
    )
    assert form, "the cancel button is a POST form with a CSRF token"
    response = client.post(form.group(1), {"csrfmiddlewaretoken": form.group(2)})
    assert response.status_code == 302
    assert state_of(waiting) == "cancelled"


# -- the job page -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_job_page_shows_arguments_progress_errors_logs_and_timeline(admin_client):
    result = logs_then_fails.using(trace_id="page-trace").enqueue(XSS)
    sibling = tasks.noop.using(trace_id="page-trace").enqueue()
    drain_queue()
    Event.objects.create(
        queue="default", job_id=result.id, kind="failed", data={"error": XSS}, created_at=datetime.now(UTC)
    )
    body = page(admin_client, f"{CHANGELIST}{result.id}/change/")
    assert "tests.test_admin_jobs.logs_then_fails" in body
    assert '<span class="dj-state dj-state-failed">failed</span>' in body
    assert "<script>alert(1)</script>" not in body, "nothing of the job is raw HTML"
    assert f"[\n  &quot;{XSS_ESCAPED}&quot;\n]" in body, "args pretty-printed as JSON, escaped"
    assert '<progress max="100" value="75.0">' in body, "current/total as a bar"
    assert "builtins.ValueError" in body and f"ValueError: bad input {XSS_ESCAPED}" in body
    assert "Traceback (most recent call last)" in body
    assert f"starting {XSS_ESCAPED}" in body, "the log line"
    assert "Attempt 1" in body
    timeline = body[body.index('id="timeline"') :]
    assert "failed" in timeline and f"&quot;error&quot;: &quot;{XSS_ESCAPED}&quot;" in timeline
    trace = body[body.index('id="trace"') :]
    assert "?trace=page-trace" in trace and sibling.id in trace
    assert 'data-action="retry"' in body and 'data-action="cancel"' not in body, "only what applies to a failed job"


@pytest.mark.django_db
def test_the_timeline_of_a_job_of_a_batch_says_where_its_enqueue_is_recorded(admin_client):
    single = tasks.noop.enqueue()
    batch = tasks.noop.enqueue_many([(), ()])
    note = "no <code>enqueued</code> event of its own"
    timeline = page(admin_client, f"{CHANGELIST}{batch[1].id}/change/").split('id="timeline"')[1]
    assert note in timeline and "enqueued-many" in timeline
    assert note not in page(admin_client, f"{CHANGELIST}{single.id}/change/")


@pytest.mark.django_db
def test_the_job_page_shows_result_and_numeric_progress(admin_client):
    done = returns.enqueue({"total": 3, "html": XSS})
    drain_queue()
    body = page(admin_client, f"{CHANGELIST}{done.id}/change/")
    assert f"&quot;html&quot;: &quot;{XSS_ESCAPED}&quot;" in body and "&quot;total&quot;: 3" in body
    assert "No attempt failed." in body and "No log lines." in body
    assert jobs_admin.progress_percent(42) == 42.0
    assert jobs_admin.progress_percent({"percent": 10}) == 10.0
    assert jobs_admin.progress_percent({"current": 1, "total": 4}) == 25.0
    assert jobs_admin.progress_percent({"step": "x"}) is None and jobs_admin.progress_percent(True) is None
    assert jobs_admin.progress_percent(150) is None


@pytest.mark.django_db
def test_the_job_page_caps_the_log(admin_client, monkeypatch):
    monkeypatch.setattr(jobs_admin, "LOG_LINES_SHOWN", 3)
    result = logs_lines.enqueue(5)
    drain_queue()
    body = page(admin_client, f"{CHANGELIST}{result.id}/change/")
    assert "line 4" in body and "line 2" in body and "line 1" not in body
    assert "Showing the last 3 lines only." in body


@pytest.mark.django_db
def test_the_job_page_links_a_flow_up_and_down(admin_client):
    from django_jobs import flow

    root = flow(
        tasks.noop, children=[flow(tasks.add, args=[1, 2], children=[flow(tasks.noop.using(queue_name="kids"))])]
    )
    parent = root.enqueue()
    middle = Job.objects.get(parent_id=parent.id)
    leaf = Job.objects.get(parent_id=middle.pk)
    body = page(admin_client, f"{CHANGELIST}{middle.pk}/change/")
    flow_part = body[body.index('id="flow"') :]
    assert f'href="{CHANGELIST}{parent.id}/change/"' in flow_part, "the parent"
    assert f'href="{CHANGELIST}{leaf.pk}/change/"' in flow_part, "the child"
    assert "Children (flow)" in flow_part and "pending" in flow_part and "kids" in flow_part
    leaf_page = page(admin_client, f"{CHANGELIST}{leaf.pk}/change/")
    chain = leaf_page[leaf_page.index('id="flow"') :]
    assert chain.index(str(parent.id)) < chain.index(str(middle.pk)), "the ancestors, root first"


@pytest.mark.django_db
def test_job_buttons_act_through_the_engine_and_come_back(admin_client):
    waiting = tasks.noop.enqueue()
    url = f"{CHANGELIST}{waiting.id}/cancel/"
    response = admin_client.post(url)
    assert response.status_code == 302 and response["Location"] == f"{CHANGELIST}{waiting.id}/change/"
    assert state_of(waiting) == "cancelled"
    assert messages_of(response) == [f"Job {waiting.id} was cancelled."]
    response = admin_client.post(f"{CHANGELIST}{waiting.id}/cancel/")
    assert messages_of(response) == [f"Job {waiting.id} was not cancelled: it is cancelled."]
    admin_client.post(f"{CHANGELIST}{waiting.id}/retry/")
    assert state_of(waiting) == "waiting"
    delayed = tasks.noop.using(run_after=timedelta(hours=1)).enqueue()
    admin_client.post(f"{CHANGELIST}{delayed.id}/run-now/")
    assert state_of(delayed) == "waiting"
    response = admin_client.post(f"{CHANGELIST}{delayed.id}/delete/")
    assert response["Location"] == CHANGELIST and not Job.objects.filter(pk=delayed.id).exists()
    history = page(admin_client, f"{CHANGELIST}{waiting.id}/history/")
    assert f"Job {waiting.id} was cancelled." in history and f"Job {waiting.id} was re-queued." in history
    assert LogEntry.objects.filter(object_id=str(delayed.id), action_flag=DELETION).exists()


@pytest.mark.django_db
def test_unknown_and_malformed_job_ids_are_404(admin_client):
    assert admin_client.get(f"{CHANGELIST}not-a-uuid/change/").status_code == 404
    assert admin_client.get(f"{CHANGELIST}{uuid.uuid4()}/change/").status_code == 404
    assert admin_client.post(f"{CHANGELIST}{uuid.uuid4()}/retry/").status_code == 404
    assert admin_client.post(f"{CHANGELIST}%3Cscript%3E/cancel/").status_code == 404
    job = tasks.noop.enqueue()
    assert admin_client.get(f"{CHANGELIST}{job.id}/cancel/").status_code == 405, "buttons only POST"
    assert state_of(job) == "waiting"
    assert admin_client.get(f"{CHANGELIST}{job.id}/history/").status_code == 200


# -- schedules ----------------------------------------------------------------------------------


SCHEDULES = "/admin/django_jobs/schedule/"


def schedule_form(**fields) -> dict:
    """The schedule form of "nightly", tests.tasks.add(1, 2), with ``fields`` set."""
    return factories.schedule_form(**{"name": "nightly", "task_path": "tests.tasks.add", "args": "[1, 2]", **fields})


def runs(body: str) -> list[str]:
    return re.findall(r'<li class="dj-run">([^<]+)', body)


@pytest.mark.django_db
def test_schedule_list_and_change_page_show_the_next_five_runs(admin_client):
    sched = schedules.schedule("nightly", "tests.tasks.add", cron="30 6 * * *", timezone="Europe/Paris", args=[1, 2])
    listing = page(admin_client, SCHEDULES)
    assert "nightly" in listing and "30 6 * * *" in listing and "Europe/Paris" in listing
    body = page(admin_client, f"{SCHEDULES}{sched.pk}/change/")
    shown = runs(body)
    assert len(shown) == 5 and all(" 06:30:00 " in r for r in shown), shown
    assert "Of the saved schedule." in body
    expected = schedules.next_runs(sched, n=5)
    assert expected[0] == sched.next_run_at
    assert [r.split(" ")[0] for r in shown] == [
        e.astimezone(schedules.zone("Europe/Paris")).date().isoformat() for e in expected
    ]


@pytest.mark.django_db
def test_schedule_search_matches_names_and_task_paths_in_any_case(admin_client):
    schedules.schedule("Nightly-Report", "tests.tasks.add", cron="0 3 * * *")
    schedules.schedule("hourly", "tests.tasks.noop", cron="0 * * * *")
    assert "Nightly-Report" in page(admin_client, SCHEDULES, q="nightly")
    assert "hourly" not in page(admin_client, SCHEDULES, q="nightly")
    assert "hourly" in page(admin_client, SCHEDULES, q="TASKS.NOOP")
    assert "Nightly-Report" not in page(admin_client, SCHEDULES, q="report noop")


@pytest.mark.django_db
def test_the_preview_button_shows_the_entered_runs_and_saves_nothing(admin_client):
    response = admin_client.post(f"{SCHEDULES}add/", schedule_form(cron="*/15 * * * *", _preview="1"))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Of the fields as entered (not saved)." in body and "errornote" not in body
    shown = runs(body)
    assert len(shown) == 5
    minutes = [int(r.split(" ")[1].split(":")[1]) for r in shown]
    assert all(m % 15 == 0 for m in minutes)
    assert not Schedule.objects.exists()

    sched = schedules.schedule("hourly", "tests.tasks.noop", cron="0 * * * *")
    response = admin_client.post(
        f"{SCHEDULES}{sched.pk}/change/", schedule_form(name="hourly", every_seconds="90", _preview="1")
    )
    assert len(runs(response.content.decode())) == 5
    sched.refresh_from_db()
    assert (sched.cron, sched.every_seconds) == ("0 * * * *", None), "not saved"


@pytest.mark.django_db
def test_an_invalid_cron_timezone_or_interval_is_a_form_error_with_the_reason(admin_client):
    for fields, reason in (
        ({"cron": "61 * * * *"}, "Invalid cron expression"),
        ({"cron": "* * * * *", "timezone": "Nowhere/Land"}, "Unknown timezone"),
        ({"every_seconds": "-5"}, "every must be a number of seconds"),
        ({"every_seconds": "abc"}, "Enter a number"),
        ({"cron": "", "every_seconds": ""}, "Give exactly one of cron"),
        ({"cron": XSS}, "cron must be 5 fields"),
    ):
        for extra in ({}, {"_preview": "1"}):
            response = admin_client.post(f"{SCHEDULES}add/", schedule_form(**fields, **extra))
            assert response.status_code == 200, fields
            body = response.content.decode()
            assert reason in body, (fields, extra)
            assert "<script>alert(1)</script>" not in body
            assert runs(body) == []
    assert not Schedule.objects.exists()


@pytest.mark.django_db
def test_saving_a_valid_schedule_still_works(admin_client):
    response = admin_client.post(f"{SCHEDULES}add/", schedule_form(cron="0 6 * * *"))
    assert response.status_code == 302
    assert Schedule.objects.get(name="nightly").next_run_at.hour == 6


@pytest.mark.django_db
def test_run_now_enqueues_one_job_from_the_template_outside_the_ticks(admin_client):
    sched = schedules.schedule("nightly", "tests.tasks.add", cron="0 3 * * *", args=[2, 5], queue="reports", limit=1)
    before = Schedule.objects.get(pk=sched.pk)
    body = page(admin_client, f"{SCHEDULES}{sched.pk}/change/")
    assert f'action="{SCHEDULES}{sched.pk}/run-now/"' in body
    response = admin_client.post(f"{SCHEDULES}{sched.pk}/run-now/")
    assert response.status_code == 302 and response["Location"] == f"{SCHEDULES}{sched.pk}/change/"
    job = Job.objects.get()
    assert (job.task_path, job.args, job.queue, job.scheduler_key, job.state) == (
        "tests.tasks.add", [2, 5], "reports", None, "waiting"
    )  # fmt: skip
    [message] = messages_of(response)
    assert f'<a href="{CHANGELIST}{job.pk}/change/">{job.pk}</a>' in message
    after = Schedule.objects.get(pk=sched.pk)
    assert (after.iterations, after.next_run_at) == (before.iterations, before.next_run_at), "not a tick"
    admin_client.post(f"{SCHEDULES}{sched.pk}/run-now/")
    assert Job.objects.count() == 2, "no unique tick key to collide on"
    drain_queue("reports")
    assert set(Job.objects.values_list("return_value", flat=True)) == {7}


@pytest.mark.django_db
def test_run_now_needs_post_the_change_permission_and_a_known_schedule(admin_client):
    sched = schedules.schedule("nightly", "tests.tasks.noop", every=3600)
    assert admin_client.get(f"{SCHEDULES}{sched.pk}/run-now/").status_code == 405
    assert admin_client.post(f"{SCHEDULES}999999/run-now/").status_code == 404
    assert admin_client.post(f"{SCHEDULES}abc/run-now/").status_code == 404
    viewer = staff_client("view_schedule")
    assert viewer.post(f"{SCHEDULES}{sched.pk}/run-now/").status_code == 403
    assert "run-now-form" not in page(viewer, f"{SCHEDULES}{sched.pk}/change/")
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_schedule_actions_run_now_disable_and_enable(admin_client):
    a = schedules.schedule("a", "tests.tasks.noop", every=60)
    b = schedules.schedule("b", "tests.tasks.noop", every=60)
    data = {"action": "run_schedules_now", "index": "0", "_selected_action": [a.pk, b.pk]}
    response = admin_client.post(SCHEDULES, data)
    assert Job.objects.count() == 2 and len(messages_of(response)) == 2
    admin_client.post(SCHEDULES, {**data, "action": "disable_schedules"})
    assert not Schedule.objects.filter(enabled=True).exists()
    Schedule.objects.filter(pk=a.pk).update(next_run_at=datetime(2020, 1, 1, tzinfo=UTC))
    response = admin_client.post(SCHEDULES, {**data, "action": "enable_schedules", "_selected_action": [a.pk]})
    a.refresh_from_db()
    assert a.enabled and a.next_run_at > datetime.now(UTC), "missed ticks are not caught up"
    assert a.source == "runtime" and a.edited_at is not None
    assert messages_of(response) == ["Enabled 1 schedule."]
    assert admin_client.post(SCHEDULES, {**data, "_selected_action": ["x"]}).status_code == 400
    viewer = staff_client("view_schedule")
    assert viewer.post(SCHEDULES, {**data, "action": "enable_schedules"}).status_code in (200, 302, 403)
    assert not Schedule.objects.get(pk=b.pk).enabled, "without the change permission nothing changes"


def test_next_runs_of_fields_and_of_saved_schedules():
    now = datetime(2026, 3, 1, 10, 7, tzinfo=UTC)
    assert schedules.next_runs({"cron": "*/15 * * * *"}, n=3, now=now) == [
        datetime(2026, 3, 1, 10, 15, tzinfo=UTC),
        datetime(2026, 3, 1, 10, 30, tzinfo=UTC),
        datetime(2026, 3, 1, 10, 45, tzinfo=UTC),
    ]
    assert schedules.next_runs({"every_seconds": 3600, "offset_seconds": 60}, n=2, now=now) == [
        datetime(2026, 3, 1, 11, 1, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 1, tzinfo=UTC),
    ]
    due = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    saved = {"cron": "0 * * * *", "next_run_at": due, "limit": 5, "iterations": 3}
    assert schedules.next_runs(saved, n=5, now=now) == [due, datetime(2026, 3, 1, 11, 0, tzinfo=UTC)], "the limit"
    end = {"cron": "0 * * * *", "end_at": datetime(2026, 3, 1, 12, 30, tzinfo=UTC)}
    assert len(schedules.next_runs(end, n=5, now=now)) == 2
    with pytest.raises(schedules.InvalidSchedule):
        schedules.next_runs({"cron": "61 * * * *"}, now=now)
    with pytest.raises(schedules.InvalidSchedule):
        schedules.next_runs({"cron": "* * * * *", "every_seconds": 5}, now=now)


# -- workers ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_workers_list_their_running_jobs(admin_client):
    engine.register_worker(using="default", worker_id="w-1", backend="default", queues=None, concurrency=4, pid=123)
    engine.register_worker(using="default", worker_id="w-2", backend="default", queues=["emails"], concurrency=1, pid=9)
    tasks.noop.enqueue()
    tasks.noop.enqueue()
    assert len(engine.claim_jobs(using="default", queues=None, limit=2, worker_id="w-1", lease_seconds=60)) == 2
    body = page(admin_client, "/admin/django_jobs/worker/")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr>.*?>(w-\d)(?:<br>.*?)?</a>.*?</tr>", body, re.S)}
    assert set(rows) == {"w-1", "w-2"}
    assert '<td class="field-running">2</td>' in rows["w-1"]
    assert '<td class="field-running">0</td>' in rows["w-2"] and "emails" in rows["w-2"]


@pytest.mark.django_db
def test_delete_asks_first_on_the_list_and_on_the_job_page(admin_client):
    jobs = [tasks.noop.using(queue_name="bulk").enqueue() for _ in range(3)]
    other = tasks.noop.using(queue_name="other").enqueue()
    response = act(admin_client, "delete_jobs", [jobs[0].id], query="?queue=bulk", across=True, confirm=False)
    body = response.content.decode()
    assert response.status_code == 200 and "Delete 3 jobs (every job the list" in body
    assert Job.objects.count() == 4, "the confirmation page deletes nothing"
    assert 'name="post" value="yes"' in body and 'action="/admin/django_jobs/job/?queue=bulk"' in body
    act(admin_client, "delete_jobs", [jobs[0].id], query="?queue=bulk", across=True)
    assert list(Job.objects.values_list("id", flat=True)) == [uuid.UUID(other.id)]

    page = admin_client.get(f"{CHANGELIST}{other.id}/delete/")
    assert page.status_code == 200 and "Delete job" in page.content.decode()
    assert Job.objects.filter(id=other.id).exists(), "GET only asks"
    admin_client.post(f"{CHANGELIST}{other.id}/delete/")
    assert not Job.objects.exists()


# -- the list and the page read at a glance (issue 15) ---------------------------------------------


@pytest.mark.django_db
def test_the_list_shows_a_failed_jobs_error_a_delayed_jobs_run_at_and_times_to_the_second(admin_client):
    failed = failed_job("no such customer 42")
    later = timezone.now() + timedelta(hours=3)
    delayed = tasks.noop.using(run_after=later).enqueue()
    body = page(admin_client)
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr>.*?value="([0-9a-f-]{36})".*?</tr>', body, re.S)}
    assert "builtins.ValueError" not in rows[failed.id], "the class's name, not its path"
    assert "ValueError: no such customer 42" in rows[failed.id]
    assert re.search(r"finished</span> \d{4}-\d\d-\d\d<br>\d\d:\d\d:\d\d UTC", rows[failed.id])
    assert f"runs at</span> {timezone.localtime(later):%Y-%m-%d<br>%H:%M:%S} UTC" in rows[delayed.id]
    assert f'title="{delayed.id}">…{delayed.id[-8:]}<' in rows[delayed.id], "a short id, the whole one in its title"
    assert "priority (of unfinished jobs)" in body, "the filter says which priorities it offers"


@pytest.mark.django_db
def test_the_timeline_orders_a_retry_inside_one_second_to_the_millisecond_and_summarises_each_event(admin_client):
    result = logs_then_fails.enqueue("x")  # two attempts, backoff 0: inside one second
    drain_queue()
    body = page(admin_client, f"{CHANGELIST}{result.id}/change/")
    timeline = body.split('id="timeline"')[1]
    times = re.findall(r'<td class="dj-time">(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC</td>', timeline)
    assert len(times) >= 4 and times == sorted(times), times  # (enqueued,) active, retried, active, failed
    assert "attempt 1, on " in timeline and "error builtins.ValueError" in timeline
    assert "<summary>raw event</summary>" in timeline, "the raw JSON behind a toggle"
    head = body.split('id="timeline"')[0]
    assert not re.search(r"\d\d:\d\d(?!:)\b(?! UTC)", re.sub(r"\d\d:\d\d:\d\d(\.\d{3})? UTC", "", head)), (
        "every time of the page in one format, to the second, with its zone"
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("progress", "percent"),
    [({"done": 3, "total": 4}, "75.0"), ({"current": 1, "total": 4}, "25.0"), ({"percent": 40}, "40.0"), (60, "60.0")],
)
def test_every_documented_progress_shape_draws_a_bar(admin_client, progress, percent):
    job_id = tasks.noop.enqueue().id
    Job.objects.filter(pk=job_id).update(progress=progress)
    body = page(admin_client, f"{CHANGELIST}{job_id}/change/")
    assert f'<progress max="100" value="{percent}">' in body

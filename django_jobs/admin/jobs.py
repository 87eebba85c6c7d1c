"""Admin for jobs: the jobs list and the job page of the operations console.

The job table may hold millions of rows, so the jobs changelist never counts it (see
:mod:`.changelist`): there is no date hierarchy and no facet counts; rows are ordered by the
primary key (UUIDv7, time-ordered), and the filters' choices come from small tables, the
settings, the code and the unfinished jobs (see :mod:`.filters`).

Every change of a job goes through :mod:`django_jobs.engine`: actions and the job page's buttons
call it, each after checking its own permission (``retry_job``, ``cancel_job``,
``run_job_now``, ``delete_job``); the admin never saves a job row itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseBadRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import re_path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from .. import engine
from ..models import Event, Job, JobDependency, JobLog
from ..spec.encryption import is_encrypted
from ..states import FINISHED_STATES, JobState
from .changelist import JobChangeList, UncountedPaginator
from .filters import (
    SEARCH_HELP,
    PriorityFilter,
    QueueFilter,
    StateFilter,
    TaskFilter,
    TraceFilter,
    range_filters,
    search_jobs,
)
from .utils import (
    database,
    error_rows,
    last_error,
    moment,
    parse_uuid,
    pretty,
    progress_percent,
    shown_json,
    state_class,
)

#: Jobs an action reads (and hands to the engine) per batch, walking its selection by keyset on
#: the primary key: a "select all" may cover millions of rows.
BATCH_SIZE = 500
#: Most rows of each kind the job page shows.
LOG_LINES_SHOWN = 1000
EVENTS_SHOWN = 500
CHILDREN_SHOWN = 200
ANCESTORS_SHOWN = 20
TRACE_JOBS_SHOWN = 20

RETRYABLE = frozenset({JobState.FAILED, JobState.CANCELLED})


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def _left(n: int, why: str) -> str:
    """The "2 were <why> and were left as they are" of an action's message."""
    was = "was" if n == 1 else "were"
    return f"{n} {was} {why} and {was} left as {'it is' if n == 1 else 'they are'}"


# -- the jobs admin -----------------------------------------------------------------------------

#: The actions of this admin and the permission (has_<name>_permission) each needs.
JOB_ACTIONS = {"retry_jobs": "retry", "cancel_jobs": "cancel", "run_jobs_now": "run_now", "delete_jobs": "delete"}
#: The job page's buttons (admin:django_jobs_job_action) and the permission each needs.
BUTTON_PERMISSIONS = {"retry": "retry", "cancel": "cancel", "run-now": "run_now", "delete": "delete"}


#: What the changelist's "when" column shows per state: (label, Job field).
_WHEN = {
    JobState.WAITING: ("enqueued", "enqueued_at"),
    JobState.WAITING_CHILDREN: ("enqueued", "enqueued_at"),
    JobState.DELAYED: ("runs at", "available_at"),
    JobState.ACTIVE: ("started", "last_attempted_at"),
}
#: Characters of a last error shown in the changelist (the whole line in its title).
ERROR_SHOWN = 60


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    change_list_template = "django_jobs/admin/job/change_list.html"
    # Fits 1280 px with the sidebar open: the id shortened (the whole one in its title and on
    # the job page), one "when" column saying which time it shows, the last error of a job
    # that has one.
    list_display = ("short_id", "task", "queue", "state_badge", "priority_display", "attempts_display", "when")
    list_display_links = ("short_id",)
    list_filter = (StateFilter, QueueFilter, TaskFilter, PriorityFilter, TraceFilter)
    # Only the primary key is sortable: it is the one order an index serves on any filter.
    sortable_by = ("id",)
    ordering = ("-id",)  # UUIDv7: newest first, by the primary key
    # What the search box covers; get_search_results does the searching (never icontains on all).
    search_fields = ("id", "task_path", "dedup_key", "idempotency_key", "trace_id", "partition_key")
    search_help_text = SEARCH_HELP
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are a COUNT per choice
    paginator = UncountedPaginator
    list_per_page = 100
    actions = ["retry_jobs", "cancel_jobs", "run_jobs_now", "delete_jobs"]

    # -- permissions (the job is read-only; changes go through the engine) --------------------

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_retry_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.retry_job")

    def has_cancel_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.cancel_job")

    def has_run_now_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.run_job_now")

    def _require(self, request: Any, permission: str) -> None:
        if not getattr(self, f"has_{permission}_permission")(request):
            raise PermissionDenied

    # -- the changelist -------------------------------------------------------------------------

    def get_queryset(self, request):
        return super().get_queryset(request).using(database())

    def get_list_filter(self, request):
        return [*self.list_filter, *range_filters()]

    def get_changelist(self, request, **kwargs):
        return JobChangeList

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        """The uncounted paginator for jobs; Django's own for the rest (the history page)."""
        if queryset.model is not Job:
            return Paginator(queryset, per_page, orphans, allow_empty_first_page)
        return super().get_paginator(request, queryset, per_page, orphans, allow_empty_first_page)

    def get_actions(self, request, action_location=None):
        # action_location: Django 6.1's (change-list or change-form actions); 6.0 has none.
        where = {"action_location": action_location} if action_location is not None else {}
        actions = super().get_actions(request, **where)
        actions.pop("delete_selected", None)  # an ORM cascade; delete_jobs goes through the engine
        return actions

    def action_checkbox(self, obj):
        # Django renders a form widget (a template) per row, about half of this page's time;
        # the same input, formatted directly.
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            obj.pk,
            f"Select this object for an action - {obj}",
        )

    @admin.display(description="state")
    def state_badge(self, job):
        return format_html('<span class="dj-state dj-state-{}">{}</span>', state_class(job.state), job.state)

    @admin.display(description="tries")
    def attempts_display(self, job):
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="prio")
    def priority_display(self, job):
        return job.priority

    @admin.display(description="task")
    def task(self, job):
        """The task's path, breakable after its dots, and under it the last error, if any."""
        path = format_html_join(mark_safe("<wbr>."), "{}", ((part,) for part in job.task_path.split(".")))
        line = last_error(job.errors)
        if not line:
            return path
        short = line if len(line) <= ERROR_SHOWN else line[: ERROR_SHOWN - 1] + "…"
        return format_html('{}<div class="dj-error" title="{}">{}</div>', path, line, short)

    @admin.display(description="job", ordering="id")
    def short_id(self, job):
        text = str(job.pk)
        return format_html('<span class="dj-id" title="{}">…{}</span>', text, text[-8:])

    @admin.display(description="when")
    def when(self, job):
        """The time that matters in the job's state, to the second, with its label."""
        label, at = _WHEN.get(job.state, ("finished", "finished_at"))
        day, _, time = moment(getattr(job, at)).partition(" ")
        return format_html('<span class="dj-when-label">{}</span> {}<br>{}', label, day, time)

    def get_search_results(self, request, queryset, search_term):
        """Exact matches on indexed columns instead of Django's ``icontains`` over every search
        field, which would scan the whole table: see :func:`.filters.search_jobs`."""
        return search_jobs(request, queryset, search_term)

    def changelist_view(self, request, extra_context=None):
        """Django ignores an action the user may not run ("no action selected", or no action
        handling at all for a user without any); one of ours posted without its permission is a
        forged request: refused with 403. Malformed ids in a selection are a 400."""
        if request.method == "POST" and "action" in request.POST:
            names = request.POST.getlist("action")
            try:
                name = names[int(request.POST.get("index", 0))]
            except (ValueError, IndexError):
                name = None
            if name in JOB_ACTIONS and not getattr(self, f"has_{JOB_ACTIONS[name]}_permission")(request):
                raise PermissionDenied
            if any(parse_uuid(pk) is None for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)):
                return HttpResponseBadRequest("Malformed job id in the selection.")
        return super().changelist_view(request, extra_context)

    # -- actions (on the selection, or on every job of the filtered list) ----------------------

    @admin.action(description="Retry the selected failed or cancelled jobs", permissions=["retry"])
    def retry_jobs(self, request, queryset):
        self._require(request, "retry")
        using, retried, skipped, refused = database(), 0, 0, 0
        for rows in _id_batches(queryset):
            for pk, state, _ in rows:
                if state not in RETRYABLE:
                    skipped += 1
                elif engine.retry_job(using=using, job_id=pk):
                    retried += 1
                else:
                    refused += 1
        parts = [f"Retried {_jobs(retried)}"]
        if skipped:
            parts.append(_left(skipped, "not failed or cancelled"))
        if refused:
            parts.append(_left(refused, "refused (a flow parent with unfinished children, or its state changed)"))
        self.message_user(request, "; ".join(parts) + ".", messages.SUCCESS if retried else messages.WARNING)

    @admin.action(description="Cancel the selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request, queryset):
        self._require(request, "cancel")
        using, cancelled, flagged, skipped, cascaded = database(), 0, 0, 0, 0
        for rows in _id_batches(queryset):
            for pk, state, _ in rows:
                result = None if state in FINISHED_STATES else engine.cancel_job(using=using, job_id=pk)
                if result is None or result.change is None:
                    skipped += 1
                    continue
                cascaded += len(result.descendants)
                if result.change == "cancelled":
                    cancelled += 1
                else:
                    flagged += 1
        parts = [f"Cancelled {_jobs(cancelled)}"]
        if cascaded:
            parts[0] += f" (and {_jobs(cascaded)} of their flows)"
        if flagged:
            parts.append(f"{flagged} {'was' if flagged == 1 else 'were'} running and asked to stop")
        if skipped:
            parts.append(_left(skipped, "already finished or asked to stop"))
        self.message_user(
            request, "; ".join(parts) + ".", messages.SUCCESS if cancelled + flagged else messages.WARNING
        )

    @admin.action(description="Run the selected delayed jobs now", permissions=["run_now"])
    def run_jobs_now(self, request, queryset):
        self._require(request, "run_now")
        using, moved, skipped = database(), 0, 0
        for rows in _id_batches(queryset):
            delayed = [(pk, queue) for pk, state, queue in rows if state == JobState.DELAYED]
            skipped += len(rows) - len(delayed)
            if delayed:
                n = engine.make_due(using=using, job_ids=[pk for pk, _ in delayed])
                moved += n
                skipped += len(delayed) - n
        parts = [f"{_jobs(moved).capitalize()} will run now"]
        if skipped:
            parts.append(_left(skipped, "not delayed"))
        self.message_user(request, "; ".join(parts) + ".", messages.SUCCESS if moved else messages.WARNING)

    @admin.action(description="Delete the selected jobs", permissions=["delete"])
    def delete_jobs(self, request, queryset):
        self._require(request, "delete")
        if request.POST.get("post") != "yes":
            return self._confirm_delete(request, queryset)
        using, deleted = database(), 0
        for rows in _id_batches(queryset):
            deleted += engine.delete_jobs(using=using, job_ids=[pk for pk, _, _ in rows])
        self.message_user(request, f"Deleted {_jobs(deleted)}.", messages.SUCCESS)

    def _confirm_delete(self, request: Any, queryset: Any) -> TemplateResponse:
        """The page before a delete, as Django's own: how many jobs (counted up to a cap, never
        the whole table) and a form that posts the same action again with ``post=yes``."""
        cap = 10_000
        count = queryset.order_by()[: cap + 1].count()
        across = request.POST.get("select_across") == "1"
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Delete jobs?",
            "count": min(count, cap),
            "more": count > cap,
            "across": across,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "states": sorted(set(queryset.order_by().values_list("state", flat=True)[:cap])),
            "back": request.get_full_path(),
        }
        return TemplateResponse(request, "django_jobs/admin/job/delete_confirmation.html", context)

    def delete_model(self, request, obj):
        engine.delete_jobs(using=database(), job_ids=[obj.pk])

    def delete_queryset(self, request, queryset):
        for rows in _id_batches(queryset):
            engine.delete_jobs(using=database(), job_ids=[pk for pk, _, _ in rows])

    # -- the job page and its buttons ------------------------------------------------------------

    def get_urls(self):
        return [
            re_path(
                r"^(?P<object_id>[^/]+)/(?P<action>retry|cancel|run-now|delete)/$",
                self.admin_site.admin_view(self.job_action_view),
                name="django_jobs_job_action",
            ),
            *super().get_urls(),
        ]

    def _get_job(self, request: Any, object_id: str) -> Job:
        pk = parse_uuid(unquote(object_id))
        job = self.get_queryset(request).filter(pk=pk).first() if pk is not None else None
        if job is None:
            raise Http404(f"No job with id {object_id!r}.")
        return job

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The job page: read-only, with the buttons the user's permissions allow."""
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        job = self._get_job(request, object_id)
        if not self.has_view_permission(request, job):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **job_page_context(job),
            "opts": self.opts,
            "title": f"{job.task_path} [{job.state}]",
            "subtitle": str(job.pk),
            "buttons": self._buttons(request, job),
            "has_view_permission": True,
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "django_jobs/admin/job/job.html", context)

    def _buttons(self, request: Any, job: Job) -> list[dict[str, str]]:
        """The actions this user may take on this job in its state."""
        applies = {
            "retry": ("Retry", job.state in RETRYABLE),
            "cancel": ("Cancel", job.state not in FINISHED_STATES and job.cancel_requested_at is None),
            "run-now": ("Run now", job.state == JobState.DELAYED),
            "delete": ("Delete", True),
        }
        return [
            {"action": action, "label": label, "url": reverse("admin:django_jobs_job_action", args=[job.pk, action])}
            for action, (label, shown) in applies.items()
            if shown and getattr(self, f"has_{BUTTON_PERMISSIONS[action]}_permission")(request)
        ]

    def job_action_view(self, request, object_id, action):
        """POST /admin/django_jobs/job/<id>/<retry|cancel|run-now|delete>/ (the job page's
        buttons): checks the permission (403 without it), calls the engine, says what happened,
        records it in the job's admin history, and goes back to the job page (the list after a
        delete)."""
        if action == "delete" and request.method in ("GET", "HEAD"):
            # The Delete button leads here first: a page that says what goes, with the real button.
            if not self.has_view_permission(request):
                raise PermissionDenied
            self._require(request, "delete")
            job = self._get_job(request, object_id)
            context = {
                **self.admin_site.each_context(request),
                "opts": self.model._meta,
                "title": "Delete this job?",
                "job": job,
                "back": reverse("admin:django_jobs_job_change", args=[job.pk]),
            }
            return TemplateResponse(request, "django_jobs/admin/job/delete_job_confirmation.html", context)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        self._require(request, BUTTON_PERMISSIONS[action])
        job = self._get_job(request, object_id)
        using = database()
        if action == "delete":
            self.log_deletions(request, [job])  # before the row goes
            engine.delete_jobs(using=using, job_ids=[job.pk])
            self.message_user(request, f"Job {job.pk} was deleted.", messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:django_jobs_job_changelist"))
        if action == "retry":
            done = engine.retry_job(using=using, job_id=job.pk)
            message = (
                f"Job {job.pk} was re-queued."
                if done
                else f"Job {job.pk} was not retried: it is {job.state} (only failed or cancelled jobs are, and not "
                "a flow parent with unfinished children)."
            )
        elif action == "cancel":
            result = engine.cancel_job(using=using, job_id=job.pk)
            change = result.change if result else None
            done = change is not None
            if change == "cancelled":
                flow = f" with {_jobs(len(result.descendants))} of its flow" if result.descendants else ""
                message = f"Job {job.pk} was cancelled{flow}."
            elif change == "flagged":
                message = f"Job {job.pk} is running: it was asked to stop."
            else:
                message = f"Job {job.pk} was not cancelled: it is {job.state}."
        else:  # run-now
            done = bool(engine.make_due(using=using, job_ids=[job.pk]))  # it wakes the workers
            message = f"Job {job.pk} will run now." if done else f"Job {job.pk} is not delayed: it is {job.state}."
        if done:
            self.log_change(request, job, message)
        self.message_user(request, message, messages.SUCCESS if done else messages.WARNING)
        return HttpResponseRedirect(reverse("admin:django_jobs_job_change", args=[job.pk]))


def _id_batches(queryset: Any, size: int | None = None) -> Iterator[list[tuple[uuid.UUID, str, str]]]:
    """``(id, state, queue)`` of the queryset's jobs, ``size`` at a time, newest first, walked by
    keyset on the primary key (each batch a fresh query after the last id seen): a selection of
    millions of jobs is never loaded at once, nor paged with a growing OFFSET."""
    size = size or BATCH_SIZE
    rows_qs = queryset.order_by("-pk").values_list("pk", "state", "queue")
    last = None
    while True:
        batch = list((rows_qs if last is None else rows_qs.filter(pk__lt=last))[:size])
        if not batch:
            return
        yield batch
        last = batch[-1][0]


# -- what the job page shows --------------------------------------------------------------------


#: The state badge an event's kind wears on the timeline.
_EVENT_STATE = {"enqueued": "waiting", "promoted": "waiting", "rescued": "waiting", "released": "waiting",
                "retried": "delayed", "snoozed": "delayed", "stalled": "failed", "cancel-requested": "cancelled",
                "removed": "cancelled"}  # fmt: skip


def timeline_row(event: Event) -> dict[str, Any]:
    """One event of the job page's timeline: its time to the millisecond (a retry sequence
    inside one second stays in order), its kind, a readable summary (attempt, worker, run time,
    error, progress) and the raw data behind a toggle."""
    data = event.data if isinstance(event.data, dict) else {}
    parts = []
    if data.get("attempt") is not None:
        parts.append(f"attempt {data['attempt']}")
    if data.get("worker"):
        parts.append(f"on {data['worker']}")
    if data.get("runtime_ms") is not None:
        parts.append(f"ran {data['runtime_ms']:,} ms" if isinstance(data["runtime_ms"], int) else "")
    if data.get("error"):
        parts.append(f"error {data['error']}")
    if "progress" in data:
        percent = progress_percent(data["progress"])
        parts.append(f"progress {percent:.0f} %" if percent is not None else "progress set")
    if data.get("manual"):
        parts.append("by an operator")
    if data.get("now"):
        parts.append("run now")
    return {
        "event": event,
        "when": moment(event.created_at, milliseconds=True),
        "state_class": state_class(_EVENT_STATE.get(event.kind, event.kind)),
        "summary": ", ".join(p for p in parts if p),
        "data_json": pretty(event.data) if event.data else "",
    }


def job_page_context(job: Job) -> dict[str, Any]:
    """Everything the job page shows besides the job's own columns, each list capped."""
    using = database()
    jobs = Job.objects.using(using)
    encrypted = bool((job.options or {}).get("encrypt"))
    logs = list(JobLog.objects.using(using).of_job(job.pk).order_by("-idx")[: LOG_LINES_SHOWN + 1])  # newest
    events = list(Event.objects.using(using).filter(job_id=job.pk).order_by("txid", "id")[: EVENTS_SHOWN + 1])

    ancestors: list[dict[str, Any]] = []  # the parent first, then its parent...
    seen, parent_id = {job.pk}, job.parent_id
    while parent_id is not None and parent_id not in seen and len(ancestors) < ANCESTORS_SHOWN:
        seen.add(parent_id)
        row = jobs.filter(pk=parent_id).values("id", "task_path", "state", "parent_id").first()
        if row is None:
            ancestors.append({"id": parent_id, "task_path": "", "state": "deleted"})
            break
        ancestors.append(row)
        parent_id = row["parent_id"]
    ancestors.reverse()  # root first

    edges = list(JobDependency.objects.using(using).filter(parent_id=job.pk).order_by("id")[: CHILDREN_SHOWN + 1])
    child_rows = {
        r["id"]: r for r in jobs.filter(pk__in=[e.child_id for e in edges]).values("id", "task_path", "state")
    }
    children = [
        {
            "id": e.child_id,
            "queue": e.child_queue,
            "status": e.status,
            "failure_policy": e.failure_policy,
            "task_path": child_rows.get(e.child_id, {}).get("task_path", ""),
            "state": child_rows.get(e.child_id, {}).get("state", "deleted"),
            # An encrypted child's value (or error) is copied here encrypted: never shown.
            "value": None if e.value is None else shown_json(e.value, _encrypted_error(e.value)),
        }
        for e in edges[:CHILDREN_SHOWN]
    ]
    trace_jobs = []
    if job.trace_id:
        trace_jobs = list(
            jobs.filter(trace_id=job.trace_id)
            .exclude(pk=job.pk)
            .order_by("id")
            .values("id", "task_path", "queue", "state")[:TRACE_JOBS_SHOWN]
        )
    return {
        "job": job,
        # The page follows a job that can still change (the live updates end once it finished).
        "live": job.state not in FINISHED_STATES,
        "state_class": state_class(job.state),
        "encrypted": encrypted,
        "args_json": shown_json(job.args, encrypted),
        "kwargs_json": shown_json(job.kwargs, encrypted),
        "options_json": pretty(job.options),
        "result_json": None if job.return_value is None else shown_json(job.return_value, encrypted),
        "progress_json": None if job.progress is None else pretty(job.progress),
        "progress_percent": progress_percent(job.progress),
        "errors": [{**e, "at_text": moment(e["at"])} for e in error_rows(job.errors)],
        "log_lines": [
            {"when": moment(line.created_at, milliseconds=True), "line": line.line}
            for line in logs[:LOG_LINES_SHOWN][::-1]
        ],  # fmt: skip
        "times": {
            "enqueued": moment(job.enqueued_at),
            "available": moment(job.available_at),
            "started": moment(job.started_at),
            "last_attempted": moment(job.last_attempted_at),
            "finished": moment(job.finished_at),
            "purge": moment(job.purge_at),
            "lease_expires": moment(job.lease_expires_at),
            "cancel_requested": moment(job.cancel_requested_at),
        },  # fmt: skip
        "logs_truncated": len(logs) > LOG_LINES_SHOWN,
        "log_cap": LOG_LINES_SHOWN,
        "events": [timeline_row(e) for e in events[:EVENTS_SHOWN]],
        "events_truncated": len(events) > EVENTS_SHOWN,
        "enqueue_recorded": any(e.kind == "enqueued" for e in events),
        "event_cap": EVENTS_SHOWN,
        "ancestors": ancestors,
        "children": children,
        "children_truncated": len(edges) > CHILDREN_SHOWN,
        "child_cap": CHILDREN_SHOWN,
        "trace_jobs": trace_jobs,
        "trace_cap": TRACE_JOBS_SHOWN,
    }


def _encrypted_error(value: Any) -> bool:
    return isinstance(value, dict) and is_encrypted(value.get("traceback"))


__all__ = ["BUTTON_PERMISSIONS", "JOB_ACTIONS", "JobAdmin", "job_page_context"]

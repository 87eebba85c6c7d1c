"""Admin for jobs, schedules and workers: the job pages of the operations console.

The job table may hold millions of rows, so the jobs changelist never counts it: a paginator
that fetches one row more than a page says whether a next page exists; there is no date
hierarchy and no facet counts; rows are ordered by the primary key (UUIDv7, time-ordered), and
the filters' choices come from small tables, the settings, the code and the unfinished jobs.

Every change of a job goes through :mod:`django_jobs.engine`: actions and the job page's buttons
call it, each after checking its own permission (``retry_job``, ``cancel_job``,
``run_job_now``, ``delete_job``); the admin never saves a job row itself.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import EmptyPage, InvalidPage, Page, PageNotAnInteger, Paginator
from django.db import DatabaseError, transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.http import Http404, HttpResponseBadRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, re_path, reverse
from django.utils import timezone
from django.utils.html import format_html

from .. import engine
from ..conf import get_settings
from ..exceptions import JobsError
from ..models import Event, Job, JobDependency, JobLog, Metric, QueueState, Schedule, Worker
from ..states import FINISHED_STATES, UNFINISHED_STATES, JobState

logger = logging.getLogger("django_jobs.admin")

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


def _using() -> str:
    return get_settings().DATABASE


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def _left(n: int, why: str) -> str:
    """The "2 were <why> and were left as they are" of an action's message."""
    was = "was" if n == 1 else "were"
    return f"{n} {was} {why} and {was} left as {'it is' if n == 1 else 'they are'}"


# -- pagination without COUNT(*) ------------------------------------------------------------------


class UncountedPage(Page):
    def __init__(self, object_list: list[Any], number: int, paginator: Paginator, has_next: bool):
        super().__init__(object_list, number, paginator)
        self._has_next = has_next

    def has_next(self) -> bool:
        return self._has_next

    def has_previous(self) -> bool:
        return self.number > 1

    def start_index(self) -> int:
        return (self.number - 1) * self.paginator.per_page + 1 if self.object_list else 0

    def end_index(self) -> int:
        return (self.number - 1) * self.paginator.per_page + len(self.object_list)


class UncountedPaginator(Paginator):
    """Pages a queryset without ever counting it: a page fetches ``per_page + 1`` rows, the
    extra one only telling whether a next page exists. ``count`` is not the number of rows: it
    is a lower bound, the rows up to the last page fetched (plus one when there are more), so
    nothing that reads it runs a COUNT(*) over millions of jobs."""

    def __init__(self, object_list: Any, per_page: int, orphans: int = 0, allow_empty_first_page: bool = True):
        super().__init__(object_list, per_page, 0, allow_empty_first_page)
        self._seen = 0

    @property
    def count(self) -> int:  # type: ignore[override]
        return self._seen

    @property
    def num_pages(self) -> int:  # type: ignore[override]
        return max(1, -(-self._seen // self.per_page))

    def validate_number(self, number: Any) -> int:
        try:
            number = int(number)
        except (TypeError, ValueError):
            raise PageNotAnInteger("That page number is not an integer") from None
        if number < 1:
            raise EmptyPage("That page number is less than 1")
        return number

    def page(self, number: Any) -> UncountedPage:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        rows = list(self.object_list[bottom : bottom + self.per_page + 1])
        if not rows and number > 1:
            raise EmptyPage("That page contains no results")
        self._seen = bottom + len(rows)
        return UncountedPage(rows[: self.per_page], number, self, has_next=len(rows) > self.per_page)


#: What a query built from the URL's lookups can raise when it runs: a value the database refuses
#: (NUL in text, an invalid regex), a lookup the backend lacks, a date out of range, a number
#: too large to bind. The admin's own "invalid lookup" answer (a redirect with ?e=1), not a 500.
_BAD_LOOKUP_ERRORS = (DatabaseError, ValueError, OverflowError)


class SafeChangeList(ChangeList):
    """Django's ChangeList, with the errors a malformed lookup raises at query time turned into
    IncorrectLookupParameters. The query runs in a savepoint, so a refused statement does not
    leave the request's transaction aborted (ATOMIC_REQUESTS)."""

    def get_results(self, request):
        try:
            with transaction.atomic(using=self.queryset.db):
                super().get_results(request)
        except IncorrectLookupParameters:
            raise
        except _BAD_LOOKUP_ERRORS as exc:
            raise IncorrectLookupParameters(exc) from None


class JobChangeList(SafeChangeList):
    """Django's ChangeList without its two counts (the filtered and the full result count)."""

    def get_results(self, request):
        paginator = self.model_admin.get_paginator(request, self.queryset, self.list_per_page)
        try:
            with transaction.atomic(using=self.queryset.db):
                page = paginator.page(self.page_num)
        except InvalidPage:
            raise IncorrectLookupParameters from None
        except _BAD_LOOKUP_ERRORS as exc:
            raise IncorrectLookupParameters(exc) from None
        self.page = page
        self.result_list = page.object_list
        self.result_count = paginator.count  # a lower bound; the templates do not show it
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.can_show_all = False
        self.multi_page = page.has_other_pages()
        self.paginator = paginator
        self.previous_page_url = self.get_query_string({PAGE_VAR: page.number - 1}) if page.has_previous() else None
        self.next_page_url = self.get_query_string({PAGE_VAR: page.number + 1}) if page.has_next() else None

    def get_ordering(self, request, queryset):
        """By the primary key only, newest first unless asked otherwise: any other order would
        sort the whole (filtered) table, which no index serves."""
        ordering = [o for o in super().get_ordering(request, queryset) if str(o).lstrip("-") in ("pk", "id")]
        return ordering[:1] or ["-pk"]


# -- filters ------------------------------------------------------------------------------------
#
# None of them runs SELECT DISTINCT over the job table: choices come from QueueState, the last
# day's Metric rows, the settings, the task modules and the unfinished jobs (a small set the
# partial index django_jobs_unfinished_idx covers); the value in the URL is always offered.


def _unfinished_values(request: Any) -> tuple[set[str], set[str], set[int]]:
    """(queues, task paths, priorities) of the unfinished jobs, once per request."""
    cached = getattr(request, "_django_jobs_unfinished", None)
    if cached is None:
        rows = (
            Job.objects.using(_using())
            .filter(state__in=UNFINISHED_STATES)
            .order_by()
            .values_list("queue", "task_path", "priority")
            .distinct()[:1000]
        )
        cached = (set(), set(), set())
        for queue, task_path, priority in rows:
            cached[0].add(queue)
            cached[1].add(task_path)
            cached[2].add(priority)
        request._django_jobs_unfinished = cached
    return cached


def known_queues(request: Any) -> list[str]:
    """Queues with a flag or limit, a recent metric, a declaration in the settings, or unfinished jobs."""
    from django.conf import settings

    using = _using()
    names = set(QueueState.objects.using(using).values_list("name", flat=True))
    since = timezone.now() - timedelta(days=1)  # django_jobs_metric_minute_idx
    names |= set(
        Metric.objects.using(using).filter(minute__gte=since).order_by().values_list("queue", flat=True).distinct()
    )
    names |= set(get_settings().QUEUES or {})
    for backend in getattr(settings, "TASKS", {}).values():
        names |= set(backend.get("QUEUES") or [])
    names |= _unfinished_values(request)[0]
    return sorted(names)


def known_task_paths(request: Any) -> list[str]:
    """The @task functions of the installed apps' ``tasks`` modules, the tasks of schedules, and
    those of unfinished jobs (once per request)."""
    cached = getattr(request, "_django_jobs_task_paths", None)
    if cached is None:
        cached = request._django_jobs_task_paths = _task_paths(request)
    return cached


def _task_paths(request: Any) -> list[str]:
    from django.tasks import Task
    from django.utils.module_loading import autodiscover_modules

    try:
        autodiscover_modules("tasks")
    except Exception:  # noqa: BLE001 - a broken tasks module must not break the admin
        logger.exception("Importing the installed apps' tasks modules failed; the task filter lists fewer tasks.")
    paths = set()
    for app in apps.get_app_configs():
        module = sys.modules.get(f"{app.name}.tasks")
        for value in vars(module).values() if module else ():
            if isinstance(value, Task):
                paths.add(value.module_path)
    paths |= set(Schedule.objects.using(_using()).values_list("task_path", flat=True))
    paths |= _unfinished_values(request)[1]
    return sorted(paths)


class _ValueFilter(admin.SimpleListFilter):
    """A filter on one column with its choices computed cheaply; the current value (validated by
    :meth:`clean`) is always among them."""

    field: str

    def choices_for(self, request: Any) -> list[tuple[Any, str]]:
        raise NotImplementedError

    def clean(self, value: str) -> Any:
        return value

    def lookups(self, request, model_admin):
        choices = self.choices_for(request)
        value = self.value()
        if value is not None and value not in {str(v) for v, _ in choices}:
            choices.append((value, value))
        return choices

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if "\x00" in value:  # PostgreSQL refuses NUL in text: an error page, not a server error
            raise IncorrectLookupParameters("NUL character in a filter value.")
        return queryset.filter(**{self.field: self.clean(value)})


class StateFilter(_ValueFilter):
    title = "state"
    parameter_name = "state"
    field = "state"

    def choices_for(self, request):
        return list(JobState.choices)

    def clean(self, value):
        if value not in JobState.values:
            raise IncorrectLookupParameters(f"Unknown state {value!r}.")
        return value

    def lookups(self, request, model_admin):
        return self.choices_for(request)  # a value outside the states is an error, not a choice


class QueueFilter(_ValueFilter):
    title = "queue"
    parameter_name = "queue"
    field = "queue"

    def choices_for(self, request):
        return [(name, name) for name in known_queues(request)]


class TaskFilter(_ValueFilter):
    title = "task"
    parameter_name = "task"
    field = "task_path"

    def choices_for(self, request):
        return [(p, p) for p in known_task_paths(request)]


class PriorityFilter(_ValueFilter):
    title = "priority"
    parameter_name = "priority"
    field = "priority"

    def choices_for(self, request):
        values = _unfinished_values(request)[2] | {0}
        return [(str(p), str(p)) for p in sorted(values, reverse=True)]

    def clean(self, value):
        try:
            number = int(value)
        except ValueError:
            raise IncorrectLookupParameters(f"priority must be an integer; got {value!r}.") from None
        if not -100 <= number <= 100:
            raise IncorrectLookupParameters(f"priority must be -100..100; got {number}.")
        return number


class TraceFilter(_ValueFilter):
    """The jobs of one trace (``?trace=<id>``, the job page links here); shown only when set."""

    title = "trace"
    parameter_name = "trace"
    field = "trace_id"  # indexed: django_jobs_trace_idx

    def choices_for(self, request):
        return []


def _range_filters() -> list[Any]:
    """Date ranges (django-admin-rangefilter) on the three timestamps, when it is installed."""
    if not apps.is_installed("rangefilter"):
        return []
    from rangefilter.filters import DateTimeRangeFilterBuilder

    return [
        ("enqueued_at", DateTimeRangeFilterBuilder(title="enqueued")),
        ("started_at", DateTimeRangeFilterBuilder(title="started")),
        ("finished_at", DateTimeRangeFilterBuilder(title="finished")),
    ]


# -- the jobs admin -----------------------------------------------------------------------------

#: The actions of this admin and the permission (has_<name>_permission) each needs.
JOB_ACTIONS = {"retry_jobs": "retry", "cancel_jobs": "cancel", "run_jobs_now": "run_now", "delete_jobs": "delete"}
#: The job page's buttons (admin:django_jobs_job_action) and the permission each needs.
BUTTON_PERMISSIONS = {"retry": "retry", "cancel": "cancel", "run-now": "run_now", "delete": "delete"}

SEARCH_HELP = (
    "A job id or trace id; or field:value with field one of id, trace, key (idempotency key), dedup, partition, "
    "task (contains), queue. Anything else matches a trace id or idempotency key, or a task path containing it "
    "(then, if no known task matches, a dedup or partition key too)."
)

#: Prefixes of the search box: (lookup, needs a UUID).
SEARCH_PREFIXES = {
    "id": ("id", True),  # the primary key
    "trace": ("trace_id", False),  # django_jobs_trace_idx
    "key": ("idempotency_key", False),  # in django_jobs_idempotency_key (backend, queue, key)
    "dedup": ("dedup_key", False),
    "partition": ("partition_key", False),  # in the unfinished/blocked indexes (queue, partition_key)
    "task": ("task_path__icontains", False),
    "queue": ("queue", False),
}


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    change_list_template = "django_jobs/admin/job/change_list.html"
    list_display = (
        "id",
        "task_path",
        "queue",
        "state_badge",
        "priority",
        "attempts_display",
        "enqueued_at",
        "started_at",
        "finished_at",
    )
    list_display_links = ("id",)
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
        return super().get_queryset(request).using(_using())

    def get_list_filter(self, request):
        return [*self.list_filter, *_range_filters()]

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
        return format_html('<span class="dj-state dj-state-{}">{}</span>', _state_class(job.state), job.state)

    @admin.display(description="attempts")
    def attempts_display(self, job):
        return f"{job.attempts}/{job.max_attempts}"

    def get_search_results(self, request, queryset, search_term):
        """Exact matches on indexed columns instead of Django's ``icontains`` over every search
        field, which would scan the whole table; see SEARCH_PREFIXES for what is indexed.

        A UUID (or a UUID's hex, as trace ids are) finds the job with that id (primary key) or
        the jobs of that trace (django_jobs_trace_idx). ``field:value`` searches one field.
        Anything else finds the jobs with that trace id or idempotency key, and those of the
        known task paths (see known_task_paths) containing it: equality on the paths, so the
        planner knows how many rows match and walks the primary key for the page. Only when no
        known task path contains it does it also look for a dedup or partition key or a task
        path containing it among every job: a scan, which the page's LIMIT may end early.
        """
        from django.db.models import Q

        term = search_term.strip()
        if not term:
            return queryset, False
        prefix, sep, rest = term.partition(":")
        if sep and prefix.lower() in SEARCH_PREFIXES and rest.strip():
            lookup, needs_uuid = SEARCH_PREFIXES[prefix.lower()]
            value: Any = rest.strip()
            if needs_uuid:
                value = _parse_uuid(value)
                if value is None:
                    return queryset.none(), False
            elif lookup == "task_path__icontains" and value in known_task_paths(request):
                lookup = "task_path"
            return queryset.filter(**{lookup: value}), False
        as_uuid = _parse_uuid(term)
        if as_uuid is not None:
            return queryset.filter(Q(id=as_uuid) | Q(trace_id__in={term, as_uuid.hex, str(as_uuid)})), False
        indexed = Q(trace_id=term) | Q(idempotency_key=term)
        paths = [p for p in known_task_paths(request) if term.lower() in p.lower()]
        if paths:
            return queryset.filter(indexed | Q(task_path__in=paths)), False
        return queryset.filter(
            indexed | Q(dedup_key=term) | Q(partition_key=term) | Q(task_path__icontains=term)
        ), False

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
            if any(_parse_uuid(pk) is None for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)):
                return HttpResponseBadRequest("Malformed job id in the selection.")
        return super().changelist_view(request, extra_context)

    # -- actions (on the selection, or on every job of the filtered list) ----------------------

    @admin.action(description="Retry the selected failed or cancelled jobs", permissions=["retry"])
    def retry_jobs(self, request, queryset):
        self._require(request, "retry")
        using, retried, skipped, refused = _using(), 0, 0, 0
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
        using, cancelled, flagged, skipped, cascaded = _using(), 0, 0, 0, 0
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
        using, moved, skipped = _using(), 0, 0
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
        using, deleted = _using(), 0
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
        engine.delete_jobs(using=_using(), job_ids=[obj.pk])

    def delete_queryset(self, request, queryset):
        for rows in _id_batches(queryset):
            engine.delete_jobs(using=_using(), job_ids=[pk for pk, _, _ in rows])

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
        pk = _parse_uuid(unquote(object_id))
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
        using = _using()
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


def _parse_uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value).strip())
    except ValueError:
        return None


def _state_class(state: str) -> str:
    return state if state in JobState.values else "unknown"


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


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def progress_percent(value: Any) -> float | None:
    """A progress value as a percentage for the bar: a number 0..100, or a dict with
    ``percent`` or ``current`` and ``total``; None for anything else."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if number(value) and 0 <= value <= 100:
        return float(value)
    if isinstance(value, dict):
        if number(value.get("percent")) and 0 <= value["percent"] <= 100:
            return float(value["percent"])
        current, total = value.get("current"), value.get("total")
        if number(current) and number(total) and total > 0:
            return max(0.0, min(100.0, 100.0 * current / total))
    return None


def _error_rows(errors: Any) -> list[dict[str, Any]]:
    """Each failed attempt's error, newest first: class, message (the traceback's last line),
    attempt, time and traceback."""
    rows = []
    for error in reversed(errors if isinstance(errors, list) else []):
        if not isinstance(error, dict):
            rows.append({"exception": "", "message": _pretty(error), "attempt": None, "at": None, "traceback": ""})
            continue
        traceback = str(error.get("traceback") or "")
        lines = [line for line in traceback.strip().splitlines() if line.strip()]
        rows.append(
            {
                "exception": error.get("exception_class_path") or "",
                "message": lines[-1] if lines else "",
                "attempt": error.get("attempt"),
                "at": error.get("at"),
                "traceback": traceback,
            }
        )
    return rows


def job_page_context(job: Job) -> dict[str, Any]:
    """Everything the job page shows besides the job's own columns, each list capped."""
    using = _using()
    jobs = Job.objects.using(using)
    logs = list(JobLog.objects.using(using).filter(job_id=job.pk).order_by("-idx")[: LOG_LINES_SHOWN + 1])
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
            "value": None if e.value is None else _pretty(e.value),
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
        "state_class": _state_class(job.state),
        "args_json": _pretty(job.args),
        "kwargs_json": _pretty(job.kwargs),
        "options_json": _pretty(job.options),
        "result_json": None if job.return_value is None else _pretty(job.return_value),
        "progress_json": None if job.progress is None else _pretty(job.progress),
        "progress_percent": progress_percent(job.progress),
        "errors": _error_rows(job.errors),
        "log_lines": logs[:LOG_LINES_SHOWN][::-1],
        "logs_truncated": len(logs) > LOG_LINES_SHOWN,
        "log_cap": LOG_LINES_SHOWN,
        "events": [{"event": e, "data_json": _pretty(e.data) if e.data else ""} for e in events[:EVENTS_SHOWN]],
        "events_truncated": len(events) > EVENTS_SHOWN,
        "event_cap": EVENTS_SHOWN,
        "ancestors": ancestors,
        "children": children,
        "children_truncated": len(edges) > CHILDREN_SHOWN,
        "child_cap": CHILDREN_SHOWN,
        "trace_jobs": trace_jobs,
        "trace_cap": TRACE_JOBS_SHOWN,
    }


# -- workers ------------------------------------------------------------------------------------


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    """Live workers, read-only, with the jobs each is running now."""

    def get_changelist(self, request, **kwargs):
        return SafeChangeList

    def get_object(self, request, object_id, from_field=None):
        return None if "\x00" in str(object_id) else super().get_object(request, object_id, from_field)

    list_display = ("id", "hostname", "pid", "queues_display", "concurrency", "running", "started_at", "heartbeat_at")
    readonly_fields = ("id", "backend", "hostname", "pid", "queues", "concurrency", "started_at", "heartbeat_at")

    def get_queryset(self, request):
        # Active jobs only: a handful of rows (the partial index django_jobs_active_idx).
        running = (
            Job.objects.filter(state=JobState.ACTIVE, worker_id=OuterRef("id"))
            .order_by()
            .values("worker_id")
            .annotate(n=Count("id"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .using(_using())
            .annotate(running_jobs=Subquery(running, output_field=IntegerField()))
        )

    @admin.display(description="running jobs")
    def running(self, worker):
        return worker.running_jobs or 0

    @admin.display(description="queues")
    def queues_display(self, worker):
        return ", ".join(worker.queues) if worker.queues else "all"

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


# -- schedules ----------------------------------------------------------------------------------

#: The Schedule columns that decide when it fires (the preview reads them from the form).
TIMING_FIELDS = ("cron", "every_seconds", "offset_seconds", "timezone", "start_at", "end_at", "limit")
PREVIEW_RUNS = 5


class ScheduleForm(forms.ModelForm):
    """The schedule form. Its "Preview" button (``_preview``) shows the next runs of the entered
    fields and saves nothing: the admin saves only a valid form, so with ``_preview`` the form
    says it is not valid (it shows no error for that)."""

    class Meta:
        model = Schedule
        fields = (
            "backend", "name", "enabled", "task_path", "args", "kwargs", "queue", "priority", "options",
            "cron", "every_seconds", "offset_seconds", "timezone", "start_at", "end_at", "limit", "catch_up",
        )  # fmt: skip

    def is_valid(self):
        return super().is_valid() and "_preview" not in self.data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Schedules can be added and edited here; an edit is a runtime edit, which the workers'
    sync of ``DJANGO_JOBS["SCHEDULES"]`` then leaves alone."""

    form = ScheduleForm
    change_form_template = "django_jobs/admin/schedule/change_form.html"
    list_display = ("name", "task_path", "when", "timezone", "enabled", "next_run_at", "iterations")
    list_filter = ("enabled", "source", "backend")
    search_fields = ("name", "task_path")
    readonly_fields = ("next_run_at", "iterations", "last_run_at", "source", "code_hash", "edited_at", "synced_at")
    fieldsets = (
        (None, {"fields": ("backend", "name", "enabled", "task_path", "args", "kwargs", "queue", "priority", "options")}),
        ("When", {"fields": ("cron", "every_seconds", "offset_seconds", "timezone", "start_at", "end_at", "limit",
                             "catch_up")}),
        ("State", {"fields": readonly_fields}),
    )  # fmt: skip
    actions = ["enable_schedules", "disable_schedules", "run_schedules_now"]

    def get_changelist(self, request, **kwargs):
        return SafeChangeList

    def changelist_view(self, request, extra_context=None):
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if request.method == "POST" else []
        if not all(pk.isdigit() and int(pk) < 2**63 for pk in selected):
            return HttpResponseBadRequest("Malformed schedule id in the selection.")
        return super().changelist_view(request, extra_context)

    @admin.display(description="cron / every")
    def when(self, sched):
        if sched.cron:
            return sched.cron
        if sched.every_seconds is not None:
            return f"every {sched.every_seconds:g}s" + (f" +{sched.offset_seconds:g}s" if sched.offset_seconds else "")
        return "-"

    def save_model(self, request, obj, form, change):
        from ..schedules import first_tick

        timing = {"cron", "every_seconds", "offset_seconds", "timezone", "start_at", "end_at"}
        now = timezone.now()
        if not change or timing & set(form.changed_data) or obj.next_run_at is None:
            obj.next_run_at = first_tick(obj, now)
        obj.source = "runtime"  # an admin edit is a runtime edit, as with django_jobs.schedule()
        obj.edited_at = now
        super().save_model(request, obj, form, change)

    # -- the next runs preview --------------------------------------------------------------------

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["preview"] = schedule_preview(context["adminform"].form, obj)
        context["run_now_url"] = (
            reverse("admin:django_jobs_schedule_run_now", args=[obj.pk])
            if obj is not None and obj.pk and self.has_change_permission(request, obj)
            else None
        )
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    # -- run now, enable, disable ----------------------------------------------------------------

    def get_urls(self):
        return [
            path(
                "<path:object_id>/run-now/",
                self.admin_site.admin_view(self.run_now_view),
                name="django_jobs_schedule_run_now",
            ),
            *super().get_urls(),
        ]

    def run_now_view(self, request, object_id):
        """POST /admin/django_jobs/schedule/<pk>/run-now/: enqueue one job from the template now."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        try:
            sched = self.get_queryset(request).filter(pk=int(unquote(object_id))).first()
        except ValueError:
            sched = None
        if sched is None:
            raise Http404(f"No schedule with id {object_id!r}.")
        self._run_now(request, [sched])
        return HttpResponseRedirect(reverse("admin:django_jobs_schedule_change", args=[sched.pk]))

    def _run_now(self, request: Any, rows: list[Schedule]) -> None:
        from ..schedules import run_now

        for sched in rows:
            try:
                job = run_now(sched)
            except JobsError as exc:
                self.message_user(request, f"Schedule “{sched.name}” did not run: {exc}", messages.ERROR)
                continue
            url = reverse("admin:django_jobs_job_change", args=[job.pk])
            self.message_user(
                request,
                format_html('Schedule “{}” enqueued job <a href="{}">{}</a>.', sched.name, url, job.pk),
                messages.SUCCESS,
            )

    @admin.action(description="Run the selected schedules now (one job each)", permissions=["change"])
    def run_schedules_now(self, request, queryset):
        if not self.has_change_permission(request):
            raise PermissionDenied
        self._run_now(request, list(queryset))

    @admin.action(description="Enable the selected schedules", permissions=["change"])
    def enable_schedules(self, request, queryset):
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable_schedules(self, request, queryset):
        self._set_enabled(request, queryset, False)

    def _set_enabled(self, request: Any, queryset: Any, enabled: bool) -> None:
        """A runtime edit, like the form's. A schedule enabled again fires from its next tick
        after now: the ticks it missed while disabled are not caught up."""
        from ..schedules import first_tick

        if not self.has_change_permission(request):
            raise PermissionDenied
        now, changed = timezone.now(), 0
        for sched in queryset.filter(enabled=not enabled):
            fields = {"enabled": enabled, "source": "runtime", "edited_at": now}
            if enabled and (sched.next_run_at is None or sched.next_run_at < now):
                fields["next_run_at"] = first_tick(sched, now)
            changed += type(sched).objects.using(sched._state.db).filter(pk=sched.pk).update(**fields)
        word = "Enabled" if enabled else "Disabled"
        self.message_user(request, f"{word} {changed} schedule{'' if changed == 1 else 's'}.", messages.SUCCESS)


def schedule_preview(form: Any, obj: Schedule | None) -> dict[str, Any]:
    """The next runs the schedule page shows: of the entered fields when the form was submitted
    (with errors, or with "Preview"), else of the saved schedule. Each run in the schedule's
    time zone and in UTC; ``error`` says why there are none."""
    from ..schedules import InvalidSchedule, next_runs, zone

    if form.is_bound:
        if any(name in form.errors for name in TIMING_FIELDS):
            return {"source": "entered", "runs": [], "error": "Correct the timing fields to see the next runs."}
        source: Any = {name: form.cleaned_data.get(name) for name in TIMING_FIELDS}
        source["offset_seconds"] = source["offset_seconds"] or 0.0
        source["timezone"] = source["timezone"] or "UTC"
        source["iterations"] = obj.iterations if obj is not None else 0
        tz_name, enabled = source["timezone"], form.cleaned_data.get("enabled", True)
    elif obj is not None:
        source, tz_name, enabled = obj, obj.timezone, obj.enabled
    else:
        return {"source": None, "runs": [], "error": None}
    out: dict[str, Any] = {"source": "entered" if form.is_bound else "saved", "enabled": enabled, "runs": []}
    try:
        runs, tz = next_runs(source, n=PREVIEW_RUNS), zone(tz_name)
    except InvalidSchedule as exc:
        return {**out, "error": str(exc)}
    out["runs"] = [
        {"local": run.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z"), "utc": run.strftime("%Y-%m-%d %H:%M:%S UTC")}
        for run in runs
    ]
    out["error"] = None if runs else "No more runs: the schedule is past its end or its limit."
    return out


__all__ = ["JobAdmin", "ScheduleAdmin", "UncountedPaginator", "WorkerAdmin"]

"""The jobs list's filters and search box.

None of them runs SELECT DISTINCT over the job table: choices come from QueueState, the last
day's Metric rows, the settings, the task modules and the unfinished jobs (a small set the
partial indexes of the unfinished states cover); the value in the URL is always offered. The
search box matches indexed columns exactly instead of Django's ``icontains`` over every field.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import Q
from django.db.models.functions import Lower
from django.db.models.lookups import Contains
from django.tasks import Task
from django.utils.module_loading import autodiscover_modules

from ..models import Job, Schedule, known_queues
from ..states import JobState
from .utils import database, parse_uuid

logger = logging.getLogger("django_jobs.admin")


def _unfinished_values(request: Any) -> tuple[set[str], set[str], set[int]]:
    """(queues, task paths, priorities) of the unfinished jobs, once per request."""
    cached = getattr(request, "_django_jobs_unfinished", None)
    if cached is None:
        rows = Job.objects.using(database()).unfinished_values()
        cached = (set(), set(), set())
        for queue, task_path, priority in rows:
            cached[0].add(queue)
            cached[1].add(task_path)
            cached[2].add(priority)
        request._django_jobs_unfinished = cached
    return cached


def queue_names(request: Any) -> list[str]:
    """The known queues (:func:`django_jobs.models.known_queues`), with the unfinished jobs' queues
    read once per request."""
    return known_queues(using=database(), unfinished=_unfinished_values(request)[0])


def known_task_paths(request: Any) -> list[str]:
    """The @task functions of the installed apps' ``tasks`` modules, the tasks of schedules, and
    those of unfinished jobs (once per request)."""
    cached = getattr(request, "_django_jobs_task_paths", None)
    if cached is None:
        cached = request._django_jobs_task_paths = _task_paths(request)
    return cached


def _task_paths(request: Any) -> list[str]:
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
    paths |= set(Schedule.objects.using(database()).values_list("task_path", flat=True))
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
        return [(name, name) for name in queue_names(request)]


class TaskFilter(_ValueFilter):
    title = "task"
    parameter_name = "task"
    field = "task_path"

    def choices_for(self, request):
        return [(p, p) for p in known_task_paths(request)]


class PriorityFilter(_ValueFilter):
    # The choices are the priorities of unfinished jobs (the unfinished states' indexes): reading
    # every finished job's would scan the history. The title says so.
    title = "priority (of unfinished jobs)"
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


def range_filters() -> list[Any]:
    """Date ranges (django-admin-rangefilter) on the three timestamps, when it is installed."""
    if not apps.is_installed("rangefilter"):
        return []
    from rangefilter.filters import DateTimeRangeFilterBuilder

    return [
        ("enqueued_at", DateTimeRangeFilterBuilder(title="enqueued")),
        ("started_at", DateTimeRangeFilterBuilder(title="started")),
        ("finished_at", DateTimeRangeFilterBuilder(title="finished")),
    ]


# -- the search box -----------------------------------------------------------------------------

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


def search_jobs(request: Any, queryset: Any, search_term: str) -> tuple[Any, bool]:
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
    term = search_term.strip()
    if not term:
        return queryset, False
    prefix, sep, rest = term.partition(":")
    if sep and prefix.lower() in SEARCH_PREFIXES and rest.strip():
        lookup, needs_uuid = SEARCH_PREFIXES[prefix.lower()]
        value: Any = rest.strip()
        if needs_uuid:
            value = parse_uuid(value)
            if value is None:
                return queryset.none(), False
        elif lookup == "task_path__icontains":
            if value in known_task_paths(request):
                return queryset.filter(task_path=value), False
            return queryset.filter(containing("task_path", value)), False
        return queryset.filter(**{lookup: value}), False
    as_uuid = parse_uuid(term)
    if as_uuid is not None:
        return queryset.filter(Q(id=as_uuid) | Q(trace_id__in={term, as_uuid.hex, str(as_uuid)})), False
    indexed = Q(trace_id=term) | Q(idempotency_key=term)
    paths = [p for p in known_task_paths(request) if term.lower() in p.lower()]
    if paths:
        return queryset.filter(indexed | Q(task_path__in=paths)), False
    return queryset.filter(indexed | Q(dedup_key=term) | Q(partition_key=term) | containing("task_path", term)), False


def containing(field: str, term: str) -> Q:
    """Rows whose ``field`` contains ``term`` in any case. Lowered on both sides rather than
    ``icontains``, which MySQL/MariaDB spell as a plain LIKE: that follows the column's
    collation, binary there for names and keys (migration 0010)."""
    return Q(Contains(Lower(field), term.lower()))


__all__ = [
    "PriorityFilter",
    "QueueFilter",
    "StateFilter",
    "TaskFilter",
    "TraceFilter",
    "containing",
    "known_task_paths",
    "queue_names",
    "range_filters",
    "search_jobs",
]

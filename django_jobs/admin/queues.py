"""Admin for queues: the queues dashboard (it replaces the changelist), one page per queue with
its controls, and the plain form of a queue's flags and limits.

Pages (names in the ``admin`` namespace):

* ``django_jobs_queuestate_changelist`` (``/admin/django_jobs/queuestate/``): every queue with
  its unfinished jobs, what finished in the last hour and day, its limits; the throughput of
  all queues (last hour, last day) and the live workers.
* ``django_jobs_queue_dashboard`` (``queue/<name>/``): one queue's figures, throughput,
  unfinished jobs per task, limits and controls.
* ``django_jobs_queue_action`` (``queue/<name>/<action>/``): pause, resume, limits (POST only);
  clean and drain (GET: a confirmation page, POST: do it).

Viewing needs ``django_jobs.view_queuestate`` (or change) or ``django_jobs.view_job``; every
control needs ``django_jobs.control_queue``. The figures come from :mod:`django_jobs.console`
(read-only, shared with ``manage.py jobs``) and the reads of :mod:`django_jobs.models`; every
change goes through :mod:`django_jobs.engine` or :func:`django_jobs.queue`. ``?backend=<alias>``
picks a django-jobs backend of ``TASKS`` when there are several (default: ``default``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.tasks import task_backends
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

import django_jobs

from .. import console, engine
from ..backend import JobsBackend, validate_queue_name
from ..exceptions import JobsError
from ..models import Job, QueueState, queue_exists
from ..queues import CLEANABLE_STATES
from ..states import UNFINISHED_STATES, JobState
from .charts import chart
from .utils import database

#: The controls of the per-queue page; clean and drain delete jobs and are confirmed first.
ACTIONS = ("pause", "resume", "limits", "clean", "drain")
CONFIRMED_ACTIONS = ("clean", "drain")
#: A clean confirmation counts the matching jobs up to this many (it says "more than" beyond).
CLEAN_COUNT_CAP = 10_000


class QueueStateForm(forms.ModelForm):
    class Meta:
        model = QueueState
        help_texts = {
            "name": "A queue needs no row to exist: it is used as soon as a job is enqueued to it. Add one "
            "only to pause a queue or set its limits before its first job (or to edit those of one).",
            "concurrency_limit": "Most jobs of this queue running at once, over every worker. Empty: no limit.",
            "rate_limit": "Most jobs of this queue starting in any window of rate_window_seconds. Empty: no limit.",
            "max_size": "Most unfinished jobs; an enqueue beyond it raises QueueFull. Empty: no limit.",
            "partition_concurrency": "Most jobs of one partition running at once (default 1: in order).",
            "partition_max_size": "Most unfinished jobs of one partition. Empty: no limit.",
        }
        fields = (
            "name", "paused", "concurrency_limit", "rate_limit", "rate_window_seconds", "max_size",
            "partition_concurrency", "partition_rate_limit", "partition_rate_window_seconds", "partition_max_size",
        )  # fmt: skip

    def clean_name(self):
        """A queue's settings under a name no job can use would be a row nobody reaches."""
        name = self.cleaned_data.get("name")
        try:
            validate_queue_name(name)
        except JobsError as exc:
            raise forms.ValidationError(str(exc)) from None
        return name

    def clean(self):
        data = super().clean()
        for prefix in ("", "partition_"):
            rate, window = data.get(f"{prefix}rate_limit"), data.get(f"{prefix}rate_window_seconds")
            if (rate is None) != (window is None):
                raise forms.ValidationError(
                    f"Set both {prefix}rate_limit and {prefix}rate_window_seconds (at most that many jobs start "
                    "in any window of that many seconds), or neither."
                )
            if window is not None and window <= 0:
                raise forms.ValidationError(f"{prefix}rate_window_seconds must be > 0.")
        for name in ("concurrency_limit", "rate_limit", "max_size", "partition_concurrency", "partition_rate_limit",
                     "partition_max_size"):  # fmt: skip
            if data.get(name) == 0:
                raise forms.ValidationError(f"{name} must be at least 1; leave it empty for no limit.")
        return data


class QueueLimitsForm(QueueStateForm):
    """The per-queue page's limits: the queue's own concurrency, rate limit and max size, with
    QueueStateForm's validation (partition limits stay on the full form). Saved through
    ``engine.update_queue_state``, never with ``save()``."""

    class Meta(QueueStateForm.Meta):
        fields = ("concurrency_limit", "rate_limit", "rate_window_seconds", "max_size")


class CleanForm(forms.Form):
    """Which finished jobs a clean deletes: one state, finished more than so many hours ago."""

    state = forms.ChoiceField(choices=[(s, s) for s in CLEANABLE_STATES], initial="completed")
    older_than_hours = forms.FloatField(
        label="Finished more than (hours) ago", min_value=0, max_value=24 * 366 * 100, initial=24
    )

    @property
    def older_than(self) -> timedelta:
        return timedelta(hours=self.cleaned_data["older_than_hours"])


@admin.register(QueueState)
class QueueStateAdmin(admin.ModelAdmin):
    """The queues dashboard and the per-queue pages (see the module docstring); the add and change
    forms edit every flag and limit, partitions included.

    Edits here are runtime edits, like ``django_jobs.queue(...).set_...()``; a worker start
    re-applies ``DJANGO_JOBS["QUEUES"]`` only where the settings changed."""

    def get_model_perms(self, request):
        """The admin's index and sidebar offer no "+ Add" beside Queues: a queue needs no row to
        be used, and the link made people create one first. The add form stays, reached from
        the overview ("Set up a queue's limits") and from a queue's page."""
        return {**super().get_model_perms(request), "add": False}

    def get_object(self, request, object_id, from_field=None):
        # A NUL in the URL is refused by PostgreSQL as a value of the text primary key: not found.
        return None if "\x00" in str(object_id) else super().get_object(request, object_id, from_field)

    form = QueueStateForm
    readonly_fields = ("declared", "updated_at")
    #: A clean deletes at most ``clean_batch_size`` jobs per statement and ``clean_max_batches``
    #: batches per request, so one click never holds a long transaction or a request for minutes.
    clean_batch_size = 1000
    clean_max_batches = 20

    def save_model(self, request, obj, form, change):
        """Through the engine, like ``django_jobs.queue(...).configure()``: a loosened limit wakes
        the workers (NOTIFY) and a removed rate limit drops its start log."""
        names = [f for f in form.changed_data if f != "name"] if change else list(form.cleaned_data)
        changes = {f: form.cleaned_data[f] for f in names if f != "name"}
        engine.update_queue_state(using=database(), queue=obj.name, changes=changes)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<str:name>/dashboard/", view(self.queue_view), name="django_jobs_queue_dashboard"),
            path("<str:name>/dashboard/<str:action>/", view(self.queue_action_view), name="django_jobs_queue_action"),
            *super().get_urls(),
        ]

    # -- pages ------------------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The queues dashboard, in place of the list of QueueState rows."""
        self._check_view(request)
        backend, using = _backend(request)
        data = console.dashboard(using=using, backend=backend)
        links = _Links(request, backend)
        context = {
            **self.admin_site.each_context(request),
            **self._base_context(request, backend),
            "title": "Queues",
            "queues": [_queue_figures(q, links) for q in data.queues],
            "hour_chart": chart(data.hour, "all-hour", "Jobs finished per minute, all queues, last hour"),
            "day_chart": chart(data.day, "all-day", f"Jobs finished, all queues, {data.day.heading.lower()}"),
            "day_heading": data.day.heading,
            "workers": data.workers,
            "worker_rows": [_worker_figures(w) for w in data.workers.rows],
            "stale_after": _duration(data.workers.stale_after.total_seconds()),
            "add_url": reverse("admin:django_jobs_queuestate_add") if self.has_add_permission(request) else None,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "django_jobs/admin/queues/overview.html", context)

    def queue_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """One queue: its figures, charts, unfinished jobs per task, limits and controls."""
        self._check_view(request)
        return self._render_queue(request, name)

    def queue_action_view(self, request: HttpRequest, name: str, action: str) -> HttpResponse:
        """Pause, resume and limits act on POST (405 otherwise); clean and drain show a
        confirmation page on GET and act on POST. Each needs django_jobs.control_queue."""
        if action not in ACTIONS:
            raise Http404(f"No queue action {action!r}.")
        if not _can_control(request):
            raise PermissionDenied
        backend, using = _backend(request)
        _check_queue(using, backend, name)
        if action not in CONFIRMED_ACTIONS and request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        return getattr(self, f"_{action}")(request, name, backend, using)

    # -- actions ----------------------------------------------------------------------------------

    def _pause(self, request: HttpRequest, name: str, backend: str, using: str) -> HttpResponse:
        django_jobs.queue(name, backend=backend).pause()
        self.message_user(request, f"Queue “{name}” paused: running jobs finish, no new one starts.", messages.SUCCESS)
        return HttpResponseRedirect(_Links(request, backend).queue(name))

    def _resume(self, request: HttpRequest, name: str, backend: str, using: str) -> HttpResponse:
        django_jobs.queue(name, backend=backend).resume()
        self.message_user(request, f"Queue “{name}” resumed.", messages.SUCCESS)
        return HttpResponseRedirect(_Links(request, backend).queue(name))

    def _limits(self, request: HttpRequest, name: str, backend: str, using: str) -> HttpResponse:
        instance = QueueState.objects.using(using).filter(name=name).first() or QueueState(name=name)
        form = QueueLimitsForm(request.POST, instance=instance)
        if not form.is_valid():
            return self._render_queue(request, name, limits_form=form)
        changes = {f: form.cleaned_data[f] for f in QueueLimitsForm.Meta.fields}
        engine.update_queue_state(using=using, queue=name, changes=changes)
        rate = changes["rate_limit"] and f"{changes['rate_limit']} per {changes['rate_window_seconds']:g} s"
        self.message_user(
            request,
            f"Limits of queue “{name}” saved: concurrency {changes['concurrency_limit'] or 'unlimited'}, "
            f"rate {rate or 'unlimited'}, max size {changes['max_size'] or 'unlimited'}.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(_Links(request, backend).queue(name))

    def _clean(self, request: HttpRequest, name: str, backend: str, using: str) -> HttpResponse:
        if request.method == "POST":
            form = CleanForm(request.POST)
            if form.is_valid():
                control = django_jobs.queue(name, backend=backend)
                deleted, state, older_than = 0, form.cleaned_data["state"], form.older_than
                for _ in range(self.clean_max_batches):
                    n = control.clean(state, older_than=older_than, limit=self.clean_batch_size)
                    deleted += n
                    if n < self.clean_batch_size:
                        more = ""
                        break
                else:
                    more = " More remain: clean again to continue."
                hours = form.cleaned_data["older_than_hours"]
                self.message_user(
                    request,
                    f"Deleted {deleted} {state} job(s) of queue “{name}” finished more than {hours:g} hour(s) ago."
                    + more,
                    messages.SUCCESS if not more else messages.WARNING,
                )
                return HttpResponseRedirect(_Links(request, backend).queue(name))
        else:
            form = CleanForm(request.GET or None)
        matching = None
        if form.is_bound and form.is_valid():
            matching = Job.objects.using(using).finished_count(
                backend=backend,
                queue=name,
                state=form.cleaned_data["state"],
                before=timezone.now() - form.older_than,
                cap=CLEAN_COUNT_CAP,
            )
        context = {
            "form": form,
            "matching": matching,
            "cap": CLEAN_COUNT_CAP,
            "more_than_cap": matching is not None and matching > CLEAN_COUNT_CAP,
        }
        return self._render_confirm(request, name, backend, "clean", context)

    def _drain(self, request: HttpRequest, name: str, backend: str, using: str) -> HttpResponse:
        control = django_jobs.queue(name, backend=backend)
        if request.method == "POST":
            deleted = control.drain()
            self.message_user(
                request, f"Drained queue “{name}”: deleted {deleted} waiting and delayed job(s).", messages.SUCCESS
            )
            return HttpResponseRedirect(_Links(request, backend).queue(name))
        counts = control.counts()
        context = {"waiting": counts["waiting"], "delayed": counts["delayed"]}
        return self._render_confirm(request, name, backend, "drain", context)

    # -- rendering --------------------------------------------------------------------------------

    def _render_queue(
        self, request: HttpRequest, name: str, limits_form: QueueLimitsForm | None = None
    ) -> HttpResponse:
        backend, using = _backend(request)
        _check_name(name)
        data = console.queue_dashboard(using=using, backend=backend, name=name)
        if data is None:
            raise Http404(f"No queue {name!r}.")
        links = _Links(request, backend)
        row = data.stats.row
        can_control = _can_control(request)
        if can_control and limits_form is None:
            limits_form = QueueLimitsForm(
                initial={
                    "concurrency_limit": row.concurrency,
                    "rate_limit": row.rate_limit[0] if row.rate_limit else None,
                    "rate_window_seconds": row.rate_limit[1] if row.rate_limit else None,
                    "max_size": row.max_size,
                }
            )
        context = {
            **self.admin_site.each_context(request),
            **self._base_context(request, backend),
            "title": f"Queue “{name}”",
            "queue": _queue_figures(data.stats, links),
            "tasks": [
                {
                    "path": t.task_path,
                    "total": t.total,
                    "url": links.jobs(name, task=t.task_path),
                    "counts": [{"n": t.counts[s], "url": links.jobs(name, s, t.task_path)} for s in UNFINISHED_STATES],
                }
                for t in data.tasks
            ],
            "hour_chart": chart(data.hour, "queue-hour", f"Jobs of queue {name} finished per minute, last hour"),
            "day_chart": chart(data.day, "queue-day", f"Jobs of queue {name} finished, {data.day.heading.lower()}"),
            "day_heading": data.day.heading,
            "limits_form": limits_form if can_control else None,
            "clean_form": CleanForm() if can_control else None,
            "actions": {a: links.action(name, a) for a in ACTIONS} if can_control else None,
            "change_url": self._change_url(request, name, using),
        }
        return TemplateResponse(request, "django_jobs/admin/queues/queue.html", context)

    def _render_confirm(
        self, request: HttpRequest, name: str, backend: str, action: str, extra: dict[str, Any]
    ) -> HttpResponse:
        links = _Links(request, backend)
        context = {
            **self.admin_site.each_context(request),
            **self._base_context(request, backend),
            "title": f"{action.capitalize()} queue “{name}”?",
            "name": name,
            "action": action,
            "action_url": links.action(name, action),
            "queue_url": links.queue(name),
            **extra,
        }
        return TemplateResponse(request, "django_jobs/admin/queues/confirm.html", context)

    def _base_context(self, request: HttpRequest, backend: str) -> dict[str, Any]:
        return {
            "opts": self.model._meta,
            "backend": backend,
            "backends": _jobs_backends(),
            "overview_url": _Links(request, backend).overview(),
            "can_control": _can_control(request),
        }

    def _change_url(self, request: HttpRequest, name: str, using: str) -> str | None:
        """The full form of the queue's flags and limits (partition limits too): its row's change
        form, or, for a queue that has no row yet (its settings are all defaults), the add form
        with the name filled in; None for a user who may not use the form it would be."""
        if QueueState.objects.using(using).filter(name=name).exists():
            if not self.has_change_permission(request):
                return None
            return reverse("admin:django_jobs_queuestate_change", args=[name])
        if not self.has_add_permission(request):
            return None
        return f"{reverse('admin:django_jobs_queuestate_add')}?{urlencode({'name': name})}"

    def _check_view(self, request: HttpRequest) -> None:
        if not (self.has_view_or_change_permission(request) or request.user.has_perm("django_jobs.view_job")):
            raise PermissionDenied


# -- helpers ---------------------------------------------------------------------------------------


def _can_control(request: HttpRequest) -> bool:
    return request.user.has_perm("django_jobs.control_queue")


def _jobs_backends() -> list[str]:
    """The aliases of ``TASKS`` served by django-jobs."""
    return [alias for alias in getattr(settings, "TASKS", {}) if isinstance(task_backends[alias], JobsBackend)]


def _backend(request: HttpRequest) -> tuple[str, str]:
    """``(alias, database)`` of the backend the page shows: ``?backend=`` when it names a
    django-jobs backend, else ``default`` (or the first one)."""
    aliases = _jobs_backends()
    wanted = request.GET.get("backend")
    if wanted in aliases:
        alias = wanted
    elif "default" in aliases or not aliases:
        alias = "default"
    else:
        alias = aliases[0]
    return alias, task_backends[alias].database if alias in aliases else database()


def _check_name(name: str) -> None:
    """404 for a name no queue can have (enqueue validates queue names)."""
    try:
        validate_queue_name(name)
    except JobsError:
        raise Http404(f"No queue {name!r}.") from None


def _check_queue(using: str, backend: str, name: str) -> None:
    _check_name(name)
    if not queue_exists(using=using, backend=backend, name=name):
        raise Http404(f"No queue {name!r}.")


class _Links:
    """URLs of the console's pages, keeping a non-default ``?backend=``; None for a page the user
    may not see (the jobs list without view_job) or a queue name no URL can hold."""

    def __init__(self, request: HttpRequest, backend: str) -> None:
        self.suffix = "" if backend == "default" else "?" + urlencode({"backend": backend})
        self.can_view_jobs = request.user.has_perm("django_jobs.view_job") or request.user.has_perm(
            "django_jobs.change_job"
        )

    def overview(self) -> str:
        return reverse("admin:django_jobs_queuestate_changelist") + self.suffix

    def queue(self, name: str) -> str | None:
        """None for a name enqueue refuses (only a raw insert can store one): its page is a 404."""
        try:
            _check_name(name)
        except Http404:
            return None
        return reverse("admin:django_jobs_queue_dashboard", args=[name]) + self.suffix

    def action(self, name: str, action: str) -> str:
        return reverse("admin:django_jobs_queue_action", args=[name, action]) + self.suffix

    def jobs(self, queue: str, state: str | None = None, task: str | None = None) -> str | None:
        if not self.can_view_jobs:
            return None
        params = {"queue": queue, "state": state, "task": task}
        return reverse("admin:django_jobs_job_changelist") + "?" + urlencode({k: v for k, v in params.items() if v})


def _queue_figures(stats: console.QueueStats, links: _Links) -> dict[str, Any]:
    """One queue's figures, formatted for the templates."""
    row, hour = stats.row, stats.hour
    age = stats.oldest_waiting_age
    return {
        "name": row.name,
        "url": links.queue(row.name),
        "counts": [
            {"state": s, "label": JobState(s).label, "n": row.counts.get(s, 0), "url": links.jobs(row.name, s)}
            for s in UNFINISHED_STATES
        ],
        "oldest_waiting": _duration(age.total_seconds()) if age is not None else "–",
        "hour": hour,
        "day": stats.day,
        "completed_url": links.jobs(row.name, "completed"),
        "failed_url": links.jobs(row.name, "failed"),
        "jobs_per_minute": f"{stats.jobs_per_minute:.1f}",
        "failure_rate": f"{hour.failure_rate:.1%}" if hour.failure_rate is not None else "–",
        "avg_runtime": _runtime(hour.avg_runtime_ms),
        "paused": row.paused,
        "concurrency": row.concurrency or "–",
        "rate_limit": f"{row.rate_limit[0]} / {row.rate_limit[1]:g} s" if row.rate_limit else "–",
        "max_size": row.max_size or "–",
    }


def _worker_figures(worker: console.WorkerRow) -> dict[str, Any]:
    return {"w": worker, "age": _duration(worker.heartbeat_age.total_seconds()), "queues": ", ".join(worker.queues)}


def _duration(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``2 h 5 min``, ``3 d 4 h``."""
    seconds = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if seconds >= size:
            rest = (seconds % size) // sub_size
            return f"{seconds // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{seconds} s"


def _runtime(ms: float | None) -> str:
    if ms is None:
        return "–"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    return _duration(ms / 1000)


__all__ = ["CleanForm", "QueueLimitsForm", "QueueStateAdmin", "QueueStateForm"]

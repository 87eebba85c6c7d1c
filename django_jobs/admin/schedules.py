"""Admin for schedules: add and edit them (a runtime edit), preview their next runs, run one now,
enable and disable them."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseBadRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from ..exceptions import JobsError
from ..models import Schedule
from ..schedules import InvalidSchedule, first_tick, next_runs, run_now, zone
from .changelist import SafeChangeList
from .filters import containing

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
    # Fits 1280 px with the sidebar open; the next run in the schedule's own time zone, named.
    list_display = ("name", "task_path", "when", "enabled", "next_run", "runs")
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

    def get_search_results(self, request, queryset, search_term):
        """Schedules whose name or task path contains each word of the term, in any case, on
        every database (see :func:`.filters.containing`)."""
        for word in search_term.split():
            queryset = queryset.filter(containing("name", word) | containing("task_path", word))
        return queryset, False

    def changelist_view(self, request, extra_context=None):
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if request.method == "POST" else []
        if not all(pk.isdigit() and int(pk) < 2**63 for pk in selected):
            return HttpResponseBadRequest("Malformed schedule id in the selection.")
        return super().changelist_view(request, extra_context)

    @admin.display(description="cron / every")
    def when(self, sched):
        if sched.cron:
            rule = sched.cron
        elif sched.every_seconds is not None:
            rule = f"every {sched.every_seconds:g}s" + (f" +{sched.offset_seconds:g}s" if sched.offset_seconds else "")
        else:
            return "-"
        return format_html('<code>{}</code><br><span class="quiet">{}</span>', rule, sched.timezone)

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, sched):
        """The next run in the schedule's time zone, to the second, the zone named (UTC too when
        the zone is another)."""
        if sched.next_run_at is None:
            return "-"
        try:
            local = sched.next_run_at.astimezone(zone(sched.timezone))
        except Exception:  # noqa: BLE001 - an unknown zone: the stored time in UTC
            local = sched.next_run_at.astimezone(UTC)
        text = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"
        if local.utcoffset() != timedelta(0):
            utc = sched.next_run_at.astimezone(UTC)
            return format_html('{}<br><span class="quiet">{} UTC</span>', text, f"{utc:%Y-%m-%d %H:%M:%S}")
        return text

    @admin.display(description="runs", ordering="iterations")
    def runs(self, sched):
        return sched.iterations

    def save_model(self, request, obj, form, change):
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


__all__ = ["ScheduleAdmin", "ScheduleForm", "schedule_preview"]

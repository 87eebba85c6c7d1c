"""Admin for queues: flags and limits (the dashboards build on it)."""

from django import forms
from django.contrib import admin

from ..models import QueueState


class QueueStateForm(forms.ModelForm):
    class Meta:
        model = QueueState
        fields = (
            "name", "paused", "concurrency_limit", "rate_limit", "rate_window_seconds", "max_size",
            "partition_concurrency", "partition_rate_limit", "partition_rate_window_seconds", "partition_max_size",
        )  # fmt: skip

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


@admin.register(QueueState)
class QueueStateAdmin(admin.ModelAdmin):
    """Edits here are runtime edits, like ``django_jobs.queue(...).set_...()``; a worker start
    re-applies ``DJANGO_JOBS["QUEUES"]`` only where the settings changed."""

    form = QueueStateForm
    list_display = (
        "name", "paused", "concurrency_limit", "rate_limit", "rate_window_seconds", "max_size",
        "partition_concurrency", "partition_rate_limit", "partition_max_size",
    )  # fmt: skip
    readonly_fields = ("declared", "updated_at")

    def save_model(self, request, obj, form, change):
        """Through the engine, like ``django_jobs.queue(...).configure()``: a loosened limit wakes
        the workers (NOTIFY) and a removed rate limit drops its start log."""
        from .. import engine
        from ..conf import get_settings

        names = [f for f in form.changed_data if f != "name"] if change else list(form.cleaned_data)
        changes = {f: form.cleaned_data[f] for f in names if f != "name"}
        engine.update_queue_state(using=get_settings().DATABASE, queue=obj.name, changes=changes)

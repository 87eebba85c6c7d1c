"""Admin for workers: the live worker processes, read-only, with the jobs each runs now."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from ..models import Worker
from .changelist import SafeChangeList
from .utils import database, moment


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    """Live workers, read-only, with the jobs each is running now."""

    def get_changelist(self, request, **kwargs):
        return SafeChangeList

    def get_object(self, request, object_id, from_field=None):
        return None if "\x00" in str(object_id) else super().get_object(request, object_id, from_field)

    # Fits 1280 px with the sidebar open: the id names the host (or the host is under it); times
    # on two lines, zone named.
    list_display = ("worker", "pid", "queues_display", "concurrency", "running", "started", "heartbeat")
    list_display_links = ("worker",)
    readonly_fields = ("id", "backend", "hostname", "pid", "queues", "concurrency", "started_at", "heartbeat_at")

    def get_queryset(self, request):
        return super().get_queryset(request).using(database()).with_running_jobs()

    @admin.display(description="running jobs")
    def running(self, worker):
        return worker.running_jobs or 0

    @admin.display(description="worker", ordering="id")
    def worker(self, worker):
        """Its id, and its host under it when the id does not name it."""
        if worker.hostname and worker.hostname not in worker.id:
            return format_html('{}<br><span class="quiet">{}</span>', worker.id, worker.hostname)
        return worker.id

    @admin.display(description="started", ordering="started_at")
    def started(self, worker):
        day, _, clock = moment(worker.started_at).partition(" ")
        return format_html("{}<br>{}", day, clock)

    @admin.display(description="heartbeat", ordering="heartbeat_at")
    def heartbeat(self, worker):
        age = max(0, round((timezone.now() - worker.heartbeat_at).total_seconds()))
        day, _, clock = moment(worker.heartbeat_at).partition(" ")
        return format_html("{}<br>{} ({} s ago)", day, clock, age)

    @admin.display(description="queues")
    def queues_display(self, worker):
        return ", ".join(worker.queues) if worker.queues else "all"

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


__all__ = ["WorkerAdmin"]

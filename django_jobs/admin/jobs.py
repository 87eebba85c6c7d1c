"""Admin for jobs, schedules and workers."""

from django.contrib import admin

from ..models import Job, JobDependency, JobLog, Schedule, Worker


class JobLogInline(admin.TabularInline):
    model = JobLog
    fields = ("idx", "created_at", "line")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("idx",)

    def has_add_permission(self, request, obj=None):
        return False


class DependencyInline(admin.TabularInline):
    """A flow parent's children: each edge's status and the child's value."""

    model = JobDependency
    fk_name = "parent"
    fields = ("child_id", "child_queue", "failure_policy", "status", "finished_at", "value")
    readonly_fields = fields
    extra = 0
    can_delete = False
    verbose_name = "child"
    verbose_name_plural = "children (flow)"

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    inlines = [DependencyInline, JobLogInline]
    list_display = (
        "id",
        "task_path",
        "queue",
        "state",
        "priority",
        "attempts",
        "max_attempts",
        "enqueued_at",
        "finished_at",
    )
    list_filter = ("state", "queue")
    search_fields = ("id", "task_path")
    date_hierarchy = "enqueued_at"
    ordering = ("-enqueued_at",)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        # Jobs change state through the engine only; admin actions arrive with the admin issue.
        return False


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("id", "hostname", "pid", "concurrency", "started_at", "heartbeat_at")

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Schedules can be added and edited here; an edit is a runtime edit, which the workers'
    sync of ``DJANGO_JOBS["SCHEDULES"]`` then leaves alone."""

    list_display = ("name", "task_path", "cron", "every_seconds", "timezone", "enabled", "next_run_at", "iterations")
    list_filter = ("enabled", "source", "backend")
    search_fields = ("name", "task_path")
    readonly_fields = ("next_run_at", "iterations", "last_run_at", "source", "code_hash", "edited_at", "synced_at")
    fieldsets = (
        (None, {"fields": ("backend", "name", "enabled", "task_path", "args", "kwargs", "queue", "priority", "options")}),
        ("When", {"fields": ("cron", "every_seconds", "offset_seconds", "timezone", "start_at", "end_at", "limit",
                             "catch_up")}),
        ("State", {"fields": readonly_fields}),
    )  # fmt: skip

    def save_model(self, request, obj, form, change):
        from django.utils import timezone

        from ..schedules import first_tick

        timing = {"cron", "every_seconds", "offset_seconds", "timezone", "start_at", "end_at"}
        now = timezone.now()
        if not change or timing & set(form.changed_data) or obj.next_run_at is None:
            obj.next_run_at = first_tick(obj, now)
        obj.source = "runtime"  # an admin edit is a runtime edit, as with django_jobs.schedule()
        obj.edited_at = now
        super().save_model(request, obj, form, change)

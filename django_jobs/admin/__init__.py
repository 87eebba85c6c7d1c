"""Admin for jobs and workers (read-only) and queue settings; dashboards and actions arrive with
the admin issue."""

from django.contrib import admin

from ..models import Job, JobDependency, JobLog, QueueState, Worker


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


@admin.register(QueueState)
class QueueStateAdmin(admin.ModelAdmin):
    list_display = ("name", "paused", "concurrency_limit", "rate_limit", "max_size")

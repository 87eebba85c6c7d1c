"""Flow dependencies: one row per (parent, child) edge (seed table ``job_dependency``).

The parent owns its rows. A child is named by id only (no foreign key, like the seed's
``child_key``): pruning a finished child must not erase what its parent reads from here.
``Job.pending_children`` on the parent counts the rows still ``pending``.
"""

from django.db import models


class DependencyStatus(models.TextChoices):
    PENDING = "pending", "Pending"  # the child has not finished
    PROCESSED = "processed", "Processed"  # the child completed; ``value`` is its return value
    IGNORED = "ignored", "Ignored"  # the child failed, the parent was told to ignore it; ``value`` = why
    FAILED = "failed", "Failed"  # the child failed and its failure counts against the parent
    REMOVED = "removed", "Removed"  # the child failed and its dependency was dropped (policy "remove")


class FailurePolicy(models.TextChoices):
    """What a child's failure does to its parent (BullMQ's flow options)."""

    FAIL = "fail", "Fail the parent"  # failParentOnFailure (our default)
    IGNORE = "ignore", "Ignore the failure"  # ignoreDependencyOnFailure
    REMOVE = "remove", "Remove the dependency"  # removeDependencyOnFailure
    CONTINUE = "continue", "Continue the parent"  # continueParentOnFailure


class JobDependency(models.Model):
    parent = models.ForeignKey("django_jobs.Job", on_delete=models.CASCADE, related_name="dependencies")
    child_id = models.UUIDField()
    child_queue = models.CharField(max_length=100)
    status = models.CharField(max_length=10, choices=DependencyStatus.choices, default=DependencyStatus.PENDING)
    failure_policy = models.CharField(max_length=10, choices=FailurePolicy.choices, default=FailurePolicy.FAIL)
    #: The child's return value (processed) or its error (ignored / failed / removed).
    value = models.JSONField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "django_jobs_dependency"
        constraints = [
            models.UniqueConstraint(fields=["parent", "child_id"], name="django_jobs_dependency_edge"),
        ]
        indexes = [
            # A child finishing finds its edge (the engine's dependency resolution).
            models.Index(fields=["child_id"], name="django_jobs_dependency_child"),
            # A parent lists its children by status (children_results, admin).
            models.Index(fields=["parent", "status"], name="django_jobs_dependency_status"),
        ]

    def __str__(self) -> str:
        return f"{self.parent_id} <- {self.child_id} [{self.status}]"

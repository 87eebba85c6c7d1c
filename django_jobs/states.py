"""Job states, the transitions the engine may make, and their projection onto Django's statuses."""

from django.db import models
from django.tasks import TaskResultStatus


class JobState(models.TextChoices):
    """The physical state of a job row (the seed schema's words, plus ``cancelled``).

    ``paused`` is a queue flag, not a state; a prioritised job is a waiting job with a priority.
    """

    WAITING = "waiting", "Waiting"
    DELAYED = "delayed", "Delayed"
    ACTIVE = "active", "Active"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    WAITING_CHILDREN = "waiting-children", "Waiting for children"
    CANCELLED = "cancelled", "Cancelled"


#: States a job never leaves by itself (only an explicit retry re-queues failed/cancelled).
FINISHED_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

#: States of a job that still has to run or finish, in one fixed order: the conditions of the
#: indexes django_jobs_unfinished_idx and django_jobs_blocked_idx and the engine's SQL spell the
#: list the same way.
UNFINISHED_STATES: tuple[str, ...] = (
    JobState.WAITING.value,
    JobState.DELAYED.value,
    JobState.ACTIVE.value,
    JobState.WAITING_CHILDREN.value,
)

#: The unfinished states as an SQL list of literals, spelled as the partial indexes' conditions
#: spell it, so the planners can use those indexes (SQLite's matches a list of literals only).
UNFINISHED_SQL = "(" + ", ".join(f"'{s}'" for s in UNFINISHED_STATES) + ")"

#: The unfinished jobs in disjoint parts, ``(state, blocked)`` (``blocked`` None: either), each
#: the condition of a partial index that a plain job's row is in anyway: waiting and ready
#: (django_jobs_ready_queue_idx), waiting for its partition's turn (django_jobs_blocked_idx),
#: delayed (django_jobs_delayed_q_idx), running (django_jobs_active_idx) and waiting for its
#: children (django_jobs_parent_wait_idx). No index holds every unfinished job, so a waiting
#: job writes no index entry only the counts read: a count by queue adds up the parts.
UNFINISHED_PARTS: tuple[tuple[str, bool | None], ...] = (
    (JobState.WAITING.value, False),
    (JobState.WAITING.value, True),
    (JobState.DELAYED.value, None),
    (JobState.ACTIVE.value, None),
    (JobState.WAITING_CHILDREN.value, None),
)

#: Every transition the engine makes, as (from, to). Tests assert the engine stays inside it.
TRANSITIONS: frozenset[tuple[str, str]] = frozenset(
    {
        (JobState.WAITING, JobState.ACTIVE),  # claim
        (JobState.DELAYED, JobState.WAITING),  # promote (due)
        (JobState.ACTIVE, JobState.COMPLETED),  # success
        (JobState.ACTIVE, JobState.FAILED),  # error, no attempts left / unresolvable task
        (JobState.ACTIVE, JobState.DELAYED),  # error with attempts left, backoff > 0
        (JobState.ACTIVE, JobState.WAITING),  # retry without backoff, release on shutdown, rescue
        (JobState.WAITING_CHILDREN, JobState.WAITING),  # flows: last child finished
        (JobState.WAITING, JobState.CANCELLED),
        (JobState.DELAYED, JobState.CANCELLED),
        (JobState.ACTIVE, JobState.CANCELLED),
        (JobState.WAITING_CHILDREN, JobState.CANCELLED),
        (JobState.FAILED, JobState.WAITING),  # manual retry
        (JobState.CANCELLED, JobState.WAITING),  # manual retry
    }
)

_PROJECTION = {
    JobState.WAITING: TaskResultStatus.READY,
    JobState.DELAYED: TaskResultStatus.READY,
    JobState.WAITING_CHILDREN: TaskResultStatus.READY,
    JobState.ACTIVE: TaskResultStatus.RUNNING,
    JobState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}


def to_task_status(state: str) -> TaskResultStatus:
    """Project a job state onto Django's ``TaskResultStatus``."""
    return _PROJECTION[JobState(state)]

"""django-jobs models: the job table and the rows that describe workers and queues."""

from .dedup import JobDedup, JobDedupNext
from .dependency import DependencyStatus, FailurePolicy, JobDependency
from .event import Event, Metric
from .job import Job, JobQuerySet
from .log import JobLog
from .queue import JobStart, QueueState
from .schedule import CatchUp, Schedule
from .worker import Worker

__all__ = [
    "DependencyStatus",
    "Event",
    "Metric",
    "FailurePolicy",
    "Job",
    "JobDedup",
    "JobDedupNext",
    "JobDependency",
    "JobLog",
    "JobStart",
    "JobQuerySet",
    "QueueState",
    "CatchUp",
    "Schedule",
    "Worker",
]

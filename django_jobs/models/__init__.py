"""django-jobs models: the job table and the rows that describe workers and queues, and the reads
the admin, the console and ``manage.py jobs`` share (QuerySet methods, :func:`known_queues`,
:func:`queue_exists`)."""

from .dedup import JobDedup, JobDedupNext
from .dependency import DependencyStatus, FailurePolicy, JobDependency
from .event import Event, EventQuerySet, Metric, MetricQuerySet
from .job import Job, JobQuerySet
from .lease import Lease
from .log import JobLog, JobLogQuerySet
from .queue import JobStart, QueueState, QueueStateQuerySet, declared_queues, known_queues, queue_exists
from .schedule import CatchUp, Schedule
from .topic import (
    ConsumerGroup,
    DeadLetter,
    DeadLetterState,
    GroupCursor,
    Message,
    Topic,
    TopicMetric,
    TopicMetricQuerySet,
    TopicPartition,
)
from .worker import Worker, WorkerQuerySet

__all__ = [
    "DependencyStatus",
    "Event",
    "EventQuerySet",
    "Metric",
    "MetricQuerySet",
    "FailurePolicy",
    "Job",
    "JobDedup",
    "JobDedupNext",
    "JobDependency",
    "JobLog",
    "JobLogQuerySet",
    "JobStart",
    "JobQuerySet",
    "Lease",
    "QueueState",
    "QueueStateQuerySet",
    "CatchUp",
    "ConsumerGroup",
    "DeadLetter",
    "DeadLetterState",
    "GroupCursor",
    "Message",
    "Topic",
    "TopicMetric",
    "TopicMetricQuerySet",
    "TopicPartition",
    "Schedule",
    "Worker",
    "WorkerQuerySet",
    "declared_queues",
    "known_queues",
    "queue_exists",
]

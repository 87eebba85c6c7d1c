"""django-jobs models: the job table and the rows that describe workers and queues."""

from .job import Job, JobQuerySet
from .log import JobLog
from .queue import QueueState
from .worker import Worker

__all__ = ["Job", "JobLog", "JobQuerySet", "QueueState", "Worker"]

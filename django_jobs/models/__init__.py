"""django-jobs models: the job table and the rows that describe workers and queues."""

from .job import Job, JobQuerySet
from .queue import QueueState
from .worker import Worker

__all__ = ["Job", "JobQuerySet", "QueueState", "Worker"]

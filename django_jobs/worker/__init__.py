"""The worker: ``Worker(queues=..., concurrency=...).run()``; see :mod:`.runner`."""

from ..exceptions import InvalidWorkerOption, WorkerCrashed
from .runner import Worker, WorkerStats

__all__ = ["InvalidWorkerOption", "Worker", "WorkerCrashed", "WorkerStats"]

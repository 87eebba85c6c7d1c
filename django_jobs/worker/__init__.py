"""The worker: ``Worker(queues=..., concurrency=...).run()``; see :mod:`.runner`."""

from ..exceptions import WorkerCrashed
from .runner import InvalidWorkerOption, Worker, WorkerStats

__all__ = ["InvalidWorkerOption", "Worker", "WorkerCrashed", "WorkerStats"]

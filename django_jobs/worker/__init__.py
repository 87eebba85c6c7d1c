"""The worker: ``Worker(queues=..., concurrency=...).run()``; see :mod:`.runner`."""

from .runner import InvalidWorkerOption, Worker, WorkerStats

__all__ = ["InvalidWorkerOption", "Worker", "WorkerStats"]

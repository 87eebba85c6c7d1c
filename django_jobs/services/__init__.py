"""Background services: one shape (``run_once()`` plus a jittered schedule, leader-aware)."""

from .base import Service
from .dedup import DedupSweeper
from .partitions import PartitionSweeper
from .promoter import Promoter
from .pruner import Pruner
from .rescuer import Reaper, Rescuer
from .scheduler import Scheduler
from .topics import TopicRecorder

__all__ = [
    "DedupSweeper",
    "PartitionSweeper",
    "Promoter",
    "Pruner",
    "Reaper",
    "Rescuer",
    "Scheduler",
    "Service",
    "TopicRecorder",
]

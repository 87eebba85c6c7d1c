"""Background services: one shape (``run_once()`` plus a jittered schedule, leader-aware)."""

from .base import Service
from .promoter import Promoter
from .rescuer import Reaper, Rescuer

__all__ = ["Promoter", "Reaper", "Rescuer", "Service"]

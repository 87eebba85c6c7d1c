"""django-jobs: durable background jobs for Django's Tasks framework, stored in your database.

The public names below are loaded on first use (PEP 562), so ``import django_jobs`` needs
neither settings nor a ready app registry, and the modules behind them import the models at
their top like any Django module.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "Dedup": "spec.dedup",
    "EventPage": "eventlog",
    "Fail": "exceptions",
    "Flow": "flows",
    "JobCall": "backend",
    "QueueFull": "exceptions",
    "Retry": "exceptions",
    "Snooze": "exceptions",
    "call": "backend",
    "cancel": "api",
    "events": "eventlog",
    "flow": "flows",
    "follow_events": "eventlog",
    "queue": "queues",
    "retry": "api",
    "rotate_keys": "api",
    "schedule": "schedules",
    "subscriber": "topics",
    "topic": "topics",
    "TopicFull": "exceptions",
    "LeaseLost": "exceptions",
    "trace": "tracing",
    "unschedule": "schedules",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_jobs' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])

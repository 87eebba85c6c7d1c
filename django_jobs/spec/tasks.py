"""The tasks of this process: those declared with django-jobs' task class, and the ``Task`` a
stored job's path names. Part of :mod:`django_jobs.spec` (no models)."""

from __future__ import annotations

from typing import Any

from django.tasks import Task
from django.utils.module_loading import import_string

from ..exceptions import TaskNotFound

#: Every task declared with our task class, by dotted path (the pruner's per-task count limits).
_DECLARED: dict[str, Any] = {}


def declared_tasks() -> list[Any]:
    """The django-jobs tasks declared (imported) in this process."""
    return list(_DECLARED.values())


def declare(task: Any) -> None:
    """Record ``task`` as declared (``JobTask`` does, for each ``@task``; not for ``.using()`` copies)."""
    _DECLARED[task.module_path] = task


def resolve_task(path: str) -> Task:
    """The Task instance a job's path names; TaskNotFound when there is none."""
    try:
        obj = import_string(path)
    except ImportError as exc:
        raise TaskNotFound(f"Task path {path!r} does not resolve: {exc}. Was it renamed or removed?") from None
    if not isinstance(obj, Task):
        raise TaskNotFound(f"{path!r} is a {type(obj).__name__}, not a Task; only @task functions run.")
    return obj


__all__ = ["declare", "declared_tasks", "resolve_task"]

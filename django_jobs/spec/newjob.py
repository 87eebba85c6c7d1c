"""``NewJob``: one job to enqueue, as the backend, a flow, a schedule or the test kit asks for it.

The value the callers build once (from a task with :meth:`NewJob.for_task`, or field by field)
and hand to the engine's insert verbs (``insert_new_job``, ``insert_job``, ``insert_jobs``,
``insert_job_once``, ``enqueue_deduplicated``, ``insert_flow``, ``advance_schedule``). What the
engine decides when it writes the row (its id, state, ``seq``, ``enqueued_at``, whether it is
blocked behind its partition) is not here: that is ``engine.common.NewRow``.

A new job option is a field here, its line in :meth:`NewJob.for_task` (and its validation in
:mod:`.options`), and its column in the INSERT (``engine.insert._new_row``, ``drivers.inserts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .encryption import encrypt_arguments

if TYPE_CHECKING:
    from django.tasks import Task


# Slots, not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__,
# about 1 us more per enqueue on CPython 3.13 than the dict of keyword arguments this replaced.
@dataclass(slots=True)
class NewJob:
    """One job to enqueue, its values validated by the caller (the backend checks the task's
    options and the arguments before it builds one; the engine does not check them again).
    Nothing changes it once built: the engine writes what it decides into a row of its own
    (``engine.common.NewRow``), and a variant is a copy (``dataclasses.replace``).

    ``args`` and ``kwargs`` are the JSON-shaped arguments to store (an envelope each when
    ``options["encrypt"]``). ``max_attempts`` and
    ``options`` are what :func:`~django_jobs.spec.options.job_fields` gives for the task.
    ``run_after``: the job is delayed until then (None, or a time not after the insert's
    ``now``: waiting). ``lifo``: claimed before the FIFO jobs of its priority, newest first.
    ``trace_id``: the job's pipeline; None is the running job's, or a new one. ``partition``:
    the job runs after the earlier jobs of its (queue, partition) finished.
    """

    backend: str
    task_path: str
    queue: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    max_attempts: int
    options: dict[str, Any]
    run_after: datetime | None = None
    lifo: bool = False
    trace_id: str | None = None
    partition: str | None = None

    @classmethod
    def for_task(
        cls,
        task: Task,
        *,
        backend: str,
        args: list[Any],
        kwargs: dict[str, Any],
        max_attempts: int,
        options: dict[str, Any],
        trace_id: str | None,
    ) -> NewJob:
        """A job of ``task`` (validated) with these arguments: its path, queue, priority,
        ``run_after`` and django-jobs options (``lifo``, ``partition``) read from the task.

        With ``options["encrypt"]`` (``job_fields`` of an ``encrypt=True`` task) the arguments
        are stored encrypted: ``args`` and ``kwargs`` become envelopes here
        (:func:`~django_jobs.spec.encryption.encrypt_arguments`), so every path to the engine
        (enqueue, dedup and its stash, flows, schedules) stores them so."""
        if options.get("encrypt"):
            args, kwargs = encrypt_arguments(args, kwargs)  # type: ignore[assignment]
        return cls(
            backend,
            task.module_path,
            task.queue_name,
            task.priority,
            args,
            kwargs,
            max_attempts,
            options,
            task.run_after,
            bool(getattr(task, "lifo", False)),
            trace_id,
            getattr(task, "partition", None),
        )


__all__ = ["NewJob"]

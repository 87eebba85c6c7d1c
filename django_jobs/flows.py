"""Flows: trees of jobs where a parent runs after its children (BullMQ's FlowProducer).

::

    from django_jobs import flow

    result = flow(
        send_report,
        args=(report_id,),
        children=[
            flow(render_chart.using(queue_name="charts"), args=(report_id, "sales")),
            flow(render_chart.using(queue_name="charts"), args=(report_id, "costs"), failure_policy="ignore"),
        ],
    ).enqueue()

The whole tree is inserted in one transaction (the caller's, when there is one). A job with
children waits (``waiting-children``) until every child is done, then becomes ``waiting`` once;
in it, ``context.children_results()`` returns the children's return values by child id.
``failure_policy`` says what a child's failure does to its parent: ``"fail"`` (default) fails
the parent, ``"ignore"`` lets it run and see the failure in ``context.children_failures()``,
``"remove"`` drops the dependency, ``"continue"`` starts the parent at once.
See docs/howto/flows.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.tasks import Task
from django.tasks.exceptions import InvalidTask

from . import engine
from .backend import JobsBackend
from .dispatch import ENQUEUED
from .exceptions import InvalidFlow, JobsError
from .models import Job
from .spec.newjob import NewJob
from .spec.options import job_fields
from .spec.payload import check_payload
from .spec.tracing import trace_id_for_new_job, validate_trace_id
from .uuid7 import uuid7

#: The deepest a flow may nest (root = depth 1).
MAX_DEPTH = 100
FAILURE_POLICIES = ("fail", "ignore", "remove", "continue")

__all__ = ["FAILURE_POLICIES", "MAX_DEPTH", "Flow", "flow"]


@dataclass(frozen=True, eq=False)
class Flow:
    """A job and the children it waits for; made by :func:`flow`."""

    task: Task
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    children: tuple[Flow, ...] = ()
    #: What this job's failure does to its parent (ignored for the root).
    failure_policy: str = "fail"

    def enqueue(self, *, parent: Any = None) -> Any:
        """Insert the whole tree atomically and return the root's result.

        ``parent``: the result (or result id) of an existing job that is still waiting for its
        children; this tree's root becomes one more of them. Raises :class:`InvalidFlow` (and
        inserts nothing) for a cycle, a job listed twice, a tree deeper than ``MAX_DEPTH``, tasks
        of different backends, a parent that does not exist or is no longer waiting for
        children, and the errors ``enqueue`` raises for invalid arguments or options.
        """
        return _enqueue(self, parent)

    async def aenqueue(self, *, parent: Any = None) -> Any:
        """The async form of :meth:`enqueue`."""
        return await sync_to_async(_enqueue, thread_sensitive=True)(self, parent)


def flow(
    task: Task,
    args: Iterable[Any] = (),
    kwargs: dict[str, Any] | None = None,
    children: Iterable[Flow] = (),
    failure_policy: str = "fail",
) -> Flow:
    """A flow node: ``task`` (with any ``.using(...)`` options) called with ``args``/``kwargs``,
    run after every flow in ``children`` is done. ``failure_policy``: what this job's failure
    does to its parent (``"fail"``, ``"ignore"``, ``"remove"`` or ``"continue"``)."""
    if not isinstance(task, Task):
        raise InvalidFlow(f"flow() takes a @task function (a django.tasks.Task); got {type(task).__name__}.")
    if not isinstance(args, (list, tuple)):
        raise InvalidFlow(f"flow() args must be a list or tuple of positional arguments; got {type(args).__name__}.")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidFlow(f"flow() kwargs must be a dict; got {type(kwargs).__name__}.")
    if failure_policy not in FAILURE_POLICIES:
        raise InvalidFlow(f"failure_policy must be one of {', '.join(FAILURE_POLICIES)}; got {failure_policy!r}.")
    if isinstance(children, Flow):
        raise InvalidFlow("children must be a list of flow(...) nodes, not a single one; wrap it in a list.")
    if not isinstance(children, (list, tuple)):
        raise InvalidFlow(f"children must be a list or tuple of flow(...) nodes; got {type(children).__name__}.")
    kids = tuple(children)
    for i, child in enumerate(kids):
        if not isinstance(child, Flow):
            raise InvalidFlow(f"children[{i}] is a {type(child).__name__}; each child must be made with flow(...).")
    return Flow(task=task, args=tuple(args), kwargs=dict(kwargs or {}), children=kids, failure_policy=failure_policy)


def _enqueue(root: Flow, parent: Any) -> Any:
    if not isinstance(root, Flow):
        raise InvalidFlow(f"expected a flow(...); got {type(root).__name__}.")
    backend = root.task.get_backend()
    if not isinstance(backend, JobsBackend):
        raise InvalidFlow(
            f"Flows need django_jobs.backend.JobsBackend; {root.task.module_path} uses {type(backend).__name__}."
        )
    attach_to = _parent_id(parent) if parent is not None else None
    # Everything is validated before anything is inserted.
    jobs: list[engine.FlowJob] = []
    tasks: list[Task] = []
    trace_id = _trace_id_for(root.task)
    _walk(root, None, 1, [], set(), backend, jobs, tasks, trace_id, _partitions_above(attach_to, backend.database))
    using = backend.database
    try:
        with transaction.atomic(using=using):
            inserted = engine.insert_flow(using=using, jobs=jobs, attach_to=attach_to, backend=backend.alias)
    except engine.FlowParentNotWaiting as exc:
        if exc.state is None:
            raise InvalidFlow(f"No job {attach_to} to attach this flow to.") from None
        if exc.backend != backend.alias:
            raise InvalidFlow(
                f"Job {attach_to} belongs to backend {exc.backend!r} and this flow to {backend.alias!r}; a flow is "
                "stored in one transaction, so all its jobs must use the same backend."
            ) from None
        raise InvalidFlow(
            f"Job {attach_to} is {exc.state}, no longer waiting for children; a child can only be attached to a "
            "parent that is waiting-children."
        ) from None
    results = [backend._result_from_job(job, task) for job, task in zip(inserted, tasks, strict=True)]

    def send() -> None:
        for result in results:  # each receiver robustly, as enqueue() sends it
            ENQUEUED.send(type(backend), result)

    transaction.on_commit(send, using=using, robust=True)
    return results[0]


def _walk(
    node: Flow,
    parent_id: uuid.UUID | None,
    depth: int,
    path: list[int],
    seen: set[int],
    backend: Any,
    jobs: list[Any],
    tasks: list[Task],
    trace_id: str | None,
    ancestors: frozenset[tuple[str, str]],
) -> None:
    where = "the root" if not path else "child " + ".".join(map(str, path))
    if not isinstance(node, Flow):
        raise InvalidFlow(f"{where} is a {type(node).__name__}; each node must be made with flow(...).")
    if depth > MAX_DEPTH:
        raise InvalidFlow(f"The flow is deeper than {MAX_DEPTH} levels (at {where}); flatten it.")
    if id(node) in seen:
        raise InvalidFlow(
            f"{where} is a flow node that already appears in this tree (a cycle, or one node used twice); a job has "
            "one parent, so build a separate flow(...) for each place."
        )
    seen.add(id(node))
    task = node.task
    if task.get_backend() is not backend:
        raise InvalidFlow(
            f"{where} ({task.module_path}) uses backend {task.backend!r} but the root uses {backend.alias!r}; a flow "
            "is stored in one transaction, so all its tasks must use the same backend."
        )
    for option in ("dedup", "idempotency_key"):
        if getattr(task, option, None):
            raise InvalidFlow(
                f"{where} ({task.module_path}) has {option}; jobs of a flow are not deduplicated. Enqueue it on its "
                "own" + (", or use .using(dedup=False) in the flow." if option == "dedup" else ".")
            )
    try:
        backend.validate_task(task)
        args, kwargs = check_payload(node.args, node.kwargs, cap=backend.settings.MAX_PAYLOAD_BYTES)
    except (InvalidTask, JobsError) as exc:  # name the node, keep the exception class
        raise type(exc)(f"{where} ({task.module_path}): {exc}") from None
    partition = getattr(task, "partition", None)
    if partition is not None and (task.queue_name, partition) in ancestors:
        raise InvalidFlow(
            f"{where} ({task.module_path}) is in partition {partition!r} of queue {task.queue_name!r}, like one of its "
            "parents: the parent waits for the child and the partition's order makes the child wait for the parent. "
            "Put the children in another partition (or none)."
        )
    if partition is not None:
        ancestors = ancestors | {(task.queue_name, partition)}
    max_attempts, options = job_fields(task, default_max_attempts=backend.settings.MAX_ATTEMPTS)
    job_id = uuid7()
    jobs.append(
        engine.FlowJob(
            id=job_id,
            job=NewJob.for_task(
                task,
                backend=backend.alias,
                args=args,
                kwargs=kwargs,
                max_attempts=max_attempts,
                options=options,
                trace_id=trace_id,
            ),
            parent_id=parent_id,
            failure_policy=node.failure_policy,
            children=len(node.children),
        )
    )
    tasks.append(task)
    for i, child in enumerate(node.children):
        _walk(child, job_id, depth + 1, [*path, i], seen, backend, jobs, tasks, trace_id, ancestors)


def _partitions_above(job_id: uuid.UUID | None, using: str) -> frozenset[tuple[str, str]]:
    """(queue, partition) of ``job_id`` and its ancestors: a flow attached under it must not
    use them (the parent would wait for a child that waits for the parent)."""
    found: set[tuple[str, str]] = set()
    for _ in range(MAX_DEPTH + 1):
        if job_id is None:
            break
        row = Job.objects.using(using).filter(id=job_id).values_list("queue", "partition_key", "parent_id").first()
        if row is None:
            break
        if row[1] is not None:
            found.add((row[0], row[1]))
        job_id = row[2]
    return frozenset(found)


def _parent_id(parent: Any) -> uuid.UUID:
    raw = getattr(parent, "id", parent)
    try:
        return uuid.UUID(str(raw))
    except (ValueError, TypeError, AttributeError):
        raise InvalidFlow(f"parent must be a job's result or result id; got {parent!r}.") from None


def _trace_id_for(task: Task) -> str:
    """One trace id for the whole flow: the root task's own, or the running job's, or a new one."""
    explicit = getattr(task, "trace_id", None)
    return trace_id_for_new_job(validate_trace_id(explicit) if explicit is not None else None)

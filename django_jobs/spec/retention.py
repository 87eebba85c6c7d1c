"""How long finished jobs are kept (BullMQ's remove-on-complete / remove-on-fail, queen's
retention), and the policy lookups the engine and the pruner share.

A policy per finished state (``completed``, ``failed``, ``cancelled``) says how long a job is
kept after it finished (``age``, seconds) and/or how many of the newest are kept (``count``).
It is looked up most specific first: the task's ``@task(retention=...)``, the queue's entry in
``DJANGO_JOBS["RETENTION"]["queues"]``, the global entry, then the default of one day.

When a job finishes the engine stores ``purge_at = finished_at + age`` on its row (no age:
``None``, kept), so the pruner deletes by one index and never looks a policy up per row. Count
limits are applied by the pruner per queue and per task. Part of :mod:`django_jobs.spec` (no
models), so the engine computes ``purge_at`` here; :mod:`django_jobs.retention` re-exports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..conf import get_settings
from ..exceptions import InvalidRetention
from .tasks import declared_tasks

__all__ = [
    "DEFAULT_AGE", "InvalidRetention", "MAX_AGE", "Policy", "STATES", "count_limits", "parse_policy", "policy_for",
    "purge_at", "queue_policies", "task_count_limits", "task_policies", "validate_policies",
    "validate_retention_setting",
]  # fmt: skip

#: Seconds a finished job is kept when nothing says otherwise: a day of history.
DEFAULT_AGE = 86_400.0
STATES = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class Policy:
    """``age``: seconds kept after finishing (None: no time limit). ``count``: at most this many
    of the newest kept (None: no count limit)."""

    age: float | None = DEFAULT_AGE
    count: int | None = None


_UNSET = object()


def parse_policy(value: Any, where: str) -> Policy:
    """One state's policy: seconds, a timedelta, None (keep forever), True (delete at once, as
    BullMQ's ``removeOnComplete: true``) or ``{"age": ..., "count": n}``."""
    if value is True:
        return Policy(age=0.0)
    if value is None:
        return Policy(age=None)
    if isinstance(value, dict):
        unknown = set(value) - {"age", "count"}
        if unknown or not value:
            raise InvalidRetention(
                f"{where}: a policy dict takes 'age' and/or 'count'; got {sorted(value) or 'an empty dict'}."
            )
        age = _age(value.get("age"), where) if "age" in value else None
        count = value.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise InvalidRetention(f"{where}: count must be an integer >= 0; got {count!r}.")
        return Policy(age=age, count=count)
    return Policy(age=_age(value, where))


#: The longest age accepted (100 years): a longer one is "forever", which is None.
MAX_AGE = 100 * 365.25 * 86_400


def _age(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_AGE
    ):
        raise InvalidRetention(
            f"{where}: an age is seconds from 0 to 100 years or a timedelta (0 deletes at once, None keeps "
            f"forever); got {value!r}."
        )
    return float(value)


def validate_policies(value: Any, where: str) -> dict[str, Policy]:
    """``{state: policy}`` from a task's ``retention=`` or one level of the setting."""
    if not isinstance(value, dict):
        raise InvalidRetention(
            f'{where} must be a dict such as {{"completed": 3600, "failed": {{"age": 86400, "count": 1000}}}}; '
            f"got {value!r}."
        )
    unknown = set(value) - set(STATES)
    if unknown:
        raise InvalidRetention(f"{where}: unknown state(s) {sorted(unknown)}; policies are for {', '.join(STATES)}.")
    return {state: parse_policy(v, f"{where}[{state!r}]") for state, v in value.items()}


def validate_retention_setting(value: Any) -> None:
    """``DJANGO_JOBS["RETENTION"]``: state policies plus ``"queues": {queue: {state: policy}}``."""
    if not isinstance(value, dict):
        raise InvalidRetention(f"RETENTION must be a dict; got {value!r}.")
    queues = value.get("queues", {})
    validate_policies({k: v for k, v in value.items() if k != "queues"}, "RETENTION")
    if not isinstance(queues, dict):
        raise InvalidRetention(f'RETENTION["queues"] must be a dict of {{queue: policies}}; got {queues!r}.')
    for name, policies in queues.items():
        validate_policies(policies, f'RETENTION["queues"][{name!r}]')


def _setting() -> dict[str, Any]:
    return get_settings().RETENTION or {}


def policy_for(state: str, *, queue: str, task_retention: dict[str, Any] | None = None) -> Policy:
    """The policy of a ``state`` job of ``queue`` whose task declared ``task_retention``."""
    if task_retention and state in task_retention:
        return parse_policy(task_retention[state], "retention")
    setting = _setting()
    per_queue = (setting.get("queues") or {}).get(queue) or {}
    if state in per_queue:
        return parse_policy(per_queue[state], f'RETENTION["queues"][{queue!r}]')
    if state in setting:
        return parse_policy(setting[state], "RETENTION")
    return Policy()


def purge_at(
    state: str, finished_at: datetime, *, queue: str, task_retention: dict[str, Any] | None = None
) -> datetime | None:
    """When a job finished in ``state`` at ``finished_at`` may be deleted (None: kept)."""
    age = policy_for(state, queue=queue, task_retention=task_retention).age
    return None if age is None else finished_at + timedelta(seconds=age)


def count_limits() -> list[tuple[str, str | None, str, int]]:
    """The count limits the pruner applies: ``(scope, name, state, count)`` with scope
    ``"queue"`` (name a queue) or ``"all"`` (name None). Task count limits are found from the
    task registry by :func:`task_count_limits`."""
    setting = _setting()
    out: list[tuple[str, str | None, str, int]] = []
    for state in STATES:
        if state in setting:
            count = parse_policy(setting[state], "RETENTION").count
            if count is not None:
                out.append(("all", None, state, count))
    for queue, policies in (setting.get("queues") or {}).items():
        for state, value in policies.items():
            count = parse_policy(value, "RETENTION").count
            if count is not None:
                out.append(("queue", queue, state, count))
    return out


def queue_policies(state: str) -> set[str]:
    """The queues whose ``RETENTION["queues"]`` entry has a policy for ``state``: the global
    policy of that state does not govern them."""
    return {q for q, policies in (_setting().get("queues") or {}).items() if state in policies}


def task_policies(state: str) -> list[str]:
    """The paths of the imported tasks with their own ``retention`` policy for ``state``: queue
    and global count limits do not govern their jobs."""
    return sorted(t.module_path for t in declared_tasks() if state in (getattr(t, "retention", None) or {}))


def task_count_limits() -> list[tuple[str, str, int]]:
    """``(task path, state, count)`` for every imported task of ours that declared a count."""
    out = []
    for task in declared_tasks():
        for state, value in (getattr(task, "retention", None) or {}).items():
            count = parse_policy(value, "retention").count
            if count is not None:
                out.append((task.module_path, state, count))
    return out

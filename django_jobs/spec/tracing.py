"""Trace ids: every job carries one, and the jobs of one pipeline share it.

A job's trace id is, in order: the one given with ``.using(trace_id=...)``; else the trace id of
the job running in this thread or task (the executor sets it around the task call, so jobs a
task enqueues inherit it); else a new one, the 32 hex digits of a UUIDv7: the job's own id
where the insert has it at hand (``task.enqueue()`` of most tasks), a fresh one elsewhere
(``enqueue_many`` and flows share one among their jobs). :func:`django_jobs.trace` lists a
pipeline (:mod:`django_jobs.tracing`, a layer up: it reads jobs).

Part of :mod:`django_jobs.spec`: no models, so the engine takes a new job's trace id from here and
task modules can import it before Django is set up. See docs/howto/idempotency-and-tracing.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import Context, ContextVar, Token, copy_context
from typing import Any

from ..exceptions import InvalidTaskOptions
from ..uuid7 import uuid7

TRACE_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}\Z")  # \Z: "$" would let a final newline in

#: The trace id of the job running in this context (None outside jobs). A ContextVar, so each
#: executor thread and each async task sees its own, and coroutines inherit their caller's.
_current: ContextVar[str | None] = ContextVar("django_jobs_trace_id", default=None)


def validate_trace_id(value: Any) -> str:
    """``value`` when it is a valid trace id; else InvalidTaskOptions saying what is allowed."""
    if not isinstance(value, str) or not TRACE_ID_RE.match(value):
        raise InvalidTaskOptions(
            f"trace_id must be 1-64 characters of letters, digits, '-', '_', '.' and ':' (a W3C trace id, a "
            f"request id, a UUID's hex); got {value!r}."
        )
    return value


def current_trace_id() -> str | None:
    """The trace id of the job running in this thread or task, or None outside a job."""
    return _current.get()


def new_trace_id() -> str:
    """A fresh trace id: 32 hex digits of a UUIDv7 (time-ordered)."""
    return uuid7().hex


def trace_id_for_new_job(explicit: str | None = None, own: Any = None) -> str:
    """The trace id a job enqueued now gets: ``explicit``, else the running job's, else a new one:
    the job's own id when the caller gives it (a UUIDv7, or its 32 hex digits: as new as a new
    trace id, and one random draw less), else a fresh UUIDv7's."""
    if explicit or (explicit := _current.get()):
        return explicit
    if own is None:
        return new_trace_id()
    return own if isinstance(own, str) else own.hex


@contextmanager
def running(trace_id: str | None) -> Iterator[None]:
    """Make ``trace_id`` the current trace id inside the block."""
    token = _current.set(trace_id)
    try:
        yield
    finally:
        _current.reset(token)


def enter_trace(trace_id: str | None) -> Token[str | None]:
    """:func:`running` without the generator, for the executor's per-job path: make ``trace_id``
    current and return the token to give :func:`leave_trace` (in a ``finally``)."""
    return _current.set(trace_id)


def leave_trace(token: Token[str | None]) -> None:
    _current.reset(token)


def context_running(trace_id: str | None) -> Context:
    """A copy of the current context in which ``trace_id`` is the current trace id: an
    ``async def`` job's coroutine runs in it on the worker's event loop."""
    context = copy_context()
    context.run(_current.set, trace_id)
    return context


__all__ = [
    "TRACE_ID_RE", "context_running", "current_trace_id", "new_trace_id", "running", "trace_id_for_new_job",
    "validate_trace_id",
]  # fmt: skip

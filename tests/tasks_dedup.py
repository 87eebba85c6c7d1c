"""Tasks for the deduplication, idempotency and trace tests (tests/contract/test_dedup.py,
tests/test_idempotency_trace.py, tests/dedup_load.py)."""

from django.tasks import task

from django_jobs import Dedup
from django_jobs.tracing import current_trace_id


@task
def refresh(item_id: int = 0, version: int = 0) -> int:
    return version


@task
def other_refresh(item_id: int = 0, version: int = 0) -> int:
    """Another task, to share a key with ``refresh``."""
    return version


@task(dedup=Dedup("nightly-report"))
def nightly_report() -> str:
    return "done"


@task(dedup=Dedup(lambda args, kwargs: f"user:{args[0]}"))
def sync_user(user_id: int, field: str = "") -> int:
    """Deduplicated per user: the key is computed from the arguments."""
    return user_id


@task(dedup=Dedup("search-index", keep_last_if_active=True))
def rebuild_index(version: int, enqueue_while_running: list[int] | None = None) -> int:
    """While it runs (holding its key), enqueues itself with each version of ``enqueue_while_running``:
    those are stashed and only the last runs, after this one."""
    for later in enqueue_while_running or []:
        result = rebuild_index.enqueue(later)
        assert result.duplicate
    return version


@task(takes_context=True)
def pipeline_step(context, depth: int) -> dict:
    """Enqueues the next step (``depth - 1``) until 0; returns the trace id it ran under and the
    child's result."""
    child = pipeline_step.enqueue(depth - 1) if depth > 0 else None
    return {
        "trace_id": current_trace_id(),
        "child_id": child.id if child else None,
        "child_trace_id": child.trace_id if child else None,
    }


@task
def enqueue_with_trace(trace_id: str) -> str:
    """Enqueues ``refresh`` with an explicit trace id from inside a running job."""
    return refresh.using(trace_id=trace_id).enqueue().trace_id


@task
async def async_step() -> dict:
    """An async task enqueueing a child: the child inherits the trace id through the context."""
    child = await refresh.aenqueue(1)
    return {"trace_id": current_trace_id(), "child_trace_id": child.trace_id}

"""The worker builds each claimed job's TaskResult through its slots (executor._task_result):
it must be what Django's dataclass builds from the same values, and the slots path must be the
one taken with the installed Django (else a Django that changed TaskResult's fields silently
costs every job the dataclass's __init__ again)."""

from __future__ import annotations

import json
import uuid
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime, timedelta

import pytest
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError

from django_jobs import context as context_module
from django_jobs.context import JobContext
from django_jobs.worker import executor
from tests import tasks

AT = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def test_the_slots_path_is_taken_with_this_django():
    assert executor._SETTERS is not None


def test_a_result_built_through_the_slots_equals_the_dataclasss():
    # Arguments as the claim gives them: decoded from JSON.
    args, kwargs = json.loads('[[1, 2], {"a": [3]}, "x", null]'), json.loads('{"k": {"n": 1.5, "t": true}}')
    errors = [TaskError(exception_class_path="builtins.ValueError", traceback="Traceback ...")]
    values = dict(
        task=tasks.noop, id="0192f0c4-0000-7000-8000-000000000001", status=TaskResultStatus.RUNNING,
        enqueued_at=AT, started_at=AT + timedelta(seconds=1), last_attempted_at=AT + timedelta(seconds=2), args=args, kwargs=kwargs, backend="default",
        errors=errors, worker_ids=["w-1", "w-2"],
    )  # fmt: skip
    built = executor._task_result(*values.values())
    expected = TaskResult(**values, finished_at=None)
    assert built == expected
    assert (built.args, built.kwargs, built.finished_at, built._return_value) == (args, kwargs, None, None)
    assert type(built) is TaskResult and built.is_finished is False


def test_the_context_slots_path_is_taken_with_this_django():
    assert context_module._SETTERS is not None


def test_a_context_built_through_the_slots_equals_the_dataclasss():
    result = executor._task_result(
        tasks.noop, "0192f0c4-0000-7000-8000-000000000001", TaskResultStatus.RUNNING, AT, AT, AT, [], {}, "default",
        [], ["w-1"],
    )  # fmt: skip
    attempt = object()
    token = uuid.uuid4()
    values = dict(
        task_result=result, job_id=result.id, queue="q", max_attempts=3, parent_id="p", partition="k",
        lease_token=token, database="other", attempt_state=attempt,
    )  # fmt: skip
    built = context_module.running_context(*values.values())
    expected = JobContext(**values)
    assert built == expected  # the fields compared: all but the lock, the cancel cache and the attempt
    assert built.attempt_state is attempt and built.attempt == 1 and built.is_last_attempt is False
    assert built._cancel_seen == [-1.0, False] and built._log_lock is not expected._log_lock
    assert built._log_lock.acquire(blocking=False)
    with pytest.raises(FrozenInstanceError):
        built.queue = "other"  # type: ignore[misc]

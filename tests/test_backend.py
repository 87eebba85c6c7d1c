"""The JobsBackend contract: options, enqueue in the caller's transaction, JSON validation,
payload cap, queue names and results. Real databases only; the engine is driven directly where
a result needs attempts (the worker has its own tests)."""

from __future__ import annotations

import enum
import json
import math
import re
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import transaction
from django.tasks import TaskResultStatus, task, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.test import override_settings
from django.utils import timezone

import django_jobs
from django_jobs import engine
from django_jobs.backend import JobsBackend, JobTask
from django_jobs.exceptions import InvalidQueueName, InvalidTaskArguments, InvalidTaskOptions, PayloadTooLarge
from django_jobs.models import Event, Job
from django_jobs.states import JobState
from tests import tasks
from tests.factories import claim, plain_function

db = pytest.mark.django_db
committing = pytest.mark.django_db(transaction=True)


def only_job() -> Job:
    jobs = list(Job.objects.all())
    assert len(jobs) == 1, jobs
    return jobs[0]


# -- contract and options ------------------------------------------------------------------


def test_backend_supports_defer_async_results_and_priority():
    backend = task_backends["default"]
    assert isinstance(backend, JobsBackend)
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True
    assert backend.task_class is JobTask


def test_task_decorator_builds_a_job_task_with_its_options():
    assert isinstance(tasks.noop, JobTask)
    assert tasks.fail_until.max_attempts == 3
    assert tasks.fail_until.backoff == 0
    assert tasks.noop.max_attempts is None
    assert tasks.noop.backoff is None


@db
def test_task_options_are_stored_on_the_job_row():
    tasks.fail_until.enqueue("/dev/null", 2)
    job = only_job()
    assert job.max_attempts == 3
    assert job.options == {"backoff": 0}


@db
def test_list_backoff_and_max_attempts_from_decorator_are_stored():
    tasks.limited_configured.enqueue()
    job = only_job()
    assert job.backend == "limited"
    assert job.max_attempts == 5
    assert job.options == {"backoff": [1, 2, 4]}


@db
def test_exponential_backoff_is_stored_by_name():
    tasks.exponential_retries.enqueue()
    job = only_job()
    assert job.max_attempts == 4
    assert job.options == {"backoff": "exponential"}


@db
def test_using_sets_max_attempts_and_backoff_on_the_job():
    configured = tasks.noop.using(max_attempts=7, backoff=[5, 10])
    assert configured.max_attempts == 7
    assert tasks.noop.max_attempts is None, "using() must return a copy"
    configured.enqueue()
    job = only_job()
    assert job.max_attempts == 7
    assert job.options == {"backoff": [5, 10]}


@db
def test_using_tuple_backoff_is_stored_as_a_list():
    tasks.noop.using(backoff=(1, 2.5)).enqueue()
    assert only_job().options == {"backoff": [1, 2.5]}


@db
def test_using_keeps_job_options_when_changing_queue_and_priority():
    tasks.fail_until.using(queue_name="slow", priority=-5).enqueue("/dev/null", 1)
    job = only_job()
    assert (job.queue, job.priority, job.max_attempts, job.options) == ("slow", -5, 3, {"backoff": 0})


@db
def test_task_without_options_stores_no_backoff_so_the_setting_applies_at_run_time():
    tasks.noop.enqueue()
    job = only_job()
    assert job.max_attempts == 1  # MAX_ATTEMPTS default
    assert job.options == {}


@db
def test_default_max_attempts_comes_from_backend_options():
    tasks.limited_echo.enqueue()
    assert only_job().max_attempts == 2


@db
def test_using_another_backend_takes_that_backends_default_max_attempts():
    tasks.noop.using(backend="limited").enqueue()
    job = only_job()
    assert job.backend == "limited"
    assert job.max_attempts == 2


@db
def test_explicit_max_attempts_wins_over_the_setting():
    tasks.limited_echo.using(max_attempts=9).enqueue()
    assert only_job().max_attempts == 9


@db
def test_default_max_attempts_follows_overridden_settings():
    with override_settings(DJANGO_JOBS={"MAX_ATTEMPTS": 6}):
        tasks.noop.enqueue()
    assert only_job().max_attempts == 6


def test_unknown_decorator_option_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="retries"):
        task(retries=3)(plain_function)


def test_unknown_using_option_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="frobnicate"):
        tasks.noop.using(frobnicate=5)


@pytest.mark.parametrize("value", [0, -1, "3", 2.5, True])
def test_invalid_max_attempts_is_rejected(value):
    with pytest.raises(InvalidTaskOptions, match="max_attempts") as info:
        tasks.noop.using(max_attempts=value)
    assert isinstance(info.value, InvalidTask)
    with pytest.raises(InvalidTaskOptions):
        task(max_attempts=value)(plain_function)


@pytest.mark.parametrize("value", [-1, [], [1, -2], "linear", math.nan, math.inf, True, {"a": 1}, [1, "2"]])
def test_invalid_backoff_is_rejected(value):
    with pytest.raises(InvalidTaskOptions, match="backoff") as info:
        tasks.noop.using(backoff=value)
    assert isinstance(info.value, InvalidTask)
    with pytest.raises(InvalidTaskOptions):
        task(backoff=value)(plain_function)


@pytest.mark.parametrize("value", [0, 2, 2.5, [1], [1, 2, 3], (0, 1.5), "exponential"])
def test_every_backoff_form_is_accepted(value):
    assert tasks.noop.using(backoff=value).backoff == value


# -- enqueue and transactions ---------------------------------------------------------------


@db
def test_enqueue_returns_a_ready_result_matching_the_row():
    result = tasks.add.using(priority=7, queue_name="emails").enqueue(2, b=3)
    job = only_job()
    assert result.id == str(job.id)
    assert uuid.UUID(result.id).version == 7
    assert result.status == TaskResultStatus.READY
    assert result.backend == "default"
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.enqueued_at == job.enqueued_at
    assert result.started_at is None and result.finished_at is None
    assert result.errors == [] and result.worker_ids == []
    assert (job.state, job.queue, job.priority, job.task_path) == ("waiting", "emails", 7, "tests.tasks.add")
    assert job.attempts == 0


@db
def test_run_after_in_the_future_stores_a_delayed_job():
    when = timezone.now() + timedelta(hours=1)
    result = tasks.noop.using(run_after=when).enqueue()
    job = only_job()
    assert job.state == JobState.DELAYED
    assert job.available_at == when
    assert result.status == TaskResultStatus.READY


@db
def test_run_after_in_the_past_stores_a_waiting_job():
    tasks.noop.using(run_after=timezone.now() - timedelta(minutes=1)).enqueue()
    assert only_job().state == JobState.WAITING


@committing
def test_rolled_back_enqueue_leaves_no_job_and_sends_no_signal(enqueued_signals):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        assert Job.objects.count() == 1  # visible inside the transaction
        raise RuntimeError("roll back")
    assert Job.objects.count() == 0
    assert enqueued_signals == []


@committing
def test_enqueue_signal_waits_for_commit_and_is_sent_once(enqueued_signals):
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert enqueued_signals == []
    assert len(enqueued_signals) == 1
    assert enqueued_signals[0]["sender"] is JobsBackend
    assert enqueued_signals[0]["task_result"].id == result.id
    assert Job.objects.filter(id=result.id).exists()


@committing
def test_enqueue_in_a_rolled_back_savepoint_is_dropped_but_outer_enqueue_commits(enqueued_signals):
    with transaction.atomic():
        kept = tasks.add.enqueue(1, 1)
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue(2, 2)
            raise RuntimeError("roll back the savepoint")
    assert list(Job.objects.values_list("id", flat=True)) == [uuid.UUID(kept.id)]
    assert [s["task_result"].id for s in enqueued_signals] == [kept.id]


@committing
def test_enqueue_outside_a_transaction_commits_and_signals_at_once(enqueued_signals):
    result = tasks.add.enqueue(1, 2)
    assert Job.objects.filter(id=result.id).exists()
    assert len(enqueued_signals) == 1 and enqueued_signals[0]["sender"] is JobsBackend


@committing
def test_aenqueue_inserts_the_job_and_signals(enqueued_signals):
    result = async_to_sync(tasks.async_add.aenqueue)(1, 2)
    job = only_job()
    assert str(job.id) == result.id
    assert job.task_path == "tests.tasks.async_add"
    assert len(enqueued_signals) == 1


# -- JSON validation and payload cap ---------------------------------------------------------

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@db
@pytest.mark.parametrize(
    ("args", "kwargs", "where"),
    [
        ((NOW,), {}, "args[0]"),
        ((), {"when": NOW}, "kwargs['when']"),
        ((date(2025, 1, 2),), {}, "args[0]"),
        ((1, Decimal("1.50")), {}, "args[1]"),
        (({1, 2},), {}, "args[0]"),
        ((frozenset({1}),), {}, "args[0]"),
        ((b"\xff",), {}, "args[0]"),  # bytes that are not UTF-8 (Django decodes UTF-8 bytes to str)
        ((uuid.uuid4(),), {}, "args[0]"),
        ((User(username="someone"),), {}, "args[0]"),
        ((object(),), {}, "args[0]"),
        ((math.nan,), {}, "args[0]"),
        ((), {"ratio": math.inf}, "kwargs['ratio']"),
        ((-math.inf,), {}, "args[0]"),
        (({1: "one"},), {}, "args[0]"),
        ((), {"a": [1, {"b": set()}]}, "kwargs['a'][1]['b']"),
        (([[1, 2], [3, (4, Decimal(5))]],), {}, "args[0][1][1][1]"),
        ((), {"d": {"ok": 1, "bad": {(1, 2): "tuple key"}}}, "kwargs['d']['bad']"),
    ],
)
def test_non_json_arguments_are_rejected_naming_the_argument(enqueued_signals, args, kwargs, where):
    with pytest.raises(InvalidTaskArguments) as info:
        tasks.echo.enqueue(*args, **kwargs)
    assert isinstance(info.value, InvalidTask)
    assert where in str(info.value)
    assert Job.objects.count() == 0
    assert enqueued_signals == []


@db
def test_model_instance_argument_error_suggests_passing_the_primary_key():
    from django.contrib.contenttypes.models import ContentType

    content_type = ContentType.objects.get_for_model(Job)
    with pytest.raises(InvalidTaskArguments, match=r"args\[0\] is a ContentType.*primary key"):
        tasks.echo.enqueue(content_type)


@db
def test_tuples_are_accepted_and_stored_as_lists():
    result = tasks.echo.enqueue((1, 2), nested=(3, [4, (5,)]), text="é")
    job = only_job()
    assert job.args == [[1, 2]]
    assert job.kwargs == {"nested": [3, [4, [5]]], "text": "é"}
    assert result.args == job.args and result.kwargs == job.kwargs


@db
def test_plain_json_values_round_trip_unchanged():
    value = {"s": "x", "i": -3, "f": 1.25, "b": True, "n": None, "l": [1, "2", [3.5]], "d": {"k": {}}}
    result = tasks.echo.enqueue(value, 10**15, key=value)
    job = only_job()
    assert job.args == [value, 10**15]
    assert job.kwargs == {"key": value}
    assert task_backends["default"].get_result(result.id).args == [value, 10**15]


class _Label(str):
    def __str__(self) -> str:  # json writes the text, not this
        return "other"


class _Colour(enum.StrEnum):
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 3


class _Ratio(float):
    pass


def _exactly(value):
    """``value`` with each leaf's type, to compare types as well as values."""
    if isinstance(value, list):
        return [_exactly(v) for v in value]
    if isinstance(value, dict):
        return {(type(k), k): _exactly(v) for k, v in value.items()}
    return (type(value), value)


@db
def test_subclasses_of_str_int_and_float_arrive_as_the_plain_values_json_stores():
    args = [_Label("tag"), _Colour.RED, _Level.HIGH, _Ratio(0.5), {_Label("key"): [_Level.HIGH, (_Colour.RED,)]}]
    kwargs = {_Colour.RED: _Ratio(1.5), "label": _Label("x")}
    stored = json.loads(json.dumps(args)), json.loads(json.dumps(kwargs))
    result = tasks.echo.enqueue(*args, **kwargs)
    [many] = tasks.echo.enqueue_many([django_jobs.call(*args, **kwargs)])
    for got in (result, many, task_backends["default"].get_result(result.id)):
        assert _exactly(got.args) == _exactly(stored[0])
        assert _exactly(got.kwargs) == _exactly(stored[1])


def payload_size(args, kwargs) -> int:
    import json

    return len(json.dumps(args).encode()) + len(json.dumps(kwargs).encode())


@db
def test_payload_exactly_at_the_cap_is_accepted():
    args = ["x" * 1018]
    assert payload_size(args, {}) == 1024
    tasks.limited_echo.enqueue(*args)
    assert Job.objects.count() == 1


@db
def test_payload_over_the_cap_is_rejected(enqueued_signals):
    args = ["x" * 1019]
    assert payload_size(args, {}) == 1025
    with pytest.raises(PayloadTooLarge, match="MAX_PAYLOAD_BYTES=1024") as info:
        tasks.limited_echo.enqueue(*args)
    assert isinstance(info.value, InvalidTaskArguments)
    assert isinstance(info.value, InvalidTask)
    assert Job.objects.count() == 0
    assert enqueued_signals == []


@db
def test_kwargs_count_toward_the_payload_cap():
    tasks.limited_echo.enqueue(text="x" * 1000)
    with pytest.raises(PayloadTooLarge):
        tasks.limited_echo.enqueue("y" * 500, text="x" * 600)
    assert Job.objects.count() == 1


@db
def test_default_payload_cap_is_one_mebibyte():
    tasks.echo.enqueue("x" * (1024 * 1024 - 6))
    with pytest.raises(PayloadTooLarge):
        tasks.echo.enqueue("x" * (1024 * 1024 - 5))
    assert Job.objects.count() == 1


@db
def test_payload_cap_counts_utf8_bytes():
    args = ["é" * 500]  # 1000 UTF-8 bytes of text, 1006 bytes of JSON with the []/{}
    tasks.limited_echo.enqueue(*args)
    assert Job.objects.count() == 1


# -- queue names -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "q" * 101, "has space", "-leading-dash", ".dot", "a/b", "é", "tab\t", 5])
def test_invalid_queue_name_is_rejected(name):
    with pytest.raises(InvalidQueueName) as info:
        tasks.noop.using(queue_name=name)
    assert isinstance(info.value, InvalidTask)


def test_invalid_queue_name_in_decorator_is_rejected():
    with pytest.raises(InvalidQueueName):
        task(queue_name="no spaces please")(plain_function)


@db
@pytest.mark.parametrize("name", ["q" * 100, "a.b:c-d_e", "0queue", "Q"])
def test_valid_queue_names_are_accepted_by_a_backend_without_queue_list(name):
    tasks.noop.using(queue_name=name).enqueue()
    assert only_job().queue == name


def test_queue_missing_from_backend_queues_is_rejected():
    with pytest.raises(InvalidTask, match="reports") as info:
        tasks.limited_echo.using(queue_name="reports")
    assert not isinstance(info.value, InvalidQueueName)


@db
def test_queue_listed_in_backend_queues_is_accepted():
    tasks.limited_echo.using(queue_name="emails").enqueue()
    assert only_job().queue == "emails"


# -- results ---------------------------------------------------------------------------------


@db
@pytest.mark.parametrize("result_id", [str(uuid.uuid4()), uuid.uuid4(), "nope", "", 123, None])
def test_get_result_of_unknown_or_malformed_id_does_not_exist(result_id):
    tasks.noop.enqueue()
    backend = task_backends["default"]
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(backend.aget_result)(result_id)


@db
def test_get_result_of_another_backends_job_does_not_exist():
    result = tasks.limited_echo.enqueue()
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result.id)
    assert task_backends["limited"].get_result(result.id).id == result.id


@db
def test_task_get_result_of_another_tasks_job_is_a_mismatch():
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.noop.get_result(result.id)
    assert tasks.add.get_result(result.id).id == result.id


@db
def test_get_result_carries_the_jobs_queue_priority_and_arguments():
    result = tasks.add.using(queue_name="emails", priority=-7).enqueue(1, b=2)
    fetched = task_backends["default"].get_result(result.id)
    assert fetched.task.func is tasks.add.func
    assert (fetched.task.queue_name, fetched.task.priority) == ("emails", -7)
    assert (fetched.args, fetched.kwargs) == ([1], {"b": 2})


@db
def test_result_of_a_job_enqueued_on_another_backend_refreshes():
    enqueued = tasks.noop.using(backend="limited").enqueue()
    fetched = task_backends["limited"].get_result(enqueued.id)
    assert fetched.task.backend == "limited"
    fetched.refresh()
    assert fetched.status == TaskResultStatus.READY


@db
def test_get_result_of_a_job_moved_to_a_backend_with_other_queues():
    enqueued = tasks.limited_echo.using(backend="default", queue_name="reports").enqueue()
    fetched = task_backends["default"].get_result(enqueued.id)
    assert fetched.task.queue_name == "reports"


@db
@pytest.mark.parametrize(
    ("state", "status"),
    [
        (JobState.WAITING, TaskResultStatus.READY),
        (JobState.DELAYED, TaskResultStatus.READY),
        (JobState.WAITING_CHILDREN, TaskResultStatus.READY),
        (JobState.ACTIVE, TaskResultStatus.RUNNING),
        (JobState.COMPLETED, TaskResultStatus.SUCCESSFUL),
        (JobState.FAILED, TaskResultStatus.FAILED),
        (JobState.CANCELLED, TaskResultStatus.FAILED),
    ],
)
def test_get_result_projects_every_state_onto_a_status(state, status):
    result = tasks.noop.enqueue()
    Job.objects.filter(id=result.id).update(state=state)
    assert task_backends["default"].get_result(result.id).status == status
    assert async_to_sync(task_backends["default"].aget_result)(result.id).status == status


def claim_one(worker_id: str, now: datetime) -> engine.ClaimedJob:
    claimed = claim(limit=10, worker_id=worker_id, now=now)
    assert len(claimed) == 1
    return claimed[0]


def error(n: int) -> dict:
    return {
        "exception_class_path": "builtins.RuntimeError",
        "traceback": f"Traceback (most recent call last):\nRuntimeError: attempt {n} fails\n",
    }


@db
def test_result_follows_a_job_through_a_retry_to_success():
    t0 = timezone.now().replace(microsecond=250_000)
    result = tasks.fail_until.enqueue("/dev/null", 2)
    backend = task_backends["default"]

    first = claim_one("worker-a", t0)
    running = backend.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.started_at == t0 and running.last_attempted_at == t0
    assert running.worker_ids == ["worker-a"]
    assert running.finished_at is None

    written = engine.record_outcomes(
        [engine.Outcome(job_id=first.id, lease_token=first.lease_token, state=JobState.WAITING, error=error(1))],
        using="default",
        now=t0 + timedelta(seconds=1),
    )
    assert set(written) == {first.id}
    retrying = backend.get_result(result.id)
    assert retrying.status == TaskResultStatus.READY
    assert len(retrying.errors) == 1
    assert retrying.errors[0].exception_class_path == "builtins.RuntimeError"
    assert "attempt 1 fails" in retrying.errors[0].traceback
    assert retrying.errors[0].exception_class is RuntimeError
    assert retrying.finished_at is None

    t2 = t0 + timedelta(seconds=2)
    second = claim_one("worker-b", t2)
    t3 = t0 + timedelta(seconds=3)
    engine.record_outcomes(
        [
            engine.Outcome(
                job_id=second.id, lease_token=second.lease_token, state=JobState.COMPLETED, return_value_json='{"n": 2}'
            )
        ],
        using="default",
        now=t3,
    )
    done = backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"n": 2}
    assert done.enqueued_at == result.enqueued_at
    assert done.started_at == t0, "started_at is the first attempt"
    assert done.last_attempted_at == t2
    assert done.finished_at == t3
    assert done.worker_ids == ["worker-a", "worker-b"]
    assert done.attempts == 2
    assert [e.traceback for e in done.errors] == [error(1)["traceback"]]

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"n": 2}
    assert result.worker_ids == ["worker-a", "worker-b"]


@db
def test_result_of_a_job_that_failed_every_attempt_has_one_error_per_attempt():
    t0 = timezone.now()
    result = tasks.always_fails.enqueue("boom")
    first = claim_one("w1", t0)
    engine.record_outcomes(
        [engine.Outcome(job_id=first.id, lease_token=first.lease_token, state=JobState.WAITING, error=error(1))],
        using="default",
        now=t0,
    )
    second = claim_one("w2", t0 + timedelta(seconds=1))
    finished = t0 + timedelta(seconds=2)
    engine.record_outcomes(
        [engine.Outcome(job_id=second.id, lease_token=second.lease_token, state=JobState.FAILED, error=error(2))],
        using="default",
        now=finished,
    )
    failed = async_to_sync(tasks.always_fails.aget_result)(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.finished_at == finished
    assert [e.traceback for e in failed.errors] == [error(1)["traceback"], error(2)["traceback"]]
    assert failed.worker_ids == ["w1", "w2"]
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value


@db
def test_return_value_none_is_distinguished_from_not_finished():
    t0 = timezone.now()
    result = tasks.noop.enqueue()
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    claimed = claim_one("w1", t0)
    engine.record_outcomes(
        [
            engine.Outcome(
                job_id=claimed.id, lease_token=claimed.lease_token, state=JobState.COMPLETED, return_value_json="null"
            )
        ],
        using="default",
        now=t0,
    )
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "kwargs", "where"),
    [(["a\x00b"], {}, "args[0]"), ([], {"k": {"x\x00": 1}}, "a key of kwargs['k']")],
)
def test_nul_characters_are_rejected_naming_the_argument(args, kwargs, where):
    from django_jobs.exceptions import InvalidTaskArguments

    with pytest.raises(InvalidTaskArguments, match=re.escape(where)):
        tasks.echo.enqueue(*args, **kwargs)
    assert not Job.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_enqueue_after_a_rolled_back_savepoint_still_notifies():
    """A NOTIFY sent inside a savepoint that rolls back is discarded by PostgreSQL, so the next
    enqueue of that queue in the transaction must notify again."""
    import threading

    from django.db import connections

    listener = connections.create_connection("default")
    listener.ensure_connection()
    listener.connection.autocommit = True
    listener.connection.execute("LISTEN django_jobs")
    received: list[str] = []

    def listen():
        for note in listener.connection.notifies(timeout=3.0, stop_after=2):
            received.append(note.payload)

    try:
        with transaction.atomic():
            tasks.noop.using(queue_name="outer").enqueue()
            try:
                with transaction.atomic():
                    tasks.noop.using(queue_name="sp").enqueue()
                    raise RuntimeError("roll the savepoint back")
            except RuntimeError:
                pass
            tasks.noop.using(queue_name="sp").enqueue()
        thread = threading.Thread(target=listen)
        thread.start()
        thread.join(5)
    finally:
        listener.close()
    assert sorted(received) == ["outer", "sp"]
    assert Job.objects.filter(queue="sp").count() == 1


@pytest.mark.django_db
def test_run_after_accepts_a_timedelta_from_now():
    before = timezone.now()
    result = tasks.noop.using(run_after=timedelta(minutes=5)).enqueue()
    job = Job.objects.get(id=result.id)
    assert job.state == "delayed"
    assert before + timedelta(minutes=5) <= job.available_at <= timezone.now() + timedelta(minutes=5)


def test_negative_timedelta_run_after_is_rejected():
    from django_jobs.exceptions import InvalidTaskOptions

    with pytest.raises(InvalidTaskOptions, match="must not be negative"):
        tasks.noop.using(run_after=timedelta(seconds=-1))


# -- the plain enqueue (a task validated once, one prepared statement; PostgreSQL) --------------


def _row(job: Job) -> dict:
    """A job's columns, less those that differ between any two enqueues (id, times, order)."""
    skip = {"id", "enqueued_at", "available_at", "seq", "trace_id"}
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields if f.attname not in skip}


@db
@pytest.mark.parametrize(
    "make",
    [
        lambda: tasks.noop,
        lambda: tasks.noop.using(max_attempts=5, backoff=[1, 2], timeout=3.5, priority=7, queue_name="q2"),
        lambda: tasks.noop.using(lifo=True, trace_id="pipeline-1"),
    ],
    ids=["plain", "options", "lifo-and-trace"],
)
def test_the_plain_enqueue_writes_the_row_and_result_the_general_one_writes(make, monkeypatch):
    """enqueue() of a task without run_after, partition or keys skips NewJob and NewRow; the row,
    the event and the result are those of the path every other enqueue takes."""
    task = make()
    first = task.enqueue(1, b=[2])
    monkeypatch.setattr(JobsBackend, "_plain", lambda self, task: None)  # the general path
    second = task.enqueue(1, b=[2])
    jobs = {str(j.id): j for j in Job.objects.all()}
    assert _row(jobs[first.id]) == _row(jobs[second.id])
    assert jobs[first.id].seq < 0 if getattr(task, "lifo", False) else jobs[first.id].seq > 0
    for result in (first, second):
        job = jobs[result.id]
        assert (result.status, result.args, result.kwargs, result.enqueued_at) == (
            TaskResultStatus.READY,
            [1],
            {"b": [2]},
            job.enqueued_at,
        )
        assert result.trace_id == job.trace_id
        assert result.task is task and not result.duplicate
    if getattr(task, "trace_id", None):
        assert first.trace_id == second.trace_id == task.trace_id
    else:
        assert first.trace_id != second.trace_id
    events = Event.objects.filter(kind="enqueued")
    assert sorted(str(e.job_id) for e in events) == sorted([first.id, second.id])


@db
def test_a_plain_task_follows_the_settings_it_is_enqueued_under():
    """The plain enqueue's per-task cache is made again when the settings change."""
    tasks.noop.enqueue()
    with override_settings(DJANGO_JOBS={"MAX_ATTEMPTS": 4, "EVENTS": False}):
        tasks.noop.enqueue()
    tasks.noop.enqueue()
    attempts = list(Job.objects.order_by("seq").values_list("max_attempts", flat=True))
    assert attempts == [1, 4, 1]
    assert Event.objects.filter(kind="enqueued").count() == 2  # none for the job enqueued with EVENTS off


@db
def test_the_enqueue_insert_is_seen_by_django_query_log_and_execute_wrappers():
    """The plain insert runs on a cursor kept between calls (PostgreSQL), still wrapped by Django:
    CaptureQueriesContext and connection.execute_wrapper see every enqueue's statement."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    for _ in range(2):
        with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(wrapper):
            tasks.noop.enqueue()
        assert [q for q in captured.captured_queries if "INSERT INTO django_jobs_job" in q["sql"]]
    assert len([s for s in seen if "INSERT INTO django_jobs_job" in s]) == 2
    assert Job.objects.count() == 2

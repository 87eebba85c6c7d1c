"""Django's Tasks contract for what enqueue takes and gives back, and the errors bad input gets.

Runs on SQLite and PostgreSQL. Arguments Django rejects raise a TypeError (Django's own tests
expect one); values Django's ``normalize_json`` accepts are stored as it normalises them; a
result read back equals the one enqueue returned; a job's times come from one clock; and each
bad priority, ``run_after`` or argument raises a documented django-jobs exception that is also
the matching builtin, before anything is inserted.
"""

from __future__ import annotations

import collections
import dataclasses
import types
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask
from django.test import override_settings
from django.utils import timezone
from django.utils.json import normalize_json

from django_jobs import Dedup, call, engine, flow
from django_jobs.backend import MAX_JSON_DEPTH
from django_jobs.exceptions import (
    ArgumentOutOfRange,
    ArgumentTooDeep,
    InvalidArgumentValue,
    InvalidOptionType,
    InvalidTaskArguments,
    InvalidTaskOptions,
    JobsError,
    NonJSONReturnValue,
    PayloadTooLarge,
    RunAfterOutOfRange,
)
from django_jobs.models import Job
from django_jobs.schedules import InvalidSchedule, schedule
from django_jobs.testing import drain_queue, perform_job
from tests import tasks
from tests.factories import new_job

db = pytest.mark.django_db


def backend():
    return task_backends["default"]


def nested(depth: int) -> list:
    """A list nested ``depth`` levels deep (``depth`` 1: ``[]``)."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


# -- Django's contract: TypeError for what it rejects ---------------------------------------------


@db
def test_arguments_django_rejects_raise_a_type_error():
    for bad in (datetime.now(), object(), {1, 2}):
        with pytest.raises(TypeError) as info:
            tasks.echo.enqueue(bad)
        assert isinstance(info.value, InvalidTaskArguments) and isinstance(info.value, InvalidTask)
        assert "args[0]" in str(info.value)
    assert Job.objects.count() == 0


@db
def test_non_json_return_value_is_recorded_as_a_type_error():
    result = perform_job(tasks.returns_non_json)
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is NonJSONReturnValue
    assert issubclass(error.exception_class, TypeError)


# -- Django's normalisation of arguments ------------------------------------------------------------


@db
def test_bytes_arguments_are_decoded_as_django_does():
    result = tasks.echo.enqueue(b"caf\xc3\xa9", [b"x"], data={"raw": b"y"}, **{"k": b""})
    expected_args = normalize_json([b"caf\xc3\xa9", [b"x"]])
    expected_kwargs = normalize_json({"data": {"raw": b"y"}, "k": b""})
    assert expected_args == ["café", ["x"]] and expected_kwargs == {"data": {"raw": "y"}, "k": ""}
    assert (result.args, result.kwargs) == (expected_args, expected_kwargs)
    job = Job.objects.get()
    assert (job.args, job.kwargs) == (expected_args, expected_kwargs)
    assert perform_job(tasks.echo, b"ok").return_value == {"args": ["ok"], "kwargs": {}}


@db
def test_bytes_that_are_not_utf8_are_rejected_as_a_value_error():
    with pytest.raises(InvalidArgumentValue, match=r"args\[1\] is bytes that are not UTF-8") as info:
        tasks.echo.enqueue("ok", b"\xff\xfe")
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    assert Job.objects.count() == 0


@db
def test_sequences_and_mappings_are_normalised_as_django_does():
    args = ((1, (2, 3)), range(3), collections.UserList([4]), types.MappingProxyType({"a": (5,)}))
    kwargs = {"m": collections.OrderedDict(b=[6]), "k": {b"key": 1}}
    result = tasks.echo.enqueue(*args, **kwargs)
    assert result.args == normalize_json(list(args)) == [[1, [2, 3]], [0, 1, 2], [4], {"a": [5]}]
    assert result.kwargs == normalize_json(kwargs) == {"m": {"b": [6]}, "k": {"key": 1}}
    assert backend().get_result(result.id).args == result.args


@db
def test_keys_that_json_would_turn_into_strings_are_still_rejected():
    # normalize_json keeps {1: "a"}, but JSON (and so the job) would get {"1": "a"}.
    with pytest.raises(InvalidTaskArguments, match="JSON object keys must be strings"):
        tasks.echo.enqueue({1: "a"})


@db
def test_enqueue_many_normalises_like_enqueue():
    results = tasks.echo.enqueue_many([(b"a",), {"k": (b"b",)}, call(range(2))])
    assert [(r.args, r.kwargs) for r in results] == [(["a"], {}), ([], {"k": ["b"]}), ([[0, 1]], {})]
    assert [(j.args, j.kwargs) for j in Job.objects.order_by("id")] == [(r.args, r.kwargs) for r in results]


@db
def test_aenqueue_normalises_like_enqueue():
    result = async_to_sync(tasks.echo.aenqueue)(b"c", t=(1,))
    assert (result.args, result.kwargs) == (["c"], {"t": [1]})
    assert backend().get_result(result.id).args == ["c"]


# -- a result read back equals the enqueued one -----------------------------------------------------


@db
def test_get_result_of_a_deferred_job_equals_the_enqueued_result():
    run_after = timezone.now().replace(microsecond=654_321) + timedelta(hours=2)
    result = tasks.echo.using(run_after=run_after).enqueue(1, k="v")
    fetched = backend().get_result(result.id)
    assert fetched.task.run_after == run_after
    assert fetched == result


@db
def test_get_result_keeps_priority_queue_and_backend_and_run_after_of_a_timedelta():
    task = tasks.echo.using(priority=7, queue_name="reports", run_after=timedelta(minutes=5))
    result = task.enqueue()
    fetched = backend().get_result(result.id)
    assert (fetched.task.priority, fetched.task.queue_name, fetched.task.backend) == (7, "reports", "default")
    assert fetched.task.run_after == task.run_after
    assert fetched == result


def assert_read_back(result):
    """get_result(id) gives back what enqueue returned. Its task has the fields a job stores
    (priority, queue, backend, run_after); options such as dedup are the enqueuing call's only."""
    fetched = backend().get_result(result.id)
    stored = ("func", "priority", "queue_name", "backend", "run_after", "takes_context")
    assert [getattr(fetched.task, f) for f in stored] == [getattr(result.task, f) for f in stored]
    assert dataclasses.replace(fetched, task=result.task) == result


@db
def test_results_of_every_enqueue_path_equal_get_result():
    run_after = timezone.now() + timedelta(days=1)
    many = tasks.echo.using(run_after=run_after, priority=-5).enqueue_many([(1,), (2,)])
    deduplicated = tasks.echo.using(dedup=Dedup("contract-key"), run_after=run_after).enqueue(3)
    idempotent = tasks.echo.using(idempotency_key="contract-idem", run_after=run_after).enqueue(4)
    root = flow(tasks.echo.using(run_after=run_after), args=(5,), children=[flow(tasks.echo, args=(6,))]).enqueue()
    for result in [*many, root]:
        assert backend().get_result(result.id) == result, result
    for result in [deduplicated, idempotent]:
        assert_read_back(result)


# -- one clock per job --------------------------------------------------------------------------------


def assert_in_order(result):
    assert result.enqueued_at <= result.started_at <= result.finished_at, (
        result.enqueued_at,
        result.started_at,
        result.finished_at,
    )


@db
def test_enqueued_at_is_not_after_started_at_when_enqueued_and_run_in_one_transaction():
    with transaction.atomic():
        result = perform_job(tasks.add, 1, 2)
        assert_in_order(result)
        assert_in_order(backend().get_result(result.id))
    assert_in_order(backend().get_result(result.id))


@db
def test_drain_queue_in_a_transaction_keeps_every_path_in_order():
    with transaction.atomic():
        single = tasks.add.enqueue(1, 2)
        many = tasks.add.enqueue_many([(3, 4), (5, 6)])
        deduplicated = tasks.add.using(dedup=Dedup("clock-key")).enqueue(7, 8)
        idempotent = tasks.add.using(idempotency_key="clock-idem").enqueue(9, 10)
        root = flow(tasks.echo, children=[flow(tasks.add, args=(1, 1))]).enqueue()
        assert drain_queue().completed == 7
    for result in [single, *many, deduplicated, idempotent, root]:
        fetched = backend().get_result(result.id)
        assert fetched.status == TaskResultStatus.SUCCESSFUL
        assert fetched.enqueued_at == result.enqueued_at
        assert_in_order(fetched)


@db
def test_enqueue_returns_the_stored_enqueued_at():
    single = tasks.echo.enqueue()
    many = tasks.echo.enqueue_many([(1,), (2,)])
    for result in [single, *many]:
        assert Job.objects.get(id=result.id).enqueued_at == result.enqueued_at


@db
def test_engine_inserts_keep_the_time_given_as_now():
    now = datetime(2024, 5, 6, 7, 8, 9, 123_456, tzinfo=UTC)
    new = new_job()
    job = engine.insert_job(new, using="default", now=now)
    once, _ = engine.insert_job_once(new, using="default", idempotency_key="now-key", now=now)
    deduplicated = engine.enqueue_deduplicated(new, using="default", key="now-dedup", now=now).job
    inserted = engine.insert_jobs(new, using="default", rows=[("[]", "{}")], now=now)
    for one in (job, once, deduplicated):
        assert one.enqueued_at == now
    assert inserted.enqueued_at == now
    assert set(Job.objects.values_list("enqueued_at", flat=True)) == {now}


# -- bad options: a specific error at .using() / enqueue time ----------------------------------------


@db
@pytest.mark.parametrize("priority", ["10", 1.5j, True, [1]])
def test_a_priority_of_the_wrong_type_raises_invalid_option_type(priority):
    with pytest.raises(InvalidOptionType, match="priority must be an int from -100 to 100") as info:
        tasks.echo.using(priority=priority)
    assert isinstance(info.value, TypeError) and isinstance(info.value, JobsError)
    assert isinstance(info.value, InvalidTaskOptions) and isinstance(info.value, InvalidTask)


@db
def test_a_priority_of_the_wrong_type_is_refused_through_every_entry_point():
    with pytest.raises(InvalidOptionType):
        tasks.echo.using(priority="10").enqueue()
    with pytest.raises(InvalidOptionType):
        tasks.echo.using(priority="10").enqueue_many([(1,)])
    with pytest.raises(InvalidOptionType):
        flow(tasks.echo.using(priority="10"))
    with pytest.raises(InvalidOptionType):
        async_to_sync(tasks.echo.using(priority="10").aenqueue)()
    with pytest.raises(InvalidSchedule, match="priority"):
        schedule("bad-priority", tasks.echo, every=60, priority="10")
    assert Job.objects.count() == 0


@db
@pytest.mark.parametrize("run_after", ["2030-01-01", 1_700_000_000, datetime(2030, 1, 1).date()])
def test_a_run_after_of_the_wrong_type_raises_invalid_option_type(run_after):
    with pytest.raises(InvalidOptionType, match="run_after must be an aware datetime or a timedelta") as info:
        tasks.echo.using(run_after=run_after)
    assert isinstance(info.value, TypeError) and isinstance(info.value, InvalidTaskOptions)


@db
def test_a_naive_run_after_is_refused_as_django_does():
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        tasks.echo.using(run_after=datetime(2030, 1, 1))


@db
@pytest.mark.parametrize(
    "run_after",
    [
        timedelta(days=3_000_000),
        timedelta.max,
        timedelta(days=3653 + 2),
        datetime.max.replace(tzinfo=UTC),
        datetime(9999, 1, 1, tzinfo=UTC),
    ],
)
def test_a_run_after_past_max_run_after_raises_run_after_out_of_range(run_after):
    with pytest.raises(RunAfterOutOfRange, match="MAX_RUN_AFTER") as info:
        tasks.echo.using(run_after=run_after)
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidTaskOptions)
    assert Job.objects.count() == 0


@db
def test_max_run_after_is_a_setting_and_none_lifts_it():
    with override_settings(DJANGO_JOBS={"MAX_RUN_AFTER": 60}):
        tasks.echo.using(run_after=timedelta(seconds=59)).enqueue()
        with pytest.raises(RunAfterOutOfRange, match="MAX_RUN_AFTER"):
            tasks.echo.using(run_after=timedelta(seconds=61))
        later = tasks.echo.using(run_after=timezone.now() + timedelta(seconds=50))
    with override_settings(DJANGO_JOBS={"MAX_RUN_AFTER": timedelta(seconds=10)}):
        with pytest.raises(RunAfterOutOfRange):
            later.enqueue()  # checked again when enqueued, against the setting then
    with override_settings(DJANGO_JOBS={"MAX_RUN_AFTER": None}):
        far = tasks.echo.using(run_after=datetime(9000, 1, 1, tzinfo=UTC)).enqueue()
        assert backend().get_result(far.id).task.run_after == datetime(9000, 1, 1, tzinfo=UTC)
        with pytest.raises(RunAfterOutOfRange, match="year 9999"):
            tasks.echo.using(run_after=timedelta(days=3_000_000))


@db
def test_get_result_of_a_job_deferred_past_a_lowered_max_run_after_still_works():
    result = tasks.echo.using(run_after=timedelta(days=30)).enqueue()
    with override_settings(DJANGO_JOBS={"MAX_RUN_AFTER": 60}):
        assert backend().get_result(result.id) == result


def test_max_run_after_setting_is_validated():
    from django_jobs.conf import JobsSettings

    for bad in (0, -1, "10y", timedelta(0), True):
        assert any("MAX_RUN_AFTER" in p for p in JobsSettings(MAX_RUN_AFTER=bad).validate()), bad
    for good in (60, 1.5, timedelta(days=1), None):
        assert not JobsSettings(MAX_RUN_AFTER=good).validate(), good


# -- bad arguments ----------------------------------------------------------------------------------


@db
def test_arguments_nested_deeper_than_the_limit_raise_argument_too_deep():
    tasks.echo.enqueue(nested(MAX_JSON_DEPTH))
    for depth in (MAX_JSON_DEPTH + 1, 10_000):
        with pytest.raises(ArgumentTooDeep, match=f"deeper than {MAX_JSON_DEPTH} levels") as info:
            tasks.echo.enqueue(nested(depth))
        assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidTaskArguments)
    deep_dict: dict = {}
    for _ in range(10_000):
        deep_dict = {"a": deep_dict}
    with pytest.raises(ArgumentTooDeep):
        tasks.echo.enqueue(k=deep_dict)
    assert Job.objects.count() == 1


@db
def test_deep_arguments_are_refused_through_every_entry_point():
    deep = nested(10_000)
    with pytest.raises(ArgumentTooDeep, match="enqueue_many item 1"):
        tasks.echo.enqueue_many([(1,), (deep,)])
    with pytest.raises(ArgumentTooDeep, match="the root"):
        flow(tasks.echo, args=(deep,)).enqueue()
    with pytest.raises(ArgumentTooDeep):
        perform_job(tasks.echo, deep)
    with pytest.raises(InvalidSchedule, match="deeper than"):
        schedule("too-deep", tasks.echo, every=60, args=[deep])
    assert Job.objects.count() == 0


@db
def test_an_integer_json_cannot_read_back_raises_argument_out_of_range():
    tasks.echo.enqueue(10**4000, -(10**4000))
    for huge in (10**5000, -(10**5000)):
        with pytest.raises(ArgumentOutOfRange, match=r"args\[0\] is an integer of 5001 digits") as info:
            tasks.echo.enqueue(huge)
        assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidTaskArguments)
    with pytest.raises(ArgumentOutOfRange, match=r"kwargs\['n'\]\[0\]"):
        tasks.echo.enqueue_many([{"n": [10**5000]}])
    job = Job.objects.get()
    assert job.args == [10**4000, -(10**4000)]


@db
def test_values_json_or_the_database_cannot_store_are_value_errors():
    for bad in (float("nan"), float("inf"), "a\x00b"):
        with pytest.raises(InvalidArgumentValue) as info:
            tasks.echo.enqueue(bad)
        assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    with pytest.raises(PayloadTooLarge) as info:
        tasks.limited_echo.enqueue("x" * 2000)
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidTaskArguments)
    assert Job.objects.count() == 0

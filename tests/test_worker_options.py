"""Every runworker option refuses what it cannot use: NaN, infinity, negative numbers, zero where
it means nothing, and worker ids that are empty, blank, too long or hold control characters.
The command says so as a CommandError naming the option; ``Worker(...)`` raises
InvalidWorkerOption for the same values when called from Python."""

from __future__ import annotations

import math

import pytest
from django.core.management import CommandError
from django.test import override_settings

from django_jobs.signals import worker_started
from django_jobs.worker import InvalidWorkerOption, Worker


@pytest.fixture
def runworker(in_process_command):
    """runworker in this process, with --stop-when-empty: should a bad value get through, the
    worker ends instead of running on."""
    return lambda *args: in_process_command(*args, "--stop-when-empty")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # --sleep: an idle worker spun at 100 % CPU on NaN and crashed with OverflowError on inf.
        (["--sleep", "nan"], "--sleep must be a number of seconds; got 'nan'"),
        (["--sleep", "NaN"], "--sleep must be a number of seconds; got 'NaN'"),
        (["--sleep", "inf"], "--sleep must be at most 86400 seconds; got 'inf'"),
        (["--sleep", "1e400"], "--sleep must be at most 86400 seconds; got '1e400'"),
        (["--sleep", "86401"], "--sleep must be at most 86400 seconds; got '86401'"),
        (["--sleep=-inf"], "--sleep must be > 0 seconds; got '-inf'"),
        (["--sleep", "-0.5"], "--sleep must be > 0 seconds; got '-0.5'"),
        (["--sleep", "0"], "--sleep must be > 0 seconds; got '0'"),
        (["--max-time", "nan"], "--max-time must be a number of seconds; got 'nan'"),
        (["--max-time", "inf"], "--max-time must be a finite number of seconds (leave it out for no limit); got 'inf'"),
        (["--max-time", "0"], "--max-time must be > 0 seconds; got '0'"),
        (["--max-time", "-1"], "--max-time must be > 0 seconds; got '-1'"),
        (["--grace", "nan"], "--grace must be a number of seconds; got 'nan'"),
        (["--grace", "inf"], "--grace must be at most 86400 seconds; got 'inf'"),
        (["--grace=-inf"], "--grace must be >= 0 seconds; got '-inf'"),
        (["--grace", "-0.1"], "--grace must be >= 0 seconds; got '-0.1'"),
        (["-c", "nan"], "--concurrency must be a whole number >= 1; got 'nan'"),
        (["-c", "inf"], "--concurrency must be a whole number >= 1; got 'inf'"),
        (["-c", "2.5"], "--concurrency must be a whole number >= 1; got '2.5'"),
        (["-c", "-4"], "--concurrency must be a whole number >= 1; got '-4'"),
        (["-c", "1001"], "concurrency must be an integer 1..1000; got 1001"),
        (["-p", "nan"], "--processes must be a whole number >= 1; got 'nan'"),
        (["-p", "0"], "--processes must be a whole number >= 1; got '0'"),
        (["-p", "-1"], "--processes must be a whole number >= 1; got '-1'"),
        (["--max-jobs", "nan"], "--max-jobs must be a whole number >= 1; got 'nan'"),
        (["--max-jobs", "inf"], "--max-jobs must be a whole number >= 1; got 'inf'"),
        (["--max-jobs", "0"], "--max-jobs must be a whole number >= 1; got '0'"),
        # --worker-id "" was silently replaced by a generated id.
        (["--worker-id", ""], "worker_id must not be empty or blank; leave it out (None) for a generated id; got ''"),
        (["--worker-id", "   "], "worker_id must not be empty or blank"),
        (["--worker-id", "x" * 201], "worker_id must be at most 200 characters; got 201"),
        (["--worker-id", " w1"], "worker_id must not start or end with whitespace; got ' w1'"),
        (["--worker-id", "w1\n"], "worker_id must not start or end with whitespace"),
        (
            ["--worker-id", "w\n1"],
            r"worker_id must be printable characters only, no control characters (newline, tab...); got 'w\n1'",
        ),
        (["--worker-id", "w\t1"], "worker_id must be printable characters only"),
        (["--worker-id", "w\x1b[31m1"], "worker_id must be printable characters only"),
        (["--worker-id", "", "-p", "2"], "--worker-id names one process"),
    ],
)
def test_runworker_refuses_a_bad_value_naming_the_option_and_what_is_allowed(runworker, args, message):
    with pytest.raises(CommandError) as info:
        runworker(*args)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sleep": math.nan}, "sleep must be a number of seconds > 0 and <= 86400; got nan"),
        ({"sleep": math.inf}, "sleep must be a number of seconds > 0 and <= 86400; got inf"),
        ({"sleep": -math.inf}, "sleep must be a number of seconds > 0 and <= 86400; got -inf"),
        ({"sleep": 86400.5}, "sleep must be a number of seconds > 0 and <= 86400; got 86400.5"),
        ({"sleep": 0}, "sleep must be a number of seconds > 0"),
        ({"sleep": -1}, "sleep must be a number of seconds > 0"),
        ({"sleep": True}, "sleep must be a number of seconds > 0"),
        ({"sleep": "1"}, "sleep must be a number of seconds > 0"),
        ({"max_time": math.nan}, "max_time must be a number of seconds > 0 and finite; got nan"),
        ({"max_time": math.inf}, "max_time must be a number of seconds > 0 and finite; got inf"),
        ({"max_time": 10**400}, "max_time must be a number of seconds > 0 and finite"),
        ({"max_time": 0}, "max_time must be a number of seconds > 0 and finite; got 0"),
        ({"max_time": -5}, "max_time must be a number of seconds > 0"),
        ({"grace": math.nan}, "grace must be a number of seconds >= 0 and <= 86400; got nan"),
        ({"grace": math.inf}, "grace must be a number of seconds >= 0 and <= 86400; got inf"),
        ({"grace": 86401}, "grace must be a number of seconds >= 0 and <= 86400; got 86401"),
        ({"grace": -1}, "grace must be a number of seconds >= 0"),
        ({"grace": None}, "grace must be a number of seconds >= 0"),
        ({"concurrency": math.nan}, "concurrency must be an integer 1..1000; got nan"),
        ({"concurrency": 2.0}, "concurrency must be an integer 1..1000; got 2.0"),
        ({"concurrency": True}, "concurrency must be an integer 1..1000; got True"),
        ({"concurrency": 0}, "concurrency must be an integer 1..1000; got 0"),
        ({"max_jobs": math.inf}, "max_jobs must be an integer >= 1; got inf"),
        ({"max_jobs": 0}, "max_jobs must be an integer >= 1; got 0"),
        ({"worker_id": ""}, "worker_id must not be empty or blank; leave it out (None) for a generated id; got ''"),
        ({"worker_id": " \t "}, "worker_id must not be empty or blank"),
        ({"worker_id": "x" * 201}, "worker_id must be at most 200 characters; got 201"),
        ({"worker_id": "w1 "}, "worker_id must not start or end with whitespace; got 'w1 '"),
        ({"worker_id": "w\r1"}, "worker_id must be printable characters only"),
        ({"worker_id": "w\x001"}, "worker_id must be printable characters only"),
        ({"worker_id": "w\u20281"}, "worker_id must be printable characters only"),  # a line separator
        ({"worker_id": 7}, "worker_id must be a string, or None for a generated id; got 7"),
        ({"on_outcome": "count"}, "on_outcome must be a callable (queue, kind, runtime_ms) or None; got 'count'"),
    ],
)
def test_worker_refuses_the_same_values_with_invalid_worker_option(options, message):
    with pytest.raises(InvalidWorkerOption) as info:
        Worker(**options)
    assert message in str(info.value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_worker_refuses_a_poll_interval_setting_it_cannot_wait_for(value):
    with override_settings(DJANGO_JOBS={"POLL_INTERVAL": value}), pytest.raises(InvalidWorkerOption) as info:
        Worker()
    assert f"POLL_INTERVAL must be a number of seconds > 0 and <= 86400; got {value!r}" in str(info.value)
    with override_settings(DJANGO_JOBS={"POLL_INTERVAL": value}):
        assert Worker(sleep=1).sleep == 1, "--sleep overrides the setting"


def test_worker_takes_the_bounds_themselves():
    worker = Worker(
        sleep=86400, grace=0, max_time=10**9, concurrency=1000, max_jobs=10**12, worker_id="web 1 (blue) wörker"
    )
    assert (worker.sleep, worker.grace, worker.max_time, worker.worker_id) == (86400, 0.0, 10**9, "web 1 (blue) wörker")
    assert Worker(sleep=0.001, grace=86400.0).sleep == 0.001
    assert Worker(worker_id="x" * 200).worker_id == "x" * 200
    assert Worker().worker_id, "None asks for a generated id"


@pytest.mark.django_db(transaction=True)
def test_runworker_runs_with_values_at_the_bounds_and_the_worker_id_given(runworker):
    seen = []

    def on_started(sender, worker_id, **kwargs):
        seen.append(worker_id)

    worker_started.connect(on_started)
    try:
        out = runworker("--worker-id", "web 1 (blue)", "--sleep", "86400", "--grace", "0", "-v", "0")
    finally:
        worker_started.disconnect(on_started)
    assert seen == ["web 1 (blue)"]
    assert "0 jobs finished" in out

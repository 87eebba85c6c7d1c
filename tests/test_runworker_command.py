"""``manage.py runworker``: option parsing and validation (in process, through call_command) and
what a real run prints (a subprocess worker)."""

from __future__ import annotations

import os
import re

import pytest
from django.core.management import CommandError

from django_jobs.models import Job
from django_jobs.signals import worker_started
from django_jobs.worker import WorkerStats
from tests import tasks
from tests.conftest import read_log

ON_SQLITE = os.environ.get("JOBS_TEST_DB", "sqlite") == "sqlite"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "0"], "--concurrency must be a whole number >= 1; got '0'"),
        (["-c", "x"], "--concurrency must be a whole number >= 1; got 'x'"),
        (["-c", "1001"], "concurrency must be an integer 1..1000"),
        (["-p", "0"], "--processes must be a whole number >= 1"),
        (["--sleep", "0"], "--sleep must be > 0 seconds; got '0'"),
        (["--sleep", "soon"], "--sleep must be a number of seconds; got 'soon'"),
        (["--max-jobs", "-1"], "--max-jobs must be a whole number >= 1; got '-1'"),
        (["--max-time", "0"], "--max-time must be > 0 seconds"),
        (["--grace", "-1"], "--grace must be >= 0 seconds; got '-1'"),
        (["--backend", "nope"], "No task backend 'nope' in TASKS"),
        (["-q", "bad name"], "Invalid queue name 'bad name'"),
        (["-q", " , "], "--queue needs at least one queue name"),
        (["--worker-id", "w1", "-p", "2"], "--worker-id names one process"),
        (["--worker-id", "x" * 201], "worker_id must be at most 200 characters"),
    ],
)
def test_bad_option_values_are_a_command_error_saying_what_is_allowed(in_process_command, args, message):
    with pytest.raises(CommandError) as info:
        in_process_command(*args)
    assert message in str(info.value)


@pytest.mark.skipif(not ON_SQLITE, reason="E005 is about SQLite; on PostgreSQL -p 2 forks workers")
def test_processes_on_sqlite_is_refused_with_check_e005(in_process_command):
    with pytest.raises(CommandError, match=r"django_jobs\.E005") as info:
        in_process_command("-p", "2")
    assert "-p 1 -c 8" in str(info.value), "the hint says what to do instead"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "queues"),
    [
        (["-q", "a,b", "-q", "c"], ["a", "b", "c"]),
        (["-q", "b, a", "-q", "a"], ["a", "b"]),
        (["-q", "a", "-q", "*"], None),
        ([], None),
    ],
)
def test_queue_option_is_comma_separated_or_repeated(in_process_command, args, queues):
    seen = []

    def on_started(sender, worker_id, queues, concurrency, **kwargs):
        seen.append((queues, concurrency))

    worker_started.connect(on_started)
    try:
        out = in_process_command(*args, "-c", "3", "--stop-when-empty", "-v", "0")
    finally:
        worker_started.disconnect(on_started)
    assert seen == [(queues, 3)]
    assert "0 jobs finished" in out


#: The worker's line per job outcome (-v 1): "Job <id> <task> <state> on attempt N/M in X ms[: Class: message]".
OUTCOME_RE = re.compile(
    r"^Job ([0-9a-f-]{36}) (\S+) (completed|failed|cancelled) on attempt (\d+)/(\d+) in [^:\n]+(?:: (.*))?$", re.M
)
#: Its line per retry: "Job <id> <task> attempt N/M failed in X ms (Class: message); retrying now|in Xs".
RETRY_RE = re.compile(
    r"^Job ([0-9a-f-]{36}) (\S+) attempt (\d+)/(\d+) failed in [^(\n]+ \((.*)\); retrying (?:now|in [\d.]+s)$", re.M
)
#: The stop summary: "<jobs> finished in Xs: C completed, F failed; A attempts (R/s), T retried".
SUMMARY_RE = re.compile(
    r"^(\d+) jobs? finished in [\d.]+s: (\d+) completed, (\d+) failed; (\d+) attempts? \([\d.]+/s\), (\d+) retried$",
    re.M,
)


def lines_by_job(pattern: re.Pattern, log: str, ids: list) -> dict[str, list[tuple]]:
    found: dict[str, list[tuple]] = {str(job_id): [] for job_id in ids}
    for job_id, *fields in pattern.findall(log):
        found.setdefault(job_id, []).append(tuple(fields))
    return found


@pytest.mark.django_db(transaction=True)
def test_default_verbosity_logs_one_line_per_job_outcome_and_per_retry_without_tracebacks(worker_process, probe):
    ok = [tasks.mark.enqueue(probe, f"v{i}").id for i in range(2)]
    once = tasks.fail_until.enqueue(probe, 2).id  # fails once, then succeeds
    bad = tasks.always_fails.enqueue("order 42 has no customer").id  # fails both of its 2 attempts
    non_json = tasks.returns_non_json.enqueue().id
    ids = [*ok, once, bad, non_json]

    proc = worker_process("--stop-when-empty", "-v", "1")
    assert proc.wait(60) == 0, read_log(proc)

    log = read_log(proc)
    outcomes = lines_by_job(OUTCOME_RE, log, ids)
    for job_id in ok:
        assert outcomes[str(job_id)] == [("tests.tasks.mark", "completed", "1", "1", "")], log
    assert outcomes[str(once)] == [("tests.tasks.fail_until", "completed", "2", "3", "")], log
    assert outcomes[str(bad)] == [
        ("tests.tasks.always_fails", "failed", "2", "2", "ValueError: order 42 has no customer")
    ]
    [(path, state, attempt, of, error)] = outcomes[str(non_json)]
    assert (path, state, attempt, of) == ("tests.tasks.returns_non_json", "failed", "1", "1"), log
    assert error.startswith("NonJSONReturnValue: tests.tasks.returns_non_json returned a value that is not JSON"), log

    retries = lines_by_job(RETRY_RE, log, ids)
    assert retries[str(once)] == [("tests.tasks.fail_until", "1", "3", "RuntimeError: attempt 1 fails")], log
    assert retries[str(bad)] == [("tests.tasks.always_fails", "1", "2", "ValueError: order 42 has no customer")], log
    assert sum(map(len, retries.values())) == 2, log

    assert "Traceback" not in log, "tracebacks are for -v 3"
    assert "Task id=" not in log, "Django's django.tasks lines would repeat ours"
    assert "promoter" not in log and "{'" not in log, "service internals are for -v 3"
    assert SUMMARY_RE.findall(log) == [("5", "3", "2", "7", "2")], log
    assert log.count(" finished in ") == 1, f"the stop summary once:\n{log}"
    assert Job.objects.filter(state="completed").count() == 3
    assert Job.objects.filter(state="failed").count() == 2


@pytest.mark.django_db(transaction=True)
def test_debug_verbosity_adds_the_traceback_of_each_failed_attempt_once(worker_process):
    bad = tasks.always_fails.enqueue("order 42 has no customer").id

    proc = worker_process("--stop-when-empty", "-v", "3")
    assert proc.wait(60) == 0, read_log(proc)

    log = read_log(proc)
    assert log.count("Traceback (most recent call last)") == 2, f"one per attempt, Django's not repeating it:\n{log}"
    assert log.count("raise ValueError(message)") == 2, log
    assert f"Job {bad} attempt 1:\nTraceback" in log, log
    assert len(OUTCOME_RE.findall(log)) == 1 and len(RETRY_RE.findall(log)) == 1, log
    assert SUMMARY_RE.findall(log) == [("1", "0", "1", "2", "1")], log


@pytest.mark.django_db(transaction=True)
def test_quiet_verbosity_logs_a_job_that_failed_for_good_but_not_the_others(worker_process, probe):
    ok = tasks.mark.enqueue(probe, "quiet").id
    bad = tasks.always_fails.enqueue("nope").id

    proc = worker_process("--stop-when-empty", "-v", "0")
    assert proc.wait(60) == 0, read_log(proc)

    log = read_log(proc)
    assert [job_id for job_id, *_ in OUTCOME_RE.findall(log)] == [str(bad)], log
    assert str(ok) not in log and not RETRY_RE.findall(log), log
    assert SUMMARY_RE.findall(log) == [("2", "1", "1", "3", "1")], log


def test_stop_summary_counts_jobs_and_attempts_with_their_plurals():
    one = WorkerStats(completed=1, started_at=0.0, stopped_at=2.0)
    assert one.summary() == "1 job finished in 2.0s: 1 completed, 0 failed; 1 attempt (0.5/s), 0 retried"
    demo = WorkerStats(completed=4, failed=1, retried=2, started_at=0.0, stopped_at=3.5)
    assert demo.summary() == "5 jobs finished in 3.5s: 4 completed, 1 failed; 7 attempts (2.0/s), 2 retried"
    rest = WorkerStats(completed=2, cancelled=1, snoozed=1, timed_out=1, released=1, started_at=0.0, stopped_at=1.0)
    assert rest.summary() == (
        "3 jobs finished in 1.0s: 2 completed, 0 failed, 1 cancelled; 4 attempts (4.0/s), 0 retried, 1 snoozed, "
        "1 timed out; 1 job released"
    )
    assert WorkerStats(started_at=5.0, stopped_at=5.0).summary().startswith("0 jobs finished in 0.0s: ")


@pytest.mark.django_db(transaction=True)
def test_max_jobs_option_stops_the_process_after_that_many_jobs(worker_process, probe):
    ids = [tasks.mark.enqueue(probe, f"j{i}").id for i in range(6)]

    proc = worker_process("--max-jobs", "2", "-c", "2")
    assert proc.wait(60) == 0, read_log(proc)

    assert SUMMARY_RE.findall(read_log(proc)) == [("2", "2", "0", "2", "0")]
    assert Job.objects.filter(id__in=ids, state="completed").count() == 2
    assert Job.objects.filter(id__in=ids, state="waiting", attempts=0).count() == 4


@pytest.mark.django_db(transaction=True)
def test_max_time_option_stops_an_idle_process(worker_process):
    proc = worker_process("--max-time", "1", "--sleep", "0.1")
    assert proc.wait(60) == 0, read_log(proc)

    log = read_log(proc)
    assert "--max-time reached" in log
    [(finished, *_)] = SUMMARY_RE.findall(log)
    assert finished == "0"


@pytest.mark.django_db(transaction=True)
def test_djangos_task_log_is_off_unless_the_project_names_it(in_process_command):
    import logging

    from django.test import override_settings

    tasks_logger = logging.getLogger("django.tasks")
    for ours in (
        {},  # Django's defaults only
        {"version": 1, "loggers": {"django": {"level": "INFO"}}},
        {"version": 1, "root": {"level": "INFO"}},
    ):
        tasks_logger.setLevel(logging.NOTSET)
        with override_settings(LOGGING=ours):
            in_process_command("--stop-when-empty", "-v", "3")
            assert not tasks_logger.isEnabledFor(logging.CRITICAL), f"our outcome lines say the same: {ours}"

    with override_settings(LOGGING={"version": 1, "loggers": {"django.tasks": {"level": "INFO"}}}):
        tasks_logger.setLevel(logging.INFO)  # as that LOGGING configures it
        in_process_command("--stop-when-empty", "-v", "0")
        assert tasks_logger.level == logging.INFO, "a project that names django.tasks keeps its configuration"
    with override_settings(LOGGING_CONFIG=None):
        tasks_logger.setLevel(logging.NOTSET)
        in_process_command("--stop-when-empty", "-v", "0")
        assert tasks_logger.level == logging.NOTSET, "so does a project with a LOGGING_CONFIG of its own"

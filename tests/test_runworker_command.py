"""``manage.py runworker``: option parsing and validation (in process, through call_command) and
what a real run prints (a subprocess worker)."""

from __future__ import annotations

import os
import re

import pytest
from django.core.management import CommandError

from django_jobs.models import Job
from django_jobs.signals import worker_started
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
    assert "0 jobs processed" in out


#: The worker's line per job attempt at -v 2: "<job id> <task path> <new state> attempt N/M in X ms".
JOB_LINE_RE = re.compile(r"\b([0-9a-f-]{36}) (\S+) (\S+) attempt (\d+)/(\d+) in [\d.]+ ms$", re.M)
SUMMARY_RE = re.compile(
    r"^(\d+) jobs processed in [\d.]+s \([\d.]+/s\): (\d+) completed, (\d+) failed, (\d+) retried$", re.M
)


@pytest.mark.django_db(transaction=True)
def test_verbose_run_logs_one_line_per_job_attempt_and_a_summary(worker_process, probe):
    ok = [tasks.mark.enqueue(probe, f"v{i}").id for i in range(3)]
    flaky = tasks.always_fails.enqueue("nope").id  # 2 attempts: retried, then failed
    non_json = tasks.returns_non_json.enqueue().id

    proc = worker_process("--stop-when-empty", "-v", "2")
    assert proc.wait(60) == 0, read_log(proc)

    log = read_log(proc)
    job_lines = {str(job_id): [] for job_id in [*ok, flaky, non_json]}
    for job_id, *fields in JOB_LINE_RE.findall(log):
        job_lines[job_id].append(tuple(fields))
    for job_id in ok:
        assert job_lines[job_id] == [("tests.tasks.mark", "completed", "1", "1")], log
    assert job_lines[flaky] == [
        ("tests.tasks.always_fails", "waiting", "1", "2"),
        ("tests.tasks.always_fails", "failed", "2", "2"),
    ], log
    assert job_lines[non_json] == [("tests.tasks.returns_non_json", "failed", "1", "1")], log

    summaries = SUMMARY_RE.findall(log)
    assert summaries == [("6", "3", "2", "1")], log
    assert Job.objects.filter(state="completed").count() == 3
    assert Job.objects.filter(state="failed").count() == 2


@pytest.mark.django_db(transaction=True)
def test_default_verbosity_prints_the_summary_but_no_line_per_job(worker_process, probe):
    ids = [tasks.mark.enqueue(probe, f"q{i}").id for i in range(3)]

    proc = worker_process("--stop-when-empty")
    assert proc.wait(60) == 0, read_log(proc)

    log = read_log(proc)
    assert SUMMARY_RE.findall(log) == [("3", "3", "0", "0")], log
    assert not JOB_LINE_RE.findall(log), log
    assert Job.objects.filter(id__in=ids, state="completed").count() == 3


@pytest.mark.django_db(transaction=True)
def test_max_jobs_option_stops_the_process_after_that_many_jobs(worker_process, probe):
    ids = [tasks.mark.enqueue(probe, f"j{i}").id for i in range(6)]

    proc = worker_process("--max-jobs", "2", "-c", "2")
    assert proc.wait(60) == 0, read_log(proc)

    assert SUMMARY_RE.findall(read_log(proc)) == [("2", "2", "0", "0")]
    assert Job.objects.filter(id__in=ids, state="completed").count() == 2
    assert Job.objects.filter(id__in=ids, state="waiting", attempts=0).count() == 4


@pytest.mark.django_db(transaction=True)
def test_max_time_option_stops_an_idle_process(worker_process):
    proc = worker_process("--max-time", "1", "--sleep", "0.1")
    assert proc.wait(60) == 0, read_log(proc)

    log = read_log(proc)
    assert "--max-time reached" in log
    [(processed, *_)] = SUMMARY_RE.findall(log)
    assert processed == "0"


@pytest.mark.django_db(transaction=True)
def test_djangos_task_log_is_kept_to_warnings_unless_the_project_configures_it(in_process_command):
    import logging

    from django.test import override_settings

    tasks_logger = logging.getLogger("django.tasks")
    tasks_logger.setLevel(logging.NOTSET)
    with override_settings(LOGGING={}):  # Django's defaults only
        in_process_command("--stop-when-empty", "-v", "0")
        assert tasks_logger.level == logging.WARNING, "Django's INFO line per task start and finish is not built"

    for configured in (
        {"version": 1, "loggers": {"django.tasks": {"level": "INFO"}}},
        {"version": 1, "loggers": {"django": {"level": "INFO"}}},
        {"version": 1, "root": {"level": "INFO"}},
    ):
        tasks_logger.setLevel(logging.NOTSET)
        with override_settings(LOGGING=configured):
            in_process_command("--stop-when-empty", "-v", "0")
            assert tasks_logger.level != logging.WARNING, f"a project's own logging configuration is kept: {configured}"

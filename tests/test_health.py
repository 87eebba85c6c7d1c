"""``manage.py jobs health`` and the health view: exit codes and statuses against real workers,
real waits and real rescues."""

from __future__ import annotations

import io
import json
import os
import signal
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

import django_jobs
from django_jobs import engine
from django_jobs.health import this_host
from django_jobs.models import Worker
from tests.conftest import read_log, wait_until
from tests.factories import claim, insert_job, jobs_settings, run_python

URL = "/jobs/health/"
#: A worker's lease and heartbeat: 1 s (it renews every third), stale after three leases.
SHORT_LEASE = {"JOBS_TEST_LEASE": "1"}


def health(*args: str) -> tuple[int, str, str]:
    """``jobs health <args>`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("jobs", "health", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code), out.getvalue(), err.getvalue()
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), err.getvalue()


def health_process(*args: str) -> tuple[int, str, str]:
    """``manage.py jobs health <args>`` as a process of its own: its real exit code."""
    done = run_python("-m", "django", "jobs", "health", *args, env=SHORT_LEASE, timeout=60)
    return done.returncode, done.stdout, done.stderr


def ready_job(seconds_ago: float, queue: str = "default", **fields) -> None:
    insert_job(queue=queue, now=timezone.now() - timedelta(seconds=seconds_ago), **fields)


def stall() -> None:
    """A job whose worker claimed it five minutes ago and never came back, rescued now (events
    are stamped with the current time: PostgreSQL's own clock)."""
    at = timezone.now() - timedelta(minutes=5)
    job = insert_job(now=at)
    claim(now=at, lease_seconds=30, job_ids=[job.id])
    # max_stalled=0: it fails, so no job is left waiting for the wait check.
    assert engine.rescue_stalled_jobs(using="default", max_stalled=0, limit=10)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_healthy_while_a_worker_heartbeats_unhealthy_once_it_is_killed(worker_process):
    proc = worker_process("-c", "1", "--worker-id", "probed", env=SHORT_LEASE)
    wait_until(lambda: Worker.objects.filter(id="probed").exists(), timeout=30, message="the worker to register")

    code, out, err = health_process()
    assert code == 0, (out, err, read_log(proc))
    assert f"workers: 1 worker(s) on {this_host()} heartbeat within 3s, 1 required" in out
    assert err == ""
    with jobs_settings(LEASE_SECONDS=1):
        response = Client().get(URL)
    assert response.status_code == 200, response.content
    assert response.json()["checks"]["workers"] | {"stale_after_seconds": 3.0} == {
        "ok": True, "message": "1 worker(s) on any host heartbeat within 3s, 1 required", "host": None,
        "fresh": 1, "stale": 0, "min": 1, "stale_after_seconds": 3.0,
    }  # fmt: skip
    assert health_process("--min-workers", "2")[0] == 1, "one worker is fewer than two"

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    age = lambda: timezone.now() - Worker.objects.get(id="probed").heartbeat_at  # noqa: E731
    wait_until(lambda: age() > timedelta(seconds=3.5), timeout=30, message="the heartbeat to go stale")

    code, out, err = health_process()
    assert code == 1, (out, err)
    assert err.splitlines() == [f"workers: 0 worker(s) on {this_host()} only heartbeat within 3s, 1 required"]
    with jobs_settings(LEASE_SECONDS=1):
        response = Client().get(URL)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "fail" and body["checks"]["workers"]["stale"] == 1
    assert body["checks"]["database"]["ok"] and body["checks"]["wait"]["ok"]
    assert health_process("--min-workers", "0")[0] == 0, "no worker required: healthy"
    assert health_process("--host", "elsewhere", "--min-workers", "0")[0] == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_unreachable_database_fails_the_database_check_alone():
    # A port nothing listens on (PostgreSQL, MariaDB), a file in a missing directory (SQLite).
    down = {"PGPORT": "1", "MYSQL_TCP_PORT": "1", "JOBS_TEST_DB_NAME": "/nonexistent/dir/jobs.sqlite3"}
    done = run_python("-m", "django", "jobs", "health", env=down, timeout=60)
    assert done.returncode == 1, (done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith("database: database 'default' unreachable (OperationalError): "), line
    assert done.stdout == ""
    done = run_python("-m", "django", "jobs", "health", "--json", env=down, timeout=60)
    assert json.loads(done.stdout)["checks"] == {
        "database": {"ok": False, "message": "database 'default' unreachable (OperationalError)"}
    }


@pytest.mark.django_db
def test_an_old_ready_job_fails_the_wait_check_of_its_queue():
    ready_job(400, args=["s3cret-argument"])
    ready_job(10, queue="emails")
    ready_job(10_000, queue="reports")
    django_jobs.queue("reports").pause()

    code, out, err = health("--min-workers", "0")
    assert code == 1
    assert err.splitlines() == ["wait: oldest ready job waited too long in default 400s > 300s"], "reports is paused"
    assert "database: database 'default' answers" in out

    assert health("--min-workers", "0", "--max-wait", "default=600")[0] == 0
    assert health("--min-workers", "0", "--max-wait", "500")[0] == 0
    assert health("--min-workers", "0", "--max-wait", "default=off", "--max-wait", "5")[0] == 1, "emails: 10s > 5s"
    assert health("--min-workers", "0", "--max-wait", "off")[0] == 0

    response = Client().get(URL, {"min_workers": "0"})
    assert response.status_code == 503
    wait = response.json()["checks"]["wait"]
    assert wait["ok"] is False
    assert wait["queues"]["default"]["ok"] is False and wait["queues"]["default"]["oldest_seconds"] >= 400
    assert wait["queues"]["emails"]["ok"] is True
    assert wait["queues"]["reports"] | {"oldest_seconds": 0} == {
        "oldest_seconds": 0, "max_seconds": 300.0, "paused": True, "ok": True,
    }  # fmt: skip
    assert b"s3cret" not in response.content, "no job arguments in the report"
    assert Client().get(URL, {"min_workers": "0", "max_wait": ["60", "default=600"]}).status_code == 200


@pytest.mark.django_db
def test_rescues_in_the_window_fail_the_rescues_check():
    stall()
    first = timezone.now()
    wait_until(lambda: timezone.now() - first > timedelta(seconds=4), timeout=10, message="4 s to pass")
    stall()
    recent = ["--min-workers", "0", "--window", "0.04"]  # 2.4 s: the second rescue only

    assert health("--min-workers", "0")[0] == 0, "the rescues check is off unless --max-rescues is given"
    code, _, err = health(*recent, "--max-rescues", "0")
    assert code == 1
    assert err.splitlines() == ["rescues: 1 job(s) stalled in the last 0.04 min, at most 0 allowed"]
    assert health(*recent, "--max-rescues", "1")[0] == 0, "the first rescue is out of the window"
    assert health("--min-workers", "0", "--max-rescues", "1")[0] == 1, "both in the default 15 minutes"
    assert health("--min-workers", "0", "--max-rescues", "2")[0] == 0
    response = Client().get(URL, {"min_workers": "0", "max_rescues": "1", "window": "120"})
    assert response.status_code == 503
    assert response.json()["checks"]["rescues"] == {
        "ok": False, "message": "2 job(s) stalled in the last 120 min, at most 1 allowed", "count": 2, "max": 1,
        "window_minutes": 120.0,
    }  # fmt: skip
    with jobs_settings(EVENTS=False):
        code, _, err = health("--min-workers", "0", "--max-rescues", "1")
    assert code == 2 and "turn the EVENTS setting on" in err


@pytest.mark.django_db
def test_json_and_quiet_output():
    code, out, err = health("--min-workers", "0", "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert report["status"] == "ok" and set(report["checks"]) == {"database", "workers", "wait"}
    assert health("--min-workers", "0", "-v", "0") == (0, "", "")
    assert health("--min-workers", "0", "--verbosity=0") == (0, "", "")
    quiet = io.StringIO()
    call_command("jobs", "-v", "0", "health", "--min-workers", "0", stdout=quiet)  # -v before the subcommand
    assert quiet.getvalue() == ""
    code, out, err = health("-v", "0", "--host", "no-such-host")
    assert (code, out) == (1, "") and err.startswith("workers: 0 worker(s) on no-such-host")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-wait", "abc"], "--max-wait 'abc': give a number of seconds (or off) above 0"),
        (["--max-wait", "0"], "--max-wait '0': give a number of seconds (or off) above 0"),
        (["--max-wait", "bad name!=5"], "--max-wait 'bad name!=5': Invalid queue name"),
        (["--max-wait", "5", "--max-wait", "off"], "--max-wait is given twice for every queue"),
        (["--min-workers", "-1"], "--min-workers must be a whole number from 0"),
        (["--host", ""], "--host must be a host name of 1-255 printable characters"),
        (["--window", "5"], "--window needs max-rescues"),
        (["--max-rescues", "x"], "--max-rescues must be a whole number"),
    ],
)
def test_bad_option_values_are_usage_errors(args, message):
    code, _, err = health(*args)
    assert code == 2 and message in err, err


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_usage_errors_exit_2_from_the_command_line():
    code, out, err = health_process("--max-wait", "soon")
    assert (code, out) == (2, "") and "--max-wait 'soon'" in err, err
    assert health_process("--no-such-option")[0] == 2
    code, _, err = health_process("--host", "a", "--any-host")
    assert code == 2 and "not allowed with argument" in err
    code, _, err = run_python("-m", "django", "jobs", "--backend", "nope", "health").returncode, None, None
    assert code == 2


@pytest.mark.django_db
def test_the_view_answers_get_only_and_rejects_bad_parameters():
    client = Client()
    assert client.post(URL).status_code == 405
    assert client.head(URL).status_code == 405
    for params, message in [
        ({"max_wait": "abc"}, "max-wait 'abc'"),
        ({"min_workers": "many"}, "min-workers must be a whole number"),
        ({"mx_wait": "5"}, "unknown parameter(s) mx_wait"),
        ({"backend": "nope"}, "backend 'nope' is not a django-jobs backend"),
        ({"min_workers": ["1", "2"]}, "min_workers is given more than once"),
    ]:
        response = client.get(URL, params)
        assert response.status_code == 400, params
        assert response.json()["status"] == "error" and message in response.json()["error"]
    response = client.get(URL, {"min_workers": "0", "backend": "limited"})
    assert response.status_code == 200 and response.json()["backend"] == "limited"
    assert "no-cache" in response["Cache-Control"]

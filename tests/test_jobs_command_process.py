"""``manage.py jobs`` as an operator runs it: a real ``python -m django`` process on the test
database, for what only a process shows (Django's common options parsed from argv, exit codes,
a terminal)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

import django_jobs
from django_jobs.testing import drain_queue
from tests import tasks
from tests.conftest import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def manage(
    *args: str, env: dict | None = None, cwd: str = str(ROOT), settings: bool = True
) -> subprocess.CompletedProcess:
    """``python -m django jobs <args>``; ``settings=False`` leaves DJANGO_SETTINGS_MODULE out of
    its environment."""
    environ = subprocess_env(env)
    if not settings:
        del environ["DJANGO_SETTINGS_MODULE"]
    return subprocess.run(
        [sys.executable, "-m", "django", "jobs", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def terminal(*args: str, timeout: float = 60) -> str:
    """What ``python -m django jobs <args>`` writes to its stdout when that is a terminal (a
    pseudo-terminal of this test), once it has exited with status 0."""
    leader, follower = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "jobs", *args],
        cwd=ROOT, env=subprocess_env({"TERM": "xterm"}), stdout=follower, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(follower)
    out = read_terminal(leader, lambda _: False, timeout)
    os.close(leader)
    assert proc.wait(timeout) == 0, proc.stderr.read() if proc.stderr else ""
    return out.decode()


def read_terminal(fd: int, enough: Callable[[bytes], bool], timeout: float) -> bytes:
    """Read a pseudo-terminal until ``enough(what was read)`` or its other end is closed."""
    out = b""
    deadline = time.monotonic() + timeout
    while not enough(out):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"timed out reading the terminal; read {out!r}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        out += chunk
    return out


def test_settings_and_pythonpath_work_after_the_subcommand():
    tasks.noop.using(queue_name="emails").enqueue()
    without = manage("status", settings=False)
    assert without.returncode != 0 and "No Django settings specified" in without.stderr
    given = manage("status", "--settings", "tests.settings", settings=False)
    assert given.returncode == 0, given.stderr
    assert given.stdout.startswith("queue") and "\nemails " in given.stdout

    # Elsewhere, with the repository off the path: tests.settings is found through --pythonpath.
    env = {"PYTHONPATH": ""}
    elsewhere = manage("list", "--settings", "tests.settings", env=env, cwd="/", settings=False)
    assert elsewhere.returncode != 0 and "No module named 'tests'" in elsewhere.stderr
    found = manage("list", "--settings", "tests.settings", "--pythonpath", str(ROOT), env=env, cwd="/", settings=False)
    assert found.returncode == 0, found.stderr
    assert "tests.tasks.noop" in found.stdout


def test_traceback_after_the_subcommand_shows_the_stack_of_an_error():
    plain = manage("--backend", "nope", "status")
    assert plain.returncode == 1 and plain.stderr.startswith("CommandError: --backend 'nope' is not")
    assert "Traceback" not in plain.stderr
    traced = manage("--backend", "nope", "status", "--traceback")
    assert traced.returncode == 1
    assert "Traceback (most recent call last)" in traced.stderr and "CommandError: --backend 'nope'" in traced.stderr


def test_verbosity_zero_after_or_before_the_subcommand_leaves_out_confirmations():
    assert manage("pause", "emails").stdout == "Queue 'emails' paused: running jobs finish, no new one starts.\n"
    quiet = manage("resume", "emails", "-v", "0")
    assert quiet.returncode == 0 and quiet.stdout == "", "-v 0 after the subcommand"
    assert not django_jobs.queue("emails").is_paused, "and it still acted"
    before = manage("-v", "0", "pause", "emails")
    assert before.returncode == 0 and before.stdout == "", "a subcommand does not undo -v given before it"
    assert django_jobs.queue("emails").is_paused
    status = manage("status", "-v", "0")
    assert status.returncode == 0 and "\nemails " in status.stdout, "the table asked for is still printed"


def test_color_options_after_the_subcommand_take_effect():
    failed = tasks.always_fails.enqueue("x")
    drain_queue()
    heading = "error (attempt 1): builtins.ValueError"
    assert f"\n{heading}\n" in manage("show", failed.id).stdout, "no color into a pipe"
    forced = manage("show", failed.id, "--force-color")
    assert forced.returncode == 0 and f"\x1b[31;1m{heading}\x1b[0m" in forced.stdout
    in_terminal = terminal("show", failed.id)
    assert f"\x1b[31;1m{heading}\x1b[0m" in in_terminal, "a terminal gets color"
    plain = terminal("show", failed.id, "--no-color")
    assert heading in plain and "\x1b[" not in plain
    both = manage("--force-color", "list", "--no-color")
    assert both.returncode == 1 and "--no-color and --force-color options can't be used together" in both.stderr


def test_skip_checks_after_the_subcommand_skips_the_system_checks():
    broken = {"JOBS_TEST_LEASE": "0.5"}  # LEASE_SECONDS < 1: check django_jobs.E002
    checked = manage("status", env=broken)
    assert checked.returncode == 1 and "django_jobs.E002" in checked.stderr
    skipped = manage("status", "--skip-checks", env=broken)
    assert skipped.returncode == 0, skipped.stderr


def test_an_unknown_option_after_the_subcommand_is_still_refused():
    refused = manage("status", "--nope")
    assert refused.returncode == 2 and "unrecognized arguments: --nope" in refused.stderr

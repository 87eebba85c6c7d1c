"""``manage.py jobs`` as an operator runs it: a real ``python -m django`` process on the test
database, for what only a process shows (Django's common options parsed from argv, exit codes,
a terminal)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime

import pytest

import django_jobs
from django_jobs.management.text import ANSI_REDRAW
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
    proc = jobs_process(*args, stdout=follower)
    os.close(follower)
    out = read_until(leader, lambda _: False, timeout)
    os.close(leader)
    assert proc.wait(timeout) == 0, proc.stderr.read() if proc.stderr else ""
    return out.decode()


def jobs_process(*args: str, stdout: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "jobs", *args],
        cwd=ROOT, env=subprocess_env({"TERM": "xterm"}), stdout=stdout, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def read_until(fd: int, enough: Callable[[bytes], bool], timeout: float) -> bytes:
    """Read a pipe or a pseudo-terminal until ``enough(what was read)`` or its other end is
    closed; fail the test after ``timeout`` seconds."""
    out = b""
    deadline = time.monotonic() + timeout
    while not enough(out):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"timed out after {timeout}s reading; the last of what was read: {out[-600:]!r}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        out += chunk
    return out


def watch_until_interrupted(fd: int, proc: subprocess.Popen, enough: Callable[[bytes], bool]) -> str:
    """Read ``status --watch`` until ``enough``, press Ctrl-C, read the rest: it must exit with 0."""
    try:
        out = read_until(fd, enough, 30)
        proc.send_signal(signal.SIGINT)
        out += read_until(fd, lambda _: False, 30)
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return out.decode()


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
    assert plain.returncode == 2 and "CommandError: --backend 'nope' is not" in plain.stderr
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


#: The line over each ``status --watch`` snapshot: when it was read.
WATCH_HEADER = re.compile(
    r"^jobs status, refreshed (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC \(every 0\.2s, Ctrl-C to stop\)$", re.M
)


def snapshot_times(snapshots: list[str]) -> list[datetime]:
    times = []
    for snapshot in snapshots:
        header, *table = snapshot.splitlines()
        found = WATCH_HEADER.fullmatch(header)
        assert found, f"each snapshot starts with its header line: {snapshot!r}"
        assert any(line.startswith("emails ") for line in table), snapshot
        times.append(datetime.fromisoformat(found.group(1)))
    assert times == sorted(times)
    return times


def test_status_watch_redraws_in_place_in_a_terminal_under_the_time_of_the_last_refresh():
    tasks.noop.using(queue_name="emails").enqueue()
    leader, follower = os.openpty()
    proc = jobs_process("status", "--watch", "0.2", stdout=follower)
    os.close(follower)
    try:
        out = watch_until_interrupted(leader, proc, lambda out: out.count(ANSI_REDRAW.encode()) >= 3)
    finally:
        os.close(leader)
    out = out.replace("\r\n", "\n")  # the terminal's own line ends
    before, *snapshots = out.split(ANSI_REDRAW)
    assert before == "", "the screen is cleared before the first snapshot too"
    assert len(snapshots) >= 3 and out.count("jobs status, refreshed") == len(snapshots), "one header per redraw"
    snapshot_times(snapshots[:-1])  # the last may have been cut short by Ctrl-C


def test_status_watch_into_a_pipe_appends_snapshots_each_under_a_header_with_its_time():
    tasks.noop.using(queue_name="emails").enqueue()
    proc = jobs_process("status", "--watch", "0.2", stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = watch_until_interrupted(proc.stdout.fileno(), proc, lambda out: out.count(b"jobs status, refreshed") >= 3)
    assert "\x1b[" not in out, "no terminal codes into a pipe"
    starts = [m.start() for m in WATCH_HEADER.finditer(out)]
    assert len(starts) >= 3 and starts[0] == 0 and out.count("jobs status, refreshed") == len(starts)
    snapshots = [out[start:end] for start, end in zip(starts, starts[1:], strict=False)]
    assert all(s.endswith("\n\n") for s in snapshots), "a blank line between snapshots"
    snapshot_times(snapshots)  # all but the last, which Ctrl-C may have cut short

"""``make demo``'s script (``example_project/manage.py demo``), run for real on a copy of the
example project and its own SQLite file: what a newcomer reads must be short and quiet."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("JOBS_TEST_DB", "sqlite") != "sqlite",
        reason="the demo runs on a SQLite file of its own whatever the test database; once is enough",
    ),
]


def manage(project, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's django_jobs
    return subprocess.run(
        [sys.executable, str(project / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_demo_prints_one_line_per_expected_failure_the_table_and_next_steps(tmp_path):
    project = tmp_path / "example_project"
    shutil.copytree(ROOT / "example_project", project, ignore=shutil.ignore_patterns("*.sqlite3*", "__pycache__"))
    migrated = manage(project, "migrate", "--verbosity", "0")
    assert migrated.returncode == 0, migrated.stderr

    run = manage(project, "demo")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    lines = out.splitlines()

    assert len(lines) < 40, f"{len(lines)} lines:\n{out}"
    assert "Traceback" not in out, out
    assert "Task id=" not in out, "Django's task lines would repeat the worker's"
    # flaky fails once, broken twice: one line each, and broken's error once more in the table.
    assert sum("ConnectionError: payments: the upstream service is down" in line for line in lines) == 1, out
    assert sum("ValueError: order 42 has no customer" in line for line in lines) == 3, out
    assert re.findall(r"^5 jobs finished in [\d.]+s: 4 completed, 1 failed; 7 attempts", out, re.M), out
    assert out.count(" finished in ") == 1, f"the stop summary once:\n{out}"

    rows = {m[0]: m[1:] for m in re.findall(r"^(\w+) +(\w+) +(\w+) +(\d+/\d+) +([\d.]+)s ", out, re.M)}
    assert set(rows) == {"add", "flaky", "delayed_report", "broken", "ping"}, out
    queue, state, attempts, ran_after = rows["delayed_report"]
    assert (state, attempts) == ("completed", "1/1") and float(ran_after) >= 3.0, f"it waited its run_after:\n{out}"
    assert float(rows["add"][3]) < 3.0, out
    assert rows["flaky"][1:3] == ("completed", "2/3") and rows["broken"][1:3] == ("failed", "2/2"), out
    assert "manage.py jobs status" in out and "/admin/django_jobs/" in out, "the next steps"

"""Shared fixtures: database vendor markers, ``wait_until``, worker runners (thread / subprocess)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    # "postgres" / "mysql": skipped on every other vendor. "needs(FLAG)": skipped where the
    # database's driver lacks that capability (django_jobs.drivers.Driver).
    vendor = os.environ.get("JOBS_TEST_DB", "sqlite")
    from django_jobs.drivers import driver

    for item in items:
        if "postgres" in item.keywords and vendor != "postgres":
            item.add_marker(
                pytest.mark.skip(reason="PostgreSQL-only feature; runs in the PostgreSQL half of make test")
            )
        if item.get_closest_marker("mysql") and vendor != "mysql":
            item.add_marker(pytest.mark.skip(reason="MySQL/MariaDB-only schema; runs in the MariaDB half of make test"))
        for mark in item.iter_markers("needs"):
            missing = [flag for flag in mark.args if not getattr(driver("default"), flag)]
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"the {vendor} driver has no {', '.join(missing)}"))


def wait_until(
    condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, message: str = ""
) -> object:
    """Poll ``condition`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message or condition}")
        time.sleep(interval)


def _collect_enqueued(pick: Callable[[dict], object]) -> Iterator[list]:
    from django.tasks.signals import task_enqueued

    received: list = []

    def receiver(sender, **kwargs):
        received.append(pick({"sender": sender, **kwargs}))

    task_enqueued.connect(receiver)
    yield received
    task_enqueued.disconnect(receiver)


@pytest.fixture
def enqueued_signals() -> Iterator[list]:
    """The ``task_enqueued`` signals sent during the test, as ``{"sender", **kwargs}`` dicts."""
    yield from _collect_enqueued(lambda signal: signal)


@pytest.fixture
def enqueued_results() -> Iterator[list]:
    """The results the ``task_enqueued`` signals sent during the test carry, in order."""
    yield from _collect_enqueued(lambda signal: signal["task_result"])


@pytest.fixture
def probe(tmp_path) -> str:
    """A JSON-lines file tasks append to (see tests.tasks.record)."""
    return str(tmp_path / "probe.jsonl")


class ThreadWorker:
    """A django_jobs Worker running in a thread of the test process."""

    def __init__(self, **kwargs):
        from django_jobs.worker import Worker

        kwargs.setdefault("sleep", 0.05)
        kwargs.setdefault("grace", 5)
        self.worker = Worker(**kwargs)
        self.stats = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.stats = self.worker.run()
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def start(self) -> ThreadWorker:
        self.thread.start()
        return self

    def stop(self, timeout: float = 15.0):
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker thread did not stop"
        if self.error:
            raise self.error
        return self.stats

    def join(self, timeout: float = 30.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker thread did not finish"
        if self.error:
            raise self.error
        return self.stats


@pytest.fixture
def thread_worker() -> Iterator[Callable[..., ThreadWorker]]:
    started: list[ThreadWorker] = []

    def start(**kwargs) -> ThreadWorker:
        w = ThreadWorker(**kwargs).start()
        started.append(w)
        return w

    yield start
    for w in started:
        if w.thread.is_alive():
            w.worker.stop()
            w.thread.join(15)


def subprocess_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["JOBS_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@pytest.fixture
def worker_process(tmp_path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``manage.py runworker <args>`` as a real process on the test database."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, env: dict | None = None) -> subprocess.Popen:
        log = open(tmp_path / f"worker-{len(procs)}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runworker", *args],
            cwd=ROOT,
            env=subprocess_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def read_log(proc: subprocess.Popen) -> str:
    return Path(proc.log_path).read_text()  # type: ignore[attr-defined]


def stop_process(proc: subprocess.Popen) -> None:
    """SIGSTOP ``proc`` (a child of this process) and return once it has stopped.

    ``kill()`` returns before a multi-threaded process stops: the thread the signal was queued
    to starts the group stop when it next runs, and until then the other threads go on. On a
    loaded machine that is tens to hundreds of milliseconds, time enough for a handler to see a
    file the test creates "after" the stop and acknowledge its batch. ``waitpid(WUNTRACED)``
    returns once every thread has stopped."""
    os.kill(proc.pid, signal.SIGSTOP)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        raise AssertionError(f"process {proc.pid} ended instead of stopping (wait status {status})")


@pytest.fixture
def in_process_command() -> Iterator[Callable[..., str]]:
    """Run runworker in this process (``run(*args)``, its stdout returned) and undo what it
    changes process-wide: the SIGTERM/SIGINT handlers the worker installs and the levels of the
    django_jobs and django.tasks loggers."""
    import logging
    import signal
    from io import StringIO

    from django.core.management import call_command

    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    loggers = [logging.getLogger(n) for n in ("django_jobs", "django_jobs.worker.jobs", "django.tasks")]
    saved_levels = [lg.level for lg in loggers]

    def run(*args: str) -> str:
        out = StringIO()
        call_command("runworker", *args, stdout=out, stderr=StringIO())
        return out.getvalue()

    yield run
    for s, handler in saved_signals.items():
        signal.signal(s, handler)
    for lg, level in zip(loggers, saved_levels, strict=True):
        lg.setLevel(level)


@pytest.fixture
def registry():
    """Bus-mode subscribers declared by a test are forgotten after it (other tests' workers run
    every declared one)."""
    from django_jobs.spec import topics as spec

    saved = dict(spec._registry)
    yield
    spec._registry.clear()
    spec._registry.update(saved)

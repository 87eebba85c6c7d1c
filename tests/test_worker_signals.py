"""Signals on real ``manage.py runworker`` processes under load: a SIGTERM followed a few
milliseconds later by a second one (as ``timeout`` and some supervisors send them) is one
request to stop, so the worker shuts down gracefully, prints its summary and exits 0. And a
process the supervisor forks is not killed by a signal that reaches it while it starts up."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from django_jobs.models import Job, Worker
from django_jobs.worker.stop_signals import REPEAT_WINDOW, StopRequests
from tests import tasks
from tests.conftest import read_log, wait_until
from tests.factories import run_python

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Rounds of two SIGTERMs, the gap between them spread over 0-5 ms so some second signal lands
#: while the first one's handler runs.
GAPS = [i * 0.005 / 9 for i in range(10)]
SUMMARY_RE = re.compile(r"^(\[process \d\] )?\d+ jobs? finished in [\d.]+s: \d+ completed", re.M)


def completed(queue: str) -> int:
    return Job.objects.filter(queue=queue, state="completed").count()


def sigterm_twice(pid: int, gap: float) -> None:
    os.kill(pid, signal.SIGTERM)
    until = time.perf_counter() + gap
    while time.perf_counter() < until:  # a busy wait: time.sleep() is too coarse for 0-5 ms
        pass
    os.kill(pid, signal.SIGTERM)


def run_rounds(worker_process, gaps: list[float], *args: str, processes: int = 1) -> None:
    """One worker per gap, each on its own queue. They start together (a Python start-up costs
    about half a second of CPU); then, one at a time, a worker gets jobs and, once it runs them,
    its two SIGTERMs. Busy workers all at once would leave each so little CPU that both signals
    would land before its main thread ran again, and Python runs one handler call for the two."""
    procs = [worker_process("-q", f"r{i}", "-c", "4", "--skip-checks", *args) for i in range(len(gaps))]
    # A worker registers its row after installing its signal handlers.
    wait_until(lambda: Worker.objects.count() == len(procs) * processes, timeout=60, message="every worker")
    for i, (proc, gap) in enumerate(zip(procs, gaps, strict=True)):
        tasks.noop.using(queue_name=f"r{i}").enqueue_many([()] * 1000)
        wait_until(lambda q=f"r{i}": completed(q) >= 50, timeout=30, message=f"worker {i} to run jobs")
        sigterm_twice(proc.pid, gap)  # the next round starts while this worker shuts down
    for i, (proc, gap) in enumerate(zip(procs, gaps, strict=True)):
        code = proc.wait(30)
        log = read_log(proc)
        assert code == 0, f"gap {gap * 1000:.1f} ms: exit status {code}\n{log}"
        assert len(SUMMARY_RE.findall(log)) == processes, f"gap {gap * 1000:.1f} ms: no summary\n{log}"
        assert "SIGTERM received, shutting down" in log
        assert "second signal" not in log
        assert completed(f"r{i}") < 1000, "the signals reached a worker with jobs left to run"


def test_two_sigterms_milliseconds_apart_stop_a_busy_worker_gracefully(worker_process):
    run_rounds(worker_process, GAPS)


@pytest.mark.needs("ROW_LOCKS")
def test_two_sigterms_milliseconds_apart_stop_a_busy_supervisor_gracefully(worker_process):
    run_rounds(worker_process, GAPS[::2], "-p", "2", processes=2)


def test_signals_within_the_repeat_window_of_a_request_are_that_request_again():
    requests = StopRequests()
    assert (requests.requests, requests.count(now=100.0)) == (0, 1)
    assert requests.count(now=100.0) == 0, "timeout(1) sends its signal twice at once"
    assert requests.count(now=100.0 + REPEAT_WINDOW) == 0
    second = 100.0 + REPEAT_WINDOW + 0.01
    assert requests.count(now=second) == 2
    assert requests.count(now=second + REPEAT_WINDOW / 2) == 0, "the window counts from the request's first signal"
    assert requests.count(now=second + REPEAT_WINDOW + 0.01) == 3
    assert requests.requests == 3


#: supervise() with one child that starts up slowly: its supervisor gets a SIGTERM and passes it
#: on before the child has installed its handler.
SLOW_STARTING_CHILD = """
import os, signal, sys
import django

django.setup()
from django_jobs.worker.stop_signals import install_stop_handler
from django_jobs.worker.supervisor import supervise


def run_child(index):
    os.kill(os.getppid(), signal.SIGTERM)
    while signal.SIGTERM not in signal.sigpending():  # starting up; the SIGTERM waits for a handler
        pass
    received = []
    install_stop_handler(lambda signum, frame: received.append(signum))
    print("child received", received, flush=True)
    return 0 if received == [signal.SIGTERM] else 5


sys.exit(supervise(1, run_child))
"""


def test_a_signal_reaching_a_child_while_it_starts_up_waits_for_its_handler():
    proc = run_python("-c", SLOW_STARTING_CHILD, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"child received [{int(signal.SIGTERM)}]" in proc.stdout

"""Fault tests: real ``manage.py runworker`` processes on the test database, signalled, killed,
and cut off from PostgreSQL mid-run. Tasks report through the probe file (tests.tasks.record),
so every execution is counted: a job is *lost* when it never completed and *duplicated* when it
ran to its end more than once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter

import pytest
from django.db import OperationalError, connection

from django_jobs.models import Job, Worker
from tests import tasks
from tests.conftest import read_log, wait_until
from tests.factories import count_states, jobs_settings, records_of
from tests.tasks import read_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SHORT_LEASE = {"JOBS_TEST_LEASE": "2"}


def keys_of(probe: str, event: str) -> Counter:
    return Counter(r["key"] for r in records_of(probe, event))


def all_completed(ids) -> bool:
    return Job.objects.filter(id__in=list(ids), state="completed").count() == len(ids)


def children_of(pid: int) -> set[int]:
    out = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def exactly_once_report(expected: set[str], ran: Counter) -> tuple[int, int, int]:
    lost = len(expected - set(ran))
    duplicated = sum(1 for k in expected if ran[k] > 1)
    return len(expected), lost, duplicated


# -- SIGTERM -----------------------------------------------------------------------------------


def test_sigterm_drains_running_jobs_and_exits_0(worker_process, probe):
    ids = {f"d{i}": tasks.sleep_then_mark.enqueue(probe, f"d{i}", 1.5).id for i in range(6)}
    proc = worker_process("-c", "4", "--grace", "10")
    wait_until(lambda: len(records_of(probe, "start")) == 4, timeout=30, message="4 jobs to start")
    running_at_signal = set(keys_of(probe, "start"))

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, read_log(proc)

    log = read_log(proc)
    assert "SIGTERM received" in log
    started, ended = keys_of(probe, "start"), keys_of(probe, "end")
    assert running_at_signal <= set(ended), "a job running at SIGTERM did not finish"
    assert started == ended, "every job that started ran to its end"
    assert all(n == 1 for n in ended.values())
    for key, job_id in ids.items():
        job = Job.objects.get(id=job_id)
        if key in started:
            assert (job.state, job.attempts) == ("completed", 1)
        else:  # not started: still there for the next worker, the attempt not spent
            assert (job.state, job.attempts, job.worker_ids, job.lease_token) == ("waiting", 0, [], None)
    assert not Worker.objects.exists(), "the worker removes its own row on a clean exit"


def test_sigterm_starts_no_job_that_was_not_running(worker_process, probe):
    ids = [tasks.sleep_then_mark.enqueue(probe, f"n{i}", 1.5).id for i in range(6)]
    proc = worker_process("-c", "4", "--grace", "10")
    wait_until(lambda: len(records_of(probe, "start")) == 4, timeout=30, message="4 jobs to start")

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, read_log(proc)

    assert len(keys_of(probe, "start")) == 4
    assert count_states(ids) == {"completed": 4, "waiting": 2}


def test_sigterm_after_short_grace_releases_the_running_job(worker_process, probe):
    result = tasks.sleep_then_mark.enqueue(probe, "long", 30)
    proc = worker_process("--grace", "1")
    wait_until(lambda: records_of(probe, "start"), timeout=30, message="the job to start")
    assert Job.objects.get(id=result.id).state == "active"

    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, read_log(proc)
    assert time.monotonic() - t0 < 8, "the grace period is 1 s"

    job = Job.objects.get(id=result.id)
    # Released, not failed: the interrupted attempt is not counted against max_attempts.
    assert (job.state, job.attempts, job.worker_ids, job.errors) == ("waiting", 0, [], [])
    assert (job.lease_token, job.lease_expires_at, job.started_at) == (None, None, None)
    assert records_of(probe, "end") == []
    assert "releasing them" in read_log(proc)


def test_second_sigterm_exits_at_once_and_the_lease_hands_the_job_on(worker_process, probe):
    result = tasks.sleep_then_mark.enqueue(probe, "twice", 4)
    a = worker_process("--worker-id", "worker-a", env=SHORT_LEASE)
    wait_until(lambda: records_of(probe, "start"), timeout=30, message="worker A to start the job")

    a.send_signal(signal.SIGTERM)
    # Python folds two pending signals into one handler call: let the first one land.
    wait_until(lambda: "SIGTERM received" in read_log(a), timeout=20)
    # The worker takes a repeat within 1 s of its handling of the first signal for the same
    # request (a terminal's Ctrl-C reaches the supervisor and its children); a second request
    # comes later than that. Counted from when the first was seen handled: on a loaded machine
    # the handler may run a while after the signal was sent.
    first = time.monotonic()
    wait_until(lambda: time.monotonic() - first > 1.2, timeout=5)
    assert a.poll() is None, "the first SIGTERM waits for the running job (grace 30 s)"
    t0 = time.monotonic()
    a.send_signal(signal.SIGTERM)
    code = a.wait(20)
    assert time.monotonic() - t0 < 5
    assert code != 0
    assert "second signal, exiting at once" in read_log(a)
    # Nothing was released on the way out: the job still belongs to A until its lease expires.
    job = Job.objects.get(id=result.id)
    assert (job.state, job.worker_id) == ("active", "worker-a")

    b = worker_process("--worker-id", "worker-b", env=SHORT_LEASE)
    wait_until(lambda: Job.objects.get(id=result.id).state == "completed", timeout=60, message="B to finish it")
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0, read_log(b)

    job = Job.objects.get(id=result.id)
    assert (job.stalled_count, job.attempts, job.worker_ids) == (1, 1, ["worker-b"])
    assert [r["pid"] for r in records_of(probe, "start")] == [a.pid, b.pid]
    assert [r["pid"] for r in records_of(probe, "end")] == [b.pid]


def test_running_job_keeps_its_lease_through_the_grace_period(worker_process, probe):
    result = tasks.sleep_then_mark.enqueue(probe, "graceful", 6)
    a = worker_process("-c", "1", "--grace", "20", "--worker-id", "worker-a", env=SHORT_LEASE)
    wait_until(lambda: records_of(probe, "start"), timeout=30, message="worker A to start the job")
    # B would rescue the job (and become leader) if A stopped renewing its lease and heartbeat
    # while draining: the 6 s job outlives A's 2 s lease three times over.
    b = worker_process("-c", "1", "--worker-id", "worker-b", env=SHORT_LEASE)
    wait_until(lambda: Worker.objects.filter(id="worker-b").exists(), timeout=30)

    a.send_signal(signal.SIGTERM)
    assert a.wait(30) == 0, read_log(a)
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0, read_log(b)

    job = Job.objects.get(id=result.id)
    assert (job.state, job.stalled_count, job.worker_ids) == ("completed", 0, ["worker-a"])
    assert [(r["event"], r["pid"]) for r in read_records(probe)] == [("start", a.pid), ("end", a.pid)]
    assert "Dropped" not in read_log(a)


def test_eight_threads_with_concurrent_enqueues_report_no_database_errors(worker_process, probe):
    first = [tasks.mark.enqueue(probe, f"c{i}").id for i in range(200)]
    proc = worker_process("-c", "8")
    # Enqueue while the worker claims and completes: on SQLite every one of these is a writer
    # contending for the database lock.
    wait_until(lambda: Job.objects.filter(state="completed").exists(), timeout=30)
    more = [tasks.mark.enqueue(probe, f"c{i}").id for i in range(200, 300)]
    wait_until(lambda: all_completed(first + more), timeout=60, message="300 jobs to complete")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, read_log(proc)

    log = read_log(proc)
    assert "locked" not in log, log
    assert " failed (" not in log, log  # no claim/outcome/maintenance write had to be retried
    ran = Counter(r["key"] for r in read_records(probe))
    n, lost, duplicated = exactly_once_report({f"c{i}" for i in range(300)}, ran)
    assert (lost, duplicated) == (0, 0), f"{n} jobs, {lost} lost, {duplicated} duplicated"
    assert count_states(first + more) == {"completed": 300}


# -- SIGKILL -----------------------------------------------------------------------------------


def test_sigkill_mid_job_another_worker_reruns_it_after_the_lease_expires(worker_process, probe):
    long = tasks.sleep_then_mark.enqueue(probe, "long", 3)
    a = worker_process("-c", "1", "--worker-id", "worker-a", env=SHORT_LEASE)
    wait_until(lambda: records_of(probe, "start"), timeout=30, message="worker A to start the long job")
    # A's only slot is busy, so these wait for whoever is alive.
    others = {f"o{i}": tasks.mark.enqueue(probe, f"o{i}").id for i in range(50)}

    os.killpg(a.pid, signal.SIGKILL)
    a.wait(10)
    assert Job.objects.get(id=long.id).state == "active"
    b = worker_process("-c", "4", "--worker-id", "worker-b", env=SHORT_LEASE)

    all_ids = [long.id, *others.values()]
    wait_until(lambda: all_completed(all_ids), timeout=60, message="B to complete every job")
    # B (the leader once A's heartbeat is stale) removes A's Worker row.
    wait_until(lambda: not Worker.objects.filter(id="worker-a").exists(), timeout=30)
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0, read_log(b)

    job = Job.objects.get(id=long.id)
    # The stalled attempt is taken back (attempts and worker_ids), only stalled_count keeps it.
    assert (job.state, job.stalled_count, job.attempts, job.worker_ids) == ("completed", 1, 1, ["worker-b"])
    assert [r["pid"] for r in records_of(probe, "start")] == [a.pid, b.pid]
    assert [r["pid"] for r in records_of(probe, "end")] == [b.pid], "the long job ran to its end exactly once"

    ran = Counter(r["key"] for r in read_records(probe) if "event" not in r)
    ran["long"] = len(records_of(probe, "end"))
    n, lost, duplicated = exactly_once_report({"long", *others}, ran)
    assert (lost, duplicated) == (0, 0), f"{n} jobs, {lost} lost, {duplicated} duplicated"
    assert count_states(all_ids) == {"completed": n}
    assert {r["pid"] for r in read_records(probe) if "event" not in r} == {b.pid}


# -- server databases: cut connections --------------------------------------------------------


def terminate_other_connections() -> int:
    """Cut every other session's connection to the test database (PostgreSQL's
    pg_terminate_backend, MySQL/MariaDB's KILL CONNECTION); return how many."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return sum(1 for (ok,) in cursor.fetchall() if ok)
        cursor.execute("SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()")
        killed = 0
        for (session,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL CONNECTION {int(session)}")
                killed += 1
            except OperationalError:  # it ended meanwhile
                pass
        return killed


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no server connections to cut")
def test_terminated_connections_mid_run_the_worker_reconnects_and_loses_nothing(worker_process, probe):
    n_jobs = 300
    ids = []
    for i in range(n_jobs):
        if i % 2:
            ids.append(tasks.sleep_then_mark.enqueue(probe, f"t{i}", 0.01).id)
        else:
            ids.append(tasks.mark.enqueue(probe, f"t{i}").id)
    # A lease of 5 s bounds the wait should a claim commit while its reply is cut off.
    proc = worker_process("-c", "2", "--stop-when-empty", env={"JOBS_TEST_LEASE": "5"})

    def completed() -> int:
        return Job.objects.filter(id__in=ids, state="completed").count()

    kills = []
    for threshold in (60, 140, 220):
        wait_until(lambda t=threshold: completed() >= t, timeout=60, message=f"{threshold} jobs done")
        done = completed()
        assert done < n_jobs, "the run ended before the connections were cut"
        kills.append((done, terminate_other_connections()))
        assert proc.poll() is None, read_log(proc)
    assert all(killed >= 1 for _, killed in kills), kills

    assert proc.wait(120) == 0, read_log(proc)
    ran = Counter(r["key"] for r in read_records(probe) if r.get("event") in (None, "end"))
    n, lost, duplicated = exactly_once_report({f"t{i}" for i in range(n_jobs)}, ran)
    assert (lost, duplicated) == (0, 0), f"{n} jobs, {lost} lost, {duplicated} duplicated; kills {kills}"
    assert count_states(ids) == {"completed": n_jobs}
    log = read_log(proc)
    assert "retrying" in log or "LISTEN connection lost" in log, log


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one worker process")
def test_supervisor_runs_two_processes_and_restarts_one_that_dies(worker_process, probe):
    ids = [tasks.mark.enqueue(probe, f"s{i}").id for i in range(200)]
    sup = worker_process("-p", "2", "-c", "2")

    wait_until(lambda: all_completed(ids), timeout=60, message="200 jobs to complete")
    ran = Counter(r["key"] for r in read_records(probe))
    n, lost, duplicated = exactly_once_report({f"s{i}" for i in range(200)}, ran)
    assert (lost, duplicated) == (0, 0), f"{n} jobs, {lost} lost, {duplicated} duplicated"

    def two_registered_children() -> set[int] | None:
        kids = children_of(sup.pid)
        rows = set(Worker.objects.values_list("pid", flat=True))
        return kids if len(kids) == 2 and kids <= rows else None

    first = wait_until(two_registered_children, timeout=30)
    assert {r["pid"] for r in read_records(probe)} <= first, "jobs ran in the children, not the supervisor"
    victim = min(first)
    os.kill(victim, signal.SIGKILL)

    def replaced() -> set[int] | None:
        kids = two_registered_children()
        return kids if kids and victim not in kids else None

    second = wait_until(replaced, timeout=30, message="the supervisor to fork a new child")
    assert len(second - first) == 1
    assert sup.poll() is None
    more = [tasks.mark.enqueue(probe, f"after{i}").id for i in range(20)]
    wait_until(lambda: all_completed(more), timeout=30)

    sup.send_signal(signal.SIGTERM)
    assert sup.wait(30) == 0, read_log(sup)
    assert children_of(sup.pid) == set()
    # The children stopped cleanly and removed their rows; only the killed one's row is left
    # for the reaper.
    assert set(Worker.objects.values_list("pid", flat=True)) == {victim}
    assert "restarting it" in read_log(sup)


def pickup_latencies(worker, probe: str, rounds: int = 3) -> list[float]:
    """Seconds from enqueue to completion of ``rounds`` jobs, each enqueued while ``worker``
    (a thread worker polling every 30 s) is idle."""
    wait_until(lambda: getattr(worker.worker, "_listener", None) and worker.worker._listener.connected.is_set())
    latencies = []
    for i in range(rounds):
        # Idle: nothing in flight and no wake-up pending; the next claim waits for NOTIFY or 22.5+ s.
        wait_until(lambda: worker.worker._inflight == 0 and not worker.worker._wake.is_set(), timeout=10)
        result = tasks.mark.enqueue(probe, f"w{i}")
        t0 = time.monotonic()
        wait_until(lambda r=result: Job.objects.get(id=r.id).state == "completed", timeout=5, message="a NOTIFY")
        latencies.append(time.monotonic() - t0)
    return latencies


@pytest.mark.postgres
def test_notify_wakes_an_idle_worker_long_before_its_poll_interval(thread_worker, probe):
    worker = thread_worker(sleep=30)

    latencies = pickup_latencies(worker, probe)
    worker.stop()

    assert max(latencies) < 3, latencies


@pytest.mark.postgres
def test_notify_uses_the_channel_set_in_django_jobs_settings(thread_worker, probe):
    with jobs_settings(NOTIFY_CHANNEL="jobs_custom"):
        worker = thread_worker(sleep=30)
        try:
            wait_until(lambda: getattr(worker.worker, "_listener", None))
            assert worker.worker._listener.channel == "jobs_custom"
            latencies = pickup_latencies(worker, probe, rounds=1)
        finally:
            worker.stop()

    assert max(latencies) < 3, latencies

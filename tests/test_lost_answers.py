"""Lost answers (issue 12): PostgreSQL commits a statement and the answer never reaches the worker.

A worker (a real ``manage.py runworker``) or a ``manage.py jobs`` command connects through
tests/faultproxy.py, which drops the answer to a chosen statement after the server committed it
and closes the connection: the claim, an outcome batch, the NOTIFY after one, the release at
shutdown, a cancel. The test process talks to PostgreSQL directly. Whatever the statement, no
job may be left active with no one running it, and every outcome is counted once.

Each test first checks that its trap fired (and on what): a trap that never fires fails the
test rather than letting it pass on nothing.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections import Counter, defaultdict

import psycopg
import pytest
from django.db import connection

from django_jobs.models import Job
from tests import tasks, tasks_partitions
from tests.conftest import read_log, wait_until
from tests.factories import count_states, run_python
from tests.faultproxy import Cut, FaultProxy, Trap
from tests.tasks import read_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.postgres]

LEASE = 2.0
#: A job nobody runs is rescued within its lease plus a rescue interval (0.5 s in tests/settings.py);
#: the rest is slack for a loaded machine.
STUCK_BOUND = LEASE + 3.0

#: The statements whose answers the tests lose (their text in django_jobs/engine.py).
CLAIM = b"SET state = 'active'"  # claim_jobs
OUTCOMES = b"lease_token = v.token"  # record_outcomes
OUTCOMES_START = "WITH v(id, token, state, rv, err"  # how it begins (Cut keeps queries' first 400 chars)
NOTIFY = b"SELECT pg_notify("  # notify(): the wake-up after an outcome batch freed a partition
RELEASE = b"THEN 'waiting' ELSE 'cancelled'"  # release_jobs
CANCEL_FLAG = b'SET "cancel_requested_at" = '  # cancel_job on a running job (the ORM's UPDATE)

SUMMARY = re.compile(
    r"(\d+) jobs? finished in [\d.]+s: (\d+) completed, (\d+) failed[^;]*; \d+ attempts? \([\d.]+/s\), (\d+) retried"
)


@pytest.fixture
def fault_proxy():
    settings = connection.settings_dict
    with FaultProxy(upstream=(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))) as proxy:
        yield proxy


def through(proxy: FaultProxy, probe: str, **extra: str) -> dict[str, str]:
    """A subprocess worker's environment: through the proxy, a 2 s lease, task_finished recorded."""
    return {**proxy.env(), "JOBS_TEST_LEASE": str(LEASE), "JOBS_TEST_FINISHED_PROBE": probe, **extra}


def fired(proxy: FaultProxy, trap: Trap, proc: subprocess.Popen | None = None) -> Cut:
    """The one cut ``trap`` made; fails the test (the harness, not the code) when it made none."""
    cuts = proxy.cuts_of(trap)
    log = f"\nworker log:\n{read_log(proc)[-4000:]}" if proc is not None else ""
    assert len(cuts) == 1, f"the trap on {trap.pattern!r} fired {len(cuts)} times, not once: it tested nothing{log}"
    assert not cuts[0].error_seen, f"the trapped transaction failed, so nothing was committed: {cuts[0]}"
    return cuts[0]


class ActiveWatch:
    """Samples which of ``ids`` are ``active`` and keeps how long each stretch lasted."""

    def __init__(self, ids):
        self.ids = list(ids)
        self.since: dict = {}
        self.longest: dict = {}

    def sample(self) -> None:
        now = time.monotonic()
        active = set(Job.objects.filter(id__in=self.ids, state="active").values_list("id", flat=True))
        for job_id in active:
            self.since.setdefault(job_id, now)
        for job_id in [j for j in self.since if j not in active]:
            self.longest[job_id] = max(self.longest.get(job_id, 0.0), now - self.since.pop(job_id))

    def over(self, bound: float) -> dict:
        """``{job id: seconds}`` of the jobs that stayed active longer than ``bound`` (so far)."""
        now = time.monotonic()
        spans = dict(self.longest)
        for job_id, t in self.since.items():
            spans[job_id] = max(spans.get(job_id, 0.0), now - t)
        return {str(j): round(s, 1) for j, s in spans.items() if s > bound}


def run_until_exit(proc: subprocess.Popen, watch: ActiveWatch, timeout: float) -> float | None:
    """Sample ``watch`` until ``proc`` exits; the seconds it took, None if it ran past ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        watch.sample()
        if proc.poll() is not None:
            return time.monotonic() - t0
        time.sleep(0.05)
    watch.sample()
    return None


def summary_counts(log: str) -> tuple[int, ...] | None:
    """(finished, completed, failed, retried) from the worker's last stop summary."""
    found = SUMMARY.findall(log)
    return tuple(int(n) for n in found[-1]) if found else None


def check(problems: list[str], proc: subprocess.Popen) -> None:
    assert not problems, "\n".join(problems) + f"\n\nworker log (tail):\n{read_log(proc)[-4000:]}"


# -- the proxy itself ----------------------------------------------------------------------------


def test_the_fault_proxy_forwards_queries_and_loses_the_answer_of_a_committed_statement(fault_proxy):
    settings = connection.settings_dict
    params = {
        "host": fault_proxy.host,
        "port": fault_proxy.port,
        "dbname": settings["NAME"],
        "user": settings["USER"],
        "password": settings["PASSWORD"],
        "sslmode": "disable",
    }
    with psycopg.connect(**params, autocommit=True) as plain:
        assert plain.execute("SELECT 41 + 1").fetchone() == (42,)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE faultproxy_selftest (note text)")
    try:
        # A statement in autocommit: committed, its answer lost.
        fault_proxy.arm(b"INSERT INTO faultproxy_selftest")
        with psycopg.connect(**params, autocommit=True) as conn:
            with pytest.raises(psycopg.OperationalError):
                conn.execute("INSERT INTO faultproxy_selftest VALUES ('autocommit')")

        # In a transaction: the answers inside it go through, the COMMIT's is lost.
        fault_proxy.arm(b"VALUES ('in a transaction')")
        conn = psycopg.connect(**params)
        conn.execute("INSERT INTO faultproxy_selftest VALUES ('in a transaction')")
        assert conn.execute("SELECT count(*) FROM faultproxy_selftest").fetchone() == (2,)
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
        conn.close()

        with connection.cursor() as cursor:
            cursor.execute("SELECT note FROM faultproxy_selftest ORDER BY note")
            assert cursor.fetchall() == [("autocommit",), ("in a transaction",)], "both were committed"
        first, second = fault_proxy.cuts
        assert (first.query, first.after, first.error_seen) == (
            "INSERT INTO faultproxy_selftest VALUES ('autocommit')",
            [],
            False,
        )
        assert second.after == ["SELECT count(*) FROM faultproxy_selftest", "COMMIT"]

        # A trap that never matches cuts nothing; kill_connections() cuts whatever is open.
        fault_proxy.arm(b"never sent")
        with psycopg.connect(**params, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert fault_proxy.kill_connections() == 1
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
        assert len(fault_proxy.cuts) == 2
        assert fault_proxy.connections == 4
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE faultproxy_selftest")


# -- enqueue --------------------------------------------------------------------------------------

ENQUEUE_SCRIPT = """
import json
import django
django.setup()
from django.db import OperationalError, connection
from django_jobs.drivers import pg_wire
from tests import tasks

sent = []
original = pg_wire.send_plain
def recording(*args):
    try:
        answer = original(*args)
    except Exception as exc:
        sent.append(type(exc).__name__)
        raise
    sent.append(answer is not None)
    return answer
pg_wire.send_plain = recording

ids = [tasks.noop.enqueue().id]
try:
    tasks.noop.enqueue()
    lost = "nothing raised"
except OperationalError as exc:
    lost = type(exc).__module__ + "." + type(exc).__name__
connection.close()
ids.append(tasks.noop.enqueue().id)
print(json.dumps({"ids": ids, "lost": lost, "sent": sent}))
"""


def test_an_enqueue_whose_answer_is_lost_raises_django_s_error_and_its_job_exists_once(fault_proxy):
    """A one-job enqueue in autocommit goes through libpq (drivers.pg_wire): the server commits
    it and the answer never comes. The caller gets Django's OperationalError, the job is there
    once (nothing sent it again), and the next enqueue, on a new connection, prepares anew."""
    trap = fault_proxy.arm(b"INSERT INTO django_jobs_job", skip=1)
    done = run_python("-c", ENQUEUE_SCRIPT, env=fault_proxy.env(), timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert trap.fired == 1 and not fired(fault_proxy, trap).error_seen
    assert out["lost"] == "django.db.utils.OperationalError"
    assert out["sent"] == [True, "OperationalError", True]
    rows = Counter(str(job_id) for job_id in Job.objects.values_list("id", flat=True))
    assert len(rows) == 3 and set(rows.values()) == {1}, rows
    assert set(out["ids"]) < set(rows)


# -- claim ---------------------------------------------------------------------------------------


def test_a_claim_whose_answer_is_lost_leaves_no_job_active_and_the_worker_stops_when_empty(
    fault_proxy, worker_process, probe
):
    plain = {f"k{i}": tasks.mark.enqueue(probe, f"k{i}").id for i in range(2)}
    part = {i: tasks_partitions.seq_mark.using(partition="p1").enqueue(probe, "p1", i).id for i in range(3)}
    ids = [*plain.values(), *part.values()]
    trap = fault_proxy.arm(CLAIM)
    proc = worker_process("-c", "4", "--stop-when-empty", env=through(fault_proxy, probe))
    watch = ActiveWatch(ids)

    took = run_until_exit(proc, watch, timeout=20)

    cut = fired(fault_proxy, trap, proc)
    assert cut.rows >= 1, f"the lost claim took no job: {cut}"
    problems = []
    if took is None:
        problems.append("the worker (--stop-when-empty) did not exit within 20 s")
    elif proc.returncode != 0:
        problems.append(f"the worker exited with {proc.returncode}")
    if stuck := watch.over(STUCK_BOUND):
        problems.append(f"jobs active (and run by no one) for longer than {STUCK_BOUND} s: {stuck}")
    states = count_states(ids)
    if states != {"completed": len(ids)}:
        problems.append(f"{cut.rows} job(s) claimed by the lost claim; states now {dict(states)}")
    ran = Counter(r["key"] for r in read_records(probe) if "key" in r) + Counter(
        f"p1/{r['seq']}" for r in read_records(probe) if "seq" in r
    )
    expected = {*plain, *(f"p1/{i}" for i in part)}
    if not_once := {k: ran[k] for k in expected if ran[k] != 1}:
        problems.append(f"jobs that did not run exactly once: {not_once}")
    check(problems, proc)


# -- outcomes ------------------------------------------------------------------------------------


def run_partitions_losing(
    fault_proxy: FaultProxy, worker_process, probe: str, pattern: bytes
) -> tuple[subprocess.Popen, Cut, list[str]]:
    """Two partitions of four 0.3 s jobs on one worker (2 threads); the answer to the third
    statement matching ``pattern`` is lost, mid-run. The PartitionSweeper runs when the worker
    starts, then every 5 s: a partition moves on within a second only if the worker knows its
    outcome was written. Returns the problems found."""
    ids = {
        (p, seq): tasks_partitions.step.using(partition=p).enqueue(probe, p, seq, False, 0.3).id
        for p in ("p1", "p2")
        for seq in range(4)
    }
    trap = fault_proxy.arm(pattern, skip=2)
    proc = worker_process(
        "-c", "2", "--stop-when-empty", env=through(fault_proxy, probe, JOBS_TEST_PROMOTE_INTERVAL="5")
    )
    watch = ActiveWatch(ids.values())
    took = run_until_exit(proc, watch, timeout=25)
    cut = fired(fault_proxy, trap, proc)

    problems = []
    if took is None:
        problems.append("the worker (--stop-when-empty) did not exit within 25 s")
    elif proc.returncode != 0:
        problems.append(f"the worker exited with {proc.returncode}")
    states = count_states(ids.values())
    if states != {"completed": len(ids)}:
        problems.append(f"states {dict(states)}")
    records = read_records(probe)
    ends = Counter((r["partition"], r["seq"]) for r in records if r.get("event") == "end")
    if not_once := {f"{p}/{s}": ends[p, s] for p, s in ids if ends[p, s] != 1}:
        problems.append(f"jobs that did not run exactly once: {not_once}")
    log = read_log(proc)
    if dropped := [line for line in log.splitlines() if "Dropped the" in line]:
        problems.append(f"{len(dropped)} written outcome(s) reported as dropped:\n  " + "\n  ".join(dropped))
    counts = summary_counts(log)
    if counts is None or counts[:2] != (len(ids), len(ids)):
        problems.append(
            f"the stop summary (finished, completed, failed, retried) is {counts}, not {len(ids)} completed"
        )
    finished = Counter(r["id"] for r in records if r.get("event") == "task_finished")
    if wrong := {str(j): finished[str(j)] for j in ids.values() if finished[str(j)] != 1}:
        problems.append(f"task_finished not sent exactly once for: {wrong}")
    times: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("event") in ("start", "end"):
            times[r["partition"]][r["seq"]].setdefault(r["event"], r["t"])
    for p, jobs in sorted(times.items()):
        gaps = [jobs[s + 1]["start"] - jobs[s]["end"] for s in range(3) if "end" in jobs[s] and "start" in jobs[s + 1]]
        if slow := [round(g, 2) for g in gaps if g > 1.0]:
            problems.append(f"partition {p}: its next job started {slow} s after the previous one ended (> 1 s)")
    return proc, cut, problems


def test_an_outcome_batch_whose_answer_is_lost_is_counted_once_and_its_partition_moves_on(
    fault_proxy, worker_process, probe
):
    proc, cut, problems = run_partitions_losing(fault_proxy, worker_process, probe, OUTCOMES)

    assert cut.rows >= 1, f"the lost outcome batch wrote nothing: {cut}"
    check(problems, proc)


def test_a_notify_lost_after_an_outcome_batch_committed_is_counted_once(fault_proxy, worker_process, probe):
    proc, cut, problems = run_partitions_losing(fault_proxy, worker_process, probe, NOTIFY)

    assert any(q.startswith(OUTCOMES_START) for q in cut.before), (
        f"the lost NOTIFY did not follow an outcome batch: {cut}"
    )
    check(problems, proc)


# -- release -------------------------------------------------------------------------------------


def test_a_release_whose_answer_is_lost_leaves_the_job_to_the_next_worker(fault_proxy, worker_process, probe):
    result = tasks.sleep_then_mark.enqueue(probe, "long", 3)
    trap = fault_proxy.arm(RELEASE)
    a = worker_process("--grace", "1", "--worker-id", "worker-a", env=through(fault_proxy, probe))
    wait_until(lambda: read_records(probe), timeout=20, message="worker A to start the job")

    a.send_signal(signal.SIGTERM)
    assert a.wait(20) == 0, read_log(a)
    cut = fired(fault_proxy, trap, a)
    assert cut.rows == 1, f"the lost release did not release the job: {cut}"
    log_a = read_log(a)
    assert "could not release" not in log_a, "the release committed; a retry on a new connection finds nothing left"
    job = Job.objects.get(id=result.id)
    stranded = job.state == "active" and job.worker_id == "worker-a"

    stopped = time.monotonic()
    b = worker_process("--worker-id", "worker-b", env={"JOBS_TEST_LEASE": str(LEASE)})
    wait_until(
        lambda: Job.objects.get(id=result.id).state == "completed",
        timeout=3 + STUCK_BOUND + 10,
        message="worker B to run the job",
    )
    took = time.monotonic() - stopped
    b.send_signal(signal.SIGTERM)
    assert b.wait(20) == 0, read_log(b)

    problems = []
    if stranded:
        problems.append(f"worker A left the job active under its name after its release: {job.state}")
    if took > 3 + STUCK_BOUND + 5:  # + a fresh worker process starting on a loaded machine
        problems.append(f"the job completed {took:.1f} s after worker A stopped (> {3 + STUCK_BOUND + 5} s)")
    starts = [r["pid"] for r in read_records(probe) if r["event"] == "start"]
    ends = [r["pid"] for r in read_records(probe) if r["event"] == "end"]
    if (starts, ends) != ([a.pid, b.pid], [b.pid]):
        problems.append(f"starts {starts}, ends {ends}: not released by A ({a.pid}) and run once by B ({b.pid})")
    check(problems, a)


# -- cancel --------------------------------------------------------------------------------------


def test_a_cancel_whose_answer_is_lost_still_cancels_the_running_job_and_says_so(fault_proxy, worker_process, probe):
    result = tasks.until_cancelled.enqueue(probe)
    # The worker talks to PostgreSQL directly; only the `jobs cancel` command goes through the proxy.
    worker = worker_process("--worker-id", "worker-c", env={"JOBS_TEST_LEASE": str(LEASE)})
    wait_until(lambda: read_records(probe), timeout=20, message="the worker to start the job")

    trap = fault_proxy.arm(CANCEL_FLAG)
    command = run_python("-m", "django", "jobs", "cancel", str(result.id), env=fault_proxy.env(), timeout=60)
    cut = fired(fault_proxy, trap)
    assert cut.after and cut.after[-1] == "COMMIT", f"the trapped cancel was not committed: {cut}"
    output = f"exit code {command.returncode}\nstdout:\n{command.stdout}\nstderr:\n{command.stderr}"

    wait_until(
        lambda: Job.objects.get(id=result.id).state != "active", timeout=10, message="the job to end after the cancel"
    )
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0, read_log(worker)

    problems = []
    if "Traceback" in command.stderr + command.stdout:
        problems.append(f"`jobs cancel` ended with a traceback:\n{output}")
    elif command.returncode == 0 and f"{result.id}: cancelled" not in command.stdout:
        problems.append(f"`jobs cancel` exited 0 without saying the job was cancelled:\n{output}")
    elif command.returncode != 0 and str(result.id) not in command.stderr:
        problems.append(f"`jobs cancel` failed without a clear error naming the job:\n{output}")
    job = Job.objects.get(id=result.id)
    if job.state != "cancelled":
        problems.append(f"the job ended {job.state}, not cancelled")
    if [r["event"] for r in read_records(probe)] != ["start", "noticed"]:
        problems.append(f"the task did not notice the cancel: {read_records(probe)}")
    check(problems, worker)

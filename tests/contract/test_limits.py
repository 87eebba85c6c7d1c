"""Queue limits: the setters' validation, concurrency and rate limits (the fast claim skips gated
queues, claim_gated_jobs holds them, under racing threads and with real worker processes), max
size and QueueFull on every insert path (also under racing enqueuers), DJANGO_JOBS["QUEUES"]
sync and its system check, and pauses of gated queues.

Contract tests on both databases; time is a parameter (``now=``) wherever the engine takes it.
"""

from __future__ import annotations

import logging
import math
import re
import signal
import threading
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from django.db import connection, transaction
from django.tasks import task_backends
from django.utils import timezone

import django_jobs
from django_jobs import Dedup, QueueFull, engine, flow, schedules
from django_jobs.engine import Outcome
from django_jobs.exceptions import JobsConfigurationError
from django_jobs.models import Job, JobDependency, JobStart, QueueState, Schedule, Worker
from django_jobs.models.dedup import JobDedup, JobDedupNext
from django_jobs.queues import InvalidQueueSetting, QueueLimits, sync_queues
from tests import factories, tasks_limits
from tests.conftest import read_log, wait_until
from tests.factories import jobs_settings, lock_waiters, race, race_scripts
from tests.tasks import read_records

UNFINISHED = ["waiting", "delayed", "active", "waiting-children"]


# -- helpers ------------------------------------------------------------------------------------

#: The factories as these tests claim: up to 10 jobs, as worker "w".
claim = partial(factories.claim, limit=10, worker_id="w")
claim_gated = partial(factories.claim_gated, limit=10, worker_id="w")


def finish(jobs: list, state: str = "completed") -> None:
    written = engine.record_outcomes(
        [Outcome(job_id=j.id, lease_token=j.lease_token, state=state, queue=j.queue) for j in jobs], using="default"
    )
    assert len(written) == len(jobs)


def enqueue(queue: str, n: int = 1, **options) -> list:
    task = tasks_limits.quick.using(queue_name=queue, **options)
    return [task.enqueue() for _ in range(n)]


def active(queue: str) -> int:
    return Job.objects.filter(queue=queue, state="active").count()


def unfinished(queue: str) -> int:
    return Job.objects.filter(queue=queue, state__in=UNFINISHED).count()


def ids(jobs) -> set[str]:
    return {str(j.id) for j in jobs}


def max_overlap(records: list[dict]) -> int:
    """The most intervals (a start and an end record per key) open at one instant; at equal
    times an end comes before a start."""
    events = sorted((r["at"], 1 if r["event"] == "start" else 0) for r in records)
    open_now = best = 0
    for _, is_start in events:
        open_now += 1 if is_start else -1
        best = max(best, open_now)
    return best


def max_starts_in_window(times: list[datetime], window: timedelta) -> int:
    """The most of ``times`` in any half-open window [t, t + window)."""
    times = sorted(times)
    best, j = 0, 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < start + window:
            j += 1
        best = max(best, j - i)
    return best


def wait_until_blocked(thread: threading.Thread) -> None:
    """Return once ``thread`` waits for a lock this test's open transaction holds. PostgreSQL
    shows it (a backend of the test database waiting on a lock, read on a second connection);
    SQLite's busy wait cannot be seen, so there the thread gets half a second to reach it."""
    if connection.vendor == "postgresql":
        other = connection.copy()
        try:
            wait_until(lambda: lock_waiters(other), timeout=15, message="the other thread to wait for the lock")
        finally:
            other.close()
    else:
        thread.join(0.5)
    assert thread.is_alive(), "the other thread did not wait for the lock"


def t0() -> datetime:
    """A whole second (an exact boundary for the window arithmetic) just past."""
    return timezone.now().replace(microsecond=0) - timedelta(seconds=1)


# -- 1. API validation ------------------------------------------------------------------------

COUNT_SETTINGS = ["concurrency", "max_size", "partition_concurrency", "partition_max_size"]
BAD_COUNTS = [0, -1, True, False, 1.5, 2.0, "3", [3]]


def test_invalid_queue_setting_is_a_value_error():
    assert issubclass(InvalidQueueSetting, ValueError)


@pytest.mark.django_db
@pytest.mark.parametrize("setting", COUNT_SETTINGS)
@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
def test_a_count_limit_must_be_an_integer_of_at_least_1(setting, value):
    q = django_jobs.queue("validated")
    q.configure(**{setting: 4})
    setter = getattr(q, f"set_{setting}")
    for attempt in (lambda: setter(value), lambda: q.configure(**{setting: value})):
        with pytest.raises(InvalidQueueSetting, match=rf"^{setting} must be an integer >= 1") as raised:
            attempt()
        assert repr(value) in str(raised.value)
    assert getattr(q.limits, setting) == 4, "a refused value must not be written"


BAD_RATES = [
    ((0, 1.0), "max_jobs must be an integer >= 1"),
    ((-3, 1.0), "max_jobs must be an integer >= 1"),
    ((True, 1.0), "max_jobs must be an integer >= 1"),
    ((2.5, 1.0), "max_jobs must be an integer >= 1"),
    (("5", 1.0), "max_jobs must be an integer >= 1"),
    ((5, 0), "per_seconds must be a number of seconds > 0"),
    ((5, 0.0), "per_seconds must be a number of seconds > 0"),
    ((5, -1.0), "per_seconds must be a number of seconds > 0"),
    ((5, math.inf), "per_seconds must be a number of seconds > 0"),
    ((5, math.nan), "per_seconds must be a number of seconds > 0"),
    ((5, True), "per_seconds must be a number of seconds > 0"),
    ((5, "1"), "per_seconds must be a number of seconds > 0"),
    ((5, None), "per_seconds must be a number of seconds > 0"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("setting", ["rate_limit", "partition_rate_limit"])
@pytest.mark.parametrize(("value", "problem"), BAD_RATES, ids=[repr(value) for value, _ in BAD_RATES])
def test_a_rate_limit_needs_a_positive_count_and_a_finite_positive_window(setting, value, problem):
    q = django_jobs.queue("validated")
    q.configure(**{setting: (7, 3.0)})
    setter = getattr(q, f"set_{setting}")
    for attempt in (lambda: setter(*value), lambda: q.configure(**{setting: value})):
        with pytest.raises(InvalidQueueSetting, match=rf"^{setting}: {problem}"):
            attempt()
    assert getattr(q.limits, setting) == (7, 3.0)


@pytest.mark.django_db
@pytest.mark.parametrize("setting", ["rate_limit", "partition_rate_limit"])
@pytest.mark.parametrize("value", [5, (5,), (5, 1.0, 2), [], "5/s", {5: 1.0}], ids=repr)
def test_a_rate_limit_must_be_a_pair(setting, value):
    q = django_jobs.queue("validated")
    with pytest.raises(InvalidQueueSetting, match=rf"^{setting} must be \(max_jobs, per_seconds\)"):
        q.configure(**{setting: value})
    assert not QueueState.objects.filter(name="validated").exists()


@pytest.mark.django_db
def test_configure_refuses_unknown_keys_and_bad_flags_and_writes_nothing_then():
    q = django_jobs.queue("validated")
    with pytest.raises(InvalidQueueSetting, match=r"^Unknown queue setting 'speed'; allowed: paused, concurrency"):
        q.configure(concurrency=2, speed=3)
    with pytest.raises(InvalidQueueSetting, match=r"^paused must be True or False; got 1"):
        q.configure(paused=1)
    with pytest.raises(InvalidQueueSetting, match=r"^max_size must be an integer >= 1"):
        q.configure(concurrency=2, rate_limit=(3, 1.0), max_size=0)
    assert q.limits == QueueLimits()
    assert not QueueState.objects.filter(name="validated").exists()


@pytest.mark.django_db
def test_limits_reflect_what_was_set_and_none_removes_each_limit():
    q = django_jobs.queue("shown")
    assert q.limits == QueueLimits()
    q.configure(
        paused=True,
        concurrency=3,
        rate_limit=(20, 2),
        max_size=100,
        partition_concurrency=2,
        partition_rate_limit=[4, 0.5],
        partition_max_size=10,
    )
    assert q.limits == QueueLimits(True, 3, (20, 2.0), 100, 2, (4, 0.5), 10)
    assert type(q.limits.rate_limit[1]) is float
    assert django_jobs.queue("other").limits == QueueLimits(), "limits belong to one queue"

    q.set_concurrency(None)
    assert q.limits.concurrency is None
    q.set_rate_limit(None)
    assert q.limits.rate_limit is None
    q.set_max_size(None)
    assert q.limits.max_size is None
    q.set_partition_concurrency(None)
    assert q.limits.partition_concurrency is None
    q.set_partition_rate_limit(None)
    assert q.limits.partition_rate_limit is None
    q.configure(partition_max_size=None, paused=False)
    assert q.limits == QueueLimits()

    q.set_concurrency(5)
    q.set_rate_limit(9)  # per_seconds defaults to 1.0
    q.set_max_size(8)
    q.set_partition_concurrency(3)
    q.set_partition_rate_limit(2, per_seconds=60)
    q.set_partition_max_size(1)
    assert q.limits == QueueLimits(False, 5, (9, 1.0), 8, 3, (2, 60.0), 1)
    q.configure(concurrency=None, rate_limit=None, max_size=None, partition_concurrency=None,
                partition_rate_limit=None, partition_max_size=None)  # fmt: skip
    assert q.limits == QueueLimits()
    # Removed for real: the fast claim takes the queue's jobs again.
    [job] = enqueue("shown")
    assert ids(claim(queues=["shown"])) == {job.id}


@pytest.mark.django_db
def test_removing_a_rate_limit_deletes_its_start_log_only():
    q, bystander = django_jobs.queue("logged"), django_jobs.queue("bystander")
    q.configure(rate_limit=(10, 60), partition_rate_limit=(10, 60))
    bystander.set_rate_limit(10, 60)
    enqueue("logged", 2)
    enqueue("logged", partition="a")
    enqueue("logged", partition="b")
    enqueue("bystander")
    assert len(claim_gated("logged")[0]) == 4
    assert len(claim_gated("bystander")[0]) == 1
    starts = JobStart.objects.filter(queue="logged")
    assert starts.filter(partition_key="").count() == 4
    assert sorted(starts.exclude(partition_key="").values_list("partition_key", flat=True)) == ["a", "b"]

    q.set_concurrency(3)  # another change keeps the log
    assert starts.count() == 6
    q.set_rate_limit(None)
    assert starts.filter(partition_key="").count() == 0
    assert starts.exclude(partition_key="").count() == 2
    q.set_partition_rate_limit(None)
    assert starts.count() == 0
    assert JobStart.objects.filter(queue="bystander").count() == 1


# -- 2. concurrency limit ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "limits",
    [
        {"concurrency": 5},
        {"rate_limit": (100, 1.0)},
        {"partition_rate_limit": (100, 1.0)},
        {"partition_concurrency": 2},
    ],
    ids=lambda d: next(iter(d)),
)
def test_the_fast_claim_never_takes_jobs_of_a_gated_queue(limits):
    django_jobs.queue("gated").configure(**limits)
    gated = enqueue("gated", 3)
    free = enqueue("free", 2)
    assert ids(claim(limit=10)) == ids(free)
    assert claim(queues=["gated"]) == []
    assert engine.gated_queues(using="default", queues=None) == ["gated"]
    assert engine.gated_queues(using="default", queues=["free"]) == []
    jobs, wake = claim_gated("gated")
    assert (ids(jobs), wake) == (ids(gated), None)


@pytest.mark.django_db
@pytest.mark.parametrize("limits", [{"max_size": 5}, {"partition_concurrency": 1}, {"partition_max_size": 2}])
def test_limits_that_do_not_gate_leave_the_queue_to_the_fast_claim(limits):
    django_jobs.queue("ungated").configure(**limits)
    jobs = enqueue("ungated", 2)
    assert engine.gated_queues(using="default", queues=None) == []
    assert ids(claim(queues=["ungated"])) == ids(jobs)


@pytest.mark.django_db
def test_claim_gated_jobs_keeps_the_active_jobs_of_the_queue_at_the_limit():
    q = django_jobs.queue("conc")
    q.set_concurrency(3)
    enqueue("conc", 9)
    enqueue("bystander", 2)
    first, wake = claim_gated("conc", limit=2)
    assert (len(first), wake) == (2, None)
    second, _ = claim_gated("conc", limit=10)
    assert len(second) == 1
    assert claim_gated("conc") == ([], None)
    assert active("conc") == 3
    # Other queues do not count and are not claimed.
    assert all(j.queue == "conc" for j in first + second)
    assert len(claim(queues=["bystander"])) == 2
    assert claim_gated("conc") == ([], None)

    finish(first)
    third, _ = claim_gated("conc")
    assert len(third) == 2 and active("conc") == 3
    # A lowered limit: running jobs finish, none starts until the queue is below it.
    q.set_concurrency(1)
    finish(second)
    assert claim_gated("conc") == ([], None)
    finish(third[:1], state="failed")  # a failure frees a slot too
    assert claim_gated("conc") == ([], None)
    finish(third[1:])
    fourth, _ = claim_gated("conc")
    assert len(fourth) == 1 and active("conc") == 1
    assert Job.objects.filter(queue="conc", state="waiting").count() == 3


@pytest.mark.django_db(transaction=True)
def test_racing_threads_never_claim_past_the_concurrency_limit():
    limit, total, racers = 4, 23, 6
    django_jobs.queue("raced").set_concurrency(limit)
    enqueue("raced", total)
    running: list = []
    rounds = 0
    while Job.objects.filter(queue="raced", state="waiting").exists():
        rounds += 1
        waiting = Job.objects.filter(queue="raced", state="waiting").count()
        expected = min(limit, len(running) + waiting)

        def racer(i: int) -> list:
            got: list = []
            for _ in range(3):  # each thread tries more than once: every slot is fought over
                got += claim_gated("raced", limit=3, worker_id=f"racer-{i}")[0]
            return got

        claimed = [j for got in race(racers, racer) for j in got]
        running += claimed
        assert active("raced") == len(running) == expected, f"round {rounds}"
        assert len(ids(claimed)) == len(claimed), "a job was claimed twice"
        # Finish three of them (the oldest first): the next round races for those slots only.
        finish(running[:3])
        running = running[3:]
    finish(running)
    assert Job.objects.filter(queue="raced", state="completed").count() == total
    assert rounds >= 6


@pytest.mark.django_db(transaction=True)
def test_threads_claiming_and_finishing_at_once_never_pass_the_concurrency_limit():
    limit, total, racers = 3, 48, 5
    django_jobs.queue("churn").set_concurrency(limit)
    enqueue("churn", total)
    done = threading.Event()
    samples: list[int] = []

    def observer() -> None:
        try:
            while not done.wait(0.002):  # a sample every ~2 ms
                samples.append(active("churn"))
        finally:
            connection.close()

    def racer(i: int) -> int:
        ran = 0
        while Job.objects.filter(queue="churn", state__in=["waiting", "active"]).exists():
            jobs, _ = claim_gated("churn", limit=2, worker_id=f"churner-{i}")
            finish(jobs)
            ran += len(jobs)
        return ran

    watching = threading.Thread(target=observer)
    watching.start()
    try:
        ran = race(racers, racer)
    finally:
        done.set()
        watching.join(30)
    assert sum(ran) == total
    assert Job.objects.filter(queue="churn", state="completed").count() == total
    assert samples and max(samples) <= limit


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_worker_processes_together_run_exactly_the_concurrency_limit_at_once(worker_process, probe):
    limit, total = 3, 60
    django_jobs.queue("conc-real").set_concurrency(limit)
    names = ["limits-conc-a", "limits-conc-b"]
    # Two slots each: reaching the limit of 3 takes both processes, so the limit is enforced
    # across them (with more slots one process could hold every running job by itself).
    procs = [worker_process("-q", "conc-real", "-c", "2", "--sleep", "0.05", "--worker-id", name) for name in names]
    wait_until(lambda: Worker.objects.filter(id__in=names).count() == 2, timeout=30, message="both workers")
    tasks_limits.span.using(queue_name="conc-real").enqueue_many([(probe, i, 0.1) for i in range(total)])
    wait_until(
        lambda: Job.objects.filter(queue="conc-real", state="completed").count() == total,
        timeout=60,
        message=f"{total} jobs to complete",
    )
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(30) == 0, read_log(p)
    records = read_records(probe)
    assert sorted(r["key"] for r in records if r["event"] == "start") == list(range(total))
    assert max_overlap(records) == limit, "at most the limit at once, and the limit reached"
    assert len({r["pid"] for r in records}) == 2, "both processes ran jobs"


# -- 3. rate limit ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_rate_limit_allows_its_count_per_window_and_says_when_the_next_may_start():
    start = t0()
    django_jobs.queue("rated").set_rate_limit(3, 10)
    enqueue("rated", 10)
    first, wake = claim_gated("rated", limit=10, now=start)
    assert (len(first), wake) == (3, None)
    assert {j.last_attempted_at for j in first} == {start}
    assert claim_gated("rated", now=start) == ([], 10.0)
    # Finished jobs do not give their starts back: the rate counts starts, not running jobs.
    finish(first)
    assert claim_gated("rated", now=start + timedelta(seconds=5)) == ([], 5.0)
    assert claim_gated("rated", now=start + timedelta(seconds=9.999999)) == ([], pytest.approx(0.000001))
    later = start + timedelta(seconds=10, microseconds=1)
    second, wake = claim_gated("rated", limit=10, now=later)
    assert (len(second), wake) == (3, None)
    assert {j.last_attempted_at for j in second} == {later}
    assert list(JobStart.objects.filter(queue="rated").values_list("started_at", flat=True)) == [later] * 3
    assert Job.objects.filter(queue="rated", state="waiting").count() == 4


@pytest.mark.django_db
def test_the_rate_window_slides_with_each_start_instead_of_resetting():
    start = t0()

    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)

    django_jobs.queue("sliding").set_rate_limit(3, 10)
    enqueue("sliding", 12)
    assert len(claim_gated("sliding", limit=2, now=at(0))[0]) == 2
    assert len(claim_gated("sliding", limit=10, now=at(9))[0]) == 1
    assert claim_gated("sliding", now=at(9.5)) == ([], pytest.approx(0.5))
    # A fixed window [10, 20) would allow 3 now; the start at 9 is still within the last 10 s.
    jobs, wake = claim_gated("sliding", limit=10, now=at(10.5))
    assert (len(jobs), wake) == (2, None)
    assert claim_gated("sliding", now=at(10.5)) == ([], pytest.approx(8.5))
    assert len(claim_gated("sliding", limit=10, now=at(19.000001))[0]) == 1
    assert claim_gated("sliding", now=at(20)) == ([], pytest.approx(0.5))
    assert len(claim_gated("sliding", limit=10, now=at(20.500001))[0]) == 2
    starts = sorted(Job.objects.filter(queue="sliding").exclude(last_attempted_at=None).values_list(
        "last_attempted_at", flat=True))  # fmt: skip
    assert len(starts) == 8
    assert max_starts_in_window(starts, timedelta(seconds=10)) == 3


@pytest.mark.django_db
def test_concurrency_and_rate_limits_hold_together():
    start = t0()
    django_jobs.queue("both").configure(concurrency=2, rate_limit=(3, 10))
    enqueue("both", 6)
    first, wake = claim_gated("both", limit=10, now=start)
    assert (len(first), wake) == (2, None)
    finish(first)
    assert len(claim_gated("both", limit=10, now=start + timedelta(seconds=1))[0]) == 1
    assert claim_gated("both", limit=10, now=start + timedelta(seconds=2)) == ([], 8.0)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_worker_processes_together_keep_to_the_rate_limit(worker_process):
    per, window, total = 5, 0.5, 40
    django_jobs.queue("rate-real").set_rate_limit(per, window)
    names = ["limits-rate-a", "limits-rate-b"]
    procs = [worker_process("-q", "rate-real", "-c", "4", "--sleep", "0.2", "--worker-id", name) for name in names]
    wait_until(lambda: Worker.objects.filter(id__in=names).count() == 2, timeout=30, message="both workers")
    enqueue_many = tasks_limits.quick.using(queue_name="rate-real").enqueue_many
    enqueue_many([()] * total)
    wait_until(
        lambda: Job.objects.filter(queue="rate-real", state="completed").count() == total,
        timeout=60,
        message=f"{total} jobs to complete",
    )
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(30) == 0, read_log(p)
    jobs = Job.objects.filter(queue="rate-real")
    starts = sorted(jobs.values_list("last_attempted_at", flat=True))
    assert len(starts) == total
    assert max_starts_in_window(starts, timedelta(seconds=window)) == per
    spread = (starts[-1] - starts[0]).total_seconds()
    least = (total / per - 1) * window  # 3.5 s: what the limit itself allows at best
    assert least <= spread < least * 3 + 2, f"{total} starts took {spread:.2f}s"
    assert {w for j in jobs for w in j.worker_ids} == set(names), "both processes started jobs"


# -- 4. max size, QueueFull -------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_past_the_max_size_raises_queue_full_and_inserts_nothing():
    django_jobs.queue("bp").set_max_size(3)
    enqueue("bp", 3)
    with pytest.raises(QueueFull) as raised:
        enqueue("bp")
    exc = raised.value
    assert (exc.queue, exc.partition, exc.size, exc.limit, exc.adding) == ("bp", None, 3, 3, 1)
    message = str(exc)
    assert message.startswith("Queue 'bp' is full: 3 unfinished job(s), max size 3; this job would pass it")
    assert "django_jobs.queue('bp').set_max_size(...)" in message
    assert unfinished("bp") == 3
    assert django_jobs.QueueFull is QueueFull
    # Other queues are not limited.
    enqueue("unlimited", 5)


@pytest.mark.django_db
def test_every_unfinished_state_takes_room_and_a_finished_job_frees_it():
    django_jobs.queue("bp").set_max_size(5)
    enqueue("bp")
    enqueue("bp", run_after=timedelta(hours=1))  # delayed
    [running] = claim(queues=["bp"])  # active
    [waiting] = enqueue("bp")
    in_bp = tasks_limits.quick.using(queue_name="bp")
    flow(in_bp, children=[flow(in_bp)]).enqueue()  # waiting-children and waiting
    assert django_jobs.queue("bp").counts() == {"waiting": 2, "delayed": 1, "active": 1, "waiting-children": 1}
    with pytest.raises(QueueFull, match="5 unfinished job"):
        enqueue("bp")
    finish([running])
    enqueue("bp")  # the completed job left room for one
    with pytest.raises(QueueFull):
        enqueue("bp")
    [failing] = claim(queues=["bp"], limit=1)
    assert str(failing.id) == waiting.id
    finish([failing], state="failed")
    enqueue("bp")
    assert unfinished("bp") == 5
    with pytest.raises(QueueFull):
        enqueue("bp")


@pytest.mark.django_db
def test_lifting_or_lowering_the_max_size():
    q = django_jobs.queue("bp")
    q.set_max_size(2)
    enqueue("bp", 2)
    with pytest.raises(QueueFull):
        enqueue("bp")
    q.set_max_size(None)
    enqueue("bp", 3)
    assert unfinished("bp") == 5
    q.set_max_size(3)  # below the jobs stored: they stay, nothing more gets in
    with pytest.raises(QueueFull) as raised:
        enqueue("bp")
    assert raised.value.limit == 3
    assert unfinished("bp") == 5


@pytest.mark.django_db
def test_jobs_enqueued_earlier_in_the_callers_transaction_count():
    django_jobs.queue("bp").set_max_size(3)
    with transaction.atomic():
        enqueue("bp", 3)
        with pytest.raises(QueueFull) as raised:
            enqueue("bp")
        assert raised.value.size == 3
        enqueue("other")  # the caller's transaction goes on
    assert unfinished("bp") == 3
    assert unfinished("other") == 1


@pytest.mark.django_db(transaction=True)
def test_a_concurrent_enqueuer_waits_for_the_callers_transaction_and_counts_its_jobs():
    django_jobs.queue("bp").set_max_size(3)
    outcome: list = []

    def other_enqueuer() -> None:
        try:
            tasks_limits.quick.using(queue_name="bp").enqueue_many([(), ()])
            outcome.append("inserted")
        except QueueFull as exc:
            outcome.append(exc)
        finally:
            connection.close()

    with transaction.atomic():
        enqueue("bp", 2)
        thread = threading.Thread(target=other_enqueuer)
        thread.start()
        wait_until_blocked(thread)
        assert outcome == [], "the other enqueuer must wait for this transaction"
    thread.join(30)
    assert not thread.is_alive()
    [exc] = outcome
    assert isinstance(exc, QueueFull), exc
    assert (exc.size, exc.limit, exc.adding) == (2, 3, 2)
    assert unfinished("bp") == 2


@pytest.mark.django_db
def test_enqueue_many_is_refused_as_a_whole_when_it_would_pass_the_max_size():
    django_jobs.queue("bp").set_max_size(5)
    enqueue("bp", 3)
    task = tasks_limits.quick.using(queue_name="bp")
    with pytest.raises(QueueFull) as raised:
        task.enqueue_many([(), (), ()])
    assert (raised.value.size, raised.value.limit, raised.value.adding) == (3, 5, 3)
    assert "these 3 jobs would pass it" in str(raised.value)
    assert unfinished("bp") == 3
    assert len(task.enqueue_many([(), ()])) == 2
    assert unfinished("bp") == 5


@pytest.mark.django_db
def test_enqueue_many_spanning_several_chunks_is_refused_as_a_whole():
    assert engine.INSERT_CHUNK == 500
    django_jobs.queue("bp").set_max_size(600)
    task = tasks_limits.quick.using(queue_name="bp")
    with transaction.atomic():
        enqueue("bp")  # the caller's own job: it stays, the batch goes
        with pytest.raises(QueueFull) as raised:
            task.enqueue_many([()] * 700)  # the first chunk of 500 fits, the second does not
    assert (raised.value.size, raised.value.limit, raised.value.adding) == (1, 600, 700)
    assert unfinished("bp") == 1
    assert len(task.enqueue_many(() for _ in range(599))) == 599
    assert unfinished("bp") == 600
    with pytest.raises(QueueFull):
        enqueue("bp")


@pytest.mark.django_db
def test_a_dedup_enqueue_on_a_full_queue_takes_no_key_and_a_duplicate_still_returns_its_holder():
    django_jobs.queue("bp").set_max_size(2)
    [holder] = enqueue("bp", dedup=Dedup("held"))
    enqueue("bp")
    with pytest.raises(QueueFull):
        enqueue("bp", dedup=Dedup("new"))
    assert not JobDedup.objects.filter(key="new").exists()
    [duplicate] = enqueue("bp", dedup=Dedup("held"))
    assert (duplicate.id, duplicate.duplicate) == (holder.id, True)
    task = tasks_limits.quick.using(queue_name="bp", dedup=Dedup(lambda args, kwargs: f"k{args[0]}"))
    with pytest.raises(QueueFull):
        task.enqueue_many([(1,), (2,)])
    assert unfinished("bp") == 2
    finish(claim(queues=["bp"], limit=1))
    [new] = enqueue("bp", dedup=Dedup("new"))
    assert not new.duplicate and JobDedup.objects.filter(key="new").exists()


@pytest.mark.django_db
def test_an_idempotency_key_enqueue_on_a_full_queue_returns_an_existing_job_and_refuses_a_new_one():
    django_jobs.queue("bp").set_max_size(2)
    [first] = enqueue("bp", idempotency_key="order-1")
    enqueue("bp")
    [again] = enqueue("bp", idempotency_key="order-1")
    assert (again.id, again.duplicate) == (first.id, True)
    with pytest.raises(QueueFull):
        enqueue("bp", idempotency_key="order-2")
    assert not Job.objects.filter(idempotency_key="order-2").exists()
    # Finished, the key still names its job (and the job no longer takes room).
    finish([j for j in claim(queues=["bp"]) if str(j.id) == first.id])
    [third] = enqueue("bp", idempotency_key="order-1")
    assert (third.id, third.duplicate) == (first.id, True)
    [second] = enqueue("bp", idempotency_key="order-2")
    assert not second.duplicate and unfinished("bp") == 2


@pytest.mark.django_db(transaction=True)
def test_an_idempotency_key_committed_while_waiting_for_a_full_queue_returns_that_job():
    """The key's job commits while a second enqueue of the same key waits for the queue's lock:
    the second is a duplicate (as on a queue without a max size), not QueueFull."""
    django_jobs.queue("bp").set_max_size(1)
    outcome: list = []

    def same_key() -> None:
        try:
            outcome.append(tasks_limits.quick.using(queue_name="bp", idempotency_key="once").enqueue())
        except QueueFull as exc:
            outcome.append(exc)
        finally:
            connection.close()

    with transaction.atomic():
        [first] = enqueue("bp", idempotency_key="once")
        thread = threading.Thread(target=same_key)
        thread.start()
        wait_until_blocked(thread)
    thread.join(30)
    assert not thread.is_alive()
    [result] = outcome
    assert not isinstance(result, QueueFull), f"a duplicate of a committed key raised: {result}"
    assert (result.id, result.duplicate) == (first.id, True)


@pytest.mark.django_db
def test_a_flow_that_would_pass_a_max_size_is_refused_as_a_whole():
    django_jobs.queue("bp").set_max_size(3)
    enqueue("bp")
    in_bp = tasks_limits.quick.using(queue_name="bp")
    elsewhere = tasks_limits.quick.using(queue_name="roomy")
    with pytest.raises(QueueFull) as raised:
        flow(elsewhere, children=[flow(in_bp), flow(in_bp), flow(in_bp)]).enqueue()
    assert (raised.value.queue, raised.value.size, raised.value.limit, raised.value.adding) == ("bp", 1, 3, 3)
    assert not Job.objects.filter(queue="roomy").exists()
    assert unfinished("bp") == 1
    assert not JobDependency.objects.exists()
    root = flow(elsewhere, children=[flow(in_bp), flow(in_bp)]).enqueue()
    assert unfinished("bp") == 3
    assert JobDependency.objects.filter(parent_id=root.id).count() == 2


T_SCHED = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.django_db
def test_a_schedule_tick_on_a_full_queue_is_skipped_and_the_schedule_advances(caplog):
    django_jobs.queue("bp-sched").set_max_size(1)
    row = schedules.schedule("full", tasks_limits.quick, every=60, queue="bp-sched")
    Schedule.objects.filter(pk=row.pk).update(next_run_at=T_SCHED)
    enqueue("bp-sched")
    with caplog.at_level(logging.WARNING, logger="django_jobs.engine"):
        schedules.fire_due(backend="default", now=T_SCHED + timedelta(seconds=1))
    assert not Job.objects.filter(scheduler_key__isnull=False).exists()
    row.refresh_from_db()
    assert row.next_run_at == T_SCHED + timedelta(seconds=60)
    [warning] = [r for r in caplog.records if r.name == "django_jobs.engine" and r.levelno == logging.WARNING]
    assert "was not enqueued" in warning.getMessage() and "Queue 'bp-sched' is full" in warning.getMessage()
    # Room again: the next tick fires.
    finish(claim(queues=["bp-sched"]))
    schedules.fire_due(backend="default", now=T_SCHED + timedelta(seconds=61))
    [job] = Job.objects.filter(scheduler_key__isnull=False)
    assert job.scheduler_key == f"{row.pk}@{(T_SCHED + timedelta(seconds=60)).isoformat()}"


@pytest.mark.django_db
def test_a_tick_skipped_by_a_full_queue_is_not_counted_as_fired():
    """Schedule.iterations counts the ticks fired (``limit`` stops the schedule after that many):
    a tick whose job QueueFull refused enqueued nothing."""
    django_jobs.queue("bp-sched").set_max_size(1)
    row = schedules.schedule("limited", tasks_limits.quick, every=60, queue="bp-sched", limit=1)
    Schedule.objects.filter(pk=row.pk).update(next_run_at=T_SCHED)
    enqueue("bp-sched")
    counts = schedules.fire_due(backend="default", now=T_SCHED + timedelta(seconds=1))
    row.refresh_from_db()
    assert not Job.objects.filter(scheduler_key__isnull=False).exists()
    # Not fired, not counted, and a schedule limited to one tick has that tick still to fire.
    assert (counts["fired"], row.iterations, row.next_run_at) == (0, 0, T_SCHED + timedelta(seconds=60))


@pytest.mark.django_db
def test_a_partition_max_size_names_the_partition_and_leaves_other_partitions_alone():
    django_jobs.queue("bp-part").set_partition_max_size(2)
    enqueue("bp-part", 2, partition="customer-1")
    with pytest.raises(QueueFull) as raised:
        enqueue("bp-part", partition="customer-1")
    exc = raised.value
    assert (exc.queue, exc.partition, exc.size, exc.limit, exc.adding) == ("bp-part", "customer-1", 2, 2, 1)
    assert str(exc).startswith("Partition 'customer-1' of queue 'bp-part' is full: 2 unfinished job(s), max size 2")
    assert "django_jobs.queue('bp-part').set_partition_max_size(...)" in str(exc)
    with pytest.raises(QueueFull, match="Partition 'customer-1'"):
        tasks_limits.quick.using(queue_name="bp-part", partition="customer-1").enqueue_many([()])
    enqueue("bp-part", 2, partition="customer-2")
    enqueue("bp-part", 5)  # jobs without a partition are not counted against it
    assert Job.objects.filter(queue="bp-part", partition_key="customer-1").count() == 2
    # Both limits: the queue's counts every partition.
    django_jobs.queue("bp-part").set_max_size(9)
    with pytest.raises(QueueFull) as raised:
        enqueue("bp-part", partition="customer-3")
    assert (raised.value.partition, raised.value.size, raised.value.limit) == (None, 9, 9)


@pytest.mark.django_db
def test_a_stashed_dedup_enqueue_waits_while_its_queue_is_full():
    django_jobs.queue("bp-stash").set_max_size(1)
    task = tasks_limits.quick.using(queue_name="bp-stash", dedup=Dedup("only", keep_last_if_active=True))
    task.enqueue()
    [holder] = claim(queues=["bp-stash"])
    assert task.enqueue().duplicate
    assert JobDedupNext.objects.count() == 1
    finish([holder])
    enqueue("bp-stash")  # full again before the stash is promoted
    assert engine.promote_dedup_stashes(using="default", limit=10) == 0
    assert JobDedupNext.objects.count() == 1
    finish(claim(queues=["bp-stash"]))
    assert engine.promote_dedup_stashes(using="default", limit=10) == 1
    assert JobDedupNext.objects.count() == 0
    assert unfinished("bp-stash") == 1


@pytest.mark.django_db(transaction=True)
def test_racing_enqueuer_threads_let_in_exactly_the_max_size():
    limit, racers, attempts = 17, 8, 5
    django_jobs.queue("bp-race").set_max_size(limit)

    def enqueuer(i: int) -> tuple[int, int]:
        ok = full = 0
        task = tasks_limits.quick.using(queue_name="bp-race")
        for _ in range(attempts):
            try:
                task.enqueue()
                ok += 1
            except QueueFull:
                full += 1
        return ok, full

    results = race(racers, enqueuer)
    assert sum(ok for ok, _ in results) == limit
    assert sum(full for _, full in results) == racers * attempts - limit
    assert unfinished("bp-race") == limit


ENQUEUE_SCRIPT = """
import json, os, sys, time
import django
django.setup()
from django_jobs import QueueFull
from tests import tasks_limits
go, queue, attempts = sys.argv[1], sys.argv[2], int(sys.argv[3])
task = tasks_limits.quick.using(queue_name=queue)
open(f"{go}.{os.getpid()}.ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
ok = full = 0
for i in range(attempts):
    try:
        if i % 2:
            task.enqueue()
        else:
            task.enqueue_many([()])
        ok += 1
    except QueueFull:
        full += 1
print(json.dumps({"ok": ok, "full": full}))
"""


@pytest.mark.slow
@pytest.mark.needs("ROW_LOCKS")
@pytest.mark.django_db(transaction=True)
def test_racing_enqueuer_processes_let_in_exactly_the_max_size(tmp_path):
    limit, racers, attempts = 23, 8, 6
    django_jobs.queue("bp-procs").set_max_size(limit)
    results = race_scripts(ENQUEUE_SCRIPT, "bp-procs", str(attempts), processes=racers, go=tmp_path / "go")
    assert sum(r["ok"] for r in results) == limit
    assert sum(r["full"] for r in results) == racers * attempts - limit
    assert unfinished("bp-procs") == limit


# -- 5. DJANGO_JOBS["QUEUES"] -------------------------------------------------------------------


def sync(declared) -> int:
    return sync_queues(using="default", declared=declared)


@pytest.mark.django_db
def test_sync_queues_writes_the_declared_limits():
    declared = {
        "emails": {"concurrency": 3, "rate_limit": (20, 1.0), "max_size": 1000},
        "reports": {
            "paused": True,
            "partition_concurrency": 2,
            "partition_rate_limit": [4, 2],
            "partition_max_size": 5,
        },
    }
    assert sync(declared) == 2
    assert django_jobs.queue("emails").limits == QueueLimits(concurrency=3, rate_limit=(20, 1.0), max_size=1000)
    assert django_jobs.queue("reports").limits == QueueLimits(
        paused=True, partition_concurrency=2, partition_rate_limit=(4, 2.0), partition_max_size=5
    )
    assert sync(declared) == 0


@pytest.mark.django_db
def test_a_queue_removed_from_the_declaration_gets_its_declared_limits_back_to_none():
    sync({"emails": {"concurrency": 3, "rate_limit": (20, 1.0), "paused": True}, "reports": {"max_size": 5}})
    django_jobs.queue("other").set_concurrency(7)  # never declared: the sync leaves it alone
    assert sync({"reports": {"max_size": 5}}) == 1
    assert django_jobs.queue("emails").limits == QueueLimits()
    assert django_jobs.queue("reports").limits == QueueLimits(max_size=5)
    assert sync(None) == 1, "no QUEUES at all: every declared queue is reset"
    assert django_jobs.queue("reports").limits == QueueLimits()
    assert django_jobs.queue("other").limits == QueueLimits(concurrency=7)
    assert sync(None) == 0 and sync({}) == 0


@pytest.mark.django_db
def test_a_runtime_change_survives_a_sync_of_the_same_declaration():
    declared = {"emails": {"concurrency": 3, "max_size": 1000}}
    sync(declared)
    q = django_jobs.queue("emails")
    q.configure(concurrency=7, max_size=None, rate_limit=(5, 2.0))
    assert sync(declared) == 0
    assert q.limits == QueueLimits(concurrency=7, rate_limit=(5, 2.0))


@pytest.mark.django_db
def test_a_changed_declaration_overwrites_the_values_it_changed():
    sync({"emails": {"concurrency": 3, "max_size": 1000}})
    q = django_jobs.queue("emails")
    q.configure(concurrency=7, max_size=50)
    assert sync({"emails": {"concurrency": 4, "max_size": 1000}}) == 1
    assert q.limits == QueueLimits(concurrency=4, max_size=50)
    assert sync({"emails": {"concurrency": 4, "max_size": 1000, "rate_limit": (9, 3)}}) == 1
    assert q.limits == QueueLimits(concurrency=4, rate_limit=(9, 3.0), max_size=50)


@pytest.mark.django_db
def test_a_key_removed_from_the_declaration_resets_its_limit():
    sync({"emails": {"concurrency": 3, "rate_limit": (20, 60.0), "max_size": 1000, "paused": True}})
    q = django_jobs.queue("emails")
    q.resume()
    enqueue("emails", 2)
    assert len(claim_gated("emails")[0]) == 2
    assert JobStart.objects.filter(queue="emails").count() == 2
    assert sync({"emails": {"max_size": 1000}}) == 1
    assert q.limits == QueueLimits(max_size=1000)
    assert not JobStart.objects.filter(queue="emails").exists(), "a removed rate limit drops its start log"
    assert engine.gated_queues(using="default", queues=None) == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("runtime", "declared"),
    [(None, (20, 2.0)), (None, (30, 1.0)), ((50, 3.0), (20, 2.0))],
    ids=["removed-at-runtime-window-changed", "removed-at-runtime-count-changed", "changed-at-runtime"],
)
def test_a_changed_rate_limit_declaration_writes_the_declared_pair(runtime, declared):
    """A rate limit is one value, (max_jobs, per_seconds): a declaration that changed it writes
    both halves, whatever a runtime edit left in the row, and the queue's claims go on."""
    sync({"emails": {"rate_limit": (20, 1.0)}})
    q = django_jobs.queue("emails")
    q.set_rate_limit(*(runtime or (None,)))
    sync({"emails": {"rate_limit": declared}})
    row = QueueState.objects.get(name="emails")
    assert (row.rate_limit, row.rate_window_seconds) == declared
    assert q.limits.rate_limit == declared
    enqueue("emails", 2)
    assert len(claim_gated("emails")[0]) == 2


BAD_DECLARATIONS = [
    ({"emails": {"concurrency": 0}}, "QUEUES['emails']: concurrency must be an integer >= 1"),
    ({"emails": {"max_size": True}}, "QUEUES['emails']: max_size must be an integer >= 1"),
    ({"emails": {"rate_limit": (20, 0)}}, "QUEUES['emails']: rate_limit: per_seconds must be a number"),
    ({"emails": {"rate_limit": 20}}, "QUEUES['emails']: rate_limit must be (max_jobs, per_seconds)"),
    ({"emails": {"partition_rate_limit": (0, 1)}}, "QUEUES['emails']: partition_rate_limit: max_jobs must be"),
    ({"emails": {"speed": 3}}, "QUEUES['emails']: Unknown queue setting 'speed'"),
    ({"emails": {"paused": "yes"}}, "QUEUES['emails']: paused must be True or False"),
    ({"emails": 5}, "QUEUES['emails'] must be a dict of limits"),
    ({"ok": {"concurrency": 2}, "has space": {"concurrency": 1}}, "QUEUES: "),
    (["emails"], "QUEUES must be a dict"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("declared", "message"), BAD_DECLARATIONS)
def test_sync_refuses_an_invalid_declaration_and_writes_nothing(declared, message):
    with pytest.raises(JobsConfigurationError, match=re.escape(message)):
        sync({"first": {"concurrency": 2}, **declared} if isinstance(declared, dict) else declared)
    assert not QueueState.objects.exists()


@pytest.mark.parametrize(("declared", "message"), BAD_DECLARATIONS)
def test_an_invalid_queues_declaration_is_check_e002(declared, message):
    with jobs_settings(QUEUES=declared):
        messages = task_backends["default"].check()
    assert [m.id for m in messages] == ["django_jobs.E002"]
    assert message in messages[0].msg
    assert messages[0].hint


def test_a_valid_queues_declaration_passes_the_checks():
    with jobs_settings(QUEUES={"emails": {"concurrency": 3, "rate_limit": [20, 1], "max_size": 10}}):
        assert task_backends["default"].check() == []


@pytest.mark.django_db(transaction=True)
def test_a_worker_applies_the_declared_limits_when_it_starts(thread_worker):
    declared = {"declared-q": {"concurrency": 2, "rate_limit": (50, 1.0), "max_size": 10}}
    jobs = enqueue("declared-q", 3)
    with jobs_settings(QUEUES=declared):
        worker = thread_worker(concurrency=2, queues=["declared-q"])
        expected = QueueLimits(concurrency=2, rate_limit=(50, 1.0), max_size=10)
        wait_until(lambda: django_jobs.queue("declared-q").limits == expected, message="the declared limits")
        wait_until(
            lambda: Job.objects.filter(id__in=[j.id for j in jobs], state="completed").count() == 3,
            timeout=15,
            message="the gated queue's jobs to run",
        )
        worker.stop()
    assert JobStart.objects.filter(queue="declared-q").count() == 3, "they started through the rate limit"


# -- 6. pauses of gated queues ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_paused_gated_queue_is_not_claimed_until_resumed():
    q = django_jobs.queue("paused-gated")
    q.configure(concurrency=2, rate_limit=(10, 60))
    enqueue("paused-gated", 3)
    q.pause()
    assert claim_gated("paused-gated") == ([], None)
    assert claim(queues=["paused-gated"]) == []
    assert engine.gated_queues(using="default", queues=None) == []
    assert not JobStart.objects.exists(), "a paused queue spends none of its rate"
    q.resume()
    assert engine.gated_queues(using="default", queues=None) == ["paused-gated"]
    running, _ = claim_gated("paused-gated")
    assert len(running) == 2
    q.pause()
    finish(running)
    assert claim_gated("paused-gated") == ([], None)
    q.resume()
    assert len(claim_gated("paused-gated")[0]) == 1
    assert q.limits == QueueLimits(concurrency=2, rate_limit=(10, 60.0)), "pause and resume keep the limits"


@pytest.mark.django_db
def test_an_admin_edit_goes_through_the_engine_and_drops_a_removed_rate_limits_log(admin_client):
    django_jobs.queue("admin-q").set_rate_limit(2, 60)
    enqueue("admin-q", 3)
    jobs, _ = claim_gated("admin-q", limit=3)
    assert len(jobs) == 2 and JobStart.objects.filter(queue="admin-q").count() == 2
    form = {"name": "admin-q", "concurrency_limit": "4", "rate_limit": "", "rate_window_seconds": "",
            "max_size": "", "partition_concurrency": "", "partition_rate_limit": "",
            "partition_rate_window_seconds": "", "partition_max_size": ""}  # fmt: skip
    page = admin_client.post("/admin/django_jobs/queuestate/admin-q/change/", form)
    assert page.status_code == 302, page.content.decode()[:2000]
    assert django_jobs.queue("admin-q").limits == QueueLimits(concurrency=4)
    assert not JobStart.objects.filter(queue="admin-q").exists(), "the removed rate limit's log went with it"
    page = admin_client.post("/admin/django_jobs/queuestate/add/", {**form, "name": "admin-new", "max_size": "0"})
    assert page.status_code == 200 and "at least 1" in page.content.decode()
    assert not QueueState.objects.filter(name="admin-new").exists()
    page = admin_client.post("/admin/django_jobs/queuestate/add/", {**form, "name": "admin-new", "max_size": "5"})
    assert page.status_code == 302
    assert django_jobs.queue("admin-new").limits == QueueLimits(concurrency=4, max_size=5)

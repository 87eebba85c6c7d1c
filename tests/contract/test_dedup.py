"""Deduplication (``Dedup``): the four modes, how keys are released and expire, the stash of
``keep_last_if_active`` and its sweeper, ``enqueue_many``, validation, and concurrency with real
processes. Contract tests: they run on SQLite and PostgreSQL. Time is the engine's ``now``
parameter where the tests drive the engine; the public API where it is the subject."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus
from django.utils import timezone

import django_jobs
from django_jobs import Dedup, engine
from django_jobs.conf import get_settings
from django_jobs.exceptions import InvalidTaskArguments, InvalidTaskOptions
from django_jobs.models import Job, JobDedup, JobDedupNext
from django_jobs.services import DedupSweeper
from django_jobs.states import JobState
from django_jobs.testing import drain_queue, perform_job
from tests import factories, tasks_dedup
from tests.conftest import ROOT, subprocess_env, wait_until
from tests.factories import lock_waiters, record

db = pytest.mark.django_db
committing = pytest.mark.django_db(transaction=True)

T0 = timezone.now().replace(microsecond=0) - timedelta(days=1)
REFRESH = "tests.tasks_dedup.refresh"


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def enqueue(
    key: str = "k",
    *args,
    ttl=None,
    extend=False,
    replace=False,
    keep_last=False,
    now=T0,
    run_after=None,
    queue="default",
    backend="default",
    task_path=REFRESH,
) -> engine.DedupOutcome:
    """One dedup enqueue through the engine, at ``now``."""
    return engine.enqueue_deduplicated(
        factories.new_job(backend=backend, queue=queue, task_path=task_path, args=list(args), run_after=run_after),
        using="default",
        key=key,
        ttl=ttl,
        extend=extend,
        replace=replace,
        keep_last_if_active=keep_last,
        now=now,
    )


#: The factory on this module's clock: at ``T0`` unless ``now`` says otherwise.
claim = partial(factories.claim, now=T0)


def finish(job: engine.ClaimedJob, state: str = JobState.COMPLETED, now=T0) -> None:
    assert record(job, state, now=now, return_value_json="null") == {job.id: state}


def holder_of(key: str = "k", queue: str = "default") -> uuid.UUID:
    return JobDedup.objects.get(backend="default", queue=queue, key=key).job_id


def sweep(now=None) -> dict[str, int]:
    return DedupSweeper(using="default", settings=get_settings("default"), interval=1, backend="default").run_once(
        now=now
    )


def live_jobs():
    return Job.objects.exclude(state__in=[JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED])


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Dedup(""), "Dedup key must not be empty"),
        (lambda: Dedup("x" * 256), "Dedup key is 256 characters, over 255; hash a long key"),
        (lambda: Dedup(42), "Dedup key must be a string or a callable (args, kwargs) -> str; got 42 (an int)."),
        (lambda: Dedup("a\x00b"), "contains a NUL character"),
        (lambda: Dedup("k", ttl=0), "Dedup ttl must be a number of seconds > 0"),
        (lambda: Dedup("k", ttl=-1), "Dedup ttl must be a number of seconds > 0"),
        (lambda: Dedup("k", ttl="5"), "got '5'"),
        (lambda: Dedup("k", ttl=float("nan")), "got nan"),
        (lambda: Dedup("k", ttl=True), "got True"),
        (lambda: Dedup("k", extend=True), "Dedup(extend=True) needs a ttl"),
        (lambda: Dedup("k", replace=True), "Dedup(replace=True) needs a ttl"),
        (lambda: Dedup("k", ttl=5, extend="yes"), "Dedup extend must be True or False; got 'yes'."),
        (lambda: Dedup("k", keep_last_if_active=1), "Dedup keep_last_if_active must be True or False; got 1."),
    ],
)
def test_invalid_dedup_options_are_rejected_saying_what_to_do(make, message):
    with pytest.raises(InvalidTaskOptions) as exc:
        make()
    assert message in str(exc.value)


def test_dedup_options_are_keyword_only_after_the_key_and_name_their_mode():
    assert Dedup("k").mode == "simple"
    assert Dedup("k", ttl=5).mode == "throttle"
    assert Dedup("k", ttl=5, extend=True, replace=True).mode == "debounce"
    assert Dedup("k", keep_last_if_active=True).mode == "keep-last-if-active"
    assert Dedup("k", ttl=5, keep_last_if_active=True).ttl == 5  # allowed together
    with pytest.raises(TypeError):
        Dedup("k", 5)  # type: ignore[misc]


def test_dedup_option_must_be_a_dedup():
    with pytest.raises(InvalidTaskOptions, match=r"dedup must be a django_jobs.Dedup, such as Dedup\('user:42'\)"):
        tasks_dedup.refresh.using(dedup="user:42")


@db
def test_a_key_function_returning_no_string_raises_and_inserts_nothing():
    task = tasks_dedup.refresh.using(dedup=Dedup(lambda args, kwargs: args[0]))
    with pytest.raises(InvalidTaskOptions, match=r"returned 7 \(an int\); it must return a string of 1-255"):
        task.enqueue(7)
    with pytest.raises(InvalidTaskOptions, match="over 255"):
        task.enqueue("x" * 300)
    assert not Job.objects.exists() and not JobDedup.objects.exists()


@db
def test_using_dedup_false_turns_the_decorators_dedup_off():
    first = tasks_dedup.nightly_report.enqueue()
    assert tasks_dedup.nightly_report.enqueue().duplicate
    plain = tasks_dedup.nightly_report.using(dedup=False).enqueue()
    assert not plain.duplicate and plain.id != first.id
    assert Job.objects.count() == 2


# -- simple ------------------------------------------------------------------------------------


@db
def test_simple_mode_returns_the_unfinished_holder_flagged_duplicate(
    django_capture_on_commit_callbacks, enqueued_results
):
    task = tasks_dedup.refresh.using(dedup=Dedup("item:1"))
    with django_capture_on_commit_callbacks(execute=True):
        first = task.enqueue(1, version=1)
        second = task.enqueue(1, version=2)
    assert not first.duplicate
    assert second.duplicate and second.id == first.id
    assert second.kwargs == {"version": 1}  # the holder's arguments, untouched
    assert second.status == TaskResultStatus.READY
    assert [r.id for r in enqueued_results] == [first.id]  # task_enqueued for the new job only
    [job] = Job.objects.all()
    assert job.dedup_key == "item:1"
    assert holder_of("item:1") == job.id


@db
def test_keys_are_per_queue_and_per_backend():
    a = tasks_dedup.refresh.using(dedup=Dedup("k")).enqueue()
    b = tasks_dedup.refresh.using(dedup=Dedup("k"), queue_name="emails").enqueue()
    c = tasks_dedup.refresh.using(dedup=Dedup("k"), backend="limited").enqueue()
    assert len({a.id, b.id, c.id}) == 3
    assert not (a.duplicate or b.duplicate or c.duplicate)
    assert JobDedup.objects.count() == 3


@db
def test_a_running_holder_still_holds_its_key():
    first = enqueue("k", 1)
    [running] = claim()
    again = enqueue("k", 2)
    assert not again.created and again.job.id == first.job.id == running.id
    assert again.job.state == JobState.ACTIVE and again.changes == ()


@db
@pytest.mark.parametrize("end", ["completed", "failed", "cancelled"])
def test_a_finished_holder_releases_its_key_in_simple_mode(end):
    first = enqueue("k", 1)
    if end == "cancelled":
        engine.cancel_job(using="default", job_id=first.job.id, now=at(1))
    else:
        [running] = claim()
        finish(running, end, now=at(1))
    second = enqueue("k", 2, now=at(2))
    assert second.created and second.changes == ("took_over",)
    assert holder_of("k") == second.job.id
    assert live_jobs().count() == 1


@db
def test_deleting_the_holder_releases_its_key():
    first = enqueue("k", 1)
    Job.objects.filter(id=first.job.id).delete()
    assert not JobDedup.objects.exists()  # CASCADE
    second = enqueue("k", 2)
    assert second.created and second.changes == ()  # the key was free: a plain insert


# -- throttle ----------------------------------------------------------------------------------


@db
def test_throttle_holds_the_key_for_its_ttl_whatever_the_jobs_state():
    first = enqueue("k", 1, ttl=10)
    [running] = claim()
    finish(running, now=at(1))
    assert not enqueue("k", 2, ttl=10, now=at(9.9)).created  # finished, but within the ttl
    third = enqueue("k", 3, ttl=10, now=at(10))
    assert third.created and third.changes == ("took_over",)
    assert third.job.id != first.job.id
    key = JobDedup.objects.get(key="k")
    assert key.job_id == third.job.id and key.expire_at == at(20)


@db
def test_an_expired_throttle_key_is_taken_over_while_its_job_still_waits():
    first = enqueue("k", 1, ttl=10)
    second = enqueue("k", 2, ttl=10, now=at(11))
    assert second.created
    assert set(live_jobs().values_list("id", flat=True)) == {first.job.id, second.job.id}


@committing  # each enqueue its own transaction: PostgreSQL's now() is the transaction's start
def test_throttle_through_the_api_with_a_short_ttl():
    task = tasks_dedup.refresh.using(dedup=Dedup("burst", ttl=0.3))
    first = task.enqueue(1)
    assert task.enqueue(2).duplicate
    later = wait_until(lambda: (r := task.enqueue(3)) and not r.duplicate and r, timeout=10)
    assert later.id != first.id and later.args == [3]


# -- debounce ----------------------------------------------------------------------------------


@db
def test_debounce_replaces_the_arguments_restarts_the_delay_and_extends_the_ttl():
    debounce = {"ttl": 10, "extend": True, "replace": True}
    first = enqueue("k", 1, **debounce, run_after=at(5))
    assert first.job.state == JobState.DELAYED
    second = enqueue("k", 2, **debounce, now=at(3), run_after=at(8))
    assert not second.created and second.changes == ("replaced", "extended")
    assert second.job.id == first.job.id
    assert (second.job.args, second.job.available_at, second.job.state) == ([2], at(8), JobState.DELAYED)
    assert JobDedup.objects.get(key="k").expire_at == at(13)
    third = enqueue("k", 3, **debounce, now=at(12), run_after=at(17))  # past the first ttl: extended
    assert not third.created and third.job.args == [3] and third.job.available_at == at(17)
    fourth = enqueue("k", 4, **debounce, now=at(22))
    assert fourth.created and fourth.changes == ("took_over",)
    assert Job.objects.count() == 2


@db
def test_debounce_without_run_after_makes_the_holder_ready_now():
    debounce = {"ttl": 10, "extend": True, "replace": True}
    first = enqueue("k", 1, **debounce, run_after=at(5))
    second = enqueue("k", 2, **debounce, now=at(1))
    assert second.job.id == first.job.id
    assert (second.job.state, second.job.available_at, second.job.seq) == (
        JobState.WAITING,
        at(1),
        engine.ready_seq(at(1)),
    )


@db
def test_replace_alone_replaces_the_arguments_but_keeps_the_expiry():
    first = enqueue("k", 1, ttl=10, replace=True)
    second = enqueue("k", 2, ttl=10, replace=True, now=at(3))
    assert second.changes == ("replaced",) and second.job.args == [2]
    assert JobDedup.objects.get(key="k").expire_at == at(10)
    assert enqueue("k", 3, ttl=10, replace=True, now=at(10)).created
    assert Job.objects.get(id=first.job.id).args == [2]


@db
def test_extend_alone_resets_the_ttl_but_keeps_the_arguments():
    first = enqueue("k", 1, ttl=10, extend=True)
    second = enqueue("k", 2, ttl=10, extend=True, now=at(8))
    assert second.changes == ("extended",) and second.job.args == [1]
    assert not enqueue("k", 3, ttl=10, extend=True, now=at(17)).created  # 8 + 10 = 18
    assert enqueue("k", 4, ttl=10, extend=True, now=at(27)).created
    assert Job.objects.get(id=first.job.id).args == [1]


@db
def test_replace_leaves_a_running_holder_alone():
    first = enqueue("k", 1, ttl=10, replace=True)
    claim()
    second = enqueue("k", 2, ttl=10, replace=True, now=at(1))
    assert not second.created and second.changes == ()
    assert Job.objects.get(id=first.job.id).args == [1]


@db
def test_replace_refuses_a_holder_of_another_task_and_changes_nothing():
    enqueue("k", 1, ttl=10, replace=True, task_path="tests.tasks_dedup.other_refresh")
    with pytest.raises(InvalidTaskOptions, match="replace=True cannot give it the arguments of tests.tasks_dedup"):
        enqueue("k", 2, ttl=10, replace=True)
    assert Job.objects.get().args == [1]


@db
def test_debounce_through_the_api_returns_the_holder_with_the_new_arguments():
    task = tasks_dedup.refresh.using(dedup=Dedup("search", ttl=60, extend=True, replace=True))
    first = task.using(run_after=timedelta(seconds=30)).enqueue(1)
    second = task.using(run_after=timedelta(seconds=30)).enqueue(2)
    assert second.duplicate and second.id == first.id and second.args == [2]
    first.refresh()
    assert first.args == [2]


# -- keep last if active ----------------------------------------------------------------------


@db
def test_keep_last_stashes_the_last_enqueue_while_the_holder_runs_and_makes_it_the_next_job():
    first = enqueue("k", 1, keep_last=True)
    [running] = claim()
    assert enqueue("k", 2, keep_last=True, now=at(1)).changes == ("stashed",)
    third = enqueue("k", 3, keep_last=True, now=at(2))
    assert not third.created and third.changes == ("stashed",) and third.job.id == first.job.id
    [stash] = JobDedupNext.objects.all()
    assert stash.payload["args"] == [3]
    assert Job.objects.count() == 1
    assert sweep(now=at(3)) == {"promoted": 0, "expired": 0}  # the holder still runs
    finish(running, now=at(4))
    assert sweep(now=at(5)) == {"promoted": 1, "expired": 0}
    [next_job] = live_jobs()
    assert next_job.args == [3] and next_job.state == JobState.WAITING and next_job.dedup_key == "k"
    assert holder_of("k") == next_job.id
    assert not JobDedupNext.objects.exists()
    assert sweep(now=at(6)) == {"promoted": 0, "expired": 0}
    assert Job.objects.count() == 2


@db
def test_keep_last_with_an_unstarted_holder_is_a_plain_duplicate():
    enqueue("k", 1, keep_last=True)
    assert enqueue("k", 2, keep_last=True).changes == ()
    assert not JobDedupNext.objects.exists()


@db
def test_a_stash_holds_the_key_past_its_ttl_and_the_next_job_gets_a_fresh_ttl():
    enqueue("k", 1, ttl=10, keep_last=True)
    [running] = claim()
    assert enqueue("k", 2, ttl=10, keep_last=True, now=at(5)).changes == ("stashed",)
    assert JobDedup.objects.get(key="k").expire_at is None  # held until the stash is a job
    assert not enqueue("k", 3, ttl=10, keep_last=True, now=at(30)).created  # stashed again, not expired
    assert sweep(now=at(31)) == {"promoted": 0, "expired": 0}
    finish(running, now=at(32))
    assert sweep(now=at(33))["promoted"] == 1
    key = JobDedup.objects.get(key="k")
    assert key.expire_at == at(43) and Job.objects.get(id=key.job_id).args == [3]


@db
def test_an_enqueue_after_the_holder_finished_takes_the_key_and_drops_the_older_stash():
    enqueue("k", 1, keep_last=True)
    [running] = claim()
    enqueue("k", 2, keep_last=True, now=at(1))
    finish(running, now=at(2))
    newest = enqueue("k", 3, keep_last=True, now=at(3))
    assert newest.created and newest.changes == ("took_over",)
    assert not JobDedupNext.objects.exists()
    assert sweep(now=at(4))["promoted"] == 0
    assert [j.args for j in live_jobs()] == [[3]]


@db
def test_a_stash_whose_holder_was_deleted_becomes_a_job():
    first = enqueue("k", 1, keep_last=True)
    claim()
    enqueue("k", 2, keep_last=True, now=at(1))
    Job.objects.filter(id=first.job.id).delete()
    assert sweep(now=at(2))["promoted"] == 1
    assert Job.objects.get().args == [2] and holder_of("k") == Job.objects.get().id


@db
def test_the_sweeper_only_promotes_stashes_of_its_backend():
    enqueue("k", 1, keep_last=True, backend="limited")
    [running] = claim()
    enqueue("k", 2, keep_last=True, backend="limited", now=at(1))
    finish(running, now=at(2))
    assert sweep(now=at(3))["promoted"] == 0  # the sweeper of "default"
    assert engine.promote_dedup_stashes(using="default", limit=10, backend="limited", now=at(3)) == 1


@db
def test_drain_queue_runs_the_stashed_enqueue_after_its_holder():
    tasks_dedup.rebuild_index.enqueue(1, enqueue_while_running=[2, 3])
    assert drain_queue().completed == 2
    assert sorted(Job.objects.values_list("return_value", flat=True)) == [1, 3]


@committing
def test_a_worker_runs_the_stashed_enqueue_once_the_running_job_finished(thread_worker):
    tasks_dedup.rebuild_index.enqueue(1, enqueue_while_running=[2, 3, 4])
    w = thread_worker(concurrency=2)
    wait_until(lambda: Job.objects.filter(state=JobState.COMPLETED).count() == 2, timeout=20)
    w.stop()
    assert sorted(Job.objects.values_list("return_value", flat=True)) == [1, 4]
    assert not JobDedupNext.objects.exists()


@db
def test_perform_job_runs_a_waiting_holder_and_refuses_one_that_is_not_waiting():
    holder = tasks_dedup.nightly_report.enqueue()
    result = perform_job(tasks_dedup.nightly_report)  # a duplicate of the waiting holder: runs it
    assert result.id == holder.id and result.return_value == "done"
    second = tasks_dedup.nightly_report.using(dedup=Dedup("nightly-report", ttl=60)).enqueue()
    assert not second.duplicate  # the holder finished: a new job took the key, for 60 s
    claim()
    with pytest.raises(
        RuntimeError, match=f"perform_job\\(\\) ran nothing: the enqueue was a duplicate of job {second.id}"
    ):
        perform_job(tasks_dedup.nightly_report)


# -- sweeping expired keys --------------------------------------------------------------------


@db
def test_the_sweeper_deletes_expired_keys_only():
    enqueue("a", ttl=5)
    enqueue("b", ttl=50)
    enqueue("c")
    assert sweep(now=at(6)) == {"promoted": 0, "expired": 1}
    assert set(JobDedup.objects.values_list("key", flat=True)) == {"b", "c"}
    assert DedupSweeper.leader_only


@committing
def test_the_worker_runs_the_sweeper(thread_worker):
    enqueue("a", ttl=0.2, now=None)
    thread_worker(queues=["nothing-here"])
    wait_until(lambda: not JobDedup.objects.exists(), timeout=20)


# -- enqueue_many --------------------------------------------------------------------------------


@db
def test_enqueue_many_with_a_key_function_deduplicates_each_item(django_capture_on_commit_callbacks, enqueued_results):
    with django_capture_on_commit_callbacks(execute=True):
        results = tasks_dedup.sync_user.enqueue_many([(1,), (2,), (1, "email"), (3,), (2,)])
    assert [r.duplicate for r in results] == [False, False, True, False, True]
    assert results[2].id == results[0].id and results[4].id == results[1].id
    assert results[2].args == [1]  # the holder's
    assert Job.objects.count() == 3
    assert len({r.trace_id for r in results}) == 1
    assert [r.id for r in enqueued_results] == [results[i].id for i in (0, 1, 3)]
    again = tasks_dedup.sync_user.enqueue_many([(3,), (4,)])
    assert [r.duplicate for r in again] == [True, False]


@db
def test_enqueue_many_with_dedup_stores_nothing_when_an_item_is_invalid():
    task = tasks_dedup.refresh.using(dedup=Dedup(lambda args, kwargs: f"k{args[0]}"))
    with pytest.raises(InvalidTaskArguments, match="^enqueue_many item 2: args\\[1\\] is a set"):
        task.enqueue_many([(1,), (2,), (3, {4})])
    with pytest.raises(InvalidTaskOptions, match="^enqueue_many item 1: The Dedup key function"):
        tasks_dedup.refresh.using(dedup=Dedup(lambda args, kwargs: f"k{args[0]}" if args[0] else None)).enqueue_many(
            [(1,), (0,)]
        )
    assert not Job.objects.exists() and not JobDedup.objects.exists()


@db
def test_enqueue_many_with_dedup_rolls_back_with_the_callers_transaction():
    with transaction.atomic():
        tasks_dedup.sync_user.enqueue_many([(1,), (2,)])
        transaction.set_rollback(True)
    assert not Job.objects.exists() and not JobDedup.objects.exists()
    assert not tasks_dedup.sync_user.enqueue(1).duplicate


# -- concurrency -----------------------------------------------------------------------------------


def _start(directory: Path, index: int, *args: str) -> subprocess.Popen:
    log = open(directory / f"log-{index}.txt", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "tests.dedup_load", args[0], str(index), str(directory), *args[1:]],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _results(directory: Path, procs: list[subprocess.Popen], timeout: float = 120) -> list[dict]:
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
    logs = "\n".join(f.read_text() for f in sorted(directory.glob("log-*.txt")))
    assert all(p.returncode == 0 for p in procs), logs
    return [json.loads((directory / f"result-{i}.json").read_text()) for i in range(len(procs))]


@committing
def test_eight_processes_enqueueing_2000_jobs_each_over_100_keys_make_exactly_100_jobs(tmp_path, capsys):
    procs = [_start(tmp_path, i, "dedup", "2000", "100") for i in range(8)]
    wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 8, timeout=60, message="8 processes ready")
    started = time.perf_counter()
    (tmp_path / "go").touch()
    results = _results(tmp_path, procs)
    elapsed = time.perf_counter() - started
    new = sum(r["new"] for r in results)
    duplicates = sum(r["duplicate"] for r in results)
    errors = [m for r in results for m in r["messages"]]
    with capsys.disabled():
        print(
            f"\n[dedup figure, {connection.vendor}] 8 processes x 2,000 enqueues over 100 keys: {new} new, "
            f"{duplicates} duplicates, {len(errors)} errors, {elapsed:.2f}s wall "
            f"(per process {min(r['elapsed'] for r in results):.2f}-{max(r['elapsed'] for r in results):.2f}s)"
        )
    assert errors == []
    assert (new, duplicates) == (100, 15_900)
    assert Job.objects.count() == 100 and live_jobs().count() == 100
    assert JobDedup.objects.count() == 100
    assert set(Job.objects.values_list("dedup_key", flat=True)) == {f"key-{k}" for k in range(100)}


@committing
def test_a_key_inserted_by_a_transaction_that_rolls_back_goes_to_exactly_one_waiting_enqueue(tmp_path):
    holder = _start(tmp_path, 0, "hold", "contended")
    wait_until(lambda: (tmp_path / "held").exists() or holder.poll() is not None, timeout=60)
    assert holder.poll() is None, (tmp_path / "log-0.txt").read_text()
    others = [_start(tmp_path, i, "once", "contended") for i in range(1, 8)]
    wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 7, timeout=60, message="7 processes ready")
    (tmp_path / "go").touch()
    wait_until(lambda: len(list(tmp_path.glob("calling-*"))) == 7, timeout=30)
    if connection.vendor == "postgresql":
        # They wait on the unique index for the holder's transaction to end.
        wait_until(lambda: lock_waiters() == 7, timeout=30, message="7 enqueues blocked on the held key")
    assert not Job.objects.exists()  # nothing committed yet
    (tmp_path / "rollback").touch()
    results = _results(tmp_path, [holder, *others])
    assert results[0]["new"] == 1  # inserted, then rolled back
    others_results = results[1:]
    assert sum(r["errors"] for r in others_results) == 0, [r["messages"] for r in others_results]
    assert sum(r["new"] for r in others_results) == 1
    assert sum(r["duplicate"] for r in others_results) == 6
    [job] = Job.objects.all()
    assert holder_of("contended") == job.id and job.args != [0]


@pytest.mark.postgres
@committing
def test_an_enqueue_waits_for_the_transaction_holding_the_key_row_lock(tmp_path):
    """A second connection locks the key row (as a takeover does); a duplicate enqueue of the key
    waits for it instead of reading a holder that is changing hands."""
    first = tasks_dedup.refresh.using(dedup=Dedup("locked")).enqueue(1)
    procs: list[subprocess.Popen] = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT id FROM django_jobs_dedup WHERE key = 'locked' FOR UPDATE")
        procs.append(_start(tmp_path, 0, "once", "locked"))
        wait_until(lambda: (tmp_path / "ready-0").exists(), timeout=60)
        (tmp_path / "go").touch()
        wait_until(lambda: lock_waiters() == 1, timeout=30)
    [result] = _results(tmp_path, procs)
    assert (result["new"], result["duplicate"]) == (0, 1)
    assert Job.objects.get().id == uuid.UUID(first.id)


def test_dedup_and_trace_are_exported():
    assert django_jobs.Dedup is Dedup
    assert callable(django_jobs.trace)


@db
def test_the_sweeper_deletes_keys_without_expiry_whose_holder_finished():
    done = enqueue("done")
    enqueue("live")
    Job.objects.filter(id=done.job.id).update(state="completed")  # as a worker's outcome would
    counts = sweep(now=at(1))
    assert counts["expired"] == 1
    assert set(JobDedup.objects.values_list("key", flat=True)) == {"live"}
    assert enqueue("done").created

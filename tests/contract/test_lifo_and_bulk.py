"""LIFO through a signed ``seq`` (seed schema ``job_seq``) and ``task.enqueue_many``: contract
tests that run on SQLite and PostgreSQL. The engine is driven directly where time matters (time
is a parameter); the backend and a real worker where the public API is the subject."""

from __future__ import annotations

import asyncio
import importlib
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from asgiref.sync import sync_to_async
from django.apps import apps
from django.db import connection, connections, transaction
from django.tasks import TaskResultStatus, task
from django.tasks.signals import task_enqueued
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_jobs
from django_jobs import backend as backend_module
from django_jobs import engine
from django_jobs.backend import JobCall, JobResult
from django_jobs.exceptions import InvalidArgumentValue, InvalidTaskArguments, InvalidTaskOptions, PayloadTooLarge
from django_jobs.models import Job
from django_jobs.states import JobState
from tests import factories, tasks
from tests.factories import insert_job, plain_function
from tests.tasks import read_records

db = pytest.mark.django_db
committing = pytest.mark.django_db(transaction=True)

T0 = timezone.now().replace(microsecond=123_456) - timedelta(days=1)
CHUNK = engine.INSERT_CHUNK


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


#: The factories on this module's clock (at ``T0`` unless ``now`` says otherwise); jobs of 3 attempts.
make_job = partial(insert_job, now=T0, max_attempts=3)
claim = partial(factories.claim, now=T0)


def claim_one_by_one(now: datetime | None = T0) -> list[uuid.UUID]:
    """Ids in claim order, one claim per job (the order a worker with one free slot sees)."""
    order = []
    while claimed := claim(limit=1, now=now):
        order.append(claimed[0].id)
    return order


def seq_of(job_id) -> int:
    return Job.objects.values_list("seq", flat=True).get(id=job_id)


# -- seq ------------------------------------------------------------------------------------


def test_ready_seq_is_microseconds_since_the_epoch_negated_for_lifo():
    moment = datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=UTC)
    assert engine.ready_seq(moment) == 1_000_005
    assert engine.ready_seq(moment, lifo=True) == -1_000_005
    assert engine.ready_seq(moment.replace(tzinfo=None)) == 1_000_005  # USE_TZ=False: naive is UTC
    assert engine.ready_seq(T0) < engine.ready_seq(T0 + timedelta(microseconds=1))


@db
def test_insert_stores_seq_from_the_moment_the_job_becomes_ready():
    fifo = make_job(now=at(0))
    lifo = make_job(lifo=True, now=at(0))
    delayed = make_job(now=at(0), run_after=at(60))
    assert seq_of(fifo.id) == engine.ready_seq(at(0)) > 0
    assert seq_of(lifo.id) == -engine.ready_seq(at(0))
    assert seq_of(delayed.id) == engine.ready_seq(at(60))


@db
def test_lifo_jobs_are_claimed_before_fifo_jobs_of_the_same_priority_newest_first():
    fifo_a = make_job(now=at(0))
    lifo_b = make_job(lifo=True, now=at(1))
    fifo_c = make_job(now=at(2))
    lifo_d = make_job(lifo=True, now=at(3))
    expected = [lifo_d.id, lifo_b.id, fifo_a.id, fifo_c.id]
    assert list(Job.objects.ready().values_list("id", flat=True)) == expected
    # One batch: RETURNING has no order, the engine restores it.
    assert [c.id for c in claim(now=at(4))] == expected


@db
def test_fifo_order_is_unchanged_availability_then_id():
    later = make_job(now=at(3))
    early = make_job(now=at(1))
    same_1 = make_job(now=at(2))
    same_2 = make_job(now=at(2))  # same moment: the id (time-ordered) decides
    assert claim_one_by_one(now=at(4)) == [early.id, same_1.id, same_2.id, later.id]


@db
def test_higher_priority_still_beats_lifo():
    lifo_low = make_job(lifo=True, priority=-5, now=at(3))
    fifo_high = make_job(priority=5, now=at(0))
    lifo = make_job(lifo=True, now=at(2))
    fifo = make_job(now=at(1))
    assert claim_one_by_one(now=at(4)) == [fifo_high.id, lifo.id, fifo.id, lifo_low.id]


@db
def test_claim_returns_seq():
    job = make_job(lifo=True)
    (claimed,) = claim()
    assert claimed.id == job.id and claimed.seq == -engine.ready_seq(T0)


@db
def test_lifo_job_retried_with_a_delay_keeps_its_lifo_sign():
    lifo = make_job(lifo=True, now=at(0))
    fifo = make_job(now=at(0))
    for claimed in claim(now=at(1)):
        engine.record_outcomes(
            [
                engine.Outcome(
                    job_id=claimed.id, lease_token=claimed.lease_token, state=JobState.DELAYED, available_at=at(60)
                )
            ],
            using="default",
            now=at(1),
        )
    assert seq_of(lifo.id) == -engine.ready_seq(at(60))
    assert seq_of(fifo.id) == engine.ready_seq(at(60))
    # Due again: still ahead of a FIFO job that was waiting all along.
    waiting = make_job(now=at(30))
    assert engine.promote_due_jobs(using="default", limit=10, now=at(60)) == 2
    assert claim_one_by_one(now=at(61)) == [lifo.id, waiting.id, fifo.id]


@db
def test_snoozed_lifo_job_gets_the_seq_of_its_new_time():
    job = make_job(lifo=True, now=at(0))
    (claimed,) = claim(now=at(1))
    outcome = engine.Outcome(
        job_id=job.id, lease_token=claimed.lease_token, state=JobState.DELAYED, available_at=at(9), uncount_attempt=True
    )
    engine.record_outcomes([outcome], using="default", now=at(1))
    assert seq_of(job.id) == -engine.ready_seq(at(9))


@db
def test_outcome_without_a_new_time_keeps_seq():
    lifo = make_job(lifo=True, now=at(0))
    fifo = make_job(now=at(0))
    claimed = {c.id: c for c in claim(now=at(1))}
    engine.record_outcomes(
        [
            engine.Outcome(job_id=lifo.id, lease_token=claimed[lifo.id].lease_token, state=JobState.WAITING),
            engine.Outcome(job_id=fifo.id, lease_token=claimed[fifo.id].lease_token, state=JobState.COMPLETED),
        ],
        using="default",
        now=at(1),
    )
    assert seq_of(lifo.id) == -engine.ready_seq(at(0))
    assert seq_of(fifo.id) == engine.ready_seq(at(0))


@db
def test_retry_job_requeues_with_a_seq_from_now_keeping_its_sign():
    lifo = make_job(lifo=True, now=at(0))
    fifo = make_job(now=at(0))
    for claimed in claim(now=at(1)):
        engine.record_outcomes(
            [engine.Outcome(job_id=claimed.id, lease_token=claimed.lease_token, state=JobState.FAILED)],
            using="default",
            now=at(1),
        )
    assert engine.retry_job(using="default", job_id=lifo.id, now=at(100))
    assert engine.retry_job(using="default", job_id=fifo.id, now=at(100))
    assert seq_of(lifo.id) == -engine.ready_seq(at(100))
    assert seq_of(fifo.id) == engine.ready_seq(at(100))


@db
def test_release_and_promote_keep_seq():
    running = make_job(lifo=True, now=at(0))
    claim(now=at(1))
    assert engine.release_jobs(using="default", worker_id="w1") == 1
    assert seq_of(running.id) == -engine.ready_seq(at(0))
    delayed = make_job(lifo=True, now=at(0), run_after=at(10))
    assert engine.promote_due_jobs(using="default", limit=10, now=at(20)) == 1
    assert seq_of(delayed.id) == -engine.ready_seq(at(10))


@db
def test_migration_gives_unfinished_jobs_the_seq_of_their_availability():
    active, delayed, waiting, finished = (make_job(now=at(i)) for i in range(4))
    assert [c.id for c in claim(limit=1, now=at(0))] == [active.id]
    # Test set-up only: rows in the other states, and seq as rows that predate the column have it.
    Job.objects.filter(id=delayed.id).update(state=JobState.DELAYED)
    Job.objects.filter(id=finished.id).update(state=JobState.COMPLETED)
    Job.objects.update(seq=0)
    migration = importlib.import_module("django_jobs.migrations.0003_job_seq")

    class SchemaEditor:
        connection = connection

    migration.set_seq_from_available_at(apps, SchemaEditor())
    assert seq_of(active.id) == engine.ready_seq(at(0))
    assert seq_of(delayed.id) == engine.ready_seq(at(1))
    assert seq_of(waiting.id) == engine.ready_seq(at(2))
    assert seq_of(finished.id) == 0


# -- the lifo task option -------------------------------------------------------------------


@db
def test_lifo_from_the_decorator_or_using_is_stored_on_the_job():
    assert tasks.lifo_mark.lifo is True and tasks.noop.lifo is False
    decorated = tasks.lifo_mark.enqueue("/dev/null", 1)
    configured = tasks.noop.using(lifo=True).enqueue()
    switched_off = tasks.lifo_mark.using(lifo=False).enqueue("/dev/null", 2)
    plain = tasks.noop.enqueue()
    rows = {str(j.id): j for j in Job.objects.all()}
    assert rows[decorated.id].options == {"lifo": True} and rows[decorated.id].seq < 0
    assert rows[configured.id].options == {"lifo": True} and rows[configured.id].seq < 0
    assert rows[switched_off.id].options == {} and rows[switched_off.id].seq > 0
    assert rows[plain.id].options == {} and rows[plain.id].seq > 0


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_invalid_lifo_is_rejected(value):
    with pytest.raises(InvalidTaskOptions, match="lifo must be True or False"):
        task(lifo=value)(plain_function)
    if value is not None:  # using(lifo=None) keeps the current value, like every option
        with pytest.raises(InvalidTaskOptions, match="lifo must be True or False"):
            tasks.noop.using(lifo=value)


# -- enqueue_many ---------------------------------------------------------------------------


@db
def test_enqueue_many_returns_ready_results_in_order_matching_the_rows():
    before = timezone.now()
    results = tasks.add.using(priority=3, queue_name="sums").enqueue_many([(1, 2), (3, 4), (5, 6)])
    assert [r.args for r in results] == [[1, 2], [3, 4], [5, 6]]
    assert all(isinstance(r, JobResult) and r.status == TaskResultStatus.READY for r in results)
    assert len({r.task for r in results}) == 1, "one Task object shared by every result"
    rows = {str(j.id): j for j in Job.objects.order_by("id")}
    assert list(rows) == [r.id for r in results]  # ids are time-ordered: in the order given
    for r in results:
        job = rows[r.id]
        assert (job.task_path, job.queue, job.priority, job.state) == ("tests.tasks.add", "sums", 3, "waiting")
        assert (job.args, job.kwargs, job.max_attempts, job.options) == (r.args, {}, 1, {})
        # enqueued_at: the database clock on PostgreSQL (the transaction's start, the clock of
        # started_at); available_at and seq: this process's (the claim order needs distinct times).
        assert job.enqueued_at == r.enqueued_at and job.available_at >= before
        assert job.seq == engine.ready_seq(job.available_at)
        assert tasks.add.get_result(r.id).args == r.args
    assert [c.id for c in claim(now=None)] == [uuid.UUID(r.id) for r in results]


@db
def test_enqueue_many_results_equal_what_enqueue_returns_field_by_field():
    """enqueue_many builds its results through the slots (backend._batch_results): each must
    equal, field by field, the result enqueue and get_result give for such a job."""
    many = tasks.add.using(queue_name="sums", trace_id="t-1").enqueue_many([(1, 2), {"a": 3, "b": 4}])
    one = tasks.add.using(queue_name="sums", trace_id="t-1").enqueue(1, 2)
    for got in many:
        fields = {f: getattr(got, f) for f in backend_module._BATCH_FIELDS}
        expected = {f: getattr(one, f) for f in backend_module._BATCH_FIELDS}
        expected.update(id=got.id, args=got.args, kwargs=got.kwargs, enqueued_at=got.enqueued_at)
        assert fields == expected
        stored = tasks.add.get_result(got.id)  # its task is the declared one, without .using()'s options
        assert {f: getattr(stored, f) for f in backend_module._BATCH_FIELDS - {"task"}} == {
            f: getattr(got, f) for f in backend_module._BATCH_FIELDS - {"task"}
        }
        assert (got.attempts, got.is_finished, got.errors, got.duplicate) == (0, False, [], False)
        with pytest.raises(ValueError, match="not finished yet"):
            _ = got.return_value
        got.refresh()
        assert got.status == TaskResultStatus.READY
    assert many[0].errors is not many[1].errors, "each result has its own lists"


@db
def test_enqueue_many_accepts_tuples_lists_dicts_and_call():
    results = tasks.echo.enqueue_many(
        [(1, 2), [3], {"a": 1}, django_jobs.call(4, b=[5]), django_jobs.call(), ((1, 2),)]
    )
    expected = [([1, 2], {}), ([3], {}), ([], {"a": 1}), ([4], {"b": [5]}), ([], {}), ([[1, 2]], {})]
    assert [(r.args, r.kwargs) for r in results] == expected
    rows = {str(j.id): (j.args, j.kwargs) for j in Job.objects.all()}
    assert [rows[r.id] for r in results] == expected
    assert django_jobs.call(1, x=2) == JobCall((1,), {"x": 2})


@db
@pytest.mark.parametrize(
    ("item", "described"), [(5, "is an int"), ("ab", "is a str"), (None, "is a NoneType"), ({1}, "is a set")]
)
def test_enqueue_many_rejects_other_items_naming_the_index(item, described):
    with pytest.raises(InvalidTaskArguments) as info:
        tasks.echo.enqueue_many([(1,), {"a": 1}, item])
    assert str(info.value) == (
        f"enqueue_many item 2 {described}; pass a tuple of positional args, a dict of keyword args, "
        "or django_jobs.call(*args, **kwargs)."
    )
    assert not Job.objects.exists()


@db
def test_a_bad_item_in_a_later_chunk_leaves_no_job_at_all(enqueued_signals):
    bad = CHUNK + 7

    def items():
        for i in range(CHUNK * 2):
            if i == bad:
                # The first chunk was already written, in this transaction.
                assert Job.objects.count() == CHUNK
                yield i
            else:
                yield (i, i)

    with pytest.raises(InvalidTaskArguments, match=f"^enqueue_many item {bad} is an int;"):
        tasks.add.enqueue_many(items())
    assert Job.objects.count() == 0
    assert enqueued_signals == []


@db
@pytest.mark.parametrize(
    ("item", "exception", "message"),
    [
        ((datetime(2025, 1, 2, tzinfo=UTC),), InvalidTaskArguments, "enqueue_many item 2: args[0] is a datetime"),
        ({"k": "a\x00b"}, InvalidArgumentValue, "enqueue_many item 2: kwargs['k'] contains a NUL character"),
        (("x" * 2000,), PayloadTooLarge, "enqueue_many item 2: The job's arguments are 2006 bytes of JSON"),
    ],
)
def test_an_invalid_payload_raises_what_enqueue_raises_prefixed_with_the_index(item, exception, message):
    with pytest.raises(InvalidTaskArguments) as info:
        tasks.limited_echo.enqueue_many([(1,), (2,), item, (4,)])  # MAX_PAYLOAD_BYTES=1024
    assert type(info.value) is exception
    assert str(info.value).startswith(message)
    assert not Job.objects.exists()


@db
def test_enqueue_and_enqueue_many_reject_a_lone_surrogate():
    with pytest.raises(InvalidTaskArguments, match="lone surrogate"):
        tasks.echo.enqueue("\ud800")
    with pytest.raises(InvalidTaskArguments, match="^enqueue_many item 1: .*lone surrogate"):
        tasks.echo.enqueue_many([("ok",), ("\ud800",)])
    assert not Job.objects.exists()


@db
def test_enqueue_many_rolls_back_with_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue_many((i, i) for i in range(CHUNK + 3))
        assert Job.objects.count() == CHUNK + 3  # visible inside the transaction
        raise RuntimeError("roll back")
    assert not Job.objects.exists()


@committing
def test_enqueue_many_sends_task_enqueued_once_per_job_on_commit(enqueued_signals):
    with transaction.atomic():
        results = tasks.add.enqueue_many((i, i) for i in range(CHUNK + 3))
        assert enqueued_signals == []
    assert [s["task_result"] for s in enqueued_signals] == results
    assert {s["sender"] for s in enqueued_signals} == {type(tasks.add.get_backend())}
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue_many([(1, 1)])
        raise RuntimeError("roll back")
    assert len(enqueued_signals) == CHUNK + 3
    assert Job.objects.count() == CHUNK + 3


@committing
def test_a_failing_task_enqueued_receiver_does_not_stop_the_other_jobs_signals(enqueued_signals, caplog):
    def fails_once(sender, task_result, **kwargs):
        if task_result.args == [0, 0]:
            raise RuntimeError("receiver failed")

    task_enqueued.connect(fails_once)
    try:
        results = tasks.add.enqueue_many([(0, 0), (1, 1)])
    finally:
        task_enqueued.disconnect(fails_once)
    assert [s["task_result"].id for s in enqueued_signals] == [r.id for r in results]
    assert "receiver failed" in caplog.text


@db
def test_enqueue_many_registers_one_on_commit_callback(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        tasks.noop.enqueue_many(() for _ in range(CHUNK * 2 + 1))
    assert len(callbacks) == 1


@db
def test_enqueue_many_inserts_one_statement_per_chunk_and_notifies_once():
    with CaptureQueriesContext(connection) as queries:
        tasks.noop.enqueue_many(() for _ in range(CHUNK * 2 + 1))
    sql = [q["sql"] for q in queries.captured_queries]
    assert sum("INSERT INTO django_jobs_job" in s for s in sql) == 3
    pg = connection.vendor == "postgresql"
    notifies = [s for s in sql if "pg_notify" in s]
    assert sum("django_jobs_events" not in s for s in notifies) == (1 if pg else 0), "one wake-up for the batch"
    assert sum("django_jobs_events" in s for s in notifies) == (1 if pg else 0), "one events NOTIFY for the batch"
    assert Job.objects.count() == CHUNK * 2 + 1


@db
def test_enqueue_many_cuts_a_chunk_by_the_size_of_its_json_too(monkeypatch):
    # PostgreSQL sends a chunk's rows as one jsonb value (at most 256 MiB): a chunk stops at
    # _CHUNK_JSON_CHARS of JSON however few rows it has. Shrunk here to about 3 jobs' worth.
    monkeypatch.setattr(engine.insert, "_CHUNK_JSON_CHARS", 3 * len('["xxxxxxxxxx"]{}') + 1)
    with CaptureQueriesContext(connection) as queries:
        results = tasks.echo.enqueue_many([("x" * 10,) for _ in range(7)])
    inserts = [q for q in queries.captured_queries if "INSERT INTO django_jobs_job" in q["sql"]]
    assert len(inserts) == (3 if connection.vendor == "postgresql" else 1)  # 3 + 3 + 1 jobs
    stored = Job.objects.filter(id__in=[r.id for r in results]).order_by("seq", "id")
    assert [j.args for j in stored] == [["x" * 10]] * 7
    assert [str(j.id) for j in stored] == [r.id for r in results], "enqueue order kept across chunks"


@committing
def test_aenqueue_many_inserts_and_signals(enqueued_signals):
    async def enqueue():
        try:
            return await tasks.add.aenqueue_many([(1, 2), django_jobs.call(a=3, b=4)])
        finally:
            # The insert ran in asgiref's worker thread; close that thread's connection.
            await sync_to_async(connections.close_all)()

    results = asyncio.run(enqueue())
    assert [(r.args, r.kwargs) for r in results] == [([1, 2], {}), ([], {"a": 3, "b": 4})]
    assert Job.objects.count() == 2
    assert [s["task_result"].id for s in enqueued_signals] == [r.id for r in results]


@db
def test_enqueue_many_with_run_after_in_the_future_stores_delayed_jobs():
    run_after = timezone.now() + timedelta(hours=1)
    results = tasks.noop.using(run_after=run_after).enqueue_many([(), ()])
    assert all(r.status == TaskResultStatus.READY for r in results)
    jobs = list(Job.objects.all())
    assert {(j.state, j.available_at, j.seq) for j in jobs} == {
        (JobState.DELAYED, run_after, engine.ready_seq(run_after))
    }
    past = tasks.noop.using(run_after=timezone.now() - timedelta(hours=1)).enqueue_many([()])
    assert Job.objects.get(id=past[0].id).state == JobState.WAITING


@db
def test_enqueue_many_lifo_jobs_run_before_fifo_ones_the_last_given_first():
    fifo = tasks.noop.enqueue_many([(), (), ()])
    lifo = tasks.noop.using(lifo=True).enqueue_many([(), (), ()])
    assert Job.objects.get(id=lifo[0].id).options == {"lifo": True}
    expected = [r.id for r in lifo[::-1]] + [r.id for r in fifo]
    assert [str(i) for i in claim_one_by_one(now=None)] == expected


@db
def test_enqueue_many_of_nothing_returns_an_empty_list(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        assert tasks.noop.enqueue_many([]) == []
        assert tasks.noop.enqueue_many(iter(())) == []
    assert callbacks == []
    assert not Job.objects.exists()


@committing
def test_jobs_enqueued_many_at_once_run_through_a_worker(thread_worker, probe):
    fifo = tasks.mark.enqueue_many((probe, f"fifo-{i}") for i in range(5))
    lifo = tasks.lifo_mark.enqueue_many(django_jobs.call(probe, key=f"lifo-{i}") for i in range(3))
    thread_worker(concurrency=1, stop_when_empty=True).join()
    assert [r["key"] for r in read_records(probe)] == [
        "lifo-2",
        "lifo-1",
        "lifo-0",
        *(f"fifo-{i}" for i in range(5)),
    ]
    for result in [*fifo, *lifo]:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert [r.return_value for r in lifo] == ["lifo-0", "lifo-1", "lifo-2"]


@db
def test_one_hundred_thousand_jobs_from_a_generator_in_one_call_all_or_nothing(enqueued_signals):
    """The issue's size: 100,000 jobs stream through chunk by chunk; a bad last item undoes all."""
    n = 100_000

    def items(bad_at=None):
        for i in range(n):
            yield i if i == bad_at else (i, 1)

    with pytest.raises(InvalidTaskArguments, match=f"^enqueue_many item {n - 1} is an int;"):
        tasks.add.enqueue_many(items(bad_at=n - 1))
    assert Job.objects.count() == 0

    results = tasks.add.enqueue_many(items())
    assert len(results) == n and results[0].args == [0, 1] and results[-1].args == [n - 1, 1]
    assert Job.objects.filter(state="waiting").count() == n


# -- later chunks: no admission probe, no waiting for answers (pipelined on PostgreSQL) ----------


@db
def test_the_later_chunks_of_a_queue_without_a_size_limit_send_no_admission_probe():
    with CaptureQueriesContext(connection) as queries:
        results = tasks.noop.enqueue_many(() for _ in range(CHUNK * 3))
    probes = [q["sql"] for q in queries.captured_queries if "django_jobs_queuestate" in q["sql"]]
    assert len(probes) == 1, probes
    stored = Job.objects.filter(id__in=[r.id for r in results])
    assert stored.count() == CHUNK * 3
    assert len({j.enqueued_at for j in stored}) == 1, "one enqueued_at for the whole call"
    assert {r.enqueued_at for r in results} == {stored[0].enqueued_at}


@db
def test_a_size_limited_queue_admits_every_chunk():
    django_jobs.queue("bulk-cap").set_max_size(CHUNK + 10)
    with pytest.raises(django_jobs.QueueFull) as raised:
        tasks.noop.using(queue_name="bulk-cap").enqueue_many(() for _ in range(CHUNK * 2))
    assert raised.value.limit == CHUNK + 10
    assert not Job.objects.filter(queue="bulk-cap").exists()
    assert len(tasks.noop.using(queue_name="bulk-cap").enqueue_many(() for _ in range(CHUNK + 10))) == CHUNK + 10


@pytest.mark.postgres
@committing
def test_a_database_error_in_a_pipelined_later_chunk_is_djangos_and_leaves_no_job():
    """The chunks after the first are sent without waiting for their answers: an error the
    database raises in one of them still reaches the caller as Django's exception, the whole
    call is rolled back, and the connection goes on working."""
    from django.db import DatabaseError

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_refuse_13() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.args = '[13]'::jsonb THEN RAISE EXCEPTION 'refused 13' USING ERRCODE = 'check_violation'; END IF; "
            "RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_refuse_13 BEFORE INSERT ON django_jobs_job FOR EACH ROW EXECUTE FUNCTION test_refuse_13()"
        )
    try:
        items = [(i,) for i in range(CHUNK * 3)]
        items[CHUNK * 2 + 5] = (13,)
        with pytest.raises(DatabaseError, match="refused 13") as raised:
            tasks.echo.enqueue_many(items)
        assert type(raised.value).__module__ == "django.db.utils", type(raised.value)
        assert not Job.objects.exists()
        assert len(tasks.echo.enqueue_many([(1,), (2,)])) == 2, "the connection works after it"
        with transaction.atomic():
            tasks.echo.enqueue(3)
            with pytest.raises(DatabaseError, match="refused 13"):
                tasks.echo.enqueue_many(items)
            tasks.echo.enqueue(4)  # the caller's transaction goes on: only the call's savepoint rolled back
        assert sorted(j.args for j in Job.objects.all()) == [[1], [2], [3], [4]]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_refuse_13 ON django_jobs_job")
            cursor.execute("DROP FUNCTION IF EXISTS test_refuse_13()")


# -- task_enqueued for a batch: the receivers looked up once, each job to each of them ----------


@db
def test_enqueue_many_sends_each_job_to_every_receiver_for_its_sender_in_order(django_capture_on_commit_callbacks):
    from django_jobs.backend import JobsBackend

    calls = []

    def first(sender, task_result, **kwargs):
        calls.append(("first", sender, task_result.args))

    def second(sender, task_result, **kwargs):
        calls.append(("second", sender, task_result.args))

    def elsewhere(sender, task_result, **kwargs):  # connected for another sender: never called
        calls.append(("elsewhere", sender, task_result.args))

    task_enqueued.connect(first)
    task_enqueued.connect(second, sender=JobsBackend)
    task_enqueued.connect(elsewhere, sender=object)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            tasks.add.enqueue_many([(1, 1), (2, 2)])
    finally:
        for receiver in (first, second, elsewhere):
            task_enqueued.disconnect(
                receiver, sender=None if receiver is first else (JobsBackend if receiver is second else object)
            )
    assert calls == [
        ("first", JobsBackend, [1, 1]),
        ("second", JobsBackend, [1, 1]),
        ("first", JobsBackend, [2, 2]),
        ("second", JobsBackend, [2, 2]),
    ]


@committing
def test_enqueue_many_reaches_an_async_receiver_for_every_job():
    seen = []

    async def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        results = tasks.add.enqueue_many([(1, 1), (2, 2), (3, 3)])
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [r.id for r in results]


@db
def test_results_of_a_batch_hold_the_arguments_normalised_once():
    results = tasks.echo.enqueue_many([((1, (2, 3)),), {"k": (4,)}])
    assert (results[0].args, results[0].kwargs) == ([[1, [2, 3]]], {})
    assert (results[1].args, results[1].kwargs) == ([], {"k": [4]})
    assert tasks.echo.enqueue((5, 6)).args == [[5, 6]]
    stored = tasks.echo.get_result(results[0].id)
    assert stored.args == [[1, [2, 3]]], "a result read back is normalised as Django does"

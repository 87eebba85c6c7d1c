"""Encrypted jobs (``encrypt=True``): what is stored, what the task and get_result() see, what
monitoring shows (never the plain or encrypted values), key rotation, checks and errors."""

from __future__ import annotations

import io
import json
import threading
import uuid

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

import django_jobs
from django_jobs import engine, schedules
from django_jobs.checks import check_encryption
from django_jobs.exceptions import (
    DecryptionFailed,
    EncryptionKeysMissing,
    InvalidKeyRotation,
    InvalidTaskArguments,
    InvalidTaskOptions,
    PayloadTooLarge,
)
from django_jobs.models import Job, JobDedup, JobDedupNext, JobDependency
from django_jobs.spec.encryption import SHOWN, decrypt_json, encrypt_json, is_encrypted
from django_jobs.testing import assert_enqueued, drain_queue, perform_job
from tests import tasks_encrypted as te
from tests.conftest import read_log, wait_until
from tests.factories import claim_job, job_page, lock_waiters, pg_session, superuser_client

KEY_A = Fernet.generate_key().decode()
KEY_B = Fernet.generate_key().decode()
SECRET = "hunter2-secret"


def keys(*ring: str) -> override_settings:
    return override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, "ENCRYPTION_KEYS": list(ring)})


@pytest.fixture
def key_a():
    with keys(KEY_A):
        yield


def raw(job_id: str, column: str) -> str:
    """A column of the job's row as the database returns it, before any decoding."""
    with connection.cursor() as cursor:
        pk = Job._meta.pk.get_db_prep_value(uuid.UUID(job_id), connection)
        cursor.execute(f"SELECT {column} FROM django_jobs_job WHERE id = %s", [pk])
        value = cursor.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


def stored(job_id: str) -> Job:
    return Job.objects.get(id=job_id)


def assert_hidden(text: str, job_id: str) -> None:
    """Neither the secret nor any stored token of the job appears in ``text``."""
    assert SECRET not in text
    job = stored(job_id)
    tokens = [v["$encrypted"] for v in (job.args, job.kwargs, job.return_value) if is_encrypted(v)]
    tokens += [e["traceback"]["$encrypted"] for e in job.errors if is_encrypted(e.get("traceback"))]
    assert tokens
    for token in tokens:
        assert token[:40] not in text


# -- what is stored and what callers get --------------------------------------------------------


@pytest.mark.django_db
def test_arguments_are_stored_encrypted_and_read_back_plain(key_a):
    result = te.echo.enqueue(1, SECRET, note=SECRET)
    assert (result.args, result.kwargs) == ([1, SECRET], {"note": SECRET})
    job = stored(result.id)
    assert is_encrypted(job.args) and is_encrypted(job.kwargs)
    assert job.options["encrypt"] is True
    for column in ("args", "kwargs"):
        assert SECRET not in raw(result.id, column)
    fresh = te.echo.get_result(result.id)
    assert (fresh.args, fresh.kwargs) == ([1, SECRET], {"note": SECRET})
    assert_enqueued(te.echo, args=[1, SECRET], kwargs={"note": SECRET})


@pytest.mark.django_db
def test_using_turns_encryption_on_and_off(key_a):
    on = te.plain.using(encrypt=True).enqueue(SECRET)
    off = te.echo.using(encrypt=False).enqueue(SECRET)
    assert is_encrypted(stored(on.id).args)
    assert stored(off.id).args == [SECRET] and "encrypt" not in stored(off.id).options
    assert te.plain.get_result(on.id).args == [SECRET]


@pytest.mark.django_db
def test_enqueue_many_stores_each_job_encrypted(key_a):
    results = te.echo.enqueue_many([(SECRET,), {"k": SECRET}, django_jobs.call(2, k=SECRET)])
    assert [r.args for r in results] == [[SECRET], [], [2]]
    for r in results:
        assert SECRET not in raw(r.id, "args") + raw(r.id, "kwargs")
        assert is_encrypted(stored(r.id).args)
    assert te.echo.get_result(results[2].id).kwargs == {"k": SECRET}


@pytest.mark.django_db
def test_the_return_value_and_tracebacks_are_stored_encrypted(key_a):
    done = perform_job(te.echo, SECRET)
    assert done.return_value == {"args": [SECRET], "kwargs": {}}
    assert is_encrypted(stored(done.id).return_value)
    assert SECRET not in raw(done.id, "return_value")

    failed = te.leaks.enqueue(SECRET)
    drain_queue()
    result = te.leaks.get_result(failed.id)
    assert result.status == "FAILED" and len(result.errors) == 2
    assert f"refused secret {SECRET}" in result.errors[-1].traceback
    job = stored(failed.id)
    assert [e["exception_class_path"] for e in job.errors] == ["builtins.ValueError"] * 2  # readable
    assert all(is_encrypted(e["traceback"]) for e in job.errors)
    assert SECRET not in raw(failed.id, "errors")


@pytest.mark.django_db
def test_arguments_are_validated_before_encryption_and_the_cap_is_on_the_plain_json(key_a):
    from datetime import datetime

    with pytest.raises(InvalidTaskArguments, match=r"args\[0\] is a datetime"):
        te.echo.enqueue(datetime.now())
    limited = te.plain.using(backend="limited", encrypt=True)  # MAX_PAYLOAD_BYTES = 1024
    fits = "x" * 1000  # 1006 bytes of JSON; encrypted, well over 1024
    result = limited.enqueue(fits)
    assert len(raw(result.id, "args")) > 1024
    assert limited.get_result(result.id).args == [fits]
    with pytest.raises(PayloadTooLarge, match="over MAX_PAYLOAD_BYTES=1024"):
        limited.enqueue("x" * 1030)
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_an_encrypted_job_without_keys_is_refused_and_nothing_is_stored():
    with keys():
        with pytest.raises(EncryptionKeysMissing, match="ENCRYPTION_KEYS"):
            te.echo.enqueue(SECRET)
        with pytest.raises(EncryptionKeysMissing):
            te.echo.enqueue_many([(SECRET,)])
        te.plain.enqueue(1)  # a plain job needs no key
    assert list(Job.objects.values_list("task_path", flat=True)) == ["tests.tasks_encrypted.plain"]


@pytest.mark.django_db
def test_encrypt_must_be_a_bool():
    with pytest.raises(InvalidTaskOptions, match="encrypt must be True or False; got 'yes'"):
        te.plain.using(encrypt="yes")


@pytest.mark.django_db
def test_dedup_and_idempotency_keys_of_encrypted_jobs_are_stored_hashed(key_a):
    first = te.deduplicated.enqueue(42, SECRET)
    again = te.deduplicated.enqueue(42, "other")
    assert again.duplicate and again.id == first.id and again.args == [42, SECRET]
    assert stored(first.id).dedup_key.startswith("sha256:")
    assert not JobDedup.objects.filter(key__contains="user:42").exists()

    key = f"order-{SECRET}"
    one = te.echo.using(idempotency_key=key).enqueue(1)
    two = te.echo.using(idempotency_key=key).enqueue(2)
    assert two.duplicate and two.id == one.id and two.args == [1]
    assert SECRET not in raw(one.id, "idempotency_key")


# -- keys: rotation, a missing key ----------------------------------------------------------------


@pytest.mark.django_db
def test_a_new_first_key_encrypts_old_keys_decrypt_and_rotation_re_encrypts():
    with keys(KEY_A):
        old = perform_job(te.echo, SECRET)
        failed = te.leaks.enqueue(SECRET)
        drain_queue()
    with keys(KEY_B, KEY_A):
        assert te.echo.get_result(old.id).return_value == {"args": [SECRET], "kwargs": {}}
        new = te.echo.enqueue(SECRET)
        token = stored(new.id).args["$encrypted"].encode()
        assert Fernet(KEY_B).decrypt(token)  # the first key encrypts
        with pytest.raises(InvalidToken):
            Fernet(KEY_A).decrypt(token)
        seen = []
        done = django_jobs.rotate_keys(batch_size=1, on_batch=lambda t: seen.append(t.examined))
        assert (done.examined, done.rotated, done.undecryptable) == (3, 2, [])  # the new job had B already
        assert seen == [1, 2, 3]
        assert django_jobs.rotate_keys().rotated == 0  # a second run writes nothing
    with keys(KEY_B):  # A removed: everything still reads
        assert te.echo.get_result(old.id).return_value == {"args": [SECRET], "kwargs": {}}
        assert SECRET in te.leaks.get_result(failed.id).errors[0].traceback
        assert te.echo.get_result(new.id).args == [SECRET]


@pytest.mark.django_db
def test_rotation_reports_jobs_no_key_decrypts_and_checks_its_options():
    with keys(KEY_A):
        job = te.echo.enqueue(SECRET)
    with keys(KEY_B):
        done = django_jobs.rotate_keys()
        assert done.undecryptable == [job.id] and done.rotated == 0
        with pytest.raises(DecryptionFailed):
            te.echo.get_result(job.id)
        with pytest.raises(InvalidKeyRotation, match="batch_size"):
            django_jobs.rotate_keys(batch_size=0)
        with pytest.raises(InvalidKeyRotation, match="after must be a job id"):
            django_jobs.rotate_keys(after="nope")
    with keys(), pytest.raises(EncryptionKeysMissing):
        django_jobs.rotate_keys()


@pytest.mark.django_db
def test_jobs_rotate_keys_command_reports_counts_and_resumes_after_an_id():
    with keys(KEY_A):
        ids = [te.echo.enqueue(i).id for i in range(3)]
    with keys(KEY_B, KEY_A):
        out = io.StringIO()
        call_command("jobs", "rotate-keys", "--batch-size", "2", "--after", ids[0], stdout=out)
        assert "Re-encrypted 2 of 2 encrypted job(s)" in out.getvalue()
        out = io.StringIO()
        call_command("jobs", "rotate-keys", stdout=out)
        assert (
            "Re-encrypted 1 of 3 encrypted job(s) with the first key (2 had it already), 0 flow value(s) and 0 "
            "stashed dedup enqueue(s)." in out.getvalue()
        )
        with pytest.raises(CommandError, match="batch_size must be an integer from 1 to 10,000"):
            call_command("jobs", "rotate-keys", "--batch-size", "0", stdout=io.StringIO())
    with keys(KEY_A), pytest.raises(CommandError, match="3 encrypted value"):
        call_command("jobs", "rotate-keys", stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_rotation_waits_for_a_concurrent_outcome_and_re_encrypts_it_instead_of_losing_it():
    with keys(KEY_A):
        job = te.echo.enqueue(SECRET)
        claim_job(job)
        late = json.dumps({"$encrypted": Fernet(KEY_A).encrypt(b'"late result"').decode()})
    session = pg_session()
    try:
        with session.cursor() as cursor:  # a worker's outcome write, not committed yet
            cursor.execute(
                "UPDATE django_jobs_job SET state = 'completed', return_value = %s::jsonb WHERE id = %s",
                [late, job.id],
            )
        done: list = []

        def rotate() -> None:
            with keys(KEY_B, KEY_A):
                done.append(django_jobs.rotate_keys())
            connection.close()

        thread = threading.Thread(target=rotate)
        thread.start()
        wait_until(lambda: lock_waiters() >= 1, message="the rotation to wait for the row lock")
        session.commit()
        thread.join(30)
    finally:
        session.close()
    assert done and done[0].rotated == 1
    with keys(KEY_B):
        result = te.echo.get_result(job.id)
        assert result.return_value == "late result" and result.args == [SECRET]


@pytest.mark.django_db
def test_flow_children_values_reach_the_parent_decrypted_are_never_copied_in_clear_and_rotate():
    with keys(KEY_A):
        ok = django_jobs.flow(te.gather, children=[django_jobs.flow(te.echo, args=(SECRET,))]).enqueue()
        failing = django_jobs.flow(
            te.gather, children=[django_jobs.flow(te.leaks.using(max_attempts=1), args=(SECRET,))]
        )
        failed = failing.enqueue()
        drain_queue()
        assert te.gather.get_result(ok.id).return_value is True
        edge = JobDependency.objects.get(parent_id=ok.id)
        assert is_encrypted(edge.value)
        parent_error = te.gather.get_result(failed.id).errors[0]
        assert parent_error.exception_class_path == "django_jobs.exceptions.ChildFailed"
        assert SHOWN in parent_error.traceback and SECRET not in parent_error.traceback
        assert is_encrypted(JobDependency.objects.get(parent_id=failed.id).value["traceback"])
        body = superuser_client().get(job_page(ok.id)).content.decode()
        assert edge.value["$encrypted"][:40] not in body and SHOWN in body
    with keys(KEY_B, KEY_A):
        done = django_jobs.rotate_keys()
        assert (done.examined, done.rotated, done.flow_values) == (2, 2, 2)  # the two children; the parents are plain
    with keys(KEY_B):
        values = engine.children_values(using="default", parent_id=uuid.UUID(ok.id))
        assert values["results"] == {str(edge.child_id): {"args": [SECRET], "kwargs": {}}}
        failures = engine.children_values(using="default", parent_id=uuid.UUID(failed.id))["failures"]
        [error] = failures.values()
        assert f"refused secret {SECRET}" in error["traceback"]  # decrypted with the new key


@pytest.mark.django_db
def test_a_stashed_dedup_enqueue_keeps_its_arguments_encrypted_and_rotates():
    with keys(KEY_A):
        holder = te.kept_last.enqueue("first")
        claim_job(holder)  # running: the next enqueue is stashed
        stashed = te.kept_last.enqueue(SECRET)
        assert stashed.duplicate
        payload = JobDedupNext.objects.get().payload
        assert is_encrypted(payload["args"]) and SECRET not in json.dumps(payload)
    with keys(KEY_B, KEY_A):
        assert django_jobs.rotate_keys().stashes == 1
    with keys(KEY_B):
        assert decrypt_json(JobDedupNext.objects.get().payload["args"]) == [SECRET]


# -- never shown --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_admin_shows_encrypted_where_the_values_would_be(key_a):
    done = perform_job(te.echo, SECRET)
    failed = te.leaks.enqueue(SECRET)
    drain_queue()
    client = superuser_client()
    for job_id in (done.id, failed.id):
        body = client.get(job_page(job_id)).content.decode()
        assert SHOWN in body and "stored encrypted" in body
        assert_hidden(body, job_id)
    listing = client.get("/admin/django_jobs/job/").content.decode()
    assert "ValueError: encrypted (not shown)" in listing
    assert_hidden(listing, failed.id)


@pytest.mark.django_db
def test_jobs_show_and_list_never_print_encrypted_values(key_a):
    failed = te.leaks.enqueue(SECRET)
    drain_queue()
    out = io.StringIO()
    call_command("jobs", "show", failed.id, stdout=out)
    text = out.getvalue()
    assert f"args        {SHOWN}" in text and "builtins.ValueError" in text
    assert_hidden(text, failed.id)
    out = io.StringIO()
    call_command("jobs", "list", stdout=out)
    assert_hidden(out.getvalue(), failed.id)


@pytest.mark.django_db(transaction=True)  # events are read once their transaction committed
def test_events_and_metrics_carry_no_encrypted_value(key_a):
    failed = te.leaks.enqueue(SECRET)
    drain_queue()
    page = django_jobs.events(job=failed.id)
    assert {e.kind for e in page.events} >= {"enqueued", "failed"}
    assert_hidden(json.dumps([e.data for e in page.events], default=str), failed.id)
    client = superuser_client()
    metrics = client.get("/metrics/").content.decode()
    assert "django_jobs" in metrics
    assert_hidden(metrics, failed.id)


@pytest.mark.django_db(transaction=True)
def test_the_worker_log_names_the_error_class_only(thread_worker, caplog):
    with keys(KEY_A):
        failed = te.leaks.using(max_attempts=1).enqueue(SECRET)
        with caplog.at_level("DEBUG", logger="django_jobs.worker.jobs"):
            worker = thread_worker()
            wait_until(lambda: stored(failed.id).state == "failed", timeout=30)
            worker.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "django_jobs.worker.jobs"]
    assert any("ValueError (its message is not logged: the job is encrypted)" in line for line in lines)
    assert_hidden("\n".join(lines), failed.id)


# -- the worker ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_worker_process_decrypts_the_arguments_and_encrypts_the_result(worker_process, probe, isolation):
    with keys(KEY_A):
        ok = te.recorded.enqueue(probe, SECRET)
        bad = te.leaks.enqueue(SECRET)
    proc = worker_process("-c", "2", "--isolation", isolation, env={"JOBS_TEST_ENCRYPTION_KEYS": KEY_A})
    wait_until(lambda: stored(ok.id).state == "completed" and stored(bad.id).state == "failed", timeout=60)
    with open(probe) as fh:
        assert json.loads(fh.readline()) == {"secret": SECRET}
    assert is_encrypted(stored(ok.id).return_value)
    with keys(KEY_A):
        assert te.recorded.get_result(ok.id).return_value == f"done {SECRET}"
        assert SECRET in te.leaks.get_result(bad.id).errors[0].traceback
    proc.terminate()
    proc.wait(30)
    assert SECRET not in read_log(proc)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_without_the_key_fails_the_job_and_goes_on(worker_process):
    with keys(KEY_A):
        locked = te.echo.enqueue(SECRET)
    other = te.plain.enqueue(1)
    worker_process(env={"JOBS_TEST_ENCRYPTION_KEYS": KEY_B})
    wait_until(lambda: stored(locked.id).state == "failed" and stored(other.id).state == "completed", timeout=60)
    assert stored(locked.id).errors[-1]["exception_class_path"] == "django_jobs.exceptions.DecryptionFailed"
    assert is_encrypted(stored(locked.id).args)  # left as stored: retry it once the key is back


@pytest.mark.django_db
def test_a_schedule_of_an_encrypted_task_enqueues_encrypted_jobs(key_a):
    sched = schedules.schedule("nightly-secret", te.echo, every=3600, args=[SECRET])
    assert SECRET in json.dumps(sched.args)  # declared in code or by your call: not job data
    job = schedules.run_now(sched)
    assert is_encrypted(stored(job.id).args) and SECRET not in raw(str(job.id), "args")
    drain_queue()
    assert te.echo.get_result(str(job.id)).return_value == {"args": [SECRET], "kwargs": {}}


@pytest.mark.django_db
def test_a_plain_job_pays_nothing_its_rows_and_results_are_as_before():
    result = perform_job(te.plain, {"x": 1})
    job = stored(result.id)
    assert job.args == [{"x": 1}] and job.return_value == {"x": 1} and "encrypt" not in job.options


# -- the codec, checks ---------------------------------------------------------------------------


def test_the_codec_round_trips_json_and_refuses_what_no_key_decrypts():
    with keys(KEY_A):
        envelope = encrypt_json({"a": [1, "é", None]})
        assert set(envelope) == {"$encrypted"} and decrypt_json(envelope) == {"a": [1, "é", None]}
        with pytest.raises(DecryptionFailed, match="got a list"):
            decrypt_json([1])
        with pytest.raises(DecryptionFailed):
            decrypt_json({"$encrypted": "not a token"})
    with keys(KEY_B), pytest.raises(DecryptionFailed, match="None of"):
        decrypt_json(envelope)


def test_check_e009_reports_bad_keys_without_printing_them():
    with keys("short", KEY_A, KEY_A):
        found = [m for m in check_encryption() if m.id == "django_jobs.E009"]
    assert [m.msg for m in found] == [
        "ENCRYPTION_KEYS[0] is not a Fernet key (44 characters of URL-safe base64 encoding 32 bytes, as "
        "Fernet.generate_key() makes); got a str of 5 characters.",
        "ENCRYPTION_KEYS lists the same key twice.",
    ]
    assert KEY_A not in " ".join(m.msg for m in found)
    with override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, "ENCRYPTION_KEYS": KEY_A}):
        assert [m.msg for m in check_encryption() if m.id == "django_jobs.E009"] == [
            "ENCRYPTION_KEYS must be a list of Fernet keys (the first encrypts); got a str of 44 characters."
        ]


def test_check_e009_when_cryptography_is_missing(monkeypatch):
    import sys

    from django_jobs.spec import encryption

    monkeypatch.setitem(sys.modules, "cryptography", None)
    encryption._ring.cache_clear()
    with keys(Fernet.generate_key().decode()):
        found = [m for m in check_encryption() if m.id == "django_jobs.E009"]
    assert len(found) == 1 and "django-db-jobs[encryption]" in found[0].msg


def test_check_w003_names_encrypted_tasks_when_there_is_no_key():
    with keys():
        found = [m for m in check_encryption() if m.id == "django_jobs.W003"]
    assert len(found) == 1 and "tests.tasks_encrypted.echo" in found[0].msg
    with keys(KEY_A):
        assert not [m for m in check_encryption() if m.id == "django_jobs.W003"]


def test_the_package_imports_and_runs_plain_jobs_without_cryptography():
    from tests.test_layers import run_python

    loaded = run_python(
        """
        import json, sys
        sys.modules["cryptography"] = None  # as if not installed
        django.setup()
        from django.core.management import call_command
        from django.test import override_settings
        import django_jobs.backend, django_jobs.engine, django_jobs.worker, django_jobs.checks
        from django_jobs.exceptions import CryptographyMissing
        from django_jobs.testing import perform_job
        from django.tasks import task

        @task
        def plain(value):
            return value

        @task(encrypt=True)
        def echo(value):
            return value

        call_command("migrate", verbosity=0)
        with override_settings(DJANGO_JOBS={"ENCRYPTION_KEYS": [THE_KEY]}):
            done = perform_job(plain, {"x": 1})
            try:
                echo.enqueue(1)
                refused = ""
            except CryptographyMissing as exc:
                refused = str(exc)
        print(json.dumps([done.status, done.return_value, refused]))
        """.replace("THE_KEY", repr(KEY_A))
    )
    assert loaded[:2] == ["SUCCESSFUL", {"x": 1}]
    assert "django-db-jobs[encryption]" in loaded[2]

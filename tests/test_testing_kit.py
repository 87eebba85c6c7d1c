"""The test kit (django_jobs.testing), used as a project's own tests would use it: inside the
test's transaction (``@pytest.mark.django_db``, ``django.test.TestCase``) and outside one."""

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.tasks.signals import task_finished, task_started
from django.test import TestCase
from django.utils import timezone

from django_jobs.exceptions import InvalidTaskArguments
from django_jobs.models import Job, JobLog
from django_jobs.testing import DrainResult, assert_enqueued, drain_queue, enqueued_jobs, perform_job, refute_enqueued
from tests import tasks, tasks_control
from tests.factories import job_row, jobs_settings
from tests.tasks_kit import (
    SENT,
    always_snoozes,
    argument_types,
    charge_card,
    flaky,
    import_rows,
    rate_limited,
    send_welcome_email,
    sign_up,
    user_exists,
)


@pytest.fixture(autouse=True)
def _clear_sent():
    SENT.clear()


# -- assert_enqueued -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_assert_enqueued_matches_by_task_and_returns_the_matches_oldest_first():
    first = send_welcome_email.enqueue("ada@example.com")
    second = send_welcome_email.enqueue("bob@example.com")
    sign_up.enqueue("cy@example.com")

    found = assert_enqueued(send_welcome_email)

    assert [r.id for r in found] == [first.id, second.id]
    assert [r.args for r in found] == [["ada@example.com"], ["bob@example.com"]]
    assert found[0].status == "READY" and found[0].task.func is send_welcome_email.func


@pytest.mark.django_db
def test_assert_enqueued_matches_by_args_kwargs_and_queue():
    by_args = send_welcome_email.enqueue("ada@example.com")
    by_kwargs = send_welcome_email.enqueue(email="bob@example.com", template="promo")
    on_emails = send_welcome_email.using(queue_name="emails").enqueue("cy@example.com")

    assert [r.id for r in assert_enqueued(send_welcome_email, args=["ada@example.com"])] == [by_args.id]
    assert [r.id for r in assert_enqueued(send_welcome_email, args=("ada@example.com",))] == [by_args.id]
    assert [
        r.id for r in assert_enqueued(send_welcome_email, kwargs={"template": "promo", "email": "bob@example.com"})
    ] == [by_kwargs.id]
    [match] = assert_enqueued(send_welcome_email, queue="emails")
    assert match.id == on_emails.id and match.task.queue_name == "emails"
    assert [r.id for r in assert_enqueued(send_welcome_email, args=["cy@example.com"], kwargs={}, queue="emails")] == [
        on_emails.id
    ]
    # Every given filter must match: the right args on the wrong queue is no match.
    with pytest.raises(AssertionError):
        assert_enqueued(send_welcome_email, args=["ada@example.com"], queue="emails")
    # kwargs are compared whole, not as a subset.
    with pytest.raises(AssertionError):
        assert_enqueued(send_welcome_email, kwargs={"email": "bob@example.com"})


@pytest.mark.django_db
def test_assert_enqueued_compares_arguments_as_stored_after_the_json_round_trip():
    """The values a test passes are the ones it enqueued: a tuple is stored as a list, so a
    tuple in the expected arguments must match it too."""
    result = argument_types.enqueue((1, 2), point=(3, 4))

    assert [r.id for r in assert_enqueued(argument_types, args=[(1, 2)])] == [result.id]
    assert [r.id for r in assert_enqueued(argument_types, kwargs={"point": (3, 4)})] == [result.id]
    refute_enqueued(argument_types, args=[(1, 3)])


@pytest.mark.django_db
def test_assert_enqueued_checks_the_count():
    send_welcome_email.enqueue("ada@example.com")
    send_welcome_email.enqueue("ada@example.com")
    send_welcome_email.enqueue("bob@example.com")

    assert len(assert_enqueued(send_welcome_email, count=3)) == 3
    assert len(assert_enqueued(send_welcome_email, args=["ada@example.com"], count=2)) == 2
    assert assert_enqueued(send_welcome_email, args=["cy@example.com"], count=0) == []
    with pytest.raises(
        AssertionError, match=r"Expected 1 job\(s\) of tests\.tasks_kit\.send_welcome_email .*found 2\."
    ):
        assert_enqueued(send_welcome_email, args=["ada@example.com"], count=1)


@pytest.mark.django_db
def test_assert_enqueued_message_lists_what_is_enqueued_for_the_task():
    send_welcome_email.enqueue("ada@example.com")
    send_welcome_email.using(queue_name="emails").enqueue(email="bob@example.com")
    sign_up.enqueue("not-listed@example.com")  # another task's job is not listed

    with pytest.raises(AssertionError) as info:
        assert_enqueued(send_welcome_email, args=["cy@example.com"], queue="default")

    message = str(info.value)
    assert message.startswith(
        "Expected a job of tests.tasks_kit.send_welcome_email with args=['cy@example.com'], queue='default' "
        "enqueued, found 0."
    )
    assert "(args=['ada@example.com'], kwargs={}, queue='default')" in message
    assert "(args=[], kwargs={'email': 'bob@example.com'}, queue='emails')" in message
    assert "not-listed" not in message


@pytest.mark.django_db
def test_assert_enqueued_message_says_none_when_nothing_is_enqueued_for_the_task():
    sign_up.enqueue("ada@example.com")

    with pytest.raises(AssertionError) as info:
        assert_enqueued(send_welcome_email)

    assert str(info.value) == (
        "Expected a job of tests.tasks_kit.send_welcome_email enqueued, found 0. Enqueued for this task: none."
    )


@pytest.mark.parametrize(
    "kit_function", [assert_enqueued, refute_enqueued, enqueued_jobs, perform_job], ids=lambda f: f.__name__
)
def test_the_kit_raises_type_error_for_a_function_that_is_not_a_task(kit_function):
    with pytest.raises(TypeError, match=rf"{kit_function.__name__}\(\) takes a @task function .*got function"):
        kit_function(send_welcome_email.func)


@pytest.mark.django_db
def test_jobs_already_run_are_not_enqueued():
    performed = perform_job(send_welcome_email, "ada@example.com")
    send_welcome_email.enqueue("bob@example.com")
    drain_queue()

    assert performed.status == "SUCCESSFUL"
    refute_enqueued(send_welcome_email)
    assert enqueued_jobs() == []
    with pytest.raises(AssertionError, match="found 0. Enqueued for this task: none."):
        assert_enqueued(send_welcome_email, args=["ada@example.com"])


# -- refute_enqueued -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_listing_shows_ten_jobs_and_counts_the_rest():
    for i in range(12):
        send_welcome_email.enqueue(f"user{i}@example.com")

    with pytest.raises(AssertionError) as info:
        assert_enqueued(send_welcome_email, args=["nobody@example.com"])

    message = str(info.value)
    assert "user9@example.com" in message and "user10@example.com" not in message
    assert message.endswith(" and 2 more.")


@pytest.mark.django_db
def test_refute_enqueued_passes_when_no_job_matches():
    refute_enqueued(send_welcome_email)
    send_welcome_email.enqueue("ada@example.com")
    refute_enqueued(send_welcome_email, args=["bob@example.com"])
    refute_enqueued(send_welcome_email, queue="emails")
    refute_enqueued(sign_up)


@pytest.mark.django_db
def test_refute_enqueued_raises_with_a_listing_when_a_job_matches():
    send_welcome_email.enqueue("ada@example.com")
    send_welcome_email.enqueue(email="bob@example.com")

    with pytest.raises(AssertionError) as info:
        refute_enqueued(send_welcome_email, args=["ada@example.com"])

    assert str(info.value) == (
        "Expected no job of tests.tasks_kit.send_welcome_email with args=['ada@example.com'] enqueued, found 1: "
        "(args=['ada@example.com'], kwargs={}, queue='default'); "
        "(args=[], kwargs={'email': 'bob@example.com'}, queue='default')."
    )


# -- enqueued_jobs -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueued_jobs_lists_jobs_oldest_first_delayed_ones_included():
    a = send_welcome_email.enqueue("a@example.com")
    b = sign_up.using(run_after=timedelta(hours=1)).enqueue("b@example.com")
    c = send_welcome_email.using(queue_name="emails").enqueue("c@example.com")
    d = send_welcome_email.using(run_after=timezone.now() + timedelta(days=1)).enqueue("d@example.com")

    assert [r.id for r in enqueued_jobs()] == [a.id, b.id, c.id, d.id]
    assert job_row(b).state == "delayed" and job_row(d).state == "delayed"
    assert [r.id for r in enqueued_jobs(send_welcome_email)] == [a.id, c.id, d.id]
    assert [r.id for r in enqueued_jobs(queue="emails")] == [c.id]
    assert [r.id for r in enqueued_jobs(send_welcome_email, args=["d@example.com"])] == [d.id]
    assert [r.id for r in enqueued_jobs(sign_up, kwargs={})] == [b.id]
    assert enqueued_jobs(sign_up, kwargs={"email": "b@example.com"}) == []
    assert [r.id for r in assert_enqueued(sign_up, args=["b@example.com"])] == [b.id]


# -- perform_job ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_perform_job_runs_the_task_now_and_returns_its_result():
    result = perform_job(send_welcome_email, "ada@example.com", template="promo")

    assert SENT == ["ada@example.com"]
    assert result.status == "SUCCESSFUL"
    assert result.return_value == "sent promo to ada@example.com"
    assert result.args == ["ada@example.com"] and result.kwargs == {"template": "promo"}
    assert result.finished_at is not None and len(result.worker_ids) == 1
    stored = job_row(result)
    assert (stored.state, stored.attempts, stored.return_value) == ("completed", 1, "sent promo to ada@example.com")


@pytest.mark.django_db
def test_perform_job_round_trips_the_arguments_through_json():
    result = perform_job(argument_types, (1, 2), {"nested": (3,)}, point=(4, 5))

    assert result.return_value == {"args": ["list", "dict"], "kwargs": {"point": "list"}}
    assert result.args == [[1, 2], {"nested": [3]}] and result.kwargs == {"point": [4, 5]}


@pytest.mark.django_db
def test_perform_job_rejects_arguments_that_are_not_json_before_running():
    with pytest.raises(InvalidTaskArguments, match=r"args\[0\] is a datetime, which is not JSON"):
        perform_job(send_welcome_email, datetime.now())
    with pytest.raises(InvalidTaskArguments, match=r"kwargs\['template'\] is a set"):
        perform_job(send_welcome_email, "ada@example.com", template={"a"})

    assert SENT == []
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_perform_job_of_a_failing_task_with_attempts_left_schedules_a_retry():
    before = timezone.now()
    result = perform_job(flaky, 2)

    assert result.status == "READY"
    assert len(result.errors) == 1
    assert result.errors[0].exception_class_path == "builtins.RuntimeError"
    assert "attempt 1 failed" in result.errors[0].traceback
    stored = job_row(result)
    assert (stored.state, stored.attempts) == ("delayed", 1)
    assert stored.available_at >= before + timedelta(seconds=3600)  # the task's backoff
    # perform_job runs one attempt only; the retry waits for its backoff (drain_queue runs it).
    assert drain_queue(with_retries=False) == DrainResult()


@pytest.mark.django_db
def test_perform_job_of_a_failing_task_on_its_last_attempt_fails_it():
    result = perform_job(flaky.using(max_attempts=1), 2)

    assert result.status == "FAILED"
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"]
    assert result.finished_at is not None
    assert job_row(result).state == "failed"


@pytest.mark.django_db
def test_perform_job_applies_fail_from_the_task():
    result = perform_job(charge_card, "fail")

    assert result.status == "FAILED", "Fail ends the job although attempts remain"
    assert [e.exception_class_path for e in result.errors] == ["django_jobs.exceptions.Fail"]
    assert "card declined" in result.errors[0].traceback


@pytest.mark.django_db
def test_perform_job_applies_retry_from_the_task():
    before = timezone.now()
    result = perform_job(charge_card, "retry")

    assert result.status == "READY"
    assert [e.exception_class_path for e in result.errors] == ["django_jobs.exceptions.Retry"]
    assert "gateway busy" in result.errors[0].traceback
    stored = job_row(result)
    assert (stored.state, stored.attempts) == ("delayed", 1)
    assert before + timedelta(seconds=30) <= stored.available_at < before + timedelta(seconds=3600), (
        "the Retry's delay, not the task's backoff"
    )


@pytest.mark.django_db
def test_perform_job_applies_snooze_from_the_task():
    before = timezone.now()
    result = perform_job(charge_card, "snooze")

    assert result.status == "READY"
    assert result.errors == []
    stored = job_row(result)
    assert (stored.state, stored.attempts) == ("delayed", 0), "a snoozed attempt does not count"
    assert stored.available_at >= before + timedelta(seconds=60)


@pytest.mark.django_db
def test_perform_job_gives_a_context_task_its_job_context():
    result = perform_job(tasks.context_details)

    assert result.status == "SUCCESSFUL"
    assert result.return_value == {
        "class": "django_jobs.context.JobContext",
        "attempt": 1,
        "job_id": result.id,
        "result_id": result.id,
        "queue": "default",
        "max_attempts": 1,
        "is_last_attempt": True,
        "parent_id": None,
    }


@pytest.mark.django_db
def test_perform_job_stores_context_log_lines_and_progress():
    result = perform_job(import_rows, 3)

    assert result.status == "SUCCESSFUL"
    assert result.return_value == {"logged": [True, True, True], "progressed": True}
    assert list(JobLog.objects.filter(job_id=result.id).values_list("line", flat=True)) == ["row 0", "row 1", "row 2"]
    assert result.progress == {"done": 3, "of": 3}


@pytest.mark.django_db
def test_perform_job_runs_an_async_task():
    result = perform_job(tasks.async_add, 2, 3)

    assert result.status == "SUCCESSFUL"
    assert result.return_value == 5


@pytest.mark.django_db
def test_perform_job_runs_an_async_task_that_reads_the_tests_data():
    """The kit works inside the test's transaction: an async task's queries see what the test
    wrote, as a sync task's do."""
    User.objects.create(username="ada")

    result = perform_job(user_exists, "ada")

    assert result.status == "SUCCESSFUL"
    assert result.return_value is True


@pytest.mark.django_db
def test_perform_job_runs_its_own_job_only():
    other = send_welcome_email.enqueue("bob@example.com")

    perform_job(send_welcome_email, "ada@example.com")

    assert SENT == ["ada@example.com"]
    assert [r.id for r in assert_enqueued(send_welcome_email)] == [other.id]


@pytest.mark.django_db
def test_perform_job_runs_a_task_scheduled_for_later_at_once():
    result = perform_job(send_welcome_email.using(run_after=timedelta(hours=1)), "ada@example.com")

    assert result.status == "SUCCESSFUL"
    assert SENT == ["ada@example.com"]


@pytest.mark.django_db
def test_perform_job_applies_the_configured_middleware():
    tasks_control.CALLS.clear()
    with jobs_settings(MIDDLEWARE=["tests.tasks_control.outer_middleware"]):
        result = perform_job(send_welcome_email, "ada@example.com")

    assert result.status == "SUCCESSFUL"
    assert tasks_control.CALLS == [
        ("outer", "before", result.id),
        ("outer", "after", "sent welcome to ada@example.com"),
    ]


@pytest.mark.django_db
def test_perform_job_sends_task_started_and_task_finished():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((kwargs["signal"], task_result.id, task_result.status))

    task_started.connect(receiver, weak=False)
    task_finished.connect(receiver, weak=False)
    try:
        result = perform_job(send_welcome_email, "ada@example.com")
    finally:
        task_started.disconnect(receiver)
        task_finished.disconnect(receiver)

    assert seen == [(task_started, result.id, "RUNNING"), (task_finished, result.id, "SUCCESSFUL")]


# -- drain_queue ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_drain_queue_runs_every_ready_job_and_counts_them():
    send_welcome_email.enqueue("ada@example.com")
    send_welcome_email.using(queue_name="emails").enqueue("bob@example.com")
    charge_card.enqueue("fail")
    charge_card.enqueue("snooze")

    counts = drain_queue()

    assert counts == DrainResult(completed=2, failed=1, snoozed=1)
    assert counts.total == 4
    assert sorted(SENT) == ["ada@example.com", "bob@example.com"]
    [snoozed] = enqueued_jobs()
    assert snoozed.args == ["snooze"], "a snoozed job waits for its time unless with_scheduled=True"


@pytest.mark.django_db
def test_drain_queue_runs_only_the_queue_given():
    send_welcome_email.enqueue("ada@example.com")
    on_emails = send_welcome_email.using(queue_name="emails").enqueue("bob@example.com")

    assert drain_queue("emails") == DrainResult(completed=1)

    assert SENT == ["bob@example.com"]
    assert job_row(on_emails).state == "completed"
    [left] = assert_enqueued(send_welcome_email, queue="default")
    assert left.args == ["ada@example.com"]


@pytest.mark.django_db
def test_drain_queue_runs_retries_to_completion_by_default():
    result = flaky.enqueue(3)

    assert drain_queue() == DrainResult(completed=1, retried=2)

    result.refresh()
    assert result.status == "SUCCESSFUL" and result.return_value == 3
    assert len(result.errors) == 2


@pytest.mark.django_db
def test_drain_queue_without_retries_leaves_a_retry_waiting_for_its_backoff():
    result = flaky.enqueue(2)

    assert drain_queue(with_retries=False) == DrainResult(retried=1)

    stored = job_row(result)
    assert (stored.state, stored.attempts, len(stored.errors)) == ("delayed", 1, 1)
    assert drain_queue(with_retries=False) == DrainResult()
    assert drain_queue() == DrainResult(completed=1)
    assert job_row(result).state == "completed"


@pytest.mark.django_db
def test_drain_queue_runs_scheduled_jobs_only_with_scheduled():
    later = send_welcome_email.using(run_after=timedelta(hours=1)).enqueue("ada@example.com")

    assert drain_queue() == DrainResult()
    assert job_row(later).state == "delayed" and SENT == []

    assert drain_queue(with_scheduled=True) == DrainResult(completed=1)
    assert job_row(later).state == "completed" and SENT == ["ada@example.com"]


@pytest.mark.django_db
def test_drain_queue_runs_jobs_enqueued_by_jobs_it_runs():
    signup = sign_up.enqueue("ada@example.com")

    assert drain_queue("default") == DrainResult(completed=2)

    assert job_row(signup).state == "completed"
    assert SENT == ["ada@example.com"]
    refute_enqueued(send_welcome_email)
    assert Job.objects.filter(task_path=send_welcome_email.module_path, state="completed").count() == 1


@pytest.mark.django_db
def test_drain_queue_leaves_a_job_snoozed_after_a_retry_for_later():
    """A snooze is a scheduled run, not a retry, even when an earlier attempt of the job
    failed: without with_scheduled, drain_queue leaves it for later."""
    result = rate_limited.enqueue()

    assert drain_queue() == DrainResult(retried=1, snoozed=1)

    stored = job_row(result)
    assert (stored.state, stored.attempts, len(stored.errors)) == ("delayed", 1, 1)


@pytest.mark.django_db
def test_drain_queue_raises_after_max_rounds_for_a_job_that_keeps_snoozing():
    result = always_snoozes.enqueue()

    with pytest.raises(RuntimeError) as info:
        drain_queue(with_scheduled=True, max_rounds=3)

    message = str(info.value)
    assert "after 3 rounds" in message
    assert "keeps retrying or snoozing" in message
    assert "max_rounds" in message
    assert job_row(result).attempts == 0


# -- in a django.test.TestCase, and outside a test transaction ----------------------------------


class TestKitInATestCase(TestCase):
    def test_assert_enqueued_and_perform_job(self):
        send_welcome_email.enqueue("ada@example.com")

        [enqueued] = assert_enqueued(send_welcome_email, args=["ada@example.com"])
        result = perform_job(send_welcome_email, *enqueued.args)

        self.assertEqual(result.status, "SUCCESSFUL")
        self.assertEqual(result.return_value, "sent welcome to ada@example.com")

    def test_drain_queue_and_refute_enqueued(self):
        sign_up.enqueue("ada@example.com")
        flaky.enqueue(2)

        self.assertEqual(drain_queue(), DrainResult(completed=3, retried=1))
        refute_enqueued(send_welcome_email)
        refute_enqueued(flaky)
        self.assertEqual(SENT, ["ada@example.com"])


@pytest.mark.django_db(transaction=True)
def test_the_kit_works_outside_a_test_transaction():
    sign_up.enqueue("ada@example.com")
    assert_enqueued(sign_up, args=["ada@example.com"], count=1)

    assert drain_queue() == DrainResult(completed=2)
    refute_enqueued(sign_up)
    refute_enqueued(send_welcome_email)

    result = perform_job(flaky, 1)
    assert result.status == "SUCCESSFUL" and result.return_value == 1
    assert SENT == ["ada@example.com"]


@pytest.mark.django_db
def test_the_kit_rejects_unclear_input_with_a_clear_error():
    from django_jobs.testing import drain_queue, enqueued_jobs

    with pytest.raises(TypeError, match="args must be a list or tuple"):
        enqueued_jobs(args="ab")
    with pytest.raises(TypeError, match="kwargs must be a dict"):
        enqueued_jobs(kwargs=[("a", 1)])
    with pytest.raises(ValueError, match="max_rounds must be an integer >= 1"):
        drain_queue(max_rounds=0)

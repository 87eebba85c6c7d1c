"""context.log(): ordered lines in JobLog, kept in order under concurrency, capped per job."""

import pytest
from django.test import override_settings

from django_jobs.models import JobLog
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_log_lines_keep_one_order_under_concurrency(thread_worker):
    result = tasks.chatty.enqueue(6, 40)
    thread_worker(concurrency=1, stop_when_empty=True).join()
    result.refresh()
    assert result.status == "SUCCESSFUL"
    rows = list(JobLog.objects.filter(job_id=result.id).order_by("idx").values_list("idx", "line"))
    assert [idx for idx, _ in rows] == list(range(240)), "positions are contiguous and unique"
    for t in range(6):
        mine = [int(line.split()[1]) for _, line in rows if line.startswith(f"t{t} ")]
        assert mine == list(range(40)), f"thread {t}'s lines are stored in the order it wrote them"


def test_log_is_capped_per_job_with_a_truncation_notice(thread_worker):
    with override_settings(DJANGO_JOBS={"LOG_MAX_LINES": 10, "POLL_INTERVAL": 0.2, "PROMOTE_INTERVAL": 0.2}):
        result = tasks.chatty.enqueue(1, 25)
        thread_worker(concurrency=1, stop_when_empty=True).join()
    lines = list(JobLog.objects.filter(job_id=result.id).order_by("idx").values_list("line", flat=True))
    assert len(lines) == 10
    assert lines[:9] == [f"t0 {i}" for i in range(9)]
    assert "log truncated at 10 lines" in lines[9]


def test_log_of_a_job_that_is_not_running_is_not_stored():
    from django_jobs.context import JobContext

    result = tasks.noop.enqueue()
    import uuid

    context = JobContext(
        task_result=result, job_id=result.id, queue="default", max_attempts=1, lease_token=uuid.uuid4()
    )
    assert context.log("nobody holds this lease") is False
    assert not JobLog.objects.exists()


def test_racing_writers_without_a_shared_context_still_get_unique_positions():
    """Two writers of one job that do not share a context (so no common Python lock) are still
    serialised by the engine, so every line is stored once at its own position."""
    import threading

    from django.db import connection

    from django_jobs import engine

    tasks.noop.enqueue()
    [job] = engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w", lease_seconds=60)
    stored = []

    def write(t):
        for i in range(30):
            stored.append(
                engine.append_job_log(
                    using="default", job_id=job.id, lease_token=job.lease_token, line=f"{t}-{i}", max_lines=1000
                )
            )
        connection.close()

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(stored) and len(stored) == 120
    idxs = sorted(JobLog.objects.filter(job_id=job.id).values_list("idx", flat=True))
    assert idxs == list(range(120))

import pytest

from django_jobs.models import Job
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_job_enqueued_runs_and_result_comes_back(thread_worker):
    from tests.conftest import wait_until

    result = tasks.add.enqueue(2, 3)
    worker = thread_worker(concurrency=2)
    wait_until(lambda: Job.objects.get(id=result.id).state == "completed")
    worker.stop()
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.return_value == 5
    assert result.worker_ids == [worker.worker.worker_id]

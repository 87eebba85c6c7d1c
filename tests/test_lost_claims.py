"""A claim whose answer is lost (issue 12, point 1), on every database, with a worker in a thread.

The connection-cutting proxy (tests/test_lost_answers.py) loses real answers on PostgreSQL; here
the same two situations are made on SQLite too: rows that a claim took for this worker while the
worker never heard of them, and a claim that commits and then raises as a lost connection does.
"""

from __future__ import annotations

import time

import pytest
from django.db import OperationalError
from django.test import override_settings

from django_jobs import engine
from django_jobs.models import Job
from tests import tasks
from tests.tasks import read_records

pytestmark = pytest.mark.django_db(transaction=True)


def test_rows_claimed_for_the_worker_without_its_knowledge_are_not_renewed_and_run(thread_worker, probe):
    """The worker renews only the leases it knows it holds: a row claimed under its id by a claim
    whose answer it never got expires, is rescued and runs; --stop-when-empty then ends."""
    job = tasks.mark.enqueue(probe, "orphan")
    with override_settings(DJANGO_JOBS={"LEASE_SECONDS": 1.0, "RESCUE_INTERVAL": 0.2, "POLL_INTERVAL": 0.1}):
        # The claim of a worker with this id whose answer never arrived.
        [orphan] = engine.claim_jobs(using="default", queues=None, limit=1, worker_id="w-lost", lease_seconds=1.0)
        assert str(orphan.id) == job.id
        started = time.monotonic()
        worker = thread_worker(worker_id="w-lost", concurrency=2, stop_when_empty=True)
        worker.join(timeout=20)
    assert time.monotonic() - started < 15
    stored = Job.objects.get(id=job.id)
    assert (stored.state, stored.stalled_count) == ("completed", 1), "rescued once, then run"
    assert [r["key"] for r in read_records(probe)] == ["orphan"]


def test_a_claim_that_commits_and_then_loses_its_answer_hands_its_jobs_back(thread_worker, probe, monkeypatch):
    ids = [tasks.mark.enqueue(probe, f"k{i}").id for i in range(3)]
    real_claim = engine.claim_jobs
    lost = []

    def claim_then_lose_the_answer(**kwargs):
        jobs = real_claim(**kwargs)  # committed (autocommit)
        if jobs and not lost:
            lost.extend(j.id for j in jobs)
            raise OperationalError("server closed the connection unexpectedly")
        return jobs

    monkeypatch.setattr(engine, "claim_jobs", claim_then_lose_the_answer)
    # A long lease: only the release can make these jobs run within the test's time.
    with override_settings(DJANGO_JOBS={"LEASE_SECONDS": 60.0, "POLL_INTERVAL": 0.1}):
        stats = thread_worker(concurrency=3, stop_when_empty=True).join(timeout=20)
    assert lost, "the fault was injected"
    assert sorted(r["key"] for r in read_records(probe)) == ["k0", "k1", "k2"], "each ran exactly once"
    stored = {j.id: j for j in Job.objects.filter(id__in=ids)}
    assert {j.state for j in stored.values()} == {"completed"}
    assert all(stored[i].attempts == 1 and stored[i].stalled_count == 0 for i in lost), "handed back, not rescued"
    assert stats.completed == 3

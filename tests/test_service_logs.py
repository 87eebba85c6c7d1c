"""What the background services log: their counts are internals, at DEBUG, never INFO (the
worker's own lines say what they meant for the jobs)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from django_jobs.conf import get_settings
from django_jobs.models import Job
from django_jobs.services import Promoter
from tests.factories import insert_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_service_run_that_changed_something_is_logged_at_debug_only(caplog):
    then = timezone.now() - timedelta(minutes=1)
    job = insert_job(now=then, run_after=then + timedelta(seconds=30))
    assert Job.objects.get(id=job.id).state == "delayed"
    promoter = Promoter(using="default", settings=get_settings(), interval=1.0)

    with caplog.at_level(logging.DEBUG, logger="django_jobs"):
        assert promoter.tick(is_leader=True) == {"promoted": 1}

    records = [r for r in caplog.records if r.name == "django_jobs.services"]
    assert [(r.levelno, r.getMessage()) for r in records] == [(logging.DEBUG, "promoter: {'promoted': 1}")]
    assert Job.objects.get(id=job.id).state == "waiting"

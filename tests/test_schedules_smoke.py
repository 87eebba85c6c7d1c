from datetime import UTC, datetime, timedelta

import pytest

from django_jobs import schedules
from django_jobs.models import Job, Schedule

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.django_db
def test_smoke_every_second():
    s = schedules.schedule("tick", "tests.tasks.noop", every=1)
    s.next_run_at = T0
    s.save()
    counts = schedules.fire_due(backend="default", now=T0 + timedelta(seconds=2.5))
    assert counts == {"fired": 3, "skipped": 0, "lost_race": 0}
    assert Job.objects.count() == 3
    assert Schedule.objects.get().next_run_at == T0 + timedelta(seconds=3)
    assert schedules.fire_due(backend="default", now=T0 + timedelta(seconds=2.5))["fired"] == 0

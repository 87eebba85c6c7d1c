"""Leadership: one lease row per backend alias on the database's clock (engine.take_leadership).
The worker that holds it runs the leader-only services; another takes it once it expires or is
given up. The processes' own clocks play no part."""

from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from django_jobs import engine
from django_jobs.models import Lease
from tests.factories import race

db = pytest.mark.django_db
committing = pytest.mark.django_db(transaction=True)


def take(worker: str, seconds: float = 30, backend: str = "default") -> bool:
    return engine.take_leadership(using="default", backend=backend, worker_id=worker, seconds=seconds)


def leader(backend: str = "default") -> str | None:
    return engine.leader_id(using="default", backend=backend)


@db
def test_the_first_worker_leads_and_the_second_does_not_while_the_lease_runs():
    assert leader() is None
    assert take("a")
    assert not take("b")
    assert take("a"), "the holder renews"
    assert leader() == "a"
    assert Lease.objects.get(name="leader:default").holder == "a"


@db
def test_an_expired_leadership_passes_to_the_next_worker_that_asks():
    assert take("a", seconds=0.2)
    assert not take("b")
    time.sleep(0.3)
    assert leader() is None, "nobody leads once the lease expired"
    assert take("b")
    assert not take("a"), "the old leader does not take it back while b's lease runs"
    assert leader() == "b"


@db
def test_a_leader_that_resigns_lets_the_next_worker_lead_at_once():
    assert take("a")
    engine.resign_leadership(using="default", backend="default", worker_id="b")
    assert leader() == "a", "only the holder can resign"
    engine.resign_leadership(using="default", backend="default", worker_id="a")
    assert leader() is None
    assert take("b")


@db
def test_each_backend_alias_has_its_own_leader():
    assert take("a", backend="default")
    assert take("b", backend="other")
    assert (leader("default"), leader("other")) == ("a", "b")


@db
def test_the_workers_own_clock_does_not_decide():
    """A host whose clock runs an hour ahead neither takes a running lease nor sees it expired."""
    assert take("a")
    ahead = timezone.now() + timedelta(hours=1)
    with mock.patch("django.utils.timezone.now", return_value=ahead):
        assert not take("b")
        assert leader() == "a"


@committing
def test_workers_racing_for_a_new_lease_elect_exactly_one():
    won = race(6, lambda i: take(f"w{i}"))
    assert sum(won) == 1, won
    assert leader() == f"w{won.index(True)}"

"""worker.holdings.Leases: a claim's lease token is renewed while any of its jobs is held."""

from __future__ import annotations

import uuid

from django_jobs.worker.holdings import Leases


def test_leases_count_each_claims_jobs_until_the_last_is_dropped():
    a, b = uuid.uuid4(), uuid.uuid4()
    leases = Leases()
    leases.add([a, a, a, b])
    leases.drop([a, b, a])
    assert leases.tokens() == [a]
    leases.drop([a, b])  # b again: already gone, and never counted below zero
    assert leases.tokens() == []
    leases.add([b])
    assert leases.tokens() == [b]

"""A build of django-jobs with the features' probes taken out of a plain job's hot path, for the
"pay for what you use" A/B (``benchmarks/plain_ab.py``). Never used outside benchmarks.

Applied (by ``benchmarks/settings.py`` when ``JOBS_BENCH_STRIPPED=1``, in every process of the
run) it removes, from what a job with no partition, no dedup or idempotency key, no parent and
no schedule, in a queue with no limit, sends to the database:

* the claim's "skip paused and limited queues" condition (``j.queue NOT IN (SELECT ... FROM
  django_jobs_queue ...)``) and its "is it this partition's turn" condition;
* the insert's "this queue has no size limit" guard (a primary-key probe of the queue table),
  where a path still sends it: since ``engine.size_limits`` a plain ``enqueue()`` into a queue
  without a size limit sends none in the shipped build either.

What is left is what a queue without those features would need anyway: the ready-index walk,
the lease, the outcome, the events and the metrics. The stripped build is wrong for queues that
use the features: benchmark plain jobs only.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig

_saved: dict[str, Any] = {}


#: Where each replaced function is looked up: (engine module, name) pairs.
_SITES = (("claim", "_claim_statement"), ("claim", "_partition_free"), ("insert", "_insert_job"), ("dedup", "_insert_job"))  # fmt: skip


def apply() -> None:
    from django_jobs.engine import claim as claim_module
    from django_jobs.engine import insert as insert_module

    if _saved:
        return
    modules = _modules()
    _saved.update({site: getattr(modules[site[0]], site[1]) for site in _SITES})
    claim, insert = claim_module._claim_statement, insert_module._insert_job

    def plain_claim_statement(d: Any, *, where: list[str], **kwargs: Any) -> tuple[str, list[Any]]:
        kept = [w for w in where if not w.startswith("j.queue NOT IN (SELECT q.name")]
        return claim(d, where=kept, **kwargs)

    def plain_insert_job(
        cursor: Any, d: Any, job: Any, *, wake: bool, once: bool = False, guarded: bool = False
    ) -> Any:
        return insert(cursor, d, job, wake=wake, once=once, guarded=False)

    plain = {"_claim_statement": plain_claim_statement, "_insert_job": plain_insert_job,
             "_partition_free": lambda d, concurrency: "TRUE"}  # fmt: skip
    for module, name in _SITES:
        setattr(modules[module], name, plain[name])


def undo() -> None:
    modules = _modules()
    for (module, name), value in _saved.items():
        setattr(modules[module], name, value)
    _saved.clear()


def _modules() -> dict[str, Any]:
    from django_jobs.engine import claim, dedup, insert

    return {"claim": claim, "dedup": dedup, "insert": insert}


class Stripped(AppConfig):
    """In INSTALLED_APPS (benchmarks/settings.py, ``JOBS_BENCH_STRIPPED=1``): every process of the
    run, the worker included, gets the stripped build once the apps are ready."""

    name = "benchmarks"
    label = "benchmarks_stripped"

    def ready(self) -> None:
        apply()

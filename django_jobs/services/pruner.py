from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.utils import timezone

from .. import engine, retention
from .base import Service


class Pruner(Service):
    """Keeps history bounded: deletes finished jobs whose retention ended (``purge_at``, set when
    they finished), jobs beyond a count limit (per queue, per task), events beyond
    ``EVENTS_MAX_PER_QUEUE`` per queue and Metric rows older than ``METRICS_KEEP_DAYS``.

    Each batch of ``PRUNE_BATCH_SIZE`` rows is its own short transaction and locks only the
    rows it deletes (SKIP LOCKED), so workers are never held up; one run stops after about a
    second and the next run goes on. Unfinished jobs are never touched. Leader only; runs every
    ``PRUNE_INTERVAL``.

    Counts: ``jobs`` (expired), ``over_count`` (beyond a count limit), ``events``, ``metrics``.
    """

    name = "pruner"
    leader_only = True
    #: Seconds one run may spend deleting expired jobs (and as long again trimming events) before
    #: it yields to the next run.
    budget = 1.0

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        batch = self.settings.PRUNE_BATCH_SIZE
        deadline = time.monotonic() + self.budget
        counts = {"jobs": 0, "over_count": 0, "events": 0, "metrics": 0}
        while True:
            n = engine.prune_expired_jobs(using=self.using, limit=batch, now=now)
            counts["jobs"] += n
            if n < batch or time.monotonic() > deadline:
                break
        limits = retention.count_limits()
        if limits:
            queues = engine.known_queues(using=self.using)
            for scope, name, state, keep in limits:
                for queue in [name] if scope == "queue" else queues:
                    counts["over_count"] += engine.prune_over_count(
                        using=self.using, queue=queue, state=state, keep=keep, limit=batch
                    )
        for task_path, state, keep in retention.task_count_limits():
            for queue in engine.known_queues(using=self.using):
                counts["over_count"] += engine.prune_over_count(
                    using=self.using, queue=queue, state=state, keep=keep, limit=batch, task_path=task_path
                )
        # Batch after batch while some queue is over its maximum: a busy queue writes more events
        # between two runs than one batch deletes.
        while True:
            n = engine.trim_events(using=self.using, keep=self.settings.EVENTS_MAX_PER_QUEUE, limit=batch)
            counts["events"] += n
            if n == 0 or time.monotonic() > deadline + self.budget:
                break
        oldest = (now or timezone.now()) - timedelta(days=self.settings.METRICS_KEEP_DAYS)
        counts["metrics"] = engine.trim_metrics(using=self.using, older_than=oldest, limit=batch)
        return counts

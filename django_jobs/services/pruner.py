from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from .. import engine
from ..db import retry_transient
from ..engine.topic_metrics import trim_topic_metrics
from ..models import known_queues
from ..spec import retention
from .base import Service, logger


class Pruner(Service):
    """Keeps history bounded: deletes finished jobs whose retention ended (``purge_at``, set when
    they finished), jobs beyond a count limit (per queue, per task), events beyond
    ``EVENTS_MAX_PER_QUEUE`` per queue, and Metric and TopicMetric rows older than
    ``METRICS_KEEP_DAYS``.

    Each batch of ``PRUNE_BATCH_SIZE`` rows is its own short transaction and locks only the
    rows it deletes (SKIP LOCKED), so workers are never held up; a batch picked as a deadlock
    victim runs again. One run stops after about a second and the next run goes on. Unfinished
    jobs are never touched. Leader only; runs every ``PRUNE_INTERVAL``.

    Counts: ``jobs`` (expired), ``over_count`` (beyond a count limit), ``events``, ``metrics``,
    ``topic_metrics``.
    """

    name = "pruner"
    leader_only = True
    #: Seconds one run may spend deleting expired jobs (and as long again trimming events) before
    #: it yields to the next run.
    budget = 1.0

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        batch = self.settings.PRUNE_BATCH_SIZE
        deadline = time.monotonic() + self.budget
        counts = {"jobs": 0, "over_count": 0, "events": 0, "metrics": 0, "topic_metrics": 0}

        def repeat(step: Any) -> int:
            """Run ``step`` batch after batch while it deletes full batches and time is left. A
            batch the database picks as a deadlock victim (MariaDB, with a worker writing an
            outcome) was rolled back whole, and runs again."""
            total = 0
            while True:
                n = retry_transient(step, what="Pruner batch", logger=logger)
                total += n
                if n < batch or time.monotonic() > deadline:
                    return total

        counts["jobs"] = repeat(lambda: engine.prune_expired_jobs(using=self.using, limit=batch, now=now))
        for queue, state, keep, task_path, exclude in self._count_limits():
            counts["over_count"] += repeat(
                lambda q=queue, s=state, k=keep, t=task_path, x=exclude: engine.prune_over_count(
                    using=self.using, queue=q, state=s, keep=k, limit=batch, task_path=t, exclude_tasks=x, now=now
                )
            )
        # A busy queue writes more events between two runs than one batch deletes.
        deadline += self.budget
        counts["events"] = repeat(
            lambda: engine.trim_events(using=self.using, keep=self.settings.EVENTS_MAX_PER_QUEUE, limit=batch)
        )
        oldest = (now or timezone.now()) - timedelta(days=self.settings.METRICS_KEEP_DAYS)
        counts["metrics"] = repeat(lambda: engine.trim_metrics(using=self.using, older_than=oldest, limit=batch))
        counts["topic_metrics"] = repeat(lambda: trim_topic_metrics(using=self.using, older_than=oldest, limit=batch))
        return counts

    def _count_limits(self) -> list[tuple[str, str, int, str | None, list[str]]]:
        """``(queue, state, keep, task or None, tasks to leave out)`` for every count limit, the
        most specific policy winning: a task's own policy for a state takes its jobs out of the
        queue's and the global limit; a queue's takes the queue out of the global one."""
        limits = retention.count_limits()
        task_limits = retention.task_count_limits()
        if not limits and not task_limits:
            return []
        # The queues with a QueueState row or finished jobs (Metric rows, over every minute kept;
        # cancelled jobs write none, docs/howto/retention.md), read without the job table.
        queues = known_queues(
            using=self.using, recent=engine.metric_queues(using=self.using), unfinished=(), declared=False
        )
        out = []
        for scope, name, state, keep in limits:
            exclude = retention.task_policies(state)
            if scope == "queue":
                out.append((name, state, keep, None, exclude))
            else:
                own = retention.queue_policies(state)
                out += [(q, state, keep, None, exclude) for q in queues if q not in own]
        for task_path, state, keep in task_limits:
            out += [(q, state, keep, task_path, []) for q in queues]
        return out

"""Prometheus metrics, through the optional ``prometheus-client`` library (the ``prometheus`` extra).

Two sources, because a count of finished jobs can be a true counter only where the jobs finish:

* :class:`DatabaseCollector` reads the database at scrape time (``django_jobs.views.metrics``
  serves it): the backlog per queue and state, the oldest waiting job's age, the pause flags,
  the live workers, and what finished in the last hour. Finished jobs are counted from the
  per-minute Metric rows, which the pruner trims, so their sums go down as minutes leave the
  window: they are gauges named ``..._last_hour``, never counters. Bus mode's messages are
  different: a topic's partitions count what was published and a group's cursors what it
  consumed, in columns that only grow, so those are true counters (``..._total``) read from
  the database, beside each group's lag, dead letters, blocked partitions and leases.
* :class:`WorkerMetrics` counts in a worker process (``runworker --metrics-port``): the outcomes
  it stored and the run time of each attempt, true counters and a histogram that only grow
  while the process lives, so ``rate()`` and ``histogram_quantile()`` work on them.

docs/howto/prometheus.md lists every metric. Nothing here imports prometheus_client at module
level: the package stays importable without it, and using a metric without it raises
:class:`~django_jobs.exceptions.PrometheusClientMissing`.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

from django.db import connections
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from .backend import JobsBackend
from .console import queue_stats, workers
from .console_topics import topic_counters
from .exceptions import InvalidWorkerOption, JobsConfigurationError, PrometheusClientMissing
from .states import UNFINISHED_STATES
from .worker.options import require_int
from .worker.stats import OUTCOME_KINDS

__all__ = [
    "RUN_SECONDS_BUCKETS",
    "DatabaseCollector",
    "LiveWorkersCollector",
    "WorkerMetrics",
    "exposition",
    "prometheus_client",
]

#: The highest TCP port.
MAX_PORT = 65535
#: The buckets of ``django_jobs_worker_run_seconds``: 5 ms to an hour.
RUN_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


def prometheus_client() -> ModuleType:
    """The prometheus_client module; :class:`PrometheusClientMissing` when it is not installed."""
    try:
        # Optional: the "prometheus" extra. core holds the metric families collectors yield.
        import prometheus_client as client
        import prometheus_client.core  # noqa: F401
    except ImportError:
        raise PrometheusClientMissing() from None
    return client


def database_of(backend: Any) -> str:
    """The database alias of the JobsBackend ``backend`` names in TASKS; JobsConfigurationError
    for anything else."""
    if not isinstance(backend, str):
        raise JobsConfigurationError(f"backend must be an alias in TASKS (a string); got {backend!r}.")
    try:
        backend_obj = task_backends[backend]
    except InvalidTaskBackend:
        raise JobsConfigurationError(
            f"No task backend {backend!r} in TASKS; pass the alias of a JobsBackend."
        ) from None
    if not isinstance(backend_obj, JobsBackend):
        raise JobsConfigurationError(
            f"TASKS[{backend!r}] is {type(backend_obj).__name__}; metrics need a django_jobs.backend.JobsBackend."
        )
    return backend_obj.database


class _Collector:
    """What both collectors share: a backend's database, read on the scraping thread, whose
    connection is closed after each scrape (a scrape thread of the worker's HTTP server would
    otherwise leave one open per request)."""

    def __init__(self, *, backend: str = "default", close_connection: bool = False):
        self.client = prometheus_client()
        self.backend = backend
        self.using = database_of(backend)
        self.close_connection = close_connection

    def describe(self) -> list:
        # Registering a collector calls describe(), or else collect(): no query at registration.
        return []

    def collect(self) -> Iterator[Any]:
        try:
            yield from self._families()
        finally:
            if self.close_connection:
                connections[self.using].close()

    def _families(self) -> Iterator[Any]:
        raise NotImplementedError

    def _workers(self) -> Iterator[Any]:
        seen = workers(using=self.using, backend=self.backend)
        stale = sum(1 for w in seen.rows if w.stale)
        gauge = self.client.core.GaugeMetricFamily
        yield gauge(
            "django_jobs_workers",
            "Worker processes whose heartbeat is fresh (newer than three leases).",
            value=len(seen.rows) - stale,
        )
        yield gauge(
            "django_jobs_workers_stale",
            "Worker rows whose heartbeat is older than three leases (the process is probably gone).",
            value=stale,
        )


class DatabaseCollector(_Collector):
    """The queues and workers of ``backend`` and the topics of its database as the database
    holds them at scrape time, in nine queries whatever the number of jobs and messages. Five
    are those of the queues dashboard (:mod:`django_jobs.console`): unfinished jobs are counted
    through their partial index and finished ones from the last hour's Metric rows, never with a
    COUNT over the job table. Four are bus mode's (:func:`~django_jobs.console_topics.topic_counters`):
    the partitions, the cursors, the groups and the dead letters, each grouped, never the
    message table."""

    def _families(self) -> Iterator[Any]:
        gauge = self.client.core.GaugeMetricFamily
        jobs = gauge("django_jobs_queue_jobs", "Unfinished jobs per queue and state.", labels=["queue", "state"])
        oldest = gauge(
            "django_jobs_queue_oldest_waiting_age_seconds",
            "How long the queue's longest-waiting ready job has been ready (0: none waits).",
            labels=["queue"],
        )
        paused = gauge("django_jobs_queue_paused", "1 while the queue is paused.", labels=["queue"])
        hour = {
            kind: gauge(
                f"django_jobs_queue_{kind}_last_hour",
                f"Jobs {kind} in the last 60 minutes (a windowed sum: it goes down as minutes leave the window).",
                labels=["queue"],
            )
            for kind in ("completed", "failed", "retried")
        }
        runtime = gauge(
            "django_jobs_queue_run_seconds_last_hour",
            "Run time of the jobs completed or failed in the last 60 minutes, summed (last attempts).",
            labels=["queue"],
        )
        for q in queue_stats(using=self.using, backend=self.backend):
            for state in UNFINISHED_STATES:
                jobs.add_metric([q.name, state], q.row.counts.get(state, 0))
            age = q.oldest_waiting_age
            oldest.add_metric([q.name], age.total_seconds() if age is not None else 0.0)
            paused.add_metric([q.name], 1 if q.row.paused else 0)
            hour["completed"].add_metric([q.name], q.hour.completed)
            hour["failed"].add_metric([q.name], q.hour.failed)
            hour["retried"].add_metric([q.name], q.hour.retried)
            runtime.add_metric([q.name], q.hour.runtime_ms / 1000)
        yield from (jobs, oldest, paused, *hour.values(), runtime)
        yield from self._workers()
        yield from self._topics()

    def _topics(self) -> Iterator[Any]:
        gauge, counter = self.client.core.GaugeMetricFamily, self.client.core.CounterMetricFamily
        group = ["topic", "group"]
        published = counter(
            "django_jobs_topic_published",
            "Messages published to the topic (its partitions' positions).",
            labels=["topic"],
        )
        consumed = counter(
            "django_jobs_topic_consumed",
            "Messages the group got through, by outcome: acked, dead_lettered, expired (skipped past max_wait).",
            labels=[*group, "outcome"],
        )
        lag = gauge("django_jobs_topic_lag", "Messages published and not yet consumed by the group.", labels=group)
        dead = gauge(
            "django_jobs_topic_dead_letters",
            "The group's stored dead letters (dead, queued for replay or replaying).",
            labels=group,
        )
        blocked = gauge(
            "django_jobs_topic_partitions_blocked",
            'Partitions stopped by on_failure="block" until an operator retries or skips them.',
            labels=group,
        )
        held = gauge(
            "django_jobs_topic_leases_held", "Partitions whose batch a worker holds under a live lease.", labels=group
        )
        expired = gauge(
            "django_jobs_topic_leases_expired",
            "Leases run out and not yet taken over: their worker died or stalls.",
            labels=group,
        )
        paused = gauge("django_jobs_topic_group_paused", "1 while the group is paused.", labels=group)
        for t in topic_counters(using=self.using):
            published.add_metric([t.name], t.published)
            for g in t.groups:
                labels = [t.name, g.name]
                consumed.add_metric([*labels, "acked"], g.acked)
                consumed.add_metric([*labels, "dead_lettered"], g.dead_lettered)
                consumed.add_metric([*labels, "expired"], g.expired)
                lag.add_metric(labels, g.lag)
                dead.add_metric(labels, g.dead)
                blocked.add_metric(labels, g.blocked)
                held.add_metric(labels, g.leased - g.leases_expired)
                expired.add_metric(labels, g.leases_expired)
                paused.add_metric(labels, 1 if g.paused else 0)
        yield from (published, consumed, lag, dead, blocked, held, expired, paused)


class LiveWorkersCollector(_Collector):
    """``django_jobs_workers`` and ``django_jobs_workers_stale`` alone (two queries), for a
    worker process's own endpoint."""

    def _families(self) -> Iterator[Any]:
        yield from self._workers()


def exposition(*, backend: str = "default") -> tuple[bytes, str]:
    """``(body, content type)`` of :class:`DatabaseCollector`'s metrics in Prometheus's text
    format, read now. Raises PrometheusClientMissing without prometheus-client and
    JobsConfigurationError when ``backend`` is not a JobsBackend's alias."""
    client = prometheus_client()
    registry = client.CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(backend=backend))
    return client.generate_latest(registry), client.CONTENT_TYPE_LATEST


class _DefaultRegistry:
    """prometheus_client's default registry as a collector of another registry: a worker serves
    the process, platform and garbage-collector metrics registered there, and whatever metrics
    the project's tasks define."""

    def __init__(self, client: ModuleType):
        self.registry = client.REGISTRY

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        return self.registry.collect()


class WorkerMetrics:
    """The counters and the run-time histogram of one worker, with ``django_jobs_workers`` read
    from the database at each scrape and the metrics of prometheus_client's default registry.

    Pass :meth:`observe` as ``Worker(on_outcome=...)``: one counter increment and one histogram
    observation per stored outcome, no statement. :meth:`serve` exposes them over HTTP. Each
    instance has a registry of its own (:attr:`registry`), so several workers of one process
    count apart.
    """

    def __init__(self, *, backend: str = "default"):
        self.client = prometheus_client()
        self.registry = self.client.CollectorRegistry(auto_describe=False)
        self.registry.register(LiveWorkersCollector(backend=backend, close_connection=True))  # validates backend
        self.outcomes = {
            kind: self.client.Counter(
                f"django_jobs_worker_{kind}",
                f"Attempts this worker stored as {kind}.",
                ["queue"],
                registry=self.registry,
            )
            for kind in OUTCOME_KINDS
        }
        self.run_seconds = self.client.Histogram(
            "django_jobs_worker_run_seconds",
            "Run time of each attempt this worker finished, whatever its outcome.",
            ["queue"],
            buckets=RUN_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_DefaultRegistry(self.client))
        self.server: Any = None

    def observe(self, queue: str, kind: str, runtime_ms: int | None) -> None:
        """Count one stored outcome (``Worker(on_outcome=...)``): ``kind`` is one of
        :data:`~django_jobs.worker.stats.OUTCOME_KINDS`."""
        self.outcomes[kind].labels(queue).inc()
        if runtime_ms is not None:
            self.run_seconds.labels(queue).observe(runtime_ms / 1000)

    def serve(self, *, port: int, addr: str = "0.0.0.0") -> None:
        """Serve :attr:`registry` on ``addr:port`` (prometheus_client's HTTP server, a daemon
        thread, a thread per scrape). InvalidWorkerOption for a port outside 1..65535 or a blank
        address; OSError when the port cannot be bound."""
        require_int("metrics port", port, 1, MAX_PORT)
        if not isinstance(addr, str) or not addr.strip():
            raise InvalidWorkerOption(f"metrics address must be a host name or an IP address; got {addr!r}.")
        self.server, _thread = self.client.start_http_server(port, addr=addr, registry=self.registry)

    def stop(self) -> None:
        """Stop serving (nothing when not serving)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

"""Prometheus metrics: the view scraped through the test client after real jobs ran, and
``runworker --metrics-port`` scraped over HTTP while a real worker process runs jobs."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections import Counter
from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import django_jobs
from django_jobs import engine, queue
from django_jobs.engine import topics as bus
from django_jobs.exceptions import JobsConfigurationError
from django_jobs.models import Job, Worker
from django_jobs.testing import drain_queue
from django_jobs.views import metrics as metrics_view
from tests import tasks
from tests.conftest import ROOT, read_log, subprocess_env, wait_until
from tests.factories import claim_job, insert_job

INSTALL_HINT = 'pip install "django-db-jobs[prometheus]"'


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of an exposition, parsed by prometheus_client."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_view(client, url: str = "/metrics/") -> dict:
    response = client.get(url)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return samples(response.content.decode())


def q(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


@pytest.mark.django_db
def test_view_shows_each_queues_backlog_by_state_and_its_oldest_waiting_age(client):
    two_minutes_ago = timezone.now() - timedelta(minutes=2)
    insert_job(queue="mv", now=two_minutes_ago)
    insert_job(queue="mv", now=two_minutes_ago + timedelta(seconds=30))
    tasks.add.using(queue_name="mv").enqueue(1, 2)
    tasks.add.using(queue_name="mv", run_after=timedelta(hours=1)).enqueue(1, 1)
    claim_job(insert_job(queue="mv-busy"))
    queue("mv-busy").pause()

    got = scrape_view(client)

    assert got[q("django_jobs_queue_jobs", queue="mv", state="waiting")] == 3
    assert got[q("django_jobs_queue_jobs", queue="mv", state="delayed")] == 1
    assert got[q("django_jobs_queue_jobs", queue="mv", state="active")] == 0
    assert got[q("django_jobs_queue_jobs", queue="mv", state="waiting-children")] == 0
    assert got[q("django_jobs_queue_jobs", queue="mv-busy", state="active")] == 1
    age = got[q("django_jobs_queue_oldest_waiting_age_seconds", queue="mv")]
    assert 120 <= age < 180, age
    assert got[q("django_jobs_queue_oldest_waiting_age_seconds", queue="mv-busy")] == 0
    assert got[q("django_jobs_queue_paused", queue="mv-busy")] == 1
    assert got[q("django_jobs_queue_paused", queue="mv")] == 0


@pytest.mark.django_db
def test_view_shows_last_hours_outcomes_after_jobs_ran(client):
    for i in range(3):
        tasks.add.using(queue_name="mo").enqueue(i, 1)
    tasks.always_fails.using(queue_name="mo").enqueue("no")  # 2 attempts: retried, then failed
    tasks.add.using(queue_name="other").enqueue(0, 0)

    result = drain_queue("mo")
    assert (result.completed, result.failed, result.retried) == (3, 1, 1)
    got = scrape_view(client)

    assert got[q("django_jobs_queue_completed_last_hour", queue="mo")] == 3
    assert got[q("django_jobs_queue_failed_last_hour", queue="mo")] == 1
    assert got[q("django_jobs_queue_retried_last_hour", queue="mo")] == 1
    assert got[q("django_jobs_queue_jobs", queue="mo", state="waiting")] == 0
    assert got[q("django_jobs_queue_run_seconds_last_hour", queue="mo")] >= 0
    # A queue whose jobs did not run yet: its backlog, and nothing finished.
    assert got[q("django_jobs_queue_jobs", queue="other", state="waiting")] == 1
    assert got[q("django_jobs_queue_completed_last_hour", queue="other")] == 0


@pytest.mark.django_db
def test_view_counts_workers_with_a_fresh_heartbeat_as_live_and_the_others_as_stale(client):
    for worker_id in ("w-live", "w-gone", "w-other-backend"):
        engine.register_worker(
            using="default", worker_id=worker_id, backend="default", queues=None, concurrency=2, pid=1
        )
    Worker.objects.filter(id="w-gone").update(heartbeat_at=timezone.now() - timedelta(hours=1))
    Worker.objects.filter(id="w-other-backend").update(backend="limited")

    got = scrape_view(client)
    assert got[q("django_jobs_workers")] == 1
    assert got[q("django_jobs_workers_stale")] == 1
    assert scrape_view(client, "/metrics/limited/")[q("django_jobs_workers")] == 1


@pytest.mark.django_db
def test_view_reads_no_finished_history(client, django_assert_max_num_queries):
    tasks.add.using(queue_name="mh").enqueue(1, 1)
    drain_queue("mh")
    bus.ensure_group("mh", "g", start_from="beginning", using="default")
    django_jobs.topic("mh").publish(1)
    # Five for the jobs and the workers, four for the topics (partitions, cursors, groups, dead letters).
    with django_assert_max_num_queries(9) as queries:
        client.get("/metrics/")
    job_reads = [x["sql"] for x in queries.captured_queries if "django_jobs_job" in x["sql"]]
    assert job_reads and all("state" in sql for sql in job_reads), job_reads  # the unfinished rows only
    assert not [x["sql"] for x in queries.captured_queries if "django_jobs_message" in x["sql"]]


@pytest.mark.django_db
def test_view_serves_topic_counters_and_each_groups_lag_dead_letters_blocks_and_leases(client):
    """Counters of what was published and consumed (true counters: the columns only grow), and
    each group's state, from the database at scrape time."""
    for group in ("acks", "fails", "stalls"):
        bus.ensure_group("mt", group, start_from="beginning", using="default")
    django_jobs.topic("mt").publish_many([{"payload": n, "partition": "p"} for n in range(5)])
    later = timezone.now() + timedelta(days=1)

    def take(group, n):
        return bus.acquire_batch("mt", group, batch_size=n, worker_id="w", using="default", now=later)

    assert bus.ack_batch(take("acks", 2), using="default")
    take("acks", 1)  # held: a live lease
    assert bus.fail_batch(take("fails", 1), error="x", max_attempts=1, using="default", now=later) == "dead"
    blocked = take("fails", 1)
    assert bus.fail_batch(blocked, error="y", max_attempts=1, on_failure="block", using="default") == "blocked"
    stalled = take("stalls", 3)
    bus.renew_batch_lease(stalled, lease_seconds=30, using="default", now=timezone.now() - timedelta(hours=1))
    django_jobs.topic("mt").group("stalls").pause()

    got = scrape_view(client)

    assert got[q("django_jobs_topic_published_total", topic="mt")] == 5
    consumed = {
        (group, outcome): got[q("django_jobs_topic_consumed_total", topic="mt", group=group, outcome=outcome)]
        for group in ("acks", "fails", "stalls")
        for outcome in ("acked", "dead_lettered", "expired")
    }
    assert consumed == {
        ("acks", "acked"): 2, ("acks", "dead_lettered"): 0, ("acks", "expired"): 0,
        ("fails", "acked"): 0, ("fails", "dead_lettered"): 1, ("fails", "expired"): 0,
        ("stalls", "acked"): 0, ("stalls", "dead_lettered"): 0, ("stalls", "expired"): 0,
    }  # fmt: skip

    def per_group(name):
        return {g: got[q(name, topic="mt", group=g)] for g in ("acks", "fails", "stalls")}

    assert per_group("django_jobs_topic_lag") == {"acks": 3, "fails": 4, "stalls": 5}
    assert per_group("django_jobs_topic_dead_letters") == {"acks": 0, "fails": 1, "stalls": 0}
    assert per_group("django_jobs_topic_partitions_blocked") == {"acks": 0, "fails": 1, "stalls": 0}
    assert per_group("django_jobs_topic_leases_held") == {"acks": 1, "fails": 0, "stalls": 0}
    assert per_group("django_jobs_topic_leases_expired") == {"acks": 0, "fails": 0, "stalls": 1}
    assert per_group("django_jobs_topic_group_paused") == {"acks": 0, "fails": 0, "stalls": 1}
    types = {f.name: f.type for f in text_string_to_metric_families(client.get("/metrics/").content.decode())}
    assert types["django_jobs_topic_published"] == types["django_jobs_topic_consumed"] == "counter"
    assert types["django_jobs_topic_lag"] == "gauge"


def test_view_refuses_a_backend_that_is_not_a_jobs_backend():
    request = RequestFactory().get("/metrics/")
    with pytest.raises(JobsConfigurationError, match="No task backend 'nope' in TASKS"):
        metrics_view(request, backend="nope")


def test_without_prometheus_client_the_view_and_the_option_say_how_to_install_it():
    script = textwrap.dedent(
        """
        import json, sys
        sys.modules["prometheus_client"] = None  # what "import prometheus_client" meets when it is not installed
        import django
        django.setup()
        from django.core.management import CommandError, call_command
        from django.test import RequestFactory
        from django_jobs.exceptions import PrometheusClientMissing
        from django_jobs.views import metrics
        out = {}
        try:
            metrics(RequestFactory().get("/metrics/"))
        except PrometheusClientMissing as exc:
            out["view"] = str(exc)
        try:
            call_command("runworker", "--metrics-port", "9400")
        except CommandError as exc:
            out["runworker"] = str(exc)
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert INSTALL_HINT in out["view"]
    assert out["runworker"].startswith("--metrics-port: Prometheus metrics need the prometheus-client library")
    assert INSTALL_HINT in out["runworker"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-port", "0"], "--metrics-port must be a whole number >= 1; got '0'"),
        (["--metrics-port", "http"], "--metrics-port must be a whole number >= 1; got 'http'"),
        (["--metrics-port", "65536"], "--metrics-port must be a port 1..65535; got '65536'"),
        (["--metrics-port", "65535", "-p", "2"], "1..65534 (with --processes 2, ports 65535..65536)"),
    ],
)
def test_bad_metrics_port_is_a_command_error_saying_what_is_allowed(in_process_command, args, message):
    from django.core.management import CommandError

    with pytest.raises(CommandError) as info:
        in_process_command(*args)
    assert message in str(info.value)


# -- runworker --metrics-port: a real worker process scraped over HTTP ----------------------------


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive TCP ports free on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n - 1 > 65535:
            continue
        socks = []
        try:
            for port in range(first, first + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def scrape_port(port: int) -> dict | None:
    """The samples served on ``port``; None while nothing listens there yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return samples(response.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return None


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(60) == 0, read_log(proc)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runworker_metrics_port_serves_true_counters_and_the_run_time_histogram(worker_process, probe):
    for i in range(2):
        tasks.mark.using(queue_name="pw").enqueue(probe, i)
    tasks.sleep_then_mark.using(queue_name="pw").enqueue(probe, "slow", 0.3)
    tasks.always_fails.using(queue_name="pw").enqueue("no")  # 2 attempts: retried, then failed
    port = free_ports(1)

    proc = worker_process("-q", "pw", "-c", "2", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")

    def finished() -> dict | None:
        got = scrape_port(port)
        done = got and got.get(q("django_jobs_worker_completed_total", queue="pw")) == 3
        return got if done and got.get(q("django_jobs_worker_failed_total", queue="pw")) == 1 else None

    got = wait_until(finished, timeout=60, interval=0.1, message="3 completed and 1 failed on the metrics port")
    assert got[q("django_jobs_worker_retried_total", queue="pw")] == 1
    # One observation per finished attempt: 3 completed, 1 retried, 1 failed.
    assert got[q("django_jobs_worker_run_seconds_count", queue="pw")] == 5
    assert got[q("django_jobs_worker_run_seconds_bucket", queue="pw", le="+Inf")] == 5
    # The 0.3 s job is the only one slower than 0.25 s.
    assert got[q("django_jobs_worker_run_seconds_bucket", queue="pw", le="0.25")] == 4
    assert got[q("django_jobs_worker_run_seconds_bucket", queue="pw", le="0.5")] == 5
    assert got[q("django_jobs_worker_run_seconds_sum", queue="pw")] >= 0.3
    assert got[q("django_jobs_workers")] == 1  # itself, from its Worker row
    assert any(name.startswith("process_") for name, _ in got)  # the default registry's collectors
    assert Job.objects.filter(queue="pw", state="completed").count() == 3
    stop(proc)


@pytest.mark.slow
@pytest.mark.needs("ROW_LOCKS")  # runworker refuses -p 2 on SQLite (check E005)
@pytest.mark.django_db(transaction=True)
def test_runworker_processes_serve_their_own_counters_on_port_plus_index(worker_process, probe):
    jobs = 8
    for i in range(jobs):
        tasks.mark.using(queue_name="pp").enqueue(probe, i)
    port = free_ports(2)

    proc = worker_process("-q", "pp", "-p", "2", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")

    def both() -> list[dict] | None:
        got = [scrape_port(port), scrape_port(port + 1)]
        if None in got or any(g[q("django_jobs_workers")] != 2 for g in got):
            return None
        completed = sum(g.get(q("django_jobs_worker_completed_total", queue="pp"), 0) for g in got)
        return got if completed == jobs else None

    got = wait_until(both, timeout=60, interval=0.1, message="both ports up and every job counted once")
    per_process = sorted(g.get(q("django_jobs_worker_completed_total", queue="pp"), 0) for g in got)
    ran_by_pid = Counter(r["pid"] for r in tasks.read_records(probe))
    # Each process counted the jobs it ran, no more: the split of the counts is the split of the runs.
    assert per_process == sorted([*ran_by_pid.values(), 0, 0])[-2:]
    stop(proc)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runworker_stops_with_a_clear_error_when_the_metrics_port_is_taken(worker_process):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = worker_process("--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
        assert proc.wait(60) != 0
    assert f"--metrics-port: cannot serve on 127.0.0.1:{port}" in read_log(proc)


@pytest.mark.django_db(transaction=True)
def test_worker_metrics_count_each_stored_outcome_of_a_worker_in_this_process(thread_worker):
    from django_jobs.prometheus import WorkerMetrics

    metrics = WorkerMetrics()
    for i in range(3):
        tasks.add.using(queue_name="pt").enqueue(i, i)
    tasks.always_fails.using(queue_name="pt").enqueue("no")

    w = thread_worker(queues=["pt"], on_outcome=metrics.observe)
    wait_until(lambda: Job.objects.filter(queue="pt", state__in=["completed", "failed"]).count() == 4, timeout=30)
    w.stop()

    got = samples(metrics.client.generate_latest(metrics.registry).decode())
    assert got[q("django_jobs_worker_completed_total", queue="pt")] == 3
    assert got[q("django_jobs_worker_failed_total", queue="pt")] == 1
    assert got[q("django_jobs_worker_retried_total", queue="pt")] == 1
    assert got[q("django_jobs_worker_run_seconds_count", queue="pt")] == 5
    assert (w.worker.stats.completed, w.worker.stats.failed, w.worker.stats.retried) == (3, 1, 1)


@pytest.mark.django_db
def test_every_metric_the_docs_and_the_grafana_dashboard_name_is_served(client):
    from django_jobs.prometheus import WorkerMetrics
    from django_jobs.worker.stats import OUTCOME_KINDS

    tasks.add.using(queue_name="md").enqueue(1, 1)  # a queue, so the per-queue metrics have a sample
    bus.ensure_group("md", "g", start_from="beginning", using="default")  # and a topic with a group
    django_jobs.topic("md").publish(1)
    served = {name for name, _ in scrape_view(client)}
    worker = WorkerMetrics()
    for kind in OUTCOME_KINDS:  # a labelled metric has samples once a label value is used
        worker.observe("q", kind, 5)
    served |= {name for name, _ in samples(worker.client.generate_latest(worker.registry).decode())}

    docs = (ROOT / "docs" / "howto" / "prometheus.md").read_text()
    dashboard = (ROOT / "docs" / "grafana" / "django-jobs.json").read_text()
    json.loads(dashboard)
    named = set(re.findall(r"\bdjango_jobs_[a-z_]+[a-z]", docs + dashboard))
    named -= {"django_jobs_unfinished_idx"}  # an index the page names, not a metric
    # A histogram or a counter is named by its family in the tables, by its samples in queries.
    families = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in served} | served
    assert named and named <= families, named - families

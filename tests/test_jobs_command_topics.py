"""``manage.py jobs topics``, ``jobs lag`` and ``jobs dead-letters``: what they show, what the
replay and delete options do (through the engine), their JSON, their errors and exit codes, and
one run in a real process (Django's common options after the subcommand, exit status)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

import django_jobs
from django_jobs.engine import topic_metrics as metrics
from django_jobs.engine import topics as bus
from django_jobs.models import DeadLetter, Message
from tests.conftest import ROOT, subprocess_env
from tests.test_encryption import KEY_A, keys
from tests.test_jobs_command import rows

db = pytest.mark.django_db
LATER = timezone.now() + timedelta(days=1)


def jobs(*args: str) -> str:
    out = io.StringIO()
    call_command("jobs", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def dead(topic: str, group: str, n: int, error: str = "ValueError: boom") -> None:
    for _ in range(n):
        b = bus.acquire_batch(topic, group, batch_size=1, worker_id="w", using="default", now=LATER)
        assert bus.fail_batch(b, error=error, max_attempts=1, using="default", now=LATER) == "dead"


@pytest.fixture
def orders():
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    t = django_jobs.topic("orders")
    t.publish_many([{"payload": {"n": i}, "partition": "a"} for i in range(3)])
    t.publish_many([{"payload": {"n": i}, "partition": "b"} for i in range(2)])
    bus.ensure_group("orders", "email", start_from="end", using="default")
    return t


@db
def test_topics_lists_partitions_published_groups_and_lag(orders):
    django_jobs.topic("orders").group("email").pause()
    [r] = rows(jobs("topics"))
    assert r["topic"] == "orders"
    assert (r["partitions"], r["published"], r["total lag"]) == ("2", "5", "5")
    assert r["groups (lag)"] == "billing (5), email (0, paused)"
    [data] = json.loads(jobs("topics", "--json"))
    assert data["lag"] == 5 and {g["group"]: g["lag"] for g in data["groups"]} == {"billing": 5, "email": 0}


@db
def test_topics_shows_messages_published_and_consumed_per_minute(orders):
    [r] = rows(jobs("topics"))
    assert (r["published/min"], r["consumed/min"]) == ("–", "billing –, email –"), "no snapshot yet"
    [data] = json.loads(jobs("topics", "--json"))
    assert data["published_per_minute"] is None and data["groups"][0]["consumed_per_minute"] is None
    # The totals five minutes ago (a worker's TopicRecorder), then 10 published, 4 acknowledged
    # and 1 dead letter: per minute, 2 published and 1 consumed.
    metrics.record_topic_totals(using="default", now=timezone.now() - timedelta(minutes=5))
    orders.publish_many([{"payload": {"n": i}, "partition": "a"} for i in range(10)])
    b = bus.acquire_batch("orders", "billing", batch_size=4, worker_id="w", using="default", now=LATER)
    assert bus.ack_batch(b, using="default")
    dead("orders", "billing", 1)
    [r] = rows(jobs("topics"))
    assert (r["published/min"], r["consumed/min"]) == ("2.0", "billing 1.0, email 0.0")
    [data] = json.loads(jobs("topics", "--json"))
    assert data["published"] == 15 and data["published_per_minute"] == 2.0
    billing, email = data["groups"]
    assert (billing["acked"], billing["dead_lettered"], billing["expired"]) == (4, 1, 0)
    assert billing["consumed_per_minute"] == 1.0
    assert (billing["acked_per_minute"], billing["dead_lettered_per_minute"]) == (0.8, 0.2)
    assert email["consumed_per_minute"] == 0.0


@db
def test_topics_says_when_there_are_none():
    assert jobs("topics").startswith("No topics")
    assert json.loads(jobs("topics", "--json")) == []


@db
def test_lag_per_partition_with_the_lease_held_and_blocked(orders):
    b = bus.acquire_batch("orders", "billing", batch_size=1, worker_id="host-1:42", using="default", now=LATER)
    out = jobs("lag", "orders", "--group", "billing")
    assert out.splitlines()[0] == "group billing: lag 5"
    table = rows("\n".join(out.splitlines()[1:]))
    by = {r["partition"]: r for r in table}
    assert by[b.partition]["leased by"] == "host-1:42" and by[b.partition]["lease expires"]
    assert (by["a"]["lag"], by["b"]["lag"]) == ("3", "2")
    assert bus.fail_batch(b, error="X: stuck", max_attempts=1, on_failure="block", using="default", now=LATER)
    data = json.loads(jobs("lag", "orders", "--group", "billing", "--partition", b.partition, "--json"))
    [p] = data["groups"][0]["partitions"]
    assert p["blocked"] and p["last_error"] == "X: stuck" and p["leased_by"] is None
    assert "BLOCKED: X: stuck" in jobs("lag", "orders")
    assert "group email: lag 0" in jobs("lag", "orders")


@db
def test_lag_of_an_unknown_topic_or_group_is_a_clear_error(orders):
    with pytest.raises(CommandError, match="No topic 'nope'"):
        jobs("lag", "nope")
    with pytest.raises(CommandError, match="No group 'nope' of topic 'orders'; its groups: billing, email"):
        jobs("lag", "orders", "--group", "nope")
    with pytest.raises(CommandError, match="Invalid topic name"):
        jobs("lag", "no spaces")


@db
def test_dead_letters_lists_then_replays_and_deletes_through_the_engine(orders):
    dead("orders", "billing", 3)
    listed = rows(jobs("dead-letters", "orders", "--group", "billing"))
    assert len(listed) == 3 and all(r["error"] == "ValueError: boom" and r["state"] == "dead" for r in listed)
    ids = sorted(int(r["id"]) for r in listed)
    assert jobs("dead-letters", "orders", "--group", "billing", "--replay", str(ids[0])).startswith("1 dead letter(s)")
    assert DeadLetter.objects.get(id=ids[0]).state == "replay"
    with pytest.raises(CommandError, match="1 of 2 dead letter\\(s\\) were not found or already queued"):
        jobs("dead-letters", "orders", "--group", "billing", "--replay", str(ids[0]), str(ids[1]))
    assert DeadLetter.objects.get(id=ids[1]).state == "replay"
    jobs("dead-letters", "orders", "--group", "billing", "--replay-all")
    assert set(DeadLetter.objects.values_list("state", flat=True)) == {"replay"}
    jobs("dead-letters", "orders", "--group", "billing", "--delete", str(ids[2]))
    assert sorted(DeadLetter.objects.values_list("id", flat=True)) == ids[:2]
    jobs("dead-letters", "orders", "--group", "billing", "--delete-all")
    assert not DeadLetter.objects.filter(group_name="billing").exists()
    assert "has no dead letters" in jobs("dead-letters", "orders", "--group", "billing")


@db
def test_dead_letters_json_never_shows_an_encrypted_payload():
    bus.ensure_group("vault", "g", start_from="beginning", using="default")
    vault = django_jobs.topic("vault")
    with keys(KEY_A):
        vault.configure(encrypt=True)
        vault.publish({"card": "4111-secret"})
        vault.configure(encrypt=False)
        vault.publish({"plain": 1})
        dead("vault", "g", 2)
    token = DeadLetter.objects.get(message_id=Message.objects.order_by("id")[0].id).payload["$encrypted"]
    data = json.loads(jobs("dead-letters", "vault", "--group", "g", "--json"))
    assert [(d["encrypted"], d["payload"]) for d in data] == [(False, {"plain": 1}), (True, "encrypted (not shown)")]
    table = jobs("dead-letters", "vault", "--group", "g")
    assert token[:40] not in table and "4111-secret" not in table and "encrypted (not shown)" in table


@db
def test_dead_letters_needs_an_existing_group_and_one_action():
    with pytest.raises(CommandError, match="No group 'g' of topic 't'"):
        jobs("dead-letters", "t", "--group", "g")
    with pytest.raises(CommandError, match="not allowed with argument"):
        jobs("dead-letters", "t", "--group", "g", "--replay-all", "--delete-all")


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_real_process_reads_lag_and_deletes_with_options_after_the_subcommand(orders):
    dead("orders", "billing", 1)

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "django", "jobs", *args],
            cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    lag = manage("lag", "orders", "--group", "billing", "--json", "--skip-checks")
    assert lag.returncode == 0, lag.stderr
    assert json.loads(lag.stdout)["groups"][0]["lag"] == 4
    quiet = manage("dead-letters", "orders", "--group", "billing", "--delete-all", "-v", "0")
    assert quiet.returncode == 0 and quiet.stdout == "", quiet.stderr
    assert not DeadLetter.objects.exists()
    missing = manage("lag", "nope")
    assert missing.returncode == 1 and "CommandError: No topic 'nope'." in missing.stderr
    usage = manage("dead-letters", "orders")
    assert usage.returncode == 2 and "--group" in usage.stderr

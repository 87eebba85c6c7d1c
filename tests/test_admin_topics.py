"""The topic pages of the admin: the topics list, a topic's page and settings, a group's page
(lag and lease per partition, blocked partitions, pause/resume, seek, dead letters with replay
and delete), their permissions, CSRF, escaping, encrypted payloads, and each action doing what it
says through the engine."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

import django_jobs
from django_jobs.admin.utils import moment
from django_jobs.engine import topic_metrics as metrics
from django_jobs.engine import topics as bus
from django_jobs.models import ConsumerGroup, DeadLetter, GroupCursor, Message, Topic
from tests.conftest import wait_until
from tests.factories import staff_client, superuser_client
from tests.test_encryption import KEY_A, keys

db = pytest.mark.django_db
TOPICS = "/admin/django_jobs/topic/"
NOW_PLUS = timezone.now() + timedelta(days=1)  # later than anything published on the real clock


def topic_url(topic: str) -> str:
    return f"{TOPICS}{topic}/dashboard/"


def group_url(topic: str, group: str, action: str = "") -> str:
    return f"{TOPICS}{topic}/dashboard/group/{group}/" + (f"{action}/" if action else "")


def text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def row(body: str, attr: str, value: str) -> str:
    found = re.search(rf'<tr[^>]*{attr}="{re.escape(html.escape(value))}"[^>]*>(.*?)</tr>', body, re.S)
    assert found, f"no row {attr}={value!r}"
    return found.group(1)


def cell(fragment: str, figure: str) -> str:
    found = re.search(rf'<td[^>]*data-figure="{figure}"[^>]*>(.*?)</td>', fragment, re.S)
    assert found, f"no cell {figure!r}"
    return text(found.group(1))


def fail_head(topic: str, group: str, *, block: bool = False, error: str = "ValueError: boom", batch: int = 1):
    """Take the group's next batch and fail it for good: dead letters (or a blocked partition)."""
    b = bus.acquire_batch(topic, group, batch_size=batch, worker_id="host-1:42", using="default", now=NOW_PLUS)
    assert b is not None
    outcome = bus.fail_batch(
        b, error=error, max_attempts=1, on_failure="block" if block else "dead_letter", using="default", now=NOW_PLUS
    )
    assert outcome == ("blocked" if block else "dead")
    return b


@pytest.fixture
def orders():
    """Topic "orders": partitions a (3 messages) and b (2); group "billing" from the beginning,
    group "email" from the end (lag 0)."""
    bus.ensure_group("orders", "billing", start_from="beginning", using="default")
    t = django_jobs.topic("orders")
    for i in range(3):
        t.publish({"n": i}, partition="a")
    for i in range(2):
        t.publish({"n": i}, partition="b")
    bus.ensure_group("orders", "email", start_from="end", using="default")
    return t


# -- reading --------------------------------------------------------------------------------------------


@db
def test_topics_list_shows_partitions_published_and_each_groups_lag(orders):
    body = superuser_client().get(TOPICS).content.decode()
    r = row(body, "data-topic", "orders")
    assert cell(r, "partitions") == "2"
    assert cell(r, "published") == "5"
    assert cell(r, "lag") == "5"
    groups = cell(r, "groups")
    assert "billing (5)" in groups and "email (0)" in groups
    assert f'href="{topic_url("orders")}"' in r


@db
def test_topic_page_lists_groups_with_lag_blocked_and_dead_letters(orders):
    fail_head("orders", "billing")  # one dead letter; the cursor moves past it
    body = superuser_client().get(topic_url("orders")).content.decode()
    billing = row(body, "data-group", "billing")
    assert cell(billing, "lag") == "4"
    assert cell(billing, "dead") == "1"
    assert cell(billing, "blocked") == "0"
    assert cell(row(body, "data-group", "email"), "lag") == "0"
    assert f'href="{group_url("orders", "billing")}"' in body
    assert "Settings in effect" in body


@db
def test_group_page_shows_lag_and_the_lease_held_per_partition(orders):
    b = bus.acquire_batch("orders", "billing", batch_size=2, worker_id="host-9:77", using="default", now=NOW_PLUS)
    body = superuser_client().get(group_url("orders", "billing")).content.decode()
    held = row(body, "data-partition", b.partition)
    assert cell(held, "leased-by") == "host-9:77"
    assert cell(held, "lag") == ("3" if b.partition == "a" else "2")
    assert cell(held, "lease-expires") == moment(b.lease_expires_at), "a day ahead: not expired"
    other = row(body, "data-partition", "b" if b.partition == "a" else "a")
    assert cell(other, "leased-by") == "–"


def throughput(topic: str = "orders"):
    """Record the totals five minutes ago (as a worker's TopicRecorder does), then publish 10
    messages and have "billing" acknowledge 4 and dead-letter 1: 2 published and 1 consumed
    per minute over the last five minutes."""
    metrics.record_topic_totals(using="default", now=timezone.now() - timedelta(minutes=5))
    django_jobs.topic(topic).publish_many([{"payload": {"n": i}, "partition": "a"} for i in range(10)])
    b = bus.acquire_batch(topic, "billing", batch_size=4, worker_id="w", using="default", now=NOW_PLUS)
    assert b.partition == "a" and bus.ack_batch(b, using="default")
    fail_head(topic, "billing")


@db
def test_topic_pages_show_messages_published_and_consumed_per_minute(orders):
    client = superuser_client()
    before = row(client.get(TOPICS).content.decode(), "data-topic", "orders")
    assert cell(before, "published-rate") == "–", "no snapshot yet: no worker recorded the totals"
    throughput()
    listed = row(client.get(TOPICS).content.decode(), "data-topic", "orders")
    assert cell(listed, "published-rate") == "2.0"
    groups = cell(listed, "groups")
    assert "billing (10) 1.0/min" in groups and "email (10) 0.0/min" in groups

    body = client.get(topic_url("orders")).content.decode()
    assert cell(row(body, "data-topic", "orders"), "published-rate") == "2.0"
    billing = row(body, "data-group", "billing")
    assert (cell(billing, "consumed-rate"), cell(billing, "consumed-hour")) == ("1.0", "5")
    svg = re.search(r'<svg[^>]*id="chart-topic-published".*?</svg>', body, re.S).group(0)
    assert 'aria-label="Messages published to orders per minute, last hour: 10 published"' in svg
    assert svg.count('class="bar"') == 60 and "Published (10)" in svg
    assert svg.count(": 2 published</title>") == 5, "10 spread over the five minutes since the snapshot"

    page = client.get(group_url("orders", "billing")).content.decode()
    figures = row(page, "data-group", "billing")
    assert (cell(figures, "consumed-rate"), cell(figures, "published-rate")) == ("1.0", "2.0")
    svg = re.search(r'<svg[^>]*id="chart-group-consumed".*?</svg>', page, re.S).group(0)
    label = (
        "Messages of orders consumed by group billing per minute, last hour: 4 acknowledged, 1 dead-lettered or expired"
    )
    assert f'aria-label="{label}"' in svg
    assert "Acknowledged (4)" in svg and "Dead-lettered or expired (1)" in svg
    assert svg.count(": 0.8 acknowledged, 0.2 dead-lettered or expired</title>") == 5


@db
def test_unknown_topic_or_group_and_impossible_names_are_404(orders):
    client = superuser_client()
    assert client.get(topic_url("nope")).status_code == 404
    assert client.get(group_url("orders", "nope")).status_code == 404
    assert client.get(group_url("orders", "no%20spaces")).status_code == 404
    assert client.post(group_url("orders", "nope", "pause")).status_code == 404
    assert client.post(group_url("orders", "billing", "explode")).status_code == 404


# -- permissions --------------------------------------------------------------------------------------------


@db
def test_viewing_needs_view_topic_and_a_viewer_sees_no_control(orders):
    fail_head("orders", "billing", block=True)
    assert staff_client("view_job", name="jobs-only").get(TOPICS).status_code == 403
    viewer = staff_client("view_topic")
    body = viewer.get(group_url("orders", "billing")).content.decode()
    assert group_url("orders", "billing", "") + "pause" not in body  # no form posts to an action
    assert 'action="' + group_url("orders", "billing") not in body
    for control in ("Pause group", "jobs-seek-form", "retry-partition"):
        assert control not in body
    for action in ("pause", "seek", "retry", "skip", "replay", "delete"):
        assert viewer.post(group_url("orders", "billing", action), {"partition": "a", "all": "1"}).status_code == 403
    assert viewer.post(f"{topic_url('orders')}action/settings/", {"lease": "5"}).status_code == 403
    assert not ConsumerGroup.objects.get(topic="orders", name="billing").paused
    assert GroupCursor.objects.get(group_name="billing", partition__name="a").blocked


@db
def test_each_action_needs_its_own_permission(orders):
    fail_head("orders", "billing")
    letter = DeadLetter.objects.get()
    replayer = staff_client("view_topic", "replay_deadletter", name="replayer")
    assert replayer.post(group_url("orders", "billing", "delete"), {"all": "1", "confirm": "yes"}).status_code == 403
    assert replayer.post(group_url("orders", "billing", "pause")).status_code == 403
    assert replayer.post(group_url("orders", "billing", "replay"), {"one": letter.id}).status_code == 302
    assert DeadLetter.objects.get().state == "replay"
    controller = staff_client("view_topic", "control_topic", name="controller")
    assert controller.post(group_url("orders", "billing", "replay"), {"all": "1"}).status_code == 403
    assert controller.post(group_url("orders", "billing", "pause")).status_code == 302
    assert ConsumerGroup.objects.get(topic="orders", name="billing").paused


@db
def test_actions_refuse_get_and_need_a_csrf_token(orders):
    client = superuser_client()
    assert client.get(group_url("orders", "billing", "pause")).status_code == 405
    strict = superuser_client(name="strict", enforce_csrf_checks=True)
    assert strict.post(group_url("orders", "billing", "pause")).status_code == 403
    assert not ConsumerGroup.objects.get(topic="orders", name="billing").paused
    page = strict.get(group_url("orders", "billing")).content.decode()
    form = re.search(rf'action="{re.escape(group_url("orders", "billing", "pause"))}".*?value="([^"]+)"', page, re.S)
    assert (
        strict.post(group_url("orders", "billing", "pause"), {"csrfmiddlewaretoken": form.group(1)}).status_code == 302
    )
    assert ConsumerGroup.objects.get(topic="orders", name="billing").paused


# -- actions ------------------------------------------------------------------------------------------------


@db
def test_pause_and_resume_change_what_the_group_is_handed(orders):
    client = superuser_client()
    client.post(group_url("orders", "billing", "pause"))
    assert bus.acquire_batch("orders", "billing", batch_size=1, worker_id="w", using="default", now=NOW_PLUS) is None
    assert "Paused" in client.get(group_url("orders", "billing")).content.decode()
    client.post(group_url("orders", "billing", "resume"))
    assert bus.acquire_batch("orders", "billing", batch_size=1, worker_id="w", using="default", now=NOW_PLUS)


@db
def test_seek_to_end_beginning_message_and_time(orders):
    client = superuser_client()
    lag = django_jobs.topic("orders").group("billing").total_lag
    assert client.post(group_url("orders", "billing", "seek"), {"to": "end"}).status_code == 302
    assert lag() == 0
    client.post(group_url("orders", "billing", "seek"), {"to": "beginning"})
    assert lag() == 5
    client.post(group_url("orders", "billing", "seek"), {"to": "end"})
    second_of_a = Message.objects.get(topic="orders", partition__name="a", position=2).id
    client.post(group_url("orders", "billing", "seek"), {"to": "message", "message_id": str(second_of_a)})
    assert django_jobs.topic("orders").group("billing").lag() == {"a": 2, "b": 0}
    client.post(group_url("orders", "billing", "seek"), {"to": "time", "at": "2000-01-01 00:00"})
    assert lag() == 5


@db
def test_a_bad_seek_shows_the_form_again_with_the_error(orders):
    client = superuser_client()
    response = client.post(group_url("orders", "billing", "seek"), {"to": "message"})
    assert response.status_code == 200
    assert "Give the id of the message to seek to." in response.content.decode()
    response = client.post(
        group_url("orders", "billing", "seek"), {"to": "message", "message_id": "999999"}, follow=True
    )
    assert "has no message 999999" in response.content.decode()


@db
def test_retry_and_skip_unblock_a_blocked_partition():
    bus.ensure_group("jam", "billing", start_from="beginning", using="default")
    django_jobs.topic("jam").publish_many([{"payload": i, "partition": "p"} for i in range(2)])
    fail_head("jam", "billing", block=True, error="RuntimeError: stuck")
    client = superuser_client()
    body = client.get(group_url("jam", "billing")).content.decode()
    assert "blocked" in cell(row(body, "data-partition", "p"), "state")
    assert "RuntimeError: stuck" in body
    client.post(group_url("jam", "billing", "retry"), {"partition": "p"})
    cursor = GroupCursor.objects.get(group_name="billing", partition__name="p")
    assert not cursor.blocked and cursor.position == 0
    fail_head("jam", "billing", block=True, error="RuntimeError: stuck")
    client.post(group_url("jam", "billing", "skip"), {"partition": "p"})
    cursor.refresh_from_db()
    assert not cursor.blocked and cursor.position == 1
    assert DeadLetter.objects.get().error == "RuntimeError: stuck"
    # Not blocked any more: the engine's error is shown, nothing changes.
    response = client.post(group_url("jam", "billing", "retry"), {"partition": "p"}, follow=True)
    assert "is not blocked" in response.content.decode()


@db
def test_an_expired_lease_is_marked_and_malformed_ids_are_refused(orders):
    orders.configure(lease=1)
    b = bus.acquire_batch("orders", "billing", batch_size=1, worker_id="gone:1", using="default")
    wait_until(lambda: timezone.now() > b.lease_expires_at, timeout=10, message="the lease's end")
    body = superuser_client().get(group_url("orders", "billing")).content.decode()
    assert cell(row(body, "data-partition", b.partition), "lease-expires").endswith("expired")
    fail_head("orders", "billing")
    client = superuser_client(name="root2")
    assert client.post(group_url("orders", "billing", "replay"), {"ids": ["1", "x"]}).status_code == 400
    assert client.post(group_url("orders", "billing", "delete"), {"one": "-1", "confirm": "yes"}).status_code == 400
    assert DeadLetter.objects.get().state == "dead"


@db
def test_replay_one_selected_or_all_dead_letters(orders):
    for _ in range(3):
        fail_head("orders", "billing")
    ids = list(DeadLetter.objects.order_by("id").values_list("id", flat=True))
    client = superuser_client()
    client.post(group_url("orders", "billing", "replay"), {"one": ids[0]})
    assert dict(DeadLetter.objects.values_list("id", "state")) == {ids[0]: "replay", ids[1]: "dead", ids[2]: "dead"}
    client.post(group_url("orders", "billing", "replay"), {"ids": [ids[1]]})
    assert DeadLetter.objects.get(id=ids[2]).state == "dead"
    client.post(group_url("orders", "billing", "replay"), {"all": "1"})
    assert set(DeadLetter.objects.values_list("state", flat=True)) == {"replay"}


@db
def test_delete_asks_first_then_deletes_the_selection_or_all(orders):
    for _ in range(3):
        fail_head("orders", "billing")
    ids = list(DeadLetter.objects.order_by("id").values_list("id", flat=True))
    client = superuser_client()
    confirm = client.post(group_url("orders", "billing", "delete"), {"ids": ids[:2]})
    assert confirm.status_code == 200
    body = confirm.content.decode()
    assert "This deletes 2 dead letter(s)" in text(body)
    assert DeadLetter.objects.count() == 3
    client.post(group_url("orders", "billing", "delete"), {"ids": ids[:2], "confirm": "yes"})
    assert list(DeadLetter.objects.values_list("id", flat=True)) == [ids[2]]
    client.post(group_url("orders", "billing", "delete"), {"all": "1", "confirm": "yes"})
    assert not DeadLetter.objects.exists()


@db
def test_payloads_and_errors_are_escaped_and_an_encrypted_payload_is_never_shown(orders):
    t = django_jobs.topic("orders")
    bus.ensure_group("orders", "audit", start_from="end", using="default")
    t.publish({"html": "<script>alert(1)</script>"}, partition="x")
    fail_head("orders", "audit", error="<img src=x onerror=alert(2)>")
    with keys(KEY_A):
        t.configure(encrypt=True)
        t.publish({"card": "4111-secret"}, partition="x")
        t.configure(encrypt=False)
        fail_head("orders", "audit")
    token = DeadLetter.objects.get(payload__has_key="$encrypted").payload["$encrypted"]
    t.publish({"long": "y" * 1000}, partition="x")
    fail_head("orders", "audit")
    body = superuser_client().get(group_url("orders", "audit")).content.decode()
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;" in body
    assert "<img src=x" not in body and "&lt;img src=x" in body
    assert "4111-secret" not in body and token[:40] not in body
    assert "encrypted (not shown)" in body
    assert "y" * 300 not in body and "y" * 150 in body


@db
def test_settings_form_configures_the_topic_through_the_api(orders):
    client = superuser_client()
    url = f"{topic_url('orders')}action/settings/"
    assert client.post(url, {"lease": "0.5"}).status_code == 200  # min 1: the form again, nothing saved
    assert not Topic.objects.filter(name="orders").exists()
    assert client.post(url, {"lease": "12", "max_size": "100"}).status_code == 302
    config = django_jobs.topic("orders").config
    assert (config.lease_seconds, config.max_size) == (12.0, 100)
    client.post(url, {"max_size": ""})
    assert django_jobs.topic("orders").config.max_size is None
    editor = staff_client("view_topic", "change_topic", name="editor")
    assert "jobs-topic-settings-form" in editor.get(topic_url("orders")).content.decode()
    assert "jobs-topic-settings-form" not in staff_client("view_topic").get(topic_url("orders")).content.decode()


@db
def test_the_change_form_saves_settings_through_the_api(orders):
    django_jobs.topic("orders").configure(lease=10)
    client = superuser_client()
    response = client.post(f"{TOPICS}orders/change/", {"lease_seconds": "20", "max_size": ""})
    assert response.status_code == 302
    assert django_jobs.topic("orders").config.lease_seconds == 20.0
    refused = client.post(f"{TOPICS}orders/change/", {"lease_seconds": "0.5", "max_size": "0"})
    assert refused.status_code == 200 and "max_size must be an integer &gt;= 1" in refused.content.decode()
    assert django_jobs.topic("orders").config.lease_seconds == 20.0


@db
def test_empty_console_says_there_are_no_topics():
    assert Client().get(TOPICS).status_code == 302  # anonymous: to the login page
    assert "No topics yet" in superuser_client().get(TOPICS).content.decode()

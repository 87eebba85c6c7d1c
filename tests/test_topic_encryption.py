"""Encrypted topics (``encrypt=True``, bus mode): what is stored (read raw), what a handler gets,
a payload no key decrypts, failures and dead letters stored encrypted and replayed, events and
logs that name the exception only, key rotation of messages and dead letters, what the admin and
``manage.py jobs`` show (never the plain or encrypted content), the setting and check W003."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.utils import timezone

import django_jobs
from django_jobs.checks import check_encryption
from django_jobs.conf import get_settings
from django_jobs.engine import topics as bus
from django_jobs.exceptions import EncryptionKeysMissing, InvalidArgumentValue, InvalidTopicSetting, PayloadTooLarge
from django_jobs.models import DeadLetter, GroupCursor, Message, TopicPartition
from django_jobs.spec.encryption import SHOWN, decrypt_json, decrypt_text, is_encrypted, is_encrypted_text
from django_jobs.spec.settings import settings_problems
from tests.conftest import wait_until
from tests.factories import superuser_client
from tests.test_encryption import KEY_A, KEY_B, keys
from tests.test_jobs_command import rows

SECRET = "4111-1111-secret"
LATER = timezone.now() + timedelta(days=1)  # later than anything published on the real clock
db = pytest.mark.django_db


@pytest.fixture
def key_a():
    with keys(KEY_A):
        yield


def raw(table: str, column: str, row_id: int) -> str:
    """A column of a row as the database returns it, before any decoding."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE id = %s", [row_id])
        value = cursor.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


def vault(*, group: str = "g") -> django_jobs.topics.TopicControl:
    """Topic "vault", encrypted, with ``group`` reading it from the beginning."""
    bus.ensure_group("vault", group, start_from="beginning", using="default")
    t = django_jobs.topic("vault")
    t.configure(encrypt=True)
    return t


def take(topic: str = "vault", group: str = "g", now=LATER):
    return bus.acquire_batch(topic, group, batch_size=10, worker_id="w", using="default", now=now)


def tokens() -> list[str]:
    """Every token stored for bus mode: payloads, dead letters' errors and tracebacks, cursors' errors."""
    found = [p["$encrypted"] for p in Message.objects.values_list("payload", flat=True) if is_encrypted(p)]
    for payload, error, trace in DeadLetter.objects.values_list("payload", "error", "traceback"):
        found += [payload["$encrypted"]] if is_encrypted(payload) else []
        found += [json.loads(t[t.index("{") :])["$encrypted"] for t in (error, trace) if is_encrypted_text(t)]
    for error in GroupCursor.objects.values_list("last_error", flat=True):
        if is_encrypted_text(error):
            found.append(json.loads(error[error.index("{") :])["$encrypted"])
    return found


def assert_hidden(text: str) -> None:
    """Neither the secret nor any stored token appears in ``text``."""
    assert SECRET not in text
    stored = tokens()
    assert stored
    for token in stored:
        assert token[:40] not in text


# -- what is stored ---------------------------------------------------------------------------------


@db
def test_an_encrypted_topic_stores_each_payload_as_an_envelope(key_a):
    t = vault()
    one = t.publish({"card": SECRET}, partition="p")
    many = t.publish_many([{"payload": [SECRET, i]} for i in range(2)])
    for published in (one, *many):
        assert SECRET not in raw("django_jobs_message", "payload", published.id)
        assert is_encrypted(Message.objects.get(id=published.id).payload)
    assert decrypt_json(Message.objects.get(id=one.id).payload) == {"card": SECRET}
    assert [decrypt_json(Message.objects.get(id=p.id).payload) for p in many] == [[SECRET, 0], [SECRET, 1]]
    assert (one.partition, one.position) == ("p", 1)  # routing is not encrypted
    assert TopicPartition.objects.get(topic="vault", name="p").name == "p"


@db
def test_a_declared_encrypt_applies_until_configure_overrides_it():
    declared = {**settings.DJANGO_JOBS, "ENCRYPTION_KEYS": [KEY_A], "TOPICS": {"vault": {"encrypt": True}}}
    with override_settings(DJANGO_JOBS=declared):
        t = django_jobs.topic("vault")
        assert t.config.encrypt is True
        first = t.publish(SECRET)
        t.configure(encrypt=False)
        second = t.publish("plain")
        t.configure(encrypt=None)  # back to the declaration
        third = t.publish(SECRET)
    stored = dict(Message.objects.values_list("id", "payload"))
    assert is_encrypted(stored[first.id]) and stored[second.id] == "plain" and is_encrypted(stored[third.id])
    assert django_jobs.topic("plain").config.encrypt is False


@db
def test_the_encrypt_setting_is_a_bool_or_none():
    with pytest.raises(InvalidTopicSetting, match="encrypt must be True, False or None; got 'yes'"):
        django_jobs.topic("vault").configure(encrypt="yes")
    with pytest.raises(InvalidTopicSetting, match="encrypt must be True, False or None; got 1"):
        django_jobs.topic("vault").configure(encrypt=1)
    with override_settings(DJANGO_JOBS={"TOPICS": {"vault": {"encrypt": "on"}}}):
        assert any("TOPICS" in p and "encrypt must be" in p for p in settings_problems(get_settings()))


@db
def test_the_size_cap_applies_to_the_plain_json(key_a):
    limited = django_jobs.topic("vault", backend="limited")  # MAX_PAYLOAD_BYTES = 1024
    limited.configure(encrypt=True)
    fits = limited.publish("x" * 1000)  # 1002 bytes of JSON; encrypted, well over 1024
    assert len(raw("django_jobs_message", "payload", fits.id)) > 1024
    with pytest.raises(PayloadTooLarge, match="over MAX_PAYLOAD_BYTES=1024"):
        limited.publish("x" * 1030)
    assert Message.objects.count() == 1


@db
def test_publishing_to_an_encrypted_topic_without_keys_raises_and_publishes_nothing():
    t = vault()
    with keys():
        with pytest.raises(EncryptionKeysMissing, match="Topic 'vault' is to store its messages encrypted"):
            t.publish({"card": SECRET})
        with pytest.raises(EncryptionKeysMissing, match="nothing was published"):
            t.publish_many([{"payload": 1}, {"payload": 2}])
        django_jobs.topic("plain").publish(1)  # a plain topic needs no key
    assert list(Message.objects.values_list("topic", flat=True)) == ["plain"]
    assert not TopicPartition.objects.filter(topic="vault").exists()


@db
def test_a_plain_payload_shaped_like_an_envelope_is_refused():
    with pytest.raises(InvalidArgumentValue, match="the shape of an encrypted payload"):
        django_jobs.topic("plain").publish({"$encrypted": "gAAAA-not-a-token"})
    django_jobs.topic("plain").publish({"$encrypted": "x", "other": 1})  # not the shape: fine
    assert Message.objects.count() == 1


# -- delivery ---------------------------------------------------------------------------------------


@db(transaction=True)
def test_the_handler_gets_plain_payloads_even_after_encryption_is_turned_off(registry, thread_worker, key_a):
    seen = []

    @django_jobs.subscriber("vault", group="g", start_from="beginning", batch=5)
    def collect(messages, context):
        seen.extend(m.payload for m in messages)

    t = vault()
    t.publish_many([{"payload": {"card": SECRET, "n": n}} for n in range(2)])
    t.configure(encrypt=False)
    t.publish({"n": 2})
    assert [is_encrypted(p) for p in Message.objects.order_by("id").values_list("payload", flat=True)] == [
        True, True, False,
    ]  # fmt: skip
    thread_worker(topics=["vault"])
    wait_until(lambda: len(seen) == 3, timeout=30, message="three messages handled")
    assert seen == [{"card": SECRET, "n": 0}, {"card": SECRET, "n": 1}, {"n": 2}]


@db(transaction=True)
def test_a_payload_no_key_decrypts_goes_to_the_dead_letters_with_an_error_naming_the_setting(registry, thread_worker):
    seen = []

    @django_jobs.subscriber("vault", group="g", start_from="beginning", max_attempts=2, backoff=0)
    def collect(message, context):
        seen.append((message.payload, context.replay))

    with keys(KEY_A):
        t = vault()
        locked = t.publish({"card": SECRET})
    token = Message.objects.get(id=locked.id).payload["$encrypted"]
    with keys(KEY_B):  # the worker has another key: the message cannot be decrypted there
        t.publish({"n": "after"})  # encrypted with B: the worker still goes on with it
        worker = thread_worker(topics=["vault"])
        wait_until(lambda: seen == [({"n": "after"}, False)], timeout=30, message="the next message handled")
        worker.stop()
    letter = DeadLetter.objects.get()
    assert letter.message_id == locked.id and letter.attempts == 2
    assert letter.payload == {"$encrypted": token}  # copied as stored
    assert letter.error.startswith(f"DecryptionFailed: message {locked.id} of topic 'vault' is stored encrypted")
    assert 'Add the key that encrypted it to DJANGO_JOBS["ENCRYPTION_KEYS"]' in letter.error
    assert SECRET not in letter.error
    with keys(KEY_B, KEY_A):  # the key is back: replaying delivers it, decrypted
        t.group("g").replay()
        thread_worker(topics=["vault"])
        wait_until(lambda: not DeadLetter.objects.exists(), timeout=30, message="the replay handled")
    assert seen[1] == ({"card": SECRET}, True)


@db(transaction=True)
def test_a_handler_failure_is_stored_encrypted_logged_without_its_message_and_replays(
    registry, thread_worker, key_a, caplog
):
    outcomes = ["fail", "fail", "ok"]
    seen = []

    @django_jobs.subscriber("vault", group="g", start_from="beginning", max_attempts=1)
    def refuse(message, context):
        seen.append((message.payload, context.replay))
        if outcomes.pop(0) == "fail":
            raise ValueError(f"refused card {message.payload['card']}")

    t = vault()
    t.publish({"card": SECRET})
    with caplog.at_level("WARNING", logger="django_jobs.worker.topics"):
        worker = thread_worker(topics=["vault"])
        wait_until(lambda: DeadLetter.objects.exists(), timeout=30, message="the dead letter")
        worker.stop()
    letter = DeadLetter.objects.get()
    assert is_encrypted(letter.payload)
    assert is_encrypted_text(letter.error) and is_encrypted_text(letter.traceback)
    assert letter.error.startswith("ValueError: {")  # the exception's name stays readable
    assert decrypt_text(letter.error) == f"ValueError: refused card {SECRET}"
    assert f"refused card {SECRET}" in decrypt_text(letter.traceback)
    for column in ("payload", "error", "traceback"):
        assert SECRET not in raw("django_jobs_dead_letter", column, letter.id)
    lines = [r.getMessage() for r in caplog.records if r.name == "django_jobs.worker.topics"]
    assert any("ValueError (its message is not logged: the messages are encrypted)" in line for line in lines)
    assert_hidden("\n".join(lines))
    [(kind, data)] = [(e.kind, e.data) for e in django_jobs.events(queue="vault").events]
    assert kind == "dead-lettered" and data["error"] == f"ValueError: {SHOWN}"
    assert_hidden(json.dumps(data))

    t.group("g").replay()  # fails again: the new error is stored encrypted too
    worker = thread_worker(topics=["vault"])
    wait_until(lambda: DeadLetter.objects.get().state == "dead" and len(seen) == 2, timeout=30)
    letter = DeadLetter.objects.get()
    assert letter.attempts == 2 and is_encrypted_text(letter.error) and is_encrypted_text(letter.traceback)
    t.group("g").replay()  # succeeds: the dead letter is deleted
    wait_until(lambda: not DeadLetter.objects.exists(), timeout=30, message="the replay to succeed")
    worker.stop()
    assert seen == [({"card": SECRET}, False), ({"card": SECRET}, True), ({"card": SECRET}, True)]


# -- the engine's failure paths and events ------------------------------------------------------------


@db(transaction=True)  # events are read once their transaction committed
def test_failures_of_an_encrypted_topic_are_stored_encrypted_and_events_name_the_exception_only(key_a):
    t = vault()
    t.publish({"card": SECRET}, partition="p")
    error, trace = f"ValueError: refused {SECRET}", f"Traceback ...\nValueError: refused {SECRET}"
    assert bus.fail_batch(take(), error=error, traceback=trace, max_attempts=2, backoff=0, using="default",
                          now=LATER) == "retry"  # fmt: skip
    cursor = GroupCursor.objects.get(topic="vault")
    assert decrypt_text(cursor.last_error) == error and SECRET not in raw(
        "django_jobs_group_cursor", "last_error", cursor.id
    )
    later = LATER + timedelta(seconds=1)
    assert (
        bus.fail_batch(take(now=later), error=error, traceback=trace, max_attempts=2, using="default", now=later)
        == "dead"
    )
    letter = DeadLetter.objects.get()
    assert (decrypt_text(letter.error), decrypt_text(letter.traceback)) == (error, trace)

    t.publish({"card": SECRET}, partition="p")
    assert bus.fail_batch(take(now=later), error=error, max_attempts=1, on_failure="block", using="default",
                          now=later) == "blocked"  # fmt: skip
    t.group("g").skip_partition("p")  # the head message goes to the dead letters with the cursor's error
    skipped = DeadLetter.objects.order_by("id").last()
    assert is_encrypted(skipped.payload) and decrypt_text(skipped.error) == error

    events = [(e.kind, e.data) for e in django_jobs.events(queue="vault").events]
    assert [k for k, _ in events] == ["message-retried", "dead-lettered", "message-blocked", "dead-lettered"]
    assert [d.get("error") for _, d in events] == [f"ValueError: {SHOWN}"] * 3 + [None]
    assert_hidden(json.dumps([d for _, d in events]))


@db
def test_a_failure_of_an_encrypted_topic_without_a_usable_key_stores_no_message(key_a):
    t = vault()
    t.publish({"card": SECRET})
    b = take()
    with keys():
        assert bus.fail_batch(b, error=f"ValueError: {SECRET}", traceback=SECRET, max_attempts=1, using="default",
                              now=LATER) == "dead"  # fmt: skip
    letter = DeadLetter.objects.get()
    assert letter.error == f"ValueError: {bus.NOT_STORED}" and letter.traceback == ""


@db
def test_a_plain_message_of_a_topic_that_now_encrypts_fails_encrypted_and_the_reverse():
    with keys(KEY_A):
        bus.ensure_group("t", "g", start_from="beginning", using="default")
        t = django_jobs.topic("t")
        t.publish("plain")
        t.configure(encrypt=True)  # the topic encrypts now: the failure of its plain message is encrypted
        assert bus.fail_batch(take("t"), error=f"ValueError: {SECRET}", max_attempts=1, using="default", now=LATER)
        t.publish("sealed")
        t.configure(encrypt=False)  # the message is encrypted: its failure too, whatever the topic says now
        assert bus.fail_batch(take("t"), error=f"ValueError: {SECRET}", max_attempts=1, using="default", now=LATER)
    first, second = DeadLetter.objects.order_by("id")
    assert first.payload == "plain" and is_encrypted_text(first.error)
    assert is_encrypted(second.payload) and is_encrypted_text(second.error)


# -- key rotation ----------------------------------------------------------------------------------


def _stored_for_rotation() -> None:
    """Three encrypted messages in partition p (and one plain message elsewhere); the first one
    dead-lettered, the second one's partition blocked. Call it with a key."""
    t = vault()
    t.publish_many([{"payload": {"card": SECRET, "n": n}, "partition": "p"} for n in range(3)])
    django_jobs.topic("plain").publish("in clear")
    b = bus.acquire_batch("vault", "g", batch_size=1, worker_id="w", using="default", now=LATER)
    bus.fail_batch(b, error=f"ValueError: {SECRET}", traceback=SECRET, max_attempts=1, using="default", now=LATER)
    b = bus.acquire_batch("vault", "g", batch_size=1, worker_id="w", using="default", now=LATER)
    bus.fail_batch(b, error=f"KeyError: {SECRET}", max_attempts=1, on_failure="block", using="default", now=LATER)


@db
def test_rotate_keys_re_encrypts_messages_dead_letters_and_cursor_errors():
    with keys(KEY_A):
        _stored_for_rotation()
    with keys(KEY_B, KEY_A):
        done = django_jobs.rotate_keys(batch_size=1)
        assert (done.messages, done.dead_letters, done.cursor_errors, done.undecryptable) == (3, 1, 1, [])
        again = django_jobs.rotate_keys()
        assert (again.messages, again.dead_letters, again.cursor_errors) == (0, 0, 0)  # nothing left to do
    with keys(KEY_B):  # A removed: everything still decrypts
        stored = Message.objects.filter(topic="vault").order_by("id").values_list("payload", flat=True)
        payloads = [decrypt_json(p) for p in stored]
        assert payloads == [{"card": SECRET, "n": n} for n in range(3)]
        assert Message.objects.get(topic="plain").payload == "in clear"
        letter = DeadLetter.objects.get()
        assert decrypt_json(letter.payload) == {"card": SECRET, "n": 0}
        assert (decrypt_text(letter.error), decrypt_text(letter.traceback)) == (f"ValueError: {SECRET}", SECRET)
        assert decrypt_text(GroupCursor.objects.get(blocked=True).last_error) == f"KeyError: {SECRET}"


@db
def test_jobs_rotate_keys_reports_topics_and_lists_what_no_key_decrypts():
    with keys(KEY_A):
        _stored_for_rotation()
    with keys(KEY_B, KEY_A):
        out = io.StringIO()
        call_command("jobs", "rotate-keys", stdout=out)
        assert "Topics: re-encrypted 3 message(s), 1 dead letter(s) and 1 group cursor error(s)." in out.getvalue()
    other = Fernet.generate_key().decode()
    with keys(other), pytest.raises(CommandError, match="5 encrypted value") as failed:
        call_command("jobs", "rotate-keys", stdout=io.StringIO(), stderr=io.StringIO())
    messages = Message.objects.filter(topic="vault").order_by("id").values_list("id", flat=True)
    letter, cursor = DeadLetter.objects.get(), GroupCursor.objects.get(blocked=True)
    listed = [*(f"message {i}" for i in messages), f"dead letter {letter.id}", f"cursor error {cursor.id}"]
    assert str(failed.value).endswith(": " + ", ".join(listed))


# -- never shown ------------------------------------------------------------------------------------


@db
def test_the_admin_never_shows_encrypted_payloads_or_errors(key_a):
    _stored_for_rotation()
    client = superuser_client()
    overview = client.get("/admin/django_jobs/topic/").content.decode()
    assert 'data-figure="encrypted"' in overview
    topic_page = client.get("/admin/django_jobs/topic/vault/dashboard/").content.decode()
    assert "yes: payloads are stored encrypted" in topic_page
    group = client.get("/admin/django_jobs/topic/vault/dashboard/group/g/").content.decode()
    assert "stores its messages encrypted" in group
    assert f"ValueError: {SHOWN}" in group and f"KeyError: {SHOWN}" in group  # a dead letter, a blocked partition
    assert SHOWN in group
    for body in (overview, topic_page, group):
        assert_hidden(body)


@db
def test_the_admin_settings_form_turns_encryption_on_and_off(key_a):
    vault()
    client = superuser_client()
    url = "/admin/django_jobs/topic/vault/dashboard/action/settings/"
    assert client.post(url, {"encrypt": "false"}).status_code == 302
    assert django_jobs.topic("vault").config.encrypt is False
    assert client.post(url, {"encrypt": "true"}).status_code == 302
    assert django_jobs.topic("vault").config.encrypt is True
    page = client.get("/admin/django_jobs/topic/vault/dashboard/").content.decode()
    assert '<option value="true" selected>Yes</option>' in page
    assert client.post("/admin/django_jobs/topic/vault/change/", {"encrypt": "false"}).status_code == 302
    assert django_jobs.topic("vault").config.encrypt is False


@db
def test_manage_py_jobs_never_prints_encrypted_payloads_or_errors(key_a):
    _stored_for_rotation()

    def jobs(*args: str) -> str:
        out = io.StringIO()
        call_command("jobs", *args, stdout=out, stderr=io.StringIO())
        return out.getvalue()

    topics = {r["topic"]: r for r in rows(jobs("topics"))}
    assert (topics["vault"]["encrypted"], topics["plain"]["encrypted"]) == ("yes", "no")
    assert {t["topic"]: t["encrypted"] for t in json.loads(jobs("topics", "--json"))} == {"plain": False, "vault": True}
    lag = jobs("lag", "vault")
    assert "is encrypted" in lag and f"BLOCKED: KeyError: {SHOWN}" in lag
    lag_json = json.loads(jobs("lag", "vault", "--json"))
    assert lag_json["encrypted"] is True
    assert [p["last_error"] for p in lag_json["groups"][0]["partitions"]] == [f"KeyError: {SHOWN}"]
    letters = jobs("dead-letters", "vault", "--group", "g")
    assert f"ValueError: {SHOWN}" in letters and SHOWN in letters
    [data] = json.loads(jobs("dead-letters", "vault", "--group", "g", "--json"))
    assert (data["encrypted"], data["payload"], data["error"]) == (True, SHOWN, f"ValueError: {SHOWN}")
    for text in (jobs("topics"), lag, json.dumps(lag_json), letters, json.dumps(data)):
        assert_hidden(text)


# -- checks -----------------------------------------------------------------------------------------


def test_check_w003_names_topics_declared_encrypted_when_there_is_no_key():
    declared = {"TOPICS": {"vault": {"encrypt": True}, "plain": {"encrypt": False}}}
    with override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, **declared, "ENCRYPTION_KEYS": []}):
        found = [m.msg for m in check_encryption() if m.id == "django_jobs.W003"]
    assert any(msg.startswith("Topic(s) vault have encrypt=True in DJANGO_JOBS['TOPICS']") for msg in found)
    assert not any("plain" in msg for msg in found)
    with override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, **declared, "ENCRYPTION_KEYS": [KEY_A]}):
        assert not [m for m in check_encryption() if m.id == "django_jobs.W003"]

"""Bus mode in the worker: the subscribers' threads.

A :class:`Consumer` runs, for each subscriber (topic, group), ``concurrency`` threads. Each
thread loops: lease the group's next ready partition and take its batch
(``engine.topics.acquire_batch``), run the handler, then acknowledge (the cursor moves past the
batch) or record the failure (retry after backoff, dead letter or block). With nothing to take
it runs one dead letter an operator asked to replay, then sleeps until a NOTIFY for the topic
(PostgreSQL) or the jittered poll interval. A renewer thread extends the leases of the batches
being handled; a worker killed mid-batch stops renewing, its lease expires, and the next worker
to take the partition gets the same batch, in order. Each subscriber thread has the database end
its session when a transaction of it stays idle longer than the topic's lease, so that a worker
stopped mid-transaction does not keep its locks, and the partition, from the other workers.

Encrypted messages (a payload that is an envelope, ``spec.encryption``) are decrypted here, just
before the handler runs, whatever the topic's setting is now; the engine stores and copies them
(to the dead letters) as they are. A payload no key of this worker decrypts fails its batch
like a handler's error would (retries, then the dead letters or a blocked partition), with an
error saying which setting to fix; the loop goes on. A failure of an encrypted batch is logged
by its exception's name only.

``atomic=True``: the handler runs inside a transaction on the jobs database, and the
acknowledgement is the transaction's last statement; when it is refused (the lease was lost)
the transaction is rolled back, handler's writes included. So the handler's ORM writes, the
jobs it enqueues, the messages it publishes and the cursor's move commit together or not at all.

Kept apart from the job executor on purpose (the runner only starts and stops it).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from django.db import DatabaseError, close_old_connections, connections, transaction
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

from ..conf import get_settings
from ..drivers import driver
from ..engine import topic_control as control
from ..engine import topics as bus
from ..engine.topic_publish import TOPIC_NOTIFY_PREFIX
from ..exceptions import (
    DecryptionFailed,
    EncryptionKeysMissing,
    InvalidWorkerOption,
    JobsConfigurationError,
    LeaseLost,
)
from ..spec.encryption import decrypt_json, is_encrypted
from ..spec.topics import Subscriber, declared_subscribers
from ..spec.tracing import running
from ..topics import MessageContext
from .listener import Listener
from .trouble import close_connection

logger = logging.getLogger("django_jobs.worker.topics")

#: Seconds between two reads of a topic's settings by a thread, and between two housekeeping
#: rounds (cursors for new partitions, retention).
CONFIG_TTL = 5.0
HOUSEKEEPING_SECONDS = 30.0


def select_subscribers(topics: list[str] | None) -> list[Subscriber]:
    """The subscribers a worker runs: of every ``subscribers`` module of the installed apps
    (and any declared already), all of them (``topics`` None or ``["*"]``) or those of the
    named topics; an unknown name raises InvalidWorkerOption."""
    autodiscover_modules("subscribers")
    subs = declared_subscribers()
    if topics is None or "*" in topics:
        return subs
    known = {s.topic for s in subs}
    unknown = sorted(set(topics) - known)
    if unknown:
        raise InvalidWorkerOption(
            f"No subscriber for topic(s) {', '.join(unknown)}; declare them with @django_jobs.subscriber in a "
            "'subscribers' module of an installed app (or a module it imports)."
        )
    return [s for s in subs if s.topic in topics]


class Undecryptable(Exception):  # noqa: N818 - an outcome, like LeaseLost
    """A message's payload is encrypted and this worker cannot decrypt it; the message says why
    and what to fix (it quotes no payload)."""


def opened(messages: Iterable[bus.DeliveredMessage]) -> tuple[bus.DeliveredMessage, ...]:
    """The messages as a handler gets them: each encrypted payload decrypted (a message says
    itself whether it is encrypted). Raises Undecryptable."""
    out = []
    for m in messages:
        if is_encrypted(m.payload):
            try:
                m = replace(m, payload=decrypt_json(m.payload))
            except (DecryptionFailed, JobsConfigurationError) as exc:
                raise Undecryptable(_undecryptable(m, exc)) from None
        out.append(m)
    return tuple(out)


def _undecryptable(m: bus.DeliveredMessage, exc: Exception) -> str:
    if isinstance(exc, EncryptionKeysMissing):
        why = 'DJANGO_JOBS["ENCRYPTION_KEYS"] is empty in this worker'
    elif isinstance(exc, DecryptionFailed):
        why = (
            'no key of DJANGO_JOBS["ENCRYPTION_KEYS"] in this worker decrypts it (the key that encrypted it was '
            "removed or never configured here, or the stored row was altered)"
        )
    else:  # CryptographyMissing, InvalidEncryptionKeys: their message says what to install or fix
        why = f"this worker cannot decrypt it: {exc}"
    return (
        f"{type(exc).__name__}: message {m.id} of topic {m.topic!r} is stored encrypted and {why}. Add the key that "
        'encrypted it to DJANGO_JOBS["ENCRYPTION_KEYS"] of the workers (docs/howto/encryption.md), then replay the '
        "dead letter (or retry the blocked partition)."
    )


def _logged(exc: BaseException, encrypted: bool) -> str:
    """A handler's error as the log shows it: for an encrypted batch its exception's name only."""
    if encrypted:
        return f"{type(exc).__name__} (its message is not logged: the messages are encrypted)"
    return f"{type(exc).__name__}: {exc}"


class _Threads:
    """The threads of one subscriber and which of them wait for work. A wake-up goes to one
    waiting thread; with none waiting it is kept (``pending``) for the next thread about to
    wait, which then looks again instead: a message committed while every thread was busy is
    not left to the poll interval."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[threading.Event] = []
        self._pending = False

    def wake_one(self) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.pop().set()
            else:
                self._pending = True

    def wake_all(self) -> None:
        """Every thread looks again (their events are set by the caller)."""
        with self._lock:
            self._pending = True
            self._waiting.clear()

    def wait(self, event: threading.Event, timeout: float) -> None:
        """Wait on ``event`` (this thread's) up to ``timeout`` seconds, unless a wake-up is pending."""
        with self._lock:
            if self._pending:
                self._pending = False
                return
            event.clear()
            self._waiting.append(event)
        event.wait(timeout)
        with self._lock:
            if event in self._waiting:
                self._waiting.remove(event)


class _Wake:
    """Wakes consumer threads. A topic's NOTIFY (``set_for``) wakes one waiting thread of each
    subscriber of that topic, and a thread that then takes a batch wakes one more of its
    subscriber's (:meth:`_Threads.wake_one`), so a burst fans out over the threads while a
    trickle of messages wakes one thread each, not every thread of every topic. ``set`` (the
    listener (re)connected: notifications may have been missed; the worker stops) wakes all."""

    def __init__(self) -> None:
        self.events: list[threading.Event] = []
        self._threads: list[_Threads] = []
        self._by_topic: dict[str, list[_Threads]] = {}

    def group(self, topic: str) -> _Threads:
        """A new subscriber's thread set, woken by ``topic``'s notifications."""
        threads = _Threads()
        self._threads.append(threads)
        self._by_topic.setdefault(TOPIC_NOTIFY_PREFIX + topic, []).append(threads)
        return threads

    def new(self) -> threading.Event:
        event = threading.Event()
        self.events.append(event)
        return event

    def set_for(self, payload: str) -> None:
        for threads in self._by_topic.get(payload, ()):
            threads.wake_one()

    def set(self) -> None:
        for threads in self._threads:
            threads.wake_all()
        for event in self.events:
            event.set()


class Consumer:
    """The subscribers' threads of one worker process (see the module's doc)."""

    def __init__(
        self,
        *,
        using: str,
        subscribers: Iterable[Subscriber],
        worker_id: str,
        stopping: threading.Event,
        sleep: float,
    ):
        self.using = using
        self.subscribers = list(subscribers)
        self.worker_id = worker_id
        self.stopping = stopping
        self.sleep = sleep
        self.wake = _Wake()
        # token -> (batch, lease seconds, when to renew it on this process's monotonic clock)
        self._held: dict[Any, tuple[bus.Batch, float, float]] = {}
        self._held_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._local = threading.local()  # per subscriber thread: the connection its limit was set on
        self.handled = 0

    @property
    def topics(self) -> list[str]:
        return sorted({s.topic for s in self.subscribers})

    def start(self) -> list[threading.Thread]:
        for sub in self.subscribers:
            threads = self.wake.group(sub.topic)
            for i in range(sub.concurrency):
                event = self.wake.new()
                t = threading.Thread(
                    target=self._loop, args=(sub, event, threads), name=f"jobs-topic-{sub.name}-{i}", daemon=True
                )
                self._threads.append(t)
        renewer = threading.Thread(target=self._renew_loop, name="jobs-topic-renewer", daemon=True)
        self._threads.append(renewer)
        if driver(self.using).LISTEN_NOTIFY:  # elsewhere the threads poll
            self._threads.append(
                Listener(
                    using=self.using,
                    channel=get_settings().NOTIFY_CHANNEL,
                    queues=[TOPIC_NOTIFY_PREFIX + t for t in self.topics],
                    wake=self.wake,  # type: ignore[arg-type]
                    stopping=self.stopping,
                )
            )
        for t in self._threads:
            t.start()
        return self._threads

    def join(self, deadline: float) -> int:
        """Wait for the threads until ``deadline`` (monotonic); how many still run (their
        batches' leases expire and the batches go to another worker)."""
        self.wake.set()
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self._threads)

    # -- one subscriber thread ------------------------------------------------------------------------

    def _loop(self, sub: Subscriber, wake: threading.Event, threads: _Threads) -> None:
        config: bus.TopicConfig | None = None
        config_at = housekeeping_at = 0.0
        failures = 0
        while not self.stopping.is_set():
            try:
                if config is None or time.monotonic() - config_at > CONFIG_TTL:
                    config, config_at = bus.topic_config(sub.topic, using=self.using), time.monotonic()
                    self._limit_idle_transactions(config.lease_seconds)
                    bus.ensure_group(sub.topic, sub.group, start_from=sub.start_from, using=self.using)
                self._limit_idle_transactions(config.lease_seconds)
                if time.monotonic() - housekeeping_at > HOUSEKEEPING_SECONDS:
                    self._housekeeping(sub)
                    housekeeping_at = time.monotonic()
                asked = time.monotonic()  # the lease runs from no earlier than this
                batch = bus.acquire_batch(
                    sub.topic,
                    sub.group,
                    batch_size=sub.batch,
                    worker_id=self.worker_id,
                    using=self.using,
                    config=config,
                )
                if batch is not None:
                    threads.wake_one()  # there may be more: a sibling looks too
                    self._handle(sub, batch, config, asked)
                    failures = 0
                    continue
                replay = control.claim_replay(
                    sub.topic, sub.group, lease_seconds=config.lease_seconds, using=self.using
                )
                if replay is not None:
                    self._replay(sub, replay)
                    continue
                failures = 0
                threads.wait(wake, self.sleep * random.uniform(0.8, 1.2))
            except DatabaseError as exc:
                failures += 1
                logger.warning(
                    "Subscriber %s: database error (%s: %s); retrying.", sub.name, type(exc).__name__, str(exc).strip()
                )
                close_connection(self.using)
                self.stopping.wait(min(5.0, 0.05 * 2**failures) * random.uniform(0.5, 1.0))
            except Exception:  # noqa: BLE001 - a bug of ours must not kill the thread silently
                logger.exception("Subscriber %s: unexpected error; going on.", sub.name)
                self.stopping.wait(1.0)
            finally:
                close_old_connections()

    def _limit_idle_transactions(self, lease: float) -> None:
        """Bound every transaction of this thread's connection (the takes, the failures, an
        ``atomic=True`` handler's) to ``lease`` seconds idle: a worker stopped in the middle of
        one (SIGSTOP, a VM pause) would otherwise keep its row locks until it resumes, and the
        cursor rows it locked are skipped by every other worker's take (SKIP LOCKED), however long
        ago their lease expired. The database ends the session instead, and rolls it back. Set
        once per connection, and again when the topic's lease changes."""
        conn = connections[self.using]
        conn.ensure_connection()
        state = self._local
        if getattr(state, "connection", None) is conn.connection and getattr(state, "lease", None) == lease:
            return
        driver(self.using).limit_idle_transactions(lease)
        state.connection, state.lease = conn.connection, lease

    def _housekeeping(self, sub: Subscriber) -> None:
        """Cursors for partitions created while the group registered, and retention."""
        with transaction.atomic(using=self.using):
            bus.ensure_cursors(sub.topic, sub.group, using=self.using, now=timezone.now())
        control.prune_messages(sub.topic, using=self.using)

    def _handle(self, sub: Subscriber, batch: bus.Batch, config: bus.TopicConfig, asked: float) -> None:
        if batch.attempt > sub.max_attempts:
            # Its workers died with it (leases expired) as many times as it may be attempted.
            outcome = bus.fail_batch(
                batch,
                error="The batch's workers died while handling it (its lease expired) on every attempt.",
                max_attempts=sub.max_attempts,
                on_failure=sub.on_failure,
                confidential=False,  # the worker's words: stored in clear
                using=self.using,
            )
            logger.warning("Subscriber %s: partition %r stalled too often -> %s", sub.name, batch.partition, outcome)
            return
        encrypted = config.encrypt or any(is_encrypted(m.payload) for m in batch.messages)
        try:
            messages = opened(batch.messages)
        except Undecryptable as exc:
            outcome = bus.fail_batch(
                batch,
                error=str(exc),
                max_attempts=sub.max_attempts,
                backoff=sub.backoff,
                on_failure=sub.on_failure,
                confidential=False,  # the worker's words, not the payload's: stored in clear
                using=self.using,
            )
            logger.warning("Subscriber %s: %s -> %s", sub.name, exc, outcome)
            return
        context = MessageContext(sub.topic, sub.group, batch.partition, batch.attempt, self.worker_id)
        arg: Any = messages[0] if sub.batch == 1 else list(messages)
        with self._held_lock:
            self._held[batch.token] = (batch, config.lease_seconds, asked + config.lease_seconds * bus.RENEW_AFTER)
        try:
            with running(batch.messages[0].trace_id):
                if sub.atomic:
                    with transaction.atomic(using=self.using):
                        sub.func(arg, context)
                        if not bus.ack_batch(batch, using=self.using):
                            raise LeaseLost()
                else:
                    sub.func(arg, context)
        except LeaseLost:
            logger.warning("Subscriber %s: lease lost; the handler's transaction was rolled back.", sub.name)
            return
        except Exception as exc:  # noqa: BLE001 - the handler's error is an outcome
            outcome = bus.fail_batch(
                batch,
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
                max_attempts=sub.max_attempts,
                backoff=sub.backoff,
                on_failure=sub.on_failure,
                using=self.using,
            )
            logger.warning(
                "Subscriber %s: partition %r positions %d-%d failed (attempt %d): %s -> %s",
                sub.name,
                batch.partition,
                batch.start + 1,
                batch.end,
                batch.attempt,
                _logged(exc, encrypted),
                outcome,
            )
            return
        finally:
            with self._held_lock:
                self._held.pop(batch.token, None)
        if not sub.atomic:
            bus.ack_batch(batch, using=self.using)
        self.handled += len(batch.messages)

    def _replay(self, sub: Subscriber, replay: control.Replay) -> None:
        try:
            [m] = opened([replay.message])
        except Undecryptable as exc:
            control.settle_replay(replay, error=str(exc), confidential=False, using=self.using)
            logger.warning("Subscriber %s: replaying dead letter %d: %s", sub.name, replay.id, exc)
            return
        context = MessageContext(sub.topic, sub.group, m.partition, replay.attempts + 1, self.worker_id, replay=True)
        arg: Any = m if sub.batch == 1 else [m]
        try:
            with running(m.trace_id):
                if sub.atomic:
                    with transaction.atomic(using=self.using):
                        sub.func(arg, context)
                        if not control.settle_replay(replay, error=None, using=self.using):
                            raise LeaseLost()
                else:
                    sub.func(arg, context)
        except LeaseLost:
            return
        except Exception as exc:  # noqa: BLE001 - the handler's error is an outcome
            control.settle_replay(
                replay, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(), using=self.using
            )
            return
        if not sub.atomic:
            control.settle_replay(replay, error=None, using=self.using)

    # -- leases ---------------------------------------------------------------------------------------

    def _renew_loop(self) -> None:
        """Extend the leases of the batches being handled, at a third of their length; after a
        stop request, for as long as a handler still runs. When is reckoned on this process's
        monotonic clock from the time the lease was asked for, not from the expiry the database
        wrote: on PostgreSQL that is the database's clock, and a database clock ahead of this
        host's by two thirds of the lease would otherwise have the renewal come too late."""
        while True:
            if self.stopping.is_set():
                if not self._held:
                    return
                time.sleep(0.5)
            else:
                self.stopping.wait(0.5)
            with self._held_lock:
                held = list(self._held.values())
            for batch, lease, renew_at in held:
                if time.monotonic() < renew_at:
                    continue
                try:
                    self._renew(batch, lease)
                except DatabaseError as exc:
                    logger.warning("Renewing a topic lease failed (%s); trying again.", exc)
                    close_connection(self.using)
            close_old_connections()

    def _renew(self, batch: bus.Batch, lease: float) -> None:
        asked = time.monotonic()
        expires = bus.renew_batch_lease(batch, lease_seconds=lease, using=self.using)
        with self._held_lock:
            if batch.token not in self._held:
                return  # finished meanwhile
            if expires is not None:
                self._held[batch.token] = (
                    replace(batch, lease_expires_at=expires),
                    lease,
                    asked + lease * bus.RENEW_AFTER,
                )
                return
            self._held.pop(batch.token, None)
        logger.warning(
            "Subscriber %s/%s: the lease of partition %r was lost while its batch ran.",
            batch.topic,
            batch.group,
            batch.partition,
        )


__all__ = ["Consumer", "Undecryptable", "opened", "select_subscribers"]

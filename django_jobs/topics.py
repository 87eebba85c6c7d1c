"""Bus mode's Python API: ``django_jobs.topic(name)`` publishes and controls a topic and its
groups; ``@django_jobs.subscriber(topic, group=...)`` declares a group's handler, which
``manage.py runworker`` runs. See docs/howto/bus-mode.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .conf import get_settings
from .engine import topic_control as control
from .engine import topic_publish as publishing
from .engine import topics as bus
from .engine.topic_publish import Published
from .engine.topics import TopicConfig
from .exceptions import InvalidPublishOption
from .models import DeadLetter
from .spec.topics import (
    Subscriber,
    make_subscriber,
    new_message,
    register_subscriber,
    topic_columns,
    validate_topic_name,
)

_ITEM_KEYS = {"payload", "partition", "transaction_id", "trace_id", "delay"}


@dataclass(frozen=True, slots=True)
class MessageContext:
    """What a handler is told besides its messages: where they come from, which attempt this
    is (1 on first delivery), and whether it is an operator's replay of a dead letter."""

    topic: str
    group: str
    partition: str
    attempt: int
    worker_id: str
    replay: bool = False


class GroupControl:
    """One consumer group of a topic: pause/resume, seek, lag, blocked partitions, dead letters."""

    def __init__(self, topic: str, name: str, using: str):
        self.topic = topic
        self.name = validate_topic_name(name, "group")
        self.using = using

    def pause(self) -> None:
        control.set_group_paused(self.topic, self.name, True, using=self.using)

    def resume(self) -> None:
        control.set_group_paused(self.topic, self.name, False, using=self.using)

    def seek(self, to: Any) -> int:
        """Move the group's cursors (see ``engine.topic_control.seek_group``); returns how many moved."""
        return control.seek_group(self.topic, self.name, to, using=self.using)

    def lag(self) -> dict[str, int]:
        """``{partition: messages not yet consumed}``."""
        return {p.partition: p.lag for p in control.group_lag(self.topic, self.name, using=self.using)}

    def total_lag(self) -> int:
        return sum(self.lag().values())

    def partitions(self) -> list[control.PartitionLag]:
        """Each partition's cursor, lag, lease and blocked state."""
        return control.group_lag(self.topic, self.name, using=self.using)

    def retry_partition(self, partition: str) -> None:
        """Unblock a partition stopped by ``on_failure="block"``: its batch is delivered again."""
        control.retry_blocked(self.topic, self.name, partition, using=self.using)

    def skip_partition(self, partition: str) -> int:
        """Unblock a partition by dead-lettering its head message; returns that message's id."""
        return control.skip_blocked(self.topic, self.name, partition, using=self.using)

    def dead_letters(self) -> Any:
        """The group's dead letters (a QuerySet, oldest first), as stored: an encrypted message's
        payload is its envelope (``spec.encryption.decrypt_json``), an encrypted topic's error
        and traceback encrypted texts (``decrypt_text``)."""
        return DeadLetter.objects.using(self.using).filter(topic=self.topic, group_name=self.name)

    def replay(self, ids: Iterable[int] | None = None) -> int:
        """Run dead letters again (``ids``, or all of the group's); returns how many were queued."""
        return control.replay_dead_letters(self.topic, self.name, None if ids is None else list(ids), using=self.using)

    def delete_dead_letters(self, ids: Iterable[int] | None = None) -> int:
        return control.delete_dead_letters(self.topic, self.name, None if ids is None else list(ids), using=self.using)


class TopicControl:
    """A topic: publish to it, read and change its settings, reach its groups."""

    def __init__(self, name: str, *, backend: str = "default"):
        self.name = validate_topic_name(name)
        self.backend = backend
        self.settings = get_settings(backend)
        self.using = self.settings.DATABASE

    def publish(
        self,
        payload: Any,
        *,
        partition: str | None = None,
        transaction_id: str | None = None,
        trace_id: str | None = None,
        delay: Any = None,
    ) -> Published:
        """Publish one message in the caller's transaction (see :meth:`publish_many`)."""
        message = new_message(
            payload,
            partition=partition,
            transaction_id=transaction_id,
            trace_id=trace_id,
            delay=delay,
            cap=self.settings.MAX_PAYLOAD_BYTES,
        )
        return publishing.publish_one(self.name, message, using=self.using)

    def publish_many(self, items: Iterable[dict[str, Any]]) -> list[Published]:
        """Publish several messages at once, in order. Each item is a dict with ``payload`` and
        optionally ``partition``, ``transaction_id``, ``trace_id``, ``delay``. All or nothing:
        an invalid item or TopicFull publishes none. A topic with ``encrypt`` stores the payloads
        encrypted (checked and sized in clear first); without ``ENCRYPTION_KEYS`` it raises
        EncryptionKeysMissing and publishes none."""
        messages = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "payload" not in item or set(item) - _ITEM_KEYS:
                raise InvalidPublishOption(
                    f"publish_many item {i} must be a dict with 'payload' and optionally 'partition', "
                    f"'transaction_id', 'trace_id', 'delay'; got {item!r}."
                )
            rest = {k: v for k, v in item.items() if k != "payload"}
            messages.append(new_message(item["payload"], cap=self.settings.MAX_PAYLOAD_BYTES, **rest))
        return publishing.publish_messages(self.name, messages, using=self.using)

    def configure(self, **settings: Any) -> None:
        """Change runtime settings: ``max_size``, ``lease``, ``delay``, ``max_wait``,
        ``window_buffer``, ``retention``, ``max_age`` (seconds or timedeltas), ``encrypt``
        (True or False: publish the payloads encrypted from now on; docs/howto/encryption.md).
        None: back to the declared value. Raises InvalidTopicSetting."""
        control.configure_topic(self.name, topic_columns(**settings), using=self.using)

    @property
    def config(self) -> TopicConfig:
        return bus.topic_config(self.name, using=self.using)

    def group(self, name: str) -> GroupControl:
        return GroupControl(self.name, name, self.using)

    def prune(self, now: datetime | None = None) -> int:
        """Delete the messages retention lets go (workers do it periodically)."""
        return control.prune_messages(self.name, using=self.using, now=now)


def topic(name: str, *, backend: str = "default") -> TopicControl:
    """The topic ``name`` (created on first publish)."""
    return TopicControl(name, backend=backend)


def subscriber(topic: str, *, group: str, **options: Any) -> Callable[[Callable[..., Any]], Subscriber]:
    """Declare ``group``'s handler of ``topic``: ``handler(message, context)``, or
    ``handler(messages, context)`` with ``batch > 1``. Options: ``batch`` (1), ``start_from``
    ("new", "beginning" or an aware datetime; the group's first run only), ``max_attempts``
    (3), ``backoff`` ("exponential", seconds or a list), ``on_failure`` ("dead_letter" or
    "block"), ``atomic`` (False: True commits the handler's ORM writes, the jobs it enqueues, the
    messages it publishes and the cursor's advance in one transaction), ``concurrency`` (1:
    threads per worker process for this group; partitions in parallel, each still in order)."""

    def decorate(func: Callable[..., Any]) -> Subscriber:
        sub = make_subscriber(func, topic, group=group, **options)
        register_subscriber(sub)
        return sub

    return decorate


__all__ = ["GroupControl", "MessageContext", "TopicControl", "subscriber", "topic"]

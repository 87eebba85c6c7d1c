"""Bus mode as declared: topic and group names, a message before it is published, a topic's
settings, and the subscribers declared in this process.

Part of :mod:`django_jobs.spec` (no models); ``django_jobs.topic(...)`` and
``django_jobs.subscriber(...)`` are in :mod:`django_jobs.topics`, a layer up.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..exceptions import (
    InvalidArgumentValue,
    InvalidPublishOption,
    InvalidSubscriber,
    InvalidTopicName,
    InvalidTopicSetting,
    PayloadTooLarge,
)
from .backoff import validate_backoff
from .encryption import ENVELOPE, is_encrypted
from .payload import normalize_argument
from .queues import QUEUE_NAME_RE
from .tracing import validate_trace_id

MAX_PARTITION_LENGTH = 200
MAX_TRANSACTION_ID_LENGTH = 255
#: Most messages per publish_many statement.
PUBLISH_CHUNK = 500
#: Most messages a subscriber takes at once.
MAX_BATCH = 1000
ON_FAILURE = ("dead_letter", "block")
#: The per-topic settings: ``DJANGO_JOBS["TOPICS"][name]`` keys, ``configure()`` arguments and
#: Topic columns (:data:`TOPIC_COLUMNS`).
TOPIC_SETTINGS = ("max_size", "lease", "delay", "max_wait", "window_buffer", "retention", "max_age", "encrypt")
#: Each setting's Topic column: ``<key>_seconds`` for a duration.
TOPIC_COLUMNS = {k: k if k in ("max_size", "encrypt") else f"{k}_seconds" for k in TOPIC_SETTINGS}
DEFAULT_LEASE_SECONDS = 30.0


def validate_topic_name(name: Any, what: str = "topic") -> str:
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise InvalidTopicName(
            f"Invalid {what} name {name!r}: use 1-100 characters of letters, digits, '_', '-', '.' and ':', "
            "starting with a letter or digit."
        )
    return name


def seconds(value: Any, what: str, *, error: type[Exception] = InvalidTopicSetting, zero_ok: bool = True) -> float:
    """``value`` (a number or a timedelta) as seconds, finite and >= 0 (> 0 unless ``zero_ok``)."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero_ok)
    ):
        raise error(f"{what} must be a number of seconds {'>=' if zero_ok else '>'} 0 or a timedelta; got {value!r}.")
    return float(value)


def topic_columns(**values: Any) -> dict[str, Any]:
    """Validated Topic columns for the given settings (``None`` resets one to its declaration)."""
    columns: dict[str, Any] = {}
    for key, value in values.items():
        if key not in TOPIC_SETTINGS:
            raise InvalidTopicSetting(f"Unknown topic setting {key!r}; the settings are {', '.join(TOPIC_SETTINGS)}.")
        if key == "max_size":
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InvalidTopicSetting(f"max_size must be an integer >= 1 or None; got {value!r}.")
            columns["max_size"] = value
        elif key == "encrypt":
            if value is not None and not isinstance(value, bool):
                raise InvalidTopicSetting(f"encrypt must be True, False or None; got {value!r}.")
            columns["encrypt"] = value
        else:
            zero_ok = key != "lease"
            columns[f"{key}_seconds"] = None if value is None else seconds(value, key, zero_ok=zero_ok)
            if key == "lease" and value is not None and columns["lease_seconds"] < 1:
                raise InvalidTopicSetting(f"lease must be at least 1 second; got {value!r}.")
    return columns


def validate_topic_declarations(declared: Any) -> dict[str, dict[str, Any]]:
    """``DJANGO_JOBS["TOPICS"]``: ``{name: {setting: value}}``, as Topic columns."""
    if not isinstance(declared, dict):
        raise InvalidTopicSetting(f'DJANGO_JOBS["TOPICS"] must be a dict of topic name to settings; got {declared!r}.')
    out = {}
    for name, values in declared.items():
        validate_topic_name(name)
        if not isinstance(values, dict):
            raise InvalidTopicSetting(f'DJANGO_JOBS["TOPICS"][{name!r}] must be a dict of settings; got {values!r}.')
        out[name] = topic_columns(**values)
    return out


@dataclass(frozen=True, slots=True)
class NewMessage:
    """One message to publish, validated."""

    payload: Any
    partition: str
    transaction_id: str | None
    trace_id: str | None
    delay: float | None


def json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def new_message(
    payload: Any,
    *,
    partition: Any = None,
    transaction_id: Any = None,
    trace_id: Any = None,
    delay: Any = None,
    cap: int,
) -> NewMessage:
    """Validate one message; ``cap`` is MAX_PAYLOAD_BYTES."""
    payload = normalize_argument(payload, "the message payload")
    if is_encrypted(payload):
        # Subscribers decrypt any payload of this shape (a message says itself it is encrypted).
        raise InvalidArgumentValue(
            f"The message payload is a dict whose only key is {ENVELOPE!r}, the shape of an encrypted payload, "
            "which subscribers would try to decrypt; wrap it in another key. To publish encrypted, configure the topic "
            "with encrypt=True (docs/howto/encryption.md)."
        )
    size = json_size(payload)
    if size > cap:
        raise PayloadTooLarge(
            f"The message payload is {size} bytes of JSON, over MAX_PAYLOAD_BYTES={cap}; store large data elsewhere "
            "and publish its key."
        )
    if partition is None:
        partition = ""
    if not isinstance(partition, str) or len(partition) > MAX_PARTITION_LENGTH or "\x00" in partition:
        raise InvalidPublishOption(
            f"partition must be a string of at most {MAX_PARTITION_LENGTH} characters without NUL, or None; "
            f"got {partition!r}."
        )
    if transaction_id is not None and (
        not isinstance(transaction_id, str)
        or not transaction_id
        or len(transaction_id) > MAX_TRANSACTION_ID_LENGTH
        or "\x00" in transaction_id
    ):
        raise InvalidPublishOption(
            f"transaction_id must be a non-empty string of at most {MAX_TRANSACTION_ID_LENGTH} characters, or "
            f"None; got {transaction_id!r}."
        )
    if trace_id is not None:
        trace_id = validate_trace_id(trace_id)
    if delay is not None:
        delay = seconds(delay, "delay", error=InvalidPublishOption)
    return NewMessage(payload, partition, transaction_id, trace_id, delay)


@dataclass(frozen=True, slots=True)
class Subscriber:
    """A consumer group's handler of a topic, as ``@django_jobs.subscriber(...)`` declared it.

    Calling it calls the handler (tests can call it directly)."""

    topic: str
    group: str
    func: Callable[..., Any]
    batch: int = 1
    start_from: Any = "new"
    max_attempts: int = 3
    backoff: Any = "exponential"
    on_failure: str = "dead_letter"
    atomic: bool = False
    concurrency: int = 1

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.group}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)


def validate_start_from(value: Any) -> Any:
    if value in ("new", "beginning"):
        return value
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value
    raise InvalidSubscriber(f'start_from must be "new", "beginning" or an aware datetime; got {value!r}.')


def make_subscriber(func: Any, topic: Any, *, group: Any, **options: Any) -> Subscriber:
    """Validate a subscriber's declaration."""
    if not callable(func):
        raise InvalidSubscriber(f"@subscriber decorates a function taking (message, context); got {func!r}.")
    validate_topic_name(topic)
    validate_topic_name(group, "group")
    batch = options.get("batch", 1)
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_BATCH:
        raise InvalidSubscriber(f"batch must be an integer from 1 to {MAX_BATCH}; got {batch!r}.")
    max_attempts = options.get("max_attempts", 3)
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
        raise InvalidSubscriber(f"max_attempts must be an integer >= 1; got {max_attempts!r}.")
    backoff = options.get("backoff", "exponential")
    if callable(backoff):
        raise InvalidSubscriber("A subscriber's backoff is 'exponential', a number of seconds or a list of them.")
    try:
        validate_backoff(backoff)
    except ValueError as exc:
        raise InvalidSubscriber(str(exc)) from None
    on_failure = options.get("on_failure", "dead_letter")
    if on_failure not in ON_FAILURE:
        raise InvalidSubscriber(f'on_failure must be "dead_letter" or "block"; got {on_failure!r}.')
    atomic = options.get("atomic", False)
    if not isinstance(atomic, bool):
        raise InvalidSubscriber(f"atomic must be True or False; got {atomic!r}.")
    concurrency = options.get("concurrency", 1)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or not 1 <= concurrency <= 100:
        raise InvalidSubscriber(f"concurrency must be an integer from 1 to 100; got {concurrency!r}.")
    unknown = set(options) - {"batch", "max_attempts", "backoff", "on_failure", "atomic", "concurrency", "start_from"}
    if unknown:
        raise InvalidSubscriber(f"Unknown subscriber option(s): {', '.join(sorted(unknown))}.")
    return Subscriber(
        topic=topic,
        group=group,
        func=func,
        batch=batch,
        start_from=validate_start_from(options.get("start_from", "new")),
        max_attempts=max_attempts,
        backoff=backoff,
        on_failure=on_failure,
        atomic=atomic,
        concurrency=concurrency,
    )


_registry: dict[tuple[str, str], Subscriber] = {}
_lock = threading.Lock()


def register_subscriber(sub: Subscriber) -> None:
    """Declare ``sub``; a group has one handler per topic (declaring it again replaces it, as a
    module reload does; a second function for the same group is refused)."""
    key = (sub.topic, sub.group)
    with _lock:
        old = _registry.get(key)
        if old is not None and (old.func.__module__, old.func.__qualname__) != (
            sub.func.__module__,
            sub.func.__qualname__,
        ):
            raise InvalidSubscriber(
                f"Group {sub.group!r} of topic {sub.topic!r} already has a subscriber "
                f"({old.func.__module__}.{old.func.__qualname__}); a group has one handler per topic."
            )
        _registry[key] = sub


def declared_subscribers() -> list[Subscriber]:
    with _lock:
        return sorted(_registry.values(), key=lambda s: (s.topic, s.group))


__all__ = [
    "MAX_BATCH",
    "TOPIC_COLUMNS",
    "TOPIC_SETTINGS",
    "NewMessage",
    "Subscriber",
    "declared_subscribers",
    "make_subscriber",
    "new_message",
    "register_subscriber",
    "seconds",
    "topic_columns",
    "validate_start_from",
    "validate_topic_declarations",
    "validate_topic_name",
]

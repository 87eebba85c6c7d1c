"""``Dedup``: the deduplication option of a task (BullMQ's ``deduplication``).

Part of :mod:`django_jobs.spec` (no models), so ``django_jobs.Dedup`` is importable without
settings. The engine does the work (:func:`django_jobs.engine.enqueue_deduplicated`); see docs/howto/deduplication.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from ..exceptions import InvalidTaskOptions

#: Longest dedup key (the column is 255 characters).
MAX_KEY_LENGTH = 255

#: The modes, by the options that make them (``Dedup.mode``).
SIMPLE, THROTTLE, DEBOUNCE, KEEP_LAST = "simple", "throttle", "debounce", "keep-last-if-active"


def _describe(value: Any) -> str:
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{value!r} ({article} {name})"


def check_key(key: Any, where: str, *, returned_by: str | None = None) -> str:
    """``key`` when it is a usable dedup key; else InvalidTaskOptions naming ``where``.

    ``returned_by``: the name of the key function that produced ``key``, for its message.
    """
    if not isinstance(key, str):
        if returned_by is not None:
            raise InvalidTaskOptions(
                f"The Dedup key function {returned_by} returned {_describe(key)}; it must return a string of "
                f"1-{MAX_KEY_LENGTH} characters."
            )
        raise InvalidTaskOptions(f"{where} must be a string or a callable (args, kwargs) -> str; got {_describe(key)}.")
    if not key:
        raise InvalidTaskOptions(f"{where} must not be empty; name what the job is about, such as 'user:42'.")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidTaskOptions(
            f"{where} is {len(key)} characters, over {MAX_KEY_LENGTH}; hash a long key "
            "(hashlib.sha256(key.encode()).hexdigest())."
        )
    if "\x00" in key:
        raise InvalidTaskOptions(f"{where} contains a NUL character (\\x00), which PostgreSQL cannot store; remove it.")
    return key


@dataclass(frozen=True, slots=True)
class Dedup:
    """Deduplicate jobs by ``key`` within their backend and queue: ``@task(dedup=Dedup(...))`` or
    ``.using(dedup=Dedup(...))``. An enqueue that is deduplicated returns the job holding the key,
    its result flagged ``duplicate=True``.

    ``key``: a string of 1-255 characters, or a callable ``(args: list, kwargs: dict) -> str``
    called at each enqueue with the job's arguments as stored (so ``enqueue_many`` gives each
    item its own key).
    ``ttl``: seconds the key holds from the enqueue that took it, whatever the job's state
    (throttle). ``None``: the key holds while its job is unfinished (simple).
    ``extend``: each duplicate resets the key's time to live to ``ttl`` from now (needs ``ttl``).
    ``replace``: a duplicate replaces the arguments and ``run_after`` of a holder that has not
    started (waiting or delayed) (needs ``ttl``). ``extend`` and ``replace`` together: debounce.
    ``keep_last_if_active``: a duplicate of a running holder is kept (the last one wins) and
    enqueued when the holder finishes.
    """

    key: str | Callable[[list[Any], dict[str, Any]], str]
    _: KW_ONLY
    ttl: float | None = None
    extend: bool = False
    replace: bool = False
    keep_last_if_active: bool = False

    def __post_init__(self) -> None:
        if not callable(self.key):
            check_key(self.key, "Dedup key")
        ttl = self.ttl
        if ttl is not None and (
            not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not math.isfinite(ttl) or ttl <= 0
        ):
            raise InvalidTaskOptions(
                f"Dedup ttl must be a number of seconds > 0, or None to hold the key while its job is unfinished; "
                f"got {ttl!r}."
            )
        for name in ("extend", "replace", "keep_last_if_active"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise InvalidTaskOptions(f"Dedup {name} must be True or False; got {value!r}.")
        if ttl is None:
            for name, what in (
                ("extend", "resets the key's time to live on each duplicate"),
                ("replace", "replaces a waiting holder's arguments until the key expires"),
            ):
                if getattr(self, name):
                    raise InvalidTaskOptions(
                        f"Dedup({name}=True) needs a ttl: {name} {what}. Pass ttl=seconds, for example "
                        f"Dedup(key, ttl=5, extend=True, replace=True) to debounce."
                    )

    @property
    def mode(self) -> str:
        """``simple``, ``throttle``, ``debounce`` or ``keep-last-if-active`` (the closest name;
        ``extend`` or ``replace`` alone count as debounce)."""
        if self.keep_last_if_active:
            return KEEP_LAST
        if self.extend or self.replace:
            return DEBOUNCE
        return THROTTLE if self.ttl is not None else SIMPLE

    def key_for(self, args: list[Any], kwargs: dict[str, Any]) -> str:
        """The key of a job with these arguments (as stored): ``key``, or what the callable returns."""
        if not callable(self.key):
            return self.key
        name = getattr(self.key, "__qualname__", repr(self.key))
        return check_key(self.key(args, kwargs), f"The key {name} returned", returned_by=name)


__all__ = ["DEBOUNCE", "KEEP_LAST", "MAX_KEY_LENGTH", "SIMPLE", "THROTTLE", "Dedup", "check_key"]

"""Sending Django's task signals as ``Signal.send_robust`` does (the worker's ``task_started``
and ``task_finished``, twice per job; ``enqueue()``'s ``task_enqueued``), but without looking
the receivers up each time: that look-up (the signal's lock, its dead-receiver sweep, a key per
sender, a list of weak references resolved) cost more than Django's own logging receiver it
then calls.

A :class:`TaskSignal` keeps, per sender, the signal's entries that concern it, and looks again
only when the signal's receivers change (a connect, a disconnect, a weakly-referenced receiver
collected). Weak references stay weak: each is resolved at the call, as Django does, so a
receiver that was collected is skipped and its owner is not kept alive by this cache. A signal
with an async receiver, or a Django whose receiver entries differ, goes through
``send_robust`` itself.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from typing import Any

from django.dispatch import Signal
from django.tasks.signals import task_enqueued

_WEAK = weakref.ReferenceType


class TaskSignal:
    """``send`` is ``signal.send_robust(sender=..., task_result=...)`` with failures logged."""

    __slots__ = ("_cache", "logger", "signal")

    def __init__(self, signal: Signal, logger_name: str = "django_jobs.worker"):
        self.signal = signal
        #: Where a receiver's failure is logged (besides Django's ``django.dispatch``).
        self.logger = logging.getLogger(logger_name)
        #: ``signal.receivers`` as last seen (a copy), and per sender its (receiver, sender_ref)
        #: entries, or None: send through send_robust. One tuple, replaced whole, so threads
        #: sending at once never mix a new receivers list with entries made from an old one.
        self._cache: tuple[list[Any] | None, dict[Any, list[tuple[Any, Any]] | None]] = (None, {})

    def send(self, sender: Any, task_result: Any) -> None:
        """Call each receiver of ``sender`` with ``task_result``; one that raises is logged (by
        Django's dispatcher logger, as send_robust does, and ours) and the others still run."""
        entries = self._for(sender)
        if entries is None:
            for receiver, response in self.signal.send_robust(sender=sender, task_result=task_result):
                if isinstance(response, Exception):
                    self.logger.error(
                        "Signal receiver %r raised for job %s", receiver, task_result.id, exc_info=response
                    )
            return
        for receiver in _resolved(entries):
            try:
                receiver(signal=self.signal, sender=sender, task_result=task_result)
            except Exception as err:  # noqa: BLE001 - as send_robust: logged, the others still run
                self.failed(receiver, task_result, err)

    def live(self, sender: Any) -> list[Any] | None:
        """The receivers :meth:`send` calls for ``sender`` now, in order, weak references
        resolved (a collected one left out); None when it goes through ``send_robust`` (an async
        receiver, a sweep pending, Django's entries not the ones this knows). A caller sending
        many results at once may look them up once and call them itself."""
        entries = self._for(sender)
        return None if entries is None else list(_resolved(entries))

    def failed(self, receiver: Any, task_result: Any, err: Exception) -> None:
        """Log ``receiver``'s exception for ``task_result``'s job as send_robust would (Django's
        ``django.dispatch`` logger), and on :attr:`logger` with the job's id."""
        log_robust = getattr(self.signal, "_log_robust_failure", None)
        if log_robust is not None:
            log_robust(receiver, err)
        self.logger.error("Signal receiver %r raised for job %s", receiver, task_result.id, exc_info=err)

    def _for(self, sender: Any) -> list[tuple[Any, Any]] | None:
        signal = self.signal
        if getattr(signal, "_dead_receivers", True):
            return None  # a collected receiver awaits Django's sweep, which send_robust makes
        receivers = signal.receivers
        seen, entries = self._cache
        if seen != receivers:  # connected or disconnected since: look again
            seen, entries = list(receivers), {}
            self._cache = (seen, entries)
        try:
            return entries[sender]
        except KeyError:
            pass
        # Made from ``seen``, stored in the dict that goes with it: when another thread has
        # replaced the cache meanwhile, this lands in the old dict, which nothing reads again.
        found = entries[sender] = _entries_of(seen, sender)
        return found


def _resolved(entries: list[tuple[Any, Any]]) -> Iterator[Any]:
    """The receivers of ``entries`` (see :meth:`TaskSignal._for`), weak references resolved and
    those whose receiver or sender was collected left out."""
    for receiver, sender_ref in entries:
        if isinstance(receiver, _WEAK):  # weakref.ref or WeakMethod
            receiver = receiver()
            if receiver is None:
                continue
        if sender_ref is not None and sender_ref() is None:
            continue
        yield receiver


def _entries_of(receivers: list[Any], sender: Any) -> list[tuple[Any, Any]] | None:
    """The (receiver, sender_ref) entries of ``receivers`` (a signal's list) that ``sender``
    reaches, in order; None when one is async or the entries are not Django 5's
    ``((receiver_key, sender_key), receiver, sender_ref, is_async)``."""
    from django.dispatch.dispatcher import NONE_ID, _make_id  # Django's own keys for "any sender" and a sender

    key = _make_id(sender)
    out = []
    for entry in receivers:
        if not isinstance(entry, tuple) or len(entry) != 4:
            return None
        (_, sender_key), receiver, sender_ref, is_async = entry
        if sender_key != NONE_ID and sender_key != key:
            continue
        if is_async:
            return None
        out.append((receiver, sender_ref))
    return out


#: ``task_enqueued`` as ``enqueue()``, ``enqueue_many()`` and flows send it, failures logged on
#: ``django_jobs.backend``.
ENQUEUED = TaskSignal(task_enqueued, "django_jobs.backend")

__all__ = ["ENQUEUED", "TaskSignal"]

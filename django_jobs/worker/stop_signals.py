"""SIGTERM and SIGINT for the worker (``runworker``) and the supervisor (``runworker -p``).

A Python signal handler runs in the main thread between two bytecodes of whatever that thread
was doing, and a second signal can interrupt the handler the same way. So the handlers of
django-jobs only read and store plain attributes, write to a pipe, and call ``os.kill`` or
``os._exit``:

* no logging: it takes locks and writes to a stream the interrupted code may be writing to;
* no ``threading.Event.set()``: the event's lock may be held by the very code the handler
  interrupted (the worker's main thread clears and waits on its events all the time), and the
  handler would wait for it forever;
* state that a nested handler reads changes in one store of an immutable value, so the nested
  handler sees it before or after the change, never half made.

What needs more (logging, stopping the worker's threads) runs on a thread the handler wakes
through a pipe (:func:`signal_relay`).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_jobs.worker")

#: The signals that stop a worker or the supervisor.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: A signal within this many seconds of a stop request's first signal is that request arriving
#: again, not a new one: ``timeout`` sends its signal to the process and then to its process
#: group, and a terminal's Ctrl-C reaches the supervisor, which passes it on, and each worker.
REPEAT_WINDOW = 1.0

Handler = Callable[[int, Any], None]


class StopRequests:
    """Numbers the stop requests that signals make. :meth:`count` is called by the handler."""

    def __init__(self) -> None:
        # (number of the latest request, monotonic time of its first signal), replaced in one
        # store: a handler that interrupts another sees the old pair or the new one.
        self._latest: tuple[int, float] | None = None

    def count(self, now: float | None = None) -> int:
        """Count one signal (received at monotonic time ``now``, default now): return the
        number of the request it starts (1, 2, ...), or 0 when it repeats the latest request
        (it came within ``REPEAT_WINDOW`` of that request's first signal).

        Two signals whose handlers interrupt each other may both start request 1 (both saw no
        request yet): callers make acting on a request twice harmless."""
        if now is None:
            now = time.monotonic()
        latest = self._latest
        if latest is not None and now - latest[1] <= REPEAT_WINDOW:
            return 0
        number = latest[0] + 1 if latest is not None else 1
        self._latest = (number, now)
        return number

    @property
    def requests(self) -> int:
        """How many stop requests signals made so far."""
        latest = self._latest
        return latest[0] if latest is not None else 0


class SignalRelay:
    """Carries signal numbers from a handler to a thread, which may log and take locks.

    The handler calls :meth:`send`, which writes the number to a pipe (no lock, never blocks);
    the ``jobs-signals`` thread reads it and calls ``receiver(signum)``."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.receiver: Callable[[int], None] | None = None
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        threading.Thread(target=self._run, name="jobs-signals", daemon=True).start()

    def send(self, signum: int) -> None:
        """Hand ``signum`` to the thread (from a signal handler)."""
        try:
            os.write(self._write, bytes((signum,)))
        except BlockingIOError:  # full: the thread has yet to read earlier signals, which suffice
            pass

    def close_inherited(self) -> None:
        """Close the pipe of a relay a forked process inherited (its thread stayed behind)."""
        os.close(self._read)
        os.close(self._write)

    def _run(self) -> None:
        while True:
            for signum in os.read(self._read, 64):
                receiver = self.receiver
                if receiver is None:
                    continue
                try:
                    receiver(signum)
                except Exception:  # noqa: BLE001 - the next signal must still get through
                    logger.exception("Handling signal %d failed.", signum)


_relay: SignalRelay | None = None
#: The handlers install_stop_handler() made current, by signal number.
_installed: dict[int, Handler] = {}


def signal_relay(receiver: Callable[[int], None]) -> SignalRelay:
    """The process's relay (started at the first call), now calling ``receiver``. Main thread."""
    global _relay
    if _relay is not None and _relay.pid != os.getpid():
        _relay.close_inherited()
        _relay = None
    if _relay is None:
        _relay = SignalRelay()
    _relay.receiver = receiver
    return _relay


def install_stop_handler(handler: Handler) -> None:
    """Make ``handler`` the SIGTERM and SIGINT handler (main thread only) and unblock both
    (a worker forked by the supervisor starts with them blocked, see :mod:`.supervisor`).

    When the process exits (at ``atexit`` time, after non-daemon threads were joined), both
    signals are ignored if ``handler`` is still installed. Python restores their default
    action, death by the signal, late in its shutdown; a repeat of the stop request arriving
    then, after the worker wrote its summary, would turn a clean exit 0 into a death by SIGTERM.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
        _installed[signum] = handler
    if hasattr(signal, "pthread_sigmask"):  # not on Windows
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    atexit.unregister(_ignore_stop_signals)  # registered once, however many workers ran
    atexit.register(_ignore_stop_signals)


def _ignore_stop_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal() works in the main thread only
    for signum, handler in _installed.items():
        if signal.getsignal(signum) is handler:
            signal.signal(signum, signal.SIG_IGN)

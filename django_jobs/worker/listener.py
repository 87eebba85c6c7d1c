"""PostgreSQL LISTEN on a dedicated connection: wakes the producer when jobs arrive.

Notifications are an optimisation; polling stays the correctness path, so a lost notification
or a dropped listener connection only costs latency.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import uuid
from collections.abc import Callable

from django.db import connections

from ..engine import CANCEL_PREFIX

logger = logging.getLogger("django_jobs.worker")

CHANNEL_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}\Z")


class Listener(threading.Thread):
    def __init__(
        self,
        *,
        using: str,
        channel: str,
        queues: list[str] | None,
        wake: threading.Event,
        stopping: threading.Event,
        on_cancel: Callable[[uuid.UUID], None] | None = None,
    ):
        super().__init__(name="jobs-listener", daemon=True)
        if not CHANNEL_RE.match(channel):
            raise ValueError(f"NOTIFY_CHANNEL must be a lower-case SQL identifier; got {channel!r}.")
        self.using = using
        self.channel = channel
        self.queues = set(queues) if queues else None
        self.wake = wake
        self.stopping = stopping
        self.on_cancel = on_cancel
        self.connected = threading.Event()

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            wrapper = connections.create_connection(self.using)
            try:
                wrapper.ensure_connection()
                raw = wrapper.connection
                raw.autocommit = True
                raw.execute(f"LISTEN {self.channel}")
                self.connected.set()
                failures = 0
                self.wake.set()  # we may have missed notifications while (re)connecting
                while not self.stopping.is_set():
                    # A short timeout so that stop() is noticed quickly.
                    for note in raw.notifies(timeout=0.2):
                        if note.payload.startswith(CANCEL_PREFIX):
                            self._cancelled(note.payload)
                        elif self.queues is None or note.payload in self.queues:
                            # A waker that tells notifications apart (bus mode's) is told which.
                            set_for = getattr(self.wake, "set_for", None)
                            if set_for is not None:
                                set_for(note.payload)
                            else:
                                self.wake.set()
                        if self.stopping.is_set():
                            break
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect after a pause
                self.connected.clear()
                failures += 1
                logger.warning("LISTEN connection lost (%s); polling until it is back.", exc)
                self.stopping.wait(min(5.0, 0.1 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0))
            finally:
                self.connected.clear()
                try:
                    wrapper.close()
                except Exception:  # noqa: BLE001
                    pass

    def _cancelled(self, payload: str) -> None:
        if self.on_cancel is None:
            return
        try:
            job_id = uuid.UUID(payload[len(CANCEL_PREFIX) :])
        except ValueError:
            logger.warning("Ignoring a malformed cancel notification %r.", payload)
            return
        self.on_cancel(job_id)

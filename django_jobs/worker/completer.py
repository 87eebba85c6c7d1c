"""Writes attempt outcomes in batches: one statement for everything that finished meanwhile.

An outcome that its attempt's own transaction wrote already (an ``atomic=True`` job, see
:mod:`.atomic`; ``Outcome.written_as`` set) is not written again: it only goes through what
follows a write (``on_written``), on this thread, like the others.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections

from .. import engine
from ..db import is_transient
from ..states import JobState

logger = logging.getLogger("django_jobs.worker")

MAX_BATCH = 500
#: Outcomes of short jobs arrive in bursts. After the first one the completer waits up to
#: LINGER seconds (or until FLUSH_AT are pending) so that one statement, one round trip and one
#: commit, carries many outcomes; each statement costs about a millisecond either way.
LINGER = 0.003
FLUSH_AT = 100


class OutcomeWindow:
    """How long finished jobs stay ``active`` in the database because their outcome is still on
    its way: the most outcomes pending at once (submitted, not yet committed) and the delay from
    a job's end (its submit) to its outcome's commit. A worker that dies inside this window runs
    those jobs again. The delays of the last SAMPLES outcomes are kept."""

    SAMPLES = 100_000

    def __init__(self) -> None:
        self.most_pending = 0
        self.delays_ms: deque[float] = deque(maxlen=self.SAMPLES)

    def summary(self) -> str:
        if not self.delays_ms:
            return "no outcome written"
        ordered = sorted(self.delays_ms)
        p50, p99 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.99))
        return (
            f"finished jobs were active until their outcome committed for {p50:.1f} ms (median), "
            f"{p99:.1f} ms (p99), {ordered[-1]:.1f} ms at most; at most {self.most_pending} at once"
        )


class Completer(threading.Thread):
    def __init__(
        self,
        *,
        using: str,
        stopping: threading.Event,
        on_written: Callable[[list[engine.Outcome], dict[Any, str]], None],
    ):
        super().__init__(name="jobs-completer", daemon=True)
        self.using = using
        self._stopping = stopping
        self._on_written = on_written
        # submit() holds the lock directly (a Condition's `with` is two Python calls around it).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._pending: list[engine.Outcome] = []
        self._written: list[engine.Outcome] = []  # written by their own transaction (atomic jobs)
        self._submitted: list[float] = []  # monotonic submit time of each pending outcome
        self._writing = 0
        self.window = OutcomeWindow()
        self._closed = False
        self._abandon = False

    def submit(self, outcome: engine.Outcome) -> None:
        if outcome.written_as is not None:
            self._submit_written(outcome)
            return
        with self._lock:
            if self._closed:
                logger.warning(
                    "Outcome of job %s arrived after shutdown; dropped (its lease was released).", outcome.job_id
                )
                return
            self._pending.append(outcome)
            self._submitted.append(time.monotonic())
            self.window.most_pending = max(self.window.most_pending, len(self._pending) + self._writing)
            # Wake the completer only when it can act: it waits for a first outcome, or lingers
            # until FLUSH_AT (each wake-up is a thread switch, as costly as a short job).
            if len(self._pending) == 1 or len(self._pending) == FLUSH_AT:
                self._cond.notify_all()

    def _submit_written(self, outcome: engine.Outcome) -> None:
        """Queue an outcome its own transaction wrote for what follows a write (after shutdown:
        run that here and now, the job being stored whatever the shutdown does)."""
        with self._cond:
            if not self._closed:
                self._written.append(outcome)
                self._cond.notify_all()
                return
        self._hand_on([outcome])

    def _hand_on(self, outcomes: list[engine.Outcome]) -> None:
        """``on_written`` for outcomes written by their own transaction (none of them here
        if the guard refused it)."""
        try:
            self._on_written(outcomes, {o.job_id: o.written_as for o in outcomes if o.written_as})
        except Exception:  # noqa: BLE001 - a bug there must not stop the writing of outcomes
            logger.exception("Handling %d outcome(s) written by their jobs failed.", len(outcomes))

    def pending(self) -> int:
        with self._cond:
            return len(self._pending) + self._writing

    def wait_below(self, limit: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until fewer than ``limit`` outcomes are pending (or the
        completer is closed); True when they are."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._pending) + self._writing >= limit and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self, timeout: float) -> None:
        """Write everything submitted so far (up to ``timeout`` seconds), then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.join(timeout)
        if self.is_alive():
            self._abandon = True
            logger.error(
                "Could not write %d outcome(s) before shutdown; those jobs' leases will expire and "
                "they will run again.",
                self.pending(),
            )

    def _write_each(self, batch: list[engine.Outcome]) -> dict[Any, str]:
        written: dict[Any, str] = {}
        for outcome in batch:
            try:
                written |= engine.record_outcomes([outcome], using=self.using)
                continue
            except DatabaseError as exc:
                if is_transient(exc):
                    raise  # retried by the caller, batch and all
                error = exc
            # The database refused this outcome: record that as the attempt's failure instead.
            failed = engine.Outcome(
                job_id=outcome.job_id,
                lease_token=outcome.lease_token,
                queue=outcome.queue,
                attempt=outcome.attempt,
                has_parent=outcome.has_parent,
                retention=outcome.retention,
                state=JobState.FAILED,
                error={
                    "exception_class_path": "django_jobs.exceptions.OutcomeNotStored",
                    "traceback": f"django_jobs.exceptions.OutcomeNotStored: the database refused the job's "
                    f"outcome ({outcome.state}): {type(error).__name__}: {error}\n",
                },
            )
            try:
                written |= engine.record_outcomes([failed], using=self.using)
                # What was stored, for the signals sent about this outcome.
                outcome.state, outcome.error, outcome.finished_at = failed.state, failed.error, failed.finished_at
                outcome.return_value_json = None
            except DatabaseError as exc:
                if is_transient(exc):
                    raise
                logger.exception(
                    "Could not record job %s at all; its lease will expire and it runs again.", outcome.job_id
                )
        return written

    def run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._pending and not self._written and not self._closed:
                    self._cond.wait()
                written_ahead: list[engine.Outcome] | None = None
                if self._written:
                    written_ahead, self._written = self._written, []
                batch: list[engine.Outcome] | None = None
                if self._pending:
                    linger_until = time.monotonic() + LINGER
                    while len(self._pending) < FLUSH_AT and not self._closed:
                        remaining = linger_until - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                    batch = self._pending[:MAX_BATCH]
                    submitted = self._submitted[:MAX_BATCH]
                    del self._pending[:MAX_BATCH]
                    del self._submitted[:MAX_BATCH]
                    self._writing = len(batch)
            if written_ahead:
                self._hand_on(written_ahead)
            if batch is None:
                if written_ahead:
                    continue
                break  # closed, and everything submitted is written
            while True:
                try:
                    try:
                        written = engine.record_outcomes(batch, using=self.using)
                    except DatabaseError as exc:
                        if is_transient(exc):
                            raise
                        # One bad row (say, a value the database refuses) must not block the rest.
                        logger.error("Writing %d outcome(s) failed (%s); writing them one by one.", len(batch), exc)
                        written = self._write_each(batch)
                    failures = 0
                    break
                except DatabaseError as exc:  # transient: the connection dropped or the database is busy
                    failures += 1
                    if self._abandon:
                        return
                    logger.warning("Writing %d outcome(s) failed (%s); retrying.", len(batch), exc)
                    try:
                        connections[self.using].close()
                    except Exception:  # noqa: BLE001
                        pass
                    threading.Event().wait(min(5.0, 0.05 * 2 ** min(failures, 8)) * random.uniform(0.5, 1.0))
            written_at = time.monotonic()
            with self._cond:
                self._writing = 0
                self.window.delays_ms.extend((written_at - t) * 1000 for t in submitted)
                self._cond.notify_all()
            try:
                self._on_written(batch, written)
            except Exception:  # noqa: BLE001 - a bug there must not stop the writing of outcomes
                logger.exception("Handling %d written outcome(s) failed.", len(batch))
        try:
            connections[self.using].close()
        except Exception:  # noqa: BLE001
            pass

"""The maintainer: the worker's leases, its ``Worker`` row, leadership and the services.

Its thread ticks every 0.1 s. Every ``LEASE_SECONDS / 3`` it extends the leases the worker
holds and moves the heartbeat (registering again if the reaper took the worker for dead); it
takes or renews the leadership of its backend alias (a lease row on the database's clock,
``engine.take_leadership``; a draining worker gives it up); it runs the services when due (the
rescuer, reaper and sweepers only on the leader); and it polls for cancels of running jobs when
no NOTIFY brings them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from .. import engine
from ..conf import JobsSettings
from ..db import is_transient
from ..exceptions import WorkerCrashed
from ..queues import sync_queues
from ..schedules import declared_schedules, sync_schedules
from ..services import DedupSweeper, PartitionSweeper, Promoter, Pruner, Reaper, Rescuer, Scheduler, TopicRecorder
from .holdings import Leases
from .trouble import close_connection, crashed, db_trouble

logger = logging.getLogger("django_jobs.worker")

#: How often a worker asks the database for cancels of its running jobs when no NOTIFY tells it
#: (SQLite, or PostgreSQL while the listener reconnects).
CANCEL_POLL_INTERVAL = 0.5


class Maintainer:
    """Maintains the worker until ``done`` is set, which the worker does only after the grace
    period: leases must keep being renewed while jobs finish. Renews ``leases``; calls
    ``poll_cancels`` every CANCEL_POLL_INTERVAL, or less often while ``listening()`` (a live
    LISTEN brings cancels). Sets ``wake`` when a service made jobs waiting. A database error a
    retry cannot fix is handed to ``on_crash``."""

    def __init__(
        self,
        *,
        using: str,
        backend: str,
        settings: JobsSettings,
        worker_id: str,
        queues: list[str] | None,
        concurrency: int,
        leases: Leases,
        stopping: threading.Event,
        wake: threading.Event,
        done: threading.Event,
        poll_cancels: Callable[[], None],
        listening: Callable[[], bool],
        on_crash: Callable[[WorkerCrashed], None],
    ):
        self.using = using
        self.backend = backend
        self.settings = settings
        self.worker_id = worker_id
        self.queues = queues
        self.concurrency = concurrency
        self._leases = leases
        self._stopping = stopping
        self._wake = wake
        self._done = done
        self._poll_cancels = poll_cancels
        self._listening = listening
        self._on_crash = on_crash

    def register(self) -> None:
        """Insert or refresh this worker's ``Worker`` row."""
        engine.register_worker(
            using=self.using,
            worker_id=self.worker_id,
            backend=self.backend,
            queues=self.queues,
            concurrency=self.concurrency,
            pid=os.getpid(),
        )

    def sync_schedules(self) -> None:
        """Apply the declared QUEUES and SCHEDULES (at start-up)."""
        # Always, even with no QUEUES: a queue removed from it gets its declared limits back to none.
        changed = sync_queues(using=self.using, declared=self.settings.QUEUES)
        if changed:
            logger.info("Worker %s applied DJANGO_JOBS['QUEUES'] to %d queue(s).", self.worker_id, changed)
        if declared_schedules(self.backend):
            counts = sync_schedules(self.backend)
            if any(counts.values()):
                logger.info(
                    "Worker %s synced the declared schedules: %s.",
                    self.worker_id,
                    ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in counts.items() if n),
                )

    def run(self) -> None:
        """The maintainer thread."""
        s = self.settings
        renew_every = s.LEASE_SECONDS / 3
        next_renew = time.monotonic() + renew_every
        common: dict[str, Any] = {
            "using": self.using,
            "settings": s,
            "worker_id": self.worker_id,
            "backend": self.backend,
        }
        services = [
            Promoter(**common, interval=s.PROMOTE_INTERVAL),
            Rescuer(**common, interval=s.RESCUE_INTERVAL),
            Reaper(**common, interval=max(s.RESCUE_INTERVAL, s.LEASE_SECONDS)),
            DedupSweeper(**common, interval=s.PROMOTE_INTERVAL),
            PartitionSweeper(**common, interval=s.PROMOTE_INTERVAL),
            Scheduler(**common, interval=s.PROMOTE_INTERVAL),
            TopicRecorder(**common, interval=s.PROMOTE_INTERVAL),
            Pruner(**common, interval=s.PRUNE_INTERVAL),
        ]
        is_leader = False
        leader_until = 0.0  # monotonic end of the leadership taken at the last check
        next_leader_check = 0.0
        next_cancel_poll = 0.0
        failures = 0
        while not self._done.wait(0.1):
            try:
                now = time.monotonic()
                if now >= next_cancel_poll:
                    self._poll_cancels()
                    listening = self._listening()
                    # With a live LISTEN, NOTIFY brings cancels; the poll is then only a safety net.
                    next_cancel_poll = now + (renew_every if listening else CANCEL_POLL_INTERVAL)
                if now >= next_renew:
                    engine.renew_leases(
                        using=self.using, lease_tokens=self._leases.tokens(), lease_seconds=s.LEASE_SECONDS
                    )
                    if not engine.heartbeat_worker(using=self.using, worker_id=self.worker_id):
                        self.register()  # the reaper took us for dead; come back
                    next_renew = now + renew_every
                if now >= next_leader_check:
                    if self._stopping.is_set():  # draining: let a worker that goes on lead
                        if is_leader:
                            self._resign()
                        is_leader = False
                    else:
                        is_leader = engine.take_leadership(
                            using=self.using, backend=self.backend, worker_id=self.worker_id, seconds=s.LEASE_SECONDS
                        )
                        leader_until = now + s.LEASE_SECONDS  # `now` was read before the lease was taken
                    next_leader_check = now + min(s.RESCUE_INTERVAL, renew_every)
                # A leadership this worker could not renew in time (the database was away) has
                # expired: another worker may lead by now.
                is_leader = is_leader and now < leader_until
                for service in services:
                    if self._stopping.is_set():  # draining: keep renewing leases, start no new work
                        break
                    counts = service.tick(is_leader=is_leader)
                    if counts and counts.get("promoted") or (counts and counts.get("requeued")):
                        self._wake.set()
                failures = 0
            except DatabaseError as exc:
                if not is_transient(exc):
                    # Without lease renewals our jobs would be rescued under us: stop the worker.
                    crash = crashed("maintenance", exc)
                    logger.error("Worker %s: %s", self.worker_id, crash)
                    self._on_crash(crash)
                    break
                failures += 1
                db_trouble(
                    "maintenance", exc, failures, worker_id=self.worker_id, using=self.using, stopping=self._stopping
                )
            except Exception:  # noqa: BLE001 - a bug or a receiver's error must not stop lease renewal
                failures += 1
                logger.exception("Worker %s: maintenance step failed; retrying.", self.worker_id)
                self._stopping.wait(min(5.0, 0.05 * 2 ** min(failures, 6)))
        if is_leader:
            self._resign()
        close_connection(self.using)

    def _resign(self) -> None:
        try:
            engine.resign_leadership(using=self.using, backend=self.backend, worker_id=self.worker_id)
        except DatabaseError:
            pass  # the lease expires by itself within LEASE_SECONDS

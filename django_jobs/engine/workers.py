"""The worker table: register, heartbeat, unregister, remove the dead, and the leader."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta

from django.utils import timezone

from ..models import Worker


def register_worker(
    *, using: str, worker_id: str, backend: str, queues: list[str] | None, concurrency: int, pid: int
) -> None:
    now = timezone.now()
    Worker.objects.using(using).update_or_create(
        id=worker_id,
        defaults={
            "backend": backend,
            "hostname": socket.gethostname()[:255],
            "pid": pid,
            "queues": queues or ["*"],
            "concurrency": concurrency,
            "started_at": now,
            "heartbeat_at": now,
        },
    )


def heartbeat_worker(*, using: str, worker_id: str, now: datetime | None = None) -> bool:
    """Record that the worker is alive; False when its row was removed (it looked dead)."""
    return Worker.objects.using(using).filter(id=worker_id).update(heartbeat_at=now or timezone.now()) == 1


def unregister_worker(*, using: str, worker_id: str) -> None:
    Worker.objects.using(using).filter(id=worker_id).delete()


def remove_dead_workers(
    *, using: str, older_than: timedelta, backend: str | None = None, now: datetime | None = None
) -> int:
    cutoff = (now or timezone.now()) - older_than
    qs = Worker.objects.using(using).filter(heartbeat_at__lt=cutoff)
    if backend is not None:
        qs = qs.filter(backend=backend)
    deleted, _ = qs.delete()
    return deleted


def leader_id(*, using: str, backend: str, alive_within: timedelta, now: datetime | None = None) -> str | None:
    """The oldest live worker of ``backend`` leads the leader-only services."""
    cutoff = (now or timezone.now()) - alive_within
    return (
        Worker.objects.using(using)
        .filter(backend=backend, heartbeat_at__gte=cutoff)
        .order_by("started_at", "id")
        .values_list("id", flat=True)
        .first()
    )

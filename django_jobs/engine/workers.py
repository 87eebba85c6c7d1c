"""The worker table (register, heartbeat, unregister, remove the dead) and leadership: a lease
row per backend alias (``leader:<backend>`` in django_jobs_lease) on the database's clock."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.utils import timezone

from ..models import Lease, Worker


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


def _leader_lease(backend: str) -> str:
    return f"leader:{backend}"


def take_leadership(*, using: str, backend: str, worker_id: str, seconds: float) -> bool:
    """Take or renew the leadership of ``backend`` for ``seconds`` of the database's clock: True
    when this worker holds it now (it held it, or it was free or had expired). Several hosts
    agree on who leads whatever their own clocks say."""
    name = _leader_lease(backend)
    # Free: never taken or given up (no expiry), or expired.
    free = Q(holder=worker_id) | Q(expires_at__isnull=True) | Q(expires_at__lt=Now())
    until = ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())
    leases = Lease.objects.using(using)
    if leases.filter(free, name=name).update(holder=worker_id, expires_at=until):
        return True
    if leases.filter(name=name).exists():
        return False  # another live worker leads
    try:
        with transaction.atomic(using=using):
            Lease.objects.using(using).create(name=name)
    except IntegrityError:
        pass  # another worker created it first
    return bool(leases.filter(free, name=name).update(holder=worker_id, expires_at=until))


def resign_leadership(*, using: str, backend: str, worker_id: str) -> None:
    """Give the leadership up (a worker that stops), so the next worker takes it at its next
    check instead of after the lease expires."""
    Lease.objects.using(using).filter(name=_leader_lease(backend), holder=worker_id).update(holder="", expires_at=None)


def leader_id(*, using: str, backend: str) -> str | None:
    """The worker that leads ``backend``'s leader-only services now (None when nobody does)."""
    return (
        Lease.objects.using(using)
        .filter(name=_leader_lease(backend), expires_at__gt=Now())
        .values_list("holder", flat=True)
        .first()
    )

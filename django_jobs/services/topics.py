from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from ..engine.topic_metrics import record_topic_totals
from .base import Service


class TopicRecorder(Service):
    """Records bus mode's running totals once a minute (``engine.topic_metrics``): each topic's
    messages published, each group's acknowledged, dead-lettered and expired. Throughput is the
    difference of two snapshots, so the consume path counts on its own cursor rows and nothing
    is written per message here.

    Leader only; ticks every ``PROMOTE_INTERVAL`` and writes at its first tick of each minute
    (of the database's clock), so a snapshot is read within about a second of its minute's
    start; between two minutes a tick asks nothing of the database. Two writers of a minute
    (the leaders of two backend aliases on one database, a leadership handed over) write it
    once: a unique constraint keeps one row per series and minute.

    Counts: ``snapshots``: rows offered (0 but once a minute).
    """

    name = "topic_recorder"
    leader_only = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: Monotonic time of the next minute's start (by the database's clock at the last write).
        self._next_minute = 0.0

    def run_once(self, now: datetime | None = None) -> dict[str, int]:
        if now is None and time.monotonic() < self._next_minute:
            return {"snapshots": 0}
        snapshot = record_topic_totals(using=self.using, now=now)
        left = snapshot.minute + timedelta(minutes=1) - snapshot.taken_at
        self._next_minute = time.monotonic() + left.total_seconds()
        return {"snapshots": snapshot.rows}

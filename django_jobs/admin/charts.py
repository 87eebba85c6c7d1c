"""The throughput charts of the queue pages: completed and failed jobs per bucket, laid out as
stacked SVG bars for ``django_jobs/admin/queues/chart.html``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from ..console import Throughput

#: The chart's viewBox and the plot area inside it (room for the legend above, axes left/below).
WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 28, 24
X_LABELS = 6


@dataclass(frozen=True)
class Chart:
    """A throughput chart laid out for ``chart.html``: stacked bars (completed below, failed
    above) with their tooltip text, axis ticks and the summary the screen readers get."""

    key: str
    label: str
    bars: list[dict[str, Any]]
    y_ticks: list[dict[str, Any]]
    x_ticks: list[dict[str, Any]]
    completed: int
    failed: int
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM
    plot_height: int = HEIGHT - TOP - BOTTOM


def chart(data: Throughput, key: str, title: str) -> Chart:
    """Lay out ``data``'s buckets as bars scaled to a round maximum (1, 2, 3, 4, 5, 6 or 8 times a
    power of ten), with up to :data:`X_LABELS` time labels in the current time zone."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = max((b.completed + b.failed for b in data.buckets), default=0)
    top = _round_up(peak)
    slot = plot_w / max(len(data.buckets), 1)
    width = max(slot * 0.8, 1.0)
    with_date = data.minutes > 60
    bars = []
    for i, b in enumerate(data.buckets):
        done_h, fail_h = b.completed / top * plot_h, b.failed / top * plot_h
        base = TOP + plot_h
        x = LEFT + i * slot
        bars.append(
            {
                "slot_x": round(x, 2),
                "slot_w": round(slot, 2),
                "x": round(x + (slot - width) / 2, 2),
                "w": round(width, 2),
                "done_y": round(base - done_h, 2),
                "done_h": round(done_h, 2),
                "fail_y": round(base - done_h - fail_h, 2),
                "fail_h": round(fail_h, 2),
                "title": f"{_clock(b.start, with_date)}–{_clock(b.end, False)}: "
                f"{b.completed} completed, {b.failed} failed",
            }
        )
    ticks = [0, top // 2, top] if top % 2 == 0 else [0, top]
    y_ticks = [{"y": round(TOP + plot_h - t / top * plot_h, 2), "label": t} for t in ticks]
    step = max(len(data.buckets) // X_LABELS, 1)
    x_ticks = [
        {"x": round(LEFT + i * slot, 2), "label": _clock(data.buckets[i].start, False)}
        for i in range(0, len(data.buckets), step)
    ]
    return Chart(
        key=key,
        label=f"{title}: {data.completed} completed, {data.failed} failed",
        bars=bars,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        completed=data.completed,
        failed=data.failed,
    )


def _round_up(n: int) -> int:
    """The smallest of 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, ... that is >= ``n``."""
    scale = 1
    while True:
        for m in (1, 2, 3, 4, 5, 6, 8):
            if m * scale >= n:
                return m * scale
        scale *= 10


def _clock(moment: datetime, with_date: bool) -> str:
    local = timezone.localtime(moment)
    return local.strftime("%Y-%m-%d %H:%M" if with_date else "%H:%M")


__all__ = ["Chart", "chart"]

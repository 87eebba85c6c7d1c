"""The throughput charts of the queue and topic pages, laid out as stacked SVG bars for
``django_jobs/admin/queues/chart.html``: per bucket, a lower bar (completed jobs, messages
published or acknowledged: the ``done`` colour) and an upper one (failed jobs, messages
dead-lettered or expired: the ``fail`` colour; none on a published chart)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from ..console import Throughput
from ..console_topics import Flow

#: The chart's viewBox and the plot area inside it (room for the legend above, axes left/below).
WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 28, 24
X_LABELS = 6
#: The legend's entries, each this far right of the previous one.
LEGEND_STEP = 150


@dataclass(frozen=True)
class Chart:
    """A throughput chart laid out for ``chart.html``: stacked bars with their tooltip text,
    the legend (each series with its total), axis ticks and the summary the screen readers get."""

    key: str
    label: str
    bars: list[dict[str, Any]]
    y_ticks: list[dict[str, Any]]
    x_ticks: list[dict[str, Any]]
    legend: list[dict[str, Any]]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM
    plot_height: int = HEIGHT - TOP - BOTTOM


@dataclass(frozen=True)
class _Bucket:
    start: datetime
    end: datetime
    low: float
    high: float


def chart(data: Throughput, key: str, title: str) -> Chart:
    """Jobs completed (below) and failed (above) per bucket of ``data``."""
    buckets = [_Bucket(b.start, b.end, b.completed, b.failed) for b in data.buckets]
    return _chart(
        key,
        title,
        buckets,
        ("Completed", "Failed"),
        with_date=data.minutes > 60,
        tooltip=lambda b: f"{_number(b.low)} completed, {_number(b.high)} failed",
    )


def published_chart(flow: Flow, key: str, title: str) -> Chart:
    """A topic's messages published per minute of ``flow``."""
    buckets = [_Bucket(m.start, m.end, m.published, 0) for m in flow.minutes]
    return _chart(key, title, buckets, ("Published",), tooltip=lambda b: f"{_number(b.low)} published")


def consumed_chart(flow: Flow, key: str, title: str) -> Chart:
    """A group's messages per minute of ``flow``: acknowledged (below), dead-lettered or expired
    (above)."""
    buckets = [_Bucket(m.start, m.end, m.acked, m.dead_lettered + m.expired) for m in flow.minutes]
    return _chart(
        key,
        title,
        buckets,
        ("Acknowledged", "Dead-lettered or expired"),
        tooltip=lambda b: f"{_number(b.low)} acknowledged, {_number(b.high)} dead-lettered or expired",
    )


def _chart(
    key: str, title: str, buckets: list[_Bucket], series: tuple[str, ...], *, tooltip: Any, with_date: bool = False
) -> Chart:
    """Lay out ``buckets`` as bars scaled to a round maximum (1, 2, 3, 4, 5, 6 or 8 times a
    power of ten), with up to :data:`X_LABELS` time labels in the current time zone; ``series``
    names the lower bars and, if given, the upper ones."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = max((b.low + b.high for b in buckets), default=0)
    top = _round_up(peak)
    slot = plot_w / max(len(buckets), 1)
    width = max(slot * 0.8, 1.0)
    bars = []
    for i, b in enumerate(buckets):
        done_h, fail_h = b.low / top * plot_h, b.high / top * plot_h
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
                "title": f"{_clock(b.start, with_date)}–{_clock(b.end, False)}: {tooltip(b)}",
            }
        )
    ticks = [0, top // 2, top] if top % 2 == 0 else [0, top]
    y_ticks = [{"y": round(TOP + plot_h - t / top * plot_h, 2), "label": t} for t in ticks]
    step = max(len(buckets) // X_LABELS, 1)
    x_ticks = [
        {"x": round(LEFT + i * slot, 2), "label": _clock(buckets[i].start, False)} for i in range(0, len(buckets), step)
    ]
    totals = [sum(b.low for b in buckets), sum(b.high for b in buckets)][: len(series)]
    legend = [
        {
            "css": css,
            "x": LEFT + i * LEGEND_STEP,
            "text_x": LEFT + i * LEGEND_STEP + 14,
            "text": f"{name} ({_number(n)})",
        }
        for i, (css, name, n) in enumerate(zip(("done", "fail"), series, totals, strict=False))
    ]
    summary = ", ".join(f"{_number(n)} {name.lower()}" for name, n in zip(series, totals, strict=True))
    return Chart(key=key, label=f"{title}: {summary}", bars=bars, y_ticks=y_ticks, x_ticks=x_ticks, legend=legend)


def _number(n: float) -> str:
    """A count as a count (``3``); a fraction (a minute's share of a longer gap) to one decimal."""
    return str(int(n)) if float(n).is_integer() else f"{n:.1f}"


def _round_up(n: float) -> int:
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


__all__ = ["Chart", "chart", "consumed_chart", "published_chart"]

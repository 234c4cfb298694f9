"""The metric chart: an SVG polyline of one metric against the step, downsampled to at most
``MAX_POINTS`` points (min and max of each bucket, so spikes survive), optionally smoothed,
with a vertical marker wherever the world size changed, a restart happened, or a node joined
or left; and its legend.

A job's series only grow (``MetricSeries``: arrays of doubles), and the dashboard draws the
chart again whenever points arrive: each series' buckets are kept between draws and only the
new points are read (``Decimation``), so a redraw costs the same at 100k points as at 1k
(before: every draw read every point, 70 ms at 100k on one core, four times a second).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ...contract.job_state import Marker
from .theme import BG_PLOT, FG_DIM, FG_FAINT, GRID, LINE, MARKER_COLORS, MARKER_WORDS, esc

MAX_POINTS = 1000


def downsample(
    steps: Sequence[float], values: Sequence[float], max_points: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most ``max_points`` points: each bucket keeps its min and max, in step order."""
    pairs = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
    if len(pairs) <= max_points:
        return pairs
    buckets = max_points // 2
    size = len(pairs) / buckets
    out = []
    for b in range(buckets):
        chunk = pairs[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}, key=lambda p: p[0]))
    return out


class Decimation:
    """Min/max buckets of a growing series, kept up to date by reading only new points.

    Buckets hold ``size`` points each (a power of two); when there are more than
    ``max_points // 2`` buckets, neighbours merge and ``size`` doubles. So at most
    ``max_points`` points come out, each bucket's min and max among them (spikes survive),
    and each point of the series is read once however often the chart is drawn."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_buckets = max(1, max_points // 2)
        self.size = 1
        self.buckets: list[list[Any]] = []  # [lo (step, value), hi (step, value), points in it]
        self.read = 0  # how many points of the series are in the buckets

    def extend(self, steps: Sequence[float], values: Sequence[float]) -> None:
        n = min(len(steps), len(values))
        if n <= self.read:
            return
        new_steps, new_values = steps[self.read : n], values[self.read : n]
        self.read = n
        buckets, size = self.buckets, self.size
        for p in zip(new_steps, new_values):
            if not math.isfinite(p[1]):
                continue
            if buckets and buckets[-1][2] < size:
                b = buckets[-1]
                if p[1] < b[0][1]:
                    b[0] = p
                if p[1] > b[1][1]:
                    b[1] = p
                b[2] += 1
                continue
            buckets.append([p, p, 1])
            if len(buckets) > self.max_buckets:
                merged = []
                for i in range(0, len(buckets) - 1, 2):
                    a, b = buckets[i], buckets[i + 1]
                    merged.append(
                        [min(a[0], b[0], key=lambda q: q[1]), max(a[1], b[1], key=lambda q: q[1]), a[2] + b[2]]
                    )
                if len(buckets) % 2:
                    merged.append(buckets[-1])
                buckets[:] = merged
                self.size = size = size * 2

    def points(self) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        for lo, hi, _ in self.buckets:
            out.extend(sorted({lo, hi}, key=lambda p: p[0]))
        return out


# id(values) -> (values, steps, buckets)
_kept: dict[int, tuple[weakref.ref[Sequence[float]], weakref.ref[Sequence[float]], Decimation]] = {}
_kept_lock = threading.Lock()


def series_points(steps: Sequence[float], values: Sequence[float]) -> list[tuple[float, float]]:
    """``downsample`` for a series drawn again and again as it grows: the buckets of a
    series that can be weakly referenced (``MetricSeries``' arrays) are kept between calls,
    so a call reads only the points that arrived since the last one. A series that shrank or
    another object starts over; anything else is downsampled afresh."""
    if len(values) <= MAX_POINTS:
        return downsample(steps, values)
    try:
        ref_values, ref_steps = weakref.ref(values), weakref.ref(steps)
    except TypeError:
        return downsample(steps, values)  # a list: nothing to keep it by
    key = id(values)
    with _kept_lock:
        kept = _kept.get(key)
        if kept is None or kept[0]() is not values or kept[1]() is not steps or kept[2].read > len(values):
            kept = (ref_values, ref_steps, Decimation())
            _kept[key] = kept
            weakref.finalize(values, _kept.pop, key, None)
        decimation = kept[2]
        decimation.extend(steps, values)
        return decimation.points()


# Integer counters a training loop reports for its own bookkeeping (the quickstart's `gen`,
# `start`): shown in the history, not offered as a chart.
BOOKKEEPING = {"step", "epoch", "gen", "generation", "start", "rank", "world_size", "restart_count"}


def chart_metrics(names: Sequence[str]) -> list[str]:
    """The metrics worth a chart: the reported ones less the loop's bookkeeping counters."""
    shown = [n for n in names if n not in BOOKKEEPING]
    return sorted(shown) or sorted(names)


def fmt_number(v: float) -> str:
    """Tick labels a person reads: 0.003, 0.25, 12, 1k, 2.5k, 1.2M (never 1e+03)."""
    if v == 0:
        return "0"
    a = abs(v)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{v / scale:.3g}{suffix}"
    if a >= 0.001:
        return f"{v:.3g}"
    return f"{v:.0e}".replace("e-0", "e-")


_fmt = fmt_number


def _nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    ticks: list[float] = []
    t = first
    while t <= hi + 1e-12 and len(ticks) < 12:
        ticks.append(round(t, 12))
        t += step
    return ticks


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average (TensorBoard's smoothing), debiased so the start is not
    pulled towards zero; ``weight`` 0 returns the values."""
    if weight <= 0:
        return list(values)
    out, avg, n = [], 0.0, 0
    for v in values:
        n += 1
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**n))
    return out


def chart_svg(
    steps: Sequence[float],
    values: Sequence[float],
    markers: Sequence[Marker] = (),
    *,
    metric: str = "loss",
    width: int = 760,
    height: int = 220,
    last_report_t: float | None = None,
    log_scale: bool = False,
    smoothing: float = 0.0,
    empty: str | None = None,
) -> str:
    """An SVG line chart of ``metric`` by step, with event markers and a legend.

    It scales to its container's width (viewBox), so one layout fits 800 px. ``log_scale``
    applies when every value is positive; ``smoothing`` draws an EMA over a faint raw line.
    ``empty``: what it says with no point (default: waiting for the metric)."""
    pad_l, pad_r, pad_t, pad_b = 46, 12, 10, 24
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    points = series_points(steps, values)
    log = log_scale and bool(points) and all(p[1] > 0 for p in points)
    head = (
        f'<svg class="ne-chart" xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'viewBox="0 0 {width} {height}" preserveAspectRatio="xMinYMin meet" style="max-width:{width}px;display:block" '
        f'data-metric="{esc(metric)}" data-points="{len(points)}" data-total-points="{len(values)}" '
        f'data-scale="{"log" if log else "linear"}" data-smoothing="{smoothing:g}"'
        + (f' data-last-report-t="{last_report_t:.3f}"' if last_report_t else "")
        + ">"
    )
    parts = [head, f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" style="fill:{BG_PLOT};stroke:{GRID}"/>']
    if not points:
        parts.append(
            f'<text x="{pad_l + w / 2}" y="{pad_t + h / 2}" text-anchor="middle" font-size="12" '
            f'style="fill:{FG_FAINT}">{esc(empty or f"waiting for {metric}…")}</text></svg>'
        )
        return "".join(parts)
    ys = [math.log10(p[1]) if log else p[1] for p in points]
    shown = smooth(ys, smoothing) if smoothing > 0 else ys
    x_lo = min(p[0] for p in points)
    x_hi = max(p[0] for p in points)
    y_lo, y_hi = min(ys), max(ys)
    marker_steps = [m.step for m in markers if m.step is not None]
    if marker_steps:
        x_lo, x_hi = min(x_lo, min(marker_steps)), max(x_hi, max(marker_steps))
    if x_hi == x_lo:
        x_hi = x_lo + 1
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    span_y = y_hi - y_lo
    y_lo -= span_y * 0.05
    y_hi += span_y * 0.05

    def sx(x: float) -> float:
        return pad_l + (x - x_lo) / (x_hi - x_lo) * w

    def sy(y: float) -> float:
        return pad_t + h - (y - y_lo) / (y_hi - y_lo) * h

    if log:  # decades, and 2x/5x between them when the range is narrow
        ticks = [float(d) for d in range(math.ceil(y_lo), math.floor(y_hi) + 1)]
        if len(ticks) < 3:
            ticks = sorted(
                {math.log10(m * 10.0**d) for d in range(math.floor(y_lo), math.ceil(y_hi) + 1) for m in (1, 2, 5)}
            )
            ticks = [t for t in ticks if y_lo <= t <= y_hi]
        y_ticks = [(t, fmt_number(10**t)) for t in ticks]
    else:
        y_ticks = [(t, fmt_number(t)) for t in _nice_ticks(y_lo, y_hi)]
    for t, label in y_ticks:
        y = sy(t)
        parts.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y:.1f}" y2="{y:.1f}" style="stroke:{GRID}"/>')
        parts.append(
            f'<text class="ne-tick" x="{pad_l - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10" '
            f'style="fill:{FG_DIM}">{label}</text>'
        )
    for t in _nice_ticks(x_lo, x_hi, 6):
        parts.append(
            f'<text class="ne-tick" x="{sx(t):.1f}" y="{height - 8}" text-anchor="middle" font-size="10" '
            f'style="fill:{FG_DIM}">{fmt_number(t)}</text>'
        )
    for m in markers:
        if m.step is None:
            continue
        x = sx(m.step)
        color = MARKER_COLORS.get(m.kind, "#999")
        dash = "" if m.kind in ("world_size", "failure") else ' stroke-dasharray="3,3"'
        parts.append(
            f'<line class="ne-marker ne-marker-{m.kind}" data-step="{m.step}" x1="{x:.1f}" x2="{x:.1f}" y1="{pad_t}" '
            f'y2="{pad_t + h}" stroke="{color}" stroke-width="1.5"{dash}><title>step {m.step}: {esc(m.label)}</title></line>'
        )
    if smoothing > 0:
        raw = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for (s, _), v in zip(points, ys))
        parts.append(
            f'<polyline class="ne-raw" fill="none" stroke-width="1" points="{raw}" style="stroke:{LINE};opacity:0.25"/>'
        )
    coords = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for (s, _), v in zip(points, shown))
    last_s, last_v = points[-1]
    parts.append(
        f'<polyline class="ne-line" fill="none" stroke-width="1.6" points="{coords}" style="stroke:{LINE}">'
        f"<title>{esc(metric)} at step {fmt_number(last_s)}: {last_v:.5g}</title></polyline>"
    )
    parts.append(
        f'<circle cx="{sx(last_s):.1f}" cy="{sy(shown[-1]):.1f}" r="2.5" style="fill:{LINE}">'
        f"<title>step {fmt_number(last_s)}: {last_v:.5g}</title></circle></svg>"
    )
    return "".join(parts)


# The chart scales to its box (viewBox), its text with it: at 450 px a 10-unit tick label was 5.6 px.
# Its box is a size container, and where it is narrow the ticks are drawn larger in the chart's units
# so they stay about 9 to 10 px on the screen (#30 item 4).
CHART_BOX_STYLE = (
    "<style>"
    "@container ne-chart (max-width: 640px) { svg.ne-chart .ne-tick { font-size: 13px; } }"
    "@container ne-chart (max-width: 500px) { svg.ne-chart .ne-tick { font-size: 16px; } }"
    "@container ne-chart (max-width: 380px) { svg.ne-chart .ne-tick { font-size: 20px; } }"
    "</style>"
)


def chart_box(svg: str) -> str:
    """The chart in a box whose width its tick labels follow (CHART_BOX_STYLE)."""
    return f'<div class="ne-chart-box" style="container:ne-chart / inline-size">{CHART_BOX_STYLE}{svg}</div>'


def legend_html(markers: Sequence[Marker], metric: str = "loss", smoothing: float = 0.0) -> str:
    """What the chart's lines mean: the metric, and each kind of marker it shows."""
    line = f"{esc(metric)}" + (f" (smoothed {smoothing:g})" if smoothing > 0 else "")
    items = [
        f'<span class="ne-legend-item"><span style="display:inline-block;width:14px;border-top:2px solid {LINE};vertical-align:middle"></span> {line}</span>'
    ]
    seen = []
    for m in markers:
        if m.step is not None and m.kind not in seen:
            seen.append(m.kind)
    for kind in seen:
        style = "solid" if kind in ("world_size", "failure") else "dashed"
        items.append(
            f'<span class="ne-legend-item" data-kind="{esc(kind)}"><span style="display:inline-block;height:11px;'
            f'border-left:2px {style} {MARKER_COLORS.get(kind, "#999")};vertical-align:middle"></span> '
            f"{esc(MARKER_WORDS.get(kind, kind))}</span>"
        )
    return (
        f'<div class="ne-legend" style="font-size:11px;color:{FG_DIM};display:flex;flex-wrap:wrap;gap:4px 14px">'
        f"{''.join(items)}</div>"
    )

"""Pure renderers: job state in, HTML/SVG text out. No widgets, no I/O, testable directly.

The chart is an SVG polyline of one metric against the step, downsampled to at most
``MAX_POINTS`` points (min and max of each bucket, so spikes survive), with a vertical
marker wherever the world size changed, a restart happened, or a node joined or left;
each marker and the line carry hover text. Plain HTML/SVG renders the same in
JupyterLab, Notebook 7 and VS Code.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence

from ..events import Event, Kind, describe
from ..job_state import JobState, Marker, elapsed_s
from ..views.text import format_duration as duration

MAX_POINTS = 1000
STATUS_COLORS = {
    "prepared": "#7e57c2",
    "pending": "#9e9e9e",
    "running": "#2e7d32",
    "restarting": "#ef6c00",
    "succeeded": "#1565c0",
    "failed": "#c62828",
    "stopped": "#546e7a",
    "lost": "#6d4c41",
}
MARKER_COLORS = {
    "world_size": "#1565c0",
    "restart": "#ef6c00",
    "failure": "#c62828",
    "node_joined": "#2e7d32",
    "node_left": "#8d6e63",
    "resumed": "#9e9e9e",
}
EVENT_COLORS = {
    Kind.WORKER_FAILED: "#c62828",
    Kind.JOB_FINISHED: "#1565c0",
    Kind.RESTART: "#ef6c00",
    Kind.PEER_LOST: "#ef6c00",
    Kind.NODE_JOINED: "#2e7d32",
    Kind.NODE_LEFT: "#8d6e63",
    Kind.RENDEZVOUS: "#1565c0",
    Kind.FAULT: "#6a1b9a",
    Kind.PENDING: "#9e9e9e",
    Kind.RESUMED: "#00838f",
    Kind.FENCED: "#c62828",
    Kind.ERROR: "#c62828",
}
NEUTRAL = "#8d6e63"  # membership changes: a departure's symptoms are not failures


def event_color(e: Event) -> str:
    if (e.kind == Kind.WORKER_FAILED and e.get("cause") == "peer") or (
        e.kind == Kind.RESTART and e.get("reason") in ("departure", "membership_change")
    ):
        return NEUTRAL
    return EVENT_COLORS.get(e.kind, "#555")


TIMELINE_HIDDEN = {
    Kind.METRIC,
    Kind.LOG,
    Kind.CHECKPOINT,
    Kind.AGENT_STARTED,
    Kind.PLAN,
    Kind.GROUP_SUCCEEDED,
    Kind.WORKER_FINISHED,
}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


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


def _nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    ticks = []
    t = first
    while t <= hi + 1e-12 and len(ticks) < 12:
        ticks.append(t)
        t += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.2g}"
    return f"{v:.3g}"


def chart_svg(
    steps: Sequence[float],
    values: Sequence[float],
    markers: Sequence[Marker] = (),
    *,
    metric: str = "loss",
    width: int = 560,
    height: int = 220,
    last_report_t: float | None = None,
) -> str:
    """An SVG line chart of ``metric`` by step, with event markers."""
    pad_l, pad_r, pad_t, pad_b = 48, 12, 12, 26
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    points = downsample(steps, values)
    head = (
        f'<svg class="ne-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-metric="{esc(metric)}" data-points="{len(points)}" '
        f'data-total-points="{len(values)}"'
        + (f' data-last-report-t="{last_report_t:.3f}"' if last_report_t else "")
        + ">"
    )
    parts = [head, f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="#fafafa" stroke="#ddd"/>']
    if not points:
        parts.append(
            f'<text x="{pad_l + w / 2}" y="{pad_t + h / 2}" text-anchor="middle" fill="#999" font-size="12">waiting for {esc(metric)}…</text></svg>'
        )
        return "".join(parts)
    x_lo = min(p[0] for p in points)
    x_hi = max(p[0] for p in points)
    y_lo = min(p[1] for p in points)
    y_hi = max(p[1] for p in points)
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

    for t in _nice_ticks(y_lo, y_hi):
        y = sy(t)
        parts.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(
            f'<text x="{pad_l - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10" fill="#666">{_fmt(t)}</text>'
        )
    for t in _nice_ticks(x_lo, x_hi, 5):
        x = sx(t)
        parts.append(
            f'<text x="{x:.1f}" y="{height - 8}" text-anchor="middle" font-size="10" fill="#666">{_fmt(t)}</text>'
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
    coords = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in points)
    last_s, last_v = points[-1]
    parts.append(
        f'<polyline class="ne-line" fill="none" stroke="#3949ab" stroke-width="1.5" points="{coords}">'
        f"<title>{esc(metric)} at step {_fmt(last_s)}: {last_v:.5g}</title></polyline>"
    )
    parts.append(
        f'<circle cx="{sx(last_s):.1f}" cy="{sy(last_v):.1f}" r="2.5" fill="#3949ab"><title>step {_fmt(last_s)}: {last_v:.5g}</title></circle>'
    )
    parts.append(f'<text x="{pad_l + 4}" y="{pad_t + 12}" font-size="11" fill="#333">{esc(metric)}</text></svg>')
    return "".join(parts)


def status_badge(status: str) -> str:
    color = STATUS_COLORS.get(status, "#9e9e9e")
    return f'<span class="ne-status" data-status="{esc(status)}" style="background:{color};color:#fff;border-radius:9px;padding:1px 8px;font-size:12px">{esc(status)}</span>'


def header_html(name: str, backend: str, state: JobState, now: float | None = None) -> str:
    nodes = len(state.running_nodes)
    rate = None if state.finished else state.steps_per_s
    eta = None if state.finished else state.eta_s
    cells = [
        ("world size", f'<b class="ne-world-size">{state.world_size}</b>'),
        ("nodes", f'<span class="ne-nodes">{nodes}</span> / {state.nnodes[0]}:{state.nnodes[1]}'),
        ("restarts", f'<span class="ne-restarts">{state.restarts}</span> / {state.max_restarts}'),
        ("elapsed", duration(elapsed_s(state, now))),
        ("steps/s", f"{rate:.2f}" if rate else "–"),
        ("ETA", duration(eta)),
    ]
    stats = "".join(f'<span style="margin-right:14px"><span style="color:#777">{k}</span> {v}</span>' for k, v in cells)
    reason = (
        f'<div class="ne-reason" style="color:#555;margin-top:2px">{esc(state.reason)}</div>'
        if state.reason and state.finished
        else ""
    )
    if state.waiting and not state.finished:
        reason += f'<div class="ne-waiting" style="color:#e65100;margin-top:2px">{esc(state.waiting)}</div>'
    return (
        f'<div class="ne-header" style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">'
        f'<b style="font-size:14px">{esc(name)}</b> <span style="color:#777">({esc(backend)})</span> {status_badge(state.status)}'
        f'<div style="margin-top:4px">{stats}</div>{reason}</div>'
    )


def ranks_html(state: JobState) -> str:
    rows = []
    for node in state.nodes.values():
        left = node.status == "left"
        style = "color:#aaa" if left else ""
        ranks = ", ".join(
            f"{r.rank} (local {r.local_rank}, pid {r.pid})" for r in sorted(node.ranks.values(), key=lambda r: r.rank)
        )
        if left:
            ranks = f"left: {esc(node.left_reason or '')}"
        rows.append(
            f'<tr class="ne-node" data-node="{esc(node.name)}" data-status="{esc(node.status)}" style="{style}">'
            f"<td>{esc(node.name)}</td><td>{esc(node.status)}</td><td>{'' if node.group_rank is None else node.group_rank}</td>"
            f"<td>{ranks or '–'}</td><td>{node.restart_count}</td></tr>"
        )
    body = "".join(rows) or '<tr><td colspan="5" style="color:#999">no node yet</td></tr>'
    return (
        f'<div class="ne-ranks" style="font-size:12px"><div style="margin-bottom:4px">world size <b>{state.world_size}</b></div>'
        '<table style="border-collapse:collapse;width:100%"><thead><tr style="text-align:left;color:#777">'
        "<th>node</th><th>status</th><th>group</th><th>ranks (global)</th><th>restarts</th></tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def timeline_html(events: Sequence[Event], limit: int = 150) -> str:
    shown = [e for e in events if e.kind not in TIMELINE_HIDDEN][-limit:]
    items = []
    for e in reversed(shown):
        color = event_color(e)
        when = time.strftime("%H:%M:%S", time.localtime(e.time))
        text = esc(describe(e))
        if e.kind == Kind.WORKER_FAILED and e.get("traceback"):
            text = f"<details><summary>{text}</summary><pre style='font-size:11px;white-space:pre-wrap'>{esc(e.get('traceback'))}</pre></details>"
        items.append(
            f'<li class="ne-event" data-kind="{esc(e.kind)}" style="list-style:none;border-left:3px solid {color};padding-left:6px;margin:2px 0">'
            f'<span style="color:#888">{when}</span> <span style="color:{color}">{esc(e.kind)}</span> {text}</li>'
        )
    return f'<ul class="ne-timeline" style="margin:0;padding:0;max-height:260px;overflow:auto;font-size:12px">{"".join(items)}</ul>'


def logs_html(lines: Sequence[str], limit: int = 60) -> str:
    text = esc("\n".join(lines[-limit:])) or "(no output yet)"
    return f'<pre class="ne-logs" style="max-height:220px;overflow:auto;font-size:11px;margin:0">{text}</pre>'

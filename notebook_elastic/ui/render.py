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

from ..events import FAULT_WORDS, Event, Kind, describe, gib, rate
from ..events import format_duration as duration
from ..job_state import JobState, Marker, elapsed_s

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
    "stall": "#c62828",
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
    Kind.FILES_CHANGED: "#c62828",
    Kind.STALL: "#c62828",
    Kind.STALL_CLEARED: "#2e7d32",
}
NEUTRAL = "#8d6e63"  # membership changes: a departure's symptoms are not failures


def event_color(e: Event) -> str:
    if (e.kind == Kind.WORKER_FAILED and e.get("cause") == "peer") or (
        e.kind == Kind.RESTART and e.get("reason") in ("departure", "membership_change", "store_replaced")
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


# Colours come from JupyterLab's theme variables, with light fallbacks for other front ends
# (Notebook 7 and VS Code set their own or none): a dark theme gets a dark dashboard.
FG = "var(--jp-ui-font-color1, #222)"
FG_DIM = "var(--jp-ui-font-color2, #666)"
FG_FAINT = "var(--jp-ui-font-color3, #999)"
BG_PLOT = "var(--jp-layout-color1, #fff)"
GRID = "var(--jp-border-color2, #e0e0e0)"
LINE = "var(--jp-brand-color1, #1976d2)"
FONT = "var(--jp-ui-font-family, system-ui, sans-serif)"

MARKER_WORDS = {
    "world_size": "world size changed",
    "restart": "restart (budget)",
    "failure": "a rank failed",
    "node_joined": "node joined",
    "node_left": "node left",
    "resumed": "resumed",
    "stall": "stall",
}
# Why a node left, in the user's words (the supervisor's exit reasons are identifiers).
LEFT_WORDS = {
    "preempted": "preempted",
    "lost": "lost",
    "scaled_down": "released (scaled down)",
    "stopped": "stopped with the job",
    "finished": "finished",
    "files_changed": "stopped: its files changed",
    "evicted": "evicted: it failed while joining",
}
# Integer counters a training loop reports for its own bookkeeping (the quickstart's `gen`,
# `start`): shown in the history, not offered as a chart.
BOOKKEEPING = {"step", "epoch", "gen", "generation", "start", "rank", "world_size", "restart_count"}


def left_words(reason: str | None) -> str:
    return LEFT_WORDS.get(reason or "", (reason or "left").replace("_", " "))


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
    ticks = []
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
) -> str:
    """An SVG line chart of ``metric`` by step, with event markers and a legend.

    It scales to its container's width (viewBox), so one layout fits 800 px. ``log_scale``
    applies when every value is positive; ``smoothing`` draws an EMA over a faint raw line."""
    pad_l, pad_r, pad_t, pad_b = 46, 12, 10, 24
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    points = downsample(steps, values)
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
            f'style="fill:{FG_FAINT}">waiting for {esc(metric)}…</text></svg>'
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


def status_badge(status: str) -> str:
    color = STATUS_COLORS.get(status, "#9e9e9e")
    return (
        f'<span class="ne-status" data-status="{esc(status)}" style="background:{color};color:#fff;'
        f'border-radius:9px;padding:1px 8px;font-size:12px">{esc(status)}</span>'
    )


def speed_text(state: JobState) -> str:
    """ "0.21 s/step · 1.52k samples/s · 97.3k tokens/s": what a GPU user reads first."""
    step_s = state.step_time_s
    if step_s is None:
        return ""
    parts = [f"{step_s:.3g} s/step"]
    if state.samples_per_s is not None:
        parts.append(rate(state.samples_per_s, "samples"))
    if state.tokens_per_s is not None:
        parts.append(rate(state.tokens_per_s, "tokens"))
    return " · ".join(parts)


def gpu_text(state: JobState) -> str:
    """ "GPU peak 31.2 GiB (rank 3) · 87% busy": the fullest rank, the mean utilisation; "" on CPU."""
    ranks = state.gpu_ranks
    if not ranks:
        return ""
    fullest = max(ranks, key=lambda r: r.get("mem_peak_bytes") or 0)
    text = f"GPU peak {gib(fullest.get('mem_peak_bytes'))}" + (f" (rank {fullest['rank']})" if len(ranks) > 1 else "")
    busy = [r["util_percent"] for r in ranks if r.get("util_percent") is not None]
    if busy:
        text += f" · {sum(busy) / len(busy):.0f}% busy"
    return text


def header_html(name: str, backend: str, state: JobState, now: float | None = None) -> str:
    """One line with the state at a glance: status, world size, nodes, step / ETA, loss,
    restarts; below it only what needs a word (why it ended, a warning, a stall)."""
    nodes = len(state.running_nodes)
    eta = None if state.finished else state.eta_s
    cells = [
        f'world size <b class="ne-world-size">{state.world_size}</b>',
        # An ended job runs on no node: its range, not "nodes 0" (#11 item 6).
        f'range <span style="color:{FG_FAINT}">{state.nnodes[0]}:{state.nnodes[1]}</span>'
        if state.finished
        else f'nodes <span class="ne-nodes">{nodes}</span> <span style="color:{FG_FAINT}">'
        f"({state.nnodes[0]}:{state.nnodes[1]})</span>",
    ]
    if state.step is not None:
        done = state.step + 1
        step = f'step <b class="ne-step">{done}</b>' + (f" / {state.total_steps}" if state.total_steps else "")
        if eta is not None:
            step += f' <span style="color:{FG_FAINT}">ETA {duration(eta)}</span>'
        cells.append(step)
    loss_name = "loss" if "loss" in state.metrics else next(iter(chart_metrics(state.metrics.names)), None)
    last = state.metrics.last(loss_name) if loss_name else None
    if last is not None:
        cells.append(f'{esc(loss_name)} <b class="ne-loss">{last:.4g}</b>')
    speed = speed_text(state)
    if speed and not state.finished:
        cells.append(f'<span class="ne-speed">{esc(speed)}</span>')
    gpu = gpu_text(state)
    if gpu:
        cells.append(f'<span class="ne-gpu">{esc(gpu)}</span>')
    cells.append(
        f'<span style="color:{FG_DIM}">restarts <span class="ne-restarts">{state.restarts}</span>/{state.max_restarts}</span>'
    )
    saving = state.checkpointing
    if saving and not state.finished:
        every = saving.get("every")
        how = f"every {every} steps" if isinstance(every, int) and every > 1 else "every step"
        cells.append(
            f'<span class="ne-checkpointing" style="color:{FG_DIM}" title="how often State saves '
            f"({'chosen to block at most 10 % of the loop' if saving.get('chosen') else '--checkpoint-every'}) "
            f'and the share of the loop its commits blocked">checkpoint {how}, blocks '
            f'<span class="ne-blocked">{saving.get("blocked_pct")}</span> %</span>'
        )
    cells.append(f'<span style="color:{FG_FAINT}">{duration(elapsed_s(state, now))}</span>')
    sep = f' <span style="color:{FG_FAINT}">·</span> '
    stats = sep.join(cells)
    notes = []
    if state.reason and state.finished:
        notes.append(f'<div class="ne-reason" style="color:{FG_DIM}">{esc(state.reason)}</div>')
    if state.warning and not state.finished:
        notes.append(f'<div class="ne-warning" style="color:#e65100">{esc(state.warning)}</div>')
    if state.stall and not state.finished:
        notes.append(
            f'<div class="ne-stall" style="color:#c62828">{esc(Event(Kind.STALL, 0, None, state.stall).describe())}</div>'
        )
    if state.waiting and not state.finished:
        notes.append(f'<div class="ne-waiting" style="color:#e65100">{esc(state.waiting)}</div>')
    return (
        f'<div class="ne-header" style="font-family:{FONT};font-size:13px;color:{FG};line-height:1.6">'
        f'<div class="ne-glance" style="display:flex;flex-wrap:wrap;align-items:center;gap:2px 8px">'
        f'<b style="font-size:14px">{esc(name)}</b> {status_badge(state.status)} '
        f"<span>{stats}</span>"
        f'<span style="color:{FG_FAINT};margin-left:auto;font-size:11px">{esc(backend)}</span></div>'
        f"{''.join(notes)}</div>"
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
            ranks = esc(left_words(node.left_reason))
        rows.append(
            f'<tr class="ne-node" data-node="{esc(node.name)}" data-status="{esc(node.status)}" style="{style}">'
            f"<td>{esc(node.name)}</td><td>{esc(node.status)}</td><td>{'' if node.group_rank is None else node.group_rank}</td>"
            f"<td style='overflow-wrap:anywhere'>{ranks or '–'}</td><td>{node.restart_count}</td></tr>"
        )
    body = "".join(rows) or '<tr><td colspan="5" style="color:#999">no node yet</td></tr>'
    return (
        f'<div class="ne-ranks" style="font-size:12px;color:{FG}"><div style="margin-bottom:4px">world size <b>{state.world_size}</b></div>'
        f'<table style="border-collapse:collapse;width:100%;table-layout:fixed"><thead><tr style="text-align:left;color:{FG_DIM}">'
        "<th style='width:16%'>node</th><th style='width:14%'>status</th><th style='width:10%'>group</th>"
        "<th>ranks (global)</th><th style='width:10%'>restarts</th></tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


# Symptoms and machinery: true, but a person reading the story needs the cause, not these.
STORY_HIDDEN = TIMELINE_HIDDEN | {
    Kind.RENDEZVOUS,
    Kind.AGENT_SIGNALED,
    Kind.LEFT_RENDEZVOUS,
    Kind.PEER_LOST,
    Kind.WORKER_EXITED,
}


def _back_after(e: Event, events: Sequence[Event], index: int) -> str:
    """' — back at world size 2 after 1.6 s': when training started again after ``e``."""
    for later in events[index + 1 :]:
        if later.kind == Kind.WORKER_STARTED:
            return f" — back at world size {later.get('world_size')} after {later.time - e.time:.1f} s"
        if later.kind == Kind.JOB_FINISHED:
            return ""
    return " — regrouping…"


def story(events: Sequence[Event]) -> list[tuple[Event, str]]:
    """The job's history as sentences, oldest first: one line per thing that happened, the
    symptoms of a membership change folded into the line of its cause."""
    out: list[tuple[Event, str]] = []
    groups: set = set()
    drilled: dict[str, Event] = {}  # node -> the drill that takes it away: told in its node_left line
    for i, e in enumerate(events):
        k, d = e.kind, e.data
        if k in STORY_HIDDEN:
            continue
        if k == Kind.WORKER_STARTED:
            key = d.get("generation")
            if key in groups:
                continue
            groups.add(key)
            out.append((e, f"training at world size {d.get('world_size')}"))
        elif k == Kind.WORKER_FAILED and d.get("cause") == "peer":
            continue
        elif k == Kind.RESTART and d.get("reason") in ("departure", "membership_change", "store_replaced"):
            continue
        elif k == Kind.RESTART:
            out.append(
                (e, f"{e.node}: worker group restarted — restart {d.get('restarts_used')} of {d.get('max_restarts')}")
            )
        elif k == Kind.SCALED and d.get("reason"):
            continue  # the node_left line tells it
        elif k == Kind.SCALED:
            out.append((e, f"asked for {d.get('target')} node(s), range {d.get('min_nodes')}:{d.get('max_nodes')}"))
        elif k == Kind.FAULT and str(d.get("fault")).endswith("_node") and e.node:
            drilled[e.node] = e  # one line for it: the node's departure, marked as a drill
        elif k == Kind.FAULT:
            out.append((e, f"drill: {d.get('target')} {FAULT_WORDS.get(str(d.get('fault')), d.get('fault'))}"))
        elif k == Kind.NODE_LEFT:
            reason = d.get("reason")
            drill = drilled.pop(e.node, None) if e.node else None
            if reason in ("stopped", "finished") and drill is None:
                continue
            if drill is not None:  # the outage counts from the drill, not from when the node was gone
                words = FAULT_WORDS.get(str(drill.get("fault")), str(drill.get("fault")))
                out.append((drill, f"{e.node} {words} (drill)" + _back_after(drill, events, i)))
            else:
                out.append((e, f"{e.node} {left_words(reason)}" + _back_after(e, events, i)))
        elif k == Kind.RESUMED:
            if d.get("rank") not in (None, 0):
                continue
            out.append((e, f"resumed from the checkpoint of step {d.get('step')}"))
        elif k == Kind.JOB_FINISHED:
            reason = d.get("reason")
            out.append((e, f"{d.get('status')}" + (f": {reason}" if reason else "")))
        else:
            out.append((e, describe(e)))
    return out


def timeline_html(events: Sequence[Event], limit: int = 150) -> str:
    items = []
    for e, text in reversed(story(events)[-limit:]):
        color = event_color(e)
        when = time.strftime("%H:%M:%S", time.localtime(e.time))
        body = esc(text)
        if e.kind == Kind.WORKER_FAILED and e.get("traceback"):
            body = (
                f"<details><summary>{body}</summary><pre style='font-size:11px;white-space:pre-wrap;"
                f"overflow-wrap:anywhere;margin:2px 0'>{esc(e.get('traceback'))}</pre></details>"
            )
        items.append(
            f'<li class="ne-event" data-kind="{esc(e.kind)}" style="list-style:none;border-left:3px solid {color};'
            f'padding-left:6px;margin:2px 0;overflow-wrap:anywhere">'
            f'<span style="color:{FG_FAINT}">{when}</span> {body}</li>'
        )
    return (
        f'<ul class="ne-timeline" style="margin:0;padding:0;max-height:260px;overflow-y:auto;overflow-x:hidden;'
        f'font-size:12px;color:{FG}">{"".join(items)}</ul>'
    )


def logs_html(lines: Sequence[str], limit: int = 60) -> str:
    text = esc("\n".join(lines[-limit:])) or "(no output yet)"
    return (
        f'<pre class="ne-logs" style="max-height:220px;overflow-y:auto;overflow-x:hidden;white-space:pre-wrap;'
        f'overflow-wrap:anywhere;font-size:11px;margin:0;color:{FG}">{text}</pre>'
    )


OFFLINE_CSS = """<style>
.notebook-elastic-dashboard,.notebook-elastic-dashboard .widget-tab-contents{box-sizing:border-box}
.notebook-elastic-dashboard.jupyter-widgets-disconnected::before,
.notebook-elastic-dashboard .jupyter-widgets-disconnected::before{display:none!important}
.notebook-elastic-dashboard.jupyter-widgets-disconnected .ne-offline{display:block!important}
.notebook-elastic-dashboard.jupyter-widgets-disconnected .widget-button,
.notebook-elastic-dashboard.jupyter-widgets-disconnected .widget-inline-hbox input{opacity:.45;pointer-events:none}
.notebook-elastic-dashboard .widget-button{width:auto;padding:0 10px}
.notebook-elastic-dashboard .widget-label{width:auto;min-width:0;padding-right:6px}
.notebook-elastic-dashboard,.notebook-elastic-dashboard .widget-html-content{color:var(--jp-ui-font-color1,#222)}
</style>"""


def offline_html(name: str, *, hidden: bool = True) -> str:
    """The word a dashboard shows once its kernel is gone (restarted, or the page reloaded
    from saved widget state): the last picture stays, and how to follow the job again.

    Hidden (inline, so a front end that drops the style sheet still hides it) until
    ipywidgets marks the view ``jupyter-widgets-disconnected``: its model has no live comm,
    after a kernel restart or when it was restored from the notebook's saved widget state.
    The ``ne-attach`` button is wired by the JupyterLab extension (it runs the magic in a
    new cell once the kernel is back); elsewhere the sentence says what to type."""
    command = f"%elastic_attach {name}"
    display = "none" if hidden else "block"
    return (
        f"{OFFLINE_CSS}"
        f'<div class="ne-offline" data-job="{esc(name)}" style="display:{display};border:1px solid #ef6c00;border-radius:4px;'
        f'padding:4px 8px;margin:2px 0 6px;font-size:12px;color:{FG};background:var(--jp-warn-color3,#fff3e0)">'
        f"<b>kernel restarted</b> — <code>{esc(command)}</code> to follow it again. "
        f'<button class="ne-attach jp-mod-styled" data-job="{esc(name)}" data-command="{esc(command)}" disabled '
        f'title="run {esc(command)} in a new cell below">follow again</button>'
        f' <span style="color:{FG_FAINT}">(the picture below is the last one this kernel saw)</span></div>'
    )


def snapshot_html(name: str, backend: str, state: JobState, chart: str, legend: str, timeline: str) -> str:
    """The dashboard's last picture as plain HTML: the text/html twin of the widget in the
    output's mime bundle, shown wherever live widget models are missing."""
    return (
        f'<div class="ne-snapshot" data-job="{esc(name)}" style="border:1px solid {GRID};padding:6px;'
        f'max-width:800px;box-sizing:border-box;font-family:{FONT}">'
        f"{offline_html(name, hidden=False)}{header_html(name, backend, state)}{chart}{legend}"
        f'<div style="margin-top:6px">{timeline}</div></div>'
    )

"""Pure renderers: job state in, HTML/SVG text out. No widgets, no I/O, testable directly.

The chart is an SVG polyline of one metric against the step, downsampled to at most
``MAX_POINTS`` points (min and max of each bucket, so spikes survive), with a vertical
marker wherever the world size changed, a restart happened, or a node joined or left;
each marker and the line carry hover text. Plain HTML/SVG renders the same in
JupyterLab, Notebook 7 and VS Code.

The chart (``chart.py``), the timeline's story (``story.py``) and the colours and words
(``theme.py``) are modules of their own; the header, the rank table, the log pane and the
offline snapshot are here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...contract.event_types import Kind
from ...contract.events import Event, gib, rate, sig
from ...contract.events import format_duration as duration
from ...contract.job_state import JobState, elapsed_s
from ...runtime.tracking import shown
from .chart import (
    BOOKKEEPING,
    MAX_POINTS,
    chart_box,
    chart_metrics,
    chart_svg,
    downsample,
    fmt_number,
    legend_html,
    smooth,
)
from .story import EVENT_COLORS, NEUTRAL, STORY_HIDDEN, TIMELINE_HIDDEN, event_color, story, timeline_html
from .theme import (
    BG_PLOT,
    FG,
    FG_DIM,
    FG_FAINT,
    FONT,
    GRID,
    LEFT_WORDS,
    LINE,
    MARKER_COLORS,
    MARKER_WORDS,
    STATUS_COLORS,
    esc,
    left_words,
)

# The renderers, and every name that was defined here before the chart, the story and the
# theme moved out (still imported from here).
__all__ = [
    "BG_PLOT",
    "BOOKKEEPING",
    "EVENT_COLORS",
    "FG",
    "FG_DIM",
    "FG_FAINT",
    "FONT",
    "GRID",
    "LEFT_WORDS",
    "LINE",
    "MARKER_COLORS",
    "MARKER_WORDS",
    "MAX_POINTS",
    "NEUTRAL",
    "OFFLINE_CSS",
    "STATUS_COLORS",
    "STORY_HIDDEN",
    "TIMELINE_HIDDEN",
    "chart_metrics",
    "chart_box",
    "chart_svg",
    "downsample",
    "esc",
    "event_color",
    "fmt_number",
    "gpu_text",
    "header_html",
    "saving_html",
    "left_words",
    "legend_html",
    "logs_html",
    "offline_html",
    "ranks_html",
    "smooth",
    "snapshot_html",
    "speed_text",
    "status_badge",
    "story",
    "timeline_html",
    "tracking_html",
]


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
    parts = [f"{sig(step_s, 3)} s/step"]
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


def wrappable(text: str) -> str:
    """A command or a path, escaped, that a narrow line breaks after a '/' or at a space, never
    inside a name (at its hyphens, "pytest-" / "78"): each name between slashes is one unbreakable
    piece, each slash a place to break (#30 item 4)."""
    out = []
    for token in re.split(r"(\s+)", text):
        if not token or token.isspace():
            out.append(esc(token))
            continue
        out.append(
            "/<wbr>".join(
                f'<span class="ne-path-seg" style="white-space:nowrap">{esc(seg)}</span>' if seg else ""
                for seg in token.split("/")
            )
        )
    return "".join(out)


def tracking_html(tracking: Sequence[Mapping[str, Any]]) -> str:
    """Where the run is tracked: a link to the MLflow/W&B run's page, else the command that shows
    it (``mlflow ui ...`` for a store on disk, ``wandb sync ...`` offline, ``tensorboard ...``).
    Only http(s) links; what an event says is escaped and stripped of credentials again here
    (a pod's rank 0 wrote it)."""
    items = []
    for d in map(shown, tracking):
        if d["url"]:
            items.append(
                f'<a class="ne-tracking-link" data-tracker="{esc(d["tracker"])}" href="{esc(d["url"])}" '
                f'target="_blank" rel="noopener noreferrer" title="{esc(d["url"])}">{esc(d["label"])}</a>'
            )
        elif d["command"]:
            where = f" in {d['path']}" if d["path"] else ""
            items.append(
                f'<span class="ne-tracking-item" data-tracker="{esc(d["tracker"])}" title="{esc(d["label"] + where)}">'
                f'{esc(d["label"])}: <code class="ne-tracking-command" style="user-select:all">{wrappable(d["command"])}</code></span>'
            )
    if not items:
        return ""
    sep = f' <span style="color:{FG_FAINT}">·</span> '
    return f'<div class="ne-tracking" style="color:{FG_DIM};font-size:12px">{sep.join(items)}</div>'


def saving_html(state: JobState) -> str:
    """ "checkpoint every ~6 steps, blocks 1.6 %": how often State saves and the share of the
    job's loop time its commits blocked, over every worker group so far (``SavingClock``: the
    figure the promise is about, #39 item 2); none before ten seconds of the loop are measured
    (one save over one step), and a history from before the totals were sent shows its last
    checkpoint event's share."""
    saving = state.checkpointing or {}
    every = saving.get("every")
    about = ""
    if saving.get("chosen") and state.saving.blocked_pct() is not None and state.saving.saves and state.steps_done:
        # chosen, it varies: the job's mean, once measured as long as its share
        every, about = max(1, round(state.steps_done / state.saving.saves)), "~"
    how = f"every {about}{every} steps" if isinstance(every, int) and every > 1 else "every step"
    share = state.saving.blocked_pct() if state.saving.measured_s else saving.get("blocked_pct")
    cost = f'blocks <span class="ne-blocked">{share}</span> %' if share is not None else "its cost being measured"
    why = "chosen to block at most a tenth of the loop's time" if saving.get("chosen") else "--checkpoint-every"
    return (
        f'<span class="ne-checkpointing" style="color:{FG_DIM}" title="how often State saves ({why}) and the share '
        f"of the job's loop time its commits blocked, over the job so far\">checkpoint {how}, {cost}</span>"
    )


def header_html(name: str, backend: str, state: JobState, now: float | None = None, status: str | None = None) -> str:
    """One line with the state at a glance: status, world size, nodes, step / ETA, loss,
    restarts; below it only what needs a word (why it ended, a warning, a stall). ``status``:
    the one to draw when it is not the job's present one (the dashboard draws each status the
    job passed through for a frame)."""
    nodes = len(state.running_nodes)
    eta = None if state.finished else state.eta_s
    # Every step done and every node gone, the outcome not yet told: the job is ending, not
    # "running · nodes 0" (#30 item 3).
    ending = not state.finished and nodes == 0 and (state.steps_done or 0) >= (state.total_steps or 0) > 0
    cells = [
        f'world size <b class="ne-world-size">{state.world_size}</b>',
        # An ended job runs on no node: its range, not "nodes 0" (#11 item 6).
        f'range <span style="color:{FG_FAINT}">{state.nnodes[0]}:{state.nnodes[1]}</span>'
        if state.finished
        else '<span class="ne-nodes-ending">all steps done, ending</span>'
        if ending
        else f'nodes <span class="ne-nodes">{nodes}</span> <span style="color:{FG_FAINT}">'
        f"({state.nnodes[0]}:{state.nnodes[1]})</span>",
    ]
    if state.step is not None:
        step = f'step <b class="ne-step">{state.steps_done}</b>' + (
            f"/{state.total_steps}" if state.total_steps else ""  # as the panel, the CLI and the summary write it
        )
        if eta is not None:
            step += f' <span style="color:{FG_FAINT}">ETA {duration(eta)}</span>'
        cells.append(step)
    loss_name = "loss" if "loss" in state.metrics else next(iter(chart_metrics(state.metrics.names)), None)
    last = state.metrics.last(loss_name) if loss_name else None
    if last is not None:
        cells.append(f'{esc(loss_name)} <b class="ne-loss">{sig(last, 4)}</b>')
    speed = speed_text(state)
    if speed and not state.finished:
        cells.append(f'<span class="ne-speed">{esc(speed)}</span>')
    gpu = gpu_text(state)
    if gpu:
        cells.append(f'<span class="ne-gpu">{esc(gpu)}</span>')
    cells.append(
        f'<span style="color:{FG_DIM}">restarts <span class="ne-restarts">{state.restarts}</span>/{state.max_restarts}</span>'
    )
    if state.checkpointing and not state.finished:
        cells.append(saving_html(state))
    cells.append(f'<span class="ne-ran" style="color:{FG_FAINT}">ran {duration(elapsed_s(state, now))}</span>')
    sep = f' <span style="color:{FG_FAINT}">·</span> '
    # The line wraps between values, never inside one ("blocks 28.1" / "% · 3s" at 970 px).
    stats = sep.join(f'<span class="ne-cell" style="white-space:nowrap">{cell}</span>' for cell in cells)
    notes = []
    if state.reason and state.finished:
        notes.append(f'<div class="ne-reason" style="color:{FG_DIM}">{esc(state.reason)}</div>')
    if state.warning and not state.finished:
        notes.append(f'<div class="ne-warning" style="color:#e65100">{esc(state.warning)}</div>')
    if state.stall and not state.finished:
        notes.append(
            f'<div class="ne-stall" style="color:#c62828">{esc(Event(Kind.STALL, 0, None, {**state.stall}).describe())}</div>'
        )
    if state.waiting and not state.finished:
        notes.append(f'<div class="ne-waiting" style="color:#e65100">{esc(state.waiting)}</div>')
    notes.append(tracking_html(list(state.tracking.values())))
    return (
        f'<div class="ne-header" style="font-family:{FONT};font-size:13px;color:{FG};line-height:1.6">'
        f'<div class="ne-glance" style="display:flex;flex-wrap:wrap;align-items:center;gap:2px 8px">'
        f'<b style="font-size:14px">{esc(name)}</b> {status_badge(status or state.status)} '
        f"<span>{stats}</span>"
        f'<span style="color:{FG_FAINT};margin-left:auto;font-size:11px">{esc(backend)}</span></div>'
        f"{''.join(notes)}</div>"
    )


#: Past this many nodes the rank map is a summary: a count of nodes by status, the nodes that
#: are not running (up to this many), and the span of ranks on the running ones. A row a node
#: at 1,024 nodes was 400 kB of HTML at every redraw, 85 ms to draw, and unreadable (#40).
RANK_MAP_ROWS = 32


def ranks_html(state: JobState) -> str:
    if len(state.nodes) > RANK_MAP_ROWS:
        return _ranks_summary_html(state)
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


def _ranks_summary_html(state: JobState) -> str:
    """The rank map of a big job: how many nodes in each status, the ones not running listed
    (restarting, starting or pending first, then the ones that left), the running ones told
    as a count and the span of their ranks."""
    order = {"restarting": 0, "starting": 1, "pending": 2, "left": 3}
    by_status: dict[str, int] = {}
    running_ranks: list[int] = []
    others = []
    for node in state.nodes.values():
        by_status[node.status] = by_status.get(node.status, 0) + 1
        if node.status == "running":
            running_ranks += list(node.ranks)
        else:
            others.append(node)
    others.sort(key=lambda n: (order.get(n.status, 4), n.name))
    counts = " · ".join(
        f"{count:,} {esc(status)}" for status, count in sorted(by_status.items(), key=lambda kv: -kv[1])
    )
    rows = []
    for node in others[:RANK_MAP_ROWS]:
        left = node.status == "left"
        what = esc(left_words(node.left_reason)) if left else ", ".join(str(r) for r in sorted(node.ranks)) or "–"
        rows.append(
            f'<tr class="ne-node" data-node="{esc(node.name)}" data-status="{esc(node.status)}"'
            f' style="{"color:#aaa" if left else ""}"><td>{esc(node.name)}</td><td>{esc(node.status)}</td>'
            f"<td>{'' if node.group_rank is None else node.group_rank}</td>"
            f"<td style='overflow-wrap:anywhere'>{what}</td><td>{node.restart_count}</td></tr>"
        )
    if len(others) > RANK_MAP_ROWS:
        rows.append(f'<tr><td colspan="5" style="color:{FG_DIM}">… and {len(others) - RANK_MAP_ROWS:,} more</td></tr>')
    running = by_status.get("running", 0)
    if running:
        span = f"ranks {min(running_ranks):,}–{max(running_ranks):,}" if running_ranks else "no rank yet"
        rows.append(
            f'<tr class="ne-running" data-count="{running}"><td colspan="2">{running:,} nodes</td>'
            f"<td>running</td><td>{span}</td><td></td></tr>"
        )
    return (
        f'<div class="ne-ranks" style="font-size:12px;color:{FG}"><div style="margin-bottom:4px">world size '
        f"<b>{state.world_size:,}</b> on {len(state.nodes):,} nodes: {counts}</div>"
        f'<table style="border-collapse:collapse;width:100%;table-layout:fixed"><thead><tr style="text-align:left;color:{FG_DIM}">'
        "<th style='width:16%'>node</th><th style='width:14%'>status</th><th style='width:10%'>group</th>"
        "<th>ranks (global)</th><th style='width:10%'>restarts</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
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
        # Said for a restarted kernel and for a notebook reopened after its kernel was shut down
        # alike: the kernel that drew this picture is gone, whichever way it went.
        f"<b>not live</b>: the kernel that drew this is gone (restarted or shut down) — "
        f"<code>{esc(command)}</code> to follow the job again. "
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

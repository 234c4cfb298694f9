"""The job's timeline as a story: its events as sentences, oldest first, the symptoms of a
membership change folded into the line of its cause and a drill told once with the
departure it caused; and that story as the dashboard's timeline list."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ...contract.event_types import (
    Fault,
    JobFinished,
    Kind,
    NodeLeft,
    Restart,
    Resumed,
    Scaled,
    WorkerFailed,
    WorkerStarted,
)
from ...contract.events import FAULT_WORDS, Event, describe, format_duration
from ...contract.job_state.handlers import quiet_departure
from .theme import FG, FG_FAINT, esc, left_words

EVENT_COLORS: dict[str, str] = {
    Kind.WORKER_FAILED: "#c62828",
    Kind.JOB_FINISHED: "#1565c0",
    Kind.RESTART: "#ef6c00",
    Kind.PEER_LOST: "#ef6c00",
    Kind.NODE_JOINED: "#2e7d32",
    Kind.NODE_LEFT: "#8d6e63",
    Kind.RENDEZVOUS: "#1565c0",
    Kind.FAULT: "#6a1b9a",
    Kind.PENDING: "#9e9e9e",
    Kind.QUEUE: "#9e9e9e",
    Kind.RESUMED: "#00838f",
    Kind.FENCED: "#c62828",
    Kind.ERROR: "#c62828",
    Kind.FILES_CHANGED: "#c62828",
    Kind.STALL: "#c62828",
    Kind.STALL_CLEARED: "#2e7d32",
    Kind.SUPERVISOR_FROZEN: "#8d6e63",  # ours, not the job's
    Kind.IN_PLACE: "#2e7d32",  # the members changed and nobody restarted
    Kind.IN_PLACE_REFUSED: "#ef6c00",
}
NEUTRAL = "#8d6e63"  # membership changes: a departure's symptoms are not failures


def event_color(e: Event) -> str:
    if (e.kind == Kind.WORKER_FAILED and e.fields(WorkerFailed).get("cause") == "peer") or (
        e.kind == Kind.RESTART
        and e.fields(Restart).get("reason") in ("departure", "membership_change", "store_replaced")
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
    Kind.TRACKING,  # the header links the run
}
# Symptoms and machinery: true, but a person reading the story needs the cause, not these.
STORY_HIDDEN = TIMELINE_HIDDEN | {
    Kind.RENDEZVOUS,
    Kind.AGENT_SIGNALED,
    Kind.LEFT_RENDEZVOUS,
    Kind.PEER_LOST,
    Kind.WORKER_EXITED,
    Kind.REGROUPED,  # each node's round: the in_place line tells the change
    Kind.LEFT_AT_BOUNDARY,
}


def _back_after(e: Event, events: Sequence[Event], index: int, started: frozenset[Any]) -> str:
    """' — back at world size 2 after 1.6s': when a new worker group started after ``e`` (the
    drill, else the departure: where the jobs panel's "running again after" counts from too,
    the fold's restart ``since``). A worker of a group in ``started`` (those started before
    ``e``: a slower node's rank of the same group, told a moment later) is not training
    starting again."""
    for later in events[index + 1 :]:
        started_now = later.fields(WorkerStarted)
        if later.kind == Kind.WORKER_STARTED and started_now.get("generation") not in started:
            how = "in place" if started_now.get("in_place") else "back"
            return (
                f" — {how} at world size {started_now.get('world_size')} after {format_duration(later.time - e.time)}"
            )
        if later.kind == Kind.JOB_FINISHED:
            return ""
    return " — regrouping…"


def story(events: Sequence[Event]) -> list[tuple[Event, str]]:
    """The job's history as sentences, oldest first: one line per thing that happened, the
    symptoms of a membership change folded into the line of its cause."""
    out: list[tuple[Event, str]] = []
    groups: set[Any] = set()  # the generations of the worker groups started so far
    # node -> the drill that takes it away and where it stands: told in the node's node_left line,
    # its outage counted from the drill (a loaded supervisor may tell node_left after the survivors
    # already started again)
    drilled: dict[str, tuple[Event, int, frozenset[Any]]] = {}
    for i, e in enumerate(events):
        k = e.kind
        if k in STORY_HIDDEN:
            continue
        if k == Kind.WORKER_STARTED:
            started = e.fields(WorkerStarted)
            key = started.get("generation")
            if key in groups:
                continue
            groups.add(key)
            if not started.get("in_place"):  # a group formed in place: its in_place line tells it
                out.append((e, f"training at world size {started.get('world_size')}"))
        elif k == Kind.WORKER_FAILED and e.fields(WorkerFailed).get("cause") == "peer":
            continue
        elif k == Kind.RESTART and e.fields(Restart).get("reason") in (
            "departure",
            "membership_change",
            "store_replaced",
        ):
            continue
        elif k == Kind.RESTART:
            restart = e.fields(Restart)
            out.append(
                (
                    e,
                    f"{e.node}: worker group restarted — restart {restart.get('restarts_used')} of {restart.get('max_restarts')}",
                )
            )
        elif k == Kind.SCALED and e.fields(Scaled).get("reason"):
            continue  # the node_left line tells it
        elif k == Kind.SCALED:
            scaled = e.fields(Scaled)
            out.append(
                (
                    e,
                    f"asked for {scaled.get('target')} node(s), range {scaled.get('min_nodes')}:{scaled.get('max_nodes')}",
                )
            )
        elif k == Kind.FAULT and str(e.fields(Fault).get("fault")).endswith("_node") and e.node:
            drilled[e.node] = (e, i, frozenset(groups))  # one line for it: the node's departure, marked as a drill
        elif k == Kind.FAULT:
            fault = e.fields(Fault)
            out.append(
                (e, f"drill: {fault.get('target')} {FAULT_WORDS.get(str(fault.get('fault')), fault.get('fault'))}")
            )
        elif k == Kind.NODE_LEFT:
            reason = e.fields(NodeLeft).get("reason")
            drilled_at = drilled.pop(e.node, None) if e.node else None
            if quiet_departure(reason) and drilled_at is None:
                continue  # nor is it marked on the chart: the same rule, the fold's
            if drilled_at is not None:  # the outage counts from the drill, not from when the node was gone
                drill, at, before = drilled_at
                what = drill.fields(Fault).get("fault")
                words = FAULT_WORDS.get(str(what), str(what))
                out.append((drill, f"{e.node} {words} (drill)" + _back_after(drill, events, at, before)))
            else:
                out.append((e, f"{e.node} {left_words(reason)}" + _back_after(e, events, i, frozenset(groups))))
        elif k == Kind.RESUMED:
            # (The checkpoint's writer alone says it, with no rank field: a check of one is gone.)
            out.append((e, f"resumed from the checkpoint of step {e.fields(Resumed).get('step')}"))
        elif k == Kind.JOB_FINISHED:
            finished = e.fields(JobFinished)
            why = finished.get("reason")
            out.append((e, f"{finished.get('status')}" + (f": {why}" if why else "")))
        else:
            out.append((e, describe(e)))
    return out


def timeline_html(events: Sequence[Event], limit: int = 150) -> str:
    items = []
    for e, text in reversed(story(events)[-limit:]):
        color = event_color(e)
        when = time.strftime("%H:%M:%S", time.localtime(e.time))
        line = f'<span class="ne-when" style="color:{FG_FAINT};white-space:nowrap">{when}</span> {esc(text)}'
        traceback = e.fields(WorkerFailed).get("traceback")
        if e.kind == Kind.WORKER_FAILED and traceback:
            # The time inside the summary: a <details> is a block, and the time stood alone on a
            # line above its sentence (#39 item 9).
            line = (
                f"<details><summary>{line}</summary><pre style='font-size:11px;white-space:pre-wrap;"
                f"overflow-wrap:anywhere;margin:2px 0'>{esc(traceback)}</pre></details>"
            )
        items.append(
            f'<li class="ne-event" data-kind="{esc(e.kind)}" style="list-style:none;border-left:3px solid {color};'
            f'padding-left:6px;margin:2px 0;overflow-wrap:anywhere">{line}</li>'
        )
    return (
        f'<ul class="ne-timeline" style="margin:0;padding:0;max-height:260px;overflow-y:auto;overflow-x:hidden;'
        f'font-size:12px;color:{FG}">{"".join(items)}</ul>'
    )

"""The live dashboard under the cell: an ipywidgets view of an ``ElasticJob``.

A view only: it reads the job's state and calls the job's methods; the job never imports
it. Events mark sections dirty; one background thread re-renders what is dirty at most
``max_updates_per_s`` times a second, so a job reporting thousands of metrics a second
costs the kernel a few renders, not thousands. Actions (scale, stop, drills) run in a
thread of their own, with their control disabled until they return, so the kernel stays
responsive (``controls.py``). Closing the dashboard does not stop the job.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from ...contract.event_types import FINAL_STATUSES, Kind, Log
from ...contract.events import Event
from ...contract.job_state.records import Transition
from ...plumbing import log as _logging
from .controls import Controls
from .render import (
    chart_box,
    chart_metrics,
    chart_svg,
    header_html,
    legend_html,
    logs_html,
    offline_html,
    ranks_html,
    snapshot_html,
    timeline_html,
)

_log = _logging.get("kernel.ui.dashboard")

if TYPE_CHECKING:
    from ..job import ElasticJob

SECTIONS = ("header", "chart", "ranks", "timeline", "logs", "controls")
#: A status of the history older than this is not drawn again: a replay, not something the
#: job passed through between two frames.
HOLD_RECENT_S = 10.0
TWIN_EVERY_S = 2.0  # how stale the hidden static picture may get while only metrics move


class Dashboard(W.VBox):  # type: ignore[misc]  # VBox is Any to mypy: ipywidgets ships no types
    """``Dashboard(job)``: header, controls, loss chart, rank map, event timeline, output."""

    def __init__(self, job: ElasticJob, *, max_updates_per_s: float = 4.0, **kwargs: Any) -> None:
        self.job = job
        self.interval_s = 1.0 / max_updates_per_s
        self._dirty: set[str] = set(SECTIONS)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.renders = 0
        self._last_chart: tuple[tuple[Any, ...], str] = ((), "")  # (what it was drawn from, the SVG)
        # The status history's entry the header drew last: a status the job passed through
        # between two frames is drawn for one frame of its own (_status_to_draw).
        self._drawn_entry: Transition | None = job.state.transitions[-1] if job.state.transitions else None

        state = job.state
        self.header = W.HTML(layout=W.Layout(width="100%", margin="0"))
        self.offline = W.HTML(offline_html(job.name), layout=W.Layout(width="100%", margin="0"))
        self.progress = W.FloatProgress(
            value=0, min=0, max=1, description="", layout=W.Layout(width="100%", height="8px", margin="0")
        )
        # The buttons, slider and boxes with their actions; their widgets stay reachable here
        # under the names they always had (dash.range, dash.stop_button, ...).
        self.controls = Controls(job, self._mark)
        c = self.controls
        self.range, self.target, self.scale_button = c.range, c.target, c.scale_button
        self.nproc, self.max_restarts, self.start_button = c.nproc, c.max_restarts, c.start_button
        self.stop_button, self.kill_button, self.preempt_button = c.stop_button, c.kill_button, c.preempt_button
        self.message, self.setup, self.drills = c.message, c.setup, c.drills
        names = chart_metrics(state.metrics.names) or ["loss"]
        self.metric = W.Dropdown(
            options=names,
            value="loss" if "loss" in names else names[0],
            description="chart",
            layout=W.Layout(width="190px"),
        )
        self.log_scale = W.Checkbox(
            value=False, description="log scale", indent=False, layout=W.Layout(width="auto", margin="0 16px 0 8px")
        )
        self.smoothing = W.Dropdown(
            options=[("off", 0.0), ("light", 0.6), ("strong", 0.9)],
            value=0.0,
            description="smoothing",
            layout=W.Layout(width="170px"),
        )
        self.chart = W.HTML(layout=W.Layout(width="100%", margin="0"))
        self.legend = W.HTML(layout=W.Layout(width="100%", margin="0"))
        self.ranks = W.HTML(layout=W.Layout(width="100%", margin="0"))
        self.timeline = W.HTML(layout=W.Layout(width="100%", margin="0"))
        self.logs = W.HTML(layout=W.Layout(width="100%", margin="0"))
        # Whose output the pane shows; on Kubernetes the node picked is also followed live
        # (the follower holds a few pods' logs open at once: ElasticJob.follow_output).
        self.output_of = W.Dropdown(
            options=[("every node", "")], value="", description="output of", layout=W.Layout(width="260px")
        )
        self._output_choice = ""  # the user's pick (a new list of options resets the menu)
        # The last picture as static HTML, never shown: if the kernel dies while the job runs,
        # the JupyterLab extension copies it into the output's text/html twin, so a notebook
        # saved afterwards keeps the picture from when the kernel went, not the first one.
        self.twin = W.HTML(layout=W.Layout(display="none"))
        self.twin.add_class("ne-twin")
        self._twin_at = 0.0

        for control in (self.metric, self.log_scale, self.smoothing):
            control.observe(lambda _c: self._mark("chart"), names="value")
        self.output_of.observe(self._on_output_of, names="value")

        row = W.Layout(flex_flow="row wrap", align_items="center", width="100%", margin="0", overflow="hidden")
        controls_row = W.HBox(
            [self.range, self.target, self.scale_button, self.setup, self.stop_button, self.drills], layout=row
        )
        chart_tools = W.HBox([self.metric, self.log_scale, self.smoothing], layout=row)
        output = W.VBox([self.output_of, self.logs], layout=W.Layout(width="100%", margin="0"))
        bottom = W.Tab(children=[self.timeline, self.ranks, output], layout=W.Layout(width="100%", margin="0"))
        for i, title in enumerate(("events", "nodes", "output")):
            bottom.set_title(i, title)
        super().__init__(
            [
                self.offline,
                self.header,
                self.progress,
                controls_row,
                self.message,
                chart_tools,
                self.chart,
                self.legend,
                bottom,
                self.twin,
            ],
            layout=W.Layout(
                border="1px solid var(--jp-border-color2, #ddd)",
                padding="6px",
                width="100%",
                max_width="100%",
                overflow="hidden",
            ),
            **kwargs,
        )
        self.add_class("notebook-elastic-dashboard")
        self._render(set(SECTIONS))
        self._refresh_twin(force=True)
        # Set by whoever displayed it with a display_id: the output is re-published when the
        # job ends, so its text/html twin (what a saved notebook shows once the kernel is
        # gone) is the last picture, not the first.
        self.display_handle: Any = None
        self._published_status: str | None = job.status  # what the first display shows
        with self._lock:  # an event meanwhile waits for the loop to exist (_keep_drawing)
            self._thread = threading.Thread(target=self._loop, name=f"dashboard-{job.name}", daemon=True)
            self._unsubscribe: Callable[[], None] | None = job.on_event(self._on_event)
            self._thread.start()

    def _keep_drawing(self) -> None:
        """The render loop ends once the job has ended and its last picture is drawn; events
        after that are a resumed run (here, or from the CLI or the panel: the handle follows
        it): draw again (#39 item 3)."""
        with self._lock:
            if self._closed or self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._loop, name=f"dashboard-{self.job.name}", daemon=True)
            self._thread.start()

    # -- updates -------------------------------------------------------------------------

    def _on_event(self, event: Event, job: ElasticJob) -> None:
        k = event.kind
        with self._lock:
            if k == Kind.METRIC:
                self._dirty.update(("chart", "header"))
            elif k == Kind.LOG:
                self._dirty.add("logs")
            elif k == Kind.CHECKPOINT:
                self._dirty.add("header")  # nothing else shows it; the controls keep what is typed
            else:
                self._dirty.update(("header", "ranks", "timeline", "chart", "controls"))
        if k == Kind.JOB_FINISHED:
            self._wake.set()
        if k == Kind.JOB_RESUMED:
            self.controls.forget_done()
        self._keep_drawing()

    def _on_output_of(self, change: dict[str, Any]) -> None:
        if not self.controls.by_the_user():
            return
        self._output_choice = change["new"]
        try:
            self.job.follow_output(change["new"] or None)
        except Exception as exc:  # the node left meanwhile
            self.controls.say(str(exc), ok=False)
        self._mark("logs")

    def _mark(self, *sections: str) -> None:
        with self._lock:
            self._dirty.update(sections)
        self._wake.set()

    def _loop(self) -> None:
        last = 0.0
        while not self._closed:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            wait = self.interval_s - (time.monotonic() - last)
            if wait > 0:
                time.sleep(wait)
            with self._lock:
                dirty, self._dirty = self._dirty, set()
            if self.job.status not in FINAL_STATUSES or dirty:
                dirty.add("header")  # elapsed time moves on
            if dirty:
                try:
                    self._render(dirty)
                    self._refresh_twin(force="timeline" in dirty)
                except Exception:
                    traceback.print_exc()
                last = time.monotonic()
            self._publish_if_changed()
            if (
                self.job.finished
                and not self._dirty
                and self.job.status in FINAL_STATUSES
                and last
                and time.monotonic() - last > 1
            ):
                self._render(set(SECTIONS))
                self._publish_if_changed(force=True)
                break

    def _refresh_twin(self, force: bool = False) -> None:
        """Keep the hidden static picture current: at every change of what the timeline
        tells, else every TWIN_EVERY_S (it is a few KB through the comm)."""
        now = time.monotonic()
        if force or now - self._twin_at >= TWIN_EVERY_S:
            self._twin_at = now
            # In a <template>: inert, and out of the page's DOM (no second .ne-status to find).
            self._set(self.twin, "value", f'<template class="ne-twin-html">{self.snapshot()}</template>')

    def _publish_if_changed(self, force: bool = False) -> None:
        """Re-publish the output (widget view and its HTML twin) once the job has ended, so
        that a notebook saved afterwards keeps how it ended. Only then: a re-published
        widget view is drawn anew, which a person would notice at every status change."""
        status = self.job.status
        if self.display_handle is None or status == self._published_status:
            return
        if status not in FINAL_STATUSES and not force:
            return
        self._published_status = status
        try:
            self.display_handle.update(self)
        except Exception:
            _log.debug("the front end is gone: nothing to keep the picture in", exc_info=True)

    def _render(self, dirty: set[str]) -> None:
        job = self.job
        state = job.state
        held = False  # a status the job passed through is drawn: the next frame draws what followed
        with job.reading():
            if "header" in dirty:
                backend = getattr(job.backend, "name", "")
                status, held = self._status_to_draw()
                self._set(self.header, "value", header_html(job.name, backend, state, status=status))
                if state.total_steps:
                    self._set(self.progress, "value", min(1.0, (state.steps_done or 0) / state.total_steps))
            if "chart" in dirty:
                names = chart_metrics(state.metrics.names)
                if names and tuple(names) != tuple(self.metric.options):
                    current = (
                        self.metric.value if self.metric.value in names else ("loss" if "loss" in names else names[0])
                    )
                    self.metric.options = names
                    self.metric.value = current
                self._set(self.chart, "value", chart_box(self._chart(state)))
                self._set(
                    self.legend, "value", legend_html(state.markers, self.metric.value or "loss", self.smoothing.value)
                )
            if "ranks" in dirty:
                self._set(self.ranks, "value", ranks_html(state))
                options = [("every node", ""), *((n, n) for n in list(state.nodes))]
                if list(self.output_of.options) != options:
                    # ipywidgets resets the value with the options: put the user's pick back.
                    with self.controls.following_the_job():
                        self.output_of.options = options
                        choice = self._output_choice
                        self.output_of.value = choice if choice in state.nodes else ""
            if "timeline" in dirty:
                self._set(self.timeline, "value", timeline_html(state.events))
            if "logs" in dirty:
                node = self.output_of.value
                lines = [e for e in list(state.logs) if not node or e.node == node][-60:]
                self._set(self.logs, "value", logs_html([f"[{e.node}] {e.fields(Log).get('text')}" for e in lines]))
            if "controls" in dirty:
                self.controls.sync()
        if held:
            self._mark("header")
        self.renders += 1

    def _status_to_draw(self) -> tuple[str, bool]:
        """The status the header draws this frame: the job's, unless it passed through another
        since the last frame. A restart of 0.2 s falls between two frames at 4 a second and
        would never be seen; each status of the history is drawn for one frame, in order, then
        the present (in-place changes are not held: no status of theirs lasted). Call with the
        job's state read-locked. Returns the status, and whether it is a past one held for this
        frame (the header is then drawn again at the next)."""
        state = self.job.state
        entries = list(state.transitions)
        start = 0
        if self._drawn_entry is not None:
            for i in range(len(entries) - 1, -1, -1):
                if entries[i] is self._drawn_entry:
                    start = i + 1
                    break
            else:
                start = len(entries)  # rolled off the history: only the present is left to draw
        for i in range(start, len(entries)):
            entry = entries[i]
            self._drawn_entry = entry
            if entry.get("in_place") or float(entry["at"]) < time.time() - HOLD_RECENT_S:
                continue  # no status of its own lasted / history replayed (a resume, an attach)
            if i < len(entries) - 1 or entry["status"] != state.status:
                return str(entry["status"]), True
        return state.status, False

    def _chart(self, state: Any) -> str:
        """The chart's SVG; drawn again only when its points, markers or options changed."""
        metric = self.metric.value or "loss"
        series = state.metrics[metric] if metric in state.metrics else None
        key = (
            metric,
            len(series.values) if series else 0,
            len(state.markers),
            self.log_scale.value,
            self.smoothing.value,
            state.finished,
        )
        if key != self._last_chart[0]:
            if series is None:
                # Ended without one: the cell never reported it (a newcomer waited on "waiting for loss…").
                told = f"no {metric} was reported: the cell's elastic.report({metric}=...) draws it here"
                svg = chart_svg([], [], metric=metric, empty=told if state.finished else None)
            else:
                svg = chart_svg(
                    series.steps,
                    series.values,
                    state.markers,
                    metric=metric,
                    last_report_t=series.times[-1] if len(series.times) else None,
                    log_scale=self.log_scale.value,
                    smoothing=self.smoothing.value,
                )
            self._last_chart = (key, svg)
        return self._last_chart[1]

    @staticmethod
    def _set(widget: W.Widget, name: str, value: Any) -> None:
        if getattr(widget, name) != value:
            setattr(widget, name, value)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the view; the job goes on."""
        self._closed = True
        self._wake.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        super().close()

    def snapshot(self) -> str:
        """The current picture as static HTML (header, chart, legend, events), marked as a
        picture of a kernel that is gone: what a notebook without live widget models shows."""
        job, state = self.job, self.job.state
        with job.reading():
            return snapshot_html(
                job.name,
                getattr(job.backend, "name", ""),
                state,
                chart_box(self._chart(state)),
                legend_html(state.markers, self.metric.value or "loss", self.smoothing.value),
                timeline_html(state.events, limit=12),
            )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        # Beside the widget view: a text/html twin for front ends (and saved notebooks)
        # without the live models, and the summary as text.
        bundle: dict[str, Any] = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.job.summary()
        bundle["text/html"] = self.snapshot()
        return bundle

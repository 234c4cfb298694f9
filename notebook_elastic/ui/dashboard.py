"""The live dashboard under the cell: an ipywidgets view of an ``ElasticJob``.

A view only: it reads the job's state and calls the job's methods; the job never imports
it. Events mark sections dirty; one background thread re-renders what is dirty at most
``max_updates_per_s`` times a second, so a job reporting thousands of metrics a second
costs the kernel a few renders, not thousands. Actions (scale, stop, drills) run in a
thread of their own, with their control disabled until they return, so the kernel stays
responsive. Closing the dashboard does not stop the job.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from ..events import FINAL_STATUSES, Event, Kind
from .render import chart_svg, header_html, logs_html, ranks_html, timeline_html

if TYPE_CHECKING:
    from ..job import ElasticJob

SECTIONS = ("header", "chart", "ranks", "timeline", "logs", "controls")


class Dashboard(W.VBox):
    """``Dashboard(job)``: header, controls, loss chart, rank map, event timeline, output."""

    def __init__(self, job: ElasticJob, *, max_updates_per_s: float = 4.0, **kwargs: Any) -> None:
        self.job = job
        self.interval_s = 1.0 / max_updates_per_s
        self._dirty: set[str] = set(SECTIONS)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._busy: set[str] = set()
        self.renders = 0
        self._last_chart_state: tuple = ()

        state = job.state
        lo, hi = state.nnodes
        self.header = W.HTML(layout=W.Layout(width="100%"))
        self.progress = W.FloatProgress(
            value=0, min=0, max=1, description="", layout=W.Layout(width="100%", height="14px")
        )
        self.progress_text = W.HTML()
        self.range = W.IntRangeSlider(
            value=(lo, hi),
            min=1,
            max=max(8, 2 * hi),
            step=1,
            description="replicas",
            continuous_update=False,
            layout=W.Layout(width="340px"),
        )
        self.target = W.BoundedIntText(
            value=state.target, min=lo, max=hi, description="nodes", layout=W.Layout(width="150px")
        )
        self.scale_button = W.Button(
            description="Scale", tooltip="run on this many nodes", layout=W.Layout(width="70px")
        )
        nproc = job.spec.nproc_per_node if job.spec else (state.nproc_per_node or 1)
        self.nproc = W.BoundedIntText(
            value=nproc, min=1, max=256, description="procs/node", layout=W.Layout(width="160px")
        )
        self.max_restarts = W.BoundedIntText(
            value=state.max_restarts, min=0, max=10_000, description="max restarts", layout=W.Layout(width="170px")
        )
        self.start_button = W.Button(
            description="Start", button_style="success", icon="play", layout=W.Layout(width="90px")
        )
        self.stop_button = W.Button(
            description="Stop", button_style="danger", icon="stop", layout=W.Layout(width="120px")
        )
        self.kill_button = W.Button(
            description="Kill a worker",
            icon="bolt",
            tooltip="drill: SIGKILL one worker process",
            layout=W.Layout(width="130px"),
        )
        self.preempt_button = W.Button(
            description="Preempt a node",
            icon="cloud",
            tooltip="drill: take a node away (SIGTERM to its agent)",
            layout=W.Layout(width="140px"),
        )
        self.message = W.HTML(layout=W.Layout(min_height="18px"))
        names = sorted(state.metrics.names) or ["loss"]
        self.metric = W.Dropdown(
            options=names,
            value="loss" if "loss" in names else names[0],
            description="metric",
            layout=W.Layout(width="220px"),
        )
        self.chart = W.HTML()
        self.ranks = W.HTML(layout=W.Layout(width="100%"))
        self.timeline = W.HTML(layout=W.Layout(width="100%"))
        self.logs = W.HTML(layout=W.Layout(width="100%"))

        self.range.observe(self._on_range, names="value")
        self.scale_button.on_click(lambda _b: self._act("scale", self.scale_button, self._scale))
        self.start_button.on_click(lambda _b: self._act("start", self.start_button, self._start))
        self.stop_button.on_click(self._on_stop)
        self.kill_button.on_click(lambda _b: self._act("kill", self.kill_button, self._kill))
        self.preempt_button.on_click(lambda _b: self._act("preempt", self.preempt_button, self._preempt))
        self.metric.observe(lambda _c: self._mark("chart"), names="value")
        self._stop_armed_until = 0.0
        self._synced_target = state.target

        controls = W.VBox(
            [
                W.HBox([self.range, self.target, self.scale_button, self.nproc, self.max_restarts]),
                W.HBox([self.start_button, self.stop_button, self.kill_button, self.preempt_button, self.message]),
            ]
        )
        left = W.VBox([self.metric, self.chart], layout=W.Layout(width="580px"))
        right = W.VBox([W.HTML("<b>ranks</b>"), self.ranks], layout=W.Layout(flex="1 1 auto", min_width="280px"))
        body = W.HBox([left, right], layout=W.Layout(width="100%", flex_flow="row wrap"))
        bottom = W.Tab(children=[self.timeline, self.logs])
        bottom.set_title(0, "events")
        bottom.set_title(1, "output")
        super().__init__(
            [self.header, W.HBox([self.progress, self.progress_text]), controls, body, bottom],
            layout=W.Layout(border="1px solid #ddd", padding="6px", width="100%"),
            **kwargs,
        )
        self.add_class("notebook-elastic-dashboard")
        self._render(set(SECTIONS))
        self._unsubscribe: Callable[[], None] | None = job.on_event(self._on_event)
        self._thread = threading.Thread(target=self._loop, name=f"dashboard-{job.name}", daemon=True)
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
                except Exception:
                    traceback.print_exc()
                last = time.monotonic()
            if (
                self.job.finished
                and not self._dirty
                and self.job.status in FINAL_STATUSES
                and last
                and time.monotonic() - last > 1
            ):
                self._render(set(SECTIONS))
                break

    def _render(self, dirty: set[str]) -> None:
        job = self.job
        state = job.state
        with job._lock:
            if "header" in dirty:
                backend = getattr(job.backend, "name", "")
                self._set(self.header, "value", header_html(job.name, backend, state))
                if state.total_steps:
                    done = (state.step + 1) if state.step is not None else 0
                    self._set(self.progress, "value", min(1.0, done / state.total_steps))
                    self._set(
                        self.progress_text,
                        "value",
                        f"<span style='font-size:12px;white-space:nowrap'>&nbsp;{done} / {state.total_steps}</span>",
                    )
            if "chart" in dirty:
                names = sorted(state.metrics.names)
                if names and tuple(names) != tuple(self.metric.options):
                    current = (
                        self.metric.value if self.metric.value in names else ("loss" if "loss" in names else names[0])
                    )
                    self.metric.options = names
                    self.metric.value = current
                metric = self.metric.value or "loss"
                if metric in state.metrics:
                    series = state.metrics[metric]
                    steps, values, times = series.steps, series.values, series.times
                    key = (metric, len(values), len(state.markers))
                    if key != self._last_chart_state:
                        self._last_chart_state = key
                        svg = chart_svg(
                            steps, values, state.markers, metric=metric, last_report_t=times[-1] if len(times) else None
                        )
                        self._set(self.chart, "value", svg)
                elif not self.chart.value:
                    self._set(self.chart, "value", chart_svg([], [], metric=metric))
            if "ranks" in dirty:
                self._set(self.ranks, "value", ranks_html(state))
            if "timeline" in dirty:
                self._set(self.timeline, "value", timeline_html(state.events))
            if "logs" in dirty:
                self._set(
                    self.logs, "value", logs_html([f"[{e.node}] {e.get('text')}" for e in list(state.logs)[-60:]])
                )
            if "controls" in dirty:
                self._sync_controls()
        self.renders += 1

    @staticmethod
    def _set(widget: W.Widget, name: str, value: Any) -> None:
        if getattr(widget, name) != value:
            setattr(widget, name, value)

    def _sync_controls(self) -> None:
        job, state = self.job, self.job.state
        prepared = job.status == "prepared"
        live = not job.finished and not prepared
        lo, hi = state.nnodes
        with self.range.hold_trait_notifications():
            if "range" not in self._busy and tuple(self.range.value) != (lo, hi):
                self._quiet_range = True
                self.range.value = (lo, hi)
                self._quiet_range = False
        if "scale" not in self._busy:
            t = self.target
            if lo > t.max:  # keep min <= max at every step
                t.max, t.min = hi, lo
            else:
                t.min, t.max = lo, hi
            # Only a change of the job's own target moves the box: a number the user is typing
            # stays until they press Scale, whatever else the job reports meanwhile.
            if state.target is not None and lo <= state.target <= hi and state.target != self._synced_target:
                t.value = state.target
                self._synced_target = state.target
        self.range.disabled = not (live or prepared) or "range" in self._busy
        self.target.disabled = not (live or prepared) or "scale" in self._busy
        self.scale_button.disabled = not live or "scale" in self._busy
        self.nproc.disabled = not prepared
        self.max_restarts.disabled = not prepared
        self.start_button.disabled = not prepared or "start" in self._busy
        self.stop_button.disabled = job.finished or "stop" in self._busy
        self.kill_button.disabled = not live or "kill" in self._busy
        self.preempt_button.disabled = not live or "preempt" in self._busy

    # -- actions -------------------------------------------------------------------------

    def _say(self, text: str, ok: bool = True) -> None:
        color = "#2e7d32" if ok else "#c62828"
        self.message.value = f"<span class='ne-message' style='color:{color};font-size:12px'>{text}</span>"

    def _act(self, name: str, widget: W.Widget | None, action: Callable[[], str]) -> None:
        """Run ``action`` in a thread; its control stays disabled until it returns."""
        if name in self._busy:
            return
        self._busy.add(name)
        if widget is not None:
            widget.disabled = True
        self._say(f"{name}…")

        def run() -> None:
            try:
                self._say(action())
            except Exception as exc:
                self._say(str(exc), ok=False)
            finally:
                self._busy.discard(name)
                self._mark("controls", "header", "ranks")

        threading.Thread(target=run, name=f"dashboard-{name}", daemon=True).start()

    _quiet_range = False

    def _on_range(self, change: dict) -> None:
        if self._quiet_range:
            return
        lo, hi = change["new"]
        if self.job.status == "prepared":
            self.job.configure(nnodes=(lo, hi))
            self._mark("controls", "header")
            return
        self._act("range", self.range, lambda: self._set_range(lo, hi))

    def _set_range(self, lo: int, hi: int) -> str:
        result = self.job.set_range(lo, hi)
        return f"range {lo}:{hi}" + (" (agents restarted with the new range)" if result.get("reconfigured") else "")

    def _scale(self) -> str:
        n = int(self.target.value)
        self.job.scale(n)
        return f"scaling to {n} node(s)"

    def _start(self) -> str:
        self.job.configure(nproc_per_node=int(self.nproc.value), max_restarts=int(self.max_restarts.value))
        self.job.start()
        return "started"

    def _kill(self) -> str:
        r = self.job.kill_worker()
        return f"killed rank {r['rank']} (pid {r['pid']}) on {r['node']}"

    def _preempt(self) -> str:
        r = self.job.preempt_node()
        return f"preempted {r['node']}"

    def _on_stop(self, _button: W.Button) -> None:
        # One confirmation, once: the first click arms the button for five seconds.
        now = time.monotonic()
        if now > self._stop_armed_until:
            self._stop_armed_until = now + 5
            self.stop_button.description = "Confirm stop"
            self._say("click again to stop the job and all its processes", ok=True)
            threading.Timer(5.0, self._disarm_stop).start()
            return
        self._stop_armed_until = 0.0
        self.stop_button.description = "Stop"
        self._act("stop", self.stop_button, lambda: f"job {self.job.stop()}")

    def _disarm_stop(self) -> None:
        if time.monotonic() >= self._stop_armed_until and self.stop_button.description == "Confirm stop":
            self.stop_button.description = "Stop"

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the view; the job goes on."""
        self._closed = True
        self._wake.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        super().close()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.job.summary()
        return bundle

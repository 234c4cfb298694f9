"""The dashboard's controls: kept in step with the job (range, target, what is enabled in
which state) and their actions (scale, range, start, stop with one confirmation, drills),
each run in a thread of its own with its control disabled until it returns, so the kernel
stays responsive. Held by ``Dashboard``, which lays the widgets out and asks them to follow
the job when it renders."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import ipywidgets as W

from ...contract.event_types import Status

if TYPE_CHECKING:
    from ...contract.job_state import JobState
    from ..job import ElasticJob

MESSAGE_FADES_S = 10.0  # how long what an action did stays under the buttons
STOP_CONFIRM_S = 5.0  # how long Stop waits for its confirming click
STOP_HINT = "click Confirm stop within 5 s to stop the job and all its processes"
#: What a word under the buttons says by its colour: done, a question waiting, gone wrong.
MESSAGE_COLORS = {"ok": "#2e7d32", "ask": "#e65100", "error": "#c62828"}


def slider_max(state: JobState, hi: int) -> int:
    """How far the replicas slider goes: on GPUs, no further than one GPU per rank allows."""
    if state.gpus and state.nproc_per_node:
        return max(hi, state.gpus // state.nproc_per_node)
    return max(8, 2 * hi)


class Mark(Protocol):
    """Asks the dashboard to draw these sections again (``Dashboard._mark``)."""

    def __call__(self, *sections: str) -> None: ...


class Controls:
    """The dashboard's buttons, sliders and boxes, as the job's state allows them."""

    def __init__(self, job: ElasticJob, mark: Mark) -> None:
        self.job = job
        self._mark = mark
        self._syncing: int | None = None  # the thread now moving the controls to the job's values
        self._busy: set[str] = set()  # actions in flight, by name: their controls stay disabled
        self._stop_armed_until = 0.0  # Stop's one confirmation: a second click before this stops
        self.stop_confirm_s = STOP_CONFIRM_S
        state = job.state
        lo, hi = state.nnodes
        self._synced_target = state.target  # the job's target the nodes box last moved to

        self.range = W.IntRangeSlider(
            value=(lo, hi),
            min=1,
            max=slider_max(state, hi),
            step=1,
            description="range",
            tooltip="how many nodes the job may run on (min:max)",
            continuous_update=False,
            layout=W.Layout(width="230px"),
        )
        self.target = W.BoundedIntText(
            value=state.target, min=lo, max=hi, description="nodes", layout=W.Layout(width="120px")
        )
        self.scale_button = W.Button(
            description="Scale", tooltip="run on this many nodes", layout=W.Layout(width="auto")
        )
        nproc = job.spec.nproc_per_node if job.spec else (state.nproc_per_node or 1)
        self.nproc = W.BoundedIntText(
            value=nproc, min=1, max=256, description="procs/node", layout=W.Layout(width="150px")
        )
        self.max_restarts = W.BoundedIntText(
            value=state.max_restarts, min=0, max=10_000, description="max restarts", layout=W.Layout(width="160px")
        )
        self.start_button = W.Button(
            description="Start", button_style="success", icon="play", layout=W.Layout(width="auto")
        )
        self.stop_button = W.Button(
            description="Stop", button_style="danger", icon="stop", layout=W.Layout(width="auto")
        )
        self.kill_button = W.Button(
            description="Kill a worker",
            icon="bolt",
            tooltip="drill: SIGKILL one worker process",
            layout=W.Layout(width="auto"),
        )
        self.preempt_button = W.Button(
            description="Preempt a node",
            icon="cloud",
            tooltip="drill: take a node away with 30 s notice, as a spot reclaim: the job saves first, then it goes",
            layout=W.Layout(width="auto"),
        )
        self.message = W.HTML(layout=W.Layout(min_height="18px"))
        self._message_lock = threading.Lock()
        self._asking = ""  # a question waiting on the user (Stop's confirmation), shown first
        self._told = ""  # what the latest action did or what went wrong
        # What shapes a job before it starts: shown only while it is prepared.
        self.setup = W.HBox([self.nproc, self.max_restarts, self.start_button], layout=W.Layout(flex_flow="row wrap"))
        self.drills = W.HBox([self.kill_button, self.preempt_button], layout=W.Layout(flex_flow="row wrap"))

        self.range.observe(self._on_range, names="value")
        self.scale_button.on_click(lambda _b: self._act("scale", self.scale_button, self._scale))
        self.start_button.on_click(lambda _b: self._act("start", self.start_button, self._start))
        self.stop_button.on_click(self._on_stop)
        self.kill_button.on_click(lambda _b: self._act("kill", self.kill_button, self._kill))
        self.preempt_button.on_click(lambda _b: self._act("preempt", self.preempt_button, self._preempt))

    @contextlib.contextmanager
    def following_the_job(self) -> Iterator[None]:
        """Controls changed in this block follow the job: their observers, which act for the
        user, let changes made on this thread pass (``by_the_user``)."""
        self._syncing = threading.get_ident()
        try:
            yield
        finally:
            self._syncing = None

    def by_the_user(self) -> bool:
        """Whether a widget's change came from the user, not from ``following_the_job``."""
        return self._syncing != threading.get_ident()

    def sync(self) -> None:
        """Move the controls to the job's values and enable or show what its state allows."""
        job, state = self.job, self.job.state
        prepared = job.status == Status.PREPARED
        live = not job.finished and not prepared
        lo, hi = state.nnodes
        # Held notifications fire when the block ends: the whole block is "ours", so the
        # slider's own observer does not echo the job's new range back as a user's set_range
        # (on Kubernetes that restarted every agent of a job a dashboard was merely opened on).
        with self.following_the_job(), self.range.hold_trait_notifications():
            if "range" not in self._busy and tuple(self.range.value) != (lo, hi):
                self.range.value = (lo, hi)
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
        # Only the controls this job can use are shown: set-up before the start, drills while
        # it runs, nothing but the picture once it ended.
        self.setup.layout.display = None if prepared else "none"
        self.drills.layout.display = None if live else "none"
        self.stop_button.layout.display = None if not job.finished else "none"
        for control in (self.range, self.target, self.scale_button):
            control.layout.display = None if (live or prepared) else "none"
        self.start_button.disabled = not prepared or "start" in self._busy
        self.stop_button.disabled = job.finished or "stop" in self._busy
        self.kill_button.disabled = not live or "kill" in self._busy
        self.preempt_button.disabled = not live or "preempt" in self._busy

    def say(self, text: str, ok: bool = True, *, fades: bool = False, tone: str | None = None) -> None:
        """A word under the buttons. What an action did (``fades``) goes after a while, once the
        header and the timeline tell its effect ("scaling to 2 node(s)" under the buttons long
        after the job grew read as still in progress); what went wrong stays until replaced.
        ``tone``: "ask" for a question waiting on the user (amber, not the green of done). A
        question stays first while it waits: the late answer of an earlier action (a range change
        whose agents took their time to restart) is said beside it, never in its place, or the
        user clicks "Confirm stop" with nothing saying what it does."""
        tone = tone or ("ok" if ok else "error")
        color = MESSAGE_COLORS[tone]
        span = f"<span class='ne-message' data-tone='{tone}' style='color:{color};font-size:12px'>{text}</span>"
        with self._message_lock:
            if tone == "ask":
                self._asking = span
            else:
                self._told = span
            self._show_message()
        if fades:

            def fade() -> None:
                with self._message_lock:
                    if self._told == span:
                        self._told = ""
                        self._show_message()

            timer = threading.Timer(MESSAGE_FADES_S, fade)
            timer.daemon = True
            timer.start()

    def _show_message(self) -> None:
        self.message.value = " ".join(part for part in (self._asking, self._told) if part)

    def _stop_asking(self) -> None:
        with self._message_lock:
            if self._asking:
                self._asking = ""
                self._show_message()

    def forget_done(self) -> None:
        """What an action did is over (the job was resumed, here or elsewhere): "job stopped"
        under the buttons of a running job read as its present."""
        with self._message_lock:
            if "data-tone='ok'" in self._told:
                self._told = ""
                self._show_message()

    def _act(self, name: str, widget: W.Widget | None, action: Callable[[], str]) -> None:
        """Run ``action`` in a thread; its control stays disabled until it returns."""
        if name in self._busy:
            return
        self._busy.add(name)
        if widget is not None:
            widget.disabled = True
        self.say(f"{name}…")

        def run() -> None:
            try:
                self.say(action(), fades=True)
            except Exception as exc:
                self.say(str(exc), ok=False)
            finally:
                self._busy.discard(name)
                self._mark("controls", "header", "ranks")

        threading.Thread(target=run, name=f"dashboard-{name}", daemon=True).start()

    def _on_range(self, change: dict[str, Any]) -> None:
        if not self.by_the_user():
            return
        lo, hi = change["new"]
        if self.job.status == Status.PREPARED:
            self.job.configure(nnodes=(lo, hi))
            self._mark("controls", "header")
            return
        self._act("range", self.range, lambda: self._set_range(lo, hi))

    def _set_range(self, lo: int, hi: int) -> str:
        answer = self.job.set_range(lo, hi)
        said = f"range {lo}:{hi}" + (" (agents restarted with the new range)" if answer.reconfigured else "")
        return f"{said}; {answer.pending}" if answer.pending else said

    def _scale(self) -> str:
        n = int(self.target.value)
        answer = self.job.scale(n)
        return f"scaling to {n} node(s); {answer.pending}" if answer.pending else f"scaling to {n} node(s)"

    def _start(self) -> str:
        self.job.configure(nproc_per_node=int(self.nproc.value), max_restarts=int(self.max_restarts.value))
        self.job.start()
        return "started"

    def _kill(self) -> str:
        killed = self.job.kill_worker()
        return f"killed rank {killed.rank} (pid {killed.pid}) on {killed.node}"

    def _preempt(self) -> str:
        taken = self.job.preempt_node()
        if taken.grace_s:
            return f"preempting {taken.node} with {taken.grace_s:g} s notice: the job saves first"
        return f"preempted {taken.node}"

    def _on_stop(self, _button: W.Button) -> None:
        # One confirmation, once: the first click arms the button for a few seconds; the hint
        # lives exactly as long (#39 item 8: it outlived the arming, and clicking as it said
        # only armed the button again).
        now = time.monotonic()
        if now > self._stop_armed_until:
            self._stop_armed_until = now + self.stop_confirm_s
            self.stop_button.description = "Confirm stop"
            self.say(STOP_HINT.replace("5 s", f"{self.stop_confirm_s:g} s"), tone="ask")
            timer = threading.Timer(self.stop_confirm_s, self._disarm_stop)
            timer.daemon = True
            timer.start()
            return
        self._stop_armed_until = 0.0
        self.stop_button.description = "Stop"
        self._stop_asking()
        self._act("stop", self.stop_button, lambda: f"job {self.job.stop()}")

    def _disarm_stop(self) -> None:
        if time.monotonic() >= self._stop_armed_until and self.stop_button.description == "Confirm stop":
            self.stop_button.description = "Stop"
            self._stop_asking()

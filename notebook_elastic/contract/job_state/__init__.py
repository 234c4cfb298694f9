"""Job state as a fold over events: status, membership, ranks, restarts, metrics, progress.

``JobState.apply(event)`` is the only way state changes, so a job re-attached from a new
kernel replays its event log into exactly the state the old kernel had. Used by the
notebook side (``ElasticJob``) and by the local supervisor (for ``status.json``). Pure: no
I/O, no threads (callers lock).

Its parts: ``records.py`` (nodes, ranks, markers, metrics), ``handlers.py`` (``Fold``: what
each event kind does, held by ``JobState``), ``failures.py`` (failures in words).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, cast

from ...runtime.tracking import tracking_text
from ..event_types import FINAL_STATUSES, Gpu, InPlace, Kind, Metric, NodeLeft, Stall, Status, Tracking, WorkerStarted
from ..events import Event, describe, format_duration, sig, steps_done
from .failures import OUT_OF_MEMORY, budget_spent_reason, describe_failure, first_failure
from .handlers import Fold
from .records import (
    SAVING_MEASURED_S,
    JobSummary,
    Marker,
    Metrics,
    MetricSeries,
    NodeInfo,
    RankInfo,
    RunClock,
    SavingClock,
    Transition,
    summary_of,
)

# The fold, and the names that were defined here before its parts moved out (still imported from here).
__all__ = [
    "FOLDED_FIELDS",
    "OUT_OF_MEMORY",
    "ROOT_WINDOW_S",
    "SYMPTOMS",
    "JobState",
    "JobSummary",
    "Marker",
    "MetricSeries",
    "Metrics",
    "NodeInfo",
    "RankInfo",
    "RunClock",
    "SAVING_MEASURED_S",
    "SavingClock",
    "Transition",
    "budget_spent_reason",
    "describe_failure",
    "elapsed_s",
    "first_failure",
    "summary_of",
    "summary_text",
    "with_fold",
]

# Events that tell why workers stop: listed under a restart in its transition.
SYMPTOMS = frozenset(
    {
        Kind.WORKER_FAILED,
        Kind.WORKER_EXITED,
        Kind.PEER_LOST,
        Kind.RESTART,
        Kind.AGENT_SIGNALED,
        Kind.NODE_LEFT,
        Kind.FAULT,
    }
)
ROOT_WINDOW_S = 10.0  # a drill or a departure this long before a restart is its cause
#: A restarting entry this long before a change in place began (its in_place event's time less
#: the time its ranks went without a group) is not that change's.
CHANGE_SLACK_S = 2.0


def _is_root_cause(e: Event) -> bool:
    """A drill, or a node that went away: what explains a survivor's "connection closed"."""
    return e.kind == Kind.FAULT or (
        e.kind == Kind.NODE_LEFT and e.fields(NodeLeft).get("reason") not in ("finished", "stopped")
    )


class JobState:
    """Everything known about a job, folded from its events."""

    def __init__(self, *, max_restarts: int = 0, nnodes: tuple[int, int] = (1, 1), target: int | None = None) -> None:
        self.status: str = Status.PENDING  # a Status
        self.reason: str | None = None
        self.waiting: str | None = None  # why capacity the job asked for is not coming
        self.waiting_node: str | None = None  # the node ``waiting`` is about (a pod, an allocation), if one
        self.held_by_queue = False  # Kueue evicted it and has not admitted it again (--queue)
        self.max_restarts = max_restarts
        self.nnodes = cast("tuple[int, int]", tuple(nnodes))  # (min, max), a tuple whatever sequence came
        self.target = target if target is not None else nnodes[0]
        self.nproc_per_node: int | None = None
        self.gpus = 0  # GPUs the job may place its ranks on (0: a CPU job)
        self.grace_s: float | None = None  # Kubernetes: a pod's grace between SIGTERM and SIGKILL (--grace)
        self.stall: Stall | None = None  # the stall in progress: step, stopped, waiting
        self.warning: str | None = None  # a condition the job trains on through (a full disk)
        self.nodes: dict[str, NodeInfo] = {}
        self.world_size = 0
        self.generation: int | None = None
        self.round: int | None = None
        self.restarts = 0  # worker-failure restarts, the most any agent used
        self.resumes = 0  # job_resumed events folded: runs continued after an outcome (or a loss)
        self.membership_changes = 0
        self.in_place_changes = 0  # of which the workers kept their processes (runtime/inplace.py)
        self.metrics = Metrics()  # rank 0's: the one loss every view shows (chart, header, jobs, panel)
        # The other ranks' latest values (report(all_ranks=True)): rank -> {name: value}, on demand.
        self.rank_values: dict[int, dict[str, Any]] = {}
        self.events: list[Event] = []  # everything but metrics and logs
        self.logs: deque[Event] = deque(maxlen=2000)
        self.markers: list[Marker] = []
        self.failures: list[Event] = []  # worker_failed events, oldest first
        self.total_steps: int | None = None
        self.step: int | None = None  # the latest step seen (metric or checkpoint)
        # How the job saves: {"every": steps between saves, "chosen": by State or given,
        # "blocked_pct": share of the loop commit() blocked}, from the latest checkpoint event.
        self.checkpointing: dict[str, Any] | None = None
        self.saving = SavingClock()  # the share of the loop State's commits blocked, over the job
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.first_step_at: float | None = None
        self.last_event_at: float | None = None
        self.runs = RunClock()  # how long it ran, its stopped spells left out
        self.dropped_events = 0  # events the fold could not take (malformed), dropped
        self.last_dropped: str | None = None
        # Status changes with their time and cause, newest last: a restart that heals in
        # less than a poll interval still shows in the jobs panel.
        self.transitions: deque[Transition] = deque(maxlen=16)
        self._last_root: Event | None = None
        self._in_place_started: float | None = None  # the first rank training in a change in place
        self._rates: deque[tuple[float, float]] = deque(maxlen=64)
        self.samples_per_step: float | None = None  # the data cursor's global batch, or reported samples=
        self.tokens_per_step: float | None = None  # reported tokens=
        self.gpu: dict[int, Gpu] = {}  # rank -> its latest gpu event's figures
        self.tracking: dict[str, Tracking] = {}  # tracker -> where its run is (tracking events)
        self._fold = Fold(self)  # what each event kind does to the attributes above

    # -- derived -------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def running_nodes(self) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if n.status != "left"]

    @property
    def steps_done(self) -> int | None:
        """The steps done, as every view counts them: the latest step index reported + 1 (a
        100-step loop's last report says 99; the dashboard, the panel, the CLI and the summary
        say 100/100). ``step`` stays the index the ranks reported."""
        return steps_done(self.step)

    def ran_s(self, now: float | None = None) -> float | None:
        """Seconds the job ran: every run from its start to its outcome, up to ``now`` while it
        runs; the time it sat stopped, failed or lost before a resume is not counted."""
        if self.started_at is None:
            return None
        now = time.time() if now is None else now
        if not self.runs.runs:  # no start told (a history from its first worker): one run
            return max(0.0, (self.finished_at or now) - self.started_at)
        return self.runs.ran_s(now)

    @property
    def steps_per_s(self) -> float | None:
        if len(self._rates) < 2:
            return None
        (t0, s0), (t1, s1) = self._rates[0], self._rates[-1]
        if t1 - t0 <= 0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)

    @property
    def step_time_s(self) -> float | None:
        """Seconds per step: the median over the recent steps (a restart's gap is an outlier)."""
        per_step = []
        pairs = list(self._rates)
        for (t0, s0), (t1, s1) in zip(pairs, pairs[1:]):
            if s1 > s0 and t1 >= t0:
                per_step.append((t1 - t0) / (s1 - s0))
        if not per_step:
            return None
        per_step.sort()
        return per_step[len(per_step) // 2]

    def _throughput(self, per_step: float | None) -> float | None:
        step_s = self.step_time_s
        return per_step / step_s if per_step and step_s else None

    @property
    def samples_per_s(self) -> float | None:
        return self._throughput(self.samples_per_step)

    @property
    def tokens_per_s(self) -> float | None:
        return self._throughput(self.tokens_per_step)

    @property
    def gpu_ranks(self) -> list[Gpu]:
        """The GPU figures of the ranks of the current world, by rank (empty on CPU)."""
        return [self.gpu[r] for r in sorted(self.gpu) if r < max(self.world_size, 1)]

    @property
    def eta_s(self) -> float | None:
        rate = self.steps_per_s
        if rate is None or self.total_steps is None or self.step is None:
            return None
        return max(0.0, (self.total_steps - 1 - self.step) / rate)

    @property
    def first_failure(self) -> Event | None:
        return first_failure(self.failures)

    def summary(self) -> JobSummary:
        """A small JSON-able digest (status.json, the jobs panel, %elastic_jobs)."""
        loss = self.metrics.last("loss")
        tail: list[float] = []
        if "loss" in self.metrics:
            values = self.metrics["loss"].values
            recent = values[-240:]
            stride = max(1, len(recent) // 60)
            tail = [round(v, 6) for v in recent[::stride]]
        return {
            "loss_tail": tail,
            "status": self.status,
            "reason": self.reason,
            "waiting": self.waiting,
            "stall": self.stall,
            "warning": self.warning,
            "world_size": self.world_size,
            "nodes_running": len(self.running_nodes),
            "target": self.target,
            "min_nodes": self.nnodes[0],
            "max_nodes": self.nnodes[1],
            "restarts": self.restarts,
            "max_restarts": self.max_restarts,
            "resumes": self.resumes,
            "step": self.step,
            "total_steps": self.total_steps,
            "loss": loss,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "ran_s": self.ran_s(),
            "generation": self.generation,
            "transitions": list(self.transitions)[-8:],
            "nodes": [n.to_json() for n in self.nodes.values()],
            "step_time_s": self.step_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            **({"gpu": self.gpu_ranks} if self.gpu_ranks else {}),
            **({"tracking": list(self.tracking.values())} if self.tracking else {}),
        }

    # -- the fold ------------------------------------------------------------------------

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, e: Event) -> None:
        """Fold one event. Workers may send anything: an event the fold cannot take is counted
        in ``dropped_events`` and dropped, never fatal to whoever folds (the supervisor)."""
        try:
            self._apply(e)
        except Exception as exc:
            self.dropped_events += 1
            self.last_dropped = f"{getattr(e, 'kind', '?')}: {type(exc).__name__}: {exc}"[:300]

    def _apply(self, e: Event) -> None:
        previous_at, self.last_event_at = self.last_event_at, e.time
        k = e.kind
        if k in (Kind.JOB_SUBMITTED, Kind.JOB_RESUMED):
            self.runs.start(e.time, previous_at)
        elif k == Kind.JOB_FINISHED:
            self.runs.end(e.time)
        if k == Kind.METRIC:
            d = e.fields(Metric)
            step = d.get("step")
            rank = d.get("rank")
            if rank not in (None, 0):  # every rank reports (all_ranks=True): the chart is rank 0's
                self.rank_values[int(rank)] = dict(d.get("values") or {})
            else:
                self.metrics.add(step if step is not None else self.metrics.count, d.get("values") or {}, e.time)
                self.saving.observe(d.get("blocked_s"), d.get("loop_s"))
            if isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step):
                self._saw_step(int(step), e.time)
            values = d.get("values") or {}
            samples = values.get("samples", d.get("samples_per_step"))
            if isinstance(samples, (int, float)) and samples > 0:
                self.samples_per_step = float(samples)
            if isinstance(values.get("tokens"), (int, float)) and values["tokens"] > 0:
                self.tokens_per_step = float(values["tokens"])
            return
        if k == Kind.LOG:
            self.logs.append(e)
            return
        if k == Kind.GPU:  # a figure, every few seconds per rank: not history
            self._fold.apply(e)
            return
        self.events.append(e)
        before = self.status
        self._fold.apply(e)
        if self.held_by_queue and self.status == Status.RESTARTING:
            self.status = Status.PENDING  # its pods going is Kueue's eviction: it waits for quota, not a restart
        self._track_transition(e, before)

    def _track_transition(self, e: Event, before: str) -> None:
        """Record a status change; a restart gets its root cause and what else happened in it.

        The event that flips a job to restarting is often a symptom (the survivor's
        "connection closed by peer"); a drill or a departure just before or during the
        restart is named as its cause instead, and every symptom is listed under it."""
        root = _is_root_cause(e)
        if self.status != before:
            entry = Transition(status=self.status, at=e.time, cause=describe(e))
            if self.status == Status.RESTARTING:
                entry["events"] = [describe(e)]
                recent = self._root_before(e.time)
                if not root and recent is not None:
                    entry["cause"] = describe(recent)
                    entry["events"].insert(0, describe(recent))
                entry["rooted"] = root or entry["cause"] != describe(e)
                # When the outage began: at its cause (the drill, else the departure), the moment
                # the timeline's "back at world size N after ..." counts from too (#39 item 4).
                entry["since"] = recent.time if recent is not None else e.time
            self.transitions.append(entry)
            if self.status == Status.RUNNING and before == Status.RESTARTING and _kept_in_place(e):
                self._restart_was_in_place()
        elif e.kind == Kind.IN_PLACE:  # told after its group already trains, or with no symptom at all
            self._restart_was_in_place(e)
        elif self.status == Status.RESTARTING and e.kind in SYMPTOMS and self.transitions:
            entry = self.transitions[-1]
            if entry["status"] == Status.RESTARTING and len(entry.setdefault("events", [])) < 8:
                entry["events"].append(describe(e))
                if root and not entry.get("rooted"):
                    entry["cause"], entry["rooted"] = describe(e), True
        if root:
            self._last_root = e
        if e.kind == Kind.WORKER_STARTED and e.fields(WorkerStarted).get("in_place"):
            since = self._last_root.time if self._last_root is not None else 0.0
            if self._in_place_started is None or self._in_place_started < since:
                self._in_place_started = e.time  # the first rank training in the change's new group

    def _root_before(self, t: float) -> Event | None:
        """The drill or departure at most ``ROOT_WINDOW_S`` before ``t``: the cause of what
        happens at ``t`` (a restart, a change in place)."""
        recent = self._last_root
        return recent if recent is not None and 0 <= t - recent.time <= ROOT_WINDOW_S else None

    def _restart_was_in_place(self, told: Event | None = None) -> None:
        """The latest membership change kept its survivors' processes: not a restart (#41 item 7),
        and every view says so. ``told``: its ``in_place`` event; a change that broke no step
        (a graceful leave, a join) flipped no status, so it is entered in the history here."""
        for entry in reversed(self.transitions):
            if entry["status"] == Status.RESTARTING:
                began = (
                    told.time - float(told.fields(InPlace).get("took_s") or 0.0) - CHANGE_SLACK_S
                    if told is not None
                    else 0.0
                )
                if entry["at"] >= began:
                    entry["in_place"] = True
                    return
                break
        if told is not None:
            self._changed_without_a_symptom(told)

    def _changed_without_a_symptom(self, told: Event) -> None:
        """A change in place no status flipped for: entered in the status history as the change it
        was (from its cause, the drill or the departure, to the first rank training in the new
        group: the timeline's "in place at world size N after ..." counts the same)."""
        recent = self._root_before(told.time)
        began = recent.time if recent is not None else told.time - float(told.fields(InPlace).get("took_s") or 0.0)
        cause = describe(recent if recent is not None else told)
        trained = (
            self._in_place_started
            if self._in_place_started is not None and self._in_place_started >= began
            else told.time
        )
        self.transitions.append(
            {
                "status": Status.RESTARTING,
                "at": began,
                "cause": cause,
                "events": [cause],
                "rooted": recent is not None,
                "since": began,
                "in_place": True,
            }
        )
        self.transitions.append({"status": Status.RUNNING, "at": trained, "cause": describe(told)})

    def _saw_step(self, step: int, t: float) -> None:
        if self.first_step_at is None:
            self.first_step_at = t
        self.step = step
        self._rates.append((t, step))


def _kept_in_place(e: Event) -> bool:
    """Whether ``e`` says training went on in the processes it ran in (a group formed in place)."""
    return e.kind == Kind.IN_PLACE or (e.kind == Kind.WORKER_STARTED and bool(e.fields(WorkerStarted).get("in_place")))


#: What a listing that reads a cluster (pods, the workers' Job) takes from a fold of the job's
#: events kept beside it: the cluster knows its pods, only the events know the training.
FOLDED_FIELDS = (
    "world_size",
    "restarts",
    "step",
    "total_steps",
    "loss",
    "loss_tail",
    "transitions",
    "ran_s",
    "generation",
    "stall",
    "warning",
    "reason",
)


def with_fold(status: str, summary: JobSummary, state: JobState | None) -> tuple[str, JobSummary]:
    """A listed job's status and summary, overlaid with what ``state`` (a fold of its events)
    knows: the Kubernetes rows of the jobs panel gain restarts, step and loss as local ones
    have them (a local job's summary is its supervisor's fold already). The cluster's word on
    its pods stays; a restart in progress or an ending the events told wins over it."""
    if state is None or state.last_event_at is None:
        return status, summary
    folded: Mapping[str, object] = state.summary()
    out = summary_of({**summary, **{k: folded[k] for k in FOLDED_FIELDS}})
    if state.finished or (
        status in (Status.PENDING, Status.RUNNING) and state.status in (Status.RUNNING, Status.RESTARTING)
    ):
        status = state.status
    out["status"] = status
    return status, out


def elapsed_s(state: JobState, now: float | None = None) -> float | None:
    """How long the job ran (``JobState.ran_s``): the one figure of its time every view shows."""
    return state.ran_s(now)


def summary_text(name: str, s: JobState) -> str:
    """A job in a line or three (``ElasticJob.summary()``, its repr): status, size, step, loss,
    restarts, time; the reason of an outcome, what it waits for, and where the run is tracked."""
    parts = [f"{name}: {s.status}"]
    finished = s.status in FINAL_STATUSES
    if s.world_size:
        # While regrouping or after the end, the last world size is history, not the present.
        parts.append(f"world size {s.world_size}" if s.status == "running" else f"last world size {s.world_size}")
    if not finished:
        parts.append(f"nodes {len(s.running_nodes)} (range {s.nnodes[0]}:{s.nnodes[1]})")
    if s.step is not None:
        parts.append(f"step {s.steps_done}" + (f"/{s.total_steps}" if s.total_steps else ""))
    loss = s.metrics.last("loss")
    if loss is not None:
        parts.append(f"loss {sig(loss, 4)}")
    parts.append(f"restarts {s.restarts}/{s.max_restarts}")
    took = elapsed_s(s)
    if took is not None:
        parts.append(f"ran {format_duration(took)}")
    text = ", ".join(parts)
    if s.reason and finished:
        text += f"\n  reason: {s.reason}"
    if s.warning:
        text += f"\n  warning: {s.warning}"
    if s.waiting and not finished:
        text += f"\n  waiting: {s.waiting}"
    for where in s.tracking.values():
        text += f"\n  {tracking_text(where)}"
    return text

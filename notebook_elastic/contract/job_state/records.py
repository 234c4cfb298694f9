"""The parts of a job's state: a rank, a node (what the panel shows of it), a marker on the
loss chart, the metrics as compact columns per name, and the digest every listing reads
(``JobSummary``: status.json, a listed job's summary, what the jobs panel's row is made of)."""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

from ..event_types import Gpu, Stall, Tracking


class Transition(TypedDict):
    """A change of a job's status, with its time (epoch seconds) and the event that caused it."""

    status: str
    at: float
    cause: str
    events: NotRequired[list[str]]  # a restart: its cause first, then what else happened while it lasted
    rooted: NotRequired[bool]  # a restart whose cause is a drill or a departure, not a symptom
    since: NotRequired[float]  # a restart: when the outage began (its cause), what "after N s" counts from
    in_place: NotRequired[bool]  # a restart that was a membership change in place: no process restarted


class JobSummary(TypedDict, total=False):
    """A job's digest (``JobState.summary()``; status.json; a listed job's ``JobInfo.summary``,
    which a backend may give only part of). Read from a file another process wrote: what each
    key holds is checked where it is shown (the jobs panel's row: ``server/rows.py``)."""

    status: str
    reason: str | None
    waiting: str | None  # why capacity the job asked for is not coming
    stall: Stall | None  # the stall in progress (its event's fields)
    warning: str | None
    world_size: int | None
    nodes_running: int | None
    nodes_pending: int  # a cluster's pods waiting
    target: int | None
    min_nodes: int | None
    max_nodes: int | None
    nproc_per_node: int | None
    restarts: int | None
    max_restarts: int | None
    resumes: int
    step: int | None  # the latest step reported (steps done: one more)
    total_steps: int | None
    loss: float | None
    loss_tail: list[float]
    started_at: float | None
    finished_at: float | None
    ran_s: float | None
    generation: int | None
    transitions: list[Transition]
    nodes: list[dict[str, Any]]
    step_time_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    gpu: list[Gpu]  # each rank's latest figures
    tracking: list[Tracking]  # where the run is tracked (the tracking events)
    # What the local supervisor adds in status.json (supervisor/outcome.py).
    name: str
    backend: str
    notebook: str | None
    supervisor_pid: int
    updated: float


def summary_of(read: Mapping[str, Any]) -> JobSummary:
    """A job's digest as read from its file (status.json, outcome.json): the same dict, neither
    copied nor checked, as ``Event.fields`` reads an event; what each listing shows of it is
    checked there (the jobs panel's row: ``server/rows.py``)."""
    return cast(JobSummary, read)


@dataclass
class RankInfo:
    rank: int
    local_rank: int
    pid: int | None
    restart_count: int
    generation: int | None
    started_at: float | None = None  # its worker_started line's time


@dataclass
class NodeInfo:
    name: str
    status: str = "starting"  # starting | running | restarting | pending | left
    agent_pid: int | None = None
    group_rank: int | None = None
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    restart_count: int = 0
    left_reason: str | None = None
    joined_at: float | None = None
    left_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "group_rank": self.group_rank,
            "ranks": sorted(self.ranks),
            "restart_count": self.restart_count,
            "left_reason": self.left_reason,
        }


@dataclass
class RunClock:
    """How long a job has run: the sum of its runs, from each start (submitted, resumed) to its
    outcome, so that the time it sat stopped before a resume is not counted (#39 item 4: "ran
    8 min 32 s" counted it)."""

    before_s: float = 0.0  # the runs that ended
    since: float | None = None  # when the current run started; None between an outcome and a resume
    runs: int = 0  # starts told (a history without job_submitted, a cluster's, has none)

    def start(self, t: float, last_seen: float | None) -> None:
        """A run starts at ``t``. A run still open (it was lost: no outcome was told) counts up to
        the last thing it said (``last_seen``)."""
        if self.since is not None:
            self.before_s += max(0.0, (last_seen if last_seen is not None else self.since) - self.since)
        self.since = t
        self.runs += 1

    def end(self, t: float) -> None:
        if self.since is not None:
            self.before_s += max(0.0, t - self.since)
            self.since = None

    def ran_s(self, now: float) -> float:
        return self.before_s + (max(0.0, now - self.since) if self.since is not None else 0.0)


#: How much of the loop's time must be measured before the share commit() blocked is shown: a
#: share of a second or two is one save over a step or two, not how the job saves.
SAVING_MEASURED_S = 10.0


@dataclass
class SavingClock:
    """The share of the job's loop time that State's commit() blocked (#39 item 2: the header
    showed one checkpoint event's window, a group's first step and first save, 37 %, for a job
    that kept under a tenth). Rank 0's metrics carry its group's running totals; a total that
    falls is a new group (a restart, a rescale), and the old group's last totals are banked."""

    banked_blocked_s: float = 0.0  # groups that ended
    banked_loop_s: float = 0.0
    blocked_s: float = 0.0  # the group training now, up to its latest report
    loop_s: float = 0.0
    saves: int = 0  # checkpoints written, as the checkpoint events count them

    def observe(self, blocked_s: Any, loop_s: Any) -> None:
        if not isinstance(blocked_s, (int, float)) or not isinstance(loop_s, (int, float)):
            return
        if loop_s < self.loop_s:  # a new worker group's State
            self.banked_blocked_s += self.blocked_s
            self.banked_loop_s += self.loop_s
        self.blocked_s, self.loop_s = float(blocked_s), float(loop_s)

    @property
    def measured_s(self) -> float:
        return self.banked_loop_s + self.loop_s

    def blocked_pct(self) -> float | None:
        """The share, in percent, once ``SAVING_MEASURED_S`` of the loop are measured; else None."""
        if self.measured_s < SAVING_MEASURED_S:
            return None
        return round(100 * (self.banked_blocked_s + self.blocked_s) / self.measured_s, 1)


@dataclass(frozen=True)
class Marker:
    """A point on the metric chart where something happened to the job."""

    step: int | None
    time: float
    kind: str  # world_size | restart | node_joined | node_left | resumed | failure
    label: str


class MetricSeries:
    """Steps, values and arrival times of one metric, compactly (array of doubles)."""

    __slots__ = ("steps", "values", "times")

    def __init__(self) -> None:
        self.steps = array("d")
        self.values = array("d")
        self.times = array("d")

    def append(self, step: float, value: float, t: float) -> None:
        self.steps.append(step)
        self.values.append(value)
        self.times.append(t)

    def __len__(self) -> int:
        return len(self.values)

    def last(self) -> tuple[float, float] | None:
        return (self.steps[-1], self.values[-1]) if self.values else None

    def points(self) -> list[tuple[float, float]]:
        return list(zip(self.steps, self.values))


class Metrics:
    """All reported metrics, by name: ``metrics["loss"].points()``, ``metrics.last("loss")``."""

    def __init__(self) -> None:
        self._series: dict[str, MetricSeries] = {}
        self.count = 0

    def add(self, step: float, values: dict[str, Any], t: float) -> None:
        try:
            step = float(step)
        except (TypeError, ValueError, OverflowError):
            return  # not a step a chart can place ("seven", 10**400): dropped, never fatal
        if not math.isfinite(step) or not isinstance(values, dict):
            return
        for name, value in values.items():
            try:
                v = float(value)
            except (TypeError, ValueError, OverflowError):
                continue
            series = self._series.get(name)
            if series is None:
                series = self._series[name] = MetricSeries()
            series.append(step, v, t)
        self.count += 1

    @property
    def names(self) -> list[str]:
        return list(self._series)

    def __getitem__(self, name: str) -> MetricSeries:
        return self._series[name]

    def __contains__(self, name: str) -> bool:
        return name in self._series

    def __len__(self) -> int:
        return self.count

    def last(self, name: str) -> float | None:
        series = self._series.get(name)
        return series.values[-1] if series else None

    def to_records(self) -> list[dict[str, float]]:
        rows: dict[float, dict[str, float]] = {}
        for name, series in self._series.items():
            for step, value in zip(series.steps, series.values):
                rows.setdefault(step, {"step": step})[name] = value
        return [rows[k] for k in sorted(rows)]

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {len(s)} points, last {s.values[-1]:.4g}" for n, s in self._series.items())
        return f"Metrics({parts or 'none yet'})"

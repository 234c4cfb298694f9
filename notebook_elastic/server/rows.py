"""A row of ``GET /notebook-elastic/api/jobs``: what the jobs panel reads of each job, typed.

``routes.job_json`` builds it (mypy checks its keys and types against ``JobRow``), and
``scripts/gen_contract.py`` turns this class into the labextension's ``IJobRow`` (in
``labextension/src/contract.ts``), so the panel and the server cannot drift apart."""

from __future__ import annotations

import sys
from typing import TypedDict

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired


class Transition(TypedDict):
    """A change of a job's status, with its time (epoch seconds) and the event that caused it."""

    status: str
    at: float
    cause: str
    events: NotRequired[list[str]]  # a restart: its cause first, then what else happened while it lasted
    rooted: NotRequired[bool]  # a restart whose cause is a drill or a departure, not a symptom
    since: NotRequired[float]  # a restart: when the outage began (its cause), what "after N s" counts from


class Tracking(TypedDict):
    """Where a job's run is tracked (runtime/tracking.py ``shown``): credentials stripped."""

    tracker: str
    label: str
    url: str | None  # the run's page (http(s) only)
    command: str | None  # the command that shows it: mlflow ui ..., wandb sync ..., tensorboard --logdir ...
    path: str | None


class JobRow(TypedDict):
    name: str
    backend: str
    status: str
    damaged: str | None
    reason: str | None
    waiting: str | None  # why capacity the job asked for is not coming
    stall: str | None  # a stall in progress, in words
    warning: str | None  # a condition the job trains on through (a full checkpoint disk)
    world_size: int | None
    nodes_running: int | None
    target: int | None
    min_nodes: int | None
    max_nodes: int | None
    restarts: int | None
    max_restarts: int | None
    step: int | None  # steps done (the last step reported + 1), as every view counts them
    total_steps: int | None
    loss: float | None
    loss_tail: list[float]
    step_time_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    gpu_mem_peak_bytes: int | None
    gpu_util_percent: float | None
    tracking: list[Tracking]
    transitions: list[Transition]
    started_at: float | None
    finished_at: float | None
    ran_s: NotRequired[float | None]  # how long it ran, its stopped spells left out (JobState.ran_s)
    notebook: str | None  # relative to the server's root, or None outside it
    location: str | None  # a job folder, a namespace

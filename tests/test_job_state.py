"""The job-state fold, pure: event lists in, status, summary, restarts, world sizes and
timeline text out. No processes. Written against mutmut's survivors (tests/README.md): each
test pins a behaviour a view shows (the dashboard, the jobs panel, status.json, the CLI)."""

from __future__ import annotations

import pytest

from notebook_elastic.contract.event_types import Kind, Status
from notebook_elastic.contract.events import Event, describe
from notebook_elastic.contract.job_state import (
    JobState,
    Metrics,
    MetricSeries,
    budget_spent_reason,
    describe_failure,
    elapsed_s,
    first_failure,
    summary_text,
    with_fold,
)


def ev(kind: str, t: float = 1.0, node: str | None = None, **data) -> Event:
    return Event(kind, t, node, data)


def started(t: float, node: str, rank: int, world: int, generation: int | None = 1, **more) -> Event:
    data = {"rank": rank, "local_rank": 0, "world_size": world, "generation": generation, **more}
    return Event(Kind.WORKER_STARTED, t, node, data)


def fold(*events: Event, **kw) -> JobState:
    state = JobState(**kw)
    state.apply_all(events)
    return state


def metric(t: float, step, **values) -> Event:
    return ev(Kind.METRIC, t, "node-0", step=step, values=values)


def labels(state: JobState, kind: str) -> list[str]:
    return [m.label for m in state.markers if m.kind == kind]


# -- metrics -----------------------------------------------------------------------------


def test_metrics_keep_what_a_chart_can_place_and_drop_the_rest():
    metrics = Metrics()
    assert repr(metrics) == "Metrics(none yet)" and metrics.last("loss") is None and metrics.names == []
    metrics.add(0, {"note": "warmup", "loss": 2, "lr": "0.1"}, 10.0)
    metrics.add("1", {"loss": 0.5}, 11.0)
    for bad_step in ("seven", 10**400, float("nan"), float("inf"), None):
        metrics.add(bad_step, {"loss": 99.0}, 12.0)
    metrics.add(2, ["not", "a", "dict"], 13.0)
    assert len(metrics) == 2 and metrics.count == 2
    assert metrics.names == ["loss", "lr"] and "loss" in metrics and "note" not in metrics
    assert metrics["loss"].points() == [(0.0, 2.0), (1.0, 0.5)] and metrics.last("loss") == 0.5
    assert list(metrics["loss"].times) == [10.0, 11.0] and len(metrics["lr"]) == 1
    assert metrics["loss"].last() == (1.0, 0.5) and MetricSeries().last() is None
    series = MetricSeries()
    for step, value in ((0, 3.0), (1, 2.0), (2, 1.0)):
        series.append(step, value, 0.0)
    assert series.last() == (2.0, 1.0)
    assert metrics.to_records() == [{"step": 0.0, "loss": 2.0, "lr": 0.1}, {"step": 1.0, "loss": 0.5}]
    assert repr(metrics) == "Metrics(loss: 2 points, last 0.5, lr: 1 points, last 0.1)"


def test_a_metric_without_a_step_is_charted_at_its_count_but_moves_no_progress():
    state = fold(
        metric(1.0, None, loss=1.0),
        metric(2.0, None, loss=0.5),
        metric(3.0, True, loss=0.25),  # a bool is no step
        metric(3.5, float("nan"), loss=0.125),  # nor is NaN: not charted either
    )
    assert state.metrics["loss"].points() == [(0.0, 1.0), (1.0, 0.5), (1.0, 0.25)]
    assert state.step is None and state.first_step_at is None and state.steps_per_s is None
    assert len(state.metrics) == 3 and state.events == []  # metrics are not history
    state.apply(ev(Kind.METRIC, 4.0, "node-0", step=5))  # a step with no values still moves progress
    assert state.step == 5 and state.first_step_at == 4.0 and len(state.metrics) == 4
    assert state.last_event_at == 4.0


def test_samples_and_tokens_per_step_come_from_the_values_or_the_cursor():
    state = fold(metric(1.0, 0, loss=1.0, samples=0, tokens=0), metric(1.0, 0, loss=1.0, samples=-2, tokens=-3))
    assert state.samples_per_step is None and state.tokens_per_step is None
    one = fold(metric(1.0, 0, loss=1.0, samples=1, tokens=1))  # a batch of one sample, one token
    assert (one.samples_per_step, one.tokens_per_step) == (1.0, 1.0)
    state.apply(ev(Kind.METRIC, 2.0, "node-0", step=1, values={"loss": 1.0}, samples_per_step=64))
    assert state.samples_per_step == 64.0 and state.tokens_per_step is None
    state.apply(metric(3.0, 2, loss=1.0, samples=32, tokens=4096))
    assert (state.samples_per_step, state.tokens_per_step) == (32.0, 4096.0)
    state.apply(metric(4.0, 3, loss=1.0, samples="many", tokens="lots"))
    assert (state.samples_per_step, state.tokens_per_step) == (32.0, 4096.0)
    # One step a second: the throughput is the per-step figure.
    assert state.step_time_s == 1.0 and state.samples_per_s == 32.0 and state.tokens_per_s == 4096.0


def test_step_time_is_the_median_step_so_a_restarts_gap_does_not_count():
    state = JobState()
    t = 0.0
    for step, dt in enumerate([0.0, 1.0, 2.0, 3.0, 4.0, 100.0]):
        t += dt
        state.apply(metric(t, step, loss=1.0))
    assert state.step_time_s == 3.0  # per step: 1 2 3 4 100
    state.apply(metric(t, 2, loss=1.0))  # back to a checkpoint: no step time from it
    state.apply(metric(t + 7.0, 3, loss=1.0))  # then 7 s for one step
    assert state.step_time_s == 4.0  # per step: 1 2 3 4 7 100
    state.apply(metric(t + 7.0, 4, loss=1.0))  # two lines in the same instant: a 0 s step
    assert state.step_time_s == 3.0  # per step: 0 1 2 3 4 7 100
    assert JobState().step_time_s is None and fold(metric(1.0, 0)).samples_per_s is None


def test_steps_per_s_and_eta_read_the_recent_steps_only():
    state = JobState()
    state.apply(ev(Kind.PLAN, 0.0, None, start=0, total=200))
    t = 0.0
    for step in range(100):  # slow at first, then 1 step/s for the last 64
        t += 10.0 if step < 37 else 1.0
        state.apply(metric(t, step, loss=1.0))
    assert state.steps_per_s == pytest.approx(1.0) and state.eta_s == pytest.approx(100.0)
    state.apply(metric(t, 300, loss=1.0))  # past the plan: nothing is left
    assert state.eta_s == 0.0
    assert fold(metric(1.0, 0), metric(1.0, 1)).steps_per_s is None  # no time passed
    assert fold(metric(1.0, 5), metric(2.0, 3)).steps_per_s is None  # went back
    assert fold(metric(1.0, 0), metric(2.0, 1)).eta_s is None  # no plan


def test_a_checkpoint_moves_the_step_forward_but_never_repeats_it():
    state = fold(*(metric(float(s), s, loss=1.0) for s in range(10)))
    state.apply(ev(Kind.CHECKPOINT, 19.0, "node-0", step=10))  # steps 0..9 done: nothing new
    assert state.step == 9 and state.steps_per_s == pytest.approx(1.0)
    state.apply(ev(Kind.CHECKPOINT, 30.0, "node-0", step=20))  # a worker that reports seldom
    assert state.step == 19 and state.steps_per_s == pytest.approx(19 / 30)
    state.apply(ev(Kind.CHECKPOINT, 31.0, "node-0", step="20"))
    assert state.step == 19
    state.apply(ev(Kind.CHECKPOINT, 32.0, "node-0", step=21))  # one step more
    assert state.step == 20
    fresh = fold(ev(Kind.CHECKPOINT, 5.0, "node-0", step=3))
    assert fresh.step == 2 and fresh.first_step_at == 5.0 and fresh.checkpointing is None


def test_how_the_job_saves_is_read_from_the_latest_checkpoint_that_says_so():
    state = fold(ev(Kind.CHECKPOINT, 1.0, "node-0", step=5, every=5, chosen=True, blocked_pct=3.2, ms=4))
    assert state.checkpointing == {"every": 5, "chosen": True, "blocked_pct": 3.2}
    state.apply(ev(Kind.CHECKPOINT, 2.0, "node-0", step=10, ms=4))
    assert state.checkpointing == {"every": 5, "chosen": True, "blocked_pct": 3.2}


# -- warnings ----------------------------------------------------------------------------


def test_a_full_checkpoint_disk_warns_until_a_checkpoint_is_saved_again():
    state = fold(ev(Kind.CHECKPOINT_FAILED, 1.0, "node-0", step=3, error="ENOSPC"))
    assert state.warning is None  # a failure that is not a full disk is an event, not a state
    state.apply(ev(Kind.CHECKPOINT_FAILED, 2.0, "node-0", step=3, disk_full=True, folder="/ckpt", retry_s=12.4))
    assert state.warning == (
        "checkpoints are not being saved: /ckpt is full; training goes on and saving is tried again every 12 s"
    )
    state.apply(ev(Kind.CHECKPOINT_FAILED, 3.0, "node-0", step=3, disk_full=True))
    assert state.warning == (
        "checkpoints are not being saved: the checkpoint disk is full; "
        "training goes on and saving is tried again every 30 s"
    )
    state.apply(ev(Kind.CHECKPOINT, 4.0, "node-0", step=4))
    assert state.warning is None
    # Another condition's warning is not cleared by a checkpoint.
    state.apply(ev(Kind.DISK_FULL, 5.0, None, message="the job disk is full: output is kept in memory"))
    state.apply(ev(Kind.CHECKPOINT, 6.0, "node-0", step=5))
    assert state.warning == "the job disk is full: output is kept in memory"
    degraded = {"missing": {"_private_hook": "a restart heals slower"}, "torch": "9.9"}
    state.apply(ev(Kind.DEGRADED, 7.0, None, **degraded))
    assert state.warning == describe(ev(Kind.DEGRADED, 7.0, None, **degraded)) and state.warning


def test_a_stall_is_held_until_it_clears_and_marks_the_chart():
    # The supervisor's step is the last one reported (index 4): 5 steps done, as every view says.
    state = fold(metric(1.0, 4, loss=1.0), ev(Kind.STALL, 40.0, None, step=4, for_s=30.0, stopped=[1], waiting=[0]))
    assert state.stall == {"step": 4, "for_s": 30.0, "stopped": [1], "waiting": [0]}
    assert state.summary()["stall"] == state.stall
    assert [(m.kind, m.step, m.time, m.label) for m in state.markers] == [("stall", 4, 40.0, "stalled at step 5")]
    state.apply(ev(Kind.STALL_CLEARED, 50.0, None, for_s=40.0))
    assert state.stall is None and state.summary()["stall"] is None


# -- membership and world size -----------------------------------------------------------


def test_submission_sets_the_range_target_and_budget():
    state = JobState()
    assert (state.status, state.target, state.nnodes, state.max_restarts, state.gpus) == ("pending", 1, (1, 1), 0, 0)
    assert (state.nproc_per_node, state.round, state.last_dropped, state.dropped_events) == (None, None, None, 0)
    assert JobState(nnodes=(2, 4)).target == 2 and JobState(nnodes=(2, 4), target=3).target == 3
    state.apply(
        ev(Kind.JOB_SUBMITTED, 5.0, None, nodes=2, min_nodes=2, max_nodes=3, nproc_per_node=4, max_restarts=7, gpus=8)
    )
    assert (state.target, state.nnodes, state.nproc_per_node, state.max_restarts, state.gpus) == (2, (2, 3), 4, 7, 8)
    assert state.started_at == 5.0
    state.apply(ev(Kind.JOB_SUBMITTED, 9.0, None, gpus=None))  # says nothing: keeps what it knew
    assert (state.target, state.nnodes, state.max_restarts, state.gpus, state.started_at) == (2, (2, 3), 7, 0, 5.0)
    assert state.nproc_per_node is None


def test_scaling_changes_the_target_and_range_it_names():
    state = fold(ev(Kind.JOB_SUBMITTED, 1.0, None, nodes=1, min_nodes=1, max_nodes=2))
    state.apply(ev(Kind.SCALED, 2.0, None, target=2))
    assert (state.target, state.nnodes) == (2, (1, 2))
    state.apply(ev(Kind.SCALED, 3.0, None, target=3, min_nodes=2, max_nodes=4))
    assert (state.target, state.nnodes) == (3, (2, 4))
    state.apply(ev(Kind.SCALED, 4.0, None))
    assert (state.target, state.nnodes) == (3, (2, 4))
    summary = state.summary()
    assert (summary["target"], summary["min_nodes"], summary["max_nodes"]) == (3, 2, 4)


def test_a_worker_group_sets_ranks_world_size_and_the_chart_marks_each_change():
    state = JobState(nnodes=(1, 2))
    state.apply(ev(Kind.NODE_JOINED, 1.0, "node-0", pid=100))
    node = state.nodes["node-0"]
    assert (node.status, node.agent_pid, node.joined_at, state.status) == ("starting", 100, 1.0, "pending")
    state.apply(started(2.0, "node-0", 0, 1, generation=1, local_rank=0, pid=7, restart_count=0))
    assert state.world_size == 1 and state.status == "running" and state.started_at == 2.0
    assert labels(state, "world_size") == []  # the first size is no change
    rank = node.ranks[0]
    assert (rank.rank, rank.local_rank, rank.pid, rank.restart_count, rank.generation) == (0, 0, 7, 0, 1)
    state.apply(metric(3.0, 10, loss=1.0))
    state.apply(ev(Kind.NODE_JOINED, 4.0, "node-1", pid=101))
    for n, r in (("node-0", 0), ("node-0", 1), ("node-1", 2), ("node-1", 3)):
        state.apply(
            Event(Kind.WORKER_STARTED, 5.0, n, {"rank": r, "local_rank": r % 2, "world_size": 4, "generation": 2})
        )
    assert state.world_size == 4 and state.generation == 2
    assert sorted(state.nodes["node-0"].ranks) == [0, 1] and sorted(state.nodes["node-1"].ranks) == [2, 3]
    assert state.nodes["node-1"].ranks[3].local_rank == 1
    assert [(m.step, m.time, m.label) for m in state.markers if m.kind == "world_size"] == [
        (10, 5.0, "world size 1 \u2192 4")
    ]
    assert labels(state, "node_joined") == ["node-0 joined", "node-1 joined"]
    assert [n["ranks"] for n in state.summary()["nodes"]] == [[0, 1], [2, 3]]


def test_a_size_change_is_marked_where_the_new_group_trains_from():
    """Saved every 8 steps, reported every step: the new group of 2 resumes at step 16, so the
    steps after it are trained again at the new size; the change and the resume are marked
    there, not at step 21, the last step reported at the old size."""
    state = fold(started(1.0, "node-0", 0, 1, generation=1))
    for step in range(22):
        state.apply(metric(2.0 + step / 100, step, loss=1.0))
    state.apply(started(3.0, "node-0", 0, 2, generation=2))
    assert [(m.step, m.label) for m in state.markers if m.kind == "world_size"] == [(21, "world size 1 \u2192 2")]
    state.apply(ev(Kind.RESUMED, 3.1, "node-0", step=7, generation=1, world_size=1))  # a late line, the old group's
    state.apply(ev(Kind.RESUMED, 3.2, "node-0", step=16, generation=2, world_size=2, from_world_size=1))
    state.apply(ev(Kind.RESUMED, 3.3, "node-1", step=16, generation=2, world_size=2, from_world_size=1))
    state.apply(metric(3.4, 16, loss=0.9))
    assert [(m.step, m.time) for m in state.markers if m.kind == "world_size"] == [(16, 3.0)]
    assert [m.step for m in state.markers if m.kind == "resumed"] == [7, 16, 16]


def test_a_new_generation_drops_the_old_ranks_and_a_late_line_from_an_old_one_is_ignored():
    state = fold(started(1.0, "node-0", 0, 2, generation=3), started(1.0, "node-1", 1, 2, generation=3))
    state.apply(started(5.0, "node-0", 0, 1, generation=4, restart_count=2))
    assert state.nodes["node-1"].ranks == {} and list(state.nodes["node-0"].ranks) == [0]
    assert state.nodes["node-0"].restart_count == 2 and state.world_size == 1
    # The superseded group's rank 1 prints its start late: nothing changes.
    state.apply(started(6.0, "node-1", 1, 2, generation=3))
    assert state.nodes["node-1"].ranks == {} and state.world_size == 1 and state.generation == 4
    assert state.nodes["node-1"].status == "running" and len(state.events) == 4  # the line is history
    assert state.events[-1].time == 6.0 and state.events[-1].kind == Kind.WORKER_STARTED
    # A lower restart count on a later group never lowers the node's.
    state.apply(started(7.0, "node-0", 0, 1, generation=5, restart_count=1))
    assert state.nodes["node-0"].restart_count == 2 and state.nodes["node-0"].ranks[0].restart_count == 1


def test_a_node_left_behind_in_place_that_sees_its_old_round_vanish_leaves_the_job_running():
    """In place, the survivors regroup without a preempted node; that node's agent, still there a
    moment, then sees the members of its old round vanish and says so (peer_lost, restart). The
    job trains on: it stays running (the panel said "restarting" for good under load, fresh-clone
    run of the whole suite). The same words from a node of the group training still flip it."""
    state = fold(started(1.0, "node-0", 0, 2, generation=1), started(1.0, "node-1", 1, 2, generation=1))
    state.apply(ev(Kind.FAULT, 2.0, "node-1", fault="preempt_node", target="node-1"))
    state.apply(started(2.3, "node-0", 0, 1, generation=2, in_place=True))
    state.apply(ev(Kind.IN_PLACE, 2.4, "node-0", reason="left", from_world_size=2, world_size=1, took_s=0.1))
    assert state.status == Status.RUNNING
    state.apply(ev(Kind.PEER_LOST, 2.5, "node-1", round=0, lost=["node-0"]))
    state.apply(ev(Kind.RESTART, 2.5, "node-1", reason="membership_change"))
    state.apply(ev(Kind.NODE_LEFT, 2.6, "node-1", reason="preempted"))
    assert state.status == Status.RUNNING, state.transitions
    assert state.transitions[-1]["status"] == Status.RUNNING
    # A member of the group training that sees a peer vanish: the job regroups.
    state.apply(ev(Kind.PEER_LOST, 3.0, "node-0", round=1, lost=["node-2"]))
    assert state.status == Status.RESTARTING


def test_an_agents_restart_line_read_after_its_new_group_started_leaves_the_job_running():
    """A local agent's own lines (stderr: "failed (exitcode: -9)", "will restart worker group")
    and its workers' lines (stdout) come through two pipes, read by two threads: under load the
    new group's start can be read first. The restart it announced is then over, not ahead:
    the job stays running (it stayed "restarting" for good while the new group trained)."""
    state = fold(started(1.0, "node-0", 0, 2, generation=1), started(1.0, "node-0", 1, 2, generation=1))
    state.apply(ev(Kind.WORKER_EXITED, 5.0, "node-0", local_rank=1, pid=11, exitcode=-9, signal=9))
    assert state.status == Status.RESTARTING  # in order: the group is restarting
    state.apply(ev(Kind.RESTART, 5.0, "node-0", reason="worker_failed", restarts_used=1, max_restarts=3))
    state.apply(started(7.0, "node-0", 0, 2, generation=2, restart_count=1))
    assert state.status == Status.RUNNING

    late = fold(started(1.0, "node-0", 0, 2, generation=1), started(1.0, "node-0", 1, 2, generation=1))
    late.apply(started(7.0, "node-0", 0, 2, generation=2, restart_count=1))
    late.apply(started(7.0, "node-0", 1, 2, generation=2, restart_count=1))
    # Read at 8.0, written at 5.0, before the group now training started.
    late.apply(ev(Kind.WORKER_EXITED, 8.0, "node-0", local_rank=1, pid=11, exitcode=-9, signal=9, written=5.0))
    late.apply(ev(Kind.RESTART, 8.0, "node-0", reason="worker_failed", restarts_used=1, max_restarts=3, written=5.0))
    late.apply(ev(Kind.RESTART, 8.0, "node-0", reason="membership_change", new_nodes=1, written=5.5))
    assert late.status == Status.RUNNING and late.nodes["node-0"].status == "running"
    assert late.restarts == 1  # still counted, and in the history
    assert [e.kind for e in late.events][-3:] == [Kind.WORKER_EXITED, Kind.RESTART, Kind.RESTART]
    # Written after the group started: a restart of the group training, as before.
    late.apply(ev(Kind.RESTART, 9.0, "node-0", reason="worker_failed", restarts_used=2, max_restarts=3, written=8.5))
    assert late.status == Status.RESTARTING


def test_an_agents_line_carries_the_time_the_agent_wrote_it():
    """The local supervisor reads an agent's restart and exit lines with the time the agent
    wrote them (this machine's clock, local time) beside the time they were read, so the fold
    can order them against the workers' lines by when they happened."""
    import time as _time

    from notebook_elastic.contract.events import LineParser

    written = _time.mktime((2026, 11, 24, 4, 37, 26, 0, 0, -1)) + 0.684
    line = "I1124 04:37:26.684000 31873 torch/x.py:942] [default] Worker group FAILED. 3/3 attempts left; will restart worker group"
    read_later = written + 3.0
    event = LineParser("node-0", "stderr", agent_clock=True).feed(line, read_later)
    assert event.kind == Kind.RESTART and event.get("written") == pytest.approx(written, abs=1e-3)
    assert event.time == read_later  # the timeline's time is still when it was read
    # Without the agent's clock (a pod's log: another machine's clock), only the time it was read.
    assert "written" not in LineParser("node-0", "stderr").feed(line, read_later).data
    # Read just after New Year: last year's December, not next December.
    line = line.replace("I1124 04:37:26.684000", "I1231 23:59:59.000000")
    new_year = _time.mktime((2027, 1, 1, 0, 0, 1, 0, 0, -1))
    event = LineParser("node-0", "stderr", agent_clock=True).feed(line, new_year)
    assert event.get("written") == pytest.approx(_time.mktime((2026, 12, 31, 23, 59, 59, 0, 0, -1)), abs=1e-3)


def test_a_minimal_worker_start_line_still_counts():
    """The fold's defaults for a worker_started that says little (an older worker's line)."""
    state = fold(Event(Kind.WORKER_STARTED, 2.0, None, {"node": "pod-a"}))
    assert list(state.nodes) == ["pod-a"] and state.world_size == 1 and state.generation is None
    rank = state.nodes["pod-a"].ranks[0]
    assert (rank.rank, rank.local_rank, rank.pid, rank.restart_count) == (0, 0, None, 0)
    assert state.status == "running" and state.nodes["pod-a"].status == "running"
    assert list(fold(Event(Kind.WORKER_STARTED, 2.0, None, {})).nodes) == ["?"]


def test_a_node_leaving_regroups_a_running_job_unless_it_was_done_or_stopped():
    for reason in ("finished", "stopped"):
        state = fold(
            started(1.0, "node-0", 0, 2), started(1.0, "node-1", 1, 2), ev(Kind.NODE_LEFT, 2.0, "node-1", reason=reason)
        )
        assert state.status == "running", reason
    state = fold(started(1.0, "node-0", 0, 2), started(1.0, "node-1", 1, 2), metric(1.5, 3, loss=1.0))
    state.apply(ev(Kind.NODE_LEFT, 2.0, "node-1", reason="preempted"))
    node = state.nodes["node-1"]
    assert state.status == "restarting" and (node.status, node.left_reason, node.left_at) == ("left", "preempted", 2.0)
    assert [n.name for n in state.running_nodes] == ["node-0"] and state.summary()["nodes_running"] == 1
    assert [(m.step, m.label) for m in state.markers if m.kind == "node_left"] == [(3, "node-1 left (preempted)")]
    # A node leaving a job that is not running (yet) is no restart.
    assert (
        fold(ev(Kind.NODE_JOINED, 1.0, "node-0"), ev(Kind.NODE_LEFT, 2.0, "node-0", reason="lost")).status == "pending"
    )
    # It comes back: joined again, its departure forgotten.
    state.apply(ev(Kind.NODE_JOINED, 3.0, "node-1", pid=5))
    assert (node.status, node.left_reason, node.left_at, node.ranks) == ("starting", None, None, {})


def test_the_peers_of_a_node_stopped_with_the_job_do_not_make_it_restart():
    """Stopping signals the agents one by one; one that sees a stopped peer vanish says it
    restarts its workers before its own SIGTERM lands (seen under load): the job stops."""
    for reason in ("stopped", "stopped: files changed since launch"):
        state = fold(
            started(1.0, "node-0", 0, 2),
            started(1.0, "node-1", 1, 2),
            ev(Kind.NODE_LEFT, 2.0, "node-1", reason=reason),
            ev(Kind.RESTART, 2.1, "node-0", reason="membership_change", message="1 node(s) of round 0 vanished"),
        )
        assert state.status == "running", reason
        assert not [t for t in state.transitions if t["status"] == "restarting"], reason
    # A resumed job regroups as ever.
    state.apply(ev(Kind.JOB_RESUMED, 3.0))
    state.apply(ev(Kind.RESTART, 4.0, "node-0", reason="membership_change"))
    assert state.status == "restarting"


def test_rendezvous_keeps_a_departed_node_departed():
    state = fold(ev(Kind.NODE_JOINED, 1.0, "node-0"), started(2.0, "node-0", 0, 1))
    state.apply(ev(Kind.RENDEZVOUS, 3.0, "node-0", round=4, group_rank=1, group_world_size=2))
    assert (state.nodes["node-0"].status, state.nodes["node-0"].group_rank, state.round) == ("starting", 1, 4)
    state.apply(ev(Kind.NODE_LEFT, 4.0, "node-1", reason="preempted"))
    state.apply(ev(Kind.RENDEZVOUS, 5.0, "node-1", round=5, group_rank=0))
    assert state.nodes["node-1"].status == "left" and state.nodes["node-1"].group_rank == 0 and state.round == 5


def test_pending_names_the_node_or_says_why_the_job_waits():
    pending = ev(Kind.PENDING, 1.0, "pod-1", reason="Unschedulable", message="0/3 nodes have a GPU")
    state = fold(pending)
    assert state.nodes["pod-1"].status == "pending" and state.status == "pending"
    # Why a node waits shows where the job's wait does (dashboard, panel, CLI) until it starts.
    assert state.waiting == describe(pending) == "pod-1 pending: Unschedulable 0/3 nodes have a GPU"
    assert "waiting: pod-1 pending: Unschedulable" in summary_text("spot", state)
    state.apply(ev(Kind.AGENT_STARTED, 1.5, "pod-1", pid=7))
    assert state.waiting is None
    slurm = ev(Kind.PENDING, 1.6, "node-3", reason="Priority", message="Slurm job 5 waits (Priority)")
    state.apply(slurm)
    state.apply(ev(Kind.AGENT_STARTED, 1.7, "node-2", pid=8))  # another node starting says nothing of it
    assert state.waiting == "node-3 pending: Priority Slurm job 5 waits (Priority)"
    state.apply(ev(Kind.NODE_LEFT, 1.8, "node-3", reason="stopped"))
    assert state.waiting is None
    # A wait of the job's own (Kueue's quota for a scale-up) is not replaced by its gated pod's.
    kueue = ev(Kind.QUEUE, 1.85, None, state="waiting", queue="team-a", nodes=2, message="insufficient quota")
    state.apply(kueue)
    state.apply(ev(Kind.PENDING, 1.9, "pod-3", reason="SchedulingGated", message="gates"))
    assert state.waiting == describe(kueue), state.waiting
    quota = ev(Kind.PENDING, 2.0, None, reason="FailedCreate", message="exceeded quota")
    state.apply(quota)
    assert state.waiting == describe(quota) and "exceeded quota" in state.waiting
    assert state.summary()["waiting"] == state.waiting
    state.apply(ev(Kind.NODE_JOINED, 3.0, "pod-2"))
    assert state.waiting is None


# -- restarts and failures ---------------------------------------------------------------


def _running(world: int = 2, **kw) -> JobState:
    state = JobState(max_restarts=3, nnodes=(1, world), **kw)
    for r in range(world):
        state.apply(ev(Kind.NODE_JOINED, 1.0, f"node-{r}", pid=10 + r))
        state.apply(started(2.0, f"node-{r}", r, world))
    return state


def test_restarts_count_the_most_any_agent_used_and_departures_are_free():
    state = _running()
    state.apply(metric(3.0, 8, loss=1.0))
    state.apply(ev(Kind.RESTART, 4.0, "node-0", reason="membership_change", new_nodes=1))
    assert state.restarts == 0 and state.membership_changes == 1 and state.status == "restarting"
    assert state.nodes["node-0"].status == "restarting" and labels(state, "restart") == []
    state.apply(ev(Kind.RESTART, 5.0, "node-0", reason="worker_failed", restarts_used=1, max_restarts=3))
    state.apply(ev(Kind.RESTART, 5.1, "node-1", reason="worker_failed", restarts_used=1, max_restarts=3))
    assert state.restarts == 1 and state.membership_changes == 1
    state.apply(ev(Kind.RESTART, 6.0, "node-1", reason="worker_failed", restarts_used=2, max_restarts=3))
    state.apply(ev(Kind.RESTART, 6.1, "node-0", reason="worker_failed", restarts_used=1, max_restarts=3))  # late
    assert state.restarts == 2 and state.nodes["node-0"].restart_count == 1 and state.nodes["node-1"].restart_count == 2
    assert [(m.step, m.time, m.label) for m in state.markers if m.kind == "restart"] == [
        (8, 5.0, "restart 1/3"),
        (8, 6.0, "restart 2/3"),
    ]
    state.apply(ev(Kind.RESTART, 7.0, "node-1", reason="worker_failed"))  # says no count: none used
    assert state.restarts == 2 and state.summary()["restarts"] == 2 and state.summary()["max_restarts"] == 3
    uncounted = _running()
    uncounted.apply(ev(Kind.RESTART, 7.0, "node-1", reason="worker_failed"))
    assert uncounted.restarts == 0 and uncounted.nodes["node-1"].restart_count == 0
    assert uncounted.status == "restarting" and uncounted.dropped_events == 0
    state.apply(ev(Kind.RESTART, 7.5, "node-1", reason="departure"))
    assert state.membership_changes == 2
    state.apply(ev(Kind.JOB_FINISHED, 8.0, None, status="failed", reason="restart budget spent"))
    state.apply(ev(Kind.RESTART, 9.0, "node-0", reason="worker_failed", restarts_used=3))
    assert state.status == "failed" and state.restarts == 3  # counted, but the ending stands


def test_a_failure_marks_the_chart_once_per_group_and_a_peers_loss_is_only_a_symptom():
    state = _running()
    state.apply(metric(3.0, 4, loss=1.0))
    peer = {"rank": 1, "error": "RuntimeError", "message": "Connection closed by peer", "generation": 1}
    state.apply(ev(Kind.WORKER_FAILED, 4.0, "node-1", cause="peer", **peer))
    assert state.status == "restarting" and state.failures == [] and labels(state, "failure") == []
    state = _running()
    for t, rank, gen, error in ((4.0, 0, 1, "A"), (4.1, 1, 1, "B"), (9.0, 1, 2, "C"), (9.1, 0, 2, "D")):
        state.apply(ev(Kind.WORKER_FAILED, t, f"node-{rank}", rank=rank, error=error, message="bad", generation=gen))
    assert state.status == "restarting" and len(state.failures) == 4 and state.dropped_events == 0
    assert labels(state, "failure") == ["rank 0 failed: A", "rank 1 failed: C"]
    assert state.first_failure is state.failures[2]


def test_symptoms_set_restarting_only_while_the_job_is_not_over():
    for kind, data in (
        (Kind.PEER_LOST, {"lost": ["node-1"], "round": 2}),
        (Kind.WORKER_EXITED, {"local_rank": 0, "pid": 5, "exitcode": 1}),
        (Kind.WORKER_FAILED, {"rank": 0, "error": "E", "message": "m", "generation": 1}),
        (Kind.WORKER_FAILED, {"rank": 0, "error": "E", "message": "m", "cause": "peer"}),
        (Kind.RESTART, {"reason": "worker_failed", "restarts_used": 1}),
    ):
        assert fold(started(1.0, "node-0", 0, 1), ev(kind, 2.0, "node-0", **data)).status == "restarting", kind
        over = fold(started(1.0, "node-0", 0, 1), ev(Kind.JOB_FINISHED, 2.0, None, status="stopped"))
        over.apply(ev(kind, 3.0, "node-0", **data))
        assert over.status == "stopped", kind
    # A worker that exits before the group ran (still pending) is no restart.
    assert fold(ev(Kind.WORKER_EXITED, 2.0, "node-0", local_rank=0, exitcode=1)).status == "pending"
    # A worker starting after the ending does not revive the job.
    late = fold(ev(Kind.JOB_FINISHED, 2.0, None, status="succeeded"), started(3.0, "node-0", 0, 1))
    assert late.status == "succeeded" and late.world_size == 1


def test_the_ending_leaves_every_node_and_keeps_why_each_left():
    state = _running(3)
    state.apply(ev(Kind.NODE_LEFT, 3.0, "node-2", reason="preempted"))
    state.apply(ev(Kind.JOB_FINISHED, 9.0, None, status="succeeded"))
    assert state.finished and state.finished_at == 9.0 and state.reason is None
    assert [(n.status, n.left_reason) for n in state.nodes.values()] == [
        ("left", "finished"),
        ("left", "finished"),
        ("left", "preempted"),
    ]
    assert state.nodes["node-2"].left_at == 3.0 and state.running_nodes == []
    state.apply(ev(Kind.NODE_LEFT, 10.0, "node-0", reason="lost"))
    assert state.status == "succeeded"
    told_nothing = fold(started(1.0, "node-0", 0, 1), ev(Kind.JOB_FINISHED, 2.0, None))
    assert told_nothing.status == "failed" and told_nothing.finished


@pytest.mark.parametrize("status", ["succeeded", "failed", "stopped", "lost"])
def test_every_final_status_is_finished_and_the_others_are_not(status):
    assert fold(ev(Kind.JOB_FINISHED, 1.0, None, status=status)).finished
    assert not fold(ev(Kind.RECOVERING, 1.0, None, reason="supervisor gone")).finished
    assert not _running().finished and not fold(ev(Kind.RESTART, 1.0, "n", reason="departure")).finished


def test_recovery_and_resumption_keep_the_history_and_start_the_budget_again():
    state = _running()
    state.apply(ev(Kind.RESTART, 3.0, "node-0", reason="worker_failed", restarts_used=3))
    state.apply(ev(Kind.WORKER_FAILED, 3.5, "node-0", rank=0, error="E", message="m", generation=1))
    state.apply(ev(Kind.PENDING, 3.6, None, reason="FailedCreate", message="quota"))
    state.apply(ev(Kind.JOB_FINISHED, 4.0, None, status="lost", reason="its supervisor is gone"))
    state.apply(ev(Kind.RECOVERING, 5.0, None, reason="the guardian restarts the supervisor"))
    assert (state.status, state.reason) == ("recovering", "the guardian restarts the supervisor")
    state.apply(ev(Kind.JOB_FINISHED, 6.0, None, status="failed", reason="budget"))
    assert state.finished_at == 6.0
    history = len(state.events)
    state.apply(ev(Kind.JOB_RESUMED, 7.0, None, after="failed", max_restarts=5, nodes=2, min_nodes=1, max_nodes=2))
    assert (state.status, state.reason, state.finished_at, state.waiting) == ("pending", None, None, None)
    assert state.restarts == 0 and state.failures == [] and state.max_restarts == 5
    assert state.resumes == 1 and state.summary()["resumes"] == 1  # what a new handle replays up to
    assert [n.restart_count for n in state.nodes.values()] == [0, 0]
    assert state.started_at == 2.0 and len(state.events) == history + 1  # the history stays
    assert [(m.time, m.label) for m in state.markers if m.kind == "resumed"] == [(7.0, "job resumed")]
    state.apply(ev(Kind.RESUMED, 9.0, "node-0", step=40, from_world_size=2, world_size=2))
    assert labels(state, "resumed") == ["job resumed", "resumed from step 40"]


def test_plan_sets_the_total_and_the_summary_carries_it():
    state = fold(ev(Kind.PLAN, 1.0, "node-0", start=0, total=500))
    assert state.total_steps == 500 and state.summary()["total_steps"] == 500


# -- transitions (the jobs panel's timeline) ---------------------------------------------


def test_each_status_change_is_kept_with_when_and_why_and_the_summary_shows_the_last_eight():
    state = JobState()
    for i in range(12):
        state.apply(started(10.0 * i, "node-0", 0, 1, generation=i))
        state.apply(ev(Kind.PEER_LOST, 10.0 * i + 5, "node-0", lost=["node-1"], round=i))
    assert len(state.transitions) == 16  # bounded: the oldest go
    shown = state.summary()["transitions"]
    assert len(shown) == 8 and shown == list(state.transitions)[-8:]
    assert shown[-1]["status"] == "restarting" and shown[-1]["at"] == 115.0
    first_running = fold(started(3.0, "node-0", 0, 1)).transitions[0]
    assert first_running == {
        "status": "running",
        "at": 3.0,
        "cause": describe(started(3.0, "node-0", 0, 1)),
    }


def test_a_restart_lists_what_happened_in_it_and_a_late_departure_becomes_its_cause():
    state = _running()
    crash = ev(Kind.WORKER_FAILED, 10.0, "node-0", rank=0, error="E", message="m", generation=1)
    state.apply(crash)
    entry = state.transitions[-1]
    assert entry["cause"] == describe(crash) and entry["rooted"] is False and entry["events"] == [describe(crash)]
    symptoms = [
        ev(Kind.WORKER_EXITED, 10.1, "node-0", local_rank=0, pid=3, exitcode=1),
        ev(Kind.PEER_LOST, 10.2, "node-0", lost=["node-1"], round=1),
        ev(Kind.RESTART, 10.3, "node-0", reason="departure"),
        ev(Kind.AGENT_SIGNALED, 10.4, "node-1", signal="SIGTERM"),
    ]
    state.apply_all(symptoms)
    state.apply(ev(Kind.RENDEZVOUS, 10.5, "node-0", round=2, group_rank=0))  # not a symptom
    state.apply(ev(Kind.CHECKPOINT, 10.6, "node-0", step=3))  # nor this
    assert entry["events"] == [describe(crash)] + [describe(s) for s in symptoms]
    left = ev(Kind.NODE_LEFT, 10.7, "node-1", reason="preempted")
    state.apply(left)
    assert entry["cause"] == "node-1 left (preempted)" and entry["rooted"] is True
    drill = ev(Kind.FAULT, 10.8, "node-1", fault="kill_worker", target="rank 1")
    state.apply(drill)
    assert entry["cause"] == "node-1 left (preempted)"  # the first root stays the cause
    for i in range(5):
        state.apply(ev(Kind.WORKER_EXITED, 11.0 + i, "node-0", local_rank=0, pid=i, exitcode=1))
    assert len(entry["events"]) == 8 and entry["events"][6] == describe(drill)
    assert entry["events"][7].startswith("node-0: worker local rank 0 (pid 0)")
    assert [t["status"] for t in state.transitions] == ["running", "restarting"]  # one entry per change


def test_a_departure_that_is_a_finish_explains_no_restart():
    state = _running()
    state.apply(ev(Kind.NODE_LEFT, 9.0, "node-1", reason="finished"))
    crash = ev(Kind.WORKER_FAILED, 10.0, "node-0", rank=0, error="E", message="m", generation=1)
    state.apply(crash)
    assert state.transitions[-1]["cause"] == describe(crash) and state.transitions[-1]["rooted"] is False
    state.apply(ev(Kind.NODE_LEFT, 10.5, "node-1", reason="stopped"))
    assert state.transitions[-1]["cause"] == describe(crash) and state.transitions[-1]["rooted"] is False


@pytest.mark.parametrize(
    "gap_s, is_cause",
    [(0.0, True), (10.0, True), (10.5, False), (-0.5, False)],
    ids=["same-instant", "at-the-window", "past-the-window", "after-the-crash"],
)
def test_a_drill_is_the_cause_of_a_restart_within_ten_seconds_before_it(gap_s, is_cause):
    state = _running()
    drill = ev(Kind.FAULT, 100.0, "node-1", fault="preempt_node", target="node-1")
    state.apply(drill)
    crash = ev(Kind.WORKER_FAILED, 100.0 + gap_s, "node-0", rank=0, error="E", message="m", generation=1)
    state.apply(crash)
    entry = state.transitions[-1]
    assert entry["status"] == "restarting"
    if is_cause:
        assert entry["cause"] == describe(drill) and entry["events"] == [describe(drill), describe(crash)]
        assert entry["rooted"] is True
    else:
        assert entry["cause"] == describe(crash) and entry["events"] == [describe(crash)]
        assert entry["rooted"] is False


def test_a_departure_that_flips_the_job_is_its_own_root():
    state = _running()
    left = ev(Kind.NODE_LEFT, 5.0, "node-1", reason="preempted")
    state.apply(left)
    entry = state.transitions[-1]
    assert entry == {
        "status": "restarting",
        "at": 5.0,
        "cause": describe(left),
        "events": [describe(left)],
        "rooted": True,
        "since": 5.0,  # the outage begins at its cause (#39 item 4)
    }
    state.apply(ev(Kind.WORKER_FAILED, 5.2, "node-0", rank=0, error="E", message="m", generation=1))
    assert entry["cause"] == describe(left) and len(entry["events"]) == 2


# -- summary, gpu, malformed events ------------------------------------------------------


def test_the_summary_is_the_fold_in_a_few_fields():
    state = JobState(max_restarts=2, nnodes=(1, 3))
    assert state.summary() == {
        "loss_tail": [],
        "status": "pending",
        "reason": None,
        "waiting": None,
        "stall": None,
        "warning": None,
        "world_size": 0,
        "nodes_running": 0,
        "target": 1,
        "min_nodes": 1,
        "max_nodes": 3,
        "restarts": 0,
        "max_restarts": 2,
        "resumes": 0,
        "step": None,
        "total_steps": None,
        "loss": None,
        "started_at": None,
        "finished_at": None,
        "ran_s": None,
        "generation": None,
        "transitions": [],
        "nodes": [],
        "step_time_s": None,
        "samples_per_s": None,
        "tokens_per_s": None,
    }
    state.apply(started(1.0, "node-0", 0, 2, generation=6))
    state.apply(ev(Kind.RENDEZVOUS, 1.5, "node-0", round=3, group_rank=0))
    state.apply(started(2.0, "node-0", 0, 2, generation=6))
    state.apply(metric(2.0, 0, loss=0.5, samples=8))
    state.apply(metric(4.0, 1, loss=0.25))
    state.apply(ev(Kind.JOB_FINISHED, 5.0, None, status="succeeded", reason="done"))
    summary = state.summary()
    assert (summary["status"], summary["reason"], summary["world_size"], summary["generation"]) == (
        "succeeded",
        "done",
        2,
        6,
    )
    assert (summary["step"], summary["loss"], summary["loss_tail"]) == (1, 0.25, [0.5, 0.25])
    assert (summary["started_at"], summary["finished_at"], summary["step_time_s"], summary["samples_per_s"]) == (
        1.0,
        5.0,
        2.0,
        4.0,
    )
    assert summary["nodes"] == [
        {
            "name": "node-0",
            "status": "left",
            "group_rank": 0,
            "ranks": [0],
            "restart_count": 0,
            "left_reason": "finished",
        }
    ]
    assert "gpu" not in summary


def test_the_loss_tail_is_at_most_sixty_points_of_the_last_240_rounded():
    state = JobState()
    for step in range(300):
        state.apply(metric(float(step), step, loss=step + 0.1234567))
    tail = state.summary()["loss_tail"]
    assert len(tail) == 60 and tail[0] == 60.123457 and tail[1] == 64.123457 and tail[-1] == 296.123457
    few = fold(*(metric(float(s), s, loss=s + 0.5) for s in range(3))).summary()["loss_tail"]
    assert few == [0.5, 1.5, 2.5]
    assert fold(metric(1.0, 0, acc=0.9)).summary()["loss_tail"] == []


def test_gpu_figures_are_kept_per_rank_of_the_current_world_and_are_not_history():
    state = fold(started(1.0, "node-0", 0, 2))
    figures = {"device": 0, "mem_peak_bytes": 2**30, "mem_total_bytes": 2**34, "util_percent": None}
    state.apply(ev(Kind.GPU, 2.0, "node-0", rank=1, **figures))
    state.apply(ev(Kind.GPU, 2.0, "node-0", rank=3, device=1, mem_peak_bytes=1))  # of a group that went
    state.apply(ev(Kind.GPU, 2.5, "node-0", device=2, util_percent=50))  # no rank: rank 0
    assert state.gpu_ranks == [
        {"rank": 0, "device": 2, "util_percent": 50},
        {"rank": 1, "device": 0, "mem_peak_bytes": 2**30, "mem_total_bytes": 2**34},
    ]
    assert state.summary()["gpu"] == state.gpu_ranks and len(state.events) == 1 and state.last_event_at == 2.5
    before = fold(ev(Kind.GPU, 1.0, "node-0", rank=0, device=0))  # world size not known yet
    assert before.gpu_ranks == [{"rank": 0, "device": 0}]


def test_logs_are_kept_apart_and_bounded():
    state = JobState()
    for i in range(2001):
        state.apply(ev(Kind.LOG, float(i), "node-0", stream="stdout", text=f"line {i}"))
    assert len(state.logs) == 2000 and state.logs[0].get("text") == "line 1" and state.events == []
    assert state.last_event_at == 2000.0


def test_a_malformed_event_is_counted_and_named_not_fatal():
    state = fold(started(1.0, "node-0", 0, 1))
    state.apply(Event(Kind.WORKER_STARTED, 2.0, "node-0", {"rank": "x" * 400, "world_size": 2}))
    assert state.dropped_events == 1 and state.world_size == 1 and state.status == "running"
    assert state.last_dropped.startswith("worker_started: ValueError: invalid literal for int()")
    state.apply(Event(Kind.GPU, 3.0, "node-0", {"rank": None}))
    assert state.dropped_events == 2 and state.last_dropped.startswith("gpu: TypeError")
    state.apply({"kind": "metric", "t": 4.0})  # not an Event at all
    assert state.dropped_events == 3 and state.last_dropped.startswith("?: AttributeError")


# -- the listing overlay and the failure sentences ---------------------------------------


def test_a_cluster_row_takes_every_folded_field_and_a_pending_pod_becomes_running():
    cluster = {"status": "pending", "nodes_running": 0, "target": 1, "min_nodes": 1, "max_nodes": 1}
    state = fold(
        started(1.0, "pod-a", 0, 1, generation=2),
        metric(2.0, 3, loss=0.75),
        ev(Kind.PLAN, 2.0, "pod-a", total=10),
        ev(Kind.DISK_FULL, 2.5, None, message="full"),
    )
    status, row = with_fold("pending", cluster, state)
    summary = state.summary()
    assert status == "running" and row["status"] == "running"
    for key in ("world_size", "restarts", "step", "total_steps", "loss", "loss_tail", "transitions", "generation"):
        assert row[key] == summary[key], key
    assert (row["warning"], row["stall"], row["reason"]) == ("full", None, None)
    assert (row["nodes_running"], row["target"]) == (0, 1)
    # A fold that has not seen the job run does not overrule the cluster.
    submitted = fold(ev(Kind.JOB_SUBMITTED, 1.0, None, nodes=1))
    assert with_fold("running", cluster, submitted)[0] == "running"
    assert with_fold("recovering", cluster, state)[0] == "recovering"


def test_failure_sentences_name_the_rank_the_node_and_memory_plainly():
    failed = ev(Kind.WORKER_FAILED, 1.0, "node-1", rank=3, error="ValueError", message="bad batch")
    assert describe_failure(failed) == "rank 3 on node-1 raised ValueError: bad batch"
    in_data = Event(Kind.WORKER_FAILED, 1.0, None, {"rank": 0, "node": "pod-b", "error": "KeyError", "message": "'x'"})
    assert describe_failure(in_data) == "rank 0 on pod-b raised KeyError: 'x'"
    nowhere = Event(Kind.WORKER_FAILED, 1.0, None, {"rank": 0, "error": "E", "message": "m"})
    assert describe_failure(nowhere) == "rank 0 raised E: m"
    for error in ("MemoryError", "OutOfMemoryError"):
        oom = ev(Kind.WORKER_FAILED, 1.0, "node-0", rank=1, error=error, message="CUDA out of memory")
        assert describe_failure(oom) == f"rank 1 on node-0 ran out of memory ({error}: CUDA out of memory)"


def test_the_first_failure_is_the_earliest_of_the_latest_failed_group():
    assert first_failure([]) is None
    old = ev(Kind.WORKER_FAILED, 1.0, "node-0", rank=0, error="A", message="", generation=1)
    late = ev(Kind.WORKER_FAILED, 9.0, "node-1", rank=1, error="B", message="", generation=2)
    early = ev(Kind.WORKER_FAILED, 8.0, "node-0", rank=0, error="C", message="", generation=2)
    assert first_failure([old, late, early]) is early
    assert first_failure([old]) is old


def test_a_spent_budget_says_so_with_the_root_cause_or_the_fallback():
    failed = ev(Kind.WORKER_FAILED, 1.0, "node-0", rank=0, error="ValueError", message="bad batch", generation=1)
    assert (
        budget_spent_reason([failed], 1, 1, "ignored")
        == "restart budget spent (1/1); rank 0 on node-0 raised ValueError: bad batch"
    )
    assert budget_spent_reason([], 2, 3, "agents gave up") == "restart budget spent (2/3); agents gave up"
    assert budget_spent_reason([], 2, None, "") == "restart budget spent"
    assert budget_spent_reason([], 2, None, "x") == "restart budget spent; x"


def test_elapsed_runs_from_the_start_to_the_end_or_now():
    state = JobState()
    assert elapsed_s(state, now=10.0) is None
    state.apply(started(5.0, "node-0", 0, 1))
    assert elapsed_s(state, now=12.5) == 7.5 and elapsed_s(state, now=1.0) == 0.0
    assert elapsed_s(state) > 0  # the wall clock: long after 5.0
    state.apply(ev(Kind.JOB_FINISHED, 8.0, None, status="succeeded"))
    assert elapsed_s(state, now=100.0) == 3.0


def test_the_symptoms_of_a_second_restart_are_listed_under_it_not_under_the_first():
    state = _running()
    state.apply(ev(Kind.WORKER_FAILED, 10.0, "node-0", rank=0, error="First", message="m", generation=1))
    state.apply(started(12.0, "node-0", 0, 2, generation=2))
    state.apply(ev(Kind.WORKER_FAILED, 20.0, "node-0", rank=0, error="Second", message="m", generation=2))
    exited = ev(Kind.WORKER_EXITED, 20.1, "node-0", local_rank=0, pid=3, exitcode=1)
    state.apply(exited)
    first, healed, second = list(state.transitions)[-3:]
    assert [t["status"] for t in (first, healed, second)] == ["restarting", "running", "restarting"]
    assert len(first["events"]) == 1 and "First" in first["events"][0]
    assert len(second["events"]) == 2 and "Second" in second["events"][0] and second["events"][1] == describe(exited)


def test_a_node_left_told_after_the_survivors_regrouped_leaves_the_job_running():
    """Under load the supervisor may tell a preempted node's node_left after the survivors
    already started their new group without it (seen in CI: the dashboard then read
    'restarting' until the job ended). Its departure ends nothing that is training now; a node
    that has ranks in the running group still means a regroup."""
    state = JobState(max_restarts=5, nnodes=(1, 2))
    state.apply_all(
        [
            started(18.0, "node-0", 0, 2, generation=1),  # node-1's rank of group 1 never started
            ev(Kind.FAULT, 18.7, "node-1", fault="preempt_node", target="node-1"),
            ev(Kind.RESTART, 19.1, "node-0", reason="departure"),
            started(20.7, "node-0", 0, 1, generation=2),
            ev(Kind.NODE_LEFT, 20.8, "node-1", reason="preempted"),
        ]
    )
    assert state.status == Status.RUNNING and state.world_size == 1
    assert state.nodes["node-1"].status == "left"

    state.apply_all([started(30.0, "node-1", 1, 2, generation=3), started(30.0, "node-0", 0, 2, generation=3)])
    state.apply(ev(Kind.NODE_LEFT, 31.0, "node-1", reason="preempted"))  # a member of the running group
    assert state.status == Status.RESTARTING


def test_every_view_counts_steps_done_alike():
    """A 100-step job whose last step (index 99) is done: the dashboard said "step 100 / 100"
    and summary(), the jobs listing, the panel and the CLI "step 99/100" (#30 item 2)."""
    from notebook_elastic.backends.base import JobInfo
    from notebook_elastic.contract.job_state import summary_text
    from notebook_elastic.kernel.launcher import JobList
    from notebook_elastic.kernel.ui.render import header_html
    from notebook_elastic.kernel.views.text import progress_line
    from notebook_elastic.server.routes import job_json

    state = fold(
        metric(1.0, 98, loss=0.5), metric(2.0, 99, loss=0.25), ev(Kind.PLAN, 0.5, "node-0", total=100, start=0)
    )
    assert 'step <b class="ne-step">100</b>/100' in header_html("done", "local", state)
    assert "step 100/100" in summary_text("done", state)
    assert progress_line(state).startswith("step 100/100")
    info = JobInfo("done", "local", "running", summary=state.summary())
    assert " 100/100 " in repr(JobList([info]))
    assert job_json(info)["step"] == 100 and job_json(info)["total_steps"] == 100
    stall = ev(Kind.STALL, 3.0, None, step=state.step, for_s=31.0, stopped=[1], waiting=[0])
    assert describe(stall).startswith("stalled at step 100 for 31s")


def test_the_chart_is_rank_0s_loss_and_the_other_ranks_latest_are_on_demand():
    """report(all_ranks=True): every rank's line at each step. The chart, the header, jobs and the
    panel show rank 0's loss (not every rank's joined in one zigzag line); the others' latest
    values are kept apart."""
    state = fold(
        ev(Kind.METRIC, 1.0, "node-0", rank=0, step=0, values={"loss": 2.0}),
        ev(Kind.METRIC, 1.0, "node-1", rank=1, step=0, values={"loss": 9.0}),
        ev(Kind.METRIC, 2.0, "node-0", rank=0, step=1, values={"loss": 1.0}),
        ev(Kind.METRIC, 2.0, "node-1", rank=1, step=1, values={"loss": 8.0}),
    )
    assert state.metrics["loss"].points() == [(0.0, 2.0), (1.0, 1.0)]
    assert state.metrics.last("loss") == 1.0 and state.summary()["loss"] == 1.0
    assert state.rank_values == {1: {"loss": 8.0}} and state.step == 1


def test_a_clean_end_puts_no_departure_on_the_chart_and_none_in_the_timeline():
    """#39 item 5: every finished job got a "node left" marker on its chart, with no line in
    the timeline; a stopped one too. A departure that is a disruption keeps both."""
    from notebook_elastic.kernel.ui.story import story

    for end in ("finished", "stopped"):
        state = _running()
        state.apply(ev(Kind.NODE_LEFT, 20.0, "node-0", reason=end))
        state.apply(ev(Kind.JOB_FINISHED, 20.5, None, status="succeeded" if end == "finished" else "stopped"))
        assert [m for m in state.markers if m.kind == "node_left"] == [], end
        assert [t for _e, t in story(state.events) if "node-0" in t and "joined" not in t] == [], end
    state = _running()
    state.apply(ev(Kind.NODE_LEFT, 20.0, "node-0", reason="preempted"))
    assert [m.kind for m in state.markers if m.kind == "node_left"] == ["node_left"]
    assert any("node-0 preempted" in text for _e, text in story(state.events))


def test_a_change_in_place_is_no_restart_in_the_transitions():
    """#41 item 7: a membership change whose survivors kept their processes is marked in place
    in the status history (the panel says "changed in place", not "restart"); a real restart
    is not, nor is the change before it once another restart comes."""
    state = _running()
    state.apply(ev(Kind.NODE_LEFT, 10.0, "node-1", reason="preempted"))
    state.apply(ev(Kind.PEER_LOST, 10.1, "node-0", lost=["node-1"], round=1))
    assert state.status == Status.RESTARTING
    state.apply(
        ev(
            Kind.IN_PLACE,
            10.3,
            "node-0",
            world_size=1,
            from_world_size=2,
            step=7,
            redone=0,
            kept=1,
            joined=0,
            took_s=0.2,
        )
    )
    assert state.status == Status.RUNNING
    changed = [t for t in state.transitions if t["status"] == Status.RESTARTING]
    assert [t.get("in_place") for t in changed] == [True]
    state.apply(ev(Kind.PEER_LOST, 20.0, "node-0", lost=["node-2"], round=2))
    state.apply(started(21.0, "node-0", 0, 1, generation=3))  # a group started anew: a restart
    changed = [t for t in state.transitions if t["status"] == Status.RESTARTING]
    assert [t.get("in_place") for t in changed] == [True, None]
    state.apply(ev(Kind.PEER_LOST, 30.0, "node-0", lost=["node-2"], round=3))
    state.apply(started(30.5, "node-0", 0, 1, generation=4, in_place=True))  # told by its worker first
    assert [t.get("in_place") for t in state.transitions if t["status"] == Status.RESTARTING] == [True, None, True]


def test_a_change_in_place_that_broke_no_step_is_in_the_history_from_its_cause():
    """A graceful change in place (a preemption with notice: the node leaves at a step boundary)
    flips no status, yet the panel must say it happened: the history gets it as a change in
    place from its drill to the first rank training in the new group (the timeline's "in place
    at world size 1 after 0.35s" counts the same)."""
    state = _running()
    drill = ev(Kind.FAULT, 10.0, "node-1", fault="preempt_node", target="node-1")
    state.apply(drill)
    state.apply(started(10.35, "node-0", 0, 1, generation=2, in_place=True))
    assert state.status == Status.RUNNING and [t["status"] for t in state.transitions] == ["running"]
    state.apply(
        ev(
            Kind.IN_PLACE,
            10.4,
            "node-0",
            world_size=1,
            from_world_size=2,
            step=9,
            redone=0,
            kept=1,
            joined=0,
            took_s=0.1,
        )
    )
    state.apply(ev(Kind.NODE_LEFT, 10.5, "node-1", reason="preempted"))  # reaped after the others regrouped
    change, back = list(state.transitions)[-2:]
    assert change["status"] == Status.RESTARTING and change["in_place"] is True, change
    assert change["since"] == change["at"] == 10.0 and change["cause"] == describe(drill), change
    assert back["status"] == Status.RUNNING and back["at"] == 10.35, back
    state.apply(
        ev(
            Kind.IN_PLACE,
            30.4,
            "node-0",
            world_size=2,
            from_world_size=1,
            step=90,
            redone=0,
            kept=1,
            joined=1,
            took_s=0.2,
        )
    )  # a join long after, with no drill: from its own start
    change, back = list(state.transitions)[-2:]
    assert (change["at"], change["in_place"], change["rooted"], back["at"]) == (30.2, True, False, 30.4), change


def test_a_change_in_place_that_restarts_no_node_is_running_once_a_node_kept_its_workers():
    """A node scaled away flips the job to restarting; in place, the survivors' agents form the
    new round and keep their workers (``regrouped``): nothing restarts, the job is running again
    before its kept workers re-form. Left "restarting" until they did, the stall watcher (which
    watches a running job) was off: a survivor stuck in the old group's last collective held the
    job for gloo's 120 s, and no stall was told though --stall-timeout was set (an adversary's
    pass). Where a node does restart its workers in the change, the job is restarting until they
    start again."""
    nodes = ("node-0", "node-1", "node-2")
    state = fold(*(started(1.0, n, r, 3, generation=1) for r, n in enumerate(nodes)))
    state.apply(ev(Kind.NODE_LEFT, 2.0, "node-2", reason="scaled_down"))
    assert state.status == Status.RESTARTING
    state.apply(ev(Kind.REGROUPED, 2.1, "node-0", round=1, group_rank=0, group_world_size=2, kept=[11], reason="left"))
    assert state.status == Status.RUNNING

    # node-1 restarts its workers (one was stopped): the job restarts until they start again.
    mixed = fold(*(started(1.0, n, r, 3, generation=1) for r, n in enumerate(nodes)))
    mixed.apply(ev(Kind.NODE_LEFT, 2.0, "node-2", reason="scaled_down"))
    mixed.apply(ev(Kind.IN_PLACE_REFUSED, 2.0, "node-1", reason="local rank 0's worker is stopped"))
    mixed.apply(ev(Kind.RESTART, 2.0, "node-1", reason="membership_change"))
    mixed.apply(ev(Kind.REGROUPED, 2.1, "node-0", round=1, group_rank=0, group_world_size=2, kept=[11], reason="left"))
    assert mixed.status == Status.RESTARTING
    mixed.apply(started(2.3, "node-1", 1, 2, generation=2))
    assert mixed.status == Status.RUNNING
    # The change over, a later one that keeps every worker is running again at its regroup.
    mixed.apply(ev(Kind.NODE_LEFT, 3.0, "node-1", reason="scaled_down"))
    mixed.apply(ev(Kind.REGROUPED, 3.1, "node-0", round=2, group_rank=0, group_world_size=1, kept=[11], reason="left"))
    assert mixed.status == Status.RUNNING

    # A round formed with no worker kept (they restart) is no change in place.
    none_kept = fold(*(started(1.0, n, r, 3, generation=1) for r, n in enumerate(nodes)))
    none_kept.apply(ev(Kind.NODE_LEFT, 2.0, "node-2", reason="scaled_down"))
    none_kept.apply(
        ev(Kind.REGROUPED, 2.1, "node-0", round=1, group_rank=0, group_world_size=2, kept=[], reason="left")
    )
    assert none_kept.status == Status.RESTARTING


def test_a_failure_repeated_as_the_budget_is_spent_ends_on_the_budget_whatever_line_comes_first():
    """The supervisor's verdict on a failure that repeats ("fails the same way every time") is for
    a budget not yet spent; at the failure that spends it, the budget path says it. The agent's
    restart line and the worker's failure come through different pipes: on torch 2.15 the second
    failure was folded before the "restart 1/1" line and the verdict raced the budget. A failed
    group counts for a restart used, whichever line comes first."""
    from notebook_elastic.supervisor.repeats import Repeats

    def failed(pid):
        data = {"rank": 0, "error": "SystemExit", "message": "7", "step": 2, "pid": pid}
        return Event(Kind.WORKER_FAILED, 0.0, "node-0", data)

    # max_restarts=1: the first failure (group 0) is restarted; the second (group 1) spends it.
    repeats = Repeats()
    assert repeats.verdict(failed(100), {0: (100, "node-0", 0)}, restarts=0, max_restarts=1) is None
    # The "restart 1/1" line not folded yet (restarts still 0): no verdict, the budget says it.
    assert repeats.verdict(failed(200), {0: (200, "node-0", 1)}, restarts=0, max_restarts=1) is None
    # With budget left, the second time is the verdict, folded before the restart line or after.
    for restarts in (0, 1):
        repeats = Repeats()
        assert repeats.verdict(failed(100), {0: (100, "node-0", 0)}, restarts=0, max_restarts=20) is None
        said = repeats.verdict(failed(200), {0: (200, "node-0", 1)}, restarts=restarts, max_restarts=20)
        assert said is not None and said[0].startswith("fails the same way every time: rank 0"), said
        assert said[0].endswith("(twice at step 2)") and said[1] is False
    # A fatal failure is said at once, and fatal.
    fatal = Event(Kind.WORKER_FAILED, 0.0, "node-0", {"rank": 0, "error": "E", "message": "m", "fatal": True})
    assert Repeats().verdict(fatal, {}, restarts=0, max_restarts=20) == (describe_failure(fatal), True)
    # A rank whose collective broke because a peer left is a symptom: never a verdict.
    peer = Event(Kind.WORKER_FAILED, 0.0, "node-0", {"rank": 1, "error": "E", "message": "m", "cause": "peer"})
    repeats = Repeats()
    assert repeats.verdict(peer, {}, 0, 20) is None and repeats.verdict(peer, {}, 0, 20) is None

"""The numbers every view writes, one way (#39 item 4): the Python side of the shared table
``tests/data/words.json`` (the jobs panel's TypeScript reads the same table in
labextension/test/format.test.ts), and the fold's one definition of each figure the views
show: steps done, how long a job ran (its stopped spells left out), when an outage began."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from notebook_elastic.contract.event_types import Kind
from notebook_elastic.contract.events import Event, format_duration, gib, rate, sig, status_phrase
from notebook_elastic.contract.job_state import JobState, summary_text

TABLE = json.loads((Path(__file__).parent / "data" / "words.json").read_text())


def _number(value):
    return math.nan if value == "NaN" else value


@pytest.mark.parametrize(("seconds", "said"), TABLE["duration"])
def test_durations_are_written_as_the_shared_table_says(seconds, said):
    assert format_duration(_number(seconds)) == said


@pytest.mark.parametrize(("value", "digits", "said"), TABLE["sig"])
def test_significant_digits_are_written_as_the_shared_table_says(value, digits, said):
    assert sig(value, digits) == said


@pytest.mark.parametrize(("per_s", "unit", "said"), TABLE["rate"])
def test_rates_are_written_as_the_shared_table_says(per_s, unit, said):
    assert rate(per_s, unit) == said


@pytest.mark.parametrize(("n", "said"), TABLE["gib"])
def test_memory_is_written_as_the_shared_table_says(n, said):
    assert gib(n) == said


@pytest.mark.parametrize(("status", "said"), TABLE["status_phrase"])
def test_a_status_reads_as_a_sentence_says_it(status, said):
    assert status_phrase(status) == said


def _run(state: JobState, kind: str, t: float, node: str | None = None, **data) -> None:
    state.apply(Event(kind, t, node, data))


def test_ran_leaves_out_the_time_a_job_sat_stopped_before_a_resume():
    """#39 item 4: the panel's "ran 8 min 32 s" counted the hours a stopped job sat before its
    resume. Two runs of 60 s and 30 s with a day between them ran 90 s, in every view."""
    state = JobState(max_restarts=1, nnodes=(1, 2))
    _run(state, Kind.JOB_SUBMITTED, 1000.0, nodes=1, min_nodes=1, max_nodes=2, max_restarts=1)
    _run(state, Kind.METRIC, 1030.0, step=10, values={"loss": 1.0})
    _run(state, Kind.JOB_FINISHED, 1060.0, status="stopped")
    assert state.ran_s(now=99_999.0) == 60.0
    _run(state, Kind.JOB_RESUMED, 87_400.0, after="stopped", nodes=1, min_nodes=1, max_nodes=2, max_restarts=1)
    assert state.ran_s(now=87_410.0) == 70.0  # live: up to now
    _run(state, Kind.METRIC, 87_420.0, step=99, values={"loss": 0.5})
    _run(state, Kind.JOB_FINISHED, 87_430.0, status="succeeded")
    assert state.ran_s(now=200_000.0) == 90.0
    assert state.summary()["ran_s"] == 90.0
    assert "ran 1m 30s" in summary_text("toy", state)


def test_a_lost_run_counts_up_to_the_last_thing_it_said():
    state = JobState()
    _run(state, Kind.JOB_SUBMITTED, 0.0, nodes=1, min_nodes=1, max_nodes=1, max_restarts=0)
    _run(state, Kind.METRIC, 40.0, step=3, values={"loss": 1.0})  # then the supervisor was killed
    _run(state, Kind.JOB_RESUMED, 500.0, after="lost", nodes=1, min_nodes=1, max_nodes=1, max_restarts=0)
    _run(state, Kind.JOB_FINISHED, 510.0, status="succeeded")
    assert state.ran_s() == 50.0


def test_steps_done_is_the_last_index_reported_plus_one_in_the_summary_too():
    """``job.state.step`` is the index the ranks reported (99 for a 100-step loop's last);
    ``steps_done`` is what every view shows: 100/100."""
    state = JobState()
    _run(state, Kind.JOB_SUBMITTED, 0.0, nodes=1, min_nodes=1, max_nodes=1, max_restarts=0)
    _run(state, Kind.PLAN, 0.5, total=100, start=0)
    _run(state, Kind.METRIC, 1.0, step=99, values={"loss": 0.25})
    assert (state.step, state.steps_done) == (99, 100)
    assert "step 100/100" in summary_text("toy", state)


def test_an_outage_counts_from_its_drill_in_the_fold_as_in_the_timeline():
    """#39 item 4: one preemption took 1.1 s on the dashboard (from the drill) and 0.8 s in
    the panel (from the node's departure). The restart's ``since`` is the drill's time."""
    from notebook_elastic.kernel.ui.story import story

    state = JobState(max_restarts=3, nnodes=(1, 2))
    _run(state, Kind.JOB_SUBMITTED, 100.0, nodes=2, min_nodes=1, max_nodes=2, max_restarts=3)
    for rank, node in ((0, "node-0"), (1, "node-1")):
        _run(
            state, Kind.WORKER_STARTED, 101.0, node, rank=rank, local_rank=0, world_size=2, generation=1, pid=10 + rank
        )
    _run(state, Kind.METRIC, 102.0, step=5, values={"loss": 1.0})
    _run(state, Kind.FAULT, 110.0, "node-1", fault="preempt_node", target="node-1")
    _run(state, Kind.SAVED_ON_NOTICE, 110.2, step=7, seconds=0.2, id=1, grace_s=30.0, notice_node="node-1", saved=True)
    _run(state, Kind.NODE_LEFT, 110.3, "node-1", reason="preempted")
    _run(state, Kind.WORKER_STARTED, 111.1, "node-0", rank=0, local_rank=0, world_size=1, generation=2, pid=20)
    restart = next(t for t in state.transitions if t["status"] == "restarting")
    healed = next(t for t in state.transitions if t["status"] == "running" and t["at"] > restart["at"])
    assert restart["since"] == 110.0
    panel = format_duration(healed["at"] - restart["since"])  # what format.ts's lastDisruption computes
    line = next(text for e, text in story(state.events) if "drill" in text)
    assert (
        line
        == f"node-1 preempted (drill) — back at world size 1 after {panel}"
        == ("node-1 preempted (drill) — back at world size 1 after 1.1s")
    )


def test_a_path_under_the_home_is_written_as_a_person_types_it(monkeypatch, tmp_path):
    """#39 item 11: the README's picture showed the test's temporary job folder; a person's
    folder is under their home, and a command shows it as ~/..., still runnable in a shell."""
    from notebook_elastic.runtime.tracking import shell_path, tensorboard_link

    monkeypatch.setenv("HOME", str(tmp_path / "reader"))
    assert shell_path(str(tmp_path / "reader" / ".notebook-elastic" / "jobs" / "q")) == "~/.notebook-elastic/jobs/q"
    assert shell_path(str(tmp_path / "reader" / "my runs")) == "~/'my runs'"
    assert shell_path("/srv/jobs/q") == "/srv/jobs/q"
    command = tensorboard_link(str(tmp_path / "reader" / ".notebook-elastic" / "jobs" / "q"))["command"]
    assert command.endswith(" --logdir ~/.notebook-elastic/jobs/q"), command


@pytest.mark.parametrize(
    ("before", "after", "reason", "said"),
    [
        (3, 2, "lost", "a node was lost: 3 \u2192 2"),
        (2, 1, "left", "a node left: 2 \u2192 1"),
        (1, 3, "joined", "a node joined: 1 \u2192 3"),
        (2, 2, "store", "the rendezvous store was replaced: 2 \u2192 2"),
        # A change that came during another (an adversary's pass read "a node joined: 2 -> 1",
        # "a node was lost: 2 -> 2" and "a node joined: 2 -> 2"): the sizes are the truth.
        (2, 1, "joined", "the members changed: 2 \u2192 1"),
        (2, 2, "lost", "the members changed: 2 \u2192 2"),
        (2, 2, "joined", "the members changed: 2 \u2192 2"),
        (2, 3, "lost", "the members changed: 2 \u2192 3"),
    ],
)
def test_a_change_in_place_is_told_as_its_sizes_show(before, after, reason, said):
    data = {"round": 1, "from_world_size": before, "world_size": after, "step": 7, "redone": 0, "kept": 1}
    event = Event(Kind.IN_PLACE, 0.0, "node-0", {**data, "joined": 0, "source": -1, "took_s": 0.1, "reason": reason})
    assert event.describe().startswith(said + " ranks in place, training again from step 7"), event.describe()


@pytest.mark.parametrize(
    ("sizes", "nodes", "reason", "said"),
    [
        # A loss during a scale-down read "a node left: 3 -> 1" (issue 41's closing note).
        ((3, 1), (3, 1), "left", "2 nodes went (the first left): 3 \u2192 1"),
        ((3, 1), (3, 1), "lost", "2 nodes went (the first was lost): 3 \u2192 1"),
        ((1, 3), (1, 3), "joined", "2 nodes joined: 1 \u2192 3"),
        ((4, 2), (2, 1), "left", "a node left: 4 \u2192 2"),  # two ranks a node: one node
        ((3, 2), (3, 2), "lost", "a node was lost: 3 \u2192 2"),
        ((3, 1), (0, 1), "left", "a node left: 3 \u2192 1"),  # no kept rank knew the old nodes: as before
    ],
)
def test_a_change_of_several_nodes_in_place_says_how_many(sizes, nodes, reason, said):
    data = {"round": 1, "from_world_size": sizes[0], "world_size": sizes[1], "step": 7, "redone": 0, "kept": 1}
    data.update(from_nodes=nodes[0], nodes=nodes[1], joined=0, source=-1, took_s=0.1, reason=reason)
    event = Event(Kind.IN_PLACE, 0.0, "node-0", data)
    assert event.describe().startswith(said + " ranks in place"), event.describe()

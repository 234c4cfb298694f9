"""The dashboard: pure renderers, and the widget tree driven by a real local job."""

from __future__ import annotations

import re
import time

import pytest
import torch
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.contract.event_types import Kind
from notebook_elastic.contract.events import Event
from notebook_elastic.contract.job_state import JobState, Marker
from notebook_elastic.kernel.ui.render import (
    chart_metrics,
    chart_svg,
    downsample,
    header_html,
    legend_html,
    ranks_html,
    story,
    timeline_html,
)


def test_downsampling_keeps_at_most_1000_points_and_the_spikes():
    steps = list(range(200_000))
    values = [1.0] * 200_000
    values[123_456] = 50.0
    values[777] = -9.0
    points = downsample(steps, values)
    assert len(points) <= 1000
    assert (123_456, 50.0) in points and (777, -9.0) in points
    assert [p[0] for p in points] == sorted(p[0] for p in points)


def test_chart_has_a_line_markers_with_hover_text_and_stays_small():
    steps = list(range(50_000))
    values = [1.0 / (s + 1) for s in steps]
    markers = [Marker(12_000, 0.0, "world_size", "world size 2 → 4"), Marker(30_000, 0.0, "restart", "restart 1/3")]
    svg = chart_svg(steps, values, markers, metric="loss")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert 'data-points="1000"' in svg or int(re.search(r'data-points="(\d+)"', svg).group(1)) <= 1000
    assert 'class="ne-marker ne-marker-world_size" data-step="12000"' in svg and "world size 2 → 4" in svg
    assert 'data-step="30000"' in svg and "restart 1/3" in svg
    assert len(svg) < 40_000  # what a refresh sends, whatever the step count
    assert "waiting for loss" in chart_svg([], [], metric="loss")


def test_header_ranks_and_timeline_render_the_state():
    state = JobState(max_restarts=3, nnodes=(1, 2))
    story = [
        Event(Kind.NODE_JOINED, 1.0, "node-0", {"pid": 10}),
        Event(
            Kind.WORKER_STARTED,
            2.0,
            "node-0",
            {"rank": 0, "local_rank": 0, "world_size": 2, "pid": 11, "generation": 0},
        ),
        Event(
            Kind.WORKER_STARTED,
            2.0,
            "node-0",
            {"rank": 1, "local_rank": 1, "world_size": 2, "pid": 12, "generation": 0},
        ),
        Event(
            Kind.WORKER_FAILED,
            3.0,
            "node-0",
            {
                "rank": 1,
                "error": "ValueError",
                "message": "bad",
                "traceback": "Traceback...\nValueError: bad",
                "generation": 0,
            },
        ),
        Event(Kind.NODE_LEFT, 4.0, "node-1", {"reason": "preempted"}),
    ]
    state.apply_all(story)
    head = header_html("toy", "local", state)
    assert 'class="ne-world-size">2<' in head and 'data-status="restarting"' in head
    ranks = ranks_html(state)
    assert 'data-node="node-1" data-status="left" style="color:#aaa"' in ranks and "preempted" in ranks
    assert "0 (local 0, pid 11)" in ranks
    timeline = timeline_html(state.events)
    assert timeline.index("node-1 preempted") < timeline.index("rank 1 on node-0 failed")  # newest first
    assert "<details><summary>" in timeline and "ValueError: bad" in timeline


def test_the_timeline_tells_a_preemption_in_plain_words_without_its_symptoms():
    state = JobState(max_restarts=5, nnodes=(1, 2))
    ws = {"local_rank": 0, "pid": 1}
    state.apply_all(
        [
            Event(Kind.WORKER_STARTED, 10.0, "node-0", {"rank": 0, "world_size": 2, "generation": 1, **ws}),
            Event(Kind.WORKER_STARTED, 10.0, "node-1", {"rank": 1, "world_size": 2, "generation": 1, **ws}),
            Event(Kind.FAULT, 20.0, "node-1", {"fault": "preempt_node", "target": "node-1"}),
            Event(Kind.SCALED, 20.0, "node-1", {"target": 1, "min_nodes": 1, "max_nodes": 2, "reason": "preempted"}),
            Event(Kind.WORKER_FAILED, 20.2, "node-0", {"rank": 0, "cause": "peer", "error": "RuntimeError"}),
            Event(Kind.RESTART, 20.3, "node-0", {"reason": "departure"}),
            Event(Kind.NODE_LEFT, 20.4, "node-1", {"reason": "preempted"}),
            Event(Kind.RENDEZVOUS, 21.0, "node-0", {"round": 2, "group_rank": 0, "group_world_size": 1}),
            Event(Kind.WORKER_STARTED, 22.0, "node-0", {"rank": 0, "world_size": 1, "generation": 2, **ws}),
            Event(Kind.NODE_LEFT, 30.0, "node-0", {"reason": "scaled_down"}),
        ]
    )
    lines = [text for _e, text in story(state.events)]
    assert lines == [
        "training at world size 2",
        "node-1 preempted (drill) — back at world size 1 after 2.0s",  # once (#11), from the drill
        "training at world size 1",
        "node-0 released (scaled down) — regrouping…",
    ]
    timeline = timeline_html(state.events)
    assert "scaled_down" not in timeline and "a peer left" not in timeline and "rendezvous" not in timeline
    assert "scaled_down" not in ranks_html(state) and "released (scaled down)" in ranks_html(state)


def test_a_drill_is_back_from_the_survivors_restart_even_when_its_node_left_is_told_late():
    """Under load the supervisor may tell the preempted node's node_left after the survivors
    started again (seen in the browser test on 5 test workers: the line said "regrouping…"
    for good): the outage still ends at the first start after the drill."""
    ws = {"local_rank": 0, "pid": 1}
    events = [
        Event(Kind.WORKER_STARTED, 10.0, "node-0", {"rank": 0, "world_size": 2, "generation": 1, **ws}),
        Event(Kind.FAULT, 20.0, "node-1", {"fault": "preempt_node", "target": "node-1"}),
        Event(Kind.WORKER_STARTED, 23.5, "node-0", {"rank": 0, "world_size": 1, "generation": 2, **ws}),
        Event(Kind.NODE_LEFT, 24.0, "node-1", {"reason": "preempted"}),
    ]
    lines = [text for _e, text in story(events)]
    assert lines == [
        "training at world size 2",
        "training at world size 1",
        "node-1 preempted (drill) — back at world size 1 after 3.5s",
    ]
    # A drill right after the first rank started: the other rank of that same group, told after
    # the drill, is not the job back (seen in CI under load: it read "back at world size 2").
    early = [
        Event(Kind.WORKER_STARTED, 8.6, "node-0", {"rank": 0, "world_size": 2, "generation": 0, **ws}),
        Event(Kind.FAULT, 8.7, "node-0", {"fault": "preempt_node", "target": "node-0"}),
        Event(Kind.WORKER_STARTED, 9.2, "node-1", {"rank": 1, "world_size": 2, "generation": 0, **ws}),
        Event(Kind.NODE_LEFT, 9.9, "node-0", {"reason": "preempted"}),
        Event(Kind.WORKER_STARTED, 11.1, "node-1", {"rank": 0, "world_size": 1, "generation": 1, **ws}),
    ]
    lines = [text for _e, text in story(early)]
    assert "node-0 preempted (drill) — back at world size 1 after 2.4s" in lines, lines


def test_chart_ticks_read_as_numbers_and_log_scale_and_smoothing_apply():
    steps = list(range(0, 5000))
    values = [10.0 / (s + 1) for s in steps]
    svg = chart_svg(steps, values)
    ticks = re.findall(r'class="ne-tick"[^>]*>([^<]*)<', svg)
    assert ticks and not any("e+" in t for t in ticks), ticks
    assert "1k" in ticks and "2k" in ticks
    log = chart_svg(steps, values, log_scale=True)
    assert 'data-scale="log"' in log
    log_ticks = re.findall(r'class="ne-tick"[^>]*>([^<]*)<', log)
    assert {"0.01", "0.1", "1", "10"} <= set(log_ticks), log_ticks
    assert 'data-scale="linear"' in chart_svg(steps, [v - 1 for v in values], log_scale=True)  # not all positive
    smoothed = chart_svg(steps, values, smoothing=0.9)
    assert 'class="ne-raw"' in smoothed and 'data-smoothing="0.9"' in smoothed
    assert 'width="100%"' in svg and "viewBox" in svg  # follows its container's width


def test_the_legend_names_each_marker_shown_and_the_menu_hides_bookkeeping():
    markers = [Marker(10, 0.0, "world_size", "world size 2 → 4"), Marker(20, 0.0, "node_left", "node-1 left")]
    legend = legend_html(markers, "loss", 0.6)
    assert "loss (smoothed 0.6)" in legend and "world size changed" in legend and "node left" in legend
    assert "restart" not in legend
    assert chart_metrics(["gen", "loss", "lr", "start"]) == ["loss", "lr"]


def test_the_header_says_how_often_the_job_saves_and_what_share_of_the_loop_it_blocks():
    state = JobState(max_restarts=3, nnodes=(1, 1))
    state.apply(Event(Kind.WORKER_STARTED, 1.0, "node-0", {"rank": 0, "local_rank": 0, "world_size": 1}))
    saved = {"step": 40, "bytes": 10**6, "ms": 30.0, "commits": 5, "every": 8, "chosen": True, "blocked_pct": 6.5}
    state.apply(Event(Kind.CHECKPOINT, 2.0, "node-0", saved))
    text = re.sub(r"<[^>]+>", "", header_html("toy", "local", state))  # what a person reads
    assert "checkpoint every 8 steps, blocks 6.5 %" in text, text
    assert "blocked 6.5 % of the loop since the last one" in Event(Kind.CHECKPOINT, 2.0, "node-0", saved).describe()


def test_the_header_shows_the_jobs_share_over_every_worker_group_not_one_window():
    """#39 item 2: the header showed one checkpoint event's window, a group's first (one step
    and its first save: 37 %), for a job that blocked well under a tenth of its loop. Now: the
    share of the job's loop, from the running totals rank 0's metrics carry, banked at each new
    worker group, shown once ten seconds of the loop are measured."""
    state = JobState(max_restarts=3, nnodes=(1, 1))
    state.apply(Event(Kind.WORKER_STARTED, 1.0, "node-0", {"rank": 0, "local_rank": 0, "world_size": 1}))

    def report(t: float, step: int, blocked_s: float, loop_s: float) -> None:
        values = {"step": step, "rank": 0, "values": {"loss": 1.0}, "blocked_s": blocked_s, "loop_s": loop_s}
        state.apply(Event(Kind.METRIC, t, "node-0", values))

    first = {"step": 1, "commits": 1, "every": 1, "chosen": True, "blocked_pct": 37.0}
    report(1.1, 0, 0.03, 0.081)
    state.apply(Event(Kind.CHECKPOINT, 1.2, "node-0", first))
    text = re.sub(r"<[^>]+>", "", header_html("toy", "local", state))
    # Not the window's 37 %. (Not "37" anywhere: the header's "ran ...h" counts from these
    # events' t, seconds after 1970, and held "498837h" on one day of CI.)
    assert "checkpoint every step, its cost being measured" in text and not re.search(r"\b37(\.0)? ?%", text), text
    report(8.0, 39, 0.09, 7.0)  # the group's last report: then a restart
    report(9.0, 35, 0.001, 0.05)  # a new group's State: its totals start again
    state.apply(Event(Kind.CHECKPOINT, 9.5, "node-0", {**first, "step": 40, "commits": 9, "every": 4}))
    report(14.0, 59, 0.05, 5.0)
    text = re.sub(r"<[^>]+>", "", header_html("toy", "local", state))
    assert "checkpoint every ~6 steps, blocks 1.2 %" in text, text  # (0.09 + 0.05) / 12.0; 60 steps / 10 saves


def test_a_job_between_its_last_step_and_its_outcome_is_ending_not_running_on_no_node():
    state = JobState(max_restarts=3, nnodes=(1, 2))
    state.apply_all(
        [
            Event(Kind.PLAN, 1.0, "node-0", {"start": 0, "total": 10}),
            Event(Kind.NODE_JOINED, 1.0, "node-0", {}),
            Event(Kind.WORKER_STARTED, 1.0, "node-0", {"rank": 0, "local_rank": 0, "world_size": 1}),
            Event(Kind.METRIC, 2.0, "node-0", {"step": 9, "values": {"loss": 0.1}}),
        ]
    )
    assert "nodes 1" in re.sub(r"<[^>]+>", "", header_html("toy", "local", state))
    state.apply(Event(Kind.NODE_LEFT, 3.0, "node-0", {"reason": "finished"}))  # the outcome comes next
    text = re.sub(r"<[^>]+>", "", header_html("toy", "local", state))
    assert "all steps done, ending" in text and "nodes 0" not in text, text
    state.apply(Event(Kind.JOB_FINISHED, 4.0, None, {"status": "succeeded"}))
    assert "range 1:2" in re.sub(r"<[^>]+>", "", header_html("toy", "local", state))


def test_the_header_says_status_world_size_step_eta_and_loss_in_one_line():
    state = JobState(max_restarts=3, nnodes=(1, 2))
    state.apply_all(
        [
            Event(Kind.PLAN, 1.0, "node-0", {"start": 0, "total": 100}),
            Event(Kind.WORKER_STARTED, 1.0, "node-0", {"rank": 0, "local_rank": 0, "world_size": 2, "generation": 0}),
        ]
        + [
            Event(Kind.METRIC, 2.0 + i, "node-0", {"step": i, "values": {"loss": 1.0 / (i + 1), "gen": 0}})
            for i in range(10)
        ]
    )
    head = header_html("toy", "local", state)
    glance = re.search(r'<div class="ne-glance".*?</div>', head).group(0)
    for part in (
        'data-status="running"',
        'class="ne-world-size">2<',
        'class="ne-step">10<',
        "</b>/100",
        "ETA",
        'class="ne-loss">0.1<',
    ):
        assert part in glance, part
    text = re.sub(r"<[^>]+>", "", re.sub(r"<style.*?</style>", "", glance))  # what a person reads
    assert "world size 2 · nodes 1 (1:2) · step 10/100" in text and "loss 0.1" in text, text
    # Ended, the job runs on no node: the header gives its range, not "nodes 0" (#11 item 6).
    state.apply(Event(Kind.JOB_FINISHED, 20.0, None, {"status": "succeeded", "reason": "finished"}))
    ended = re.sub(r"<[^>]+>", "", re.sub(r"<style.*?</style>", "", header_html("toy", "local", state)))
    assert "nodes 0" not in ended and "range 1:2" in ended, ended


TRAIN = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(4, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), lr=0.01)
    time.sleep(0.03)
"""


@pytest.mark.slow
def test_a_real_job_drives_the_widgets_and_the_controls_drive_the_job(home):
    from notebook_elastic.kernel.ui import Dashboard

    job = ne.launch(
        TRAIN,
        nnodes="1:2",
        nproc_per_node=1,
        max_restarts=5,
        name="dash",
        user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 100_000},
    )
    dash = Dashboard(job)
    try:
        wait_for(
            lambda: 'class="ne-world-size">1<' in dash.header.value and 'data-status="running"' in dash.header.value,
            "world size 1 in the header",
        )
        wait_for(lambda: "ne-line" in dash.chart.value, "the loss line")
        assert dash.metric.options == ("loss", "lr") and dash.metric.value == "loss"
        points_before = int(re.search(r'data-total-points="(\d+)"', dash.chart.value).group(1))
        wait_for(
            lambda: int(re.search(r'data-total-points="(\d+)"', dash.chart.value).group(1)) > points_before + 10,
            "the chart gaining points",
        )

        # The nodes box + Scale button call job.scale; the job follows; the view shows it.
        dash.target.value = 2
        dash.scale_button.click()
        assert dash.scale_button.disabled  # in flight
        wait_for(lambda: 'class="ne-world-size">2<' in dash.header.value, "world size 2 on the page")
        # In place: the node joins, the kept rank goes on from the step it was at.
        wait_for(lambda: any(e.kind in (Kind.RESUMED, Kind.IN_PLACE) for e in job.events), "the change")
        resumed = next(e for e in job.events if e.kind in (Kind.RESUMED, Kind.IN_PLACE))
        # At the step the new size trains from (an automatic save interval back from the last
        # step reported at the old size, under load), drawn where it is.
        (marker,) = [m for m in job.state.markers if m.kind == "world_size"]
        assert marker.step == resumed.get("step")
        wait_for(
            lambda: f'ne-marker-world_size" data-step="{marker.step}"' in dash.chart.value, "the world-size marker"
        )
        wait_for(lambda: 'data-node="node-1" data-status="running"' in dash.ranks.value, "node-1's ranks in the map")

        # The range slider calls set_range.
        dash.range.value = (1, 3)
        wait_for(lambda: job.state.nnodes == (1, 3) and not dash.range.disabled, "the new range")
        wait_for(lambda: dash.target.max == 3, "the nodes box to follow the range")

        # Drill: kill a worker; the timeline shows the restart.
        wait_for(lambda: job.status == "running", "running again")
        dash.kill_button.click()
        wait_for(lambda: 'data-kind="restart"' in dash.timeline.value, "the restart in the timeline")
        wait_for(lambda: "killed rank" in dash.message.value, "the drill's result")

        # (Renders are throttled to at most 4 a second: benchmarks/dashboard.py measures it.)

        # Closing the view does not stop the job: it goes on training.
        dash.close()
        closed_at = job.state.step
        wait_for(lambda: job.finished or job.state.step >= closed_at + 10, "ten more steps after closing the view")
        assert not job.finished, job.summary()
        dash = Dashboard(job)
        # Stop asks once, then stops.
        dash.stop_button.click()
        assert dash.stop_button.description == "Confirm stop" and not job.finished
        dash.stop_button.click()
        wait_for(lambda: job.status == "stopped", "the job to stop")
        wait_for(
            lambda: dash.kill_button.disabled and dash.stop_button.disabled and dash.scale_button.disabled,
            "controls disabled",
        )
    finally:
        dash.close()
        job.stop()


@pytest.mark.slow
def test_a_prepared_job_is_shaped_and_started_from_the_dashboard(home):
    from notebook_elastic.kernel.ui import Dashboard

    job = ne.launch(
        TRAIN,
        nnodes="1:2",
        name="prep",
        dry_run=True,
        user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 30},
    )
    dash = Dashboard(job)
    try:
        assert job.status == "prepared" and not dash.start_button.disabled and not dash.nproc.disabled
        dash.nproc.value = 2
        dash.range.value = (1, 1)
        dash.start_button.click()
        wait_for(lambda: job.status != "prepared", "the start")
        assert job.wait(120) == "succeeded"
        assert job.spec.nproc_per_node == 2 and job.spec.nnodes == (1, 1) and job.world_size == 2
    finally:
        dash.close()


@pytest.mark.slow
def test_a_number_typed_in_the_nodes_box_survives_the_jobs_events_until_scale(home):
    from notebook_elastic.kernel.ui import Dashboard

    job = ne.launch(
        TRAIN,
        nnodes="1:3",
        name="typed",
        user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 100_000},
    )
    dash = Dashboard(job)
    try:
        wait_for(lambda: job.status == "running" and job.state.step is not None, "the job to run")
        dash.target.value = 3  # typed, Scale not pressed yet
        seen = len(job.events)
        renders = dash.renders
        wait_for(
            lambda: any(e.kind == Kind.CHECKPOINT for e in job.events[seen:]) and dash.renders > renders + 2,
            "a checkpoint event and a few renders after the typing",
        )
        wait_for(lambda: dash.renders > renders + 4, "more renders")
        assert dash.target.value == 3
        dash.scale_button.click()
        wait_for(lambda: "scaling to 3 node(s)" in dash.message.value, "the Scale answer")
        wait_for(lambda: 'class="ne-world-size">3<' in dash.header.value, "world size 3 on the page")
        # The answer goes once the header tells the effect (#30 item 4): not "scaling" forever.
        wait_for(lambda: dash.message.value == "", "the Scale answer to fade", timeout=60)
        checkpoints = [e for e in job.events if e.kind == Kind.CHECKPOINT]
        assert len(checkpoints) < job.state.step / 5  # coalesced, not one per commit
    finally:
        dash.close()
        job.stop()


def test_a_dashboard_carries_its_kernel_gone_word_and_a_static_twin(home):
    """Item 7 of #11: the word shows once ipywidgets marks the view disconnected (kernel
    restarted, or models restored from saved widget state); the mime bundle's text/html is
    the last picture for front ends without live models, with the word visible."""
    from notebook_elastic.kernel.ui import Dashboard

    job = ne.launch(
        TRAIN,
        nnodes="1:2",
        name="twin",
        dry_run=True,
        user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 30},
    )
    dash = Dashboard(job)
    try:
        offline = dash.offline.value
        assert "the kernel that drew this is gone (restarted or shut down)" in offline
        assert "%elastic_attach twin" in offline
        assert 'class="ne-offline" data-job="twin" style="display:none' in offline  # hidden while live
        assert ".jupyter-widgets-disconnected .ne-offline{display:block!important}" in offline
        assert 'class="ne-attach' in offline and 'data-command="%elastic_attach twin"' in offline
        bundle = dash._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        twin = bundle["text/html"]
        assert 'class="ne-snapshot"' in twin and 'style="display:block' in twin and "%elastic_attach twin" in twin
        assert 'class="ne-chart"' in twin and 'class="ne-header"' in twin
        # Only the controls a prepared job needs: set-up shown, drills not.
        assert dash.setup.layout.display is None and dash.drills.layout.display == "none"
    finally:
        dash.close()


def test_a_job_that_ended_without_its_metric_says_the_cell_never_reported_it(home):
    """Waiting for a loss the cell never reports, for ever, told a newcomer nothing: once the
    job ended with none, the chart says which call draws it."""
    from notebook_elastic.kernel.ui import Dashboard

    job = ne.launch("state = elastic.State()\nfor step in state.steps(3):\n    state.commit()\n", name="unreported")
    assert job.wait(120) == "succeeded", job.summary()
    dash = Dashboard(job)
    try:
        wait_for(lambda: "elastic.report(loss=...)" in dash.chart.value, "the chart's word", timeout=30)
        assert "no loss was reported: the cell&#x27;s elastic.report(loss=...) draws it here" in dash.chart.value
    finally:
        dash.close()


def test_a_restart_shorter_than_a_frame_is_still_drawn_for_a_frame(home):
    """A restart over in 0.1 s falls between two frames (4 a second): the header drew only
    the status at each frame, so "restarting" was never on the page (a flaky browser test on
    an idle machine). Each status the job passed through is drawn for a frame of its own, in
    order, then the present; an in-place change (no status of its own lasted) is not held."""
    from notebook_elastic.kernel.ui import Dashboard

    job = ne.launch(
        TRAIN, name="flash", dry_run=True, user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 30}
    )
    dash = Dashboard(job, max_updates_per_s=20)
    drawn: list[str] = []
    dash.header.observe(
        lambda change: drawn.append(re.search(r'data-status="(\w+)"', change["new"]).group(1)), names="value"
    )
    ws = {"local_rank": 0, "pid": 1}

    def told(*events: Event) -> None:  # as the follower folds them: under the job's lock, then the callbacks
        for e in events:
            with job._lock:
                job._state.apply(e)
            dash._on_event(e, job)

    try:
        now = time.time()
        told(
            Event(Kind.WORKER_STARTED, now, "node-0", {"rank": 0, "world_size": 2, "generation": 1, **ws}),
            Event(Kind.WORKER_STARTED, now, "node-1", {"rank": 1, "world_size": 2, "generation": 1, **ws}),
        )
        wait_for(lambda: drawn and drawn[-1] == "running", "running drawn", 10, poll_s=0.01)
        now = time.time()
        told(  # a whole restart between two frames
            Event(Kind.FAULT, now, "node-1", {"fault": "preempt_node", "target": "node-1"}),
            Event(Kind.WORKER_FAILED, now, "node-0", {"rank": 0, "cause": "peer", "error": "RuntimeError"}),
            Event(Kind.RESTART, now, "node-0", {"reason": "departure"}),
            Event(Kind.WORKER_STARTED, now + 0.1, "node-0", {"rank": 0, "world_size": 1, "generation": 2, **ws}),
        )
        assert job.status == "running"
        wait_for(
            lambda: "restarting" in drawn and drawn[-1] == "running", "the restart drawn, then running", 10, poll_s=0.01
        )
        held = drawn[drawn.index("restarting") :]
        assert held[0] == "restarting" and held[-1] == "running", drawn
        # A replayed history (an attach, a resume) is not flashed again: its times are old.
        drawn.clear()
        old = now - 60
        told(
            Event(Kind.WORKER_FAILED, old, "node-0", {"rank": 0, "cause": "peer", "error": "RuntimeError"}),
            Event(Kind.RESTART, old, "node-0", {"reason": "departure"}),
            Event(Kind.WORKER_STARTED, old + 0.1, "node-0", {"rank": 0, "world_size": 1, "generation": 3, **ws}),
        )
        time.sleep(0.5)  # ten frames
        assert "restarting" not in drawn, drawn
    finally:
        dash.close()


@pytest.mark.slow
def test_the_output_is_republished_at_each_status_so_a_saved_notebook_keeps_the_last_picture(home):
    """Item 7 of #11: the display is updated (its text/html twin with it) when the job ends,
    so a notebook saved and reloaded after the kernel is gone shows how the job ended, not
    how it began. Once: a re-published widget is redrawn, which a person would see."""
    import re

    from notebook_elastic.kernel.ui import Dashboard

    class Handle:  # IPython's DisplayHandle, as the front end receives its updates
        def __init__(self) -> None:
            self.pictures: list[str] = []

        def update(self, obj) -> None:
            html = obj._repr_mimebundle_()["text/html"]
            self.pictures.append(re.search(r'class="ne-status" data-status="(\w+)"', html).group(1))

    job = ne.launch(
        TRAIN, name="pictures", dry_run=True, user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 30}
    )
    dash = Dashboard(job)
    handle = dash.display_handle = Handle()
    try:
        job.start()
        job.wait(300)
        deadline = time.monotonic() + 60
        while not handle.pictures or handle.pictures[-1] != "succeeded":
            assert time.monotonic() < deadline, handle.pictures
            time.sleep(0.1)
    finally:
        dash.close()
    time.sleep(1.5)  # a second publication would come within the dashboard's next renders
    assert handle.pictures == ["succeeded"], handle.pictures


@pytest.mark.slow
def test_the_nodes_box_follows_a_preemption(home):
    """A preemption lowers the job's target: the supervisor says so in a scaled event, and
    the nodes box follows (it read 2 on one node before, #11)."""
    from notebook_elastic.kernel.ui import Dashboard

    job = ne.launch(
        TRAIN,
        nnodes="1:2",
        nodes=2,
        name="preempted",
        user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 100_000},
    )
    dash = Dashboard(job)
    try:
        # Training (a step reported): its State can save on notice.
        wait_for(lambda: job.status == "running" and job.state.world_size == 2 and job.state.step, "world size 2")
        assert dash.target.value == 2 and dash.drills.layout.display is None and dash.setup.layout.display == "none"
        dash.preempt_button.click()
        # The drill gives notice (30 s, a kubelet's default): the job saves, then the node goes.
        wait_for(lambda: "preempting node-" in dash.message.value, "the drill's answer")
        assert "30 s notice: the job saves first" in dash.message.value, dash.message.value
        # In place the others keep the values (no save needed); else rank 0 saves first.
        wait_for(
            lambda: "saved on notice at step" in dash.timeline.value or "no save needed" in dash.timeline.value,
            "the answer to the notice in the timeline",
        )
        wait_for(lambda: job.state.target == 1, "the target to follow the preemption")
        wait_for(lambda: dash.target.value == 1, "the nodes box to follow the preemption")
        wait_for(lambda: 'class="ne-world-size">1<' in dash.header.value, "world size 1")
        wait_for(lambda: "at world size 1 after" in dash.timeline.value, "the preemption told in plain words")
        job.stop()
        wait_for(
            lambda: dash.drills.layout.display == "none" and dash.stop_button.layout.display == "none",
            "a finished job's controls gone",
        )
    finally:
        dash.close()
        job.stop()


def test_a_dashboard_follows_a_range_changed_elsewhere_without_setting_it_back(home):
    """The job's range moves (another kernel, the CLI, an attach that learns it late): the
    slider follows and calls nothing. Before, its held notification fired after the quiet
    flag was lowered, so opening a dashboard on a Kubernetes job restarted all its agents."""
    from notebook_elastic.backends.local import LocalBackend
    from notebook_elastic.kernel.job import ElasticJob
    from notebook_elastic.kernel.ui import Dashboard

    job = ElasticJob("elsewhere", LocalBackend())  # not followed: the test moves its state
    calls: list = []
    job.set_range = lambda *a, **k: calls.append(a)  # a spy: any call is the bug
    job.scale = lambda *a, **k: calls.append(a)
    dash = Dashboard(job)
    try:
        job.state.apply(Event(Kind.SCALED, time.time(), None, {"target": 3, "min_nodes": 2, "max_nodes": 5}))
        dash._mark("controls")
        wait_for(lambda: tuple(dash.range.value) == (2, 5), "the slider at the job's new range")
        wait_for(lambda: dash.target.value == 3, "the nodes box at the job's new target")
        # The held notification fires as the render ends; an echo would mark "range" busy
        # then (before its thread calls the spy). Two renders later: none.
        renders = dash.renders
        wait_for(lambda: dash.renders >= renders + 2, "two more renders")  # a live job re-renders its header
        assert "range" not in dash.controls._busy and "scale" not in dash.controls._busy and calls == []
    finally:
        dash.close()


def test_stops_hint_asks_in_amber_and_goes_with_the_confirmation(home):
    """#39 item 8: the hint under Stop outlived its confirmation (clicking as it said only armed
    the button again) and was green, the colour of done. A prepared job: nothing launches."""
    from notebook_elastic.kernel.ui import Dashboard
    from notebook_elastic.kernel.ui.controls import MESSAGE_COLORS

    job = ne.launch(
        TRAIN,
        nnodes="1:2",
        name="hint",
        dry_run=True,
        user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 5},
    )
    dash = Dashboard(job)
    try:
        dash.controls.stop_confirm_s = 0.6
        dash.stop_button.click()
        assert dash.stop_button.description == "Confirm stop"
        assert "click Confirm stop within 0.6 s" in dash.message.value
        assert MESSAGE_COLORS["ask"] in dash.message.value and MESSAGE_COLORS["ok"] not in dash.message.value
        # The late answer of an earlier action (a range change whose agents restart slowly, as
        # in a CI run under load) is said beside the question, never in its place.
        dash.controls.say("range 2:2 (agents restarted with the new range)", fades=True)
        first, second = dash.message.value.split("</span>", 1)
        assert "click Confirm stop within 0.6 s" in first and "range 2:2" in second, dash.message.value
        wait_for(lambda: dash.stop_button.description == "Stop", "the confirmation to lapse", timeout=10)
        wait_for(lambda: "Confirm stop" not in dash.message.value, "the hint to go with it", timeout=2)
        assert "range 2:2" in dash.message.value  # the answer stays its own while
        assert job.status == "prepared"  # nothing was stopped
    finally:
        dash.close()


@pytest.mark.slow
def test_a_dashboard_follows_a_resume_from_the_terminal_and_the_range_survives_it(home):
    """#39 item 3: after a resume from the CLI the notebook's dashboard still said "stopped
    889/3000" while the panel and the CLI said "succeeded 3000/3000"; and the resume put the
    range set with the slider (1:4) back to the cell's (1:2)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from notebook_elastic.kernel.ui import Dashboard

    job = ne.launch(
        TRAIN,
        nnodes="1:2",
        nproc_per_node=1,
        name="resumed-elsewhere",
        user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 120},
    )
    dash = Dashboard(job)
    try:
        wait_for(lambda: (job.state.step or 0) >= 5, "step 5", job=job, give_up_when_finished=True)
        dash.range.value = (1, 4)  # the slider: set_range
        wait_for(lambda: job.state.nnodes == (1, 4) and job.status == "running", "the new range, training")
        job.stop()
        wait_for(lambda: 'data-status="stopped"' in dash.header.value, "the dashboard to say stopped")
        stopped_at = job.state.steps_done
        cli = Path(sys.executable).with_name("notebook-elastic")
        done = subprocess.run(
            [str(cli), "resume", "resumed-elsewhere"], capture_output=True, text=True, timeout=120, env=dict(os.environ)
        )
        assert done.returncode == 0, done.stderr
        wait_for(
            lambda: 'data-status="succeeded"' in dash.header.value and 'class="ne-step">120<' in dash.header.value,
            "the dashboard to follow the resumed run to its end",
            timeout=240,
        )
        assert stopped_at < 120 and job.status == "succeeded" and job.state.steps_done == 120
        resumed = [e for e in job.events if e.kind == Kind.JOB_RESUMED]
        assert [(e.get("min_nodes"), e.get("max_nodes")) for e in resumed] == [(1, 4)]
        assert job.state.nnodes == (1, 4) and tuple(dash.range.value) == (1, 4)
    finally:
        dash.close()
        job.stop()

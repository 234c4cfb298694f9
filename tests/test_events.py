"""The event parser on real torchrun 2.13 agent output, and the job-state fold over it.

tests/data/agent-node-*.log are the raw stdout+stderr of two agents of a real local job
(scale 1 -> 2 nodes, a SIGKILLed worker, node-1 preempted), metric lines removed for size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notebook_elastic.contract.event_types import Kind
from notebook_elastic.contract.events import Event, LineParser, describe
from notebook_elastic.contract.job_state import JobState

DATA = Path(__file__).parent / "data"


def parse_log(name: str) -> list[Event]:
    parser = LineParser(name, "stdout")
    events = []
    for n, line in enumerate((DATA / f"agent-{name}.log").read_text().splitlines()):
        event = parser.feed(line, t=1000.0 + n * 0.001)
        if event is not None:
            events.append(event)
    return events


def test_agent_lines_become_typed_events():
    events = parse_log("node-0")
    kinds = [e.kind for e in events if e.kind not in (Kind.LOG,)]
    rounds = [e.get("round") for e in events if e.kind == Kind.RENDEZVOUS]
    assert rounds == [0, 1, 2, 3]
    restarts = [(e.get("reason"), e.get("restarts_used")) for e in events if e.kind == Kind.RESTART]
    assert restarts == [("membership_change", None), ("worker_failed", 1), ("worker_failed", 2)]
    exited = [e.data for e in events if e.kind == Kind.WORKER_EXITED]
    assert exited[0]["signal"] == 9 and exited[0]["local_rank"] == 0 and exited[1]["exitcode"] == 1
    assert kinds.count(Kind.WORKER_STARTED) == 8  # 4 groups x 2 local workers
    assert Kind.GROUP_SUCCEEDED in kinds and Kind.AGENT_STARTED in kinds
    failed = [e for e in events if e.kind == Kind.WORKER_FAILED]
    assert failed and "Traceback (most recent call last)" in failed[0].get("traceback")
    assert all(e.node == "node-0" for e in events)


def test_preempted_agent_reports_the_signal_by_name():
    events = parse_log("node-1")
    signaled = [e for e in events if e.kind == Kind.AGENT_SIGNALED]
    assert [e.get("signal") for e in signaled] == ["SIGTERM"]
    assert "agent received SIGTERM" in describe(signaled[0])


def test_torn_and_odd_lines():
    parser = LineParser("node-3")
    torn = parser.feed('step 2 rank 1@@elastic {"kind":"metric","t":5.0,"rank":0,"step":2,"values":{"loss":1.5}}')
    assert (
        torn.kind == Kind.METRIC and torn.get("values") == {"loss": 1.5} and torn.time == 5.0 and torn.node == "node-3"
    )
    broken = parser.feed('@@elastic {"kind": "metric", "t": ')
    assert broken.kind == Kind.LOG and broken.get("text").startswith("@@elastic")
    assert parser.feed("\n") is None
    plain = parser.feed("hello from rank 0", t=7.0)
    assert plain.kind == Kind.LOG and plain.get("text") == "hello from rank 0" and plain.time == 7.0
    nan = parser.feed('@@elastic {"kind":"metric","t":1,"rank":0,"step":1,"values":{"loss":NaN}}')
    assert nan.kind == Kind.METRIC and nan.get("values")["loss"] != nan.get("values")["loss"]
    assert parser.feed("I1122 03:07:14.821000 5367 torch/x.py:1] something unremarkable") is None
    # A store wait that ended at its bound (torch's client, as printed by torch 2.13): not an event.
    for timed_out in (
        "[W1127 14:50:05.553302474 socket.cpp:469] [c10d] waitForInput: poll for socket SocketImpl(fd=15, "
        "addr=[::ffff:127.0.0.1]:49484, remote=[::ffff:127.0.0.1]:34955) returned 0, likely a timeout",
        "[W1127 14:50:05.553848475 socket.cpp:494] [c10d] waitForInput: socket SocketImpl(fd=15, "
        "addr=[::ffff:127.0.0.1]:49484, remote=[::ffff:127.0.0.1]:34955) timed out after 200ms",
    ):
        assert parser.feed(timed_out) is None
    refused = "[W1127 13:06:39.376367209 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host"
    assert parser.feed(refused).kind == Kind.LOG  # a store that does not answer is still told


def test_events_round_trip_through_json_lines():
    event = Event(Kind.NODE_LEFT, 12.5, "node-2", {"reason": "preempted", "exitcode": -15})
    assert Event.from_line(event.to_line()) == event


def test_state_folds_two_agents_into_the_job_story():
    events = sorted(parse_log("node-0") + parse_log("node-1"), key=lambda e: e.time)
    # The supervisor's own events, as it writes them around the agents' lines.
    story = [
        Event(
            Kind.JOB_SUBMITTED,
            999.0,
            None,
            {"nodes": 1, "min_nodes": 1, "max_nodes": 3, "nproc_per_node": 2, "max_restarts": 5},
        )
    ]
    story += [Event(Kind.NODE_JOINED, 999.5, "node-0", {"pid": 1})]
    story += events
    state = JobState()
    sizes = []
    for event in story:
        before = state.world_size
        state.apply(event)
        if state.world_size != before:
            sizes.append(state.world_size)
    assert sizes == [2, 4, 2]
    assert state.restarts == 2 and state.max_restarts == 5 and state.membership_changes >= 1
    assert [m.kind for m in state.markers if m.kind == "world_size"] == ["world_size", "world_size"]
    assert state.status == "running"
    # Every status change is kept with its time and cause, so a restart that healed
    # between two polls of the jobs panel is still told.
    history = [t["status"] for t in state.transitions]
    assert history[-1] == "running" and history.count("restarting") >= 2
    assert all(a != b for a, b in zip(history, history[1:]))
    restart = next(t for t in state.transitions if t["status"] == "restarting")
    assert restart["at"] > 999.5 and restart["cause"]
    state.apply(Event(Kind.JOB_FINISHED, 2000.0, None, {"status": "succeeded"}))
    assert state.status == "succeeded" and state.finished
    assert state.summary()["status"] == "succeeded"
    assert state.summary()["transitions"][-1] == {"status": "succeeded", "at": 2000.0, "cause": "job succeeded"}


def test_metrics_progress_and_eta():
    state = JobState()
    state.apply(Event(Kind.PLAN, 0.0, None, {"total": 100, "start": 0}))
    for step in range(50):
        state.apply(
            Event(Kind.METRIC, 10.0 + step * 0.5, None, {"rank": 0, "step": step, "values": {"loss": 1.0 / (step + 1)}})
        )
    assert state.step == 49 and len(state.metrics["loss"]) == 50
    assert abs(state.steps_per_s - 2.0) < 1e-6
    assert abs(state.eta_s - 25.0) < 1e-6
    assert state.metrics.last("loss") == 1.0 / 50
    assert state.metrics.to_records()[0] == {"step": 0, "loss": 1.0}


def _running_pair() -> JobState:
    state = JobState(max_restarts=3, nnodes=(1, 2))
    for node, rank in (("node-0", 0), ("node-1", 1)):
        state.apply(Event(Kind.NODE_JOINED, 1.0, node, {"pid": 10 + rank}))
        state.apply(
            Event(Kind.WORKER_STARTED, 2.0, node, {"rank": rank, "local_rank": 0, "world_size": 2, "generation": 1})
        )
    return state


SURVIVOR_CRASH = {"rank": 0, "error": "RuntimeError", "message": "Connection closed by peer", "generation": 1}


def test_a_restart_names_its_root_cause_not_the_survivors_symptom():
    # A drill just before the restart: the drill is the cause, the symptom is listed under it.
    state = _running_pair()
    state.apply(Event(Kind.FAULT, 10.0, "node-1", {"fault": "preempt_node", "target": "node-1"}))
    state.apply(Event(Kind.WORKER_FAILED, 10.4, "node-0", SURVIVOR_CRASH))
    state.apply(Event(Kind.NODE_LEFT, 10.6, "node-1", {"reason": "preempted"}))
    state.apply(
        Event(Kind.WORKER_STARTED, 12.0, "node-0", {"rank": 0, "local_rank": 0, "world_size": 1, "generation": 2})
    )
    restart, healed = list(state.transitions)[-2:]
    assert restart["status"] == "restarting" and restart["at"] == 10.4
    assert restart["cause"] == "drill: node-1 preempted"
    assert restart["events"] == [
        "drill: node-1 preempted",
        "rank 0 on node-0 failed: RuntimeError: Connection closed by peer",
        "node-1 left (preempted)",
    ]
    assert healed["status"] == "running" and healed["at"] - restart["at"] == pytest.approx(1.6)

    # No drill (a real preemption): the departure, seen after the survivor's crash, becomes the cause.
    state = _running_pair()
    state.apply(Event(Kind.WORKER_FAILED, 20.0, "node-0", SURVIVOR_CRASH))
    state.apply(Event(Kind.NODE_LEFT, 20.3, "node-1", {"reason": "preempted"}))
    restart = state.transitions[-1]
    assert restart["cause"] == "node-1 left (preempted)" and len(restart["events"]) == 2

    # A drill long ago explains nothing: a plain crash is its own cause.
    state = _running_pair()
    state.apply(Event(Kind.FAULT, 1.0, "node-1", {"fault": "kill_worker", "target": "rank 1"}))
    state.apply(Event(Kind.WORKER_FAILED, 60.0, "node-0", SURVIVOR_CRASH))
    assert state.transitions[-1]["cause"].startswith("rank 0 on node-0 failed")


def test_a_compacted_history_replays_to_the_same_state_with_every_spike():
    import random

    from notebook_elastic.contract.job_state import JobState
    from notebook_elastic.jobfolder.history import compact

    rng = random.Random(0)
    events = [Event(Kind.JOB_SUBMITTED, 0.0, None, {"nodes": 2, "min_nodes": 1, "max_nodes": 3, "max_restarts": 5})]
    t = 1.0
    for step in range(100_000):  # a long job: 100k metric points, output, membership changes
        t += 0.01
        loss = 1.0 / (step + 1) + (50.0 if step in (777, 54_321) else 0.0)
        events.append(Event(Kind.METRIC, t, "node-0", {"step": step, "values": {"loss": loss, "lr": 0.1}}))
        if step % 500 == 0:
            events.append(Event(Kind.LOG, t, "node-0", {"stream": "stdout", "text": f"epoch {step}"}))
        if step % 20_000 == 10:
            world = rng.choice([2, 4])
            events.append(Event(Kind.NODE_JOINED, t, f"node-{step}", {"pid": step}))
            events.append(
                Event(
                    Kind.WORKER_STARTED,
                    t,
                    "node-0",
                    {"rank": 0, "local_rank": 0, "world_size": world, "generation": step},
                )
            )
            events.append(
                Event(Kind.RESTART, t, "node-0", {"reason": "worker_failed", "restarts_used": 1, "max_restarts": 5})
            )
    events.append(Event(Kind.JOB_FINISHED, t, None, {"status": "succeeded"}))

    kept = compact(events)
    full, compacted = JobState(max_restarts=5, nnodes=(1, 3)), JobState(max_restarts=5, nnodes=(1, 3))
    full.apply_all(events)
    compacted.apply_all(kept)
    assert len(kept) < 4000 < len(events)
    for field in ("status", "world_size", "restarts", "step", "target", "nnodes", "membership_changes"):
        assert getattr(compacted, field) == getattr(full, field), field
    assert set(compacted.nodes) == set(full.nodes)
    values = compacted.metrics["loss"].values.tolist()
    assert max(values) == max(full.metrics["loss"].values.tolist())  # the spikes survive
    assert values.count(max(values)) == 1 and 50.0 + 1 / 54_322 in values
    assert compacted.metrics.last("loss") == full.metrics.last("loss")
    assert not [e for e in kept if e.kind == Kind.LOG]  # output lives in the node logs


@pytest.mark.breaks_contract("it writes a history that breaks the contract, to see the check fail")
def test_every_kind_has_a_schema_and_the_contract_check_can_fail(tmp_path):
    """The typed contract (#12 item 3): kinds and statuses are enums, each kind has a JSON
    schema, and the check conftest runs on every job history of the suite goes red on an event
    that breaks it (so its silence elsewhere means something)."""
    import jsonschema
    from conftest import contract_problems

    from notebook_elastic.contract.event_types import FINAL_STATUSES, Kind, Status, event_schemas

    assert set(event_schemas()) == set(Kind)
    for schema in event_schemas().values():
        jsonschema.Draft202012Validator.check_schema(schema)
    # A kind read back from a line is the member; it prints and serializes as its string.
    e = Event.from_line('{"kind":"node_left","t":1.0,"node":"node-1","reason":"preempted"}')
    assert e.kind is Kind.NODE_LEFT and f"{e.kind}" == "node_left" and json.loads(e.to_line())["kind"] == "node_left"
    assert Event.from_line('{"kind":"from_a_newer_worker","t":1.0}').kind == "from_a_newer_worker"
    assert set(FINAL_STATUSES) <= set(Status) and f"{Status.LOST}" == "lost"

    job = tmp_path / "job"
    job.mkdir()
    good = [
        Event(
            Kind.JOB_SUBMITTED,
            1.0,
            None,
            {"nodes": 2, "min_nodes": 1, "max_nodes": 2, "nproc_per_node": 1, "max_restarts": 3},
        ),
        Event(Kind.WORKER_STARTED, 2.0, "node-0", {"rank": 0, "local_rank": 0, "world_size": 2, "pid": 12}),
        Event(Kind.JOB_FINISHED, 3.0, None, {"status": "succeeded", "reason": None}),
    ]
    (job / "events.jsonl").write_text("".join(e.to_line() + "\n" for e in good))
    assert contract_problems(tmp_path) == []
    bad = [
        Event(Kind.WORKER_STARTED, 2.0, "node-0", {"rank": "x", "world_size": 2}),
        Event(Kind.JOB_FINISHED, 3.0, None, {"status": "restarting"}),
        Event("gossip", 4.0, None, {}),
    ]
    (job / "events.jsonl").write_text("".join(e.to_line() + "\n" for e in good + bad))
    (problem,) = contract_problems(tmp_path, limit=10)
    assert "worker_started rank: 'x' is not of type 'integer'" in problem
    assert "'local_rank' is a required property" in problem
    assert "job_finished status: 'restarting' is not one of" in problem
    assert "kind 'gossip' has no class" in problem


def test_a_cluster_row_takes_training_from_the_fold_and_pods_from_the_cluster():
    """with_fold (#12 item 3), pure: the cluster's row keeps its pod counts and range; the fold
    brings restarts, step, loss and world size; a restart in progress or an ending the events
    told wins over the cluster's 'running'/'pending', never over its other words."""
    from notebook_elastic.contract.job_state import with_fold

    cluster = {"status": "running", "nodes_running": 2, "target": 2, "min_nodes": 1, "max_nodes": 3, "step": None}
    assert with_fold("running", cluster, None) == ("running", cluster)
    assert with_fold("running", cluster, JobState()) == ("running", cluster)  # a fold that saw nothing

    state = JobState(max_restarts=3, nnodes=(1, 3))
    ws = {"local_rank": 0, "pid": 1, "generation": 1}
    state.apply_all(
        [
            Event(Kind.WORKER_STARTED, 1.0, "pod-a", {"rank": 0, "world_size": 2, **ws}),
            Event(Kind.METRIC, 2.0, "pod-a", {"step": 7, "values": {"loss": 0.5}}),
            Event(Kind.RESTART, 3.0, "pod-a", {"reason": "worker_failed", "restarts_used": 1, "max_restarts": 3}),
        ]
    )
    status, row = with_fold("running", cluster, state)
    assert status == "restarting" and row["status"] == "restarting"
    assert (row["restarts"], row["step"], row["loss"], row["world_size"]) == (1, 7, 0.5, 2)
    assert (row["nodes_running"], row["target"], row["min_nodes"], row["max_nodes"]) == (2, 2, 1, 3)
    assert row["loss_tail"] == [0.5] and row["transitions"][-1]["status"] == "restarting"
    assert with_fold("pending", cluster, state)[0] == "restarting"
    assert with_fold("expired", cluster, state)[0] == "expired"  # the cluster's own word stays
    assert cluster["step"] is None  # the cluster's row is not changed in place

    state.apply(Event(Kind.JOB_FINISHED, 4.0, None, {"status": "succeeded"}))
    assert with_fold("running", cluster, state)[0] == "succeeded"  # pods still terminating
    assert with_fold("expired", cluster, state)[0] == "succeeded"


def test_the_degraded_event_the_agent_sends_keeps_the_contract_and_the_fold_reads_it(tmp_path, monkeypatch):
    """On a torch that lacks an internal, the agent names each one with what the job loses
    (``torch_adapter.missing()``, a mapping); the contract and the fold read that same shape."""
    from conftest import contract_problems
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from notebook_elastic.agent import run as agent

    monkeypatch.delattr(dynamic_rendezvous, "_RendezvousExitOp")
    sent: list[Event] = []
    monkeypatch.setattr(agent, "emit", lambda kind, **fields: sent.append(Event.from_json({"kind": kind, **fields})))
    agent._report_degraded()
    (event,) = sent
    assert event.kind == Kind.DEGRADED and list(event.get("missing")) == ["dynamic_rendezvous._RendezvousExitOp"]
    job = tmp_path / "job"
    job.mkdir()
    (job / "events.jsonl").write_text(event.to_line() + "\n")
    assert contract_problems(tmp_path) == []
    state = JobState()
    state.apply(event)
    assert state.dropped_events == 0 and state.warning == describe(event)
    assert state.warning.startswith(f"torch {event.get('torch')} lacks internals")


def test_a_peer_that_left_is_told_in_our_words_and_torchs_text_stays_in_the_event():
    raw = "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.2]:4321 \U0001f4a5"
    e = Event(Kind.WORKER_FAILED, 0.0, "node-0", {"rank": 0, "error": "RuntimeError", "message": raw, "cause": "peer"})
    said = e.describe()
    assert said == (
        "rank 0 on node-0 stopped: a peer left the worker group mid-collective (RuntimeError); "
        "the group re-forms without it"
    )
    assert e.get("message") == raw  # kept for whoever reads the event itself


def test_a_warm_workers_exit_names_the_worker_not_its_launcher():
    """A warm start's worker is a fork that a launcher stands for; torch's line of its exit names
    the launcher (the pid torch watches). Its worker_started said both, on the other stream of
    the same agent: the exit names the worker by its own pid, and the launcher as such."""
    launchers: dict[int, int] = {}
    out = LineParser("node-0", "stdout", launchers=launchers)
    err = LineParser("node-0", "stderr", agent_clock=True, launchers=launchers)
    started = {"kind": "worker_started", "t": 1.0, "rank": 0, "local_rank": 0, "world_size": 1, "pid": 5440}
    assert out.feed("@@elastic " + json.dumps({**started, "launcher": 5431})).get("launcher") == 5431
    exit_line = (
        "E1122 03:07:32.393000 5367 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
        "local_rank: 0 (pid: {pid}) of binary: /work/main/.venv/bin/python"
    )
    exited = err.feed(exit_line.format(pid=5431))
    assert exited.kind == Kind.WORKER_EXITED and (exited.get("pid"), exited.get("launcher")) == (5440, 5431)
    assert "(pid 5440) died with signal 9" in describe(exited)
    # A cold start's (no launcher told): the pid torch named, which is the worker's own.
    cold = err.feed(exit_line.format(pid=5473))
    assert cold.get("pid") == 5473 and "launcher" not in cold.data

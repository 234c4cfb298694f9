"""Who is sent away when a round fails (agent/joiner.py, #14 item 2): the decision an agent
takes from the rendezvous store, on a real TCPStore and a real rendezvous handler over it. The
end-to-end story (real pods, agents, gloo) is tests/test_kubernetes_joiner.py; here each rule
of the decision is one case. Only the process exit is replaced (it would end pytest)."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from notebook_elastic.agent import joiner, torch_adapter
from notebook_elastic.contract import protocol
from notebook_elastic.contract.protocol import EVENT_PREFIX

# What must hold on every torch of the declared range (scripts/torch_range.py).
pytestmark = pytest.mark.torch_contract


@pytest.fixture
def store():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    served = torch_adapter.tcp_store_server(sock, timeout_s=10)
    yield served
    del served
    sock.close()


@pytest.fixture
def handler(store):
    backend = C10dRendezvousBackend(store, "job-r1-e0")
    return dr.DynamicRendezvousHandler.from_backend(
        "job-r1-e0",
        store,
        backend,
        min_nodes=1,
        max_nodes=3,
        timeout=dr.RendezvousTimeout(join=timedelta(seconds=20), last_call=timedelta(seconds=1)),
    )


class Left(Exception):
    """Raised instead of the agent's exit."""


@pytest.fixture
def node(handler, monkeypatch, tmp_path):
    """This node's Joining, in round 2 of 3 members, its folder private; leaving raises Left."""
    monkeypatch.delenv(protocol.ENV_PROGRESS_DIR, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(joiner, "FAILURE_GRACE_S", 0.2)
    watch = SimpleNamespace(handler=handler, agent=object(), latest=(2, frozenset("abc")), killed_round=None)
    joining = joiner.Joining(watch, lambda: "pod-c", lambda: None)
    joining.start()

    def leave(handler, agent, round_, others, failure):
        raise Left(f"{others}: {failure}")

    monkeypatch.setattr(joining, "_leave", leave)
    yield joining
    joining.clean()


def failed(exitcode=1):
    return SimpleNamespace(failures={0: ProcessFailure(local_rank=0, pid=1, exitcode=exitcode, error_file="")})


def key(name):
    return f"notebook_elastic/job-r1-e0/joiners/{name}"


def test_a_joiner_whose_own_workers_fail_alone_while_the_job_trains_is_sent_away(node, store):
    store.set(key("progressed"), "1")  # round 1 trained, without this node
    node.joined(2)
    with pytest.raises(Left, match="^2: a worker exited with code 1$"):  # the job goes on at 2
        node.leave_if_it_failed_joining(failed())


def test_two_joiners_failing_in_the_same_round_both_go(node, store, handler):
    store.set(key("progressed"), "1")
    other = joiner.Joining(node.watch, lambda: "pod-d", lambda: None)
    other.folder, other.rounds = node.folder, {2}
    other._leave = node._leave
    node.joined(2)
    for joining in (node, other):
        with pytest.raises(Left):
            joining.leave_if_it_failed_joining(failed())


def test_an_old_member_s_failure_in_the_same_round_makes_it_a_normal_restart(node, store):
    store.set(key("progressed"), "1")
    node.joined(2)
    store.add(key("failed/2"), 1)  # an old member's workers failed on their own in round 2
    node.leave_if_it_failed_joining(failed())  # returns: charged as torchrun does


def test_an_old_member_is_never_sent_away_and_its_failure_is_counted(node, store):
    store.set(key("progressed"), "2")  # the round it trained in
    node.joined(1)
    node.joined(2)
    node.leave_if_it_failed_joining(failed())
    assert store.add(key("failed/2"), 0) == 1  # a joiner failing in this round now is not to blame


def test_nothing_is_sent_away_before_the_job_ever_trained(node):
    node.joined(2)
    node.leave_if_it_failed_joining(failed())  # a job's first start: torchrun's own retries


def test_a_joiner_whose_workers_made_a_step_is_not_a_joiner_any_more(node, store):
    store.set(key("progressed"), "1")
    node.joined(2)
    protocol.mark_progress({protocol.ENV_PROGRESS_DIR: node.folder, protocol.ENV_ROUND: "2"})
    assert protocol.progress_marked(node.folder, 2) and not protocol.progress_marked(node.folder, 1)
    node.leave_if_it_failed_joining(failed())


def test_a_departed_peer_s_symptom_is_not_the_joiner_s_own_failure(node, store):
    store.set(key("progressed"), "1")
    node.joined(2)
    node.leave_if_it_failed_joining(failed(protocol.EXIT_PEER_LOST))


def test_a_replacement_for_an_evicted_index_backs_off_before_it_joins(node, store, monkeypatch, capsys):
    slept = []
    here, sleep = threading.current_thread(), time.sleep
    # time.sleep is the process's: only this thread's calls are the backoff (CI: a watcher thread
    # left by another test slept in a loop and its 0.5 s sleeps filled the list).
    monkeypatch.setattr(
        joiner.time, "sleep", lambda s: slept.append(s) if threading.current_thread() is here else sleep(s)
    )
    store.add(key("evicted/pod-c"), 2)  # this index was sent away twice (no Job index: the node name)
    node.before_joining(node.watch.handler)
    node.before_joining(node.watch.handler)  # once per agent
    assert slept == [2 * joiner.BACKOFF_FIRST_S]
    (line,) = [json.loads(x[len(EVENT_PREFIX) :]) for x in capsys.readouterr().out.splitlines()]
    assert line["kind"] == "pending" and line["reason"] == "BackOff"
    assert "failed while joining 2 time(s)" in line["message"]


def test_leaving_is_charged_once_per_node_index_and_never_without_a_budget(handler, store, monkeypatch, capsys):
    """What the others and the timeline are told when a joiner goes, the process exit replaced."""
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "2")
    monkeypatch.setattr(joiner.os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    left = []

    def agent(restarts_left, max_restarts):
        return SimpleNamespace(
            _remaining_restarts=restarts_left,
            get_worker_group=lambda: SimpleNamespace(spec=SimpleNamespace(max_restarts=max_restarts)),
        )

    def leave(pod, budget):
        watch = SimpleNamespace(handler=handler, agent=agent(*budget), latest=(2, frozenset("abc")), killed_round=None)
        node = joiner.Joining(watch, lambda: pod, lambda: left.append(pod))
        with pytest.raises(SystemExit) as exited:
            node._leave(handler, watch.agent, 2, 2, "RuntimeError: Unable to find address for: nosuch0")
        assert exited.value.code == protocol.EXIT_EVICTED
        return [json.loads(x[len(EVENT_PREFIX) :]) for x in capsys.readouterr().out.splitlines()]

    first = leave("workers-2-aaaaa", (3, 3))
    assert [e["kind"] for e in first] == ["restart", "node_evicted"]
    assert first[0]["reason"] == "worker_failed" and first[0]["restarts_used"] == 1 and first[0]["max_restarts"] == 3
    assert first[1]["failure"].endswith("nosuch0") and first[1]["target"] == 2 and first[1]["index"] == "2"
    # Its replacement (same index, another pod) failing the same way is not charged again.
    assert [e["kind"] for e in leave("workers-2-bbbbb", (3, 3))] == ["node_evicted"]
    assert left == ["workers-2-aaaaa", "workers-2-bbbbb"]  # each left its round (never closed it)
    assert store.add(key("evicted/2"), 0) == 2  # what the next replacement backs off by
    # With --max-restarts 0 there is nothing to charge.
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    assert [e["kind"] for e in leave("workers-3-ccccc", (0, 0))] == ["node_evicted"]

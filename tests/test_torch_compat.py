"""The contract of every private torch internal we use (agent/torch_compat.py), checked on
real torch objects: a real rendezvous handler over a real TCPStore, torchrun's real agent
class. A torch release that moves one of them fails here, by name, before any job does; a
torch that lacks one is reported as a ``degraded`` event and the job runs on."""

from __future__ import annotations

import inspect
import os
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from notebook_elastic.agent import torch_compat
from notebook_elastic.contract.events import Event, Kind, describe
from notebook_elastic.contract.job_state import JobState

# What must hold on every torch of the declared range (scripts/torch_range.py).
pytestmark = pytest.mark.torch_contract


def test_the_installed_torch_has_every_internal_we_use():
    assert torch_compat.missing() == {}, f"torch {torch.__version__} moved internals we use"


@pytest.fixture
def store():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    served = torch_compat.tcp_store_server(sock, timeout_s=10)
    yield served
    del served
    sock.close()


def handler_on(
    store,
    run_id: str,
    *,
    nodes: tuple[int, int] = (1, 1),
    join_s: float = 20,
    last_call_s: float = 1,
    keep_alive_s: int = 1,
) -> dr.DynamicRendezvousHandler:
    """torchrun's rendezvous handler on ``store`` (3 missed heartbeats: dead; every 5 s where
    this torch fixes the interval)."""
    keep_alive = dict(keep_alive_interval=keep_alive_s, keep_alive_max_attempt=3) if KEEP_ALIVE_SET else {}
    return dr.DynamicRendezvousHandler.from_backend(
        run_id,
        store,
        C10dRendezvousBackend(store, run_id),
        min_nodes=nodes[0],
        max_nodes=nodes[1],
        timeout=dr.RendezvousTimeout(join=timedelta(seconds=join_s), last_call=timedelta(seconds=last_call_s)),
        **keep_alive,
    )


#: Whether this torch lets a handler's heartbeat be set (2.5 and later; 2.4 fixes 5 s x 3).
KEEP_ALIVE_SET = "keep_alive_interval" in inspect.signature(dr.DynamicRendezvousHandler.from_backend).parameters


def test_a_real_round_is_read_left_and_hooked(store):
    seen = []
    assert torch_compat.hook_next_rendezvous(lambda handler, info: seen.append((handler, info.world_size)))
    assert torch_compat.hook_next_rendezvous(lambda *_: None)  # idempotent: one hook, not two
    handler = handler_on(store, "contract")
    info = handler.next_rendezvous()
    assert info.world_size == 1 and seen == [(handler, 1)]
    round_, participants = torch_compat.joined_round(handler)
    assert round_ == 0 and list(participants.values()) == [0]
    # The store's view agrees with the handler's own.
    assert torch_compat.round_state(handler) == (0, frozenset(participants))
    assert torch_compat.keep_alive_window_s(handler) == (3.0 if KEEP_ALIVE_SET else 15.0)
    assert torch_compat.rendezvous_store(handler) is store  # where our keys go beside the round's
    assert torch_compat.leave_round(handler)
    # Left at once: the store no longer lists this node (no wait for a heartbeat to expire).
    deadline = time.monotonic() + 10
    while torch_compat.round_state(handler)[1]:
        assert time.monotonic() < deadline, "the node is still a participant after leaving"
        time.sleep(0.05)


def test_a_node_stopped_by_a_signal_leaves_its_round_and_never_closes_it_for_the_others(store, monkeypatch):
    """torch 2.4's agent shuts its rendezvous down when SIGTERM stops it (a preemption, a
    scale-down): that closed the round for every node, and the job failed. A shutdown while a
    SignalException is handled leaves the round; any other one closes it, as torch does."""
    import signal as signals

    from torch.distributed.elastic.multiprocessing.api import SignalException

    monkeypatch.setattr(dr.DynamicRendezvousHandler, "shutdown", dr.DynamicRendezvousHandler.shutdown)
    monkeypatch.setattr(torch_compat, "_leave_always", False)
    assert torch_compat.leave_instead_of_closing(always=False)
    handler = handler_on(store, "signalled")
    handler.next_rendezvous()
    try:
        raise SignalException("stopped", sigval=signals.SIGTERM)
    except SignalException:
        assert handler.shutdown()
    assert not handler.is_closed() and torch_compat.round_state(handler)[1] == frozenset()
    other = handler_on(store, "done")
    other.next_rendezvous()
    assert other.shutdown() and other.is_closed()  # a job done (or failed): closed, as torch does


def test_the_agent_hooks_wrap_torchruns_own_methods():
    start, monitor = LocalElasticAgent._start_workers, LocalElasticAgent._monitor_workers
    try:
        assert torch_compat.hook_agent(lambda agent: None, lambda result: [], lambda failures: None)
        assert LocalElasticAgent._start_workers is not start and LocalElasticAgent._monitor_workers is not monitor
        assert torch_compat.hook_agent(lambda agent: None, lambda result: [], lambda failures: None)
        assert getattr(LocalElasticAgent._start_workers, "_notebook_elastic", False)
    finally:
        LocalElasticAgent._start_workers, LocalElasticAgent._monitor_workers = start, monitor
    assert torch_compat.worker_pids(object()) == [] and not torch_compat.group_is_healthy(object())


def test_a_torch_without_an_internal_degrades_and_says_what_is_lost(monkeypatch):
    monkeypatch.delattr(SimpleElasticAgent, "_restart_workers")  # defined on the base class
    monkeypatch.delattr(dr, "_RendezvousExitOp")
    lacking = torch_compat.missing()
    assert set(lacking) == {"LocalElasticAgent._restart_workers", "dynamic_rendezvous._RendezvousExitOp"}
    assert not torch_compat.hook_agent(lambda a: None, lambda r: [], lambda f: None)  # runs unhooked
    tested = f"torch{torch_compat.tested_torch_text()}"
    event = Event(Kind.DEGRADED, time.time(), "node-0", {"torch": "9.9", "missing": lacking, "tested": tested})
    text = describe(event)
    # One sentence: the torch, the range it is tested with, and what the job loses.
    assert text.startswith("torch 9.9 lacks internals notebook-elastic uses (tested with torch>=2.4,<2.16)")
    assert "departures are charged to --max-restarts" in text
    state = JobState(max_restarts=3, nnodes=(1, 1), target=1)
    state.apply(event)
    assert state.warning == text


def test_the_store_serves_on_the_socket_it_was_given(store):
    client = torch.distributed.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=5))
    client.set("k", "v")
    assert store.get("k") == b"v"


def test_the_store_leaves_its_callers_socket_open_when_it_goes():
    """torch's TCPStore closes the listening descriptor it is given when it goes; given the
    caller's own, the caller's close was a second close of that number, by then another
    socket's (in the suite: a fixture API server's listener, at a random GC)."""
    import gc
    import os
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    store = torch_compat.tcp_store_server(sock, timeout_s=5)
    store.set("k", "v")
    del store
    gc.collect()
    os.fstat(sock.fileno())  # still the caller's: raises EBADF when the store took it along
    sock.close()


def test_a_round_closes_once_it_holds_the_jobs_target_not_last_call_later(store, monkeypatch):
    """torch closes a round of 1:3 nodes last_call after it reached 1 (here 600 s): with the
    job's target of 2 in the store, it closes as soon as the second node joins (old code:
    both nodes still waiting at the test's limit)."""
    for owner, name in (
        (dr._RendezvousJoinOp, "__call__"),
        (dr._DistributedRendezvousOpExecutor, "run"),
        (dr, "_delay"),
        (dr._BackendRendezvousStateHolder, "__init__"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # this process's torch as it was, after
    assert torch_compat.close_rounds_at_target(poll_s=0.1)
    assert torch_compat.close_rounds_at_target(poll_s=0.1)  # idempotent: one wrapper, not two
    store.set(torch_compat.TARGET_KEY, "2")
    host, port = "127.0.0.1", store.port

    def join(i: int, results: dict) -> None:
        client = torch.distributed.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
        handler = handler_on(client, "target", nodes=(1, 3), join_s=600, last_call_s=600)
        assert handler._state_holder._cache_duration == 0.1  # a look reads the store at most 0.1 s old
        handlers.append(handler)
        results[i] = handler.next_rendezvous().world_size

    results: dict[int, int] = {}
    handlers: list = []
    nodes = [threading.Thread(target=join, args=(i, results), daemon=True) for i in range(2)]
    for node in nodes:
        node.start()
    for node in nodes:
        node.join(timeout=120)
    for handler in handlers:
        handler._stop_heartbeats()  # no keep-alive thread outlives the test's store
    assert results == {0: 2, 1: 2}


PEER = """
import sys, datetime, torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
client = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=60))
keep_alive = dict(keep_alive_interval=60, keep_alive_max_attempt=3) if sys.argv[2] == "1" else {}
handler = dr.DynamicRendezvousHandler.from_backend(
    "gone", client, C10dRendezvousBackend(client, "gone"), min_nodes=2, max_nodes=2,
    timeout=dr.RendezvousTimeout(join=datetime.timedelta(seconds=120)), **keep_alive,
)
handler.next_rendezvous()
print("joined", flush=True)
sys.stdin.read()
"""


def test_a_node_the_supervisor_saw_die_leaves_the_round_at_once_not_at_its_heartbeats_expiry(store, monkeypatch):
    """Heartbeats every 60 s, 3 missed to be dead: torch drops a SIGKILLed peer 3 minutes
    later. Named in GONE_KEY by the supervisor that reaped it, it is out of its peers' view of
    the round at their next look (old code: still a participant at the test's limit)."""
    import json
    import subprocess
    import sys

    monkeypatch.setattr(dr._BackendRendezvousStateHolder, "_sanitize", dr._BackendRendezvousStateHolder._sanitize)
    assert torch_compat.drop_gone_nodes()
    assert torch_compat.drop_gone_nodes()  # idempotent
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(store.port), str(int(KEEP_ALIVE_SET))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        client = torch.distributed.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60))
        handler = handler_on(client, "gone", nodes=(2, 2), join_s=120, last_call_s=30, keep_alive_s=60)
        assert handler.next_rendezvous().world_size == 2
        assert peer.stdout.readline() == "joined\n"
        _round, members = torch_compat.round_state(handler)
        assert {n.pid for n in members} == {os.getpid(), peer.pid}
        peer.kill()
        peer.wait()
        store.set(torch_compat.GONE_KEY, json.dumps({str(peer.pid): time.time()}))
        # Well inside the heartbeat window (180 s; 15 s where torch fixes it): dropped by the
        # supervisor's word, not by its heartbeat's expiry.
        deadline = time.monotonic() + min(60, torch_compat.keep_alive_window_s(handler) / 2)
        while peer.pid in {n.pid for n in torch_compat.round_state(handler)[1]}:
            assert time.monotonic() < deadline, "the dead peer is still in the round"
            time.sleep(0.1)
        assert {n.pid for n in torch_compat.round_state(handler)[1]} == {os.getpid()}
        handler._stop_heartbeats()  # no keep-alive thread outlives the test's store
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()

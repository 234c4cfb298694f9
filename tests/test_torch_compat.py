"""The contract of every private torch internal we use (agent/torch_adapter.py; used by rounds.py,
store_link.py and notebook_agent.py), checked on
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

from notebook_elastic.agent import notebook_agent, rounds, store_link, torch_adapter
from notebook_elastic.contract import protocol
from notebook_elastic.contract.event_types import Kind
from notebook_elastic.contract.events import Event, describe
from notebook_elastic.contract.job_state import JobState

# What must hold on every torch of the declared range (scripts/torch_range.py).
pytestmark = pytest.mark.torch_contract


def test_the_installed_torch_has_every_internal_we_use():
    assert torch_adapter.missing() == {}, f"torch {torch.__version__} moved internals we use"


@pytest.fixture
def store():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    served = torch_adapter.tcp_store_server(sock, timeout_s=10)
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
    link: store_link.StoreLink | None = None,
    rules: rounds.RoundRules | None = None,
    hooks: rounds.RendezvousHooks | None = None,
):
    """Our handler over a round of torch's c10d rendezvous on ``store``, as the registry makes
    it (keep_alive_s: where this torch lets it be set; 2.4 fixes the interval), over ``link``
    (an agent's link to its store), ``rules`` (its round rules: torch's, by default) and
    ``hooks`` (what the handler calls around a round: nothing, by default)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    params = RendezvousParameters(
        backend=rounds.RDZV_BACKEND,
        endpoint=f"{store.host}:{store.port}",
        run_id=run_id,
        min_nodes=nodes[0],
        max_nodes=nodes[1],
        join_timeout=join_s,
        last_call_timeout=last_call_s,
        keep_alive_interval=keep_alive_s,
        keep_alive_max_attempt=3,
    )
    rules, hooks = rules or rounds.RoundRules(), hooks or rounds.RendezvousHooks()
    return rounds.handler_over(store, params, rules, hooks, link or store_link.StoreLink())


#: Whether this torch lets a handler's heartbeat be set (2.5 and later; 2.4 fixes 5 s x 3).
KEEP_ALIVE_SET = "keep_alive_interval" in inspect.signature(dr.DynamicRendezvousHandler.from_backend).parameters


def test_a_real_round_is_read_left_and_hooked(store):
    seen = []

    def after(handler, info):
        seen.append((handler, info.world_size))

    hooks = rounds.RendezvousHooks()
    assert rounds.hook_next_rendezvous(hooks, after)
    assert rounds.hook_next_rendezvous(hooks, after)  # idempotent: one hook, not two
    link = store_link.StoreLink()
    handler = handler_on(store, "contract", link=link, hooks=hooks)
    inner = handler.torch_handler
    info = handler.next_rendezvous()
    assert info.world_size == 1 and seen == [(inner, 1)]  # the hooks are told torch's own handler
    assert torch_adapter.torch_handler(handler) is inner and torch_adapter.torch_handler(inner) is inner
    round_, participants = torch_adapter.joined_round(inner)
    assert round_ == 0 and list(participants.values()) == [0]
    # The store's view agrees with the handler's own.
    assert torch_adapter.round_state(inner) == (0, frozenset(participants))
    assert torch_adapter.keep_alive_window_s(inner) == (3.0 if KEEP_ALIVE_SET else 15.0)
    assert torch_adapter.rendezvous_store(inner) is store  # where our keys go beside the round's
    # torch keeps the round's state under the key our rounds' keys are named after, and the
    # supervisor names (supervisor/board.py: the key it moves when it saw a member die).
    assert store.check([protocol.rendezvous_state_key("contract")])
    assert rounds.leave_round(inner, link) and link.leaving.is_set()  # a store lost now is not waited for
    # Left at once: the store no longer lists this node (no wait for a heartbeat to expire).
    deadline = time.monotonic() + 10
    while torch_adapter.round_state(inner)[1]:
        assert time.monotonic() < deadline, "the node is still a participant after leaving"
        time.sleep(0.05)


def test_our_handler_is_made_by_torchs_public_registry_and_answers_its_interface(store):
    """torchrun makes a handler from --rdzv-backend through torch's public registry: ours is
    registered there (once, however often asked) and answers every method of the public
    ``RendezvousHandler`` interface over a real round of torch's c10d rendezvous."""
    from torch.distributed.elastic.rendezvous import (
        RendezvousHandler,
        RendezvousParameters,
        rendezvous_handler_registry,
    )

    rules, hooks, link = rounds.RoundRules(), rounds.RendezvousHooks(), store_link.StoreLink()
    name = rounds.register_rendezvous(rules, hooks, link)
    assert rounds.register_rendezvous(rules, hooks, link) == name == rounds.RDZV_BACKEND
    host, port = "127.0.0.1", store.port
    params = RendezvousParameters(
        backend=name, endpoint=f"{host}:{port}", run_id="registry", min_nodes=1, max_nodes=1, is_host=False
    )
    handler = rendezvous_handler_registry.create_handler(params)
    assert isinstance(handler, RendezvousHandler) and type(handler).__name__ == "NotebookRendezvous"
    assert isinstance(torch_adapter.torch_handler(handler), dr.DynamicRendezvousHandler)
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert handler.get_backend() == name and torch_adapter.torch_handler(handler).get_backend() == "c10d"
    assert handler.get_run_id() == "registry" and handler.num_nodes_waiting() == 0
    assert handler.use_agent_store is torch_adapter.torch_handler(handler).use_agent_store
    assert not handler.is_closed()
    assert handler.shutdown() and handler.is_closed()  # a job done: closed, as torch does


def test_a_node_stopped_by_a_signal_leaves_its_round_and_never_closes_it_for_the_others(store, monkeypatch):
    """torch 2.4's agent shuts its rendezvous down when SIGTERM stops it (a preemption, a
    scale-down): that closed the round for every node, and the job failed. A shutdown while a
    SignalException is handled leaves the round; any other one closes it, as torch does."""
    import signal as signals

    from torch.distributed.elastic.multiprocessing.api import SignalException

    hooks = rounds.RendezvousHooks()
    assert rounds.leave_instead_of_closing(hooks, always=False)
    handler = handler_on(store, "signalled", hooks=hooks)
    handler.next_rendezvous()
    try:
        raise SignalException("stopped", sigval=signals.SIGTERM)
    except SignalException:
        assert handler.shutdown()
    assert not handler.is_closed() and torch_adapter.round_state(handler.torch_handler)[1] == frozenset()
    other = handler_on(store, "done", hooks=hooks)
    other.next_rendezvous()
    assert other.shutdown() and other.is_closed()  # a job done (or failed): closed, as torch does


def test_an_agent_told_to_stop_leaves_its_round_however_its_run_then_ended(store):
    """A SIGTERM that lands inside a store call whose ``except`` takes it for a lost connection
    is swallowed or turned into another error (term.py's ``_Insist`` tells the agent again); torchrun
    then closes the rendezvous after any end of the run but a signal's, and every later joiner
    fails on a closed round (CI stop 45: two replacement pods exited 1 and the Job failed). An
    agent that was told to stop leaves its round, whatever its run ended with."""
    told = []
    hooks = rounds.RendezvousHooks()
    assert rounds.leave_instead_of_closing(hooks, always=False, told_to_stop=lambda: bool(told))
    handler = handler_on(store, "told", hooks=hooks)
    handler.next_rendezvous()
    told.append("SIGTERM")
    try:
        raise ConnectionError("the store call the signal landed in")
    except ConnectionError:
        assert handler.shutdown()
    assert not handler.is_closed() and torch_adapter.round_state(handler.torch_handler)[1] == frozenset()
    assert handler.shutdown() and not handler.is_closed()  # and with nothing under way
    told.clear()
    other = handler_on(store, "untold", hooks=hooks)
    other.next_rendezvous()
    assert other.shutdown() and other.is_closed()  # never told: a job done, closed as torch does


def test_torchrun_makes_our_agent_a_subclass_of_its_own_and_torchs_class_is_untouched():
    import torch.distributed.launcher.api as launcher

    start, monitor, made = (
        LocalElasticAgent._start_workers,
        LocalElasticAgent._monitor_workers,
        launcher.LocalElasticAgent,
    )
    hooks = notebook_agent.AgentHooks()  # an agent's
    try:
        assert notebook_agent.hook_agent(hooks, lambda agent: None, lambda result: [], lambda failures: None)
        ours_ = launcher.LocalElasticAgent
        assert ours_ is not LocalElasticAgent and issubclass(ours_, LocalElasticAgent)
        assert notebook_agent.hook_agent(hooks, lambda agent: None, lambda result: [], lambda failures: None)
        assert launcher.LocalElasticAgent is ours_  # one subclass, however often hooked
        # The hooks torch documents for subclasses, each overridden; torch's own class as it was.
        for name in ("_start_workers", "_monitor_workers", "_shutdown", "_rendezvous"):
            assert name in vars(ours_), name
        assert (LocalElasticAgent._start_workers, LocalElasticAgent._monitor_workers) == (start, monitor)
    finally:
        launcher.LocalElasticAgent = made
    assert torch_adapter.worker_pids(object()) == [] and not torch_adapter.group_is_healthy(object())


def test_our_agent_ranks_a_round_again_when_it_lost_a_member_while_ranks_were_assigned(monkeypatch):
    """While torch assigns a round's ranks, a wait on the round's store ends when the round lost
    a member (``store_link.RoundLostMember``): the agent's ``ranking`` (its store link's, handed
    through ``hook_agent``, never read off the handler) is set for each try and clear after, and
    the agent rendezvouses again. torch's own ``_rendezvous`` (the hook its agent documents for
    subclasses) stands in for a round here; the store-level wait is test_store_frozen.py's."""
    import torch.distributed.launcher.api as launcher

    monkeypatch.setattr(launcher, "LocalElasticAgent", launcher.LocalElasticAgent)  # hook_agent rebinds it
    hooks = notebook_agent.AgentHooks()
    ranking = threading.Event()
    assert notebook_agent.hook_agent(
        hooks, lambda agent: None, lambda result: [], lambda failures: None, ranking=ranking
    )
    assert hooks.ranking is ranking
    tries: list[bool] = []

    def torchs_rendezvous(self, worker_group):
        tries.append(ranking.is_set())
        if len(tries) == 1:
            raise store_link.RoundLostMember("a member left the round while its ranks were assigned")
        return "ranked"

    monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", torchs_rendezvous)
    agent = object.__new__(notebook_agent.agent_subclass(hooks))  # never started: only its _rendezvous
    assert agent._rendezvous(object()) == "ranked"
    assert tries == [True, True] and not ranking.is_set()


def test_every_hook_leaves_torchs_classes_as_torch_made_them(monkeypatch):
    """#25: no method of torch's is replaced. Once every hook the agent installs is in, each
    class of torch's we build on has the same attributes, bound to the same objects, as before;
    the two names of torch's we do rebind are module names: the executor's wait between looks
    (``_delay``, a module function) and the agent class torchrun makes (``LocalElasticAgent``
    in torchrun's launcher module, bound to our subclass of it)."""
    import torch.distributed.launcher.api as launcher

    classes = [
        dr.DynamicRendezvousHandler,
        dr._BackendRendezvousStateHolder,
        dr._DistributedRendezvousOpExecutor,
        dr._RendezvousJoinOp,
        C10dRendezvousBackend,
        LocalElasticAgent,
        SimpleElasticAgent,
    ]
    before = {klass: dict(vars(klass)) for klass in classes}
    monkeypatch.setattr(dr, "_delay", dr._delay)
    monkeypatch.setattr(launcher, "LocalElasticAgent", launcher.LocalElasticAgent)
    rules = rounds.RoundRules()
    assert rounds.close_rounds_at_target(rules, poll_s=0.1) and rounds.drop_gone_nodes(rules)
    assert rounds.join_and_beat_together(rules)
    hooks = rounds.RendezvousHooks()
    assert rounds.hook_next_rendezvous(hooks, lambda handler, info: None, before=lambda handler: None)
    assert rounds.leave_instead_of_closing(hooks, always=False)
    link = store_link.StoreLink()
    agent = notebook_agent.AgentHooks()
    assert notebook_agent.hook_store_reconnect(link, hooks, agent, lambda: 0, lambda _round: None, replaceable=True)
    assert notebook_agent.hook_agent(agent, lambda agent: None, lambda result: [], lambda failures: None)
    for klass in classes:
        after = dict(vars(klass))
        changed = sorted(n for n in before[klass].keys() | after.keys() if before[klass].get(n) is not after.get(n))
        assert not changed, f"{klass.__name__}: {changed} replaced"
    assert launcher.LocalElasticAgent is notebook_agent.agent_subclass(agent)
    assert getattr(dr._delay, "_notebook_elastic", False) and dr._delay._ne_owner is rules


def test_a_trial_round_finds_every_behaviour_we_use_and_one_torch_changed_under_its_name(monkeypatch):
    """#25: a name check passes an internal that keeps its name and changes what it does. The
    probe runs the behaviours on a throwaway round (closing at the target, members, dropping a
    node named gone, leaving) and, here, catches torch's sanitize kept by name but made to drop
    nothing: named with what the job loses. It never tells the agent's hooks of its round, nor
    marks this node as leaving its real one."""
    told = []
    rules = rounds.RoundRules()  # the agent's
    rules.close_at_target = rules.drop_gone = True
    hooks = rounds.RendezvousHooks()  # the agent's
    hooks.after = lambda handler, info: told.append(info)
    link = store_link.StoreLink()  # the agent's
    started = time.monotonic()
    agent = notebook_agent.AgentHooks()
    assert notebook_agent.probe(rules, hooks, link, agent) == {}
    took = time.monotonic() - started
    assert not told and not link.leaving.is_set()
    monkeypatch.setattr(dr._BackendRendezvousStateHolder, "_sanitize", lambda self: None)
    lost = notebook_agent.probe(rules, hooks, link, agent)
    name = "dynamic_rendezvous._BackendRendezvousStateHolder._sanitize"
    assert lost == {name: torch_adapter.INTERNALS[name]}, lost
    assert "dropped when its heartbeat expires" in lost[name]
    print(f"probe: {took * 1000:.0f} ms")


def test_a_node_paused_through_its_trial_round_is_not_told_its_torch_changed(monkeypatch):
    """An adversary froze a pod through its agent's trial round: thawed, it said "torch lacks
    internals". The verdict takes a second trial: a behaviour that failed once (here torch's
    sanitize made to drop nothing for one round only, as a pause past the round's close fails
    once) is not reported; one that fails again is, as before."""
    from notebook_elastic.agent.run import confirmed

    rules = rounds.RoundRules()
    rules.close_at_target = rules.drop_gone = True
    hooks, link, agent = rounds.RendezvousHooks(), store_link.StoreLink(), notebook_agent.AgentHooks()
    sanitize = dr._BackendRendezvousStateHolder._sanitize
    calls, failing = [], [1]  # failing: for this many more trials

    def trial():
        calls.append(1)
        broken = (lambda self: None) if failing else sanitize
        monkeypatch.setattr(dr._BackendRendezvousStateHolder, "_sanitize", broken)
        if failing:
            failing.pop()  # the pause is over after this trial
        return notebook_agent.probe(rules, hooks, link, agent)

    assert confirmed(trial, set()) == {} and len(calls) == 2
    calls.clear()
    assert confirmed(trial, set()) == {} and len(calls) == 1  # nothing found: no second trial
    failing.extend([1, 1, 1, 1])  # a torch that changed: every trial
    name = "dynamic_rendezvous._BackendRendezvousStateHolder._sanitize"
    assert confirmed(trial, set()) == {name: torch_adapter.INTERNALS[name]}
    assert confirmed(trial, {name}) == {}  # lacking already (said in the first event): not again


def test_a_torch_without_an_internal_degrades_and_says_what_is_lost(monkeypatch):
    monkeypatch.delattr(SimpleElasticAgent, "_restart_workers")  # defined on the base class
    monkeypatch.delattr(dr, "_RendezvousExitOp")
    lacking = torch_adapter.missing()
    assert set(lacking) == {"LocalElasticAgent._restart_workers", "dynamic_rendezvous._RendezvousExitOp"}
    agent = notebook_agent.AgentHooks()
    assert not notebook_agent.hook_agent(agent, lambda a: None, lambda r: [], lambda f: None)  # runs unhooked
    # ... yet an agent store lost while it forms its group is still regained: our agent's
    # _rendezvous regroups (the store's calls have their deadline), whatever else it lacks.
    import torch.distributed.launcher.api as launcher

    monkeypatch.setattr(launcher, "LocalElasticAgent", launcher.LocalElasticAgent)
    hooks = rounds.RendezvousHooks()
    assert notebook_agent.hook_store_reconnect(store_link.StoreLink(), hooks, agent, lambda: 0, lambda _round: None)
    assert hooks.bounded_store  # the round's store, as the agent gets it, answers under the deadline
    assert agent.on_regroup is not None and launcher.LocalElasticAgent is notebook_agent.agent_subclass(agent)
    tested = f"torch{torch_adapter.tested_torch_text()}"
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
    store = torch_adapter.tcp_store_server(sock, timeout_s=5)
    store.set("k", "v")
    del store
    gc.collect()
    os.fstat(sock.fileno())  # still the caller's: raises EBADF when the store took it along
    sock.close()


def _jitter_handler(store, monkeypatch, name: str, joiner: bool):
    """torch's handler under our rules on a job whose target is 1 node, and the waits it asks
    torch's ``_delay`` for (recorded by a stand-in for torch's own: nothing is waited)."""
    waits: list = []
    monkeypatch.setattr(dr, "_delay", waits.append)
    rules = rounds.RoundRules()
    assert rounds.close_rounds_at_target(rules, poll_s=0.1)
    rules.spread_first_join = not joiner  # as agent/run.py sets it
    store.set(protocol.TARGET_KEY, "1")
    client = torch.distributed.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60))
    return handler_on(client, name, nodes=(1, 2), rules=rules).torch_handler, waits


def test_a_node_that_regroups_from_the_first_round_does_not_wait_torchs_first_join_jitter(store, monkeypatch):
    """torch spreads a job's first joins over up to 0.3 s (``_delay((0, 0.3))`` in its
    next_rendezvous while the state's round is 0). A node that was in round 0 and regroups (in
    place, after a loss: the first change of every job) is no first join: our rounds skip it
    (old code: waited it again, 0.15 s on average of a change in place's 0.2 to 0.5 s)."""
    handler, waits = _jitter_handler(store, monkeypatch, "jitter", joiner=False)
    try:
        assert handler.next_rendezvous().world_size == 1
        assert [w for w in waits if isinstance(w, tuple)] == [(0, 0.3)], waits  # the first join: torch's jitter
        assert handler._state_holder.state.round == 0
        waits.clear()
        assert handler.next_rendezvous().world_size == 1  # a regroup, from round 0
        assert handler._state_holder.state.round == 1
        assert not [w for w in waits if isinstance(w, tuple)], waits
    finally:
        handler._stop_heartbeats()


def test_a_node_that_joins_a_job_that_trains_does_not_wait_torchs_first_join_jitter(store, monkeypatch):
    """torch's jitter is waited while the state it holds is round 0, and a fresh process holds
    round 0 until it reads the store: every joiner of a job that trains (a scale-up, a
    replacement; the agent's ``NOTEBOOK_ELASTIC_JOINER``) waited 0 to 0.3 s, alone in its join
    (old code: 0.15 s on average of a scale-up's 0.7 s, #41). A job's first joins still spread."""
    handler, waits = _jitter_handler(store, monkeypatch, "joiner-jitter", joiner=True)
    try:
        assert handler.next_rendezvous().world_size == 1
        assert not [w for w in waits if isinstance(w, tuple)], waits
    finally:
        handler._stop_heartbeats()


def test_a_round_closes_once_it_holds_the_jobs_target_not_last_call_later(store, monkeypatch):
    """torch closes a round of 1:3 nodes last_call after it reached 1 (here 600 s): with the
    job's target of 2 in the store, it closes as soon as the second node joins (old code:
    both nodes still waiting at the test's limit)."""
    monkeypatch.setattr(dr, "_delay", dr._delay)  # this process's torch as it was, after
    rules = rounds.RoundRules()
    assert rounds.close_rounds_at_target(rules, poll_s=0.1)
    ours = dr._delay
    assert rounds.close_rounds_at_target(rules, poll_s=0.1)  # idempotent: one _delay, not two
    assert dr._delay is ours
    store.set(protocol.TARGET_KEY, "2")
    host, port = "127.0.0.1", store.port

    def join(i: int, results: dict) -> None:
        client = torch.distributed.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
        handler = handler_on(client, "target", nodes=(1, 3), join_s=600, last_call_s=600, rules=rules).torch_handler
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

    rules = rounds.RoundRules()
    assert rounds.drop_gone_nodes(rules)
    assert rounds.drop_gone_nodes(rules)  # idempotent
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(store.port), str(int(KEEP_ALIVE_SET))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        client = torch.distributed.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60))
        ours = handler_on(client, "gone", nodes=(2, 2), join_s=120, last_call_s=30, keep_alive_s=60, rules=rules)
        assert ours.next_rendezvous().world_size == 2
        handler = ours.torch_handler
        assert peer.stdout.readline() == "joined\n"
        _round, members = torch_adapter.round_state(handler)
        assert {n.pid for n in members} == {os.getpid(), peer.pid}
        peer.kill()
        peer.wait()
        store.set(protocol.GONE_KEY, json.dumps({str(peer.pid): time.time()}))
        # Well inside the heartbeat window (180 s; 15 s where torch fixes it): dropped by the
        # supervisor's word, not by its heartbeat's expiry.
        deadline = time.monotonic() + min(60, torch_adapter.keep_alive_window_s(handler) / 2)
        while peer.pid in {n.pid for n in torch_adapter.round_state(handler)[1]}:
            assert time.monotonic() < deadline, "the dead peer is still in the round"
            time.sleep(0.1)
        assert {n.pid for n in torch_adapter.round_state(handler)[1]} == {os.getpid()}
        handler._stop_heartbeats()  # no keep-alive thread outlives the test's store
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()


def test_the_agents_monitor_waits_its_interval_on_what_can_cut_it_short(store, monkeypatch):
    """torch's run loop sleeps --monitor-interval between two looks and nothing wakes it: a
    departure the watch saw waited for the rest of it. Our agent has torch sleep a tick and waits
    the rest on ``wait_for_change`` (old code: torch slept the whole interval, nothing asked)."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    hooks = notebook_agent.AgentHooks()
    waits: list[float] = []
    hooks.wait_for_change = waits.append
    client = torch.distributed.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60))
    handler = handler_on(client, "monitor")
    spec = WorkerSpec(role="t", local_world_size=1, rdzv_handler=handler, entrypoint="true", monitor_interval=0.5)
    agent = notebook_agent.agent_subclass(hooks)(spec, logs_specs=DefaultLogsSpecs())
    assert spec.monitor_interval == notebook_agent.MONITOR_TICK_S  # torch's own sleep: a tick
    monkeypatch.setattr(
        torch_adapter.agent_class(), "_monitor_workers", lambda self, group: RunResult(state=WorkerState.HEALTHY)
    )
    assert agent._monitor_workers(agent.get_worker_group()).state == WorkerState.HEALTHY
    assert waits == [pytest.approx(0.5 - notebook_agent.MONITOR_TICK_S)]  # the rest, on what can cut it


def _a_node_joins_while_the_monitor_waits(store, monkeypatch, run_id: str, hooks, armed=lambda: True):
    """A member alone in a complete round, our agent's monitor waiting on it (``hooks``, a
    600-s interval), then a real handler of ours joining on the same store (its join times out
    after 5 s, nobody regroups here). Returns once the monitor's wait ended (or 60 s passed):
    whether it ended, and what torch's own look found waiting."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    rules = rounds.RoundRules()
    assert rounds.join_and_beat_together(rules) and rounds.regroup_in_one_write(rules)
    host, port = "127.0.0.1", store.port

    def client():
        return torch.distributed.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))

    member = handler_on(client(), run_id, nodes=(1, 3), join_s=600, last_call_s=1, rules=rules)
    assert member.next_rendezvous() is not None  # a complete round of one
    assert not member.round_moved()  # its first look: the counter as the round has it
    spec = WorkerSpec(role="t", local_world_size=1, rdzv_handler=member, entrypoint="true", monitor_interval=600)
    agent = notebook_agent.agent_subclass(hooks)(spec, logs_specs=DefaultLogsSpecs())
    monkeypatch.setattr(
        torch_adapter.agent_class(), "_monitor_workers", lambda self, group: RunResult(state=WorkerState.HEALTHY)
    )
    monitor = threading.Thread(target=agent._monitor_workers, args=(agent.get_worker_group(),), daemon=True)
    monitor.start()
    wait_until(armed, 10)
    joiner = handler_on(client(), run_id, nodes=(1, 3), join_s=5, last_call_s=1, rules=rules)
    ended: list[BaseException] = []

    def join() -> None:
        try:
            joiner.next_rendezvous()
        except Exception as exc:  # its join's timeout: nobody regroups in this test
            ended.append(exc)

    joining = threading.Thread(target=join, daemon=True)
    joining.start()
    try:
        monitor.join(60)
        return not monitor.is_alive(), member.num_nodes_waiting()  # torch's own look, next
    finally:
        joining.join(60)
        for handler in (member, joiner):
            handler.torch_handler._stop_heartbeats()  # no keep-alive thread outlives the test's store
        assert not joining.is_alive() and ended, "the joiner's thread outlived its join"


def wait_until(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the test's deadline"
        time.sleep(0.01)


def test_a_node_waiting_to_join_ends_the_monitors_wait_where_rounds_are_polled_fast(store, monkeypatch):
    """torch looks for a node waiting to join once a monitor interval, after its wait: a
    scale-up waited up to an interval for the survivors to see its node. Where rounds are
    polled fast (``join_look_s``: a local job) the wait looks at the round's change counter and
    ends once a node waits to join (old code: it waited the whole interval, here 600 s). The
    joiner is a real handler of ours joining the complete round on the same store."""
    hooks = notebook_agent.AgentHooks()
    hooks.join_look_s = 0.01  # at most every JOIN_LOOK_S
    ended, waiting = _a_node_joins_while_the_monitor_waits(store, monkeypatch, "join-look", hooks)
    assert ended, "the monitor waited on with a node waiting to join"
    assert waiting == 1


def test_a_node_waiting_to_join_ends_the_monitors_wait_through_the_stores_answer(store, monkeypatch):
    """Where the monitor does not look between its looks (a cluster's or Slurm's job, whose one
    store serves every node), the change watch holds a WAIT for the round's next change mark:
    the joiner's own write (it puts itself on the wait list) moves the counter and sets the
    mark, the store answers, and the monitor's wait ends (old code: the whole interval, 600 s
    here). The joiner is a real handler of ours; the store is torch's."""
    from notebook_elastic.agent.change_watch import ChangeWatch

    woken = threading.Event()
    hooks = notebook_agent.AgentHooks()
    hooks.wait_for_change = lambda seconds: woken.wait(seconds) or None
    hooks.change_watch = watch = ChangeWatch(woken.set)
    # Armed by the monitor's wait before anyone joins.
    ended, waiting = _a_node_joins_while_the_monitor_waits(
        store, monkeypatch, "change-watch", hooks, armed=lambda: watch.active
    )
    assert ended, "the monitor waited on with a node waiting to join"
    assert watch.woken == 1 and waiting == 1


def test_the_change_watch_follows_its_round_and_store_waits_once_per_mark_and_gives_up_on_a_dead_store(
    store, monkeypatch
):
    """The watch's thread waits for the key it is armed with; re-armed for another round, or for
    the same key through another store client (a replaced store), it cuts its WAIT and waits
    anew at once (the cut WAIT is no answer); a key once answered is never waited on again (a
    mark set while the count read since did not move would wake it in a loop); a store it
    cannot reach ends it after GIVE_UP_AFTER tries, and the monitor looks instead."""
    from notebook_elastic.agent import change_watch

    host, port = "127.0.0.1", store.port
    setter = torch.distributed.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    woken, stale = threading.Event(), []
    watch = change_watch.ChangeWatch(woken.set)
    before, after = object(), object()  # the agent's store client, then its replacement's
    watch.arm("r1/changed/1", (host, port), lambda: stale.append(1), before)
    wait_until(lambda: watch.watching("r1/changed/1"), 10)
    watch.arm("r2/changed/1", (host, port), lambda: stale.append(2), before)
    wait_until(lambda: watch.watching("r2/changed/1"), 10)  # cut from round 1's key
    watch.arm("r2/changed/1", (host, port), lambda: stale.append(3), after)
    wait_until(lambda: watch.watching("r2/changed/1") and watch._where[2] == id(after), 10)
    assert not setter.check(["r1/changed/1"])  # cut, not set: no one else is woken by it
    assert not woken.is_set() and watch.woken == 0 and watch._failures == 0
    setter.set("r2/changed/1", "1")
    assert woken.wait(10) and watch.woken == 1 and stale == [3]
    assert not watch.active and not watch.watching("r2/changed/1")  # armed again after the look
    watch.arm("r2/changed/1", (host, port), lambda: None, after)
    assert not watch.active  # that key is set: waiting on it again would wake at once, forever

    monkeypatch.setattr(change_watch, "RETRY_S", 0.01)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
    try:
        lost = change_watch.ChangeWatch(lambda: None, lambda address, timeout_s: change_watch.connect(address, 1.0))
        lost.arm("r1/changed/1", dead.getsockname()[:2])
        wait_until(lambda: lost.given_up, 60)
        assert not lost.active and lost.woken == 0
    finally:
        dead.close()


def test_only_a_job_whose_store_is_on_this_machine_looks_for_a_joiner_between_its_looks():
    """The look above costs a store call per agent every JOIN_LOOK_S: taken where the store is on
    loopback (a local job), not where one store serves every node of an allocation (Slurm's
    supervisor) or where rounds go at torch's pace (a cluster's)."""
    from notebook_elastic.agent.run import join_look_s

    local = {protocol.ENV_RDZV_POLL_S: "0.02", protocol.ENV_NOTICE_STORE: "127.0.0.1:4242"}
    assert join_look_s(local) == 0.02
    assert join_look_s({**local, protocol.ENV_NOTICE_STORE: "10.0.0.1:4242"}) is None  # Slurm
    assert join_look_s({protocol.ENV_NOTICE_STORE: "127.0.0.1:4242"}) is None  # no fast rounds


def test_a_worker_at_a_boundary_or_with_a_broken_group_wakes_its_agent(monkeypatch):
    """A worker's word over its link (runtime/inplace.py's Link, the agent's Links on a real
    socket): "boundary" (its group voted a change: a member goes) has the departure watch look
    now; "lost" (its group broke) ends the monitor's wait (old code: both waited for the next
    look of each, 0.1 s apart)."""
    from notebook_elastic.agent.inplace import InPlace
    from notebook_elastic.runtime.inplace import Link

    looked = threading.Event()
    monkeypatch.delenv(protocol.ENV_IN_PLACE, raising=False)
    agent_side = InPlace(lambda: "node-0", look_now=looked.set)
    for name, value in agent_side.start().items():
        monkeypatch.setenv(name, value)
    worker = Link.connect()
    assert worker is not None
    worker.send(op="boundary", step=3)
    assert looked.wait(30), "the watch was not told to look"
    waiting = threading.Thread(target=agent_side.wait_for_change, args=(600.0,), daemon=True)
    waiting.start()
    worker.send(op="lost", step=3)
    waiting.join(30)
    assert not waiting.is_alive(), "the monitor's wait was not cut short"
    assert agent_side.lost.is_set()
    # The round does not show the member gone yet (the supervisor's word still to come): the
    # next waits are short looks (LOST_LOOK_S), not the interval.
    again = threading.Thread(target=agent_side.wait_for_change, args=(600.0,), daemon=True)
    again.start()
    again.join(30)
    assert not again.is_alive(), "a broken group waited the whole interval for the member to go"


def test_a_stop_swallowed_during_an_in_place_regroup_lands_before_the_workers_get_the_new_group(monkeypatch):
    """torch's SignalException, raised wherever the agent's main thread is, may land in a store
    call whose ``except`` takes it for a lost connection (runtime/term.py's ``_Insist``): the
    stop is swallowed. In an in-place regroup (a joiner's round, a notice arriving meanwhile)
    the agent then put its kept workers in the new group and went ``RESEND_S`` later, a second
    regroup for the others. Now the stop lands once the round formed, before any worker is
    assigned. The signal handler is a boundary here: ``os.kill`` to itself raises as torch's
    handler would, instead of signalling the test process."""
    import signal as signals
    import types

    from torch.distributed.elastic.multiprocessing.api import SignalException

    from notebook_elastic.agent.inplace import InPlace
    from notebook_elastic.runtime import term
    from notebook_elastic.runtime.inplace import Link

    monkeypatch.delenv(protocol.ENV_IN_PLACE, raising=False)
    agent_side = InPlace(lambda: "node-0")
    for name, value in agent_side.start().items():
        monkeypatch.setenv(name, value)
    worker = Link.connect()
    assert worker is not None
    worker.say_capable(True)
    deadline = time.monotonic() + 30
    while agent_side.links.why_not([0]) is not None:
        assert time.monotonic() < deadline, "the worker's word did not reach the agent"
        time.sleep(0.01)
    sent: list[dict] = []
    monkeypatch.setattr(agent_side.links, "send", lambda local_rank, message: sent.append(message) or True)

    def torchs_handler(pid, sig):
        assert pid == os.getpid()
        raise SignalException(f"Process {pid} got signal: {sig}", sigval=signals.Signals(sig))

    monkeypatch.setattr(os, "kill", torchs_handler)
    monkeypatch.setattr(term._insist, "signalled", None)
    monkeypatch.setattr(term._insist, "shutting_down", False)

    def round_that_swallowed_a_stop():
        term._insist.told(signals.SIGTERM)  # the guard saw it; torch's raise went into an except

    member = types.SimpleNamespace(local_rank=0, global_rank=0, world_size=2, role_rank=0, role_world_size=2)
    group = types.SimpleNamespace(workers=[member], group_rank=0, group_world_size=2)
    with pytest.raises(SignalException):
        agent_side.restart({0: os.getpid()}, group, round_that_swallowed_a_stop, "joined")
    assert sent == [], "a worker was put in the new group before the stop landed"
    # Without a stop, the same regroup assigns the worker its place.
    monkeypatch.setattr(term._insist, "signalled", None)
    assert agent_side.restart({0: os.getpid()}, group, lambda: None, "joined")
    assert [m["op"] for m in sent] == ["assign"]


def test_a_fatal_end_is_one_fact_for_the_restart_and_the_regroup_and_the_other_nodes(monkeypatch):
    """A worker's "fatal" word over its link (runtime/inplace.py's Link, the agent's Links on a
    real socket) is the fact the agent's in-place policy and its restart decision both read
    (agent/fatal.py): no regroup for a departure from then on, the failures that follow end the
    job, and it is said in a real TCPStore once, where another node's agent reads it."""
    from torch.distributed import TCPStore

    from notebook_elastic.agent.fatal import FatalEnd
    from notebook_elastic.agent.inplace import InPlace
    from notebook_elastic.runtime.inplace import Link

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    here = FatalEnd(lambda: (store, "run-1"), lambda: "node-0")
    other = FatalEnd(lambda: (store, "run-1"), lambda: "node-1")
    monkeypatch.delenv(protocol.ENV_IN_PLACE, raising=False)
    agent_side = InPlace(lambda: "node-0", fatal=here)
    for name, value in agent_side.start().items():
        monkeypatch.setenv(name, value)
    assert not other.peer_gave_up() and not here.ends
    worker = Link.connect()
    assert worker is not None
    worker.send(op="fatal")
    deadline = time.monotonic() + 30
    while not here.ends and time.monotonic() < deadline:
        time.sleep(0.01)
    assert here.ends, "the worker's word did not reach the agent"
    assert agent_side.departure_seen([0], 1, graceful=False)  # no abort, no regroup: the job ends
    assert agent_side.regroup_now() is None and not agent_side.regroup.is_set()
    assert here.after_failures([])  # its failures (whatever their exit) end the job here
    assert store.get(protocol.fatal_key("run-1")) == b"node-0"
    assert other.peer_gave_up() and other.after_failures([])  # the other node stops the same way


def test_a_torch_that_cannot_abort_an_nccl_collective_is_found_before_a_change(monkeypatch):
    """#41 item 6: where a hung NCCL collective cannot be aborted (no ``_abort_process_group``,
    torch < 2.6, and no ``ProcessGroupNCCL.abort``), in place cannot be made safe: the probe a
    worker runs when its State is built says so in one sentence (its agent restarts it then).
    The probe is the one the worker runs; the torches here are made to lack what it looks for."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from notebook_elastic.runtime.group import nccl_abort_missing

    if getattr(c10d, "_abort_process_group", None) is not None:
        assert nccl_abort_missing() is None  # this torch (>= 2.6) aborts
    monkeypatch.delattr(c10d, "_abort_process_group", raising=False)

    class NoAbort:  # a ProcessGroupNCCL of a torch that cannot abort its collectives
        pass

    class Aborts:
        def abort(self) -> None: ...

    monkeypatch.setattr(dist, "ProcessGroupNCCL", NoAbort, raising=False)
    said = nccl_abort_missing()
    assert said == (
        f"torch {torch.__version__} cannot abort a hung NCCL collective "
        "(torch >= 2.6 has _abort_process_group, earlier ProcessGroupNCCL.abort)"
    )
    monkeypatch.setattr(dist, "ProcessGroupNCCL", Aborts)
    assert nccl_abort_missing() is None


def test_an_nccl_group_whose_abort_fails_makes_its_worker_restart_and_say_why(monkeypatch):
    """An abort that fails at the change (the NCCL call raised): the group's collectives end at
    its timeout, in a state not to build on. The worker then does not stay: it says why to its
    agent (which says ``in_place_refused``) and restarts as torchrun would."""
    from notebook_elastic.runtime import group as group_module
    from notebook_elastic.runtime.inplace import Assignment, InPlace, MembershipChange

    said: list[tuple[bool, str]] = []

    class Link:  # the worker's end of its agent's link (runtime/inplace.py), as the agent hears it
        closed = False
        change_pending = False

        def say_capable(self, capable: bool, why: str = "") -> None:
            said.append((capable, why))

    machinery = InPlace()
    machinery.link = Link()  # type: ignore[assignment]
    machinery.state = object()  # a State was built
    machinery.group.assignment = Assignment.from_message(
        {"round": 1, "epoch": 0, "rank": 0, "world_size": 2, "local_rank": 0, "local_world_size": 1}
        | {"group_rank": 0, "group_world_size": 2, "role_rank": 0, "role_world_size": 2}
        | {"store": "127.0.0.1:1", "prefix": "p"}
    )
    machinery.group.backend = "nccl"
    monkeypatch.setattr(group_module, "_abort_nccl", lambda: False)
    machinery.group.abort()
    assert machinery.continues_after(MembershipChange(), peer_lost=False) is None
    assert said == [(False, "the NCCL group could not be aborted (its collectives end at its timeout)")]


def two_nodes_in_a_round(store, run_id: str):
    """Two of our handlers on ``store`` that formed one round together (1 s keep-alive, where
    this torch lets it be set)."""
    handlers: dict[int, object] = {}

    def join(i: int) -> None:
        client = torch.distributed.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60))
        handler = handler_on(client, run_id, nodes=(1, 2), last_call_s=1).torch_handler
        handlers[i] = handler
        handler.next_rendezvous()

    joining = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(2)]
    for node in joining:
        node.start()
    for node in joining:
        node.join(timeout=120)
    return handlers[0], handlers[1]


def test_the_departure_watch_outlives_a_store_it_cannot_reach(store, monkeypatch):
    """A host cut off: its agent's look at the round fails (the store call ends at its deadline).
    The watch's thread stopped for good at that failure, so once the link came back the node never
    saw itself left out, and its worker waited out gloo's 120 s in the old group (a fresh-clone run
    of test_slurm_hosts). It looks again at the next interval: after three failed looks and the
    link back (the backend reaches the same store again, through a new client: the same store, not
    a replacement), the node dropped and the other gone on, it sees itself left out."""
    from types import SimpleNamespace

    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    from notebook_elastic.agent.departures import DepartureWatch

    if not KEEP_ALIVE_SET:
        pytest.skip("torch 2.4 fixes the heartbeat at 5 s x 3: dropping a node takes 15 s")
    h0, h1 = two_nodes_in_a_round(store, "cut-off")
    holder = h1._state_holder
    sync, failed = holder.sync, []

    backend = holder._backend
    first_client = backend._store

    def cut_off():
        if len(failed) < 3:
            failed.append(time.monotonic())
            if len(failed) == 3:  # the link back: the agent's backend reaches the same store again
                store_link._reconnect(backend, first_client, backend._ne_link)
            raise RendezvousConnectionError("The connection to the C10d store has failed.")
        return sync()

    watch = DepartureWatch(in_place=lambda ranks, round_, graceful: True)
    try:
        round_, members = torch_adapter.round_state(h1)
        healthy = SimpleNamespace(state=SimpleNamespace(name="HEALTHY"))
        watch.agent = SimpleNamespace(get_worker_group=lambda: healthy, _pcontext=SimpleNamespace(pids=dict))
        monkeypatch.setattr(holder, "sync", cut_off)
        watch.joined(h1, round_, members)  # its thread looks every interval
        deadline = time.monotonic() + 30
        while len(failed) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(failed) == 3, failed
        h1._stop_heartbeats()  # cut off: its heartbeat expires (1 s x 3) ...
        time.sleep(3.5)
        h0.next_rendezvous()  # ... and the other goes on without it
        deadline = time.monotonic() + 30
        while watch.left_out_since is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.thread is not None and watch.thread.is_alive()
        assert backend._store is not first_client  # a new client, of the same store: not a replacement
        assert watch.left_out_since is not None, "the watch stopped at the failed look"
    finally:
        watch.stop()
        if watch.thread is not None:
            watch.thread.join(timeout=10)
        for handler in (h0, h1):
            handler._stop_heartbeats()


def test_a_node_the_others_went_on_without_sees_itself_left_out(store):
    """A node stopped past its heartbeat (SIGSTOP, a host cut off and back) is dropped from its
    round and the others go on in a round of their own. Thawed, its agent saw nothing: torch's
    looks for nodes waiting to join, never for itself left out, and the departure watch looked
    only at a round it was in. The watch now sees the node in none of the round's lists; once
    that has lasted ``grace_s`` (its workers had that long to regroup in place on their own), the
    agent restarts them, once. Not on a store that replaced the round's (it lists nobody's old
    round: its agents regroup on it their own way), and not while the node joins a round."""
    from types import SimpleNamespace

    from notebook_elastic.agent.departures import DepartureWatch

    if not KEEP_ALIVE_SET:
        pytest.skip("torch 2.4 fixes the heartbeat at 5 s x 3: dropping a node takes 15 s")
    h0, h1 = two_nodes_in_a_round(store, "left-out")
    told: list[tuple] = []
    watch = DepartureWatch(in_place=lambda ranks, round_, graceful: told.append((ranks, round_, graceful)) or True)
    try:
        round_, members = torch_adapter.round_state(h1)
        assert len(members) == 2
        healthy = SimpleNamespace(state=SimpleNamespace(name="HEALTHY"))
        watch.agent = SimpleNamespace(get_worker_group=lambda: healthy, _pcontext=SimpleNamespace(pids=dict))

        def joined() -> None:  # as watch.joined, without its thread: each look is the test's
            watch.handler, watch.round, watch.members, watch.latest = h1, round_, members, (round_, members)
            watch.replacements, watch.left_out_since = store_link.replacements(h1), None

        joined()
        watch._check()
        assert told == [] and not watch.left_out(grace_s=0)  # in the round, with both members
        h1._stop_heartbeats()  # node 1 stops: its heartbeat expires (1 s x 3)
        time.sleep(3.5)
        watch._check()  # its own look drops it from the round (torch's sanitize) ...
        assert told == [] and watch.left_out_since is not None  # ... not a member gone to abort for
        h0.next_rendezvous()  # node 0 goes on without it, alone in the next round
        now = torch_adapter.round_state(h1)
        assert now is not None and now[0] > round_ and torch_adapter.left_out(h1) is not None
        watch._check()
        assert told == []  # not a member gone from its round: this node is the one out
        assert not watch.left_out(grace_s=60)  # its workers have time to regroup on their own
        assert watch.left_out(grace_s=0)  # then the agent restarts them ...
        watch._check()
        assert not watch.left_out(grace_s=0)  # ... once
        # A node that joins a round is not left out meanwhile; nor is one on a replaced store.
        joined()
        watch.joining()
        watch._check()
        assert not watch.left_out(grace_s=0)
        joined()
        h1._state_holder._backend._ne_replacements += 1  # its store found replaced since (_reconnect)
        watch._check()
        assert not watch.left_out(grace_s=0)
    finally:
        for handler in (h0, h1):
            handler._stop_heartbeats()  # no keep-alive thread outlives the test's store


def test_workers_restarted_for_a_node_left_out_are_killed_not_waited_for(tmp_path):
    """A node left out (dropped while cut off, the others gone on) restarts its workers; they wait
    in the old group's collective, where a Python handler (Slurm's SIGTERM, deferred) runs only
    when the call returns: torch's SIGTERM then waited out its 30 s before its SIGKILL, and a
    two-host job ended before the node was back (a partition test's run here). The agent's hook
    names the signal for that restart, and torch's own shutdown sends it. Here a real process
    that notes each SIGTERM stands in for the worker: stopped within a left-out restart it gets
    SIGKILL alone; stopped at the node's end it gets torch's SIGTERM, as ever."""
    import signal
    import sys

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    notes = tmp_path / "notes"
    child = (
        "import signal, sys, time\n"
        "def noted(signum, frame):\n"
        f"    open({str(notes)!r}, 'a').write('TERM\\n')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, noted)\n"
        f"open({str(notes)!r}, 'a').write('ready\\n')\n"
        "time.sleep(120)\n"
    )
    hooks = notebook_agent.AgentHooks()
    hooks.before_stop = lambda agent, restarting: signal.SIGKILL if restarting else None
    agent_class = notebook_agent.agent_subclass(hooks)

    def stopped(restarting: bool) -> list[str]:
        notes.write_text("")
        context = start_processes(
            name="left-out",
            entrypoint=sys.executable,
            args={0: ("-c", child)},
            envs={0: {}},
            logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / f"logs-{restarting}")),
        )
        try:
            deadline = time.monotonic() + 60
            while "ready" not in notes.read_text():
                assert time.monotonic() < deadline, "the stand-in worker did not start"
                time.sleep(0.05)
            agent = object.__new__(agent_class)  # never started: only its _shutdown
            agent._worker_watchdog = agent._health_check_server = agent._rdzv_handler = (
                None  # (torch 2.4 reads the last)
            )
            agent._pcontext, agent._ne_restarting = context, restarting
            agent._shutdown()  # as torch's _stop_workers calls it
            (pid,) = context.pids().values()
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # it is gone (reaped by the context's close)
        finally:
            context.close()
        return notes.read_text().split()

    assert stopped(restarting=True) == ["ready"]  # SIGKILL alone: no SIGTERM waited on
    assert stopped(restarting=False) == ["ready", "TERM"]  # the node's end: torch's SIGTERM

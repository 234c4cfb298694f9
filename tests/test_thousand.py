"""A job of many nodes (#40): nodes that join, leave and beat together (agent/together.py), the
simulated agents the benchmark runs a thousand of (tests/rdzv_sim.py) checked against torch's
own classes, and a round of 1,024 of them.

The rounds here are torch's c10d rendezvous: torch's handlers (ours, as ``handler_over`` makes
them; one of torch's own, as its registry makes it) in threads, each with its own TCPStore
client, against our store server; or the simulated agents. Nothing here is timed: what is
asserted is who is in a round, with which rank, and how many writes of the state it took."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import os
import pickle
import socket
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
import rdzv_sim as sim
import torch
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from notebook_elastic.agent import rounds, store_link, together, torch_adapter
from notebook_elastic.contract import protocol
from notebook_elastic.store import keys as store_keys
from notebook_elastic.store.server import StoreServer

#: Whether this torch lets a handler's heartbeat be set (2.5 and later; 2.4 fixes 5 s x 3).
KEEP_ALIVE_SET = "keep_alive_interval" in inspect.signature(dr.DynamicRendezvousHandler.from_backend).parameters


MEMBERS = b"#members"


def _members(value: bytes) -> tuple | None:
    """A state's round, completeness, participants and wait list (None: no state yet)."""
    if value in (b"", sim.SENTINEL):
        return None
    state = pickle.loads(base64.b64decode(value))
    return state.round, state.complete, dict(state.participants), frozenset(state.wait_list)


@pytest.fixture
def served(monkeypatch):
    """Our store server in a thread, counting the writes of each rendezvous state that won; and,
    under the key + ``MEMBERS``, those of them that changed its round's members (a join, a leave,
    a node waiting, a round opened or completed: not a heartbeat alone, which a torch that
    fixes its heartbeats, 2.4's, writes for each node every 5 s, whatever else goes on)."""
    won: dict[bytes, int] = {}
    compare_set = store_keys.Keys._compare_set

    def counting(self, key, expected, desired):
        current = compare_set(self, key, expected, desired)
        state_key = key.startswith(b"/torch.rendezvous.") and b"/" not in key[1:]
        if state_key and current == desired and desired != sim.SENTINEL:  # not the backend's first mark
            won[key] = won.get(key, 0) + 1
            if _members(expected) != _members(desired):
                won[key + MEMBERS] = won.get(key + MEMBERS, 0) + 1
        return current

    monkeypatch.setattr(store_keys.Keys, "_compare_set", counting)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    server = StoreServer(sock)
    thread = server.start()
    yield sock.getsockname()[1], won
    server.stop()
    thread.join(10)


@pytest.fixture
def rules(monkeypatch):
    """The round rules of this test's nodes (torch's, until the test sets one); and no random
    wait before a first round (torch's 0-0.3 s, which spreads twelve nodes so that no two writes meet)."""
    delay = dr._delay
    monkeypatch.setattr(dr, "_delay", lambda seconds: None if isinstance(seconds, tuple) else delay(seconds))
    return rounds.RoundRules()


def _client(port: int) -> torch.distributed.TCPStore:
    return torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))


def _params(port: int, run_id: str, n: int, keep_alive: tuple[int, int] = (5, 6)) -> RendezvousParameters:
    extra = {"keep_alive_interval": keep_alive[0], "keep_alive_max_attempt": keep_alive[1]} if KEEP_ALIVE_SET else {}
    return RendezvousParameters(
        backend=rounds.RDZV_BACKEND,
        endpoint=f"127.0.0.1:{port}",
        run_id=run_id,
        min_nodes=n,
        max_nodes=n,
        join_timeout=120,
        last_call_timeout=1,
        **extra,
    )


def _round(
    port: int, run_id: str, n: int, rules: rounds.RoundRules, plain: int = 0, keep_alive: tuple[int, int] = (5, 6)
) -> list:
    """n nodes, ``plain`` of them torch's own handler, the others ours under ``rules``, each
    joining in a thread: their (handler, rendezvous info)."""
    out: list = [None] * n
    errors: list = []
    start = threading.Barrier(n, timeout=120)  # all at once: their writes meet

    def join(i: int) -> None:
        try:
            client = _client(port)
            params = _params(port, run_id, n, keep_alive)
            if i < plain:
                handler = dr.create_handler(client, C10dRendezvousBackend(client, run_id), params)
            else:
                handler = rounds.handler_over(client, params, rules, rounds.RendezvousHooks(), store_link.StoreLink())
                handler = handler.torch_handler
            start.wait()
            out[i] = (handler, handler.next_rendezvous())
        except Exception as exc:  # told by the assertion below, with its node
            errors.append((i, exc))

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert all(o is not None for o in out), "a node never finished joining"
    return out


def _stop(joined: list) -> None:
    for handler, _info in joined:
        handler._stop_heartbeats()  # no keep-alive thread outlives the test's store


def test_nodes_that_join_together_fill_a_round_in_a_few_writes_and_torchs_own_node_shares_it(served, rules):
    """Twelve nodes join a round of 12 (one of them torch's own handler, which knows nothing of
    sayings): every node gets its own rank in one round. Each node wrote its own join before:
    12 writes of the state at least; together, far fewer (the first writers take in the rest)."""
    port, won = served
    assert rounds.join_and_beat_together(rules)
    joined = _round(port, "together", 12, rules, plain=1)
    try:
        ranks = sorted(info.rank for _h, info in joined)
        assert ranks == list(range(12)) and {info.world_size for _h, info in joined} == {12}
        formed = {h._state_holder.state.round for h, _i in joined}
        assert formed == {0}
        writes = won[b"/torch.rendezvous.together"]
        assert writes < 6, f"{writes} writes of the state for 12 joins"
    finally:
        _stop(joined)


def test_each_node_writing_its_own_join_is_what_torch_does(served, rules):
    """The baseline of the test above, torch's way (our nodes without sayings): a write each."""
    port, won = served
    joined = _round(port, "alone", 12, rules)
    try:
        assert sorted(info.rank for _h, info in joined) == list(range(12))
        assert won[b"/torch.rendezvous.alone"] >= 12
    finally:
        _stop(joined)


@pytest.mark.skipif(not KEEP_ALIVE_SET, reason="this torch fixes the heartbeat at 5 s: the test would take minutes")
def test_heartbeats_go_together_and_nobody_is_dropped(served, rules):
    """Eight nodes, a heartbeat every 2 s, seven missed to be dropped (six leave too little of
    the window past the last resort of ``together.beats_together``): over five intervals each
    node wrote its own heartbeat before (40 writes at least); together, what each says is taken
    in by another's write, and every node stays in its round."""
    port, won = served
    assert rounds.join_and_beat_together(rules)
    joined = _round(port, "beats", 8, rules, keep_alive=(2, 7))
    try:
        key = b"/torch.rendezvous.beats"
        before = won[key]
        time.sleep(10)  # five intervals: what is counted is writes, not time
        writes = won[key] - before
        members = {frozenset(torch_adapter.round_state(h)[1]) for h, _i in joined}
        assert len(members) == 1 and len(next(iter(members))) == 8, "a node was dropped"
        assert writes < 20, f"{writes} writes of the state for 8 nodes' heartbeats over 5 intervals"
    finally:
        _stop(joined)


def test_a_node_leaving_takes_the_others_leaving_with_it(rules):
    """The sayings on a state, without a store: what together.py does to torch's state."""
    settings = dr.RendezvousSettings(
        "r", 2, 4, dr.RendezvousTimeout(), keep_alive_interval=timedelta(seconds=5), keep_alive_max_attempt=6
    )
    nodes = [dr._NodeDesc(f"10.0.0.{i}", 100 + i, 0) for i in range(4)]
    state = dr._RendezvousState()
    now = time.time()
    said = together.parse(b"".join(together.line(together.JOIN, 0, n, now) for n in nodes[1:]) + b"torn lin")
    state.participants[nodes[0]] = 0
    state.last_heartbeats[nodes[0]] = datetime.now(timezone.utc)
    assert together.take_joins(state, said, settings, lambda f: dr._NodeDesc(*f), now) == 3
    assert state.complete and sorted(state.participants.values()) == [0, 1, 2, 3]  # full: ranked as torch ranks
    state.complete = False
    leaving = together.parse(b"".join(together.line(together.LEAVE, 0, n, now) for n in nodes[:3]))
    gone = together.take_leaves(state, leaving, lambda f: dr._NodeDesc(*f), nodes[0])
    assert gone == nodes[1:3] and set(state.participants) == {nodes[0], nodes[3]}  # not itself: its own removal
    later = now + 7
    alive = together.parse(together.line(together.ALIVE, -1, nodes[3], later))
    assert together.take_alive(state, alive, lambda f: dr._NodeDesc(*f)) == 1
    assert state.last_heartbeats[nodes[3]].timestamp() == pytest.approx(later, abs=0.01)
    assert together.beat_due(state, nodes[0], settings.keep_alive_interval, now + 8)
    assert not together.beat_due(state, nodes[3], settings.keep_alive_interval, later + 5)
    assert together.beats_together(settings)  # a cluster's 5 s x 6
    local = dr.RendezvousSettings("r", 1, 2, dr.RendezvousTimeout(), timedelta(seconds=1), 3)
    assert not together.beats_together(local)  # the local 1 s x 3: each node writes its own


@pytest.mark.torch_contract
def test_a_join_taken_into_a_round_with_no_heartbeat_yet_gets_this_torchs_kind_of_time():
    """torch 2.4 keeps the rendezvous's times naive (``datetime.utcnow()``), later ones aware
    (UTC). A join taken in by a write of ours into a round with no heartbeat yet (the first
    round, or one every member left) got an aware time whatever the torch, and torch 2.4's own
    keep-alive then failed comparing it with its naive now (TypeError: the 128-agent simulation
    on torch 2.4.1 stopped there)."""
    settings = dr.RendezvousSettings("r", 1, 2, dr.RendezvousTimeout(), timedelta(seconds=5), 6)
    state = dr._RendezvousState()
    node = dr._NodeDesc("127.0.0.1", 1, 0)
    now = time.time()
    said = [together.Said(together.JOIN, 0, ("127.0.0.1", 1, 0), now)]
    assert together.take_joins(state, said, settings, lambda n: dr._NodeDesc(*n), now) == 1
    assert (state.last_heartbeats[node].tzinfo is not None) == torch_adapter.rendezvous_times_aware()
    assert dr._should_keep_alive(dr._RendezvousContext(node, state, settings)) is False  # torch's own comparison


def test_in_a_complete_round_two_members_on_duty_write_the_heartbeats_in_turn():
    """#40: in steady state 1,024 simulated nodes' heartbeats came due together and each tried
    a write of the 130 kB round (1,207 tries in two intervals, 6 won). Now, in a complete round,
    ``ON_DUTY`` members by rank write each interval, in turn; another writes only once what it
    said went untaken for ``OFF_DUTY_INTERVALS``, and then only ``ON_DUTY`` of those overdue, in
    turn (434 of 1,024 simulated nodes overdue at once after a slow first round wrote together,
    lost to one another until heartbeats expired and the round broke); every one only past
    ``LAST_RESORT_INTERVALS``; while a round forms, the old limit holds."""
    interval = timedelta(seconds=5)
    nodes = [dr._NodeDesc(f"10.0.0.{i}", 100 + i, 0) for i in range(8)]
    state = dr._RendezvousState()
    now = 1_000_000 * 5.0  # the start of interval 1,000,000
    for node in nodes:
        state.participants[node] = 0
        state.last_heartbeats[node] = datetime.fromtimestamp(now - 1.2 * 5, timezone.utc)
    assert all(together.beat_due(state, n, interval, now + 2 * 5) for n in nodes)  # forming: > 1.5 intervals
    assert not any(together.beat_due(state, n, interval, now) for n in nodes)
    state.complete = True
    for rank, node in enumerate(nodes):
        state.participants[node] = rank
    for i in range(16):  # each interval: two on duty, every member in turn
        for node in nodes:  # taken in 1.2 intervals ago: past torch's one, within the others'
            state.last_heartbeats[node] = datetime.fromtimestamp(now + i * 5 - 1.2 * 5, timezone.utc)
        due = [r for r, n in enumerate(nodes) if together.beat_due(state, n, interval, now + i * 5)]
        assert len(due) == together.ON_DUTY and (1_000_000 + i) % 8 in due, (i, due)
    # 2.8 intervals since the state's heartbeats, all overdue (past OFF_DUTY_INTERVALS): those on
    # duty and two backups write, the backups in turn, so every member overdue is one in 4 intervals
    backups: set[int] = set()
    for i in range(16, 20):
        at = now + i * 5 + 1
        for node in nodes:
            state.last_heartbeats[node] = datetime.fromtimestamp(at - 2.8 * 5, timezone.utc)
        on_duty = {r for r, n in enumerate(nodes) if (r - (1_000_000 + i)) % 8 < together.ON_DUTY}
        due = {r for r, n in enumerate(nodes) if together.beat_due(state, n, interval, at)}
        assert on_duty <= due and len(due - on_duty) <= together.ON_DUTY and len(due) > len(on_duty), (i, due)
        backups |= due - on_duty
        for node in nodes:  # 2 intervals: not yet overdue, only those on duty write
            state.last_heartbeats[node] = datetime.fromtimestamp(at - 2 * 5, timezone.utc)
        assert {r for r, n in enumerate(nodes) if together.beat_due(state, n, interval, at)} == on_duty
    assert len(backups) >= len(nodes) - 2 * together.ON_DUTY, backups  # the turn goes round
    late = now + 15 * 5 + 2.1 * 5  # 3.3 intervals: past LAST_RESORT_INTERVALS, each writes its own
    for node in nodes:
        state.last_heartbeats[node] = datetime.fromtimestamp(now + 15 * 5 - 1.2 * 5, timezone.utc)
    assert all(together.beat_due(state, n, interval, late) for n in nodes)
    # one on duty writes though its own heartbeat is fresh, once an interval, where a member's is old
    at = now + 20 * 5
    for node in nodes:
        state.last_heartbeats[node] = datetime.fromtimestamp(at - 0.5 * 5, timezone.utc)
    first = (1_000_000 + 20) % 8
    assert together.duty_write(state, nodes[first], interval, at, None) is None  # every heartbeat fresh
    state.last_heartbeats[nodes[5]] = datetime.fromtimestamp(at - 1.6 * 5, timezone.utc)
    assert together.duty_write(state, nodes[first], interval, at, None) == 1_000_020
    assert together.duty_write(state, nodes[first], interval, at, 1_000_020) is None  # written this interval
    assert together.duty_write(state, nodes[(first + 2) % 8], interval, at, None) is None  # off duty
    stranger = dr._NodeDesc("10.0.0.99", 99, 0)
    state.last_heartbeats[stranger] = datetime.fromtimestamp(now - 1.6 * 5, timezone.utc)
    assert together.beat_due(state, stranger, interval, now)  # no member: the old limit


# -- the simulated agents, against torch's own classes -----------------------------------------


def _state(n: int, seed: int) -> tuple[dr._RendezvousState, list]:
    import random

    rng = random.Random(seed)
    nodes = [dr._NodeDesc(f"10.1.{i // 256}.{i % 256}", 4000 + i, i % 3) for i in range(n)]
    state = dr._RendezvousState()
    state.round = rng.randrange(5)
    for node in nodes[: n - 3]:
        state.participants[node] = 0
        state.last_heartbeats[node] = sim.utc_now() - timedelta(seconds=rng.randrange(60))
    state.wait_list.add(nodes[-1])
    state.redundancy_list.add(nodes[-2])
    state.last_heartbeats[nodes[-1]] = sim.utc_now()
    state.last_heartbeats[nodes[-2]] = sim.utc_now()
    state.deadline = sim.utc_now() + timedelta(seconds=3)
    return state, nodes


def test_who_leads_completes_and_backs_up_a_round_is_chosen_in_torchs_order_of_nodes():
    """together's choices of members (the leader that writes the next round, the first member
    that completes one, the ranks of a complete round, the backups that write the heartbeats,
    whether every member said it regroups) compare nodes by their fields, in C, where the node's
    own ``__hash__``, ``__eq__`` and ``__lt__`` are Python: a member's look over a round of 1,024
    was 0.41 ms for the leader alone and a simulated change of 1,024 spent 1 s in them. The
    choices are those of torch's own node order and equality, on nodes whose addresses order
    otherwise as text than as numbers, share an address, or share a pid; ties of rank included."""
    import random

    rng = random.Random(40)
    for trial in range(200):
        n = rng.randint(1, 40)
        addrs = [f"10.0.{rng.randint(0, 2)}.{rng.randint(1, 12)}" for _ in range(n)]
        nodes = list(dict.fromkeys(dr._NodeDesc(a, rng.randint(1, 5), rng.randint(0, 1)) for a in addrs))
        state = dr._RendezvousState()
        ranks = rng.sample(range(len(nodes)), len(nodes)) if trial % 3 else [rng.randint(0, 2) for _ in nodes]
        now = 1_000_000 * 5.0 + rng.uniform(0, 5)
        for node, rank in zip(nodes, ranks):
            state.participants[node] = rank
            state.last_heartbeats[node] = datetime.fromtimestamp(now - rng.uniform(0, 4) * 5, timezone.utc)
        state.complete = True
        # torch's own comparisons, as the choices were written before
        assert together.leader(state) == min(state.participants, key=lambda m: (state.participants[m], m))
        assert together.first_member(state) == min(state.participants)
        assert together.in_order(state.participants) == sorted(state.participants)
        limit = datetime.fromtimestamp(now - together.OFF_DUTY_INTERVALS * 5, timezone.utc)
        this = together.interval_of(now, 5.0)
        overdue = sorted(
            r
            for m, r in state.participants.items()
            if (r - this) % len(nodes) >= together.ON_DUTY and state.last_heartbeats[m] < limit
        )
        for node in nodes:
            rank = state.participants[node]
            backup = (
                rank in overdue and (overdue.index(rank) - this * together.ON_DUTY) % len(overdue) < together.ON_DUTY
            )
            if (rank - this) % len(nodes) >= together.ON_DUTY and state.last_heartbeats[node] < limit:
                assert together._backup(state, node, limit, this) == backup
        copies = [dr._NodeDesc(m.addr, m.pid, m.local_id) for m in nodes]  # decoded: equal, not the same
        said = [together.Said(together.REGROUP, state.round, (m.addr, m.pid, m.local_id), now) for m in copies]
        me = copies[0]
        assert together.regrouping(state, said, me)
        assert together.regrouping(state, said[1:], me)  # its own saying is not needed
        if len(nodes) > 1:
            assert not together.regrouping(state, said[:-1], me)  # one member has not said so
            stale = [together.Said(together.REGROUP, state.round - 1, said[-1].node, now)]
            assert not together.regrouping(state, said[:-1] + stale, me)  # of another round


def test_the_simulated_agents_bytes_are_a_pickle_of_torchs_own_state():
    codec = sim.Codec()
    for n, seed in ((1, 0), (40, 1), (300, 2)):
        state, _nodes = _state(max(n, 4), seed)
        encoded = codec.encode(state)
        back = pickle.loads(base64.b64decode(encoded))
        assert type(back) is dr._RendezvousState and vars(back) == vars(state)
        mine = base64.b64encode(pickle.dumps(state))
        assert abs(len(encoded) - len(mine)) < 0.1 * len(mine)  # the same size on the wire, near enough
    assert codec.decode(encoded) == codec.decode(encoded) and codec.decodes == 0  # its own: not decoded again


def test_the_simulated_agents_actions_are_torchs_executors():
    """Each of the nine actions, applied by the simulated agent and by torch's own executor to
    the same state: the same state after."""
    settings = dr.RendezvousSettings(
        "r", 2, 30, dr.RendezvousTimeout(), keep_alive_interval=timedelta(seconds=5), keep_alive_max_attempt=6
    )
    for action in dr._Action:
        if action in (dr._Action.SYNC, dr._Action.ERROR_CLOSED, dr._Action.ERROR_TIMEOUT, dr._Action.FINISH):
            continue
        for who in (0, 2, 27, 28, 29):  # a participant, others, the waiting and the redundant nodes
            state, nodes = _state(30, 7)
            node = nodes[who]
            if action == dr._Action.ADD_TO_PARTICIPANTS and node in state.participants:
                continue
            if action == dr._Action.REMOVE_FROM_PARTICIPANTS and node not in state.participants:
                continue
            if action == dr._Action.REMOVE_FROM_WAIT_LIST and node not in state.wait_list:
                continue
            if action == dr._Action.REMOVE_FROM_REDUNDANCY_LIST and node not in state.redundancy_list:
                continue
            theirs = sim.clone(state)
            executor = dr._DistributedRendezvousOpExecutor(node, None, settings)  # type: ignore[arg-type]
            executor._state = theirs
            method = {
                dr._Action.KEEP_ALIVE: executor._keep_alive,
                dr._Action.ADD_TO_PARTICIPANTS: executor._add_to_participants,
                dr._Action.ADD_TO_WAIT_LIST: executor._add_to_wait_list,
                dr._Action.ADD_TO_REDUNDANCY_LIST: executor._add_to_redundancy_list,
                dr._Action.REMOVE_FROM_PARTICIPANTS: executor._remove_from_participants,
                dr._Action.REMOVE_FROM_WAIT_LIST: executor._remove_from_wait_list,
                dr._Action.REMOVE_FROM_REDUNDANCY_LIST: executor._remove_from_redundancy_list,
                dr._Action.MARK_RENDEZVOUS_COMPLETE: executor._mark_rendezvous_complete,
                dr._Action.MARK_RENDEZVOUS_CLOSED: executor._mark_rendezvous_closed,
            }[action]
            method()
            ours = sim.clone(state)
            sim.apply(action, ours, node, settings)
            for beats in (theirs.last_heartbeats, ours.last_heartbeats):  # "now" differs by microseconds
                if node in beats and beats[node] > sim.utc_now() - timedelta(seconds=1):
                    beats[node] = datetime.min
            for s in (theirs, ours):  # a deadline is "now" + last call
                if s.deadline is not None and s.deadline > sim.utc_now():
                    s.deadline = None
            assert vars(ours) == vars(theirs), (action, who)


#: How much ahead of the rest of the suite the 1,024 simulated agents and their store run
#: (``os.setpriority``; root only): on a real cluster each agent has a machine and the store a
#: pod of its own, where here they share a slice of 2 cores with the suite's other tests. At -10
#: a fresh-clone run (main tier of 3 workers, the paced lane and both torch ends beside it) still
#: ran this loop 0.9 to 2 s late every 5-s interval: its agents' own heartbeats went late, the
#: members overdue wrote as backups (376 to 2,595 writes an interval) and 170 live nodes were
#: dropped, a starvation of one process no cluster's agents share. The most a nice gives.
SIMULATION_NICE = -20
#: Intervals after the first round the writes of the round have to come down to a few (steady state).
SETTLE_INTERVALS = 8


@contextlib.contextmanager
def as_machines_would(*pids: int):
    """Run this thread and ``pids`` ahead of the machine's other work while the ``with`` lasts,
    where the user may (root): starved beside the whole suite and 5 busy loops, one process's
    1,024 agents ran their heartbeats 9 s late and dropped 85 of their own, a starvation no
    cluster's agents share; else as they are (the failure then says how late the loop ran)."""
    ids = [0, *pids]  # 0: this thread (Linux's nice is per thread)
    before = {}
    for pid in ids:
        with contextlib.suppress(OSError):
            prio = os.getpriority(os.PRIO_PROCESS, pid)
            os.setpriority(os.PRIO_PROCESS, pid, SIMULATION_NICE)
            before[pid] = prio
    try:
        yield
    finally:
        for pid, prio in before.items():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, pid, prio)


@pytest.mark.slow
# Not timed, so bounded for a broken run only: beside the whole suite and the torch range on 2
# cores the first round took past the suite's 600 s once (fresh-clone run of 2026-12-06; 75 s in
# CI before, 26 s alone on a quiet machine).
@pytest.mark.timeout(1500)
def test_a_round_of_1024_simulated_agents_gives_each_a_rank_and_keeps_them_all(tmp_path):
    """#40: 1,024 simulated agents against our store, as they join a cluster job's first round:
    one round, each agent with a rank of its own; after it, the writes of the round down to a
    few an interval (not one per node) within ``SETTLE_INTERVALS`` heartbeat intervals, and no
    node dropped in them (heartbeats that could not be written dropped live nodes before). Not timed: the round may take what this
    machine needs (on a machine starved enough for this one process to run seconds late, its
    1,024 agents' heartbeats are late too: the failure says how late it ran)."""
    from notebook_elastic.store import run as store_run  # noqa: F401  (the store the pod runs)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    import subprocess
    import sys

    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys; from notebook_elastic.store.server import StoreServer; "
            "s = socket.socket(fileno=int(sys.argv[1])); StoreServer(s).serve_forever()",
            str(sock.fileno()),
        ],
        pass_fds=(sock.fileno(),),
    )
    port = sock.getsockname()[1]
    sock.close()

    async def story() -> None:
        settings = sim.Settings(min_nodes=1023, max_nodes=1024, together=True, backoff_s=0.02, supervised=False)
        fleet = sim.Fleet("127.0.0.1", port, settings)
        lag = [0.0]  # the longest this loop ran late: 1,024 agents share one process here

        async def probe() -> None:
            while True:
                t0 = time.monotonic()
                await asyncio.sleep(0.1)
                lag[0] = max(lag[0], time.monotonic() - t0 - 0.1)

        prober = asyncio.ensure_future(probe())
        try:
            await fleet.add(1024)
            await fleet.until(lambda: len(fleet.ranked_in(0)) == 1024, 1400, "the first round")
            assert sorted(a.marks.rank[0] for a in fleet.agents) == list(range(1024))
            assert {a.round for a in fleet.agents} == {0}
            formed = time.monotonic()
            # Steady state: the first intervals after a round that took long to form still see
            # heartbeats taken in late (72 to 268 writes in the first two); then the two on duty
            # write each interval (together.ON_DUTY): 3 to 5 here (each node tried one every two
            # intervals before, 600 an interval, all but a few lost). Starved beside the whole
            # suite (this loop seconds late), the members overdue write as backups for a while
            # (216 in the third interval once, in CI): so the writes must come down to a few
            # within SETTLE intervals, and no node be dropped in any of them.
            per_interval: list[tuple[int, float]] = []  # (writes tried, how late this loop ran)
            for _ in range(SETTLE_INTERVALS):
                writes, lag[0] = fleet.state_writes, 0.0  # tried, won or lost: each the whole round
                await asyncio.sleep(settings.keep_alive_interval_s)
                per_interval.append((fleet.state_writes - writes, lag[0]))
                if len(per_interval) >= 3 and per_interval[-1][0] <= 64:
                    break
            dropped = [a for a in fleet.agents if a.marks.departures or a.marks.waiting]
            assert not dropped, (
                "a live node was dropped: "
                + "; ".join(
                    f"agent {a.index} saw "
                    + (f"{sum(len(gone) for _, gone in a.marks.departures)} gone" if a.marks.departures else "")
                    + (" a node waiting" if a.marks.waiting else "")
                    + f" {min(t for t, _ in a.marks.departures) - formed if a.marks.departures else min(a.marks.waiting) - formed:+.1f} s after the round"
                    for a in dropped[:5]
                )
                + f" (heartbeats missed: {sum(a.missed_beats for a in fleet.agents)}; per interval, writes"
                f" and how late this loop ran: {per_interval})"
            )
            assert per_interval[-1][0] <= 64, (
                f"the writes of the round never came down to a few an interval: {per_interval}"
                " (writes tried, and how late this loop ran in s, per interval)"
            )
            assert fleet.codec.foreign == 0  # every state read was one an agent here wrote
        finally:
            prober.cancel()
            fleet.close()
            await asyncio.sleep(0.2)

    try:
        with as_machines_would(server.pid):
            asyncio.run(story())
    finally:
        server.terminate()
        server.wait(30)


def test_the_views_of_a_1024_node_job_stay_bounded():
    """#40: a job of 1,024 nodes x 8 ranks, its first round and a node lost, folded as the
    kernel folds it: the agents' rendezvous lines no longer carry the round's members past
    ``MEMBERS_TOLD`` (a million entries a round: the fold held 567 MB), the fold stays under
    64 MB, and the rank map is a summary a person can read, with the lost node named."""
    import json
    import tracemalloc

    from notebook_elastic.agent.run import MEMBERS_TOLD, rendezvous_members
    from notebook_elastic.contract.events import LineParser
    from notebook_elastic.contract.job_state import JobState
    from notebook_elastic.contract.protocol import EVENT_PREFIX
    from notebook_elastic.kernel.ui.render import RANK_MAP_ROWS, ranks_html

    n, nproc = 1024, 8
    names = [f"big-workers-{i}" for i in range(n)]

    def line(kind: str, t: float, node: str, **fields: object) -> str:
        return EVENT_PREFIX + json.dumps({"kind": kind, "t": t, "node": node, **fields})

    def round_(r: int, t: float, alive: list[int]) -> list[tuple[str, str]]:
        members = [
            {"addr": f"10.0.{i // 256}.{i % 256}", "pid": 7, "local_id": 0, "group_rank": g}
            for g, i in enumerate(alive)
        ]
        shown = rendezvous_members(members)
        out = []
        for g, i in enumerate(alive):
            told = {"members": shown} if shown is not None else {}
            out.append(
                (names[i], line("rendezvous", t, names[i], round=r, group_rank=g, group_world_size=len(alive), **told))
            )
            for local in range(nproc):
                rank = g * nproc + local
                started = {"rank": rank, "local_rank": local, "world_size": len(alive) * nproc, "group_rank": g}
                out.append((names[i], line("worker_started", t + 1, names[i], pid=rank, generation=r, **started)))
        return out

    assert rendezvous_members([{}] * MEMBERS_TOLD) is not None and rendezvous_members([{}] * (MEMBERS_TOLD + 1)) is None
    lost = 300
    alive = [i for i in range(n) if i != lost]
    lines = round_(0, 1000.0, list(range(n)))
    lines += [(names[lost], line("node_left", 1100.0, names[lost], reason="lost"))]
    lines += [(names[i], line("restart", 1100.5, names[i], reason="departure")) for i in alive]
    lines += round_(1, 1102.0, alive)
    tracemalloc.start()
    state = JobState(max_restarts=3, nnodes=(n - 1, n))
    parsers: dict[str, LineParser] = {}
    for node, text in lines:
        event = parsers.setdefault(node, LineParser(node)).feed(text)
        if event is not None:
            state.apply(event)
    held, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert state.world_size == (n - 1) * nproc and state.round == 1
    assert held < 64 * 2**20, f"the fold holds {held / 2**20:.0f} MB"
    html = ranks_html(state)
    assert len(html) < 20_000, len(html)
    assert f'data-node="{names[lost]}" data-status="left"' in html and "1,023 nodes" in html
    assert f"world size <b>{(n - 1) * nproc:,}</b> on 1,024 nodes" in html
    assert html.count('class="ne-node"') <= RANK_MAP_ROWS


def test_a_job_of_1024_nodes_sends_the_kernel_a_bounded_number_of_gpu_lines():
    """#40: every rank sampled its GPU every 5 s whatever the job's size: 8,192 ranks sent the
    kernel 1,638 lines a second, 8 % of a core to fold (the goal is 5 %). Up to 1,000 ranks each
    still samples every 5 s; past that the job as a whole sends at most ``JOB_LINES_PER_S``."""
    from notebook_elastic.runtime import gpu

    assert gpu.interval_s(1) == gpu.interval_s(1000) == gpu.SAMPLE_EVERY_S == 5.0
    for ranks in (1024 * 8, 4096 * 8):
        assert ranks / gpu.interval_s(ranks) <= gpu.JOB_LINES_PER_S <= 200


# -- a change of members in one write (together.open_next_round) ---------------------------------


def _ours(port: int, params: RendezvousParameters, rules: rounds.RoundRules):
    return rounds.handler_over(_client(port), params, rules, rounds.RendezvousHooks(), store_link.StoreLink())


def _in_threads(calls: list) -> list:
    """Each call in a thread of its own, all at once: what each returned."""
    out: list = [None] * len(calls)
    errors: list = []

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as exc:  # told by the assertion below
            errors.append((i, exc))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert all(o is not None for o in out), "a node never finished regrouping"
    return out


def _regroup(port: int, won: dict, run_id: str, rules: rounds.RoundRules, n: int, plain: int) -> dict:
    """A round of ``n`` nodes (``plain`` of them torch's own handler), range n-1:n; then a node of
    ours leaves and the others regroup; then a node of ours joins and all regroup. The writes of
    the state that changed its round each change took, and who is in each round with which rank."""
    extra = {"keep_alive_interval": 5, "keep_alive_max_attempt": 6} if KEEP_ALIVE_SET else {}
    params = RendezvousParameters(
        backend=rounds.RDZV_BACKEND,
        endpoint=f"127.0.0.1:{port}",
        run_id=run_id,
        min_nodes=n - 1,
        max_nodes=n,
        join_timeout=120,
        last_call_timeout=1,
        **extra,
    )
    handlers = [
        dr.create_handler(c, C10dRendezvousBackend(c, run_id), params) if i < plain else _ours(port, params, rules)
        for i, c in ((i, _client(port)) for i in range(n))
    ]
    key = f"/torch.rendezvous.{run_id}".encode()
    out: dict = {}
    try:
        first = _in_threads([h.next_rendezvous for h in handlers])
        assert sorted(info.rank for info in first) == list(range(n))
        # A node of ours leaves; the others see it (as the departure watch does) and regroup.
        key += MEMBERS  # the writes that changed the round (not heartbeats that fell in the while)
        before = won.get(key, 0)
        leaver = handlers.pop()
        formed = torch_adapter.round_state(leaver.torch_handler)
        assert rounds.leave_round(leaver.torch_handler, store_link.StoreLink())
        infos = _in_threads([_after_seeing(h, lambda h: torch_adapter.round_state(h) != formed) for h in handlers])
        out["leave"] = (won[key] - before, infos)
        # A node of ours joins: it waits in the list; the others see it waiting and regroup.
        before = won[key]
        joiner = _ours(port, params, rules)
        waiting = [_after_seeing(h, lambda h: h.num_nodes_waiting() > 0) for h in handlers]
        joined = _in_threads([joiner.next_rendezvous] + waiting)
        handlers.append(joiner)
        out["join"] = (won[key] - before, joined)
        return out
    finally:
        for h in handlers:
            torch_adapter.stop_heartbeats(torch_adapter.torch_handler(h))


def _after_seeing(handler, change):
    """The handler's next_rendezvous once it sees ``change(torch's handler)`` in the round, as
    an agent regroups once it sees it (torch's agent: a node waiting; ours: a member gone too)."""

    def regroup():
        deadline = time.monotonic() + 60
        while not change(torch_adapter.torch_handler(handler)):
            assert time.monotonic() < deadline, "the change was never seen"
            time.sleep(0.05)
        return handler.next_rendezvous()

    return regroup


def _ranks(infos: list) -> list[int]:
    return sorted(info.rank for info in infos)


def test_a_change_of_members_is_one_write_of_the_round_and_torchs_own_node_shares_it(served, rules, monkeypatch):
    """Twelve nodes, one of them torch's own handler: a node leaves and the eleven left regroup;
    a node joins and the twelve regroup. Each survivor left the round and joined the next
    through the state before (``test_a_change_of_members_is_a_write_per_node_torchs_way``);
    now the round's lowest ranked member writes the next round once all said they regroup: a few
    writes whatever the number of nodes (torch's own node leaves and joins as it does, and is in
    each round with its own rank)."""
    port, won = served
    assert rounds.join_and_beat_together(rules) and rounds.regroup_in_one_write(rules)
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as our agents run (agent/run.py)
    story = _regroup(port, won, "changes", rules, 12, plain=1)
    writes, infos = story["leave"]
    assert _ranks(infos) == list(range(11)) and {i.world_size for i in infos} == {11}
    assert writes <= 8, f"{writes} writes that changed the round for a node leaving 12"  # 5 or 6
    writes, infos = story["join"]
    assert _ranks(infos) == list(range(12)) and {i.world_size for i in infos} == {12}
    assert writes <= 8, f"{writes} writes that changed the round for a node joining 11"  # 4 to 6


def test_a_member_whose_copy_of_the_round_is_fresh_sees_a_leave_at_the_rounds_change_counter(served, rules):
    """#40: a member reads the round at most once a second (torch's cache); at 1,024 nodes that
    second made a leave's agreement 2.2 s. A node that takes itself out of a complete round adds
    to the round's change counter (``protocol.CHANGED``), and a member whose copy is fresher than
    the cache reads that counter, a few bytes, at most every ``together.CHANGE_LOOK_S``: where it
    moved, the member reads the round at once; where it did not, the cached copy stands."""
    port, _won = served
    assert rounds.join_and_beat_together(rules) and rounds.regroup_in_one_write(rules)
    joined = _round(port, "counter", 3, rules)
    try:
        (h0, _), (_h1, _), (h2, _) = joined
        round_, members = torch_adapter.round_state(h0)
        assert len(members) == 3
        assert torch_adapter.exit_round(h2, 30)  # node 2 leaves the complete round
        # torch's state key, as the supervisor names it (board.py), under which the member counted
        counter = protocol.signal_key(protocol.rendezvous_state_key("counter"), round_, protocol.CHANGED)
        assert _client(port).add(counter, 0) == 1
        holder = h0._state_holder

        def fresh_copy_sees(counted: int) -> frozenset:
            """node 0's members after a sync, its copy just read (by torch's cache) and its
            counter last seen at ``counted``, CHANGE_LOOK_S ago."""
            holder._last_sync_time = time.monotonic()
            holder._ne_changes = (round_, counted, time.monotonic() - together.CHANGE_LOOK_S)
            with h0._heartbeat_lock:
                holder.sync()
            return frozenset(holder.state.participants)

        assert fresh_copy_sees(1) == members  # the counter as seen: the cached copy stands
        assert fresh_copy_sees(0) == members - {h2._this_node}  # it moved: the round read now
    finally:
        _stop(joined)


def test_a_member_the_supervisor_saw_die_wakes_the_rounds_members_at_once(served, rules):
    """#41 item 8: the supervisor that reaped a dead agent names it in the store (GONE_KEY) and
    moves the change counter of the latest round an agent said it formed, so each member's change
    watch is answered at once: its monitor and departure watch look now, instead of at their
    next look (every 0.02 s once a worker's group broke, every 0.1 s or more before that)."""
    from types import SimpleNamespace

    from notebook_elastic.agent import change_watch
    from notebook_elastic.supervisor.board import Board

    port, _won = served
    assert rounds.join_and_beat_together(rules) and rounds.regroup_in_one_write(rules)
    joined = _round(port, "woken", 2, rules)
    woken = threading.Event()
    watch = change_watch.ChangeWatch(woken.set)
    try:
        (h0, _), (h1, _) = joined
        round_, members = torch_adapter.round_state(h0)
        assert len(members) == 2
        change_watch.next_mark(SimpleNamespace(torch_handler=h0), watch)
        assert watch.active, "the change watch is not armed on the round's counter"
        deadline = time.monotonic() + 30
        while not watch.watching(change_watch._next_mark(h0._state_holder, h0._state_holder._ne_sayings)):
            assert time.monotonic() < deadline, "the change watch never sent its WAIT"
            time.sleep(0.01)
        board = Board()
        board.store = _client(port)
        board.round_formed("woken", 0, round_ - 1)  # an older round's event, after the newer's: kept newest
        board.round_formed("woken", 0, round_)
        board.round_formed("woken", 0, round_ - 1)
        assert not woken.is_set()
        board.publish_gone(h1._this_node.pid)
        assert woken.wait(30), "the member's change watch was not answered when the supervisor named the dead agent"
        assert watch.woken == 1
    finally:
        _stop(joined)


def test_a_change_of_members_is_a_write_per_node_torchs_way(served, rules, monkeypatch):
    """The baseline of the test above: our nodes leaving and joining again through the state
    (together, without the one write of the next round)."""
    port, won = served
    assert rounds.join_and_beat_together(rules)
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as our agents run (agent/run.py)
    story = _regroup(port, won, "changes_torch", rules, 12, plain=1)
    for change, n in (("leave", 11), ("join", 12)):
        writes, infos = story[change]
        assert _ranks(infos) == list(range(n))
        assert writes >= 16, f"{writes} writes of the state for a change of 12 nodes, torch's way"


def test_a_change_of_128_simulated_agents_is_a_few_writes_of_the_round():
    """#40 item 3: 128 simulated agents against our store; a node leaves and the others regroup,
    then a node joins and all regroup. Each change is a few writes of the state whatever the
    number of nodes (the round's leader writes the next one; 556 writes, 287 of them lost to
    another's, for a node leaving 128 when each left and joined again through the state), and
    each round gives every agent its own rank. Not timed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    server = StoreServer(sock)
    thread = server.start()
    n = 128

    async def story() -> None:
        settings = sim.Settings(
            min_nodes=n - 1, max_nodes=n, together=True, regroup=True, watch=True, backoff_s=0.02, supervised=False
        )
        fleet = sim.Fleet("127.0.0.1", sock.getsockname()[1], settings)
        try:
            await fleet.add(n)
            await fleet.until(lambda: len(fleet.ranked_in(0)) == n, 300, "the first round")
            for change in ("leave", "join"):
                round_, writes = fleet.latest_round(), fleet.state_writes
                if change == "leave":
                    await fleet.agents[n // 2].leave()
                else:
                    await fleet.add(1)
                await fleet.until(
                    lambda r=round_: all(max(a.marks.ranked, default=-1) > r for a in fleet.live()), 300, change
                )
                live = fleet.live()
                latest = fleet.latest_round()
                assert sorted(a.marks.rank[latest] for a in live) == list(range(len(live))), change
                assert fleet.state_writes - writes <= 6, f"{fleet.state_writes - writes} writes of the state: {change}"
        finally:
            fleet.close()
            await asyncio.sleep(0.2)

    try:
        asyncio.run(story())
    finally:
        server.stop()
        thread.join(10)

"""Departures, as the agent sees them: the watch that ends this node's workers when a member
of their rendezvous round disappears (torchrun's agent notices new nodes, not departed ones),
and the test that tells a failure a departure caused (regrouped, not charged to
``--max-restarts``) from a worker's own."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

from ..contract import protocol
from ..contract.event_types import Kind, PeerLost
from ..plumbing import log as _logging
from ..runtime import term
from ..runtime._emit import emit
from . import torch_adapter
from .store_link import replacements

_log = _logging.get("agent.departures")


def node_name() -> str:
    return os.environ.get(protocol.ENV_NODE) or socket.gethostname()


#: How often the watch looks at the round: where rounds are polled faster than torch's second
#: (a local job: ``ENV_RDZV_POLL_S``), as often, at most ten times a second; on a cluster, where
#: a thousand agents share the store, twice a second.
WATCH_INTERVAL_S = 0.5
#: How long this node may stay left out of the round the others went on to (dropped while it was
#: stopped, and back) before its workers restart to join again (``left_out``): long enough for
#: its workers to see their group broken and regroup in place first, as they mostly do.
LEFT_OUT_GRACE_S = 5.0


def watch_interval_s() -> float:
    try:
        poll_s = float(os.environ.get(protocol.ENV_RDZV_POLL_S) or 0)
    except ValueError:
        poll_s = 0.0
    return min(WATCH_INTERVAL_S, max(0.1, poll_s)) if poll_s > 0 else WATCH_INTERVAL_S


def _marked_leaving(handler: Any, agent_pid: int) -> bool:
    """Whether the agent ``agent_pid`` said it leaves on purpose (agent/inplace.py) before it
    left the round."""
    from .deadline import call_with_deadline

    store = torch_adapter.rendezvous_store(handler)
    if store is None:
        return False
    try:
        return bool(call_with_deadline(store.check, 5.0, [protocol.leaving_key(agent_pid)]))
    except Exception:
        _log.debug("could not read whether the member left on purpose: taken as lost", exc_info=True)
        return False


class DepartureWatch:
    """Ends this node's workers when a member of their rendezvous round disappears."""

    def __init__(self, in_place: Any = None) -> None:
        # (local ranks) -> whether the workers stay in place (told to abort, the agent regroups)
        self.in_place: Any = in_place
        self.agent: Any = None  # torchrun's LocalElasticAgent, once it starts workers
        self.handler: Any = None  # torch's rendezvous handler, once a round was joined
        self.round: int | None = None  # the round being watched (None once acted on)
        self.members: frozenset[Any] = frozenset()
        self.latest: tuple[int | None, frozenset[Any]] = (None, frozenset())  # the latest round joined
        self.killed_round: int | None = None  # the round whose workers the watch ended
        self.replacements = 0  # stores found replaced when the last round was joined (store_link)
        self.left_out_since: float | None = None  # since when the others went on without this node
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self._look = threading.Event()  # look now, not at the next interval (look_now)
        self._stopped = False

    def joining(self) -> None:
        """This node joins a round now: nothing to watch until it has (``joined``)."""
        with self.lock:
            self.round, self.left_out_since = None, None

    def joined(self, handler: Any, round_: int | None, members: frozenset[Any]) -> None:
        replaced = replacements(handler)
        with self.lock:
            self.handler, self.round, self.members = handler, round_, members
            self.latest, self.replacements, self.left_out_since = (round_, members), replaced, None
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="notebook-elastic-departures", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        interval_s = watch_interval_s()  # now: a warm spare learns its environment after import
        while not self._stopped:
            self._look.wait(interval_s)
            self._look.clear()
            if self._stopped:
                return
            try:
                self._check()
            except Exception:
                # Its store call failed (a partition: the agent's calls end at their deadline; a
                # store being replaced): it looks again at the next interval. It stopped for good
                # here once, and a node cut off and back never saw itself left out (its worker
                # waited out gloo's 120 s in the old group: fresh-clone run 57's two-host test).
                # (A torch without the internals it reads answers None there, not an exception.)
                _log.debug("the round could not be read now: looking again", exc_info=True)

    def stop(self) -> None:
        """No more looks (its thread ends at its next wake)."""
        self._stopped = True
        self._look.set()

    def look_now(self) -> None:
        """Look at the round now (a worker of this node reached a step boundary its group agreed
        on: a member leaving on purpose voted for it), not at the next interval."""
        self._look.set()

    def _check(self) -> None:
        with self.lock:
            handler, round_, members, agent = self.handler, self.round, self.members, self.agent
        if handler is None or agent is None or round_ is None or not members:
            return
        if not torch_adapter.group_is_healthy(agent):
            return
        now = torch_adapter.round_state(handler)
        if now is None:
            return
        if replacements(handler) != self.replacements:
            # (After the read: the read itself may find the store replaced.) The store was
            # replaced since this round was joined: the new one is seeded with a round listing
            # nobody (store_link), which is no member gone and no node left out; the agent
            # regroups its workers on it its own way (``_StoreReplaced``) and joins the watch
            # again. Looking there once ended the workers and charged a restart (fresh-clone
            # run 58, torch 2.15).
            with self.lock:
                self.left_out_since = None
            return
        # (A node alone in its round too: dropped while stopped, as a joiner went on without it.)
        if now[0] != round_ or torch_adapter.left_out(handler) is not None:
            # The round went on, or dropped this node itself (its heartbeat expired while it was
            # stopped or starved): not a member gone to abort for. Its workers see their group
            # broken when the others regroup, or it restarts them (``left_out``); an abort from
            # here may not reach a collective whose connections gloo closed (120 s).
            self._seen_left_out(handler, round_)
            return
        gone = [n for n in members if n not in now[1]]
        if not gone or len(members) < 2:
            return
        with self.lock:
            if self.round != round_:
                return
            self.round = None  # act once per round
        if self.in_place is not None:
            graceful = all(_marked_leaving(handler, node.pid) for node in gone)
            if self.in_place(sorted(torch_adapter.worker_pids_by_local_rank(agent)), round_, graceful):
                return  # they stay: the agent regroups them in place at its next look
        with self.lock:
            self.killed_round = round_
        pids = torch_adapter.worker_pids(agent)
        emit(
            Kind.PEER_LOST,
            node=node_name(),
            **PeerLost(round=round_, lost=[{"addr": n.addr, "pid": n.pid} for n in gone], workers=pids),
        )
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _seen_left_out(self, handler: Any, round_: int) -> None:
        """The store's round is past ``round_``: note since when this node is in none of its lists
        (dropped when its heartbeat expired while it was stopped, and the others went on); not for
        a node told to stop. (``_check`` looks at no store that replaced the round's.)"""
        out = not term.told_to_stop() and torch_adapter.left_out(handler) is not None
        with self.lock:
            if self.round != round_:
                return
            if not out:
                self.left_out_since = None
            elif self.left_out_since is None:
                self.left_out_since = time.monotonic()

    def left_out(self, grace_s: float = LEFT_OUT_GRACE_S) -> bool:
        """Whether this node's workers restart now to join again: the others went on without
        this node ``grace_s`` ago and its workers have not regrouped since (those whose peers'
        sockets closed see their group broken and regroup in place; one whose peers' sockets
        stayed open waits in the old group's collective for good: an adversary's pass, 1 run of
        6, the job at 3 nodes of 4 until stopped). An abort may not reach that collective (gloo
        may have closed the group's connections, and it waits out its timeout, 120 s: 3 runs of
        19), so the agent restarts them, uncharged, from its monitor (one path: no kill racing
        a failure of their own); they take the live values from the others, which keep theirs.
        Once per round."""
        with self.lock:
            since = self.left_out_since
            if since is None or time.monotonic() - since < grace_s:
                return False
            self.round, self.left_out_since = None, None
        return True

    def round_lost_a_member(self, grace_s: float) -> bool:
        """Whether a member of the round these workers were formed in is gone (left, or its
        heartbeat expired), waiting up to ``grace_s`` for a dead peer's heartbeat to expire."""
        handler = self.handler
        round_, members = self.latest
        if handler is None or round_ is None or not members:
            return False
        if len(members) < 2:
            # Alone in the round: no peer could have left, but the round may have gone on
            # without this node (dropped while stopped, as a joiner trained on: its worker is
            # fenced by the joiner's generation), which restarts it uncharged.
            now = torch_adapter.round_state(handler)
            return now is not None and now[0] != round_ and torch_adapter.left_out(handler) is not None
        deadline = time.monotonic() + grace_s
        while True:
            now = torch_adapter.round_state(handler)
            if now is None:
                return False  # this torch does not say: charged, as torchrun would
            if now[0] != round_ or any(m not in now[1] for m in members):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def left_on_purpose(self) -> bool:
        """Whether every member gone from the round these workers were formed in said it leaves
        on purpose (agent/inplace.py leave): a scale down or a notice, even where its workers could
        not leave at a step boundary and the others' group broke (then the step in flight is
        redone, and the change is told as the departure it was, not as a loss)."""
        handler = self.handler
        round_, members = self.latest
        if handler is None or round_ is None or len(members) < 2:
            return False
        now = torch_adapter.round_state(handler)
        gone = [] if now is None else [n for n in members if n not in now[1]]
        return bool(gone) and all(_marked_leaving(handler, node.pid) for node in gone)

    def failed_because_a_peer_left(self, result: Any) -> list[Any]:
        """The failures, if they are a departure's doing: one of them at least is a departure's
        symptom (a worker that says its collective broke because a peer left, or that the watch
        ended) and the round has really lost a member. A sibling that failed some other way in
        the same moment (gloo words it differently under load) goes with it; a bug of the user's
        comes back in the next round and is charged there."""
        failures = list(getattr(result, "failures", {}).values())
        watch_ended_them = self.killed_round is not None and self.killed_round == self.latest[0]
        symptoms = [
            f
            for f in failures
            if f.exitcode == protocol.EXIT_PEER_LOST or (watch_ended_them and f.exitcode == -signal.SIGKILL)
        ]
        if not symptoms:
            return []  # a worker's own failure: charged, as torchrun does
        # A leaving peer takes itself out of the round once its own workers are stopped, which on
        # a loaded machine can take a while; a dead one is dropped when its heartbeat expires.
        window_s = torch_adapter.keep_alive_window_s(self.handler)
        grace_s = 2.0 + 2 * (window_s or 0.0)
        return failures if self.round_lost_a_member(grace_s) else []

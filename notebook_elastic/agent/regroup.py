"""A change of a round's members in one write of it (#40 item 3): our executor's exit from a
round when it regroups (``exit_op``) and its join's waits (``join_op``), the collaborator of
``rounds.py``'s executor (``NotebookExecutor``, whose sayings, reads and state these use) that
``regroup_in_one_write`` turns on (a round rule, kept in ``rounds.RoundRules``); the rules themselves are ``together.py``'s
(``open_next_round``, ``leader``, ``regrouping``; the round's keys, ``signal_key``, are the contract's).

A member that sees its round change says it regroups and waits; the round's lowest ranked member
writes the next round once every member said so; a node waiting for a round of ours waits on
that round's key, which the store answers when a write of ours opened or completed it, instead
of looking at the state again a second later.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..contract import protocol
from . import store_link, together
from .deadline import StoreSilent, call_with_deadline
from .torch_adapter import missing, node_of, operation_keep_alive_s, operation_store, rendezvous_actions, reread

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore


def regroup_in_one_write(rules: Any) -> bool:
    """Our handler's nodes change a round's members in one write of the state
    (``together.open_next_round``): a member that sees a change says it regroups, the round's
    lowest ranked member writes the next round once every member said so, and the others wait on
    a key the store answers when that round is written, instead of each leaving the round and
    joining the next through the state (2N writes of the whole round, one after another). Set in
    ``rules``; needs ``join_and_beat_together`` (the sayings). Idempotent; False where torch
    lacks what it takes (each node then leaves and joins again, as torch's do)."""
    needed = {
        "dynamic_rendezvous._RendezvousExitOp",
        "dynamic_rendezvous._BackendRendezvousStateHolder._last_sync_time",
        "dynamic_rendezvous._DistributedRendezvousOpExecutor._remove_from_participants",
        "dynamic_rendezvous._DistributedRendezvousOpExecutor",
    }
    if not rules.together or missing().keys() & needed:
        return False
    rules.regroup = True
    return True


#: A node waiting for a round of ours to be written waits on its key at most this long (and at
#: most a heartbeat interval) at a time, then reads the state again (a writer that died, a round
#: written by torch's own agent). Normally the key comes first. One that times out is logged by
#: torch's client (two warnings).
SIGNAL_WAIT_S = 1.0
#: A member of a round that is not the one to complete it at its deadline waits this much longer
#: for the one that does before it completes it itself (one write, not one per member; on a
#: loaded machine a shorter grace let hundreds of simulated members complete it each).
COMPLETE_GRACE_S = 1.0
#: The round's leader, waiting for every member to say it regroups, looks again after 20 ms,
#: doubling up to this: each look reads the round and two keys of sayings (about 200 kB at 1,024
#: nodes), where a longer pause (0.25 s) added up to 0.4 s to a 1,024-node leave's agreement.
LEADER_LOOK_MAX_S = 0.1


def exit_op(self: Any, op: Any) -> Callable[[Any, float], Any]:
    """torch's exit from a round before joining the next, when this node regroups: where
    it sees the round's members changed, it says it regroups and waits for the next
    round (``together.open_next_round``), written by the round's lowest ranked member
    (this one, perhaps) once every member said so; elsewhere torch's exit (it leaves the
    round: the others see that and regroup)."""
    pause = [0.0]

    def regrouping(ctx: Any, deadline: float) -> Any:
        while True:
            state, joined = ctx.state, self._ne_joined
            if joined is None or ctx.node not in state.participants:
                return op(ctx, deadline)
            if state.round > joined[0]:
                return _action().FINISH  # the next round, written with this node in
            if state.round != joined[0] or not state.complete or not together.changed(state, joined[1]):
                return op(ctx, deadline)
            if time.monotonic() > deadline:
                return op(ctx, deadline)  # torch's: out of time
            now = time.time()
            if not self._ne_say(together.REGROUP, state.round, now):
                return op(ctx, deadline)  # it cannot say so: it leaves, as torch's do
            if together.beats_together(ctx.settings):
                self._ne_say(together.ALIVE, -1, now)
            elif together.beat_older(state, ctx.node, ctx.settings.keep_alive_interval, now):
                return _action().KEEP_ALIVE  # each writes its own heartbeat here (a local job)
            if together.leader(state) == ctx.node:
                said = self._ne_read()
                if together.regrouping(state, said, ctx.node):
                    together.take_alive(state, said, node_of)
                    self._ne_opening = True
                    return _action().REMOVE_FROM_PARTICIPANTS  # _remove_from_participants opens it
                pause[0] = min(max(2 * pause[0], 0.02), LEADER_LOOK_MAX_S)
                time.sleep(pause[0])
            else:
                key = protocol.signal_key(self._ne_sayings().state_key, state.round + 1, protocol.OPENED)
                _wait(self, key, _wait_s(self))
            ctx = _reread(self)

    return regrouping


def join_op(self: Any, op: Any) -> Callable[[Any, float], Any]:
    """torch's join, which looks again a second later where it waits: it waits instead
    for the key of what it waits for (the next round opened, its own round completed),
    answered by the store once a write of ours made it so."""

    def waiting(ctx: Any, deadline: float) -> Any:
        action = op(ctx, deadline)
        completing = (_action().SYNC, _action().MARK_RENDEZVOUS_COMPLETE)
        for _ in range(8):  # then torch's own look a second later, whatever it waits for
            state, node = ctx.state, ctx.node
            key_of = functools.partial(protocol.signal_key, self._ne_sayings().state_key)
            if action == _action().SYNC and state.complete and node in state.wait_list:
                _wait(self, key_of(state.round + 1, protocol.OPENED), _wait_s(self))
            elif (
                action in completing
                and not state.complete
                and node in state.participants
                and state.deadline is not None
            ):
                # The first member completes the round at its deadline; the others
                # wait a little longer for that (one write, not one each); a node that
                # fills it first completes it sooner.
                left = together.seconds_to(state.deadline, time.time())
                grace = 0.0 if together.first_member(state) == node else COMPLETE_GRACE_S
                if left + grace <= 0 or (action != _action().SYNC and left > 0):
                    return action  # its turn (or the job's target reached: torch's)
                key = key_of(state.round, protocol.COMPLETE)
                _wait(self, key, max(0.01, min(left + grace, _wait_s(self))))
            else:
                return action  # it waits for nodes to join: torch's own look
            ctx = _reread(self)
            action = op(ctx, deadline)
        return action

    return waiting


def _wait_s(self: Any) -> float:
    return min(SIGNAL_WAIT_S, operation_keep_alive_s(self))


def _wait(self: Any, key: str, bound_s: float) -> bool:
    """Wait for ``key`` at most ``bound_s``: whether it came."""
    return wait_for_key(operation_store(self), key, bound_s)


def wait_for_key(store: KeyStore | None, key: str, bound_s: float) -> bool:
    """Wait for ``key`` in ``store`` at most ``bound_s``: whether it came. A store that does not
    answer, or went, is a key that did not come: the next read of the state says why.

    torch's client waits in C++, and at its timeout it asks the server to cancel the wait and
    waits for that reply without any bound: a store frozen then (its process stopped, its node
    cut off) held this thread there for good, and a signal with it. So the wait is a call under
    a deadline (``call_with_deadline``: its bound and a store call's), on a caller thread the
    interpreter's end waits for: one still in C++ when the interpreter ended aborted the agent
    (SIGABRT), as a regroup's wait in the rendezvous probe's thread did when the job ended."""
    from datetime import timedelta

    if store is None:  # this torch does not say where its round's store is
        return False
    try:
        call_with_deadline(store.wait, bound_s + store_link.STORE_CALL_TIMEOUT_S, [key], timedelta(seconds=bound_s))
        return True
    except (RuntimeError, StoreSilent):  # its timeout (DistStoreError), a store lost or silent
        # Not Exception: a signal's handler raises where the wait is waited for (torch's agent:
        # SignalException, a node sent away), and that must reach the agent.
        return False


def _reread(self: Any) -> Any:
    """The state as the store has it now, for the operation's next decision."""
    return reread(self)


def _action() -> Any:
    return rendezvous_actions()

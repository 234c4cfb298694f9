"""Our rendezvous: torch's c10d rounds, held by a handler of ours (``NotebookRendezvous``,
torch's public ``RendezvousHandler`` interface, registered in torch's public handler registry),
on our subclasses of torch's state holder and operation executor (``handler_over``), with the
rules a notebook job's rounds follow (each off until the agent turns it on at start).

torch closes a round between min and max nodes last_call_timeout after it reached min, and a
node waiting in a round looks again once a second (1.5 s of a 3.6 s scale-up from 1 to 2 of
1:3). The local supervisor keeps its target in the store: a round that holds that many closes
at once, and nodes in a round look again every ``poll_s``; a cluster's store has no target.

A node the supervisor saw die (``GONE_KEY``) is dropped at once (``drop_gone_nodes``); nodes
join, leave and beat together (``together.py``); a stopped node leaves its round instead of
closing it (``leave_instead_of_closing``); torch's private names: ``torch_adapter.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..contract import protocol
from ..plumbing import log as _logging
from . import change_watch, gone, regroup, store_link, together
from .deadline import call_with_deadline
from .regroup import regroup_in_one_write as regroup_in_one_write
from .torch_adapter import (
    exit_round,
    handler_parts,
    holder_store,
    missing,
    node_of,
    rdzv_events_heard,
    recording_only_when_heard,
    rendezvous_actions,
    rendezvous_bases,
    rendezvous_op_kind,
    replace_handler_parts,
    wrap_rendezvous_wait,
)

if TYPE_CHECKING:
    from torch.distributed import Store

    from ..plumbing.store_client import KeyStore

_log = _logging.get("agent.rounds")


def leave_round(handler: Any, link: store_link.StoreLink, timeout_s: float = 5.0) -> bool:
    """Take this node out of its round now (False: this torch cannot, peers wait for its
    heartbeat to expire); ``link`` (this agent's) marks it leaving first."""
    link.mark_leaving()  # a store lost now is not waited for
    return exit_round(handler, timeout_s)


def leave_instead_of_closing(
    hooks: RendezvousHooks, always: bool = True, told_to_stop: Callable[[], bool] | None = None
) -> bool:
    """``shutdown()`` closes the rendezvous for every node: the whole job ends. Our handler
    (``NotebookRendezvous``) takes this node out of its round instead
    - when the agent was stopped by a signal: torch 2.4's agent shuts its rendezvous down on
      SIGTERM (``LocalElasticAgent._shutdown``; later releases do not), so a preempted or
      scaled-down node closed the round under the survivors and the job failed. A signal is
      known by the ``SignalException`` under way, or by ``told_to_stop()`` (the agent's word,
      whatever its run then ended with: torchrun closes the round after any end but a signal's);
    - always, with ``always``: a joiner that spends its budget failing to join must not end the job.
    Set in ``hooks`` (the agent's). Idempotent (``always`` once set stays)."""
    hooks.leave_always = hooks.leave_always or always
    if told_to_stop is not None:
        hooks.told_to_stop = told_to_stop
    return True


class RoundRules:
    """How our handler's rounds differ from torch's (each default: as torch's): one per agent
    process, set at its start (``agent/run.py``), read by each handler's parts (``handler_over``)."""

    def __init__(self) -> None:
        self.close_at_target = False  # a round holding TARGET_KEY's nodes closes at once
        self.poll_s: float | None = None  # a waiting node looks again this often (torch: 1 s)
        self.drop_gone = False  # nodes named in GONE_KEY are dropped at once
        self.together = False  # nodes join, leave and beat together (together.py); lost writes back off
        self.regroup = False  # a change of members in one write (together.open_next_round)
        self.joined_once = False  # it was in a round: torch's first-join jitter is not waited again
        self.spread_first_join = True  # False: a node that joins a job that trains waits no jitter


def close_rounds_at_target(rules: RoundRules, poll_s: float | None = None) -> bool:
    """Our handler closes a round once it holds the job's target (``TARGET_KEY``), not
    ``last_call_timeout`` later; with ``poll_s``, a node waiting in a round looks again, and
    reads a state at most that old (the agent's check for joiners too), that often, not every
    second. Before the handler is made; set in ``rules``, which torch's wait between looks
    reads (one per agent process). Idempotent; False where torch lacks the internals."""
    needed = {"dynamic_rendezvous._RendezvousJoinOp", "dynamic_rendezvous._DistributedRendezvousOpExecutor"}
    polling = {"dynamic_rendezvous._delay", "dynamic_rendezvous._BackendRendezvousStateHolder._cache_duration"}
    if missing().keys() & (needed | (polling if poll_s else set())):
        return False
    rules.close_at_target = True
    rules.poll_s = poll_s or rules.poll_s
    if poll_s:

        def wrap(delay: Callable[[Any], Any]) -> Callable[[Any], Any]:
            def _delay(seconds: Any) -> Any:
                if isinstance(seconds, tuple) and (rules.joined_once or not rules.spread_first_join):
                    # torch spreads a job's first joins over up to 0.3 s (its only call with a range);
                    # a node regrouping from round 0 (0.15 s of every job's first change) or joining a
                    # job that trains (alone in its join: 0.15 s of a scale-up) is no first join.
                    return None
                wait = rules.poll_s if seconds == 1 and rules.poll_s else seconds
                return delay(wait)

            return _delay

        wrap_rendezvous_wait(wrap, rules)
    return True


def _closing_at_target(join: Any, store: KeyStore | None) -> Callable[[Any, float], Any]:
    """torch's join operation, closing the round when it holds the job's target (read in
    ``store``: the one the operation's executor syncs with)."""
    actions = rendezvous_actions()

    def join_op(ctx: Any, deadline: float) -> Any:
        action = join(ctx, deadline)
        if action in (actions.SYNC, actions.KEEP_ALIVE):
            state, settings = ctx.state, ctx.settings
            held = len(state.participants)
            if (
                not state.complete
                and ctx.node in state.participants
                and settings.min_nodes <= held <= settings.max_nodes
                and store_link.holds_target(held, store_link.target_nodes(store))  # last: a store read
            ):
                return actions.MARK_RENDEZVOUS_COMPLETE
        return action

    return join_op


def drop_gone_nodes(rules: RoundRules) -> bool:
    """Our handler drops a node whose agent died from the rendezvous as soon as the supervisor
    saw it die (``GONE_KEY``), not when its heartbeat expires (keep_alive_interval x
    max_attempt later): a lost node's peers regroup at once. Set in ``rules``. Idempotent; False
    where torch lacks it."""
    if "dynamic_rendezvous._BackendRendezvousStateHolder._sanitize" in missing():
        return False
    rules.drop_gone = True
    return True


class RendezvousHooks:
    """What ``NotebookRendezvous`` calls around torch's rendezvous, set by the agent at start:
    one per agent process (``agent/run.py`` makes it), held by each handler made over it
    (``handler_over``)."""

    def __init__(self) -> None:
        self.before: Callable[[Any], None] | None = None  # (torch's handler) before joining a round
        self.after: Callable[[Any, Any], None] | None = None  # (torch's handler, its info) after
        self.leave_always = False  # every shutdown leaves the round (a joiner), not only a signalled one
        # Whether this agent was told to stop by a signal, however its run then ended (a
        # SignalException that a store call's ``except`` took for a lost connection): it leaves.
        self.told_to_stop: Callable[[], bool] = lambda: False
        # The round's store, as the agent gets it, answers under the deadline: set with the agent's
        # regroup on a lost store (hook_store_reconnect), which that deadline's error starts.
        self.bounded_store = False


#: The name our handler is registered under in torch's public registry
#: (``rendezvous_handler_registry``). It is torch's c10d rendezvous (the same store, state and
#: rounds: plain torchrun agents may join it), held by a handler of ours: ``agent/run.py`` runs a
#: job's ``--rdzv-backend c10d`` through it.
RDZV_BACKEND = "notebook-elastic-c10d"


def register_rendezvous(rules: RoundRules, hooks: RendezvousHooks, link: store_link.StoreLink) -> str:
    """Register our handler in torch's public handler registry, its handlers made over this
    agent's ``rules``, ``hooks`` and ``link``; its name. Idempotent for the same objects: torch's registry refuses a
    second, different maker under the name (one set per agent process)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(RDZV_BACKEND, _RendezvousMaker(rules, hooks, link))
    return RDZV_BACKEND


@dataclasses.dataclass(frozen=True)
class _RendezvousMaker:
    """What torch's registry calls to make our handler: the agent's objects, closed over at
    registration (torch calls it with the parameters alone). Equal when made over the same
    objects, so registering them again is no second registration for torch."""

    rules: RoundRules
    hooks: RendezvousHooks
    link: store_link.StoreLink

    def __call__(self, params: Any) -> Any:
        """As torch's registry makes its c10d handler (``_create_c10d_handler``: the store from
        ``create_backend``), with our backend and round parts, held by our handler."""
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

        _torch_backend, store = create_backend(params)
        return handler_over(store, params, self.rules, self.hooks, self.link)


def handler_over(
    store: Store, params: Any, rules: RoundRules, hooks: RendezvousHooks, link: store_link.StoreLink
) -> Any:
    """Our handler (``NotebookRendezvous``) over torch's c10d rendezvous of ``params.run_id`` on
    ``store``: torch's handler made by torch's ``create_handler`` (its timeouts and heartbeats
    from ``params``), on our backend (``rendezvous_backend``), with our state holder and
    operation executor in place of torch's (``_holder_class``, ``_executor_class``), whose
    rounds follow ``rules``; ``hooks`` called around each round; a lost store answered as this
    agent's ``link`` says."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    backend = store_link.rendezvous_backend(store, params.run_id, link)
    torch_handler = create_handler(store, backend, params)
    # torch's handler takes its state holder as made by from_backend, and makes its executor
    # from it: both are replaced before its first round, by instances of our subclasses.
    try:
        settings, node = handler_parts(torch_handler)
        holder = _holder_class()(backend, settings, rules=rules)
        executor = _executor_class()(node, holder, settings, rules=rules)
    except (AttributeError, TypeError):  # another torch: its own parts (missing() and the probe say what is lost)
        _log.debug("torch's rendezvous parts are kept", exc_info=True)
    else:
        replace_handler_parts(torch_handler, holder, executor)
    vars(torch_handler)["_get_store"] = functools.partial(
        _store_of_round, torch_handler, hooks, link
    )  # this instance's
    record = getattr(torch_handler, "_record", None)
    if record is not None:
        vars(torch_handler)["_record"] = recording_only_when_heard(record)  # this instance's
    return _rendezvous_class()(torch_handler, hooks, link)


def join_and_beat_together(rules: RoundRules) -> bool:
    """Our handler's nodes join, leave and beat together (``together.py``): each says what it
    does in a small key beside the state, and a write of the state takes in what the others
    said; a write that lost to another's backs off a little and reads the state again before
    the next. Set in ``rules``. Idempotent; False where torch lacks what it takes (each node then
    writes its own, as torch's do)."""
    needed = {
        "dynamic_rendezvous._BackendRendezvousStateHolder._last_sync_time",
        "dynamic_rendezvous._DistributedRendezvousOpExecutor._add_to_participants",
        "dynamic_rendezvous._DistributedRendezvousOpExecutor._remove_from_participants",
        "dynamic_rendezvous._DistributedRendezvousOpExecutor._keep_alive",
        "dynamic_rendezvous._DistributedRendezvousOpExecutor",
    }
    if missing().keys() & needed:
        return False
    rules.together = True
    return True


#: A write that lost waits a random pause below this, doubling with each loss in a row up to
#: BACKOFF_MAX_S, then reads the state again: the nodes that lost do not all try again at once
#: on the same state (1,024 simulated nodes that did never closed a round).
BACKOFF_S = 0.02


BACKOFF_MAX_S = 0.5


# Our subclasses of torch's classes, each made once, at its first use (torch imported by then): a
# cache, not a registry, for the classes hold nothing; each instance holds the rules or hooks
# it was made with.
@functools.cache
def _holder_class() -> type:
    import random

    class NotebookStateHolder(rendezvous_bases()[0]):  # type: ignore[misc]  # torch's class, known at run time
        """torch's view of the round in the store, read at most ``poll_s`` old, and without the
        nodes the supervisor saw die (``drop_gone_nodes``); with ``join_and_beat_together``, a
        lost write backs off and reads again, and a won one deletes the sayings no longer read."""

        _last_sync_time: float  # torch's, set in its __init__: -1 makes its next sync read the store

        def __init__(self, backend: Any, settings: Any, cache_duration: int = 1, *, rules: RoundRules) -> None:
            super().__init__(backend, settings, cache_duration)
            self._ne_rules = rules
            if rules.poll_s:
                # Seconds, compared with a float: torch annotates its 1 s default as an int.
                self.__dict__["_cache_duration"] = min(self._cache_duration, rules.poll_s)
            self._ne_lost = 0  # writes lost in a row
            interval_s = settings.keep_alive_interval.total_seconds()
            state_key = getattr(backend, "_key", None)  # a backend of another kind: no sayings
            self._ne_sayings = together.Sayings(state_key, None, interval_s, _call_with_deadline) if state_key else None
            self._ne_seen = (-1, False, 0, 0)  # together.membership of the state last read or written
            self._ne_changes = (-1, 0, 0.0)  # (round, its CHANGED counter as last read, when read)
            self._ne_watch: Any = None  # the agent's change_watch: it stands in for the looks

        def sync(self) -> Any:
            seen, store = self._ne_seen, holder_store(self)
            if (
                self._ne_rules.regroup
                and self._ne_sayings is not None
                and store is not None
                and not change_watch.watches(self)
            ):
                self._ne_look_for_change(self._ne_sayings, store)
            has_set = super().sync()
            state = self._state
            self._ne_seen = together.membership(state)
            if not self._ne_rules.together or self._ne_sayings is None or has_set is None:
                return has_set
            if has_set:
                self._ne_lost = 0
                if self._ne_rules.regroup:
                    self._ne_signal(seen, state)
                try:
                    self._ne_sayings.won(holder_store(self))
                except Exception:
                    _log.debug("an old key of sayings stays: a later write deletes it", exc_info=True)
                return has_set
            self._ne_lost += 1
            time.sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_S * 2 ** min(self._ne_lost, 10))))
            self._last_sync_time = -1  # the state as it is after the pause, for the next decision
            super().sync()
            self._ne_seen = together.membership(self._state)
            return has_set

        def _ne_look_for_change(self, sayings: Any, store: KeyStore, now_anyway: bool = False) -> bool:
            """A look at a complete round's change counter when due (``look_due``) or ``now_anyway``:
            where it moved (returned), the next sync reads the round, not up to 1 s later."""
            round_, complete = self._ne_seen[:2]
            now = time.monotonic()
            fresh = complete and now - self._last_sync_time < self._cache_duration  # else read anyway
            if not complete or not (now_anyway or (fresh and together.look_due(self._ne_changes, round_, now))):
                return False  # (a round forming: its own keys tell)
            key = protocol.signal_key(sayings.state_key, round_, protocol.CHANGED)
            try:
                count = int(_call_with_deadline(store.add, key, 0))
            except Exception:
                _log.debug("the round's change counter not read: the round is read at torch's pace", exc_info=True)
                return False
            self._ne_changes, moved = together.looked_at(self._ne_changes, round_, count, now)
            if moved:
                self._last_sync_time = -1  # torch's: its next sync reads the store
            return moved

        def look_now(self) -> bool:
            """One look at the round's change counter now (``_ne_look_for_change``)."""
            store, sayings = holder_store(self), self._ne_sayings
            if not self._ne_rules.regroup or sayings is None or store is None:
                return False
            return self._ne_look_for_change(sayings, store, now_anyway=True)

        def _ne_signal(self, seen: tuple[int, bool, int, int], state: Any) -> None:
            """This write opened or completed a round: its key (``regroup_in_one_write``); or it
            changed a complete round's members (``changed_since``): its counter and its mark."""
            if seen[0] < 0 or self._ne_sayings is None:
                return
            store: Any = holder_store(self)
            key = functools.partial(protocol.signal_key, self._ne_sayings.state_key, state.round)
            changed = together.changed_since(seen, state)
            calls: list[tuple[Any, str, Any]] = [(store.add, key(protocol.CHANGED), 1)] if changed else []
            if state.round > seen[0]:
                calls.append((store.set, key(protocol.OPENED), "1"))
            if state.complete and (state.round > seen[0] or not seen[1]):
                calls.append((store.set, key(protocol.COMPLETE), "1"))
            for call, name, value in calls:
                try:
                    count = _call_with_deadline(call, name, value)
                    if name == key(protocol.CHANGED):  # and the key change watches wait on (mark_key)
                        _call_with_deadline(store.set, protocol.mark_key(name, int(count)), "1")
                except Exception:
                    _log.debug("a round's key not set: who waits for it reads the state in a second", exc_info=True)

        def _sanitize(self) -> Any:
            if self._ne_rules.drop_gone:
                gone.mark_expired(self)
            return super()._sanitize()

        def _record(self, *args: Any, **kwargs: Any) -> Any:
            return super()._record(*args, **kwargs) if rdzv_events_heard() else None

    return NotebookStateHolder


def _call_with_deadline(fn: Callable[..., Any], *args: Any) -> Any:
    return call_with_deadline(fn, store_link.STORE_CALL_TIMEOUT_S, *args)


@functools.cache
def _executor_class() -> type:
    actions = rendezvous_actions()

    class NotebookExecutor(rendezvous_bases()[1]):  # type: ignore[misc]  # torch's class, known at run time
        """torch's executor of rendezvous operations; its join closes at the job's target;
        with ``join_and_beat_together`` its joins, leaves and heartbeats go together."""

        def __init__(self, node: Any, state_holder: Any, settings: Any, *, rules: RoundRules) -> None:
            super().__init__(node, state_holder, settings)
            self._ne_rules = rules
            self._ne_taking = False  # inside a join or a leave that takes the others' in
            self._ne_regrouping = False  # inside our handler's next_rendezvous (not a node leaving)
            self._ne_opening = False  # its next removal writes the next round instead
            self._ne_joined: tuple[int, frozenset[Any]] | None = None  # the round it last joined, its members
            self._ne_duty: int | None = None  # the interval it last wrote in on duty (together.duty_write)
            self._state: Any = None  # torch's: the state of its current operation (set by torch's run, regroup.py)

        def _record(self, *args: Any, **kwargs: Any) -> Any:
            # torch names the event through inspect.stack() before it looks whether anyone hears.
            return super()._record(*args, **kwargs) if rdzv_events_heard() else None

        def run(self, state_handler: Any, deadline: float, update_deadline: Any = None) -> Any:
            kind = rendezvous_op_kind(state_handler)
            joining, exiting = kind == "join", kind == "exit"
            if self._ne_rules.close_at_target and joining:
                # The store the operation syncs with: the one a round's target is read from.
                state_handler = _closing_at_target(state_handler, holder_store(self._state_holder))
            if self._ne_sayings() is not None and together.beats_together(self._settings):
                state_handler = self._beating_together(state_handler, joining, kind == "keep_alive")
            if self._ne_sayings() is not None and self._ne_rules.regroup:
                if self._ne_regrouping and exiting:
                    state_handler = regroup.exit_op(self, state_handler)
                elif joining:
                    state_handler = regroup.join_op(self, state_handler)
            ran = super().run(state_handler, deadline, update_deadline)
            if joining:
                self._ne_rules.joined_once = True  # a round joined: the next join is a regroup
                state = self._state_holder.state
                self._ne_joined = (state.round, frozenset(state.participants))
            return ran

        def _beating_together(self, op: Any, joining: bool, beating: bool) -> Callable[[Any, float], Any]:
            """torch wants this node's heartbeat written (or it is on duty): it says it lives (once an
            interval); writes if what it said was not taken in, or on duty; else looks again or ends."""

            def beat(ctx: Any, deadline: float) -> Any:
                action, now = op(ctx, deadline), time.time()
                if beating and action == actions.FINISH:
                    action = self._ne_on_duty(ctx, now, action)
                if action != actions.KEEP_ALIVE:
                    return action
                if not self._ne_say(together.ALIVE, -1, now):
                    return action
                if together.beat_due(ctx.state, ctx.node, ctx.settings.keep_alive_interval, now):
                    return action
                return actions.SYNC if joining else actions.FINISH

            return beat

        def _ne_on_duty(self, ctx: Any, now: float, action: Any) -> Any:
            duty = together.duty_write(ctx.state, ctx.node, ctx.settings.keep_alive_interval, now, self._ne_duty)
            self._ne_duty = self._ne_duty if duty is None else duty
            return action if duty is None else actions.KEEP_ALIVE

        def _ne_say(self, kind: str, round_: int, now: float) -> bool:
            sayings = self._ne_sayings()
            sayings.node = self._node
            try:
                sayings.say(holder_store(self._state_holder), kind, round_, now)
                return True
            except Exception:
                _log.debug("could not say it: this node writes for itself", exc_info=True)
                return False

        def _ne_sayings(self) -> Any:
            """The holder's sayings, when this node joins, leaves and beats together."""
            return getattr(self._state_holder, "_ne_sayings", None) if self._ne_rules.together else None

        def _ne_read(self) -> list[Any]:
            try:
                return list(self._ne_sayings().read(holder_store(self._state_holder), time.time()))
            except Exception:
                _log.debug("could not read what the others said: this write is this node's own", exc_info=True)
                return []

        def _add_to_participants(self) -> None:
            if self._ne_sayings() is None:
                super()._add_to_participants()
                return
            self._ne_say(together.JOIN, self._state.round, time.time())
            said = self._ne_read()
            self._ne_taking = True
            try:
                super()._add_to_participants()  # calls _keep_alive: its own heartbeat, not a read
            finally:
                self._ne_taking = False
            together.take_joins(self._state, said, self._settings, node_of, time.time())
            together.take_alive(self._state, said, node_of)

        def _remove_from_participants(self) -> None:
            if self._ne_opening:
                self._ne_opening = False
                together.open_next_round(self._state, self._settings, self._node, time.time())
                return None
            if self._ne_sayings() is None:
                super()._remove_from_participants()
                return None
            self._ne_say(together.LEAVE, self._state.round, time.time())
            together.take_leaves(self._state, self._ne_read(), node_of, self._node)
            super()._remove_from_participants()

        def _keep_alive(self) -> None:
            super()._keep_alive()
            if self._ne_sayings() is not None and not self._ne_taking:
                together.take_alive(self._state, self._ne_read(), node_of)

    return NotebookExecutor


@functools.cache
def _rendezvous_class() -> type:
    """``NotebookRendezvous``: a ``RendezvousHandler`` (torch's public interface) that holds
    torch's c10d handler and adds what a notebook job needs around it: the hooks before and
    after each round (``hook_next_rendezvous``), and leaving the round instead of closing it
    when stopped (``leave_instead_of_closing``)."""
    from torch.distributed.elastic.rendezvous import RendezvousHandler

    class NotebookRendezvous(RendezvousHandler):
        def __init__(self, torch_handler: Any, hooks: RendezvousHooks, link: store_link.StoreLink) -> None:
            self.torch_handler = torch_handler  # torch's DynamicRendezvousHandler
            self._ne_hooks = hooks
            self._ne_link = link  # this agent's: a node leaving does not wait for a lost store

        def get_backend(self) -> str:
            return RDZV_BACKEND  # the name it is made by (torch's registry checks it)

        @property
        def use_agent_store(self) -> bool:
            return bool(self.torch_handler.use_agent_store)

        def next_rendezvous(self) -> Any:
            hooks = self._ne_hooks
            if hooks.before is not None:
                hooks.before(self.torch_handler)
            executor: Any = getattr(self.torch_handler, "_op_executor", None)
            if hasattr(executor, "_ne_regrouping"):
                executor._ne_regrouping = True  # its exit regroups (a node leaving exits for good)
            try:
                info = self.torch_handler.next_rendezvous()
            finally:
                if hasattr(executor, "_ne_regrouping"):
                    executor._ne_regrouping = False
            if hooks.after is not None:
                hooks.after(self.torch_handler, info)
            return info

        def is_closed(self) -> bool:
            return bool(self.torch_handler.is_closed())

        def round_moved(self) -> bool:
            """Whether this node's round changed since its last look (one small call, now)."""
            look = getattr(getattr(self.torch_handler, "_state_holder", None), "look_now", None)
            return bool(look()) if look is not None else False

        def set_closed(self) -> None:
            self.torch_handler.set_closed()

        def num_nodes_waiting(self) -> int:
            return int(self.torch_handler.num_nodes_waiting())

        def get_run_id(self) -> str:
            return str(self.torch_handler.get_run_id())

        def shutdown(self) -> bool:
            from torch.distributed.elastic.multiprocessing.api import SignalException

            hooks = self._ne_hooks
            if not (hooks.leave_always or hooks.told_to_stop() or isinstance(sys.exc_info()[1], SignalException)):
                return bool(self.torch_handler.shutdown())  # the job is done (or failed): close it, as torch does
            try:
                return leave_round(self.torch_handler, self._ne_link)
            except Exception:
                _log.debug("the store is gone already: nothing to leave, nothing to close", exc_info=True)
                return False

    return NotebookRendezvous


def hook_next_rendezvous(
    hooks: RendezvousHooks, after: Callable[[Any, Any], None], before: Callable[[Any], None] | None = None
) -> bool:
    """Have our handlers over ``hooks`` call ``after(handler, info)`` each time a rendezvous
    completes, and ``before(handler)`` each time this node is about to join one (``handler``:
    torch's own). Idempotent: the hooks are replaced, never added twice."""
    hooks.before, hooks.after = before, after
    return True


def _store_of_round(torch_handler: Any, hooks: RendezvousHooks, link: store_link.StoreLink) -> Any:
    """The round's store, as torch's handler makes it in ``_get_store`` (a PrefixStore), on the
    store the rendezvous reaches now (a replacement, once reconnected), not the one it was made
    with; once ``hook_store_reconnect`` ran, each call on it has a deadline (``store_link.BoundedStore``).
    Set on our handlers' torch handler only (an attribute of the instance, not of torch's
    class): torch's ``create_handler`` makes the handler, so no subclass of ours can."""
    store_link.follow_replaced_store(torch_handler)
    store = type(torch_handler)._get_store(torch_handler)
    return store_link.BoundedStore(store, torch_handler._store, link) if hooks.bounded_store else store

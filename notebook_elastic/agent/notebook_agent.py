"""torchrun's agent, ours: ``NotebookAgent``, a subclass of torchrun's ``LocalElasticAgent``
through the hooks ``SimpleElasticAgent`` names for subclasses, calling what the job's agent
(``run.py``) hooks in around torch's own (``hook_agent``, ``hook_store_reconnect``); torchrun
makes it by the name its launcher module holds, the one class name of torch's we rebind. And
the trial round at agent start (``probe``) that tries every behaviour of torch's private names
we use, on a throwaway round of our rendezvous (``rounds.py``) and a throwaway agent.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..contract.protocol import GONE_KEY, TARGET_KEY
from ..plumbing import log as _logging
from . import change_watch, rounds, store_link
from .torch_adapter import (
    INTERNALS,
    agent_class,
    backend_has_store,
    exit_round,
    group_is_healthy,
    handler_class,
    has_worker_context,
    joined_round,
    keep_alive_window_s,
    mark_round_dirty,
    rendezvous_backend,
    rendezvous_store,
    restart_budget,
    round_state,
    seeded_round,
    spend_restart_budget,
    state_key,
    stop_heartbeats,
    torch_handler,
    worker_group_spec,
    worker_pids,
    worker_pids_by_local_rank,
)

_log = _logging.get("agent.notebook_agent")


#: What torch's run loop sleeps between two looks at the workers; our agent waits the rest of
#: the monitor interval, woken early when there is something to regroup for.
MONITOR_TICK_S = 0.01
#: Where rounds are polled faster than the monitor's interval (a local job), its wait looks
#: for a node waiting to join this often at most: 0.1 % of a core per agent (measured, two
#: agents of a local job); at 0.02 s, 1.3 %.
JOIN_LOOK_S = 0.05

#: How long the probe's round may take to close at its target; torch alone closes it at its last
#: call (``PROBE_LAST_CALL_S``). Apart enough that a loaded machine (the probe runs at the lowest
#: priority) is not taken for a torch that changed: at 2.5 s against 5 s it was, under load.
PROBE_CLOSE_S = 6.0
PROBE_LAST_CALL_S = 15


def probe(
    rules: rounds.RoundRules, hooks: rounds.RendezvousHooks, link: store_link.StoreLink, agent: AgentHooks
) -> dict[str, str]:
    """What the rendezvous internals we use still do on this torch, tried on a throwaway round
    of our handler over an in-memory store (``HashStore``; some 70 ms), its rounds as the agent's
    ``rules`` say: a round of 1:2 nodes
    closes at a target of 1 (where ``close_rounds_at_target`` is on), its members are read, its
    state lies where and as a replaced store is seeded, a node the supervisor names as gone is
    dropped (where ``drop_gone_nodes`` is on), and a node leaves at once; then a throwaway agent
    of ours, never started, has its restart budget, group and workers read. A name torch kept while changing what it does fails here, not in a job.
    Each behaviour that fails maps to its entries of ``INTERNALS`` (what the job loses); ``{}``
    when all hold. Touches nothing of the agent's own rendezvous: its ``hooks`` are not called,
    and this node is not marked as leaving in its ``link`` (the round's store calls are answered
    as the agent's are); the throwaway agent is of the agent's class (over its hooks, ``agent``),
    never started."""
    import json

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    lost: dict[str, str] = {}

    def fails(*names: str) -> None:
        lost.update({name: INTERNALS[name] for name in names})

    store = dist.HashStore()
    store.set(TARGET_KEY, "1")
    params = RendezvousParameters(
        backend=rounds.RDZV_BACKEND,
        endpoint="127.0.0.1:0",
        run_id="notebook-elastic-probe",
        min_nodes=1,
        max_nodes=2,
        join_timeout=30,
        last_call_timeout=PROBE_LAST_CALL_S,
    )
    inner: Any = None
    try:
        inner = rounds.handler_over(store, params, rules, hooks, link).torch_handler
        started = time.monotonic()
        inner.next_rendezvous()  # torch's own: the agent's hooks are not told of this round
        if rules.close_at_target and time.monotonic() - started > PROBE_CLOSE_S:
            fails("dynamic_rendezvous._RendezvousJoinOp", "dynamic_rendezvous._DistributedRendezvousOpExecutor")
        state = round_state(inner)
        if state is None or len(state[1]) != 1 or joined_round(inner)[1].keys() != state[1]:
            fails("DynamicRendezvousHandler._heartbeat_lock", "DynamicRendezvousHandler._state_holder")
        if keep_alive_window_s(inner) is None:
            fails("DynamicRendezvousHandler._settings")
        # A replaced store is seeded with a state torch reads back (_reconnect): the round's
        # state is where and as the seeding writes it.
        backend = rendezvous_backend(inner)
        if (
            rendezvous_store(inner) is not store
            or state is None
            or seeded_round(store.get(state_key(backend))) != state[0]
        ):
            fails("C10dRendezvousBackend._store")
        if rules.drop_gone:
            store.set(GONE_KEY, json.dumps({str(os.getpid()): time.time()}))
            mark_round_dirty(inner)
            after = round_state(inner)
            if after is None or after[1]:
                fails("dynamic_rendezvous._BackendRendezvousStateHolder._sanitize")
            store.delete_key(GONE_KEY)
        if not exit_round(inner, 5.0):
            fails("DynamicRendezvousHandler._stop_heartbeats", "dynamic_rendezvous._RendezvousExitOp")
        _probe_agent(inner, agent, fails)
    except Exception as exc:  # a step that broke: what it takes is lost, and why, said once
        _log.debug("the rendezvous probe failed", exc_info=True)
        if not lost:
            fails("dynamic_rendezvous._RendezvousJoinOp", "DynamicRendezvousHandler._state_holder")
        lost["probe"] = f"a trial round failed ({type(exc).__name__}: {exc})"[:300]
    finally:
        try:
            stop_heartbeats(inner)
        except Exception:
            _log.debug("the probe's heartbeats were stopped already", exc_info=True)
    return lost


def _probe_agent(handler: Any, hooks: AgentHooks, fails: Callable[..., None]) -> None:
    """A throwaway agent of ours (never started): its restart budget, group and workers read."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    spec = WorkerSpec(role="probe", local_world_size=1, rdzv_handler=handler, entrypoint="true", max_restarts=3)
    agent = agent_subclass(hooks)(spec, logs_specs=DefaultLogsSpecs())
    if restart_budget(agent) != (3, 3):
        fails("LocalElasticAgent._remaining_restarts")
    # The departure watch reads the group (torch's public get_worker_group) and its workers' pids.
    group_read = not group_is_healthy(agent) and worker_group_spec(agent) is spec
    if not group_read or worker_pids(agent) != [] or not has_worker_context(agent):
        fails("LocalElasticAgent._pcontext")


def hook_store_reconnect(
    link: store_link.StoreLink,
    rendezvous: rounds.RendezvousHooks,
    agent: AgentHooks,
    last_round: Callable[[], int | None],
    on_replaced: Callable[[int], None],
    replaceable: bool = True,
    on_regroup: Callable[[], object] = lambda: None,
) -> bool:
    """Give every call of our rendezvous backend (``rendezvous_backend``), and every call
    torchrun's agent makes on its store, a deadline, and make them survive the store's loss
    (idempotent): a store that stopped answering is waited for; with ``replaceable`` a store
    that went is waited for too, and a replacement is taken. ``last_round()`` is the round this
    node was in; ``on_replaced(seeded_round)`` is called once per replacement this node sees;
    ``on_regroup()`` when the agent rendezvouses again because its store was lost while it
    formed its group. ``link`` and ``rendezvous``: the agent's (its rendezvous handlers hold
    them); ``agent``: its hooks (its class is made over them). False when this torch lacks what
    it takes."""
    if not link.recover_lost_stores(last_round, on_replaced, replaceable):
        return False
    _hook_agent_store(on_regroup, rendezvous, agent)
    return True


def _hook_agent_store(on_regroup: Callable[[], object], rendezvous: rounds.RendezvousHooks, agent: AgentHooks) -> None:
    """The round's store, as the agent gets it, answers under the deadline (``_store_of_round``);
    our agent (``NotebookAgent._rendezvous``) forms its group again when it was lost."""
    if hasattr(handler_class(), "_get_store") and hasattr(agent_class(), "_rendezvous"):
        agent.on_regroup = on_regroup
        rendezvous.bounded_store = True
        _use_our_agent(agent)  # its _rendezvous regroups, whether or not hook_agent could hook the rest


# -- the agent -----------------------------------------------------------------------------


class AgentHooks:
    """What ``NotebookAgent`` calls at torchrun's documented agent hooks, set at agent start
    (``hook_agent``, ``hook_store_reconnect``); each default leaves torch's behaviour. One per
    agent process (``agent/run.py`` makes it): torchrun makes its agent by a class name, with no
    way to hand it an object, so the class is made over them (``agent_subclass``)."""

    def __init__(self) -> None:
        self.before_start: Callable[[Any], None] = lambda agent: None
        self.after_start: Callable[[Any], None] = lambda agent: None
        # Before torch stops the workers (restarting: within its restart of them): the signal to
        # stop them with, where not torch's SIGTERM (None).
        self.before_stop: Callable[[Any, bool], int | None] = lambda agent, restarting: None
        # At each of the monitor's looks, before torch's own (a stop told and swallowed lands).
        self.at_look: Callable[[], None] = lambda: None
        self.departures: Callable[[Any], list[Any]] = lambda result: []
        self.on_departure: Callable[[list[Any]], None] = lambda failures: None
        self.regroup_now: Callable[[], str | None] = lambda: None  # why a healthy group regroups now
        self.gives_up: Callable[[Any], bool] = lambda result: False
        self.on_regroup: Callable[[], object] | None = None  # None: a lost store is not regained
        # In place (agent/inplace.py): (pids by local rank, the group, its rendezvous, why) ->
        # whether the workers were regrouped without a restart; what a healthy group's restart
        # tells when they were not (why); what a node told to go does before torch stops its
        # workers (its local ranks).
        self.in_place: Callable[[dict[int, int], Any, Callable[[], None], str], bool] = lambda *a: False
        self.restarting: Callable[[str], None] = lambda why: None
        self.leave: Callable[[list[int]], None] = lambda local_ranks: None
        self.why: str | None = None  # why the restart under way: "joined" (torch's own), "lost",
        # "left", "store" (a healthy group regroups), "failed" (a departure broke the workers)
        # The monitor's wait between two looks (seconds), cut short when there is something to
        # regroup for (in place: agent/inplace.py): whether it was; torch's own sleep is
        # MONITOR_TICK_S of it.
        self.wait_for_change: Callable[[float], bool | None] = time.sleep
        # Where rounds are polled faster than the monitor's interval (a local job), the wait
        # also looks this often for a node waiting to join (None: at torch's look alone).
        self.join_look_s: float | None = None
        # A wait the store answers when the round changes (change_watch): where it is armed,
        # it stands in for those looks, and the monitor is woken by it.
        self.change_watch: change_watch.ChangeWatch | None = None
        # Set while torch assigns a round's ranks (the agent's store link's ``ranking``): a
        # wait on the round's store then ends when the round lost a member (RoundLostMember).
        self.ranking: threading.Event | None = None


# Made once per hooks object, at its first use (torch imported by then): a cache, not a
# registry; one agent process has one hooks object, so one class.
@functools.cache
def agent_subclass(hooks: AgentHooks) -> type:
    """``NotebookAgent``: torchrun's ``LocalElasticAgent`` through the hooks its base class
    documents for subclasses (``SimpleElasticAgent``: ``_start_workers``, ``_monitor_workers``,
    ``_shutdown``, ``_rendezvous``), each calling torch's own and ``hooks`` around it."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    class NotebookAgent(agent_class()):  # type: ignore[misc]  # torch's class, known at run time
        _remaining_restarts: int  # torch's (SimpleElasticAgent's) budget, spent at once by gives_up

        def __init__(self, spec: Any, *args: Any, **kwargs: Any) -> None:
            # torch's run loop sleeps spec.monitor_interval between two looks, and nothing wakes
            # it: a departure the watch saw waited for the rest of it (0.05 s on average of a
            # change in place at 0.1 s). torch sleeps a tick of it; we wait the rest
            # (_monitor_workers), ended early by hooks.wait_for_change. Workers are still looked
            # at once an interval (--monitor-interval), as torch does.
            self._ne_interval_s = float(spec.monitor_interval)
            self._ne_restarting = False  # within torch's restart of the workers (not the node's end)
            spec.monitor_interval = min(self._ne_interval_s, MONITOR_TICK_S)
            super().__init__(spec, *args, **kwargs)

        def _start_workers(self, worker_group: Any) -> Any:
            hooks.before_start(self)
            started = super()._start_workers(worker_group)
            hooks.after_start(self)
            return started

        def _shutdown(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.elastic.multiprocessing.api import SignalException

            if isinstance(sys.exc_info()[1], SignalException):  # this node goes: its workers leave in place
                # First: until they have left (at a step boundary), nothing says they are being
                # stopped, and a Slurm SIGTERM a worker holds stays held (``before_stop`` then).
                hooks.leave(sorted(worker_pids_by_local_rank(self)))
            death_sig = hooks.before_stop(self, self._ne_restarting)
            if death_sig is not None and self._ne_restarting and not args:  # (torch's restart passes keywords)
                kwargs["death_sig"] = signal.Signals(death_sig)
            return super()._shutdown(*args, **kwargs)

        def _restart_workers(self, worker_group: Any) -> Any:
            # A change of members: torchrun stops and starts every worker; ours keep their
            # processes when they can (each worker said so), and only a new round is formed.
            # torch's own call: new nodes wait (a healthy group), or its workers failed (told as
            # a failure already: "a new node waiting" beside it was false).
            healthy = worker_group.state == WorkerState.HEALTHY
            why, hooks.why = hooks.why or ("joined" if healthy else "failed"), None
            if why != "failed" and healthy:
                pids = worker_pids_by_local_rank(self)
                if hooks.in_place(pids, worker_group, lambda: self._rendezvous(worker_group), why):
                    worker_group.state = WorkerState.HEALTHY
                    return None
            hooks.restarting(why)
            # torch stops the failed workers (``_shutdown``) and starts new ones: a stop of its
            # round, not of the node (a signal landing meanwhile unwinds it: then it is the end).
            self._ne_restarting = True
            try:
                return super()._restart_workers(worker_group)
            finally:
                self._ne_restarting = False

        def _monitor_workers(self, worker_group: Any) -> Any:
            hooks.at_look()
            rest_s = self._ne_interval_s - worker_group.spec.monitor_interval
            if rest_s > 0:
                self._ne_wait(worker_group, rest_s)
            result = super()._monitor_workers(worker_group)
            why = hooks.regroup_now() if result.state == WorkerState.HEALTHY else None
            if why is not None:
                hooks.why = why
                self._restart_workers(worker_group)
                return RunResult(state=WorkerState.HEALTHY)
            if result.state not in (WorkerState.FAILED, WorkerState.UNHEALTHY):
                return result
            if result.state == WorkerState.FAILED and hooks.gives_up(result):
                spend_restart_budget(self)  # torchrun's own "no attempts left" path
                return result
            failures = hooks.departures(result)
            if not failures:
                return result
            hooks.on_departure(failures)
            hooks.why = "failed"  # its workers are gone already: restarted, as torchrun would
            self._restart_workers(worker_group)
            return RunResult(state=WorkerState.HEALTHY)

        def _ne_wait(self, worker_group: Any, rest_s: float) -> None:
            """The rest of the monitor's interval, ended early by ``hooks.wait_for_change``. torch
            looks for a node waiting to join once an interval, after it (``num_nodes_waiting``):
            a scale-up waited up to an interval for the survivors to see its node (0.05 s on
            average at 0.1 s). Where rounds are polled faster (``hooks.join_look_s``: a local
            job), the wait looks at the round's change counter that often (one small call; at
            most every ``JOIN_LOOK_S``) and ends when it moved: torch's own look, next, reads
            the round and finds the node."""
            look_s = max(hooks.join_look_s, JOIN_LOOK_S) if hooks.join_look_s else None
            moved = getattr(worker_group.spec.rdzv_handler, "round_moved", None)  # ours (rounds.py)
            watch = hooks.change_watch
            if watch is not None and moved is not None:
                change_watch.next_mark(worker_group.spec.rdzv_handler, watch)
                if watch.active:  # the store answers when the round changes: no looks
                    if hooks.wait_for_change(rest_s):
                        moved()  # torch's look, next, reads the round where its counter moved
                    return
            if not look_s or look_s >= rest_s or moved is None:
                hooks.wait_for_change(rest_s)
                return
            deadline = time.monotonic() + rest_s
            while (left := deadline - time.monotonic()) > 0:
                if hooks.wait_for_change(min(left, look_s)) or moved():
                    return

        def _rendezvous(self, worker_group: Any) -> Any:
            ranking = hooks.ranking
            while True:
                try:
                    if ranking is not None:
                        ranking.set()
                    return super()._rendezvous(worker_group)
                except store_link.RoundLostMember as lost:
                    _log.warning("%s: rendezvous again", lost)
                    continue
                except store_link.AgentStoreLost as lost:
                    rendezvous = torch_handler(worker_group.spec.rdzv_handler)
                    backend = rendezvous_backend(rendezvous)
                    if hooks.on_regroup is None or backend is None or not backend_has_store(backend):
                        raise
                    store_link.regain_store(backend, lost.client, lost.silent)
                finally:
                    if ranking is not None:
                        ranking.clear()
                hooks.on_regroup()  # a round on the store there now, for every node: nothing charged

    return NotebookAgent


def hook_agent(
    hooks: AgentHooks,
    before_start: Callable[[Any], None],
    departures: Callable[[Any], list[Any]],
    on_departure: Callable[[list[Any]], None],
    regroup_now: Callable[[], str | None] = lambda: None,
    gives_up: Callable[[Any], bool] = lambda result: False,
    after_start: Callable[[Any], None] = lambda agent: None,
    before_stop: Callable[[Any, bool], int | None] = lambda agent, restarting: None,
    at_look: Callable[[], None] = lambda: None,
    in_place: Callable[[dict[int, int], Any, Callable[[], None], str], bool] | None = None,
    restarting: Callable[[str], None] | None = None,
    leave: Callable[[list[int]], None] | None = None,
    wait_for_change: Callable[[float], bool | None] | None = None,
    ranking: threading.Event | None = None,
    join_look_s: float | None = None,
    watch: change_watch.ChangeWatch | None = None,
) -> bool:
    """torchrun's agent, as ``NotebookAgent``: ``before_start(agent)`` before every (re)start
    of its workers; a failed or unhealthy round whose ``departures(result)`` is not empty is
    regrouped as for a new node (``on_departure(failures)`` first) instead of being charged to
    the budget; so is a healthy one when ``regroup_now()`` says why (its rendezvous store was
    replaced, a member left); a failed one that ``gives_up(result)`` is not restarted at all: torchrun stops
    its workers and ends as when its budget is spent (``ChildFailedError``).
    ``after_start(agent)`` runs once its workers are started (torch has set its signal handlers
    by then), and ``before_stop(agent, restarting)`` before it stops them (``_shutdown``: within
    torch's restart of its workers, or its end; it returns the signal to stop them with, None for
    torch's SIGTERM); ``at_look()`` at each of the monitor's looks. In place (``agent/inplace.py``): a healthy group's restart first asks ``in_place(pids
    by local rank, group, rendezvous, why)`` whether its workers were regrouped without one, and
    tells ``restarting(why)`` when they were not; a node stopped by a signal calls ``leave(local
    ranks)`` before torch stops its workers; the monitor's wait between two looks is
    ``wait_for_change(seconds)`` (cut short when there is something to regroup for: True), and
    looks for a node waiting to join every ``join_look_s`` of it where that is set, or, where
    ``watch`` is armed, waits for the store's answer when the round changes; ``ranking``
    is set while torch assigns a round's ranks (the agent's ``StoreLink.ranking``). torchrun makes its agent in ``torch.distributed.launcher.api.launch_agent`` from that
    module's name ``LocalElasticAgent``, with no option to name another class: that one name is
    bound to our subclass, made over ``hooks`` (the agent's; the only name of torch's we rebind
    for the agent). False when this torch lacks what it takes (then the agent runs as torch's
    own)."""
    if not all(hasattr(agent_class(), n) for n in ("_start_workers", "_monitor_workers", "_restart_workers")):
        return False
    hooks.before_start, hooks.departures, hooks.on_departure = before_start, departures, on_departure
    hooks.regroup_now, hooks.gives_up = regroup_now, gives_up
    hooks.after_start, hooks.before_stop, hooks.at_look = after_start, before_stop, at_look
    if in_place is not None:
        hooks.in_place = in_place
    if restarting is not None:
        hooks.restarting = restarting
    if leave is not None:
        hooks.leave = leave
    if wait_for_change is not None:
        hooks.wait_for_change = wait_for_change
    if ranking is not None:
        hooks.ranking = ranking
    hooks.join_look_s = join_look_s
    hooks.change_watch = watch
    _use_our_agent(hooks)
    return True


def _use_our_agent(hooks: AgentHooks) -> None:
    """torchrun makes ``NotebookAgent`` over ``hooks`` (each hook not set leaves torch's behaviour)."""
    import torch.distributed.launcher.api as launcher

    launcher_module: Any = launcher  # its LocalElasticAgent, bound to ours below
    launcher_module.LocalElasticAgent = agent_subclass(hooks)

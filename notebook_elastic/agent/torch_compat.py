"""Every use of torch's private internals, in one place, each guarded.

torchrun gives no public hook for what an elastic notebook job needs: the members of a
rendezvous round, leaving a round at once, a say in whether a failure is charged to
``--max-restarts``. And the versions differ: a store served on a socket bound before torch is
imported needs the legacy server before torch 2.7 (``tcp_store_server``). What we
use is listed in ``INTERNALS`` with what is lost without it; ``missing()`` checks them all
against the installed torch, and the agent reports the missing ones in one ``degraded``
event: the job still runs, it heals slower. ``tests/test_torch_compat.py`` is the contract,
run on the oldest and the newest torch of pyproject's range (``torch>=2.4,<2.16``) by
``scripts/torch_range.py``.

One module on purpose, well over 600 lines (some 850): one adapter owns every private torch
internal (#12 item 5), so a torch upgrade is checked in one place. The deadline its store calls
run under is plain Python and lives beside it (``deadline.py``).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..runtime import log as _logging
from .deadline import StoreSilent, call_with_deadline

_log = _logging.get("agent.torch_compat")

#: name -> what a job loses when the installed torch lacks it.
INTERNALS = {
    "DynamicRendezvousHandler._heartbeat_lock": "departed peers are noticed at the collective timeout, not at once",
    "DynamicRendezvousHandler._state_holder": "departed peers are noticed at the collective timeout, not at once",
    "DynamicRendezvousHandler._settings": "a departure is told apart from a bug after a fixed 2 s grace",
    "DynamicRendezvousHandler._stop_heartbeats": "a stopped node is noticed when its heartbeat expires",
    "DynamicRendezvousHandler._op_executor": "a stopped node is noticed when its heartbeat expires",
    "dynamic_rendezvous._RendezvousExitOp": "a stopped node is noticed when its heartbeat expires",
    "LocalElasticAgent._start_workers": "changed files are not refused at a restart",
    "LocalElasticAgent._monitor_workers": "departures are charged to --max-restarts like failures",
    "LocalElasticAgent._restart_workers": "departures are charged to --max-restarts like failures",
    "LocalElasticAgent._pcontext": "departed peers are noticed at the collective timeout, not at once",
    "LocalElasticAgent._worker_group": "departed peers are noticed at the collective timeout, not at once",
    "LocalElasticAgent._remaining_restarts": (
        "a node sent away while joining is not charged to --max-restarts; a failure no retry can mend "
        "(state that cannot be saved) may spend one restart before the job stops"
    ),
    "C10dRendezvousBackend._call_store": "a replaced rendezvous store ends every agent, a frozen one hangs them",
    "C10dRendezvousBackend._store": "a replaced rendezvous store ends every agent, a frozen one hangs them",
    "DynamicRendezvousHandler._store": "a replaced rendezvous store ends every agent, a frozen one hangs them",
    "DynamicRendezvousHandler._get_store": "a store frozen while ranks are assigned or at the exit barrier hangs the agent",
    "LocalElasticAgent._rendezvous": "a store frozen while ranks are assigned or at the exit barrier hangs the agent",
    "dynamic_rendezvous._RendezvousJoinOp": "a round waits last_call_timeout past the nodes the job runs",
    "dynamic_rendezvous._DistributedRendezvousOpExecutor": "a round waits last_call_timeout past the nodes the job runs",
    "dynamic_rendezvous._delay": "a node waiting in a round looks again once a second",
    "dynamic_rendezvous._BackendRendezvousStateHolder._cache_duration": "a node waiting in a round looks again once a second",
    "dynamic_rendezvous._BackendRendezvousStateHolder._sanitize": "a node that died is dropped when its heartbeat expires",
}


def _handler_class() -> Any:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    return dr.DynamicRendezvousHandler


def _agent_class() -> Any:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    return LocalElasticAgent


def _mark_ours(patch: Any) -> None:
    """Mark ``patch`` as ours: a hook that finds it in place already does not wrap it again."""
    patch._notebook_elastic = True


def missing() -> dict[str, str]:
    """The internals the installed torch lacks, each with what the job loses."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    handler, agent = _handler_class(), _agent_class()
    # Instance attributes are set in __init__: read them from its code, without an instance.
    handler_init = set(handler.__init__.__code__.co_names)
    agent_names = set()
    for klass in agent.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and hasattr(init, "__code__"):
            agent_names |= set(init.__code__.co_names)
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as cb

    backend_init = set(cb.C10dRendezvousBackend.__init__.__code__.co_names)
    present = {
        "C10dRendezvousBackend._call_store": hasattr(cb.C10dRendezvousBackend, "_call_store"),
        "C10dRendezvousBackend._store": "_store" in backend_init,
        "DynamicRendezvousHandler._store": "_store" in handler_init,
        "DynamicRendezvousHandler._get_store": hasattr(handler, "_get_store"),
        "LocalElasticAgent._rendezvous": hasattr(agent, "_rendezvous"),
        "DynamicRendezvousHandler._heartbeat_lock": "_heartbeat_lock" in handler_init,
        "DynamicRendezvousHandler._state_holder": "_state_holder" in handler_init,
        "DynamicRendezvousHandler._settings": "_settings" in handler_init,
        "DynamicRendezvousHandler._stop_heartbeats": hasattr(handler, "_stop_heartbeats"),
        "DynamicRendezvousHandler._op_executor": "_op_executor" in handler_init,
        "dynamic_rendezvous._RendezvousExitOp": hasattr(dr, "_RendezvousExitOp"),
        "LocalElasticAgent._start_workers": hasattr(agent, "_start_workers"),
        "LocalElasticAgent._monitor_workers": hasattr(agent, "_monitor_workers"),
        "LocalElasticAgent._restart_workers": hasattr(agent, "_restart_workers"),
        "LocalElasticAgent._pcontext": "_pcontext" in agent_names,
        "LocalElasticAgent._worker_group": "_worker_group" in agent_names,
        "LocalElasticAgent._remaining_restarts": "_remaining_restarts" in agent_names,
        "dynamic_rendezvous._RendezvousJoinOp": hasattr(dr, "_RendezvousJoinOp") and hasattr(dr, "_Action"),
        "dynamic_rendezvous._DistributedRendezvousOpExecutor": hasattr(dr, "_DistributedRendezvousOpExecutor"),
        "dynamic_rendezvous._delay": hasattr(dr, "_delay"),
        "dynamic_rendezvous._BackendRendezvousStateHolder._cache_duration": "_cache_duration"
        in getattr(getattr(dr, "_BackendRendezvousStateHolder", None), "__annotations__", {}),
        "dynamic_rendezvous._BackendRendezvousStateHolder._sanitize": hasattr(
            getattr(dr, "_BackendRendezvousStateHolder", None), "_sanitize"
        ),
    }
    return {name: INTERNALS[name] for name, ok in present.items() if not ok}


# -- the rendezvous ------------------------------------------------------------------------


def round_state(handler: Any) -> tuple[int, frozenset[Any]] | None:
    """``(round, participants)`` of the rendezvous as the store has it now (None: unknown)."""
    try:
        with handler._heartbeat_lock:
            handler._state_holder.sync()
            state = handler._state_holder.state
        return state.round, frozenset(state.participants)
    except AttributeError:
        return None


def joined_round(handler: Any) -> tuple[int | None, dict[Any, int]]:
    """``(round, {node: group rank})`` the handler just joined, from its local copy."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    return getattr(state, "round", None), dict(getattr(state, "participants", {}))


def keep_alive_window_s(handler: Any) -> float | None:
    """How long a silent member stays in the round (interval x attempts), if known."""
    settings = getattr(handler, "_settings", None)
    if settings is None:
        return None
    window_s: float = settings.keep_alive_interval.total_seconds() * settings.keep_alive_max_attempt
    return window_s


def leave_round(handler: Any, timeout_s: float = 5.0) -> bool:
    """Take this node out of its round now (False: this torch cannot, peers wait for its
    heartbeat to expire)."""
    _leaving.set()  # a store lost now is not waited for
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

        handler._stop_heartbeats()
        handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + timeout_s)
    except (ImportError, AttributeError):
        return False
    return True


def rendezvous_store(handler: Any) -> Any | None:
    """The store the rendezvous backend talks to now (a replacement, once reconnected), for
    keys of our own beside the rendezvous state; None when this torch does not say."""
    backend = getattr(getattr(handler, "_state_holder", None), "_backend", None)
    return getattr(backend, "_store", None)


_leave_always = False  # a joiner's every shutdown leaves (leave_instead_of_closing)


def leave_instead_of_closing(always: bool = True) -> bool:
    """``shutdown()`` closes the rendezvous for every node: the whole job ends. Make it take
    this node out of its round instead
    - when the agent was stopped by a signal: torch 2.4's agent shuts its rendezvous down on
      SIGTERM (``LocalElasticAgent._shutdown``; later releases do not), so a preempted or
      scaled-down node closed the round under the survivors and the job failed;
    - always, with ``always``: a joiner that spends its budget failing to join must not end
      the job it joins.
    Idempotent."""
    global _leave_always
    _leave_always = _leave_always or always
    handler = _handler_class()
    original = handler.shutdown
    if getattr(original, "_notebook_elastic", False):
        return True

    def shutdown(self: Any) -> Any:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        if not _leave_always and not isinstance(sys.exc_info()[1], SignalException):
            return original(self)  # the job is done (or failed): close it, as torch does
        try:
            return leave_round(self)
        except Exception:
            _log.debug("the store is gone already: nothing to leave, nothing to close", exc_info=True)
            return False

    _mark_ours(shutdown)
    handler.shutdown = shutdown
    return True


# -- a round that closes when the job's nodes are in ----------------------------------------
#
# torch closes a round between min and max nodes last_call_timeout after it reached min, and a
# node waiting in a round looks at it again once a second: a scale-up from 1 to 2 of 1:3 waited
# for both (about 1.5 s of the 3.6 s it took on 2 cores). The local supervisor knows how many
# nodes the job runs (its target) and keeps that number in the store; a round that holds that
# many closes at once, and nodes waiting in a round look again every ``poll_s``. Where the key
# is absent (a cluster's store) rounds close as torch closes them.

#: The number of nodes the job runs now, set in the rendezvous store by the local supervisor.
TARGET_KEY = "notebook_elastic/target"
_round_store = threading.local()


def _value(store: Any, key: str) -> bytes | None:
    """What ``key`` holds in ``store``, or None when it is not set (a get alone would wait)."""
    return store.get(key) if store.check([key]) else None


def _target_nodes() -> int | None:
    store = getattr(_round_store, "store", None)
    if store is None:
        return None
    try:
        value = _value(store, TARGET_KEY)
        return None if value is None else int(value)
    except Exception:
        _log.debug("a store lost meanwhile: the rendezvous says so on its own next call", exc_info=True)
        return None


def close_rounds_at_target(poll_s: float | None = None) -> bool:
    """Close a round as soon as it holds the job's target number of nodes (``TARGET_KEY``),
    not ``last_call_timeout`` later; with ``poll_s``, a node waiting in a round looks again
    that often instead of every second, and a look reads the store's state at most ``poll_s``
    old (the agent's check for nodes waiting to join too). Must run before the rendezvous
    handler is made. Idempotent; False where torch lacks the internals."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dr: Any = dynamic_rendezvous  # its private names, patched below
    needed = {"dynamic_rendezvous._RendezvousJoinOp", "dynamic_rendezvous._DistributedRendezvousOpExecutor"}
    polling = {"dynamic_rendezvous._delay", "dynamic_rendezvous._BackendRendezvousStateHolder._cache_duration"}
    if missing().keys() & (needed | (polling if poll_s else set())):
        return False
    executor, join = dr._DistributedRendezvousOpExecutor, dr._RendezvousJoinOp
    if getattr(join.__call__, "_notebook_elastic", False):
        return True
    run, call = executor.run, join.__call__

    def run_op(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The store the operation syncs with: the one a round's target is read from.
        _round_store.store = getattr(getattr(getattr(self, "_state_holder", None), "_backend", None), "_store", None)
        return run(self, *args, **kwargs)

    def join_op(self: Any, ctx: Any, deadline: float) -> Any:
        action = call(self, ctx, deadline)
        if action in (dr._Action.SYNC, dr._Action.KEEP_ALIVE):
            state, settings = ctx.state, ctx.settings
            held = len(state.participants)
            if (
                not state.complete
                and ctx.node in state.participants
                and settings.min_nodes <= held <= settings.max_nodes
                and held == _target_nodes()  # last: a store read, only when the rest holds
            ):
                return dr._Action.MARK_RENDEZVOUS_COMPLETE
        return action

    _mark_ours(join_op)
    executor.run = run_op
    join.__call__ = join_op
    if poll_s:
        # Both are a second: the wait between looks, and how long a look serves the state
        # read before (also what the agent's monitor sees of nodes waiting to join).
        delay, holder = dr._delay, dr._BackendRendezvousStateHolder
        init = holder.__init__

        def _delay(seconds: Any) -> Any:
            return delay(poll_s if seconds == 1 else seconds)  # the 1 s poll; backoffs stay

        def holder_init(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self._cache_duration = min(self._cache_duration, poll_s)

        dr._delay = _delay
        holder.__init__ = holder_init
    return True


#: Agents that died on this machine, {pid: when}, set in the store by the local supervisor.
GONE_KEY = "notebook_elastic/gone"


def _gone_pids(store: Any, window_s: float) -> set[int]:
    """Pids of agents the supervisor saw die within ``window_s`` (a pid reused later is not
    one of them: by then torch's own heartbeat expiry has dropped the dead node anyway)."""
    try:
        value = None if store is None else _value(store, GONE_KEY)
        if value is None:
            return set()
        import json

        now = time.time()
        return {int(pid) for pid, when in json.loads(value).items() if now - when <= window_s}
    except Exception:
        _log.debug("unreadable, or the store lost: heartbeats decide, as in torch", exc_info=True)
        return set()


def drop_gone_nodes() -> bool:
    """A node whose agent died is dropped from the rendezvous as soon as the supervisor saw it
    die (``GONE_KEY``), not when its heartbeat expires (keep_alive_interval x max_attempt
    later): a lost node's peers regroup at once. Idempotent; False where torch lacks it."""
    from datetime import datetime, timezone

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    if "dynamic_rendezvous._BackendRendezvousStateHolder._sanitize" in missing():
        return False
    holder: Any = dr._BackendRendezvousStateHolder  # its _sanitize is patched below
    sanitize = holder._sanitize
    if getattr(sanitize, "_notebook_elastic", False):
        return True

    def _sanitize(self: Any) -> Any:
        settings = self._settings
        window_s = settings.keep_alive_interval.total_seconds() * settings.keep_alive_max_attempt
        gone = _gone_pids(getattr(self._backend, "_store", None), window_s)
        for node, beat in list(self._state.last_heartbeats.items()) if gone else ():
            if node.pid in gone:
                # torch's sanitize drops it now. The same kind of time as torch's own: aware
                # (UTC) since 2.5, naive before (2.4's utcnow(); comparing the two raised
                # TypeError in every agent's next sync, and the job failed on a node's loss).
                expired = datetime.min if beat.tzinfo is None else datetime.min.replace(tzinfo=timezone.utc)
                self._state.last_heartbeats[node] = expired
        return sanitize(self)

    _mark_ours(_sanitize)
    holder._sanitize = _sanitize
    return True


def hook_next_rendezvous(after: Callable[[Any, Any], None], before: Callable[[Any], None] | None = None) -> bool:
    """Call ``after(handler, info)`` each time a rendezvous completes, and ``before(handler)``
    each time this node is about to join one (idempotent)."""
    handler = _handler_class()
    original = handler.next_rendezvous
    if getattr(original, "_notebook_elastic", False):
        return True

    def next_rendezvous(self: Any) -> Any:
        if before is not None:
            before(self)
        info = original(self)
        after(self, info)
        return info

    _mark_ours(next_rendezvous)
    handler.next_rendezvous = next_rendezvous
    get_store = getattr(handler, "_get_store", None)
    if get_store is not None:

        def _get_store(self: Any) -> Any:
            _follow_replaced_store(self)  # the round's store on the store joined, not a lost one
            return get_store(self)

        handler._get_store = _get_store
    return True


# -- a replaced (or frozen) store -------------------------------------------------------------
#
# torch's TCPStore client never reconnects: once its server is gone, every call raises
# DistNetworkError at once, even when a new server serves at the same address (measured on
# 2.13). torchrun's agent then fails on its next rendezvous sync (RendezvousConnectionError
# from num_nodes_waiting) and exits: a store pod that Kubernetes replaced would end every
# agent. So the rendezvous backend reconnects: on a failed call it opens a new client to the
# same endpoint (waiting up to the store's timeout for the replacement to serve), and when the
# store there is another one (``STORE_ID_KEY`` differs, or the rendezvous state is gone) it
# seeds an empty round numbered after the last one (rounds fence checkpoint writes, so they
# must not start over at 0) and says so; the agent then re-forms its round on it.
#
# A store that freezes without resetting the connection (its process stopped, its node cut off)
# never fails a call: the client waits for its reply far past its own timeout (agent/deadline.py).
# So every call of the backend has a deadline, and one that passes it is a lost connection.
# Where the store cannot be replaced (the local supervisor's own: it dies with its agents), only
# the same store answering again is waited for; a store that went (a reset) ends the agent at once.

STORE_ID_KEY = "notebook_elastic/store_id"  # set by our store server (store/run.py)
#: A rendezvous store call is a round trip of a few hundred bytes; one without a reply after
#: this long, even on a loaded node, is a store that does not answer.
STORE_CALL_TIMEOUT_S = 15.0
_reconnect_lock = threading.Lock()
_leaving = threading.Event()  # this node is leaving: a lost store is not waited for


def store_id(store: Any) -> str | None:
    """The id our store server put in the store, or None (another server, or none).
    ``StoreSilent`` when the store does not answer."""

    def read() -> str | None:
        value = _value(store, STORE_ID_KEY)
        return None if value is None else value.decode()

    try:
        found: str | None = call_with_deadline(read, STORE_CALL_TIMEOUT_S)
        return found
    except StoreSilent:
        raise
    except Exception:
        _log.debug("the store's id could not be read", exc_info=True)
        return None


def _store_gone(store: Any, silent: bool, replaceable: bool) -> str:
    where = f"The rendezvous store at {store.host}:{store.port}"
    how = f"stopped answering (no reply in {STORE_CALL_TIMEOUT_S:g} s)" if silent else "closed its connection"
    back = "no store answered there" if replaceable else "it did not answer again"
    return (
        f"{where} {how} and {back} within {store.timeout.total_seconds():g} s: its process is stopped or gone, "
        "or its machine is unreachable."
    )


def hook_store_reconnect(
    last_round: Callable[[], int | None],
    on_replaced: Callable[[int], None],
    replaceable: bool = True,
    on_regroup: Callable[[], object] = lambda: None,
) -> bool:
    """Give every call of the c10d rendezvous backend, and every call torchrun's agent makes on
    its store, a deadline, and make them survive the store's loss (idempotent): a store that
    stopped answering is waited for; with ``replaceable`` a store that went is waited for too,
    and a replacement is taken. ``last_round()`` is the round this node was in;
    ``on_replaced(seeded_round)`` is called once per replacement this node sees;
    ``on_regroup()`` when the agent rendezvouses again because its store was lost while it
    formed its group. False when this torch lacks what it takes."""
    try:
        import torch.distributed as dist
        from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as cb
        from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    except ImportError:
        return False
    backend: Any = cb.C10dRendezvousBackend  # its _call_store is patched below
    original = getattr(backend, "_call_store", None)
    if original is None:
        return False
    _recovery.update(last_round=last_round, on_replaced=on_replaced, replaceable=replaceable)
    if getattr(original, "_notebook_elastic", False):
        return True

    def bounded(self: Any, store_op: Any, *args: Any, **kwargs: Any) -> Any:
        return call_with_deadline(original, STORE_CALL_TIMEOUT_S, self, store_op, *args, **kwargs)

    def _call_store(self: Any, store_op: Any, *args: Any, **kwargs: Any) -> Any:
        failed = self._store
        try:
            if not hasattr(self, "_ne_store_id"):
                self._ne_store_id = store_id(failed)
            return bounded(self, store_op, *args, **kwargs)
        except StoreSilent:
            silent = True
        except RendezvousConnectionError as exc:
            if not isinstance(exc.__cause__, getattr(dist, "DistNetworkError", RuntimeError)):
                raise  # a timeout or a bad request, not a lost connection
            if not _recovery["replaceable"]:
                raise  # the supervisor's store went with the supervisor, and its agents go too
            silent = False
        _regain_store(self, failed, silent)
        try:
            return bounded(self, store_op, *args, **kwargs)
        except StoreSilent as exc:
            raise RendezvousConnectionError(_store_gone(self._store, True, _recovery["replaceable"])) from exc

    _mark_ours(_call_store)
    backend._call_store = _call_store
    _hook_agent_store(on_regroup)
    return True


#: What a lost store is answered with (hook_store_reconnect's arguments).
_recovery: dict[str, Any] = {"last_round": lambda: None, "on_replaced": lambda _round: None, "replaceable": False}


def _regain_store(backend: Any, failed: Any, silent: bool) -> None:
    """After a call on ``failed`` (the backend's store client) got no reply (``silent``) or found
    its connection closed: wait for the store there to answer again, or (replaceable) for a
    replacement, and give the backend a client of it. ``RendezvousConnectionError``, in one
    sentence, when none answers within the store's timeout or this node is leaving."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    replaceable = _recovery["replaceable"]
    if _leaving.is_set():
        how = "stopped answering" if silent else "closed its connection"
        raise RendezvousConnectionError(f"The rendezvous store {how}; this node is leaving, so not waiting for it.")
    with _reconnect_lock:
        if getattr(backend, "_ne_given_up", None) is failed:  # waited for once already: not again
            raise RendezvousConnectionError(_store_gone(failed, silent, replaceable))
        if backend._store is failed:  # no other thread has reconnected meanwhile
            try:
                _reconnect(backend, failed, _recovery["last_round"], _recovery["on_replaced"], replaceable)
            except (ValueError, RuntimeError, TimeoutError) as exc:
                backend._ne_given_up = failed
                raise RendezvousConnectionError(_store_gone(failed, silent, replaceable)) from exc


# torchrun's agent also calls the store outside the rendezvous backend, on the round's PrefixStore
# over the same client (``DynamicRendezvousHandler._get_store``): the bootstrap address exchange
# at the end of ``next_rendezvous``, rank assignment (``_assign_worker_ranks``: set, multi_get,
# multi_set, get) and the exit barrier (``store_util.barrier``: add, set, wait). Those calls get
# the same deadline. One without a reply while the agent forms its group (``_rendezvous``) is a
# lost store: it is regained as above and the agent rendezvouses again (the keys it was waiting
# for are on a store that may be gone), spending no restart. At the exit barrier torch logs the
# error and the agent ends with its workers' result: they are done, and a silent store is a
# reason to stop waiting for the other nodes, not to wait longer.

#: Between two checks of a key a store wait is polling for (doubling from 10 ms).
STORE_POLL_MAX_S = 0.5


class AgentStoreLost(ConnectionError):
    """A call of torchrun's agent on its store got no reply by the deadline, or (``silent``
    False) found the connection closed."""

    def __init__(self, message: str, client: Any, silent: bool) -> None:
        super().__init__(message)
        self.client, self.silent = client, silent


class _BoundedStore:
    """The agent's store (the round's PrefixStore over ``client``), each call under the deadline.
    A call that waits for a key (``get``, ``multi_get``, ``wait``) waits as checks, each a round
    trip under the deadline, for as long as the store's timeout allows: a peer slow to write
    the key is waited for, a store that does not answer is not (the exit barrier waits
    ``exit_barrier_timeout`` for the slowest node: a deadline per call, not per barrier)."""

    def __init__(self, store: Any, client: Any) -> None:
        self._ne_store, self._ne_client = store, client
        self._ne_timeout: timedelta | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ne_store, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: self._call(attr, *args, **kwargs)

    # The agent's waits only. On the PrefixStore it would be the client's, which the rendezvous
    # backend shares: the exit barrier sets 300 s and, failing, never restores it (torch's
    # ``store_timeout`` has no ``finally``), so waiting for a lost store would take 300 s.
    @property
    def timeout(self) -> timedelta:
        return self._ne_timeout or self._ne_store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._ne_timeout = timeout

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist

        try:
            return call_with_deadline(fn, STORE_CALL_TIMEOUT_S, *args, **kwargs)
        except StoreSilent as exc:
            where = f"{self._ne_client.host}:{self._ne_client.port}"
            raise AgentStoreLost(
                f"The rendezvous store at {where} stopped answering torchrun's agent "
                f"(no reply to {getattr(fn, '__name__', 'a call')} in {STORE_CALL_TIMEOUT_S:g} s).",
                self._ne_client,
                silent=True,
            ) from exc
        except dist.DistNetworkError as exc:
            if not _recovery["replaceable"]:
                raise  # the supervisor's store went with the supervisor
            raise AgentStoreLost(str(exc), self._ne_client, silent=False) from exc

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        import torch.distributed as dist

        limit_s = (timeout or self.timeout).total_seconds()
        end, pause = time.monotonic() + limit_s, 0.01
        while not self._call(self._ne_store.check, list(keys)):
            if time.monotonic() >= end:
                raise dist.DistStoreError(f"wait timeout after {limit_s * 1000:.0f}ms, keys: {list(keys)}")
            time.sleep(min(pause, max(0.0, end - time.monotonic())))
            pause = min(2 * pause, STORE_POLL_MAX_S)

    def get(self, key: str) -> bytes:
        self.wait([key])
        value: bytes = self._call(self._ne_store.get, key)
        return value

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.wait(keys)
        values: list[bytes] = self._call(self._ne_store.multi_get, keys)
        return values


def _hook_agent_store(on_regroup: Callable[[], object]) -> None:
    handler, agent = _handler_class(), _agent_class()
    get_store, rendezvous = getattr(handler, "_get_store", None), getattr(agent, "_rendezvous", None)
    if get_store is None or rendezvous is None:
        return

    def _get_store(self: Any) -> Any:
        return _BoundedStore(get_store(self), self._store)

    def _rendezvous(self: Any, worker_group: Any) -> Any:
        while True:
            try:
                return rendezvous(self, worker_group)
            except AgentStoreLost as lost:
                backend = getattr(getattr(worker_group.spec.rdzv_handler, "_state_holder", None), "_backend", None)
                if backend is None or not hasattr(backend, "_store"):
                    raise
                _regain_store(backend, lost.client, lost.silent)
            on_regroup()  # a round on the store there now, for every node: nothing charged

    handler._get_store = _get_store
    agent._rendezvous = _rendezvous


RECONNECT_ATTEMPT_S = 5.0


def _reconnect(
    backend: Any, failed: Any, last_round: Callable[[], int | None], on_replaced: Any, replaceable: bool
) -> None:
    import pickle
    from base64 import b64decode, b64encode

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    # The Service has no endpoint until the replacement store serves: the constructor retries
    # refused connections; one accepted and then dropped (a proxy still routing to the store
    # that went) raises, one accepted by a frozen store is never answered; either is tried
    # again, until the store's timeout.
    # Each attempt is short: signals (SIGTERM from the kubelet, or the parent-death signal)
    # are handled between attempts, never held off for the whole timeout inside C++.
    deadline = time.monotonic() + failed.timeout.total_seconds()
    sentinel = backend._NULL_SENTINEL
    while True:
        attempt_s = max(0.5, min(RECONNECT_ATTEMPT_S, deadline - time.monotonic()))
        try:
            store = call_with_deadline(
                dist.TCPStore,
                attempt_s + RECONNECT_ATTEMPT_S,
                failed.host,
                failed.port,
                is_master=False,
                timeout=timedelta(seconds=attempt_s),
            )
            store.set_timeout(failed.timeout)
            new_id = store_id(store)
            known = getattr(backend, "_ne_store_id", None)
            if not replaceable and known is not None and new_id != known:
                raise ValueError(f"another store serves at {failed.host}:{failed.port}")
            # the state, or the sentinel just set
            current = call_with_deadline(store.compare_set, STORE_CALL_TIMEOUT_S, backend._key, "", sentinel)
            break
        except (RuntimeError, TimeoutError):
            if time.monotonic() >= deadline or _leaving.is_set():
                raise
            time.sleep(0.5)
    replaced = new_id != getattr(backend, "_ne_store_id", None) or (new_id is None and current == sentinel.encode())
    backend._store, backend._ne_store_id = store, new_id
    if not replaced or not replaceable:
        return  # the same store, reached again
    if current == sentinel.encode():
        state = _RendezvousState()
        state.round = (last_round() or 0) + 1
        seed = b64encode(pickle.dumps(state)).decode()
        call_with_deadline(store.compare_set, STORE_CALL_TIMEOUT_S, backend._key, sentinel, seed)
    won = call_with_deadline(store.get, STORE_CALL_TIMEOUT_S, backend._key)
    seeded = pickle.loads(b64decode(won)).round if won != sentinel.encode() else 0
    on_replaced(seeded)


def _follow_replaced_store(handler: Any) -> None:
    """The handler keeps its own reference to the store (for the round's PrefixStore): the
    backend's, which a reconnection replaced."""
    backend = getattr(getattr(handler, "_state_holder", None), "_backend", None)
    store = getattr(backend, "_store", None)
    if store is not None and getattr(handler, "_store", None) is not store:
        handler._store = store


# -- the agent -----------------------------------------------------------------------------


def worker_pids(agent: Any) -> list[int]:
    context = getattr(agent, "_pcontext", None)
    return list(context.pids().values()) if context is not None else []


def restart_budget(agent: Any) -> tuple[int, int] | None:
    """``(restarts left, --max-restarts)`` of this agent, or None when this torch does not say."""
    left = getattr(agent, "_remaining_restarts", None)
    group = getattr(agent, "_worker_group", None)
    most = getattr(getattr(group, "spec", None), "max_restarts", None)
    return (int(left), int(most)) if left is not None and most is not None else None


def group_is_healthy(agent: Any) -> bool:
    group = getattr(agent, "_worker_group", None)
    return group is not None and getattr(group.state, "name", "") == "HEALTHY"


def hook_agent(
    before_start: Callable[[Any], None],
    departures: Callable[[Any], list[Any]],
    on_departure: Callable[[list[Any]], None],
    regroup_now: Callable[[], bool] = lambda: False,
    gives_up: Callable[[Any], bool] = lambda result: False,
    after_start: Callable[[Any], None] = lambda agent: None,
    before_stop: Callable[[Any], None] = lambda agent: None,
) -> bool:
    """Hook torchrun's agent: ``before_start(agent)`` before every (re)start of its workers;
    a failed or unhealthy round whose ``departures(result)`` is not empty is regrouped as for
    a new node (``on_departure(failures)`` first) instead of being charged to the budget; so
    is a healthy one when ``regroup_now()`` says so (its rendezvous store was replaced); a
    failed one that ``gives_up(result)`` is not restarted at all: torchrun stops its workers
    and ends as when its budget is spent (``ChildFailedError``). ``after_start(agent)`` runs
    once its workers are started (torch has set its signal handlers by then), and
    ``before_stop(agent)`` before it stops them (``_shutdown``: a restart, or its end).
    False when this torch lacks what it takes (then the agent runs unhooked)."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    agent = _agent_class()
    if not all(hasattr(agent, n) for n in ("_start_workers", "_monitor_workers", "_restart_workers")):
        return False
    original = agent._start_workers
    if getattr(original, "_notebook_elastic", False):
        return True
    monitor = agent._monitor_workers
    shutdown = getattr(agent, "_shutdown", None)

    def _start_workers(self: Any, worker_group: Any) -> Any:
        before_start(self)
        started = original(self, worker_group)
        after_start(self)
        return started

    def _shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        before_stop(self)
        assert shutdown is not None  # set in torch's place below only when torch has one
        return shutdown(self, *args, **kwargs)

    def _monitor_workers(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if result.state == WorkerState.HEALTHY and regroup_now():
            self._restart_workers(worker_group)
            return RunResult(state=WorkerState.HEALTHY)
        if result.state not in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            return result
        if result.state == WorkerState.FAILED and gives_up(result):
            self._remaining_restarts = 0  # torchrun's own "no attempts left" path
            return result
        failures = departures(result)
        if not failures:
            return result
        on_departure(failures)
        self._restart_workers(worker_group)
        return RunResult(state=WorkerState.HEALTHY)

    _mark_ours(_start_workers)
    agent._start_workers = _start_workers
    agent._monitor_workers = _monitor_workers
    if shutdown is not None:
        agent._shutdown = _shutdown
    return True


# -- the store (torch versions differ) ---------------------------------------------------


#: The torch versions CI proves, as pyproject declares them (``torch>=2.4,<2.16``: the whole
#: suite on 2.13, the contract subset on 2.4.1 and 2.15.0; tests/test_torch_range.py keeps them
#: in step).
TESTED_TORCH = ((2, 4), (2, 16))


def tested_torch_text() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED_TORCH
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"


def torch_is_tested(version: tuple[int, int]) -> bool:
    return TESTED_TORCH[0] <= version < TESTED_TORCH[1]


def torch_version(text: str | None = None) -> tuple[int, int]:
    """(major, minor) of the installed torch (or of `text`), e.g. (2, 5) for "2.5.1+cu124"."""
    if text is None:
        import torch

        text = torch.__version__
    m = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def libuv_store_takes_listen_fd(version: tuple[int, int] | None = None) -> bool:
    """torch's libuv TCPStore (the default server since 2.4) refuses ``master_listen_fd``
    before 2.7 ("NotImplementedError: The libuv TCPStore backend does not support
    initialization with an listen fd")."""
    return (version or torch_version()) >= (2, 7)


def tcp_store_server(sock: socket.socket, timeout_s: float) -> Any:
    """A multi-tenant c10d TCPStore server on `sock` (bound and listening already, so
    clients may connect while torch imports). Where the libuv server cannot take the socket,
    the legacy server does (``use_libuv=False``): same protocol, every client works.

    The store closes the descriptor it is given when it goes, so it gets a duplicate of its
    own: handing it ``sock.fileno()`` made the socket's own close a second close of that
    number, by then perhaps another socket's (a test's API server lost its listener so)."""
    import torch.distributed as dist

    host, port = sock.getsockname()[:2]
    kwargs: dict[str, Any] = dict(
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        timeout=timedelta(seconds=timeout_s),
    )
    if not libuv_store_takes_listen_fd():
        kwargs["use_libuv"] = False
    try:
        return dist.TCPStore(host, port, **kwargs, master_listen_fd=os.dup(sock.fileno()))
    except NotImplementedError:
        if kwargs.get("use_libuv") is False:
            raise
        # A build whose libuv server still refuses the fd (a backport without the support).
        # (The refused duplicate is left open: closing a number the store may have closed is
        # the very double close avoided above.)
        return dist.TCPStore(host, port, **kwargs, use_libuv=False, master_listen_fd=os.dup(sock.fileno()))

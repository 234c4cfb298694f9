"""Every name of torch's we read or write that torch does not document, and the versions we
run on: the one place a torch upgrade is checked (#12 item 5, #38 item 3).

torchrun gives no public hook for what an elastic notebook job needs: the members of a
rendezvous round, leaving a round at once, closing a round at the job's size, a say in whether
a failure is charged to ``--max-restarts``. So we build on what torch offers for extension and
replace none of its methods (#25; ``tests/test_torch_compat.py`` checks torch's classes are left
as torch made them):
- the rendezvous (``rounds.py``): a handler of ours (``NotebookRendezvous``, torch's public
  ``RendezvousHandler`` interface), registered in torch's public handler registry, holding
  torch's c10d handler as torch's ``create_handler`` makes it, on our subclasses of torch's
  backend (``store_link.py``), state holder and operation executor;
- the agent (``notebook_agent.py``): our subclass of torchrun's ``LocalElasticAgent``
  (``NotebookAgent``) through the hooks ``SimpleElasticAgent`` names for subclasses; torchrun
  makes it by the name its launcher module holds, the one class name of torch's we rebind;
- one module function, the executor's wait between looks (``_delay``), is rebound when a job
  polls faster than torch's second.
The private names we use are listed in ``INTERNALS`` with what is lost without them;
``missing()`` checks them against the installed torch, and the agent reports the missing ones in
one ``degraded`` event: the job still runs, it heals slower; ``notebook_agent.probe`` tries what
each does. Reading torch's private state goes through the functions here (``round_state``,
``rendezvous_store``, ``worker_pids``, ``restart_budget``...).

The versions differ too: a store served on a socket bound before torch is imported needs the
legacy server before torch 2.7 (``tcp_store_server``). ``tests/test_torch_compat.py`` is the
contract, run on the oldest and the newest torch of pyproject's range (``torch>=2.4,<2.16``,
``TESTED_TORCH``) by ``scripts/torch_range.py``.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore

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


def rendezvous_times_aware(version: tuple[int, int] | None = None) -> bool:
    """Whether torch's c10d rendezvous keeps its times aware (UTC, torch >= 2.5) or naive UTC
    (torch 2.4's ``datetime.utcnow()``): what a time we write into a state with none yet takes."""
    return (version or torch_version()) >= (2, 5)


def tcp_store_server(sock: socket.socket, timeout_s: float) -> KeyStore:
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


#: name -> what a job loses when the installed torch lacks it.
INTERNALS = {
    "DynamicRendezvousHandler._heartbeat_lock": "departed peers are noticed at the collective timeout, not at once",
    "DynamicRendezvousHandler._state_holder": "departed peers are noticed at the collective timeout, not at once",
    "DynamicRendezvousHandler._settings": "a departure is told apart from a bug after a fixed 2 s grace",
    "DynamicRendezvousHandler._stop_heartbeats": "a stopped node is noticed when its heartbeat expires",
    "DynamicRendezvousHandler._this_node": (
        "a round waits last_call_timeout past the nodes the job runs; a node that died is dropped when its "
        "heartbeat expires; a node dropped while stopped, whose workers never see their group broken, stays out"
    ),
    "DynamicRendezvousHandler._op_executor": "a stopped node is noticed when its heartbeat expires",
    "dynamic_rendezvous._RendezvousExitOp": "a stopped node is noticed when its heartbeat expires",
    "LocalElasticAgent._start_workers": "changed files are not refused at a restart",
    "LocalElasticAgent._monitor_workers": "departures are charged to --max-restarts like failures",
    "LocalElasticAgent._restart_workers": "departures are charged to --max-restarts like failures",
    "LocalElasticAgent._pcontext": "departed peers are noticed at the collective timeout, not at once",
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
    "dynamic_rendezvous._BackendRendezvousStateHolder._last_sync_time": (
        "a node whose write lost reads the state again only at its next look (more lost writes at scale)"
    ),
    "dynamic_rendezvous._DistributedRendezvousOpExecutor._add_to_participants": (
        "each node writes its own join, leave and heartbeat (a round of hundreds of nodes closes slowly)"
    ),
    "dynamic_rendezvous._DistributedRendezvousOpExecutor._remove_from_participants": (
        "each node writes its own join, leave and heartbeat (a round of hundreds of nodes closes slowly)"
    ),
    "dynamic_rendezvous._DistributedRendezvousOpExecutor._keep_alive": (
        "each node writes its own join, leave and heartbeat (a round of hundreds of nodes closes slowly)"
    ),
}


def handler_class() -> Any:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    return dr.DynamicRendezvousHandler


def agent_class() -> Any:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    return LocalElasticAgent


def mark_ours(patch: Any) -> None:
    """Mark ``patch`` as ours: a hook that finds it in place already does not wrap it again."""
    patch._notebook_elastic = True


def missing() -> dict[str, str]:
    """The internals the installed torch lacks, each with what the job loses."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    handler, agent = handler_class(), agent_class()
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
        "DynamicRendezvousHandler._this_node": "_this_node" in handler_init,
        "DynamicRendezvousHandler._stop_heartbeats": hasattr(handler, "_stop_heartbeats"),
        "DynamicRendezvousHandler._op_executor": "_op_executor" in handler_init,
        "dynamic_rendezvous._RendezvousExitOp": hasattr(dr, "_RendezvousExitOp"),
        "LocalElasticAgent._start_workers": hasattr(agent, "_start_workers"),
        "LocalElasticAgent._monitor_workers": hasattr(agent, "_monitor_workers"),
        "LocalElasticAgent._restart_workers": hasattr(agent, "_restart_workers"),
        "LocalElasticAgent._pcontext": "_pcontext" in agent_names,
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


def seeded_round(raw: bytes) -> int | None:
    """The round of a rendezvous state as the backend stores it (base64 of a pickle)."""
    import pickle
    from base64 import b64decode

    round_: int | None = pickle.loads(b64decode(raw)).round
    return round_


def round_state(handler: Any) -> tuple[int, frozenset[Any]] | None:
    """``(round, participants)`` of the rendezvous as the store has it now (None: unknown)."""
    try:
        with handler._heartbeat_lock:
            handler._state_holder.sync()
            state = handler._state_holder.state
        return state.round, frozenset(state.participants)
    except AttributeError:
        return None


def left_out(handler: Any) -> Any:
    """This node, where the round the store had at the last ``round_state`` lists it neither as
    a participant nor as waiting (its heartbeat expired while it was stopped, and the others went
    on without it); else None (and where this torch does not say)."""
    try:
        with handler._heartbeat_lock:
            state = handler._state_holder.state
            me = handler._this_node
        return None if me in state.participants or me in state.wait_list else me
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


def exit_round(handler: Any, timeout_s: float) -> bool:
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

        handler._stop_heartbeats()
        handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + timeout_s)
    except (ImportError, AttributeError):
        return False
    return True


def stop_heartbeats(handler: Any) -> None:
    """Stop the handler's heartbeats, if this torch has them to stop (else nothing)."""
    stop = getattr(handler, "_stop_heartbeats", None)
    if stop is not None:
        stop()


def rendezvous_backend(handler: Any) -> Any | None:
    """The rendezvous backend the handler's state holder keeps the round in; None when this
    torch does not say."""
    return getattr(getattr(handler, "_state_holder", None), "_backend", None)


def backend_has_store(backend: Any) -> bool:
    """Whether the rendezvous backend talks to a store we can replace (``C10dRendezvousBackend._store``)."""
    return hasattr(backend, "_store")


def state_key(backend: Any) -> Any:
    """The store key a rendezvous backend keeps the round's state under."""
    return backend._key


def mark_round_dirty(handler: Any) -> None:
    """Make the handler read its round's state again (and sanitize it) at its next sync."""
    handler._state_holder.mark_dirty()


def rendezvous_store(handler: Any) -> KeyStore | None:
    """The store the rendezvous backend talks to now (a replacement, once reconnected), for
    keys of our own beside the rendezvous state; None when this torch does not say."""
    return holder_store(getattr(handler, "_state_holder", None))


def round_store(handler: Any) -> KeyStore:
    """``rendezvous_store``, or LookupError where this torch does not say (its callers' store
    calls are in a ``try`` that takes that as a store that does not answer)."""
    store = rendezvous_store(handler)
    if store is None:
        raise LookupError("this torch's rendezvous handler does not say where its store is")
    return store


def holder_store(holder: Any) -> KeyStore | None:
    """The store a rendezvous state holder's backend talks to now; None when this torch does
    not say."""
    return getattr(getattr(holder, "_backend", None), "_store", None)


def wrap_rendezvous_wait(wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]], owner: object) -> None:
    """Put ``wrap(torch's own)`` in place of the wait between two looks of a rendezvous round
    (``dynamic_rendezvous._delay``, a module function torch's executor calls with 1, its join's
    first-join jitter with a range): not reachable from a subclass. Ours always wraps torch's
    own, never one of ours; for the same ``owner`` (the rules it reads) it is put once."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dr: Any = dynamic_rendezvous
    if getattr(dr._delay, "_ne_owner", None) is owner:
        return
    own = getattr(dr._delay, "_ne_delay", dr._delay)
    ours: Any = wrap(own)
    mark_ours(ours)
    ours._ne_owner, ours._ne_delay = owner, own
    dr._delay = ours


def rendezvous_bases() -> tuple[Any, Any]:
    """torch's rendezvous state holder and operation executor classes (``dynamic_rendezvous``'s
    ``_BackendRendezvousStateHolder``, ``_DistributedRendezvousOpExecutor``), which ours
    subclass (agent/rounds.py): the state read and written, the operations run on it."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    return dr._BackendRendezvousStateHolder, dr._DistributedRendezvousOpExecutor


def rendezvous_op_kind(op: Any) -> str:
    """Which of torch's rendezvous operations ``op`` is: "join", "exit", "keep_alive" or ""
    (another)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    if isinstance(op, dr._RendezvousJoinOp):
        return "join"
    if isinstance(op, dr._RendezvousKeepAliveOp):
        return "keep_alive"
    return "exit" if isinstance(op, dr._RendezvousExitOp) else ""


def handler_parts(handler: Any) -> tuple[Any, Any]:
    """torch's rendezvous handler's settings and this node's descriptor (``_settings``,
    ``_this_node``): what our state holder and executor are made from. AttributeError on a
    torch without them."""
    return handler._settings, handler._this_node


def replace_handler_parts(handler: Any, holder: Any, executor: Any) -> None:
    """Put our state holder and operation executor in place of torch's in its handler, before
    its first round (it makes its executor from its holder once, at its start)."""
    handler._state_holder, handler._op_executor = holder, executor


def holder_settings(holder: Any) -> Any:
    """A rendezvous state holder's settings (its keep-alive interval and attempts)."""
    return holder._settings


def rendezvous_actions() -> Any:
    """What torch's rendezvous operations return to its executor (``_Action``: SYNC, KEEP_ALIVE,
    FINISH, ...), for ours that stand in for them (agent/regroup.py)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    return dr._Action


def operation_store(op: Any) -> Any | None:
    """The store a rendezvous operation of torch's (its join or exit) talks to now."""
    return holder_store(getattr(op, "_state_holder", None))


def operation_keep_alive_s(op: Any) -> float:
    """A rendezvous operation's keep-alive interval, seconds."""
    return float(op._settings.keep_alive_interval.total_seconds())


def reread(op: Any) -> Any:
    """The round as the store has it now, read into a rendezvous operation of torch's, and the
    context its next decision takes."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    holder: Any = op._state_holder
    holder._last_sync_time = -1  # torch's: its next sync reads the store
    holder.sync()
    op._state = holder.state
    return dr._RendezvousContext(op._node, op._state, op._settings)


def node_of(fields: tuple[str, int, int]) -> Any:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    return dr._NodeDesc(*fields)


def torch_handler(handler: Any) -> Any:
    """torch's own handler behind ``handler`` (ours holds it; any other is its own)."""
    return getattr(handler, "torch_handler", handler)


def worker_pids(agent: Any) -> list[int]:
    context = getattr(agent, "_pcontext", None)
    return list(context.pids().values()) if context is not None else []


def worker_pids_by_local_rank(agent: Any) -> dict[int, int]:
    """``{local rank: pid}`` of the agent's workers as torch started them (under the warm pool,
    the launchers torchrun watches)."""
    context = getattr(agent, "_pcontext", None)
    return {int(r): int(p) for r, p in context.pids().items()} if context is not None else {}


def restart_budget(agent: Any) -> tuple[int, int] | None:
    """``(restarts left, --max-restarts)`` of this agent, or None when this torch does not say."""
    left = getattr(agent, "_remaining_restarts", None)
    most = getattr(getattr(worker_group(agent), "spec", None), "max_restarts", None)
    return (int(left), int(most)) if left is not None and most is not None else None


def worker_group(agent: Any) -> Any | None:
    """The agent's worker group (torch's public ``get_worker_group``); None where it has none."""
    get = getattr(agent, "get_worker_group", None)
    return get() if callable(get) else None


def worker_group_spec(agent: Any) -> Any | None:
    """The spec of the agent's worker group; None when this torch does not say."""
    return getattr(worker_group(agent), "spec", None)


def has_worker_context(agent: Any) -> bool:
    """Whether the agent has the place torch keeps its workers' processes (``_pcontext``)."""
    return hasattr(agent, "_pcontext")


def spend_restart_budget(agent: Any) -> None:
    """No restart left: the agent takes torchrun's own "no attempts left" path at its next look."""
    agent._remaining_restarts = 0


def group_is_healthy(agent: Any) -> bool:
    group = worker_group(agent)
    return group is not None and getattr(group.state, "name", "") == "HEALTHY"


def rdzv_events_heard() -> bool:
    """Whether torch's rendezvous events go anywhere (a handler other than its default null one)."""
    import logging

    from torch.distributed.elastic.events import get_logging_handler

    return not isinstance(get_logging_handler("dynamic_rendezvous"), logging.NullHandler)


def recording_only_when_heard(record: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``_record`` of a rendezvous part, made only when its events are heard: it names
    its event after its caller through ``inspect.stack()``, twice, before it looks whether any
    handler listens (by default none does). That cost about 0.1 s per step of a round on 2
    cores, most of a round's time (py-spy: 0.75 s of a 1.2 s regroup in place)."""

    def _record(*args: Any, **kwargs: Any) -> Any:
        return record(*args, **kwargs) if rdzv_events_heard() else None

    return _record

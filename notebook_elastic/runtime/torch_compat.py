"""Every use of torch's private internals, in one place, each guarded.

torchrun gives no public hook for what an elastic notebook job needs: the members of a
rendezvous round, leaving a round at once, a say in whether a failure is charged to
``--max-restarts``. And the versions differ: a store served on a socket bound before torch is
imported needs the legacy server before torch 2.7 (``tcp_store_server``). What we
use is listed in ``INTERNALS`` with what is lost without it; ``missing()`` checks them all
against the installed torch, and the agent reports the missing ones in one ``degraded``
event: the job still runs, it heals slower. ``tests/test_torch_compat.py`` is the contract,
run against the torch in pyproject's tested range (``torch>=2.13,<2.14``).
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

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
}


def _handler_class() -> Any:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    return dr.DynamicRendezvousHandler


def _agent_class() -> Any:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    return LocalElasticAgent


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
    present = {
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
    }
    return {name: INTERNALS[name] for name, ok in present.items() if not ok}


# -- the rendezvous ------------------------------------------------------------------------


def round_state(handler: Any) -> tuple[int, frozenset] | None:
    """``(round, participants)`` of the rendezvous as the store has it now (None: unknown)."""
    try:
        with handler._heartbeat_lock:
            handler._state_holder.sync()
            state = handler._state_holder.state
        return state.round, frozenset(state.participants)
    except AttributeError:
        return None


def joined_round(handler: Any) -> tuple[int | None, dict]:
    """``(round, {node: group rank})`` the handler just joined, from its local copy."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    return getattr(state, "round", None), dict(getattr(state, "participants", {}))


def keep_alive_window_s(handler: Any) -> float | None:
    """How long a silent member stays in the round (interval x attempts), if known."""
    settings = getattr(handler, "_settings", None)
    if settings is None:
        return None
    return settings.keep_alive_interval.total_seconds() * settings.keep_alive_max_attempt


def leave_round(handler: Any, timeout_s: float = 5.0) -> bool:
    """Take this node out of its round now (False: this torch cannot, peers wait for its
    heartbeat to expire)."""
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

        handler._stop_heartbeats()
        handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + timeout_s)
    except (ImportError, AttributeError):
        return False
    return True


def leave_instead_of_closing() -> bool:
    """An agent whose budget is spent shuts its rendezvous down, which closes it for every
    node: the whole job ends. Make ``shutdown()`` take this node out of its round instead
    (a joiner that fails while joining must not end the job it joins)."""
    handler = _handler_class()
    original = handler.shutdown
    if getattr(original, "_notebook_elastic", False):
        return True

    def shutdown(self):  # type: ignore[no-untyped-def]
        try:
            return leave_round(self)
        except Exception:  # the store is gone already: nothing to leave, nothing to close
            return False

    shutdown._notebook_elastic = True  # type: ignore[attr-defined]
    handler.shutdown = shutdown
    return True


def hook_next_rendezvous(after: Callable[[Any, Any], None]) -> bool:
    """Call ``after(handler, info)`` each time a rendezvous completes (idempotent)."""
    handler = _handler_class()
    original = handler.next_rendezvous
    if getattr(original, "_notebook_elastic", False):
        return True

    def next_rendezvous(self):  # type: ignore[no-untyped-def]
        info = original(self)
        after(self, info)
        return info

    next_rendezvous._notebook_elastic = True  # type: ignore[attr-defined]
    handler.next_rendezvous = next_rendezvous
    return True


# -- the agent -----------------------------------------------------------------------------


def worker_pids(agent: Any) -> list[int]:
    context = getattr(agent, "_pcontext", None)
    return list(context.pids().values()) if context is not None else []


def group_is_healthy(agent: Any) -> bool:
    group = getattr(agent, "_worker_group", None)
    return group is not None and getattr(group.state, "name", "") == "HEALTHY"


def hook_agent(
    before_start: Callable[[Any], None],
    departures: Callable[[Any], list],
    on_departure: Callable[[list], None],
) -> bool:
    """Hook torchrun's agent: ``before_start(agent)`` before every (re)start of its workers;
    a failed or unhealthy round whose ``departures(result)`` is not empty is regrouped as for
    a new node (``on_departure(failures)`` first) instead of being charged to the budget.
    False when this torch lacks what it takes (then the agent runs unhooked)."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    agent = _agent_class()
    if not all(hasattr(agent, n) for n in ("_start_workers", "_monitor_workers", "_restart_workers")):
        return False
    original = agent._start_workers
    if getattr(original, "_notebook_elastic", False):
        return True
    monitor = agent._monitor_workers

    def _start_workers(self, worker_group):  # type: ignore[no-untyped-def]
        before_start(self)
        return original(self, worker_group)

    def _monitor_workers(self, worker_group):  # type: ignore[no-untyped-def]
        result = monitor(self, worker_group)
        if result.state not in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            return result
        failures = departures(result)
        if not failures:
            return result
        on_departure(failures)
        self._restart_workers(worker_group)
        return RunResult(state=WorkerState.HEALTHY)

    _start_workers._notebook_elastic = True  # type: ignore[attr-defined]
    agent._start_workers = _start_workers
    agent._monitor_workers = _monitor_workers
    return True


# -- the store (torch versions differ) ---------------------------------------------------


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
    the legacy server does (``use_libuv=False``): same protocol, every client works."""
    import torch.distributed as dist

    host, port = sock.getsockname()[:2]
    kwargs: dict[str, Any] = dict(
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=sock.fileno(),
        timeout=timedelta(seconds=timeout_s),
    )
    if not libuv_store_takes_listen_fd():
        kwargs["use_libuv"] = False
    try:
        return dist.TCPStore(host, port, **kwargs)
    except NotImplementedError:
        if kwargs.get("use_libuv") is False:
            raise
        # A build whose libuv server still refuses the fd (a backport without the support).
        return dist.TCPStore(host, port, **kwargs, use_libuv=False)

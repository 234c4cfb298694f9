"""The agent's link to its rendezvous store: every call under a deadline, and a store that was
lost (replaced, or frozen) regained.

torch's TCPStore client never reconnects: once its server is gone, every call raises
DistNetworkError at once, even when a new server serves at the same address (measured on
2.13). torchrun's agent then fails on its next rendezvous sync (RendezvousConnectionError
from num_nodes_waiting) and exits: a store pod that Kubernetes replaced would end every
agent. So the rendezvous backend reconnects: on a failed call it opens a new client to the
same endpoint (waiting up to the store's timeout for the replacement to serve), and when the
store there is another one (``STORE_ID_KEY`` differs, or the rendezvous state is gone) it
seeds an empty round numbered after the last one (rounds fence checkpoint writes, so they
must not start over at 0) and says so; the agent then re-forms its round on it.

A store that freezes without resetting the connection (its process stopped, its node cut off)
never fails a call: the client waits for its reply far past its own timeout (agent/deadline.py).
So every call of the backend has a deadline, and one that passes it is a lost connection.
Where the store cannot be replaced (the local supervisor's own: it dies with its agents), only
the same store answering again is waited for; a store that went (a reset) ends the agent at once.

torchrun's agent also calls the store outside the rendezvous backend, on the round's PrefixStore
over the same client (``DynamicRendezvousHandler._get_store``): the bootstrap address exchange
at the end of ``next_rendezvous``, rank assignment (``_assign_worker_ranks``: set, multi_get,
multi_set, get) and the exit barrier (``store_util.barrier``: add, set, wait). Those calls get
the same deadline. One without a reply while the agent forms its group (``_rendezvous``) is a
lost store: it is regained as above and the agent rendezvouses again (the keys it was waiting
for are on a store that may be gone), spending no restart. At the exit barrier torch logs the
error and the agent ends with its workers' result: they are done, and a silent store is a
reason to stop waiting for the other nodes, not to wait longer.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..contract.protocol import STORE_ID_KEY, TARGET_KEY
from ..plumbing import log as _logging
from .deadline import StoreSilent, call_with_deadline
from .torch_adapter import rendezvous_store

if TYPE_CHECKING:
    from torch.distributed import Store

    from ..plumbing.store_client import KeyStore

_log = _logging.get("agent.store_link")


def read_key(store: KeyStore, key: str) -> bytes | None:
    """What ``key`` holds in ``store``, or None when it is not set (a get alone would wait)."""
    return store.get(key) if store.check([key]) else None


def target_nodes(store: KeyStore | None) -> tuple[int, bool] | None:
    """The nodes a round closes at once with (``TARGET_KEY``), or None: the job's target
    (``"3"``: that many), or, while survivors of a departure regroup, those survivors
    (``"2+"``: at least that many; a joiner still starting comes in a change of its own)."""
    if store is None:
        return None
    try:
        value = read_key(store, TARGET_KEY)
        return None if value is None else parse_target(value.decode())
    except Exception:
        _log.debug("a store lost meanwhile: the rendezvous says so on its own next call", exc_info=True)
        return None


def parse_target(text: str) -> tuple[int, bool]:
    """``TARGET_KEY``'s value: ``"3"`` -> (3, False), exactly; ``"2+"`` -> (2, True), at least."""
    return int(text.rstrip("+")), text.endswith("+")


def holds_target(held: int, target: tuple[int, bool] | None) -> bool:
    """Whether a round of ``held`` nodes holds the target ``target_nodes`` read."""
    return target is not None and (held >= target[0] if target[1] else held == target[0])


#: A rendezvous store call is a round trip of a few hundred bytes; one without a reply after
#: this long, even on a loaded node, is a store that does not answer.
STORE_CALL_TIMEOUT_S = 15.0


def store_id(store: KeyStore) -> str | None:
    """The id our store server put in the store, or None (another server, or none).
    ``StoreSilent`` when the store does not answer."""

    def read() -> str | None:
        value = read_key(store, STORE_ID_KEY)
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
    # ``store``: torch's TCPStore client (its host, port and timeout: the last not in torch's stub).
    where = f"The rendezvous store at {store.host}:{store.port}"
    how = f"stopped answering (no reply in {STORE_CALL_TIMEOUT_S:g} s)" if silent else "closed its connection"
    back = "no store answered there" if replaceable else "it did not answer again"
    return (
        f"{where} {how} and {back} within {store.timeout.total_seconds():g} s: its process is stopped or gone, "
        "or its machine is unreachable."
    )


class StoreLink:
    """How this agent answers a lost store, and whether its node is leaving: one per agent
    process (``agent/run.py`` makes it), held by each rendezvous backend of ours made for it
    (``rendezvous_backend``) and passed to what the agent calls on its store (``BoundedStore``).
    Until ``recover_lost_stores``, the backend calls the store as torch's does."""

    def __init__(self) -> None:
        self.last_round: Callable[[], int | None] = lambda: None
        self.on_replaced: Callable[[int], None] = lambda _round: None
        self.replaceable = False
        self.hooked = False  # until recover_lost_stores: our backend calls the store as torch's does
        self.leaving = threading.Event()  # this node is leaving: a lost store is not waited for
        # While the agent assigns a round's ranks (``ranking`` set): whether that round lost a
        # member; a wait on the round's store then ends (``RoundLostMember``).
        self.member_gone: Callable[[], bool] = lambda: False
        self.ranking = threading.Event()
        self.reconnecting = threading.Lock()  # one thread regains the store; the others find it regained

    def recover_lost_stores(
        self, last_round: Callable[[], int | None], on_replaced: Callable[[int], None], replaceable: bool
    ) -> bool:
        """Our rendezvous backend's calls (``rendezvous_backend``) get a deadline and survive the
        store's loss (``hook_store_reconnect`` says how); False when this torch lacks what it takes."""
        try:
            from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as cb
        except ImportError:
            return False
        if not hasattr(cb.C10dRendezvousBackend, "_call_store"):
            return False
        self.last_round, self.on_replaced, self.replaceable = last_round, on_replaced, replaceable
        self.hooked = True
        return True

    def mark_leaving(self) -> None:
        """This node is leaving: a store lost from now on is not waited for."""
        self.leaving.set()


def rendezvous_backend(store: Store, run_id: str, link: StoreLink) -> Any:
    """torch's c10d rendezvous backend on ``store``, as our handler uses it: once ``link``'s
    ``recover_lost_stores`` ran, each call has a deadline and survives the store's loss."""
    return _backend_class()(store, run_id, link)


# Our subclass of torch's class, made at its first use (torch imported by then); a cache, not a
# registry: the class holds nothing, each backend its link.
@functools.cache
def _backend_class() -> type:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    class NotebookBackend(C10dRendezvousBackend):
        def __init__(self, store: Store, run_id: str, link: StoreLink) -> None:
            self._ne_link = link
            self._ne_store_id: str | None = None
            self._ne_replacements = 0  # stores found replaced (``replacements``)
            self._ne_id_read = False  # the store's id is read at the first call
            self._ne_given_up: Any = None  # the client a lost store was waited for once already
            super().__init__(store, run_id)

        def _bounded(self, store_op: Any, *args: Any, **kwargs: Any) -> Any:
            call = super()._call_store
            return call_with_deadline(call, STORE_CALL_TIMEOUT_S, store_op, *args, **kwargs)

        def _call_store(self, store_op: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._ne_link.hooked:
                return super()._call_store(store_op, *args, **kwargs)  # as torch's own
            failed = self._store
            try:
                if not self._ne_id_read:
                    self._ne_store_id, self._ne_id_read = store_id(failed), True
                return self._bounded(store_op, *args, **kwargs)
            except StoreSilent:
                silent = True
            except RendezvousConnectionError as exc:
                if not isinstance(exc.__cause__, getattr(dist, "DistNetworkError", RuntimeError)):
                    raise  # a timeout or a bad request, not a lost connection
                if not self._ne_link.replaceable:
                    raise  # the supervisor's store went with the supervisor, and its agents go too
                silent = False
            regain_store(self, failed, silent)
            try:
                return self._bounded(store_op, *args, **kwargs)
            except StoreSilent as exc:
                raise RendezvousConnectionError(_store_gone(self._store, True, self._ne_link.replaceable)) from exc

    return NotebookBackend


def regain_store(backend: Any, failed: Any, silent: bool) -> None:
    """After a call on ``failed`` (the backend's store client) got no reply (``silent``) or found
    its connection closed: wait for the store there to answer again, or (replaceable) for a
    replacement, and give the backend a client of it (as its link says: ``StoreLink``). ``RendezvousConnectionError``, in one
    sentence, when none answers within the store's timeout or this node is leaving."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    link: StoreLink = backend._ne_link
    replaceable = link.replaceable
    if link.leaving.is_set():
        how = "stopped answering" if silent else "closed its connection"
        raise RendezvousConnectionError(f"The rendezvous store {how}; this node is leaving, so not waiting for it.")
    with link.reconnecting:
        if getattr(backend, "_ne_given_up", None) is failed:  # waited for once already: not again
            raise RendezvousConnectionError(_store_gone(failed, silent, replaceable))
        if backend._store is failed:  # no other thread has reconnected meanwhile
            try:
                _reconnect(backend, failed, link)
            except (ValueError, RuntimeError, TimeoutError) as exc:
                backend._ne_given_up = failed
                raise RendezvousConnectionError(_store_gone(failed, silent, replaceable)) from exc


#: Between two checks of a key a store wait is polling for: from the first, doubling to the
#: most. A round's ranks are assigned through such waits (torch's ``_assign_worker_ranks``: every
#: agent waits for what group rank 0 writes, which it writes once it read every agent's part):
#: from 10 ms, a rank other than 0 took 0.02 to 0.03 s more than rank 0 to learn its ranks, on
#: every change, where the key was there a millisecond after its first check.
STORE_POLL_FIRST_S = 0.002
STORE_POLL_MAX_S = 0.5
#: While a round's ranks are assigned, how often a wait on the round's store looks whether a
#: member left the round (a read of the round's state).
MEMBER_LOOK_S = 1.0


class RoundLostMember(RuntimeError):
    """A member of the round whose ranks are being assigned left it meanwhile (stopped right
    after the round formed, before it wrote its part): what the wait waits for never comes. The
    agent rendezvouses again (``NotebookAgent._rendezvous``) instead of waiting for the wait's
    bound (60 s) and failing: an evicted joiner's agent so failed the node that stayed."""


class AgentStoreLost(ConnectionError):
    """A call of torchrun's agent on its store got no reply by the deadline, or (``silent``
    False) found the connection closed."""

    def __init__(self, message: str, client: Any, silent: bool) -> None:
        super().__init__(message)
        self.client, self.silent = client, silent


class BoundedStore:
    """The agent's store (the round's PrefixStore over ``client``), each call under the deadline.
    A call that waits for a key (``get``, ``multi_get``, ``wait``) waits as checks, each a round
    trip under the deadline, for as long as the store's timeout allows: a peer slow to write
    the key is waited for, a store that does not answer is not (the exit barrier waits
    ``exit_barrier_timeout`` for the slowest node: a deadline per call, not per barrier)."""

    def __init__(self, store: Any, client: Any, link: StoreLink) -> None:
        # ``store``: torch's PrefixStore (its ``timeout``, not in torch's stub, is read below).
        self._ne_store, self._ne_client, self._ne_link = store, client, link
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
            if not self._ne_link.replaceable:
                raise  # the supervisor's store went with the supervisor
            raise AgentStoreLost(str(exc), self._ne_client, silent=False) from exc

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        import torch.distributed as dist

        limit_s = (timeout or self.timeout).total_seconds()
        end, pause = time.monotonic() + limit_s, STORE_POLL_FIRST_S
        look_at = time.monotonic() + MEMBER_LOOK_S
        while not self._call(self._ne_store.check, list(keys)):
            if time.monotonic() >= end:
                raise dist.DistStoreError(f"wait timeout after {limit_s * 1000:.0f}ms, keys: {list(keys)}")
            if self._ne_link.ranking.is_set() and time.monotonic() >= look_at:
                look_at = time.monotonic() + MEMBER_LOOK_S
                if self._ne_link.member_gone():
                    raise RoundLostMember(
                        f"a member left the round while its ranks were assigned (waiting for {list(keys)})"
                    )
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


RECONNECT_ATTEMPT_S = 5.0


def _reconnect(backend: Any, failed: Any, link: StoreLink) -> None:
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
    replaceable = link.replaceable
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
            if time.monotonic() >= deadline or link.leaving.is_set():
                raise
            time.sleep(0.5)
    replaced = new_id != getattr(backend, "_ne_store_id", None) or (new_id is None and current == sentinel.encode())
    backend._store, backend._ne_store_id = store, new_id
    if not replaced or not replaceable:
        return  # the same store, reached again
    if current == sentinel.encode():
        state = _RendezvousState()
        state.round = (link.last_round() or 0) + 1
        seed = b64encode(pickle.dumps(state)).decode()
        call_with_deadline(store.compare_set, STORE_CALL_TIMEOUT_S, backend._key, sentinel, seed)
    won = call_with_deadline(store.get, STORE_CALL_TIMEOUT_S, backend._key)
    seeded = pickle.loads(b64decode(won)).round if won != sentinel.encode() else 0
    backend._ne_replacements = getattr(backend, "_ne_replacements", 0) + 1
    link.on_replaced(seeded)


def replacements(handler: Any) -> int:
    """How many times the handler's rendezvous backend found its store replaced by another (a
    store pod Kubernetes replaced): a client of the same store reached again (a partition
    healed) is not one. 0 for a backend not ours."""
    backend = getattr(getattr(handler, "_state_holder", None), "_backend", None)
    return int(getattr(backend, "_ne_replacements", 0))


def follow_replaced_store(handler: Any) -> None:
    """The handler keeps its own reference to the store (for the round's PrefixStore): the
    backend's, which a reconnection replaced."""
    store = rendezvous_store(handler)
    if store is not None and getattr(handler, "_store", None) is not store:
        handler._store = store

"""A wait the store answers when this node's round changes, instead of looks at it (#40 item 2,
#41 item 8).

torch's agent looks for a change of its round (a node waiting to join, a member gone) once a
monitor interval, after its wait; a local job's agents also looked at the round's change counter
every ``JOIN_LOOK_S`` while they waited. Either way a change waited for the next look (0.03 s on
average on this machine, up to the interval elsewhere) and every idle agent kept asking.

Here one thread per agent holds a WAIT on the store, on its own connection: a WAIT for the key a
writer of ours sets when it moves the round's change counter to the next count
(``protocol.mark_key``). The store answers it the moment the key is set; the thread then wakes
the monitor (``on_change``), whose look, next, reads the round. The monitor arms the watch once
a wait, with the round it is in, the count it read last and the store client the agent reaches
the round through (``arm``). A watch armed for another round, or for a replaced store, cuts its
thread's WAIT (it shuts that connection) and waits anew on a new connection: a WAIT left on the
old store (a replaced store pod still serving while it terminates) would never be answered.
While its WAIT is not under way, the state holder looks at the counter as before. The thread
waits at most ``WAIT_S`` a call, on a connection of its own in plain Python, and ends with the
agent (a daemon thread). Where the watch cannot run (no store address, a connection refused
``GIVE_UP_AFTER`` times in a row), the monitor looks as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..contract import protocol
from ..plumbing import log as _logging
from .torch_adapter import holder_store

_log = _logging.get("agent.change_watch")

#: The longest one WAIT lasts before the thread asks again on a new connection (an idle round
#: costs a connection and one call this often).
WAIT_S = 300.0
#: How long a connection to the store may take.
CONNECT_S = 10.0
#: A connection that failed this many times in a row ends the watch: the monitor looks instead.
GIVE_UP_AFTER = 5
#: The pause after a failed connection or call, before the next try.
RETRY_S = 1.0


def connect(address: tuple[str, int], timeout_s: float) -> Any:
    """A store client of the watch's own (a WAIT holds the connection it is sent on until it is
    answered), in plain Python: a thread blocked in torch's C++ client when its connection
    closed at the process's end took the process down (std::terminate)."""
    from ..plumbing.store_client import StoreClient

    host, port = address
    return StoreClient(f"{host}:{port}", timeout_s)


class ChangeWatch:
    """The thread that waits on the store for the key of the next change of this node's round,
    and calls ``on_change`` when the store answers."""

    def __init__(
        self,
        on_change: Callable[[], None],
        connect_to: Callable[[tuple[str, int], float], Any] = connect,
    ) -> None:
        self._on_change = on_change
        self._connect_to = connect_to
        self._cond = threading.Condition()
        self._key: str | None = None  # what the thread should wait for (None: nothing, now)
        self._where: tuple[str, int, int] | None = None  # the store's host, port and client's id
        self._stale: Callable[[], None] = lambda: None
        self._waiting_on: str | None = None  # what its WAIT is on now, on this client
        self._client: Any = None
        self._answered: str | None = None  # the key last answered: never waited on again
        self._failures = 0
        self._thread: threading.Thread | None = None
        self.given_up = False
        self.woken = 0  # answers the store gave (for the tests and the logs)

    @property
    def active(self) -> bool:
        """Whether the watch stands in for the monitor's looks (armed, its connection not
        failing, not given up)."""
        return not self.given_up and self._key is not None and self._failures == 0

    def watching(self, key: str) -> bool:
        """Whether the thread's WAIT is on ``key`` now (so the store answers when it is set)."""
        return not self.given_up and self._waiting_on == key

    def arm(
        self,
        key: str | None,
        address: tuple[str, int] | None,
        stale: Callable[[], None] = lambda: None,
        store: object = None,
    ) -> None:
        """Wait for ``key`` on the store at ``address`` (reached by the agent through the client
        ``store``) from now on; None: for nothing. When it is set, ``stale()`` (the copy of the
        round is old now), then ``on_change()``. A WAIT on another key (a round left behind) or
        another store (a replacement) is cut: its connection is shut, and the thread takes the
        new one at once on a new connection."""
        if self.given_up:
            return
        if key is not None and key == self._answered:
            key = None  # set, yet the count read since did not move (a round left behind): look instead
        where = None if address is None else (address[0], address[1], id(store))
        with self._cond:
            if key == self._key and where == self._where:
                return
            self._key, self._where, self._stale = key, where, stale
            cut = self._client if self._waiting_on is not None else None
            self._cond.notify_all()
            if self._thread is None and key is not None:
                self._thread = threading.Thread(target=self._run, name="notebook-elastic-change-watch", daemon=True)
                self._thread.start()
        if cut is not None:
            cut.cut()

    def _moved_on(self, key: str, where: tuple[str, int, int]) -> bool:
        return self._key != key or self._where != where

    def _run(self) -> None:
        client: Any = None
        client_where: tuple[str, int, int] | None = None
        while True:
            with self._cond:
                while self._key is None or self._where is None:
                    self._cond.wait()
                key, where, stale = self._key, self._where, self._stale
            try:
                if client is None or client_where != where:
                    if client is not None:
                        client.close()
                    client, client_where = None, None
                    client = self._connect_to((where[0], where[1]), CONNECT_S)
                    client_where = where
                with self._cond:
                    if self._moved_on(key, where):
                        continue
                    self._client, self._waiting_on = client, key
                answered = client.wait([key], WAIT_S)
            except Exception:
                with self._cond:
                    self._client = self._waiting_on = None
                    cut = self._moved_on(key, where)
                if client is not None:
                    client.close()
                client, client_where = None, None
                if cut:
                    continue  # cut by arm(): another round or store, not a failure
                self._failures += 1
                _log.debug("the change watch's store call failed (%d in a row)", self._failures, exc_info=True)
                if self._failures >= GIVE_UP_AFTER:
                    with self._cond:
                        self.given_up = True
                        self._key = None
                    _log.info(
                        "the change watch gave up after %d failed store calls: the monitor looks instead",
                        self._failures,
                    )
                    return
                time.sleep(RETRY_S)
                continue
            self._failures = 0
            with self._cond:
                self._client = self._waiting_on = None
                if not answered:
                    client, client_where = None, None  # ran its time (its connection closed): again
                    continue
                if self._moved_on(key, where):
                    continue  # answered as it was cut: the new key is waited for instead
                self._key, self._answered = None, key  # the monitor arms the next one after its look
            self.woken += 1
            stale()
            self._on_change()


def next_mark(handler: Any, watch: ChangeWatch) -> None:
    """Arm ``watch`` for the next change of the round ``handler`` (ours, ``NotebookRendezvous``)
    is in, where that round is complete and its change counter is ours to read (``rules.regroup``);
    else disarm it. Reads the counter (one small call) only when the round is new to it."""
    holder = getattr(getattr(handler, "torch_handler", None), "_state_holder", None)
    sayings = getattr(holder, "_ne_sayings", None)
    store = holder_store(holder)
    rules = getattr(holder, "_ne_rules", None)
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if holder is None or sayings is None or store is None or rules is None or not rules.regroup or not host or not port:
        watch.arm(None, None)
        return
    round_, complete = holder._ne_seen[:2]
    if complete and holder._ne_changes[0] != round_:
        holder.look_now()  # this round's count, read once
    if not complete or holder._ne_changes[0] != round_:
        watch.arm(None, None)
        return
    key = _next_mark(holder, sayings)
    # Once answered, torch's next sync reads the store (its _last_sync_time, as rounds.py's look does).
    watch.arm(key, (str(host), int(port)), lambda: _stale(holder), store)
    holder._ne_watch = watch  # its own look at the counter is not needed while the watch waits


def watches(holder: Any) -> bool:
    """Whether the agent's change watch waits for the next count of the round ``holder`` (our
    state holder) read last: the store answers it when the counter moves, so the holder need not
    look at the counter between its reads of the round."""
    watch, sayings = getattr(holder, "_ne_watch", None), getattr(holder, "_ne_sayings", None)
    if watch is None or sayings is None or holder._ne_changes[0] != holder._ne_seen[0]:
        return False
    return bool(watch.watching(_next_mark(holder, sayings)))


def _next_mark(holder: Any, sayings: Any) -> str:
    """The mark of the next count of the round whose change counter ``holder`` read last."""
    round_, count = holder._ne_changes[:2]
    return protocol.mark_key(protocol.signal_key(sayings.state_key, round_, protocol.CHANGED), count + 1)


def _stale(holder: Any) -> None:
    holder._last_sync_time = -1

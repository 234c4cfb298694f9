"""A worker's process group in place (runtime/inplace.py): formed from an ``Assignment`` over
the rendezvous store under its round's key prefix, and abortable, which gloo is not by itself.

Worker-side module: the standard library, and torch once a group is formed.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..contract import protocol
from ..plumbing import log as _logging

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore
    from .inplace import Assignment

_log = _logging.get("runtime.group")

#: How long torch's forming of a group may take once every member is up (``protocol.ready_key``):
#: the exchange of addresses and gloo's full-mesh connect, milliseconds when all is well. A
#: member lost in that window (its address published, its connections not made) held the others
#: in gloo's ``Pair::waitUntilConnected`` for the whole collective timeout, where no abort reaches
#: (there is no socket to shut down yet). The group's collectives then get the collective timeout.
FORMING_BOUND_S = 10.0
#: The oldest torch shown here whose gloo group takes a new collective timeout once formed
#: (pytorch#165422: before its fix the bound stayed the collectives' timeout; 2.4 keeps it, 2.13
#: and 2.15 do not: tests/test_group.py on both ends of the range). Older torches form
#: unbounded, as before (docs/guide/in-place.md says so).
BOUNDED_FORMING_SINCE = (2, 13)


class Superseded(RuntimeError):
    """A group not formed: its agent formed a newer round before this one began to form."""


#: An open socket of this process: its descriptor, and what /proc names it by ("socket:[inode]").
Socket = tuple[int, str]


def _socket_fds() -> set[Socket]:
    """This process's open sockets. A descriptor closed and opened again for another socket is
    another socket here: the old group's sockets, which torch closes as it lets that group go,
    may be closed while the next group forms, and their numbers taken by its connections (a
    group told by numbers alone then left those out: its abort did not reach them, and a peer
    waiting on them hung for the collective timeout, 120 s)."""
    found: set[Socket] = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith("socket:"):
                found.add((int(name), target))
        except (OSError, ValueError):
            continue
    return found


def forming_is_bounded() -> bool:
    """Whether this torch's groups form within ``FORMING_BOUND_S``."""
    import torch

    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= BOUNDED_FORMING_SINCE


def _set_collective_timeout(timeout: timedelta) -> None:
    """The default group's collective timeout, set after it formed: ``dist.set_timeout`` where
    torch has it (2.12 on), its earlier private name before (every torch of the range)."""
    import torch.distributed as dist

    set_timeout = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    set_timeout(timeout)


class Group:
    """The worker's default process group, formed from an ``Assignment`` over the rendezvous
    store, and abortable: gloo has no abort (pytorch#130345), so ``abort`` shuts down the
    sockets the group opened. A collective waiting on them fails at once, and so do its peers'
    (their sockets close), instead of waiting for the group's timeout; NCCL's communicators are
    aborted through torch."""

    def __init__(self) -> None:
        self.assignment: Assignment | None = None
        self.backend = ""
        self._fds: set[Socket] = set()
        self._store: Any = None  # the TCPStore client to the rendezvous store (kept across groups)
        self._store_at = ""
        self._store_fds: set[Socket] = set()  # its connection
        self._forming: set[Socket] | None = None  # while a group forms: the sockets open before it
        self._lock = threading.Lock()
        self.aborted = False
        self.unabortable: str | None = None  # why an abort failed: this worker restarts instead
        self._newest = -1  # the newest round its agent formed, as told (``superseded_by``)

    def open(self, assignment: Assignment, backend: str, timeout_s: float) -> None:
        """Form the group ``assignment`` names (a collective with its other ranks). First every
        member counts itself up in the store and waits for the others (``protocol.ready_key``),
        which an ``abort`` cuts short (a member went before it came: its store connection is
        shut); then torch forms the group within ``FORMING_BOUND_S``, and its collectives get
        ``timeout_s``. Raises where it does not form; the store connection is made again for the
        next one."""
        import torch.distributed as dist

        with self._lock:
            if self._newest > assignment.round:
                # Told of a newer round between taking this one and forming it (the joiner that
                # failed left again): its members went on to that one, so this one never forms.
                raise Superseded(f"round {self._newest} was formed before round {assignment.round} formed")
            self.aborted = False
            before = _socket_fds()
            # A replaced store serves at the same address: the old connection leads nowhere.
            if self._store is None or self._store_at != assignment.store or assignment.reason == "store":
                host, _, port = assignment.store.rpartition(":")
                self._store = dist.TCPStore(
                    host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
                )
                self._store_at = assignment.store
                self._store_fds = _socket_fds() - before
            raw = self._store
            store = dist.PrefixStore(assignment.prefix, raw)
            self._forming = _socket_fds()
            self.assignment = assignment
        _first_group_name()
        forming_s = min(timeout_s, FORMING_BOUND_S) if forming_is_bounded() else timeout_s
        try:
            self._all_up(raw, assignment)
            dist.init_process_group(
                backend,
                store=store,
                rank=assignment.rank,
                world_size=assignment.world_size,
                timeout=timedelta(seconds=forming_s),
            )
            if forming_s < timeout_s:
                _set_collective_timeout(timedelta(seconds=timeout_s))
        except BaseException:
            with self._lock:
                self._forming = None
                self.assignment = None
                self._store, self._store_at = None, ""  # its connection may be the one aborted
            raise
        with self._lock:
            self._fds = _socket_fds() - self._forming
            self._forming = None
            self.backend = str(dist.get_backend())

    @staticmethod
    def _all_up(store: KeyStore, assignment: Assignment) -> None:
        """Count this worker up among its group's members and wait (an ``abort`` or the store's
        timeout ends the wait) until all of them are."""
        ready, everyone = protocol.ready_key(assignment.prefix), protocol.all_ready_key(assignment.prefix)
        if int(store.add(ready, 1)) >= assignment.world_size:
            store.set(everyone, "1")
        store.wait([everyone])

    def abort(self) -> None:
        """Fail every collective of this group now, here and (through the closed sockets) at its
        peers. Safe from any thread, any number of times."""
        with self._lock:
            if self.aborted or self.assignment is None:
                return
            self.aborted = True
            if self._forming is not None:
                # Still forming: its store waits, and the connections made so far.
                fds = self._store_fds | (_socket_fds() - self._forming)
                backend = ""
            else:
                fds = set(self._fds)
                backend = self.backend
        if backend == "nccl" and not _abort_nccl():
            # Its collectives end at the group's timeout, in a state not to build on: restart.
            self.unabortable = "the NCCL group could not be aborted (its collectives end at its timeout)"
        for fd, name in fds:
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != name:
                    continue  # closed meanwhile, and the number taken by another socket
                with socket.socket(fileno=os.dup(fd)) as s:
                    # Not its listener: gloo's loop aborts the process when accept() fails.
                    if not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                        s.shutdown(socket.SHUT_RDWR)
            except OSError:
                continue  # closed meanwhile, or not a connected socket any more

    @property
    def newest_round(self) -> int:
        """The newest round its agent formed, as told (-1: none told yet)."""
        with self._lock:
            return self._newest

    def superseded_by(self, assignment: Assignment) -> None:
        """A newer round was formed (another node joined or left meanwhile): its members went on
        to it. One still forming is given up (aborted); one taken but not begun is not formed
        (``open`` raises ``Superseded``: a joiner that failed and left as the kept worker took
        its round held that worker in the round's wait for all, 120 s, in a CI run)."""
        with self._lock:
            self._newest = max(self._newest, assignment.round)
            forming = self._forming is not None and self.assignment is not None
            older = forming and self.assignment is not None and self.assignment.round < assignment.round
        if older:
            self.abort()

    def close(self) -> None:
        """Destroy the (aborted) group, so that a new one can be made. A gloo group's own end
        (its C++ object's, which joins its threads: 5 to 30 ms on 2 cores, 9 of a scale-down's 57
        ms in place) comes when its last holder lets it go, the ended body's DDP model, as the
        body runs again: ``_retire`` takes it off that way."""
        import torch.distributed as dist

        if dist.is_initialized():
            old = dist.group.WORLD if self.backend == "gloo" else None
            try:
                dist.destroy_process_group()
            except Exception:
                _log.debug("the broken group could not be destroyed cleanly", exc_info=True)
            if old is not None:
                _retire([old])
        with self._lock:
            self._fds = set()
            self.assignment = None


#: How long a retired group's reaper waits for the last of the cell's objects that hold it (the
#: ended body's, let go as the body runs again); past it, whoever lets it go last ends it.
RETIRE_WAIT_S = 60.0


def _retire(held: list[Any]) -> None:
    """End the group ``held`` holds (its one item) on a thread of its own, once nothing else
    holds it: its destructor then waits for gloo's threads there, the GIL let go (measured: the
    main thread ran on meanwhile), not on the new group's way to its first step."""

    def reap() -> None:
        deadline, pause = time.monotonic() + RETIRE_WAIT_S, 0.005
        while sys.getrefcount(held[0]) > 2 and time.monotonic() < deadline:  # 2: the list's, the call's
            time.sleep(pause)
            pause = min(2 * pause, 0.5)
        held.clear()

    threading.Thread(target=reap, name="notebook-elastic-retired-group", daemon=True).start()


def _first_group_name() -> None:
    """The group about to form takes the name a fresh process's first group takes. torch names
    each group by a per-process count (``distributed_c10d._world.group_count``, in the keys its
    ranks meet under) that destroying the default group sets back to 0, but a group that failed
    to form leaves counted: a kept worker whose first try was aborted (a member left before the
    group formed) named its next group "1" while the new ranks named theirs "0", and they never
    met. No other group lives here now (a cell's own groups make a worker restart instead)."""
    import torch.distributed.distributed_c10d as c10d

    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(type(world), "group_count"):
        world.group_count = 0


def _abort_nccl() -> bool:
    """NCCL's communicators of the default group, aborted (torch >= 2.6 has the call; before,
    the process group's own abort); a collective that hangs on a lost peer returns. False where
    the abort failed."""
    try:
        import torch.distributed.distributed_c10d as c10d

        abort = getattr(c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
            return True
        pg: Any = c10d._get_default_group()
        backend = pg._get_backend(c10d.torch.device("cuda"))
        backend.abort()
        return True
    except Exception:
        _log.warning("the NCCL group could not be aborted: its collectives end at its timeout", exc_info=True)
        return False


def nccl_abort_missing() -> str | None:
    """Why a hung NCCL collective could not be aborted here (None: it can). Without an abort a
    collective waiting on a lost peer ends only at the group's timeout, and NCCL's state after a
    timeout is not one to build on: the workers restart instead."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    if getattr(c10d, "_abort_process_group", None) is not None:
        return None
    nccl = getattr(torch.distributed, "ProcessGroupNCCL", None)
    if nccl is not None and callable(getattr(nccl, "abort", None)):
        return None
    return (
        f"torch {torch.__version__} cannot abort a hung NCCL collective "
        "(torch >= 2.6 has _abort_process_group, earlier ProcessGroupNCCL.abort)"
    )

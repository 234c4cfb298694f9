"""The agent's side of in place: its workers keep their processes when the job's members change.

torchrun's agent stops and starts every worker at every change of members (a node joins or
leaves). Ours (``notebook_agent.NotebookAgent``) asks ``InPlace.restart`` first: when each of its
workers is linked (``runtime/inplace.py``) and says it can stay, the agent only rendezvouses
(torch's own round: the same members, ranks and world size a restart would get), and sends each
worker its place in the new group instead of a new process. A worker that cannot stay, or a
worker that failed, makes the node restart as torchrun would (charged as torchrun charges it);
its new workers join the others' new group and take the live values from them.

- A node that joins (a scale-up, a replacement) starts fresh workers: the kept ones train on in
  their old group until those are up and forming the new group (each counts itself up in the
  store), so a joiner's process start is not time the others stand still.
- A departure seen by the watch (``departures.py``) no longer ends the workers: they are told to
  abort their group (a collective waiting on a peer on a lost host fails at once), and the agent
  regroups in place.
- A node that goes on purpose (SIGTERM: a scale-down, a preemption, a stop) tells its workers to
  leave at the next step boundary the group agrees on (the vote before each optimizer step), so
  no step is lost, and leaves its round first, so the survivors form theirs meanwhile. Workers
  that do not reach a boundary in time are told to abort, then stopped as torchrun stops them.

The link: an abstract Unix socket (no file to leave behind) whose name and token reach the
workers through their environment; a connection without the token, or from another user
(``SO_PEERCRED``), is closed unheard.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..contract import protocol
from ..contract.event_types import InPlaceRefused, Kind, LeftAtBoundary, Regrouped
from ..plumbing import log as _logging
from ..plumbing.procfs import is_stopped
from ..runtime import term
from ..runtime._emit import emit
from ..runtime.group import forming_is_bounded
from .deadline import call_with_deadline
from .fatal import STORE_CALL_S, FatalEnd

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore

_log = _logging.get("agent.inplace")

#: Why a healthy group regroups when the others went on without this node: its workers restart.
LEFT_OUT = "left_out"
#: How long a node that goes waits for its workers to leave at a step boundary (within the
#: supervisor's stop grace, 10 s) before it tells them to abort (a step longer than this costs
#: the survivors that step, redone).
LEAVE_AT_BOUNDARY_S = 6.0
#: After an abort, how long it waits for them to exit before torch's shutdown stops them.
LEAVE_AFTER_ABORT_S = 2.0
#: While a worker's group is broken (a peer died) and the round does not show the member gone
#: yet, the agent looks this often (a look reads the round's state, at most this old).
LOST_LOOK_S = 0.02
#: ... for this long after the word (a member that never goes: a failed worker's node restarts
#: in the round; its new workers join as a new round, which the agent forms anyway).
LOST_LOOKS_FOR_S = 5.0
#: How long kept workers train on in their old group while a joiner's workers start (their
#: process, the script's imports) before they are told the new group anyway (a joiner that
#: never gets going is then waited for in the new group, as before, up to its timeout).
FRESH_READY_WAIT_S = 30.0
#: How often the agent reads the joiners' count meanwhile: at first, then doubling up to a bound
#: that grows with the job (every kept node reads: at 1,024 nodes, some 5,000 reads a second in
#: all), so a small job sees its joiner up within 10 ms.
FRESH_LOOK_S = 0.005
FRESH_LOOKS_A_SECOND_IN_ALL = 5000.0
FRESH_LOOK_MOST_S = (0.01, 0.25)
#: How long a worker found stopped at a change must stay stopped before its node restarts it: a
#: node thawed process by process (its agent first) saw its worker still stopped and killed it
#: (a fresh-clone CI run of the thawed-node test); a worker that goes on within this is kept.
STOPPED_FOR_S = 1.0


@dataclass
class _Worker:
    local_rank: int
    pid: int  # the process that linked (under the warm pool, the fork behind torchrun's launcher)
    conn: socket.socket
    capable: bool = False
    why: str = "the cell keeps no elastic.State (it has made none, so holds nothing to keep)"
    progressed: bool = False  # it has reported a step (a restart of it is worth a sentence)
    said: bool = False  # it said whether it can stay
    open: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, message: dict[str, Any]) -> bool:
        data = (json.dumps(message) + "\n").encode()
        with self.lock:
            try:
                self.conn.sendall(data)
                return True
            except OSError:
                self.open = False
                return False


class Links:
    """The agent's end of its workers' links."""

    def __init__(
        self,
        on_lost: Callable[[], None] = lambda: None,
        on_boundary: Callable[[], None] = lambda: None,
        on_fatal: Callable[[], None] = lambda: None,
    ) -> None:
        self._on_lost = on_lost  # a worker said its group broke: look for a departure now
        self._on_boundary = on_boundary  # a worker left its group at a boundary the group agreed on
        self._on_fatal = on_fatal  # a worker fails in a way no retry mends: the job ends
        self.token = secrets.token_hex(16)
        self.name = f"notebook-elastic-agent-{os.getpid()}-{secrets.token_hex(6)}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + self.name)
        self._sock.listen(64)
        self._workers: dict[int, _Worker] = {}  # by local rank: the newest link of each
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)  # a worker said something, or went
        threading.Thread(target=self._accept, name="notebook-elastic-links", daemon=True).start()

    def env(self) -> dict[str, str]:
        return {protocol.ENV_AGENT_LINK: self.name, protocol.ENV_AGENT_TOKEN: self.token}

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                time.sleep(0.1)  # out of descriptors: try again, never spin
                continue
            threading.Thread(target=self._serve, args=(conn,), name="notebook-elastic-link", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer_pid, peer_uid, _gid = struct.unpack("3i", creds)
        reader = conn.makefile("rb")
        worker: _Worker | None = None
        try:
            conn.settimeout(10.0)
            hello = json.loads(reader.readline() or b"{}")
            if peer_uid != os.getuid() or not secrets.compare_digest(str(hello.get("token", "")), self.token):
                _log.warning("a link from pid %s (uid %s) without the agent's token: closed", peer_pid, peer_uid)
                return
            conn.settimeout(None)
            worker = _Worker(int(hello.get("local_rank", -1)), peer_pid, conn)
            with self._lock:
                self._workers[worker.local_rank] = worker
                self.changed.notify_all()
            for line in reader:
                message = json.loads(line)
                with self._lock:
                    self._said(worker, message)
                    self.changed.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            reader.close()
            conn.close()
            if worker is not None:
                with self._lock:
                    worker.open = False
                    self.changed.notify_all()

    def _said(self, worker: _Worker, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "capable":
            worker.capable, worker.why = bool(message.get("capable")), str(message.get("why") or "")
            worker.said = True
        elif op == "progress":
            worker.progressed = True
        elif op == "lost":  # its group broke: it waits for the next assignment
            self._on_lost()
        elif op == "boundary":  # it left its group at a boundary (a member that goes voted for it)
            self._on_boundary()
        elif op == "fatal":  # it fails in a way no retry mends (EXIT_FATAL): the job ends
            self._on_fatal()

    def why_not(self, local_ranks: list[int]) -> str | None:
        """Why the workers of these local ranks cannot all stay in place (None: they can)."""
        with self._lock:
            for local_rank in local_ranks:
                worker = self._workers.get(local_rank)
                if worker is not None and worker.said and not worker.capable:
                    return f"local rank {local_rank}'s worker cannot stay: {worker.why}"  # what it said last
                if worker is None or not worker.open:
                    return f"local rank {local_rank}'s worker has no link to its agent"
                if not worker.capable:
                    return f"local rank {local_rank}'s worker cannot stay: {worker.why}"
        return None

    def said_why(self) -> str | None:
        """The first reason a worker gave for not staying in place (None: none did)."""
        with self._lock:
            for local_rank, worker in sorted(self._workers.items()):
                if worker.said and not worker.capable:
                    return f"local rank {local_rank}'s worker cannot stay: {worker.why}"
        return None

    def trained(self) -> bool:
        """Whether any of this agent's workers (now or before) reported a step."""
        with self._lock:
            return any(w.progressed for w in self._workers.values())

    def pids(self, local_ranks: list[int]) -> list[int]:
        with self._lock:
            return [w.pid for r in local_ranks if (w := self._workers.get(r)) is not None]

    def send(self, local_rank: int, message: dict[str, Any]) -> bool:
        with self._lock:
            worker = self._workers.get(local_rank)
        if worker is None:
            return False
        return worker.send(message)

    def stopped(self, local_ranks: list[int], for_s: float = STOPPED_FOR_S) -> list[int]:
        """Those of these local ranks whose worker is stopped (SIGSTOP, a debugger), and stays
        stopped for ``for_s`` (looked at every 50 ms: a worker that goes on meanwhile is not)."""
        with self._lock:
            pids = [(r, w.pid) for r in local_ranks if (w := self._workers.get(r)) is not None and w.open and w.pid]
        still = [(r, pid) for r, pid in pids if is_stopped(pid)]
        deadline = time.monotonic() + for_s
        while still and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            still = [(r, pid) for r, pid in still if is_stopped(pid)]
        return [r for r, _pid in still]

    def why_not_kept(self, local_ranks: list[int]) -> str | None:
        """``why_not``, or one of them is stopped: kept, it held its peer in the old group's last
        collective for gloo's 120 s, which then restarted, charged (an adversary's pass). A node
        that leaves still leaves first (``leave``: killed after the abort's grace)."""
        why = self.why_not(local_ranks)
        if why is None and (stopped := self.stopped(local_ranks)):
            why = (
                f"local rank {stopped[0]}'s worker is stopped (SIGSTOP, or a debugger holds it):"
                " a stopped process cannot take its place in the new group"
            )
        return why

    def kill(self, local_ranks: list[int]) -> list[int]:
        """SIGKILL these local ranks' workers whose links are still open (a worker that can act on
        nothing: stopped, stuck in the kernel); the pids killed. Held by a pidfd opened while
        its link is open (the process is there: its pid is no other's), signalled through it.
        A warm start's worker is the pool's fork, no child of this agent's, and outlives its
        launcher while stopped: torch's shutdown would leave it holding its group's sockets."""
        killed = []
        with self._lock:
            open_now = [(r, w) for r in local_ranks if (w := self._workers.get(r)) is not None and w.open and w.pid]
        for _rank, worker in open_now:
            try:
                pidfd = os.pidfd_open(worker.pid)
            except OSError:
                continue  # gone already
            try:
                if worker.open:  # still its process: the link closes only when it ends
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    killed.append(worker.pid)
            except OSError:
                pass
            finally:
                os.close(pidfd)
        return killed

    def wait_closed(self, local_ranks: list[int], timeout_s: float) -> bool:
        """Wait until these local ranks' links are closed (their processes ended); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                if all(not w.open for r in local_ranks if (w := self._workers.get(r)) is not None):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(timeout=left)


class InPlace:
    """The agent's policy: regroup in place when its workers can, restart when they cannot."""

    def __init__(
        self,
        node: Callable[[], str],
        member_gone: Callable[[], bool] = lambda: False,
        look_now: Callable[[], None] = lambda: None,
        left_on_purpose: Callable[[], bool] = lambda: False,
        fatal: FatalEnd | None = None,
    ) -> None:
        self._node = node
        self.fatal = fatal or FatalEnd()  # the job ends: nothing to restart or regroup for
        self._member_gone = member_gone  # whether the round this node is in has lost a member
        self._look_now = look_now  # the departure watch looks at the round now
        self._left_on_purpose = left_on_purpose  # whether the members gone said they leave
        # Set when the agent has something to look at (a departure seen, a worker's group broke):
        # its monitor, waiting between looks, looks now (wait_for_change).
        self._wake = threading.Event()
        self._lost_at = float("-inf")  # when a worker last said its group broke (monotonic)
        self.links: Links | None = None
        self.regroup = threading.Event()  # a departure was seen: regroup at the next look
        self.regroup_after: int | None = None  # ... of a member of this round (stale once past it)
        self.lost = threading.Event()  # a worker's group broke: a departure is looked for at each look
        self.reason = ""  # why the next round forms ("left", "lost", "joined", "store")
        self.refused_round: int | None = None  # the round whose restart was said (in_place_refused)
        self._members: frozenset[Any] | None = None  # the last round's members (torch's node ids)
        self._newcomers = 0  # how many of them the round before did not have
        self._store: KeyStore | None = None  # the rendezvous store the last round formed on

    def start(self) -> dict[str, str]:
        """Listen for the workers' links; the environment that tells the workers where."""
        if os.environ.get(protocol.ENV_IN_PLACE) == "0":
            return {}
        self.links = Links(on_lost=self._lost, on_boundary=self._look_now, on_fatal=self.fatal.said_by_a_worker)
        return self.links.env()

    def _lost(self) -> None:
        self._lost_at = time.monotonic()
        self.lost.set()
        self._wake.set()

    def wake_monitor(self) -> None:
        """End the monitor's wait now (the round changed: ``change_watch``)."""
        self._wake.set()

    def wait_for_change(self, timeout_s: float) -> bool:
        """The agent's monitor waits between two looks: ``timeout_s``, or until there is something
        to regroup for (a departure seen by the watch, a worker whose group broke), sooner. While
        a worker's group is broken and the round has not yet lost the member (the supervisor's
        word that it died, or its heartbeat, still to come), it looks every ``LOST_LOOK_S``.
        True when the monitor looks now (woken, or at such a look), not at the end of its wait."""
        recent = time.monotonic() - self._lost_at < LOST_LOOKS_FOR_S
        lost = self.lost.is_set() and not self.regroup.is_set() and recent
        if lost:
            timeout_s = min(timeout_s, LOST_LOOK_S)
        woken = self._wake.wait(timeout_s)
        if woken:
            self._wake.clear()
        return woken or lost

    def group_env(self, run_id: str, round_: int | None, store: KeyStore | None) -> dict[str, str]:
        """What a fresh worker of this round needs to form its group as the kept ones do."""
        if self.links is None or round_ is None or store is None:
            return {}
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if not host or not port:
            return {}
        epoch = int(os.environ.get(protocol.ENV_RDZV_EPOCH, 0))
        return {
            protocol.ENV_GROUP_STORE: f"{host}:{port}",
            protocol.ENV_GROUP_PREFIX: protocol.group_prefix(run_id, round_, epoch),
        }

    def formed(self, members: frozenset[Any], store: KeyStore | None) -> None:
        """A round formed with ``members`` on ``store``: how many of them are new (joiners,
        replacements), whose workers start fresh while the kept ones could still train."""
        self._newcomers = len(members - self._members) if self._members is not None else 0
        self._members = members
        self._store = store

    def _await_newcomers(self, prefix: str, expected: int, nodes: int, workers: int, changes_key: str = "") -> float:
        """Before the kept workers leave their old group: wait (training on) until the new
        members' ``expected`` fresh workers are up and forming the new group
        (``protocol.ready_key``), so that their process start is not time the kept ones stand
        still in the new group. Bounded, and cut short by anything else that needs a regroup
        (a departure meanwhile: the old group is broken or goes; the new round changed once
        complete, its ``changes_key`` counter moved: a node waits to join it, or a member went,
        so a joiner's fresh workers may be restarted before they count). ``expected`` is this
        agent's guess (members its own last round lacked): where every member's workers are
        kept after all (a node thawed after the others regrouped twice counts them new, they
        count it new), the kept ones its peers count in
        (``protocol.kept_key``) with the fresh ones up make the group's ``nodes`` x ``workers``.
        The seconds waited."""
        store = self._store
        if expected <= 0 or store is None or not prefix or not forming_is_bounded():
            # Where torch forms a group unbounded (runtime/group.py), a joiner lost between its
            # count and its connections would hold the kept workers for the collective
            # timeout: they are told at once, as before, which keeps that window milliseconds.
            return 0.0
        started = time.monotonic()
        deadline = started + FRESH_READY_WAIT_S
        pause = FRESH_LOOK_S
        least, bound = FRESH_LOOK_MOST_S
        most = min(bound, max(least, nodes / FRESH_LOOKS_A_SECOND_IN_ALL))
        try:
            call_with_deadline(store.add, STORE_CALL_S, protocol.kept_key(prefix), workers)
        except Exception:
            _log.debug("could not count this node's kept workers: not waiting for joiners", exc_info=True)
            return time.monotonic() - started
        while time.monotonic() < deadline and not (self.lost.is_set() or self.regroup.is_set()):
            try:
                up = int(call_with_deadline(store.add, STORE_CALL_S, protocol.ready_key(prefix), 0))
                if up >= expected:
                    break
                kept = int(call_with_deadline(store.add, STORE_CALL_S, protocol.kept_key(prefix), 0))
                # Kept workers count themselves up only once their agent is done waiting, by
                # when every fresh one was: the first agent done counts none twice.
                if up + kept >= nodes * workers:
                    break
                if changes_key and int(call_with_deadline(store.add, STORE_CALL_S, changes_key, 0)) > 0:
                    break
            except Exception:
                _log.debug("could not read how many joiners' workers are up: not waiting for them", exc_info=True)
                break
            time.sleep(pause)
            pause = min(most, pause * 2)
        return time.monotonic() - started

    def departure_seen(self, local_ranks: list[int], round_: int, graceful: bool) -> bool:
        """The watch saw a member of round ``round_`` go: when this node's workers can stay,
        the agent regroups at its next look, and unless the member left on purpose
        (``graceful``: it leaves at the step boundary the vote agrees on) the workers are told to
        abort their group first (a collective waiting on the lost peer returns). False: the
        watch ends them, as before."""
        links = self.links
        if links is None or not local_ranks:
            return False
        if self.fatal.ends:
            return True  # the job ends (its supervisor stops the others): nothing to restart or regroup
        why = links.why_not_kept(local_ranks)
        if why is not None:
            self._refused(why, round_)
            self._kill_stopped(local_ranks)
            return False
        if not graceful:
            for local_rank in local_ranks:
                links.send(local_rank, {"op": "abort"})
        self._regroup("left" if graceful else "lost", round_)
        return True

    def explain_restart(self, round_: int) -> None:
        """The agent restarts its workers: where one of them said why it cannot stay, say so."""
        said = self.links.said_why() if self.links is not None else None
        if said is not None:
            self._refused(said, round_)

    def left_out(self, round_: int | None) -> None:
        """This node's workers restart: the others went on without it (``departures.left_out``)."""
        self._refused(
            "this node was dropped from the round while it was stopped or cut off, and the others went"
            " on: its workers start again and take the live values from them",
            -1 if round_ is None else round_,
        )

    def _refused(self, why: str, round_: int) -> None:
        """Said once per round: this node's workers restart, and why (not for workers that never
        trained: still starting, there was nothing to keep)."""
        if self.refused_round != round_ and self.links is not None and self.links.trained():
            self.refused_round = round_
            emit(Kind.IN_PLACE_REFUSED, node=self._node(), **InPlaceRefused(reason=why))

    def _kill_stopped(self, local_ranks: list[int]) -> None:
        """SIGKILL this node's stopped workers, which restart: torch's shutdown signals their
        launchers, and a warm start's worker (the pool's fork, no child of theirs) outlives its
        launcher while stopped, holding its group's sockets (a scale-up waited 30 s for it)."""
        links = self.links
        stopped = links.stopped(local_ranks, for_s=0.0) if links is not None else []
        killed = links.kill(stopped) if links is not None and stopped else []
        if killed:
            _log.warning("workers %s were stopped and cannot stay in place: killed", killed)

    def _regroup(self, reason: str, round_: int | None) -> None:
        self.reason = reason
        self.regroup_after = round_
        self.regroup.set()
        self._wake.set()

    def regroup_now(self) -> str | None:
        """Why the agent should regroup now ("lost", "left"), or None: a departure seen by the
        watch, or a worker whose group broke while the round has lost a member (sooner than the
        watch). A departure from a round this node has regrouped past already is done with."""
        current = int(os.environ.get(protocol.ENV_ROUND, -1))
        if self.fatal.ends:
            self.regroup.clear()
            self.lost.clear()
            return None  # a worker here ends the job: no regroup for the others' going
        if self.lost.is_set() and not self.regroup.is_set() and self._member_gone():
            # A group broken by a member that leaves on purpose (its workers aborted, not left at
            # a boundary: stopped, or a loaded machine past LEAVE_AT_BOUNDARY_S) is a departure.
            self._regroup("left" if self._left_on_purpose() else "lost", current)
        if not self.regroup.is_set():
            return None
        self.regroup.clear()
        self.lost.clear()
        if self.regroup_after is not None and self.regroup_after < current:
            return None
        return self.reason or "lost"

    def restart(
        self, pids_by_local_rank: dict[int, int], worker_group: Any, rendezvous: Callable[[], None], reason: str
    ) -> bool:
        """Instead of torchrun's restart of the workers: rendezvous, then send each kept worker
        its place in the new group (torch's worker ids stay its processes'). False (nothing
        done) when they cannot all stay."""
        links = self.links
        local_ranks = sorted(pids_by_local_rank)
        if links is None or not local_ranks or reason == LEFT_OUT:
            return False  # left out: its workers wait in a group the others left (departures.left_out)
        why = links.why_not_kept(local_ranks)
        if why is not None:
            self._refused(why, int(os.environ.get(protocol.ENV_ROUND, -1)))
            self._kill_stopped(local_ranks)
            return False
        started = time.monotonic()
        self.reason = ""
        rendezvous()  # torch's round: the new members, ranks and world size
        self.lost.clear()  # whatever broke the old group is superseded by this round
        round_ = int(os.environ.get(protocol.ENV_ROUND, 0))
        store, prefix = os.environ.get(protocol.ENV_GROUP_STORE, ""), os.environ.get(protocol.ENV_GROUP_PREFIX, "")
        epoch = int(os.environ.get(protocol.ENV_RDZV_EPOCH, 0))
        took_s = time.monotonic() - started
        # Nodes have as many workers each (torchrun's --nproc-per-node): the new ones' count.
        workers = len(worker_group.workers)
        # The round's change counter: a write of ours adds to it once the complete round changes.
        handler = getattr(getattr(worker_group, "spec", None), "rdzv_handler", None)
        run_id = None if handler is None else handler.get_run_id()
        changes_key = (
            protocol.signal_key(protocol.rendezvous_state_key(str(run_id)), round_, protocol.CHANGED) if run_id else ""
        )
        trained_on_s = self._await_newcomers(
            prefix, self._newcomers * workers, worker_group.group_world_size, workers, changes_key
        )
        # A stop swallowed meanwhile (a store call's ``except`` took torch's SignalException for
        # a lost connection, in the round or in the wait above) lands now, before the workers
        # are put in the new group: the node goes from its old group, instead of ``RESEND_S``
        # later from a group the others just formed with it (a second regroup for them).
        term.land_stop()
        for worker in worker_group.workers:
            pid = pids_by_local_rank.get(worker.local_rank)
            if pid is None:
                return False
            worker.id = pid
            links.send(
                worker.local_rank,
                {
                    "op": "assign",
                    "round": round_,
                    "epoch": epoch,
                    "rank": worker.global_rank,
                    "world_size": worker.world_size,
                    "local_rank": worker.local_rank,
                    "local_world_size": len(worker_group.workers),
                    "group_rank": worker_group.group_rank,
                    "group_world_size": worker_group.group_world_size,
                    "role_rank": worker.role_rank,
                    "role_world_size": worker.role_world_size,
                    "store": store,
                    "prefix": prefix,
                    "reason": reason,
                },
            )
        said = Regrouped(
            round=round_,
            group_rank=worker_group.group_rank,
            group_world_size=worker_group.group_world_size,
            kept=links.pids(local_ranks),
            reason=reason,
            took_s=round(took_s, 4),
        )
        if trained_on_s:
            said["trained_on_s"] = round(trained_on_s, 4)
        emit(Kind.REGROUPED, node=self._node(), **said)
        return True

    def leave(self, local_ranks: list[int], leave_round: Callable[[], object], store: KeyStore | None) -> None:
        """This node goes (SIGTERM): out of the round first (marked as leaving in ``store``, so
        its peers do not take it for lost), then its workers leave at the next step boundary,
        or are told to abort after ``LEAVE_AT_BOUNDARY_S``."""
        links = self.links
        if links is None or not local_ranks or links.why_not(local_ranks) is not None:
            return
        try:
            if store is not None:
                call_with_deadline(store.set, STORE_CALL_S, protocol.leaving_key(os.getpid()), str(time.time()))
            leave_round()  # the survivors form their round meanwhile
        except Exception:
            _log.debug("could not leave the round first: the survivors see it at the heartbeat", exc_info=True)
        for local_rank in local_ranks:
            links.send(local_rank, {"op": "leave"})
        if links.wait_closed(local_ranks, LEAVE_AT_BOUNDARY_S):
            emit(Kind.LEFT_AT_BOUNDARY, node=self._node(), **LeftAtBoundary(local_ranks=local_ranks))
            return
        for local_rank in local_ranks:
            links.send(local_rank, {"op": "abort"})
        if links.wait_closed(local_ranks, LEAVE_AFTER_ABORT_S):
            return
        # Its workers neither left at a boundary nor aborted (stopped, stuck): the others wait on
        # them in the group's next collective, until its timeout (gloo: 120 s, then a restart
        # charged and the live values lost). Killed, their sockets close and the others redo
        # the step in flight in place.
        killed = links.kill(local_ranks)
        if killed:
            _log.warning("workers %s did not leave at a step boundary or abort: killed", killed)
            links.wait_closed(local_ranks, LEAVE_AFTER_ABORT_S)

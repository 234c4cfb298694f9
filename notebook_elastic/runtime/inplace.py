"""In place: a worker keeps its process, and all it holds, when the job's members change.

torchrun restarts every worker of every node whenever a node leaves or joins. Under our agent a
worker that can (``capable()``) stays instead:
- it talks to its agent over a local socket (``Link``): the agent sends it the new group's
  ``Assignment`` when a new rendezvous round formed (a node joined or left), ``abort`` when a
  member of its group is gone (its collectives would otherwise wait for their timeout), and
  ``leave`` when its own node goes (a scale-down, a preemption);
- each optimizer step first takes a one-value vote over the group (``State``'s pre-hook): is a
  change pending anywhere? So every rank learns it after the same step, and all leave the old
  group at the same step boundary (``State.steps()`` raises ``MembershipChange`` there): a
  graceful change costs no step;
- an abrupt loss breaks the step in flight: its collective fails (the group's sockets are shut
  down by whoever noticed first, ``Group.abort``, so no rank waits for gloo's timeout), the
  optimizer does not step, and the step is redone in the new group;
- ``worker.run`` then builds the new group from the assignment (a fresh key prefix in the
  rendezvous store, so no key of an earlier group is read) and runs the cell's body again in
  the same process; the new ``State`` takes its values from the previous one's live objects
  (``Handoff``), or from the live rank furthest ahead when ranks differ (a joiner, a rank whose
  step was not applied): never from disk while a rank of the job holds them.

Where a worker cannot stay (the cell holds process groups of its own, a sharded model, no
``State``), it says why once and its agent restarts the node as torchrun would. Under plain
``torchrun`` (no agent link in the environment) nothing here is active.

Its parts: the group, abortable (``group.py``), and what a State hands to the next
(``handoff.py``). Worker-side module: the standard library, and torch only once a group is built.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..contract import protocol
from ..plumbing import log as _logging
from .group import Group, nccl_abort_missing
from .handoff import Handoff

_log = _logging.get("runtime.inplace")

#: How long a worker whose group broke waits for its agent's next assignment before it gives up
#: staying (and exits as a worker whose peer left: its agent then restarts it).
ASSIGNMENT_WAIT_S = 120.0


class MembershipChange(BaseException):
    """Raised at a step boundary when the job's members change: the cell's body ends there and
    runs again in the new group. A ``BaseException``, so a cell's ``except Exception`` does not
    swallow it."""


@dataclass(frozen=True)
class Assignment:
    """Where a worker stands in a group: what torchrun's environment says of a fresh worker,
    for a group formed while it kept running."""

    round: int
    epoch: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    role_rank: int
    role_world_size: int
    store: str  # host:port of the rendezvous store the group's keys live in
    prefix: str  # this group's key prefix there
    reason: str = ""  # why the group changed: "joined", "left", "lost", "store"
    leave: bool = False  # this worker's node goes: no group for it

    def env(self) -> dict[str, str]:
        """The environment torchrun would have given a worker of this group."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "GROUP_WORLD_SIZE": str(self.group_world_size),
            "ROLE_RANK": str(self.role_rank),
            "ROLE_WORLD_SIZE": str(self.role_world_size),
            protocol.ENV_ROUND: str(self.round),
            protocol.ENV_RDZV_EPOCH: str(self.epoch),
            protocol.ENV_GROUP_STORE: self.store,
            protocol.ENV_GROUP_PREFIX: self.prefix,
        }

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Assignment | None:
        """The group a worker was started into, when its agent forms groups in place."""
        env = dict(os.environ) if env is None else env
        if not env.get(protocol.ENV_GROUP_PREFIX) or not env.get(protocol.ENV_GROUP_STORE):
            return None
        return cls(
            round=int(env.get(protocol.ENV_ROUND, 0)),
            epoch=int(env.get(protocol.ENV_RDZV_EPOCH, 0)),
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            group_rank=int(env.get("GROUP_RANK", 0)),
            group_world_size=int(env.get("GROUP_WORLD_SIZE", 1)),
            role_rank=int(env.get("ROLE_RANK", env.get("RANK", 0))),
            role_world_size=int(env.get("ROLE_WORLD_SIZE", env.get("WORLD_SIZE", 1))),
            store=env[protocol.ENV_GROUP_STORE],
            prefix=env[protocol.ENV_GROUP_PREFIX],
        )

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Assignment:
        known = {k: v for k, v in message.items() if k in cls.__dataclass_fields__}
        return cls(**known)


# -- the link to the agent ------------------------------------------------------------------


class Link:
    """This worker's connection to its agent (an abstract Unix socket the agent listens on,
    authenticated by a token only the agent's children hold): one JSON object per line each way."""

    def __init__(
        self,
        sock: socket.socket,
        on_abort: Callable[[], None] = lambda: None,
        on_assign: Callable[[Assignment], None] = lambda a: None,
    ) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self.pending: Assignment | None = None  # the newest group the agent formed, not taken yet
        self.leaving = False  # this worker's node goes: it leaves at the next step boundary
        self.closed = False  # the agent went (or never answered): nothing here stays in place
        # The group's abort, and its word of a newer round: set before the reader starts, so
        # that no message the agent sends at once (a round formed as this worker started) misses them.
        self.on_abort = on_abort
        self.on_assign = on_assign
        self.capable_said: tuple[bool, str] | None = None
        self._thread = threading.Thread(target=self._read, name="notebook-elastic-link", daemon=True)
        self._thread.start()

    @classmethod
    def connect(
        cls, on_abort: Callable[[], None] = lambda: None, on_assign: Callable[[Assignment], None] = lambda a: None
    ) -> Link | None:
        """The link, when this worker's agent keeps workers in place (its environment says so)."""
        name, token = os.environ.get(protocol.ENV_AGENT_LINK), os.environ.get(protocol.ENV_AGENT_TOKEN)
        if not name or not token:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        try:
            sock.connect("\0" + name)
            hello = {
                "op": "hello",
                "token": token,
                "pid": os.getpid(),
                "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
            }
            sock.sendall((json.dumps(hello) + "\n").encode())
        except OSError as exc:
            _log.info("no link to the agent (%s): a change of members restarts this worker", exc)
            sock.close()
            return None
        sock.settimeout(None)
        return cls(sock, on_abort, on_assign)

    def send(self, **message: Any) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError:
                self._gone()

    def say_capable(self, capable: bool, why: str = "") -> None:
        """Tell the agent whether this worker can stay in place (once per change of answer)."""
        if self.capable_said != (capable, why):
            self.capable_said = (capable, why)
            self.send(op="capable", capable=capable, why=why)

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._gone()
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    self._handle(json.loads(line))
                except (ValueError, TypeError):
                    _log.warning("the agent sent what this worker does not read: %r", line[:200])

    def _handle(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "assign":
            assignment = Assignment.from_message(message)
            with self._cond:
                self.pending = assignment
                self._cond.notify_all()
            self.on_assign(assignment)
        elif op == "leave":
            with self._cond:
                self.leaving = True
                self._cond.notify_all()
        elif op == "abort":
            self.on_abort()

    def _gone(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    @property
    def change_pending(self) -> bool:
        """Whether a change waits for the next step boundary (a new group, or this node's leave)."""
        return self.leaving or self.pending is not None

    def next_assignment(self, after_round: int | None, deadline: float) -> Assignment | None:
        """The agent's next group for this worker (newer than ``after_round``), or one saying it
        leaves; None when the agent went or said nothing by ``deadline``."""
        with self._cond:
            while True:
                pending = self.pending
                if pending is not None and (after_round is None or pending.round > after_round):
                    self.pending = None
                    return pending
                if self.leaving:
                    return None
                if self.closed or time.monotonic() >= deadline:
                    return None
                self._cond.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))


# -- the switch --------------------------------------------------------------------------------


@dataclass
class Switch:
    """One change of group, as this worker lived it (rank 0's becomes the ``in_place`` event)."""

    # monotonic: when training last moved here (``State.stood_since``: a boundary, or the start of
    # the step in flight). Told from the change's first sign, a survivor that stood 70 s in the old
    # group's last collective read "training again after 0.02 s" (an adversary's pass).
    started: float
    reason: str
    from_world_size: int
    abrupt: bool  # the step in flight broke (it is redone), not a boundary everyone agreed on
    from_nodes: int = 0  # the old group's nodes (its GROUP_WORLD_SIZE): "2 nodes went", not "a node"


class InPlace:
    """This worker's in-place machinery: its link, its group, the handoff between States."""

    def __init__(self) -> None:
        self.link: Link | None = None
        self.group = Group()
        self.handoff: Handoff | None = None  # left by the State that ended, for the next
        self.switch: Switch | None = None  # the change under way, until the new State trains
        self.incapable: str | None = None  # why this worker cannot stay (said to the agent)
        self.state: Any = None  # the State of the body running now (it registers itself)
        self.ended: Assignment | None = None  # the group that broke last (closed), for its survivors' save

    def start(self) -> None:
        self.link = Link.connect(on_abort=self.group.abort, on_assign=self.group.superseded_by)

    @property
    def active(self) -> bool:
        return self.link is not None and not self.link.closed

    def init_group(self, backend: str, timeout_s: float) -> bool:
        """The worker's first group, formed the way its later groups will be (over the
        rendezvous store, under this round's prefix): False where its agent does not form groups
        in place (plain torchrun: ``env://`` as usual)."""
        assignment = Assignment.from_env()
        if assignment is None or self.link is None:
            return False
        deadline = time.monotonic() + ASSIGNMENT_WAIT_S
        while True:
            try:
                self.group.open(assignment, backend, timeout_s)
                return True
            except Exception:
                if self.group.newest_round <= assignment.round:
                    raise  # it did not form, and no newer round is there to form: it fails
                # Its agent formed a newer round before this one formed (another node joined or
                # left as this one started): its members went on to that one; so does this worker.
                self.group.close()
                newer = self.link.next_assignment(assignment.round, deadline)
                if newer is None:
                    raise
                _log.info(
                    "round %s was replaced before it formed: this worker forms round %s", assignment.round, newer.round
                )
                os.environ.update(newer.env())
                assignment = newer

    def progressed(self) -> None:
        """This worker's group made a step (its first report in the group): told to the agent,
        which says why it restarts a worker that trained (not one that never got going)."""
        if self.link is not None:
            self.link.send(op="progress")

    def keeps_values_without(self, notice: dict[str, Any], held: bool = False) -> bool:
        """Whether a notice for a node needs no save: this worker stays in place, and its
        notifier knows other nodes stay (they keep every value). A pod's keeper cannot know
        (a gang eviction takes every pod at once): its notice is saved for. ``held``: the values
        are the ones a State handed on, no next State made yet."""
        try:
            stays = int(notice.get("stays", 0))
        except (TypeError, ValueError):
            stays = 0
        kept = self.state is not None or (held and self.handoff is not None)
        return self.active and self.incapable is None and kept and stays > 0

    def ends_fatally(self) -> None:
        """This worker failed in a way no retry can mend: the job ends (told to the agent)."""
        if self.link is not None:
            self.link.send(op="fatal")

    def say(self, capable: bool, why: str = "") -> None:
        if self.link is not None:
            self.link.say_capable(capable, why)

    def vote_flag(self) -> int:
        """This worker's vote before an optimizer step: 1 when a change waits here."""
        return 1 if self.link is not None and self.link.change_pending else 0

    def continues_after(self, exc: BaseException, peer_lost: bool) -> Assignment | None:
        """After the cell's body ended with ``exc``: the assignment of the group this worker
        goes on in (its group already built), or None when it cannot stay (its agent restarts
        it, or it leaves: see ``leaving``)."""
        link = self.link
        if link is None or link.closed:
            return None
        boundary = isinstance(exc, MembershipChange)
        if not (boundary or peer_lost):
            return None
        state = self.state
        # The values a State handed on that no State took yet: the cell's body broke while it
        # made its next State (a peer that went during its collectives). They are the ones to
        # go on from: the change before this one is not over (a worker that restarted here lost
        # every step since the last save, said as "the cell keeps no elastic.State").
        held = self.handoff if state is None else None
        why = self.incapable or self.group.unabortable
        why = why or (None if state is not None or held is not None else _no_state(exc))
        if why:
            link.say_capable(False, why)
            return None
        import torch.distributed as dist

        if state is not None or self.switch is None:
            world = int(os.environ.get("WORLD_SIZE", 1))
            now = time.monotonic()
            since = state.stood_since(now) if state is not None else now
            nodes = int(os.environ.get("GROUP_WORLD_SIZE", 1))
            self.switch = Switch(since, "", world, abrupt=not boundary, from_nodes=nodes)
        self.handoff = state.handoff() if state is not None else held
        assert self.handoff is not None
        if self.handoff.partly is not None:  # no step's values: the restart from the latest save
            link.say_capable(False, self.handoff.partly)
            self.handoff = None
            return None
        self.state = None
        ended = state
        self.group.abort()  # peers still in the old group's step fail now, not at its timeout
        link.send(op="lost" if not boundary else "boundary", step=self.handoff.next_step)
        current = self.group.assignment
        after = current.round if current is not None else None
        backend = self.group.backend or (dist.get_backend() if dist.is_initialized() else "gloo")
        self.ended = current
        self.group.close()
        timeout_s = float(os.environ.get(protocol.ENV_COLLECTIVE_TIMEOUT_S, 120))
        deadline = time.monotonic() + ASSIGNMENT_WAIT_S
        while True:
            assignment = link.next_assignment(after, deadline)
            if assignment is None:
                if boundary and link.leaving:
                    # Its own node goes too, while the rest regroup (a gang eviction's SIGTERMs a
                    # moment apart: one node left at the vote, this one just after). It holds
                    # the values of the boundary everyone agreed on: the old group's writer
                    # saves them, so the steps since the last save are not redone.
                    if ended is not None:
                        ended.save_leaving_between_groups()
                    else:  # held: no State took it
                        self.handoff.save_if_writer()
                return None
            self.switch.reason = assignment.reason
            os.environ.update(assignment.env())
            try:
                self.group.open(assignment, backend or "gloo", timeout_s)
            except Exception as exc:
                # A member of it went before it formed (a joiner that failed): the agent
                # forms the next round without it.
                _log.info("the group of round %s did not form (%s): waiting for the next", assignment.round, exc)
                self.group.close()
                after = assignment.round
                continue
            return assignment

    @property
    def leaving(self) -> bool:
        return self.link is not None and self.link.leaving

    def chosen_to_save(self) -> bool:
        """Whether this worker saves for its group that broke as its node goes (a stop while the
        survivors regrouped after a loss): the first survivor to claim the group's
        ``protocol.saver_key`` in the rendezvous store, which outlives any node. Every survivor
        holds the same values, and the group's writer (rank 0) may be the member lost (an
        adversary's pass: such a stop saved nothing, and the resume trained every step again).
        Where the store cannot be reached, the writer, as before."""
        assignment = self.group.assignment or self.ended
        if assignment is None:
            return os.environ.get("RANK", "0") == "0"
        # Its rank in that group, and this process: RANK may be a later group's that did not form.
        me = f"{assignment.rank}@{socket.gethostname()}:{os.getpid()}"
        try:
            return claim(assignment.store, protocol.saver_key(assignment.prefix), me)
        except Exception:
            _log.info("could not claim the save of the broken group: its writer saves", exc_info=True)
            return assignment.rank == 0


#: How long a survivor's claim of the save waits for the rendezvous store (``chosen_to_save``).
CLAIM_S = 5.0


def claim(store_at: str, key: str, value: str) -> bool:
    """Whether ``value`` is the first set at ``key`` in the store at ``store_at`` (this call's
    or an earlier one's with the same value)."""
    from datetime import timedelta

    import torch.distributed as dist

    host, _, port = store_at.rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=CLAIM_S), wait_for_workers=False)
    return bool(store.compare_set(key, "", value).decode() == value)


#: Why a worker fenced by a newer generation does not stay (a node stopped or cut off while the
#: others went on, restarted from a save, without it).
FENCED = (
    "a newer generation of this job trains (this worker's group was superseded while it was stopped or cut off): "
    "it starts again and takes the live values"
)

#: Why a worker whose code sets up its own default group cannot stay (the packager leaves the
#: group to code it sees call init_process_group: runtime/worker.py run).
OWN_DEFAULT_GROUP = (
    "the cell sets up its own process group (init_process_group), which holds the old members; leave the "
    "call out, or name its backend as a literal (init_process_group(backend='nccl')), to keep the workers in place"
)


def _no_state(exc: BaseException) -> str:
    """Why a worker with no State and no values handed on cannot stay: its cell makes none, or
    its first one broke as it was made (a new rank whose group lost a member: it held nothing)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__" and type(frame.f_locals.get("self")).__name__ == "State":
            return "its elastic.State was being made when the group broke (it held no values yet)"
        tb = tb.tb_next
    return "the cell keeps no elastic.State"


def own_groups(ours: int = 0) -> int:
    """Process groups the cell made itself (beyond the default group and ``ours``): they hold
    the old members and cannot be rebuilt from here, so such a worker restarts at a change.
    torch keeps them in ``distributed_c10d._world.pg_map`` (every torch of the range); where it
    does not say, none is assumed."""
    import torch.distributed.distributed_c10d as c10d

    pg_map = getattr(getattr(c10d, "_world", None), "pg_map", None)
    if pg_map is None:
        return 0
    return max(0, len(pg_map) - 1 - ours)


def torch_lacks() -> str | None:
    """What this torch lacks to rebuild a group in place (None: nothing)."""
    import torch
    import torch.distributed as dist

    if not hasattr(torch.optim.Optimizer, "register_step_pre_hook"):
        return f"torch {torch.__version__} has no optimizer step hooks (torch >= 2.0 has)"
    if not hasattr(dist, "PrefixStore") or not dist.is_available():
        return f"torch {torch.__version__} has no distributed PrefixStore"
    if dist.is_initialized() and "nccl" in str(dist.get_backend()).lower():
        return nccl_abort_missing()
    return None


_inplace = InPlace()


def machinery() -> InPlace:
    """This process's in-place machinery (one per worker)."""
    return _inplace

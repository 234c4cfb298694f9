"""Light rendezvous agents: a job of many nodes on one machine, as the rendezvous store sees it
(#40), without a torchrun agent (and its workers) per node.

Each simulated node is one asyncio task with its own TCP connection to the store, speaking
torch's TCPStore wire protocol call by call as torch's client does (a ``get`` is a WAIT and a
GET; every key under "/"), and torch's c10d rendezvous as our agents run it (``agent/run.py``,
``agent/rounds.py``): the rendezvous state in one key (base64 of a pickled
``_RendezvousState``), read with ``get`` and written with ``compare_set`` on the token last read;
each decision taken by torch's own operations (``_RendezvousJoinOp``, ``_RendezvousExitOp``,
``_RendezvousKeepAliveOp``) on torch's own state classes; the state holder's cache (a state read
less than ``cache_duration`` ago is not read again) and sanitize (members whose heartbeat is older
than ``keep_alive_interval x keep_alive_max_attempt`` are dropped); heartbeats every
``keep_alive_interval``; the agent's monitor asking ``num_nodes_waiting`` every
``monitor_interval`` and our departure watch; after a round: the bootstrap keys
(``RendezvousStoreInfo.build``) and torch's rank assignment (``_assign_worker_ranks``: set,
multi_get, multi_set, get) on the round's prefix, each wait as our agent makes it
(``store_link.BoundedStore``); our holder's check of ``GONE_KEY`` after each read, our join's check of
``TARGET_KEY``, our backend's read of the store's id at its first call.

What is not torch's own code here, for speed (1,024 nodes on 2 cores): the executor's loop and
its nine actions (a few lines each, checked against torch's executor by
``tests/test_thousand.py``), and the state's encoding: the bytes are a pickle of the state that
``pickle.loads`` turns into the same ``_RendezvousState`` (checked there too), built from each
node's pieces instead of by the pickler (the pickler takes 1.6 ms for 1,024 nodes, and a round
of 1,024 nodes makes thousands of writes); a state this process wrote is not decoded again
when read back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import random
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

from notebook_elastic.agent import regroup, store_link, together
from notebook_elastic.agent.torch_adapter import rendezvous_times_aware
from notebook_elastic.contract import protocol

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, DELETE_KEY, APPEND = 0, 1, 2, 3, 4, 5, 6, 8, 9
MULTI_GET, MULTI_SET, CANCEL_WAIT = 10, 11, 12
NAMES = {SET: "set", COMPARE_SET: "compare_set", GET: "get", ADD: "add", CHECK: "check", WAIT: "wait"}
NAMES |= {APPEND: "append", DELETE_KEY: "delete_key"}
NAMES |= {MULTI_GET: "multi_get", MULTI_SET: "multi_set", CANCEL_WAIT: "cancel_wait"}
MAGIC = 0x3C85F7CE
SENTINEL = b"Y2FuaW1hZGFt"  # C10dRendezvousBackend._NULL_SENTINEL
A = dr._Action
DEBUG = False
#: torch's rendezvous keeps its times aware (UTC) from 2.5 on, naive UTC on 2.4 (``utcnow``): the
#: simulated agents write the kind this torch's own would, or its keep-alive fails comparing them.
AWARE = rendezvous_times_aware()


# -- the state's bytes ---------------------------------------------------------------------------


def _str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def _int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raise ValueError(n)


_MOD = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
# Memo slots set once at the start: 0 the module's name, 1 _NodeDesc, 2 "datetime", 3 datetime,
# 4 timezone.utc, 5..7 the field names of a node; a node's own object from slot 16 on.
_HEADER = b"".join(
    [
        b"\x80\x04",
        _str(_MOD),
        b"q\x00",
        _str("_NodeDesc"),
        b"\x93q\x010",
        _str("datetime"),
        b"q\x02",
        _str("datetime"),
        b"\x93q\x030",
        b"h\x02",
        _str("timezone"),
        b"\x93h\x02",
        _str("timedelta"),
        b"\x93K\x00K\x00K\x00\x87R\x85Rq\x040",
        _str("addr"),
        b"q\x050",
        _str("pid"),
        b"q\x060",
        _str("local_id"),
        b"q\x070",
        b"h\x00",
        _str("_RendezvousState"),
        b"\x93)\x81}(",
    ]
)
_FIRST_NODE_SLOT = 16


_INTS = [_int(n) for n in range(65536)]


class Codec:
    """torch's rendezvous state <-> what the c10d backend stores (base64 of a pickle)."""

    def __init__(self, cache: int = 256) -> None:
        self._slots: dict[dr._NodeDesc, int] = {}
        # By the node object's id (its dataclass hash is Python code, and a state of 1,024 nodes
        # names each twice): (the node, its pickle, a reference to it once pickled).
        self._pieces: dict[int, tuple[dr._NodeDesc, bytes, bytes]] = {}
        self._times: dict[datetime, bytes] = {}
        self._decoded: OrderedDict[bytes, dr._RendezvousState] = OrderedDict()
        self._cache = cache
        self.decodes = 0  # states read that were not in the cache (pickle.loads)
        # Every state written here, by its hash: a state read that is none of them came from
        # elsewhere (the cache alone cannot tell: a slow reader's state may have left it).
        self._written: set[int] = set()
        self.foreign = 0

    def _learn(self, node: dr._NodeDesc) -> tuple[dr._NodeDesc, bytes, bytes]:
        slot = self._slots.setdefault(node, _FIRST_NODE_SLOT + len(self._slots))
        whole = b"".join(
            [b"h\x01)\x81}(h\x05", _str(node.addr), b"h\x06", _int(node.pid), b"h\x07", _int(node.local_id)]
        )
        pieces = (node, whole + b"ub" + b"r" + struct.pack("<I", slot), b"j" + struct.pack("<I", slot))
        self._pieces[id(node)] = pieces  # the node is kept: its id stays its own
        return pieces

    def _time(self, when: datetime) -> bytes:
        piece = self._times.get(when)
        if piece is None:
            if when.tzinfo is not (timezone.utc if AWARE else None):
                raise ValueError("torch's rendezvous times are UTC: aware from torch 2.5, naive on 2.4")
            state = when.__reduce__()[1][0]
            # datetime(state, timezone.utc), or datetime(state) where this torch keeps them naive
            piece = b"h\x03C" + bytes([len(state)]) + state + (b"h\x04\x86R" if AWARE else b"\x85R")
            if len(self._times) > 65536:
                self._times.clear()
            self._times[when] = piece
        return piece

    def encode(self, state: dr._RendezvousState) -> bytes:
        pieces, learn, seen = self._pieces, self._learn, set()

        def node(n: dr._NodeDesc) -> bytes:
            i = id(n)
            p = pieces.get(i)
            if p is None or p[0] is not n:
                p = learn(n)
            if i in seen:
                return p[2]
            seen.add(i)
            return p[1]

        out = [_HEADER, _str("round"), _int(state.round), _str("complete"), b"\x88" if state.complete else b"\x89"]
        out += [_str("deadline"), b"N" if state.deadline is None else self._time(state.deadline)]
        out += [_str("closed"), b"\x88" if state.closed else b"\x89", _str("participants"), b"}("]
        for n, rank in state.participants.items():
            out += (node(n), _INTS[rank] if 0 <= rank < 65536 else _int(rank))
        out += [b"u", _str("wait_list"), b"\x8f("]
        out += [node(n) for n in state.wait_list]
        out += [b"\x90", _str("redundancy_list"), b"\x8f("]
        out += [node(n) for n in state.redundancy_list]
        out += [b"\x90", _str("last_heartbeats"), b"}("]
        time_ = self._time
        for n, beat in state.last_heartbeats.items():
            out += (node(n), time_(beat))
        out.append(b"uub.")
        encoded = base64.b64encode(b"".join(out))
        self._written.add(hash(encoded))
        if DEBUG:
            back = pickle.loads(base64.b64decode(encoded))
            if vars(back) != vars(state):
                raise AssertionError(f"encoding differs: {len(back.participants)} vs {len(state.participants)}")
        self._remember(encoded, clone(state))
        return encoded

    def decode(self, encoded: bytes) -> dr._RendezvousState:
        """The state ``encoded`` holds; shared with other readers: never changed in place."""
        state = self._decoded.get(encoded)
        if state is None:
            self.decodes += 1
            if hash(encoded) not in self._written:
                self.foreign += 1
            state = pickle.loads(base64.b64decode(encoded))
            self._remember(encoded, state)
        else:
            self._decoded.move_to_end(encoded)
        return state

    def _remember(self, encoded: bytes, state: dr._RendezvousState) -> None:
        self._decoded[encoded] = state
        if len(self._decoded) > self._cache:
            self._decoded.popitem(last=False)


def clone(state: dr._RendezvousState) -> dr._RendezvousState:
    copy = dr._RendezvousState()
    copy.round, copy.complete, copy.deadline, copy.closed = state.round, state.complete, state.deadline, state.closed
    copy.participants = dict(state.participants)
    copy.wait_list = set(state.wait_list)
    copy.redundancy_list = set(state.redundancy_list)
    copy.last_heartbeats = dict(state.last_heartbeats)
    return copy


# -- the wire ------------------------------------------------------------------------------------


@dataclass
class Counts:
    """Calls of torch's client API, commands on the wire, and bytes, by what made them."""

    calls: dict[str, int] = field(default_factory=dict)
    commands: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    received: int = 0

    def add(self, other: Counts) -> None:
        for mine, theirs in ((self.calls, other.calls), (self.commands, other.commands)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.sent += other.sent
        self.received += other.received

    def minus(self, before: Counts) -> Counts:
        out = Counts(sent=self.sent - before.sent, received=self.received - before.received)
        out.calls = {k: v - before.calls.get(k, 0) for k, v in self.calls.items()}
        out.commands = {k: v - before.commands.get(k, 0) for k, v in self.commands.items()}
        return out

    def copy(self) -> Counts:
        return Counts(dict(self.calls), dict(self.commands), self.sent, self.received)


def _vec(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


class Wire:
    """One connection, as torch's TCPStore client uses it: one call at a time."""

    def __init__(self, host: str, port: int, counts: Counts) -> None:
        self.host, self.port, self.counts = host, port, counts
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.lock = asyncio.Lock()

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        self.writer.write(bytes([VALIDATE]) + struct.pack("<I", MAGIC))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _send(self, command: int, *fields: bytes) -> None:
        data = bytes([command]) + b"".join(fields)
        assert self.writer is not None
        self.writer.write(data)
        self.counts.sent += len(data)
        name = NAMES[command]
        self.counts.commands[name] = self.counts.commands.get(name, 0) + 1

    async def _exactly(self, n: int) -> bytes:
        assert self.reader is not None
        data = await self.reader.readexactly(n)
        self.counts.received += n
        return data

    async def _vector(self) -> bytes:
        return await self._exactly(_U64.unpack(await self._exactly(8))[0])

    def _call(self, name: str) -> None:
        self.counts.calls[name] = self.counts.calls.get(name, 0) + 1

    @staticmethod
    def _key(key: str) -> bytes:
        return _vec(b"/" + key.encode())

    async def _wait(self, keys: list[str], timeout_s: float | None = None) -> bool:
        self._send(WAIT, _U64.pack(len(keys)), *(self._key(k) for k in keys))
        if timeout_s is None:
            await self._exactly(1)
            return True
        try:
            await asyncio.wait_for(self._exactly(1), timeout_s)
            return True
        except asyncio.TimeoutError:
            self._send(CANCEL_WAIT)
            answer = await self._exactly(1)
            if answer == b"\x00":  # it was answered as we cancelled: the cancel's answer follows
                await self._exactly(1)
                return True
            return False

    async def get(self, key: str) -> bytes:
        async with self.lock:
            self._call("get")
            await self._wait([key])
            self._send(GET, self._key(key))
            return await self._vector()

    async def wait(self, keys: list[str], timeout_s: float) -> bool:
        async with self.lock:
            self._call("wait")
            return await self._wait(keys, timeout_s)

    async def check(self, keys: list[str]) -> bool:
        async with self.lock:
            self._call("check")
            self._send(CHECK, _U64.pack(len(keys)), *(self._key(k) for k in keys))
            return await self._exactly(1) == b"\x00"

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        async with self.lock:
            self._call("compare_set")
            self._send(COMPARE_SET, self._key(key), _vec(expected), _vec(desired))
            return await self._vector()

    async def set(self, key: str, value: bytes) -> None:
        async with self.lock:
            self._call("set")
            self._send(SET, self._key(key), _vec(value))

    async def add(self, key: str, delta: int) -> int:
        async with self.lock:
            self._call("add")
            self._send(ADD, self._key(key), _I64.pack(delta))
            return int(_I64.unpack(await self._exactly(8))[0])

    async def delete_key(self, key: str) -> bool:
        async with self.lock:
            self._call("delete_key")
            self._send(DELETE_KEY, self._key(key))
            return bool(_I64.unpack(await self._exactly(8))[0])

    async def append(self, key: str, value: bytes) -> None:
        async with self.lock:
            self._call("append")
            self._send(APPEND, self._key(key), _vec(value))

    async def multi_get(self, keys: list[str]) -> list[bytes]:
        async with self.lock:
            self._call("multi_get")
            await self._wait(keys)
            self._send(MULTI_GET, _U64.pack(len(keys)), *(self._key(k) for k in keys))
            return [await self._vector() for _ in keys]

    async def multi_set(self, keys: list[str], values: list[bytes]) -> None:
        async with self.lock:
            self._call("multi_set")
            pairs = (self._key(k) + _vec(v) for k, v in zip(keys, values))
            self._send(MULTI_SET, _U64.pack(len(keys)), *pairs)


# -- an agent ------------------------------------------------------------------------------------


@dataclass
class Settings:
    """A job's rendezvous settings; the defaults are a cluster job's (``CLUSTER_RDZV_CONF``,
    ``defaults.py``)."""

    min_nodes: int
    max_nodes: int
    keep_alive_interval_s: float = 5.0
    keep_alive_max_attempt: int = 6
    last_call_s: float = 1.0
    join_timeout_s: float = 1800.0
    cache_s: float = 1.0  # the state holder's cache (torch's 1 s; a local job's poll_s)
    poll_s: float = 1.0  # a node waiting in a round looks again this often (torch's _delay(1))
    monitor_s: float = 0.1  # torchrun's --monitor-interval
    watch_s: float = 0.5  # our departure watch (agent/departures.py)
    store_wait: str = "poll"  # the agent's waits on the round's keys: "poll" (checks), "wait" (WAIT)
    supervised: bool = True  # checks for the supervisor's keys: GONE_KEY after each read, TARGET_KEY
    backoff_s: float = 0.0  # a lost write waits up to this (doubling) before the next try
    together: bool = False  # joins and exits announced, and made by any writer for all announced
    regroup: bool = False  # a change of members in one write by the round's leader (together.open_next_round)
    # The change watch (agent/change_watch.py): a WAIT on a connection of its own for the key of
    # the round's next change (protocol.mark_key), in place of the looks at the change counter.
    watch: bool = False

    def torch(self, run_id: str) -> dr.RendezvousSettings:
        timeout = dr.RendezvousTimeout(
            join=timedelta(seconds=self.join_timeout_s), last_call=timedelta(seconds=self.last_call_s)
        )
        return dr.RendezvousSettings(
            run_id,
            self.min_nodes,
            self.max_nodes,
            timeout,
            keep_alive_interval=timedelta(seconds=self.keep_alive_interval_s),
            keep_alive_max_attempt=self.keep_alive_max_attempt,
        )


@dataclass
class Marks:
    """When (time.monotonic()) an agent reached each point."""

    rounds: dict[int, float] = field(default_factory=dict)  # its round complete, by round
    ranked: dict[int, float] = field(default_factory=dict)  # its workers' ranks assigned, by round
    rank: dict[int, int] = field(default_factory=dict)  # its group rank, by round
    departures: list[tuple[float, frozenset[Any]]] = field(default_factory=list)  # noticed: who
    waiting: list[float] = field(default_factory=list)  # saw a node waiting to join
    agreed: dict[int, float] = field(default_factory=dict)  # out of its round, in the next (by the next's number)


class Agent:
    """One node's agent and its rendezvous handler."""

    def __init__(self, fleet: Fleet, index: int) -> None:
        self.fleet, self.index = fleet, index
        addr = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
        self.node = fleet.nodes.setdefault((addr, 1000 + index, 0), dr._NodeDesc(addr, 1000 + index, 0))
        self.settings = fleet.torch_settings
        self.wire = Wire(fleet.host, fleet.port, fleet.counts)
        self.key = f"torch.rendezvous.{fleet.run_id}"
        self.state = dr._RendezvousState()
        self.owned = True  # this agent's own copy (shared ones are cloned before a change)
        self.token: bytes | None = None
        self.dirty = False
        self.last_sync = -1.0
        self.lost_writes = 0
        self.lock = asyncio.Lock()  # torch's _heartbeat_lock
        self.beating: asyncio.Event | None = None  # set to stop the current heartbeats
        self.task: asyncio.Task[None] | None = None
        self.round: int | None = None
        self.members: frozenset[Any] = frozenset()
        self.marks = Marks()
        self.gone = False
        self.missed_beats = 0  # heartbeats that ran past their deadline (torch logs and goes on)
        self.duty: int | None = None  # the interval it last wrote in on duty (together.duty_write)
        self.announced: tuple[str, int] | None = None
        self.consumed: int | None = None  # the interval whose sayings go once this write wins
        self.deleted = -1  # the last interval whose sayings it deleted
        self.announced_at = 0.0
        self.said_alive = 0.0  # when it last said it lives
        self.joined: tuple[int, frozenset[Any]] | None = None  # the round it last joined, its members
        self.said_regroup = -1  # the round it said it regroups from
        self.said_regroup_at = 0.0
        self.seen = (-1, False, 0, 0)  # together.membership of the state last read or written
        self.changes = (-1, 0, 0.0)  # the round's change counter as last read (together.looked_at)
        self.pause = 0.0  # the leader's pause between two reads of who regroups
        self.watch: Wire | None = None  # the change watch's own connection
        self.watch_key: str | None = None  # what it waits for (None: nothing, now)
        self.watching: str | None = None  # what its WAIT is on now
        self.watch_armed = asyncio.Event()
        self.woken = asyncio.Event()  # the watch's answer: the monitor looks now
        self.watch_task: asyncio.Task[None] | None = None
        self.cut = False  # its life was cut (crash, leave): a wait_for that swallowed the cancel ends here

    # the state holder (torch's _BackendRendezvousStateHolder, with our NotebookStateHolder)

    async def sync(self) -> bool | None:
        now = time.monotonic()
        if self.dirty:
            has_set: bool | None = False
            mine = self.fleet.codec.encode(self.state)
            got = await self.wire.compare_set(self.key, self.token or SENTINEL, mine)
            has_set = got == mine
            self.fleet.state_writes += 1
            self.fleet.state_writes_won += has_set
            if has_set and self.fleet.settings.regroup:
                await self._signal()
            stale, self.consumed = self.consumed, None
            if has_set and stale is not None and stale > self.deleted:  # no longer read: gone
                self.deleted = stale
                await self.wire.delete_key(protocol.announced_key(self.key, stale))
        else:
            has_set = None
            if self.fleet.settings.cache_s > 0 and self.last_sync >= max(now - self.fleet.settings.cache_s, 0):
                if not await self._moved(now):
                    return None
            got = await self.wire.get(self.key)
        if got == SENTINEL:
            self.state, self.owned, self.token = dr._RendezvousState(), True, None
        else:
            self.state, self.owned, self.token = self.fleet.codec.decode(got), False, got
        self.dirty = False
        self.last_sync = time.monotonic()
        self.seen = together.membership(self.state)
        if (
            DEBUG
            and self.token
            and len(self.fleet.codec.decode(self.token).participants) != len(self.state.participants)
        ):
            raise AssertionError(
                f"agent {self.index}: read {len(self.state.participants)}, token holds {len(self.fleet.codec.decode(self.token).participants)}"
            )
        await self._sanitize()
        if has_set is False and self.fleet.settings.backoff_s:
            # ours: a lost write backs off, then reads the state as it is by then
            self.lost_writes += 1
            cap = self.fleet.settings.backoff_s * 2 ** min(self.lost_writes, 10)
            await asyncio.sleep(random.uniform(0, min(cap, 1.0)))
            got = await self.wire.get(self.key)
            self.state, self.owned, self.token = self.fleet.codec.decode(got), False, got
            self.last_sync = time.monotonic()
            self.seen = together.membership(self.state)
            await self._sanitize()
        elif has_set:
            self.lost_writes = 0
        return has_set

    async def _moved(self, now: float, now_anyway: bool = False) -> bool:
        """NotebookStateHolder._ne_look_for_change: a member of a complete round (ours) whose copy
        is fresher than the cache reads the round's change counter every CHANGE_LOOK_S."""
        round_ = self.seen[0]
        due = now_anyway or together.look_due(self.changes, round_, now)
        if not (self.fleet.settings.regroup and self.seen[1] and due):
            return False
        if not now_anyway and self.watch_key is not None and self.changes[0] == round_:
            return False  # change_watch.watches: the store answers when the counter moves
        count = await self.wire.add(protocol.signal_key(self.key, round_, protocol.CHANGED), 0)
        self.changes, moved = together.looked_at(self.changes, round_, count, now)
        return moved

    async def _sanitize(self) -> None:
        if self.fleet.settings.supervised:  # NotebookStateHolder._sanitize: gone.pids reads GONE_KEY
            if await self.wire.check([protocol.GONE_KEY]):
                await self.wire.get(protocol.GONE_KEY)
        window = self.settings.keep_alive_interval * self.settings.keep_alive_max_attempt
        expire = utc_now() - window
        beats = self.state.last_heartbeats
        if not beats or self.fleet.oldest(self.state) >= expire:
            return
        self._own()
        dead = [n for n, beat in self.state.last_heartbeats.items() if beat < expire]
        removed = False
        for node in dead:
            del self.state.last_heartbeats[node]
            removed = self.state.participants.pop(node, None) is not None or removed
            self.state.wait_list.discard(node)
            self.state.redundancy_list.discard(node)
        if removed:
            dr._remove_participant_epilogue(self.state, self.settings)

    def _own(self) -> None:
        if not self.owned:
            self.state, self.owned = clone(self.state), True

    # the operation executor (torch's _DistributedRendezvousOpExecutor, with our NotebookExecutor)

    async def run(
        self, op: Callable[[Any, float], Any], deadline: float, update: bool = False, regroup: bool = False
    ) -> None:
        action = None
        regroup = regroup and self.fleet.settings.regroup
        while action != A.FINISH:
            await self.sync()
            ctx = dr._RendezvousContext(self.node, self.state, self.settings)
            if regroup and isinstance(op, dr._RendezvousExitOp):
                decided = await self._regroup_exit()
                if decided == "open":
                    self._own()
                    together.open_next_round(self.state, self.settings, self.node, time.time())
                    self.dirty = True
                    continue
                if decided == "again":
                    continue
                if decided is not None:
                    action = decided
                    continue
            action = op(ctx, deadline)
            if (
                action == A.FINISH
                and isinstance(op, dr._RendezvousKeepAliveOp)
                and self.fleet.settings.together
                and together.beats_together(self.settings)
            ):  # rounds._ne_on_duty
                duty = together.duty_write(
                    self.state, self.node, self.settings.keep_alive_interval, time.time(), self.duty
                )
                if duty is not None:
                    action, self.duty = A.KEEP_ALIVE, duty
            if action == A.MARK_RENDEZVOUS_COMPLETE and regroup is False and self.fleet.settings.regroup:
                if await self._wait_for_first():
                    continue
            if action == A.KEEP_ALIVE and self.fleet.settings.together and together.beats_together(self.settings):
                action = await self._beat_together(op)
            if (
                self.fleet.settings.supervised
                and isinstance(op, dr._RendezvousJoinOp)
                and action in (A.SYNC, A.KEEP_ALIVE)
            ):
                action = await self._closing_at_target(action)
            if action == A.FINISH:
                continue
            if action == A.ERROR_CLOSED:
                raise RuntimeError("the rendezvous is closed")
            if action == A.ERROR_TIMEOUT:
                raise TimeoutError("the rendezvous timed out")
            if action == A.SYNC:
                if not (self.fleet.settings.regroup and await self._wait_for_round()):
                    await asyncio.sleep(self.fleet.settings.poll_s)
                continue
            self._own()
            if self.fleet.settings.together and action in (
                A.ADD_TO_PARTICIPANTS,
                A.REMOVE_FROM_PARTICIPANTS,
                A.KEEP_ALIVE,
            ):
                await self._together(action)
            else:
                apply(action, self.state, self.node, self.settings)
            if action == A.REMOVE_FROM_REDUNDANCY_LIST and update:
                deadline = time.monotonic() + self.settings.timeout.join.total_seconds()
            self.dirty = True

    async def _regroup_exit(self) -> Any:
        """Our executor's exit from a round to regroup (rounds.py, together.open_next_round):
        None (torch's exit op decides), FINISH (a round was written with it in), "open" (it
        leads: it writes the next round), or "again" (it waited: read the state again)."""
        state, joined = self.state, self.joined
        if joined is None or self.node not in state.participants:
            return None
        round_, members = joined
        if state.round > round_:
            return A.FINISH  # the leader wrote the next round with it in
        if state.round != round_ or not state.complete or not together.changed(state, members):
            return None  # no change it can see: it leaves, as torch's does (the others see that)
        now = time.time()
        interval_s = self.settings.keep_alive_interval.total_seconds()
        if self.said_regroup != round_ or now - self.said_regroup_at >= interval_s:  # said again while it lasts
            if self.said_regroup != round_:
                self.pause = 0.0
            self.said_regroup, self.said_regroup_at = round_, now
            await self._say(together.REGROUP, round_, now)
        if now - self.said_alive >= interval_s:
            self.said_alive = now
            await self._say(together.ALIVE, -1, now)
        if together.leader(state) == self.node:
            said = await self._read_said(now)
            if together.regrouping(state, said, self.node):
                self._own()
                together.take_alive(self.state, said, self.fleet.node_of)
                return "open"
            self.pause = min(max(2 * self.pause, 0.02), regroup.LEADER_LOOK_MAX_S)
            await asyncio.sleep(self.pause)
        else:
            wait_s = min(1.0, interval_s)  # rounds.SIGNAL_WAIT_S
            await self.wire.wait([protocol.signal_key(self.key, round_ + 1, protocol.OPENED)], wait_s)
        self.last_sync = -1.0
        return "again"

    async def _wait_for_round(self) -> bool:
        """A join that would look again in poll_s waits for the round it waits for instead (the
        next one opened, or its own completed): False where it waits for nothing of ours."""
        state, node = self.state, self.node
        wait_s = min(1.0, self.settings.keep_alive_interval.total_seconds())  # rounds.SIGNAL_WAIT_S
        if state.complete and node in state.wait_list:
            await self.wire.wait([protocol.signal_key(self.key, state.round + 1, protocol.OPENED)], wait_s)
        elif not state.complete and node in state.participants and state.deadline is not None:
            left = max(0.0, (state.deadline - utc_now()).total_seconds())
            grace = 0.0 if together.first_member(state) == node else 1.0  # rounds.COMPLETE_GRACE_S
            key = protocol.signal_key(self.key, state.round, protocol.COMPLETE)
            await self.wire.wait([key], max(0.01, min(left + grace, wait_s)))
        else:
            return False
        self.last_sync = -1.0
        return True

    async def _wait_for_first(self) -> bool:
        """rounds.py: a member past its round's deadline that is not the first waits a little
        longer for the first to complete it (one write, not one each)."""
        state = self.state
        if state.complete or state.deadline is None or self.node not in state.participants:
            return False
        left = (state.deadline - utc_now()).total_seconds()
        grace = 0.0 if together.first_member(state) == self.node else 1.0  # rounds.COMPLETE_GRACE_S
        if left > 0 or left + grace <= 0:
            return False
        await self.wire.wait([protocol.signal_key(self.key, state.round, protocol.COMPLETE)], left + grace)
        self.last_sync = -1.0
        return True

    async def _signal(self) -> None:
        """After a write that won: the round it opened or completed, told to whoever waits; a
        change of a complete round's members, to its counter."""
        seen, state = self.seen, self.state
        if together.changed_since(seen, state):
            counter = protocol.signal_key(self.key, state.round, protocol.CHANGED)
            count = await self.wire.add(counter, 1)
            if self.fleet.settings.watch:
                await self.wire.set(protocol.mark_key(counter, count), b"1")
        if state.round > seen[0]:
            await self.wire.set(protocol.signal_key(self.key, state.round, protocol.OPENED), b"1")
        if state.complete and (state.round > seen[0] or not seen[1]):
            await self.wire.set(protocol.signal_key(self.key, state.round, protocol.COMPLETE), b"1")

    async def _read_said(self, now: float) -> list[together.Said]:
        this = together.interval_of(now, self.settings.keep_alive_interval.total_seconds())
        said: list[together.Said] = []
        for i in (this - 1, this):  # compare_set(k, "", ""): the value, or an empty key made
            said += self.fleet.said(await self.wire.compare_set(protocol.announced_key(self.key, i), b"", b""))
        return said

    async def _beat_together(self, op: Any) -> Any:
        """torch wants this node's heartbeat written: say it lives (once an interval), and write
        it only when what it said before was not taken in (together.beat_due); else wait for
        the next look (a join) or be done (a heartbeat)."""
        now = time.time()
        interval = self.settings.keep_alive_interval.total_seconds()
        if now - self.said_alive >= interval:
            self.said_alive = now
            await self._say(together.ALIVE, -1, now)
        if together.beat_due(self.state, self.node, self.settings.keep_alive_interval, time.time()):
            return A.KEEP_ALIVE
        return A.SYNC if isinstance(op, dr._RendezvousJoinOp) else A.FINISH

    async def _say(self, kind: str, round_: int, when: float) -> None:
        interval = together.interval_of(when, self.settings.keep_alive_interval.total_seconds())
        await self.wire.append(protocol.announced_key(self.key, interval), together.line(kind, round_, self.node, when))

    async def _together(self, action: Any) -> None:
        """Our executor's actions with ``agent/together.py``: say what this node does (a join or
        a leave once an interval while it lasts; a heartbeat at each tick), read what the
        others said this interval and the last, and take it in with this node's own change."""
        state, settings, node = self.state, self.settings, self.node
        now = time.time()
        interval_s = settings.keep_alive_interval.total_seconds()
        kind = {A.ADD_TO_PARTICIPANTS: together.JOIN, A.REMOVE_FROM_PARTICIPANTS: together.LEAVE}.get(action)
        if kind is not None and (self.announced != (kind, state.round) or now - self.announced_at >= interval_s):
            self.announced, self.announced_at = (kind, state.round), now
            await self._say(kind, state.round, now)
        this = together.interval_of(now, interval_s)
        said: list[together.Said] = []
        for i in (this - 1, this):  # compare_set(k, "", ""): the value, or an empty key made
            said += self.fleet.said(await self.wire.compare_set(protocol.announced_key(self.key, i), b"", b""))
        if action == A.REMOVE_FROM_PARTICIPANTS:
            together.take_leaves(state, said, self.fleet.node_of, node)
        apply(action, state, node, settings)
        if action == A.ADD_TO_PARTICIPANTS:
            together.take_joins(state, said, settings, self.fleet.node_of, now)
        together.take_alive(state, said, self.fleet.node_of)
        self.consumed = this - 2  # the interval whose key goes once this write wins

    async def _closing_at_target(self, action: Any) -> Any:
        """rounds._closing_at_target: a round holding TARGET_KEY's nodes closes at once (the
        key is read only when the rest holds; a cluster's store has none)."""
        state, settings = self.state, self.settings
        held = len(state.participants)
        if not state.complete and self.node in state.participants and settings.min_nodes <= held <= settings.max_nodes:
            if await self.wire.check([protocol.TARGET_KEY]):
                target = store_link.parse_target((await self.wire.get(protocol.TARGET_KEY)).decode())
                if store_link.holds_target(held, target):
                    return A.MARK_RENDEZVOUS_COMPLETE
        return action

    # the handler (torch's DynamicRendezvousHandler) and the agent's use of the round's store

    async def start(self) -> None:
        await self.wire.connect()
        await self.wire.compare_set(self.key, b"", SENTINEL)  # C10dRendezvousBackend.__init__
        if await self.wire.check([protocol.STORE_ID_KEY]):  # NotebookBackend: the store's id
            await self.wire.get(protocol.STORE_ID_KEY)
        self.task = asyncio.ensure_future(self._life())

    async def _life(self) -> None:
        while True:
            await self.next_rendezvous()
            await self._monitor()

    async def next_rendezvous(self) -> None:
        self._stop_heartbeats()
        if self.state.round == 0 and not (self.fleet.settings.together and self.joined is not None):
            # torch's first-join jitter; ours waits it only once (rounds.RoundRules.joined_once)
            await asyncio.sleep(random.uniform(0, 0.3))
        deadline = time.monotonic() + self.settings.timeout.join.total_seconds()
        await self.run(dr._RendezvousExitOp(), deadline, regroup=True)
        if self.joined is not None:  # a regroup: it knows the next round's members (ours), or is out (torch's)
            self.marks.agreed[self.joined[0] + 1] = time.monotonic()
        await self.run(dr._RendezvousJoinOp(), deadline, update=True)
        self.beating = asyncio.Event()
        asyncio.ensure_future(self._keep_alive(self.beating))
        round_, rank, world = self.state.round, self.state.participants[self.node], len(self.state.participants)
        self.round, self.members = round_, frozenset(self.state.participants)
        self.joined = (round_, self.members)
        self.marks.rounds[round_] = time.monotonic()
        self.marks.rank[round_] = rank
        prefix = f"torch.rendezvous.{self.fleet.run_id}.{round_}/"
        # RendezvousStoreInfo.build (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
        if rank == 0:
            await self.wire.set(prefix + "MASTER_ADDR", self.node.addr.encode())
            await self.wire.set(prefix + "MASTER_PORT", b"29500")
        await self._get(prefix + "MASTER_ADDR")
        await self._get(prefix + "MASTER_PORT")
        # SimpleElasticAgent._assign_worker_ranks
        info = json.dumps({"role": "default", "rank": rank, "local_world_size": 1}).encode()
        await self.wire.set(f"{prefix}torchelastic/role_info/{rank}", info)
        if rank == 0:
            keys = [f"{prefix}torchelastic/role_info/{i}" for i in range(world)]
            await self._wait(keys)
            infos = await self.wire.multi_get(keys)
            values = [json.dumps([i, len(infos), i, len(infos)]).encode() for i in range(len(infos))]
            await self.wire.multi_set([f"{prefix}torchelastic/assigned_ranks/{i}" for i in range(world)], values)
        await self._get(f"{prefix}torchelastic/assigned_ranks/{rank}")
        self.marks.ranked[round_] = time.monotonic()

    async def _get(self, key: str) -> bytes:
        await self._wait([key])
        return await self.wire.get(key)

    async def _wait(self, keys: list[str]) -> None:
        """store_link.BoundedStore.wait: checks, 10 ms apart doubling to STORE_POLL_MAX_S ("poll"), or
        torch's WAIT, answered by the store when the keys come, at most WAIT_S long ("wait")."""
        if self.fleet.settings.store_wait == "wait":
            while not await self.wire.wait(keys, getattr(store_link, "STORE_WAIT_S", 1.0)):
                pass
            return
        pause = 0.01
        while not await self.wire.check(keys):
            await asyncio.sleep(pause)
            pause = min(2 * pause, store_link.STORE_POLL_MAX_S)

    async def _keep_alive(self, stopped: asyncio.Event) -> None:
        """torch's _PeriodicTimer: a heartbeat every interval until stopped; one under way when
        it is stopped goes to its end (a call is never cut in the middle: the connection's next
        reply would be the cut call's)."""
        interval = self.settings.keep_alive_interval.total_seconds()
        while True:
            try:
                await asyncio.wait_for(stopped.wait(), interval)
                return
            except asyncio.TimeoutError:
                pass
            if self.gone:
                return
            async with self.lock:
                deadline = time.monotonic() + self.settings.timeout.heartbeat.total_seconds()
                try:
                    await self.run(dr._RendezvousKeepAliveOp(), deadline)
                except (TimeoutError, RuntimeError):
                    self.missed_beats += 1  # torch's _keep_alive logs a missed heartbeat and goes on

    def _stop_heartbeats(self) -> None:
        if self.beating is not None:
            self.beating.set()
            self.beating = None

    async def _monitor(self) -> None:
        """torchrun's monitor (num_nodes_waiting every monitor_interval) and our departure watch
        (round_state every watch_s): each a sync under the heartbeat lock, which reads the store
        only once the cached state is cache_s old; so this wakes when the next of them reads."""
        monitor_s = self.fleet.settings.monitor_s
        while True:
            await self._arm_watch()
            due = self.last_sync + self.fleet.settings.cache_s
            if self.fleet.settings.regroup and self.seen[1] and self.watch_key is None:  # its next counter look
                due = min(due, self.changes[2] + together.CHANGE_LOOK_S)
            wait = max(0.0, due - time.monotonic())
            try:
                await asyncio.wait_for(
                    self.woken.wait(), monitor_s * (int(wait / monitor_s) + 1) if wait > 0 else monitor_s
                )
                self.woken.clear()
                if self.cut:
                    return
                async with self.lock:  # rounds.round_moved: the count, for the next mark
                    await self._moved(time.monotonic(), now_anyway=True)
            except asyncio.TimeoutError:
                pass
            if self.cut:
                return
            async with self.lock:
                await self.sync()
            state = self.state
            if state.wait_list:
                self.marks.waiting.append(time.monotonic())
                return  # torchrun's agent restarts its workers for the nodes waiting
            # a complete round's members only leave it: as many as it began with, none gone
            if state.round == self.round and len(state.participants) < len(self.members):
                gone = self.members.difference(state.participants)  # the set's hashes: no node's __hash__
                if gone:
                    self.marks.departures.append((time.monotonic(), gone))
                    return  # our watch ends the workers; the agent regroups, not charged

    async def _arm_watch(self) -> None:
        """change_watch.next_mark: in a complete round, the key of its counter's next count (the
        count read once a round); a WAIT on another round's key is cut, and made anew on a new
        connection."""
        if not (self.fleet.settings.watch and self.fleet.settings.regroup):
            return
        round_, complete = self.seen[:2]
        if complete and self.changes[0] != round_:
            async with self.lock:
                await self._moved(time.monotonic(), now_anyway=True)
        key = (
            protocol.mark_key(protocol.signal_key(self.key, round_, protocol.CHANGED), self.changes[1] + 1)
            if complete and self.changes[0] == round_
            else None
        )
        if key == self.watch_key:
            return
        self.watch_key = key
        if key is None:
            self.watch_armed.clear()
            return
        self.watch_armed.set()
        if self.watch_task is not None and self.watching is not None and self.watching != key:
            self._end_watch()  # its WAIT on the old round's key is cut: its connection shut
            self.watch_task = self.watch = self.watching = None
        if self.watch_task is None:
            self.watch = Wire(self.fleet.host, self.fleet.port, self.fleet.counts)
            await self.watch.connect()
            self.watch_task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        assert self.watch is not None
        while True:
            await self.watch_armed.wait()
            key = self.watching = self.watch_key
            if key is None:
                continue
            answered = await self.watch.wait([key], 300.0)
            self.watching = None
            if not answered or key != self.watch_key:
                continue  # ran its time, or released for another round: no answer
            self.watch_key = None
            self.watch_armed.clear()
            self.last_sync = -1.0  # torch's next sync reads the store
            self.woken.set()

    def crash(self) -> None:
        """The node is lost: nothing more from it, its connection closed."""
        self.gone = self.cut = True
        self._stop_heartbeats()
        if self.task is not None:
            self.task.cancel()
        self._end_watch()
        self.wire.close()

    def _end_watch(self) -> None:
        if self.watch_task is not None:
            self.watch_task.cancel()
        if self.watch is not None:
            self.watch.close()

    async def leave(self) -> None:
        """The node leaves (a scale-down, a notice): rounds.leave_round, then gone. Its
        life is cut where it is; the exit goes on a connection of its own (the cut call's reply
        would come on the old one)."""
        self.cut = True
        self._stop_heartbeats()
        if self.task is not None:
            self.task.cancel()
        self._end_watch()
        self.wire.close()
        self.wire = Wire(self.fleet.host, self.fleet.port, self.fleet.counts)
        await self.wire.connect()
        self.dirty, self.last_sync = False, -1.0
        await self.run(dr._RendezvousExitOp(), time.monotonic() + 5)
        self.gone = True
        self.wire.close()


def apply(action: Any, state: dr._RendezvousState, node: dr._NodeDesc, settings: dr.RendezvousSettings) -> None:
    """What torch's _DistributedRendezvousOpExecutor does for ``action`` (its _keep_alive,
    _add_to_participants, ... methods, without their event records)."""
    now = utc_now()
    if action == A.KEEP_ALIVE:
        state.last_heartbeats[node] = now
    elif action == A.ADD_TO_PARTICIPANTS:
        state.wait_list.discard(node)
        state.participants[node] = 0
        state.last_heartbeats[node] = now
        if len(state.participants) == settings.min_nodes:
            state.deadline = now + settings.timeout.last_call
        if len(state.participants) == settings.max_nodes:
            apply(A.MARK_RENDEZVOUS_COMPLETE, state, node, settings)
    elif action == A.ADD_TO_WAIT_LIST:
        state.redundancy_list.discard(node)
        state.wait_list.add(node)
        state.last_heartbeats[node] = now
    elif action == A.ADD_TO_REDUNDANCY_LIST:
        state.redundancy_list.add(node)
        state.last_heartbeats[node] = now
    elif action == A.REMOVE_FROM_PARTICIPANTS:
        del state.participants[node]
        del state.last_heartbeats[node]
        dr._remove_participant_epilogue(state, settings)
    elif action == A.REMOVE_FROM_WAIT_LIST:
        state.wait_list.remove(node)
        del state.last_heartbeats[node]
    elif action == A.REMOVE_FROM_REDUNDANCY_LIST:
        state.redundancy_list.remove(node)
        del state.last_heartbeats[node]
    elif action == A.MARK_RENDEZVOUS_COMPLETE:
        state.complete = True
        state.deadline = None
        # torch sorts the nodes themselves (a dataclass ordered by addr, pid, local_id): the
        # same order by a key, without the dataclass's comparison in Python.
        for rank, member in enumerate(sorted(state.participants, key=lambda n: (n.addr, n.pid, n.local_id))):
            state.participants[member] = rank
    elif action == A.MARK_RENDEZVOUS_CLOSED:
        state.closed = True
    else:
        raise ValueError(action)


class Fleet:
    """Many agents in this process's event loop, against one store."""

    def __init__(self, host: str, port: int, settings: Settings, run_id: str = "sim") -> None:
        self.host, self.port, self.settings, self.run_id = host, port, settings, run_id
        self.torch_settings = settings.torch(run_id)
        self.counts = Counts()
        self.codec = Codec()
        self.agents: list[Agent] = []
        self._oldest: OrderedDict[int, tuple[dr._RendezvousState, datetime]] = OrderedDict()
        self._said: OrderedDict[bytes, list[together.Said]] = OrderedDict()
        self.nodes: dict[tuple[str, int, int], dr._NodeDesc] = {}  # one object per node
        self.state_writes = 0  # compare_sets of the state (each a whole round's bytes)
        self.state_writes_won = 0

    def node_of(self, fields: tuple[str, int, int]) -> dr._NodeDesc:
        """The one object of this node here (a dataclass's hash is Python code: by object)."""
        node = self.nodes.get(fields)
        if node is None:
            node = self.nodes[fields] = dr._NodeDesc(*fields)
        return node

    def said(self, value: bytes) -> list[together.Said]:
        known = self._said.get(value)
        if known is None:
            known = self._said[value] = together.parse(value)
            if len(self._said) > 64:
                self._said.popitem(last=False)
        return known

    def oldest(self, state: dr._RendezvousState) -> datetime:
        """The oldest heartbeat in ``state`` (kept for shared states: each is read by many)."""
        known = self._oldest.get(id(state))
        if known is not None and known[0] is state:
            return known[1]
        oldest = min(state.last_heartbeats.values())
        self._oldest[id(state)] = (state, oldest)
        if len(self._oldest) > 512:
            self._oldest.popitem(last=False)
        return oldest

    async def add(self, n: int) -> list[Agent]:
        new = [Agent(self, len(self.agents) + i) for i in range(n)]
        self.agents += new
        await asyncio.gather(*(a.start() for a in new))
        return new

    def live(self) -> list[Agent]:
        return [a for a in self.agents if not a.gone]

    async def until(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Seconds until ``predicate()`` holds (checked every 10 ms); TimeoutError naming ``what``."""
        t0 = time.monotonic()
        while not predicate():
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"{what}: not within {timeout_s:g} s")
            await asyncio.sleep(0.01)
        return time.monotonic() - t0

    def ranked_in(self, round_: int | None = None) -> list[Agent]:
        """Live agents whose workers have ranks in ``round_`` (default: the latest any has)."""
        live = self.live()
        if round_ is None:
            round_ = max((max(a.marks.ranked, default=-1) for a in live), default=-1)
        return [a for a in live if round_ in a.marks.ranked]

    def latest_round(self) -> int:
        return max((max(a.marks.ranked, default=-1) for a in self.live()), default=-1)

    def close(self) -> None:
        for agent in self.agents:
            if not agent.gone:
                agent.crash()


def utc_now() -> datetime:
    """Now, as this torch's rendezvous writes it (``AWARE``)."""
    now = datetime.now(timezone.utc)
    return now if AWARE else now.replace(tzinfo=None)

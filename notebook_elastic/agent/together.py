"""Nodes that join, leave and beat together: one write of the rendezvous state for many (#40).

torch's c10d rendezvous keeps a job's whole round in one store key, written with compare_set by
each node for itself: to join, to leave, and every ``keep_alive_interval`` to say it lives. A
write that loses to another's is made again on the state that won; at 1,024 nodes the state is
85 kB and heartbeats alone ask 205 writes a second of it (5 s apart), more than the key can
take one at a time (each write is a read, a decode, an encode and a round trip): the first
round of 1,024 simulated nodes never closed, and nodes in it were dropped for heartbeats that
could not be written (``benchmarks/thousand.py``).

So each of our nodes also *says* what it does, in a small key beside the state (``announced``,
one line per saying, appended: cheap and never lost to another's write), and whoever writes the
state takes in what the others said:
- ``join R``: this node is joining round R; a node adding itself to round R adds every node
  that said so too (up to the round's maximum), each with its own heartbeat: the round fills in
  a few writes instead of one each;
- ``leave R``: it is leaving round R; a node leaving R takes the others out with it;
- ``alive``: it lives, at this time; every write sets each member's heartbeat to the latest it
  said (never older than the state's). ``ON_DUTY`` members write each interval, in turn by
  rank; another writes its own heartbeat only when what it said has not been taken in
  (``beat_due``): in steady state about one write per interval for the job, not one per node.
Each change is one torch would make (a node's own join, leave or heartbeat, at the time it
said), so torch's own agents may share the rendezvous: they read and write the same state, and
what they say is only what they write. Sayings go to a key per interval (``announced_key``,
contract/protocol.py); a writer reads this interval's and the last (each node says it lives once
an interval, so both hold a saying of every node that lives), and one whose write won deletes
the key of the interval before those. A saying that ages out unread costs that node its own
write, nothing else. A key is read with ``compare_set(key, "", "")``: its value, or an empty
key made where there was none (torch's ``get`` would wait for a key that is not there).

The standard library, our cross-process names and torch's state classes only, passed in: the
agent (``rounds.py``) and the simulated agents of the benchmark (``tests/rdzv_sim.py``) run the
same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..contract.protocol import announced_key
from .torch_adapter import rendezvous_times_aware

#: A node's fields, which torch's node equals and hashes by: a tuple compared and hashed in C,
#: where the node's own ``__hash__`` and ``__eq__`` are Python (a dataclass's), and a look over
#: a round of 1,024 members was 1,024 of each.
_fields = attrgetter("addr", "pid", "local_id")


def in_order(nodes: Iterable[Any]) -> list[Any]:
    """``nodes`` in torch's order of nodes (``_NodeDesc`` orders by its fields: its ranks)."""
    return sorted(nodes, key=_fields)


def first_member(state: Any) -> Any:
    """The round's first member in torch's order: the one that completes it at its deadline."""
    return min(state.participants, key=_fields)


if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore

JOIN, LEAVE, ALIVE, REGROUP = "join", "leave", "alive", "regroup"
KINDS = (JOIN, LEAVE, ALIVE, REGROUP)
#: A node writes its own heartbeat when the state's is older than this many intervals: what it
#: said one interval ago was not taken in (torch writes at one interval) ...
BEAT_AFTER_INTERVALS = 1.5
#: ... or, in a complete round, this many when it is not on duty (``beat_due``): then ``ON_DUTY``
#: of the members overdue so write, in turn, as a backup of those on duty ...
OFF_DUTY_INTERVALS = 2.5
#: ... and every member overdue this many (the backups too were slow, or gone).
LAST_RESORT_INTERVALS = OFF_DUTY_INTERVALS + 0.5
#: How many members of a complete round write the state each interval, taking in what all said.
ON_DUTY = 2
#: How much of the heartbeat window stays past the oldest a heartbeat taken in may be.
MARGIN_S = 5.0


@dataclass(frozen=True)
class Said:
    kind: str
    round: int
    node: tuple[str, int, int]  # addr, pid, local_id: torch's _NodeDesc fields
    when: float  # seconds since the epoch


def interval_of(when: float, interval_s: float) -> int:
    return int(when // interval_s)


def line(kind: str, round_: int, node: Any, when: float) -> bytes:
    """One saying, as appended to the key (an address has no spaces: torch's node address is a
    host name or an IP)."""
    return f"{kind} {round_} {node.addr} {node.pid} {node.local_id} {when:.3f}\n".encode()


def parse(data: bytes) -> list[Said]:
    """The sayings in the key's value; a line that is not one (a torn append) is skipped."""
    out = []
    for raw in data.decode(errors="replace").splitlines():
        parts = raw.split()
        if len(parts) != 6 or parts[0] not in KINDS:
            continue
        try:
            out.append(Said(parts[0], int(parts[1]), (parts[2], int(parts[3]), int(parts[4])), float(parts[5])))
        except ValueError:
            continue
    return out


def _time_like(example: datetime | None, when: float) -> datetime:
    """``when`` as the state's own times are, or, in a state with none yet, as this torch's are
    (an aware one in an empty round on torch 2.4 broke its keep-alive's comparison)."""
    aware = datetime.fromtimestamp(when, timezone.utc)
    keep = example.tzinfo is not None if example is not None else rendezvous_times_aware()
    return aware if keep else aware.replace(tzinfo=None)


def _example(state: Any) -> datetime | None:
    return next(iter(state.last_heartbeats.values()), None)


def take_alive(state: Any, said: Iterable[Said], node_of: Callable[[tuple[str, int, int]], Any]) -> int:
    """Set each member's heartbeat to the latest time it said it lives, where that is newer;
    the number of members refreshed."""
    latest: dict[tuple[str, int, int], float] = {}
    for s in said:
        if s.kind == ALIVE and s.when > latest.get(s.node, 0.0):
            latest[s.node] = s.when
    example, refreshed = _example(state), 0
    for fields, when in latest.items():
        node = node_of(fields)
        beat = state.last_heartbeats.get(node)
        if beat is None:
            continue  # not a member (left, or dropped): its saying is stale
        said_at = _time_like(example, when)
        if said_at > beat:
            state.last_heartbeats[node] = said_at
            refreshed += 1
    return refreshed


def take_joins(
    state: Any, said: Iterable[Said], settings: Any, node_of: Callable[[tuple[str, int, int]], Any], now: float
) -> int:
    """Add every node that said it joins this (open) round and said so within the heartbeat
    window, as torch's ``_add_to_participants`` adds one, up to the round's maximum; the round's
    deadline and completion as torch sets them. The number added."""
    if state.complete or state.closed:
        return 0
    window = (settings.keep_alive_interval * settings.keep_alive_max_attempt).total_seconds()
    before, added, example = len(state.participants), 0, _example(state)
    for s in said:
        if s.kind != JOIN or s.round != state.round or now - s.when > window:
            continue
        if len(state.participants) >= settings.max_nodes:
            break
        node = node_of(s.node)
        if node in state.participants or node in state.wait_list or node in state.redundancy_list:
            continue
        state.participants[node] = 0
        state.last_heartbeats[node] = _time_like(example, s.when)
        added += 1
    held = len(state.participants)
    if added and before < settings.min_nodes <= held and state.deadline is None:
        state.deadline = _time_like(example, now) + settings.timeout.last_call
    if added and held == settings.max_nodes:
        state.complete = True
        state.deadline = None
        for rank, member in enumerate(in_order(state.participants)):
            state.participants[member] = rank
    return added


def take_leaves(state: Any, said: Iterable[Said], node_of: Callable[[tuple[str, int, int]], Any], me: Any) -> list[Any]:
    """Take out of this round every other member that said it leaves it (torch's
    ``_remove_from_participants`` for each; its epilogue runs with the caller's own removal,
    after these); the members taken out."""
    gone = []
    for s in said:
        if s.kind != LEAVE or s.round != state.round:
            continue
        node = node_of(s.node)
        if node != me and node in state.participants:
            del state.participants[node]
            state.last_heartbeats.pop(node, None)
            gone.append(node)
    return gone


def beat_due(state: Any, node: Any, interval: timedelta, now: float) -> bool:
    """Whether this node writes the state now to keep its heartbeat (torch already wants one:
    the state's is over an interval old). In a complete round, the ``ON_DUTY`` members on duty
    this interval (in turn by rank) write, taking in what every node said; another writes only
    when the state's heartbeat for it is older than ``OFF_DUTY_INTERVALS`` (what it said was not
    taken in: those on duty are gone or slow). So in steady state about ``ON_DUTY`` nodes try a
    write each interval, not every node at once when their heartbeats come due together (1,207
    writes tried in two intervals by 1,024 simulated nodes, 6 of them won). While a round forms
    (no ranks yet), or for a node no member, the limit is ``BEAT_AFTER_INTERVALS``.

    Off duty, the members overdue come due together too (a round that took long to form, or
    those on duty starved: 434 of 1,024 simulated nodes at once, whose writes lost to one
    another until heartbeats expired and the round broke). So of them, ``ON_DUTY`` write, in
    turn by rank (``_backup``): one write takes in what all said; only past
    ``LAST_RESORT_INTERVALS`` does every member overdue write its own."""
    beat = state.last_heartbeats.get(node)
    if beat is None:
        return True
    this = interval_of(now, interval.total_seconds())
    duty = _on_duty(state, node, this)
    if duty:
        return True
    at = _time_like(beat, now)
    if duty is None:
        return bool(beat < at - BEAT_AFTER_INTERVALS * interval)
    overdue = at - OFF_DUTY_INTERVALS * interval
    if beat >= overdue:
        return False
    return beat < at - LAST_RESORT_INTERVALS * interval or _backup(state, node, overdue, this)


def _backup(state: Any, node: Any, limit: datetime, this: int) -> bool:
    """Whether ``node``, overdue off duty (its heartbeat older than ``limit``), is one of the
    ``ON_DUTY`` of the overdue members off duty that write in interval ``this``: in turn by rank,
    each reading the same state picks the same."""
    ranks, n = state.participants, len(state.participants)
    # The heartbeats older than the limit first (compared in C), a member's rank only for those.
    late = (ranks.get(member) for member, beat in state.last_heartbeats.items() if beat < limit)
    overdue = sorted(rank for rank in late if rank is not None and (rank - this) % n >= ON_DUTY)
    return (overdue.index(state.participants[node]) - this * ON_DUTY) % len(overdue) < ON_DUTY


def duty_write(state: Any, node: Any, interval: timedelta, now: float, last: int | None) -> int | None:
    """The interval in which ``node``, on duty, writes the state for the others though torch
    wants no heartbeat of it (its own is fresh): once an interval, where a member's heartbeat
    is older than ``BEAT_AFTER_INTERVALS``; else None. (Only those on duty look at every
    member's heartbeat, at their own heartbeat.)"""
    this = interval_of(now, interval.total_seconds())
    if this == last or not _on_duty(state, node, this):
        return None
    oldest = min(state.last_heartbeats.values())  # a member's at least: not empty
    return this if oldest < _time_like(oldest, now) - BEAT_AFTER_INTERVALS * interval else None


def _on_duty(state: Any, node: Any, this: int) -> bool | None:
    """Whether ``node`` writes the heartbeats in interval number ``this``: ``ON_DUTY`` members
    of a complete round, in turn by rank. None for a node that is no member of a complete
    round (its ranks not given yet): the rule does not apply."""
    rank = state.participants.get(node)
    if rank is None or not state.complete:
        return None
    return bool((rank - this) % len(state.participants) < ON_DUTY)


def beat_older(state: Any, node: Any, interval: timedelta, now: float) -> bool:
    """Whether the state's heartbeat of ``node`` is older than ``interval`` (torch's
    ``_should_keep_alive``), or absent."""
    beat = state.last_heartbeats.get(node)
    return beat is None or beat < _time_like(beat, now) - interval


def beats_together(settings: Any) -> bool:
    """Whether a job's heartbeats may go together: a heartbeat taken in by another's write is
    up to ``LAST_RESORT_INTERVALS`` + 1 intervals old before this node writes its own (it looks
    once an interval), so the window (interval x max_attempt) keeps ``MARGIN_S`` past that (a
    cluster's 5 s x 6: yes; the local 1 s x 3, sized to notice a lost node in 3 s: no, each
    node writes its own, as torch's do)."""
    interval: float = settings.keep_alive_interval.total_seconds()
    attempts: int = settings.keep_alive_max_attempt
    return (attempts - LAST_RESORT_INTERVALS - 1) * interval >= MARGIN_S


class Sayings:
    """One node's side: what it says and when, what it reads, the key it deletes. Each store
    call goes through ``call(fn, *args)`` (the agent's deadline); a failing call is the caller's
    to handle (a node that cannot say or read writes for itself, as torch's do)."""

    def __init__(self, state_key: str, node: Any, interval_s: float, call: Callable[..., Any]) -> None:
        self.state_key, self.node, self.interval_s, self.call = state_key, node, interval_s, call
        self.said: dict[tuple[str, int], float] = {}  # (kind, round) -> when it said so last
        self.stale: int | None = None  # the interval whose key goes once the pending write wins
        self.deleted = -1

    def say(self, store: Any, kind: str, round_: int, now: float) -> None:
        # ``store``: torch's (its ``append``, which every torch of the range has, is not in torch's stub).
        """Say it, unless it was said less than an interval ago (a join or a leave lasts)."""
        if now - self.said.get((kind, round_), 0.0) < self.interval_s:
            return
        self.said = {k: t for k, t in self.said.items() if now - t < self.interval_s} | {(kind, round_): now}
        this = interval_of(now, self.interval_s)
        self.call(store.append, announced_key(self.state_key, this), line(kind, round_, self.node, now))

    def read(self, store: KeyStore, now: float) -> list[Said]:
        """What was said this interval and the last (``compare_set(k, "", "")``: the value, or an
        empty key made where there was none); the key before those goes once this node's next
        write wins (``won``)."""
        this = interval_of(now, self.interval_s)
        said: list[Said] = []
        for i in (this - 1, this):
            said += parse(self.call(store.compare_set, announced_key(self.state_key, i), "", ""))
        self.stale = this - 2
        return said

    def won(self, store: KeyStore | None) -> None:
        stale, self.stale = self.stale, None
        if store is not None and stale is not None and stale > self.deleted:
            self.deleted = stale
            self.call(store.delete_key, announced_key(self.state_key, stale))


# -- a change of members in one write (#40 item 3) ----------------------------------------------
#
# torch regroups a complete round R by having every member leave it (the last one out opens
# R+1) and join R+1 again: 2N writes of the state, one after another, each a read, a decode and
# an encode of the whole round (85 kB at 1,024 nodes): 35 s at 1,024 nodes, even together. Ours
# agree instead: each member that sees a change of R's members says ``regroup R`` (an append to
# the small key), and the lowest ranked member of R, once every member of R has said so, writes
# R+1 at once: the state torch's own rounds would reach if every one of them had left R and
# joined R+1 at the same moment, with the nodes waiting (``open_next_round``). The others wait on
# a key of that round the store answers when it is set (``signal_key``), not on the state.
# What each waits for is only ever the state torch keeps: a member of R that is not ours (torch's
# own agent, which never says ``regroup``) leaves R and waits as torch does, and R+1 is written
# only once it is out of R (so it is never written a round it would then leave); a member that is
# lost is still only dropped when its heartbeat expires (until then R waits for it, as torch's
# round does); a waiting node joins R+1 itself, as torch's do (one that went away is in no round).

#: How often a member looks at its round's change counter between two reads of the round.
CHANGE_LOOK_S = 0.5


def membership(state: Any) -> tuple[int, bool, int, int]:
    """``(round, complete, members, waiting)`` of ``state``: what ``changed_since`` compares."""
    return state.round, state.complete, len(state.participants), len(state.wait_list)


def changed_since(before: tuple[int, bool, int, int], state: Any) -> bool:
    """Whether a write that made ``state`` of a round read as ``before`` (``membership``) took
    a member out of that complete round or put a node on its wait list: a change its members
    act on (they regroup), told through the round's ``CHANGED`` counter."""
    return bool(
        state.complete
        and before[0] == state.round
        and before[1]
        and (len(state.participants) < before[2] or len(state.wait_list) > before[3])
    )


def look_due(looked: tuple[int, int, float], round_: int, now: float) -> bool:
    """Whether a member looks at round ``round_``'s change counter now: ``looked`` (round, count,
    when) was its last look; not within ``CHANGE_LOOK_S`` of it in the same round."""
    return looked[0] != round_ or now - looked[2] >= CHANGE_LOOK_S


def looked_at(
    looked: tuple[int, int, float], round_: int, count: int, now: float
) -> tuple[tuple[int, int, float], bool]:
    """After a look that read ``count`` (``add(signal_key(..., CHANGED), 0)``: a counter, made at
    0 where there is none): the next ``looked``, and whether the round moved since the last."""
    return (round_, count, now), looked[0] == round_ and count != looked[1]


def seconds_to(when: datetime, now: float) -> float:
    """Seconds from ``now`` (since the epoch) to ``when``, a time of the state."""
    return (when - _time_like(when, now)).total_seconds()


def changed(state: Any, members: frozenset[Any]) -> bool:
    """Whether the complete round a node joined with ``members`` has changed: a member gone
    (left, or dropped at the keep-alive bound) or a node waiting to join."""
    return bool(state.wait_list) or frozenset(state.participants) != members


def leader(state: Any) -> Any:
    """The member of a complete round that writes the next one: the lowest ranked (of equal
    ranks, the lowest by its fields)."""
    ranks = state.participants
    lowest = min(ranks.values())
    return min((node for node, rank in ranks.items() if rank == lowest), key=_fields)


def regrouping(state: Any, said: Iterable[Said], me: Any) -> bool:
    """Whether every member of the round (``me`` aside) said it regroups from it."""
    ready = {s.node for s in said if s.kind == REGROUP and s.round == state.round}
    ready.add(_fields(me))
    return all(_fields(n) in ready for n in state.participants)


def open_next_round(state: Any, settings: Any, me: Any, now: float) -> list[Any]:
    """Make ``state`` (a complete round R whose members all regroup) round R+1 as torch's rounds
    would make it if they all left R and joined R+1 at once (``_remove_participant_epilogue``,
    then ``_add_to_participants`` for each): its members are R's; its deadline set once it holds
    ``min_nodes``; complete, with torch's ranks, once it holds ``max_nodes``. The nodes waiting
    are not put in: each joins R+1 itself, as torch's do (a write that takes in the others'), so
    a node that went away while it waited is in no round (put in, it was a member the others
    waited for: a node sent away by the supervisor hung its job's next round). Its members."""
    example = _example(state)
    members = list(state.participants)
    state.round += 1
    state.complete = False
    state.deadline = None
    state.participants = dict.fromkeys(members, 0)
    state.last_heartbeats[me] = _time_like(example, now)
    if len(members) >= settings.min_nodes:
        state.deadline = _time_like(example, now) + settings.timeout.last_call
    if len(members) >= settings.max_nodes:
        state.complete = True
        state.deadline = None
        for rank, member in enumerate(in_order(state.participants)):
            state.participants[member] = rank
    return in_order(state.participants)

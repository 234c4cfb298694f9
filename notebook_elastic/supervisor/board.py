"""What the supervisor tells the agents through the job's store, beside their rendezvous round
(agent/rounds.py reads it): the number of nodes the job runs (a round that holds that many
closes at once) and the agents it saw die (their peers drop them from the round at once). It
holds the store torch's TCPStore server hosts, from the time ``Supervisor.run`` hosts it, and
the port it listens on; ``Nodes`` and ``Commands`` are handed this, not the supervisor."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from ..contract import protocol
from ..contract.protocol import GONE_KEY, TARGET_KEY
from ..plumbing import log

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore


class Board:
    def __init__(self) -> None:
        self.store: KeyStore | None = None  # torch's TCPStore server, once the supervisor hosts it
        self.port = 0  # the port it listens on, from the supervisor's run() on
        self._published_target: str | None = None  # the target the store holds (TARGET_KEY)
        self._gone: dict[str, float] = {}  # agent pid -> when it was reaped (GONE_KEY)
        # The latest round an agent said it formed: (epoch, round, torch's state key of its run).
        self._round: tuple[int, int, str] | None = None
        # A node went since the latest round formed: its survivors regroup, standing still.
        self._regrouping = False

    def _tell_agents(self, key: str, value: str) -> bool:
        """Set what the agents' rendezvous reads beside its round (agent/rounds.py); False when
        the store is not hosted yet or is going (the job ends): the agents then do as torch."""
        if self.store is None:
            return False
        try:
            self.store.set(key, value)
            return True
        except Exception:
            log.get("supervisor").debug("could not tell the agents %s through the store", key, exc_info=True)
            return False

    def publish_target(self, target: int, survivors: int | None = None) -> None:
        """The number of nodes the job runs, in the store: a round that holds that many closes
        at once instead of waiting last_call_timeout for nodes that will not come. While a
        departure regroups the survivors, given ``survivors`` (the staying nodes that were in a
        round), a round closes once it holds at least those (``"2+"``): survivors standing still
        do not wait for a joiner still starting (a scale-up's on Slurm, seconds away, held a
        loss's survivors 5 s, an adversary's pass); it comes in a change of its own, which costs
        them a fraction of that."""
        value = str(target)
        if survivors is not None and self._regrouping and 0 < survivors < target:
            value = f"{survivors}+"
        if value != self._published_target and self._tell_agents(TARGET_KEY, value):
            self._published_target = value

    @property
    def latest_round(self) -> tuple[int, int] | None:
        """(epoch, round) of the latest round an agent said it formed."""
        return None if self._round is None else self._round[:2]

    def regroup(self, target: int, survivors: int | None) -> None:
        """A member of the latest round is going or gone (told to, signalled, reaped): until the
        next round forms, its survivors regroup without a joiner still starting (the target
        first, before they are woken: their first look finds it; at their next, a Slurm job's
        came 1 s later)."""
        self._regrouping = True
        self.publish_target(target, survivors)

    def publish_gone(self, agent_pid: int | None, died: bool = True) -> None:
        """An agent reaped: its peers drop it from their round now, not at its heartbeat's
        expiry (a node left on purpose has left already; naming it again is harmless). Where it
        ``died`` (killed, or ended on its own: not told to go), its round's members are woken."""
        if self.store is None or agent_pid is None:
            return
        now = time.time()
        self._gone = {pid: t for pid, t in self._gone.items() if now - t < 60}
        self._gone[str(agent_pid)] = now
        if self._tell_agents(GONE_KEY, json.dumps(self._gone)) and died:
            self._wake_round()

    def round_formed(self, rdzv_id: str, epoch: int, round_: int | None) -> None:
        """An agent formed round ``round_`` of the rendezvous ``rdzv_id`` (its ``rendezvous``
        event): the round whose members ``publish_gone`` wakes."""
        if round_ is not None and (self._round is None or (epoch, round_) > self._round[:2]):
            self._round = (epoch, round_, protocol.rendezvous_state_key(rdzv_id))
            self._regrouping = False

    def _wake_round(self) -> None:
        """The latest round's members look at it now, not at their next look (up to 0.02 s
        after a worker's group broke, 0.1 s or more where none did yet): a writer of ours moved its
        change counter, whose next mark their change watches wait on (agent/change_watch.py), and
        their look drops the member GONE_KEY names (agent/gone.py). A round left behind meanwhile
        is harmless: nobody waits on its counter."""
        if self._round is None or self.store is None:
            return
        _epoch, round_, state_key = self._round
        counter = protocol.signal_key(state_key, round_, protocol.CHANGED)
        try:
            count = int(self.store.add(counter, 1))
            self.store.set(protocol.mark_key(counter, count), "1")
        except Exception:
            log.get("supervisor").debug("could not wake round %s's members: they look as before", round_, exc_info=True)

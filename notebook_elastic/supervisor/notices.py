"""Notices the local supervisor gives before it takes a node (``preempt_node(grace_s=...)``,
the dashboard's preempt drill), as a kubelet, Slurm or a cloud's spot notice would.

The notice is posted in the job's store (``runtime/notice.py``); rank 0 saves at its next step
boundary and answers; the node is let go at once then, or when the grace is over without an
answer (a ``notice_expired`` event says how many steps that costs and what grace would have
been enough). Once the node is gone the notice is withdrawn, and the group regroups at the
saved step. A collaborator the supervisor holds, with its own state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..contract.event_types import Checkpoint, Kind, Notice, NoticeExpired, SavedOnNotice
from ..contract.events import Event
from ..plumbing import log as _logging
from ..runtime import notice as board

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore

_log = _logging.get("supervisor.notices")

#: Beyond the last save's time and a step, the slack a grace needs (rank 0 looks for a notice
#: every ``runtime/notice.py POLL_S``).
GRACE_SLACK_S = 1.0


@dataclass
class Given:
    """A notice given to one node."""

    id: int
    node: Any  # the supervisor's Agent for that node
    grace_s: float
    deadline: float  # monotonic time at which the grace is over
    let_go: bool = False  # the node was told to go (SIGTERM)


class Notices:
    def __init__(
        self,
        store: Callable[[], Any],
        emit: Callable[..., None],
        let_go: Callable[[Any], None],
    ) -> None:
        self._store = store  # the job's store, or None before it is hosted
        self._emit = emit
        self._let_go = let_go  # SIGTERM the node's agent, as a preemption
        self.given: dict[int, Given] = {}
        self._last_id = 0
        self._standing: set[int] = set()  # the notices it posted and has not withdrawn
        self.saved_step: int | None = None  # steps done in the newest checkpoint the job told of
        self.save_s: float | None = None  # how long the newest save took
        self.has_state = False  # the job's loop runs State.steps() (no State: nothing to save)

    def observe(self, e: Event) -> None:
        """From the sink: the newest checkpoint (what a notice that expires costs is counted from it)."""
        if e.kind == Kind.PLAN:
            self.has_state = True  # rank 0 runs State.steps(): it can save on notice
        if e.kind == Kind.CHECKPOINT:
            saved = e.fields(Checkpoint)
            step, ms = saved.get("step"), saved.get("ms")
            if isinstance(step, int):  # (a worker may have sent anything)
                self.saved_step = max(self.saved_step or 0, step)
                if isinstance(ms, (int, float)):
                    self.save_s = float(ms) / 1000
        elif e.kind == Kind.SAVED_ON_NOTICE:
            on_notice = e.fields(SavedOnNotice)
            if on_notice.get("saved"):
                self.saved_step = max(self.saved_step or 0, int(on_notice["step"]))

    def give(self, node: Any, grace_s: float, stays: int = 0) -> bool:
        """Post a notice for ``node`` (``stays``: how many other nodes stay); False when there is
        no store to post it in yet, or no State in the job to save (the caller then lets the
        node go at once)."""
        store = self._store()
        if store is None or not self.has_state:
            return False
        self._last_id += 1
        try:
            board.post(store, node.name, grace_s, self._last_id, stays=stays)
        except Exception:
            _log.debug("could not post the notice: the node goes at once", exc_info=True)
            return False
        self._standing.add(self._last_id)
        self.given[self._last_id] = Given(self._last_id, node, float(grace_s), time.monotonic() + float(grace_s))
        self._emit(Kind.NOTICE, node.name, **Notice(grace_s=float(grace_s), id=self._last_id))
        return True

    def watch(self, latest_step: int | None, step_s: float | None) -> None:
        """Each turn of the supervisor's loop: let a node go once rank 0 saved (an answer to
        its notice or a newer one: one save covers every notice before it) or its grace is
        over; withdraw the notice once every node given one is gone."""
        if not self.given:
            return
        store = self._store()
        answered = 0
        for id_ in sorted(self.given, reverse=True):
            try:
                if store is not None and board.answer(store, id_) is not None:
                    answered = id_
                    break
            except Exception:  # a store call that failed: the grace still ends it
                break
        now = time.monotonic()
        for id_, given in list(self.given.items()):
            if not given.let_go and (id_ <= answered or now >= given.deadline):
                if id_ > answered:
                    self._expired(given, latest_step, step_s)
                given.let_go = True
                self._let_go(given.node)
            if given.let_go and (given.node.reaped or not given.node.alive):
                del self.given[id_]
        if not self.given and store is not None and self._standing:
            board.withdraw(store, self._standing)  # its own: a keeper's posted since stands
            self._standing.clear()

    def withdraw_for(self, node: str, store: KeyStore | None) -> None:
        """A node that posted its own notice (its keeper, on a cluster) is gone: take that
        notice down, as its keeper would have had it lived (a holding rank 0 trains on)."""
        if store is None:
            return
        board.withdraw(store, node=node)  # (a store that does not answer: the notice's grace ends the hold)

    def _expired(self, given: Given, latest_step: int | None, step_s: float | None) -> None:
        """The grace ended with no save on notice: about how many steps are redone (since the
        newest checkpoint the job told of), and the grace that would have been enough."""
        lost = None if latest_step is None else max(0, latest_step + 1 - (self.saved_step or 0))
        needed = (self.save_s or 0.0) + (step_s or 0.0) + GRACE_SLACK_S
        self._emit(
            Kind.NOTICE_EXPIRED,
            given.node.name,
            **NoticeExpired(grace_s=given.grace_s, id=given.id, lost_steps=lost, needed_s=round(needed, 1)),
        )

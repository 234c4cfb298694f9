"""Notice before a node is taken: the job saves at the next step boundary, and loses no step.

Every reclaimer gives notice first (the kubelet's SIGTERM and grace period, Slurm's
``--signal``, a cloud's spot notice; locally ``preempt_node(grace_s=...)``). Whoever learns of
it (the local supervisor; on a cluster, the node's agent) sets ``NOTICE_KEY`` in the job's
rendezvous store: ``{"id", "node", "grace_s", "at"}``. Rank 0 of the worker group (the writer:
for a sharded model its verdict tells every rank to save) polls that key from a thread of its
own, so a slow or frozen store never slows a step (while no notice stands, it waits on the
store for the next one to be posted, ``announce``: the store answers a WAIT at once); ``State.commit()`` then saves at once,
waits for the write and answers under ``answer_key(id)`` (``{"step", "seconds"}``); the loop's
next turn of ``State.steps()`` (after the step's own report) holds the group until the node is
gone (the notice withdrawn) or the grace is over: the group regroups at exactly the saved step,
so no step is redone. (A loop that calls ``commit(step)`` without ``steps()`` is not held: it
may train a step or two past the save, redone after the regroup.) A notice that needs no save
(the job changes in place and other nodes stay) is answered from the polling thread as soon as
it is seen: the node leaves at the step boundary its group votes on.

Worker-side module: the standard library, and torch's public ``TCPStore`` once polled.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from ..contract import protocol
from ..contract.event_types import Kind, SavedOnNotice
from ..contract.protocol import LATEST_ANSWER_KEY, NOTICE_KEY, NOTICE_POSTS_KEY, answer_key, mark_key
from ..plumbing import log as _logging
from ..plumbing.store_client import StoreClient
from ._emit import emit

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore, KeyValues

_log = _logging.get("runtime.notice")

#: How often rank 0 looks at a notice that stands (answered by a save or not, withdrawn), from a
#: thread: the training loop never waits for it. While none stands it waits for the next to be
#: posted instead (a WAIT the store answers when a poster's mark is set, ``announce``): a new
#: notice is seen at once, not at the next look (12 ms of a notice's 76 ms in place, on average,
#: at one look every 25 ms, #41), and an idle rank 0 makes a call every ``IDLE_WAIT_S``, not 40 a
#: second.
POLL_S = 0.025
#: The longest one such WAIT lasts; then it is asked again, on a new connection (a store that was
#: replaced meanwhile answers the new one).
IDLE_WAIT_S = 5.0
#: After the grace is over, how long a holding rank 0 still waits for its group to end.
HOLD_MARGIN_S = 5.0


def post(store: KeyValues, node: str, grace_s: float, notice_id: int, stays: int = 0) -> dict[str, Any]:
    """Post a notice in ``store`` (a TCPStore, or anything with ``set``); returns it. ``stays``:
    how many other nodes the notifier knows stay (the local supervisor does; a pod's keeper
    does not): where some do and the job changes in place, no save is needed."""
    notice = {"id": int(notice_id), "node": node, "grace_s": float(grace_s), "at": time.time(), "stays": int(stays)}
    store.set(NOTICE_KEY, json.dumps(notice))
    announce(store)
    return notice


def announce(store: KeyValues) -> None:
    """After a notice is set under ``NOTICE_KEY``: count it posted and set that count's mark, which
    a waiting rank 0's WAIT is answered by (``NoticeBoard``). ``store``: torch's client, or ours.
    Best effort: the notice is posted once its key is set (the poster then waits for its answer
    and withdraws it); where the mark could not be set, rank 0 finds it at its next look, at most
    ``IDLE_WAIT_S`` later."""
    try:
        posted = int(store.add(NOTICE_POSTS_KEY, 1))
        store.set(mark_key(NOTICE_POSTS_KEY, posted), "1")
    except Exception:
        _log.debug("could not mark the notice posted: rank 0 finds it at its next look", exc_info=True)


def answer(store: KeyValues, notice_id: int) -> dict[str, Any] | None:
    """Rank 0's answer to a notice (``{"step", "seconds", "saved"}``), or None while none came."""
    key = answer_key(notice_id)
    if not store.check([key]):
        return None
    reply: dict[str, Any] = json.loads(store.get(key))
    return reply


def standing(store: KeyValues) -> dict[str, Any] | None:
    """The notice that stands in ``store`` (as ``post`` wrote it), or None where none does or what
    stands there does not read as one. Every reader of the key reads it here."""
    if not store.check([NOTICE_KEY]):
        return None
    try:
        notice = json.loads(store.get(NOTICE_KEY))
    except ValueError:
        return None
    return notice if isinstance(notice, dict) else None


def withdraw(store: KeyValues, ids: Collection[int] | None = None, node: str | None = None) -> None:
    """The node is gone (or the notice is void): a holding rank 0 trains on. ``ids``: only a
    notice of these (the poster's own): one posted since by another (a node's keeper, on its
    SIGTERM) stands until it is answered; withdrawn with the one before, it was never answered
    and its node waited out its grace (a Slurm job stopped just after a preemption: 5 s).
    ``node``: only a notice for that node (one its keeper posted, the node gone)."""
    try:
        if ids is not None or node is not None:
            notice = standing(store)
            if notice is None or (ids is not None and notice.get("id") not in ids):
                return
            if node is not None and notice.get("node") != node:
                return
        store.delete_key(NOTICE_KEY)
    except Exception:
        _log.debug("a store that is gone: nobody polls it any more either", exc_info=True)


_ANSWERED: set[int] = set()
_BOARDS: dict[str, NoticeBoard] = {}


def notice_board() -> NoticeBoard:
    """This process's notice board for the store it is told of: one polling thread, whichever
    State is the latest (each State made again in place started another that never ended, and
    held that State and its model alive: one more a change, an adversary's pass found)."""
    endpoint = os.environ.get(protocol.ENV_NOTICE_STORE, "")
    board = _BOARDS.get(endpoint)
    if board is None:
        board = _BOARDS[endpoint] = NoticeBoard(endpoint)
    return board


class NoticeBoard:
    """Rank 0's view of the notice key, polled every ``POLL_S`` from a daemon thread."""

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint if endpoint is not None else os.environ.get(protocol.ENV_NOTICE_STORE, "")
        self.current: dict[str, Any] | None = None  # the notice posted now, if any
        # The notices this process answered, whichever State answered them: a State made again
        # in place must not answer (and save for) one that is still up again.
        self.answered: set[int] = _ANSWERED
        self._store: KeyStore | None = None
        self._waiter: StoreClient | None = None  # the idle WAIT's own connection (poll thread only)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._io = threading.Lock()  # one store call at a time on the one connection
        self._state: Callable[[], Any] | None = None  # a weak reference to the latest State

    def start(self, state: Any = None) -> None:
        """Begin polling (once; nothing happens without an endpoint), for ``state`` (the latest
        State, held weakly: an earlier one and its model are let go). A notice it says needs
        no save (``state.notice_needs_no_save``: in place, other nodes stay) is answered from
        the polling thread as soon as it is seen, not at the next commit (half a step and a
        commit sooner: the node is let go then)."""
        self._state = weakref.ref(state) if state is not None else None
        with self._lock:
            if self._thread is not None or not self.endpoint:
                return
            self._thread = threading.Thread(target=self._poll, name="notebook-elastic-notice", daemon=True)
            self._thread.start()

    def pending(self) -> dict[str, Any] | None:
        """The notice to act on now: posted, and not answered yet by this process; taken (the
        polling thread does not answer it too)."""
        notice = self.current
        return notice if notice is not None and self._take(notice) else None

    def _take(self, notice: dict[str, Any]) -> bool:
        """Whether this process is first to act on ``notice`` (the commit, or the polling thread)."""
        with self._lock:
            if notice.get("id") in self.answered:
                return False
            self.answered.add(int(notice.get("id", -1)))
            return True

    def saved(self, notice: dict[str, Any], step: int, saved: bool) -> bool:
        """After the commit a notice made save (``step`` steps done): answer the notifier and
        say so in an event. Returns ``saved``."""
        seconds = max(0.0, time.time() - float(notice.get("at", time.time())))
        error = "" if saved else "the checkpoint could not be written (see the checkpoint events)"
        self.answer(notice, step, seconds, saved, error)
        said = SavedOnNotice(
            step=step,
            seconds=round(seconds, 3),
            id=int(notice["id"]),
            grace_s=float(notice.get("grace_s", 0.0)),
            notice_node=str(notice.get("node", "")),
            saved=saved,
        )
        if error:
            said["error"] = error
        emit(Kind.SAVED_ON_NOTICE, **said)
        return saved

    def kept_in_place(self, notice: dict[str, Any], step: int) -> None:
        """Answer a notice without a save: the job changes in place, and the ranks that stay
        keep every value (runtime/inplace.py); the node goes at the step boundary the group
        agrees on, and no step is lost."""
        seconds = max(0.0, time.time() - float(notice.get("at", time.time())))
        self.answer(notice, step, seconds, saved=False, in_place=True)
        emit(
            Kind.SAVED_ON_NOTICE,
            **SavedOnNotice(
                step=step,
                seconds=round(seconds, 3),
                id=int(notice["id"]),
                grace_s=float(notice.get("grace_s", 0.0)),
                notice_node=str(notice.get("node", "")),
                saved=False,
                in_place=True,
            ),
        )

    def answer(
        self, notice: dict[str, Any], step: int, seconds: float, saved: bool, error: str = "", in_place: bool = False
    ) -> None:
        self.answered.add(int(notice["id"]))
        body = {
            "step": step,
            "seconds": round(seconds, 3),
            "saved": saved,
            **({"error": error} if error else {}),
            **({"in_place": True} if in_place else {}),
        }
        try:
            latest = {**body, "id": int(notice["id"]), "notice_at": float(notice.get("at", 0.0))}
            with self._io:
                self._client().set(answer_key(int(notice["id"])), json.dumps(body))
                self._client().set(LATEST_ANSWER_KEY, json.dumps(latest))
        except Exception:  # the notifier then waits out the grace: said there
            self._store = None

    def hold(self, notice: dict[str, Any]) -> None:
        """Wait while the notice stands (until the node is gone or its grace is over): the group
        is torn down at the saved step, so nothing after it is trained and redone."""
        deadline = float(notice.get("at", time.time())) + float(notice.get("grace_s", 0.0)) + HOLD_MARGIN_S
        while time.time() < deadline:
            current = self.current
            if current is None or current.get("id") != notice.get("id"):
                return
            time.sleep(0.02)

    def _client(self) -> KeyStore:
        if self._store is None:
            from datetime import timedelta

            import torch.distributed as dist

            host, _, port = self.endpoint.rpartition(":")
            self._store = dist.TCPStore(
                host, int(port), is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False
            )
        return self._store

    def _answered_in_place(self, store: KeyValues, notice_id: int) -> None:
        """A notice another process answered in place (the rank 0 of the group the node left)
        or with a save that was written is answered for this one too: the ranks that stay kept
        every value, or the save holds them, and a rank 0 of the next group has nothing to add
        while the notice still stands (it answered again: two answers, two events, for one
        notice; after a save, a second save: a fresh-clone CI run of a Kueue preemption, whose
        pods' SIGTERMs came a moment apart). A save that failed is tried again here."""
        key = answer_key(notice_id)
        if store.check([key]):
            reply = json.loads(store.get(key))
            if reply.get("in_place") or reply.get("saved"):
                self.answered.add(notice_id)

    def _needs_no_save(self, notice: dict[str, Any]) -> int | None:
        """The steps done where ``notice`` needs no save, asked of the latest State; between two
        (the cell's body made again after a change), of the values the last one handed on, held
        by the rank that writes for its group (a notice then waited for the next State, seconds
        where its model is built anew)."""
        state = self._state() if self._state is not None else None
        step = None if state is None else state.notice_needs_no_save(notice)
        if step is not None:
            return int(step)
        from .inplace import machinery

        held = machinery().handoff
        if held is None or held.save is None or not machinery().keeps_values_without(notice, held=True):
            return None
        return int(held.next_step)

    def _wait_posted(self, count: int) -> None:
        """While no notice stands: until the ``count``-th is posted (its mark set: the store
        answers the WAIT) or ``IDLE_WAIT_S`` passed."""
        try:
            if self._waiter is None:
                self._waiter = StoreClient(self.endpoint, timeout_s=10.0)
            if not self._waiter.wait([mark_key(NOTICE_POSTS_KEY, count)], IDLE_WAIT_S):
                self._waiter = None  # closed: it held a WAIT nobody reads any more
        except Exception:  # the store is away: the next look tries again
            if self._waiter is not None:
                self._waiter.close()
                self._waiter = None
            time.sleep(POLL_S)

    def _poll(self) -> None:
        while True:
            try:
                with self._io:
                    store = self._client()
                    # The count before the key: a notice posted after this read is marked with
                    # a later count, which the WAIT below is for.
                    posted = int(store.add(NOTICE_POSTS_KEY, 0))
                    current = standing(store)
                    if current is not None and int(current.get("id", -1)) not in self.answered:
                        self._answered_in_place(store, int(current.get("id", -1)))
                    self.current = current
                step = None if current is None else self._needs_no_save(current)
                if step is not None and current is not None and self._take(current):
                    self.kept_in_place(current, step)
                if current is None:
                    self._wait_posted(posted + 1)
                else:
                    time.sleep(POLL_S)
            except Exception:  # the store is away (being replaced, frozen): look again later
                self._store = None
                time.sleep(1.0)

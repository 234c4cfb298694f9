"""A node that fails while joining a job that trains is sent away, decided in its own agent.

A module missing on one node, a broken driver or NIC, NCCL failing on that node alone: its
workers fail in their first round. torchrun retries them, pulling the healthy nodes into
every retry (a new member is a membership change for them), until the node's budget is spent,
and then closes the rendezvous on them all: the job, healthy at its previous size, fails. The
local supervisor watches its nodes and sends such a node away itself; on a cluster nothing
watches them but their agents, so each decides for itself from the rendezvous store:

- a worker whose group made a step marks its round (``protocol.mark_progress``, from
  ``report()``); its agent writes the round to ``progressed`` in the store, the job's latest
  round that trained (a round trains with all its members: it tells every member it trained);
- a node that has been in no round that trained, while some round without it did, is joining
  a job that trains. When its own workers fail there (not a departed peer's symptom) and no
  old member's workers failed on their own in that round (``failed/ROUND`` counts them, read
  after a grace: a bug that fails every rank at one step fails the old members too, and that
  is a normal, charged restart; other joiners failing beside it are not counted, so two
  broken joiners both go), it leaves: it stops its workers, leaves the round without
  closing it, says why (``node_evicted``) and exits with ``EXIT_EVICTED``. The others regroup
  at their size, uncharged, as for any departure.

Its failure is charged once per node index, as the local supervisor charges the one retry it
interrupts (none with ``--max-restarts 0``). A replacement pod for that index (a Job replaces
the pod) waits before it joins, longer each time, as the kubelet backs off a crashing
container: a node that is still broken costs the job one regroup per back-off, not one per
second. What the store cannot tell (no such key, no answer in time) is no eviction: the node
fails as torchrun would have it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..contract import protocol
from ..contract.event_types import Kind, NodeEvicted, Pending, Restart
from ..plumbing import log
from ..pool.warm import Zygote
from ..runtime._emit import emit
from . import store_link, torch_adapter
from .deadline import call_with_deadline

_log = log.get("agent.joiner")

WATCH_INTERVAL_S = 0.5
#: How long a joiner whose workers failed waits for the old members' own failures of the same
#: round, if any, to be counted in the store (each agent notices its workers' exit within its
#: monitor interval, 0.1 s by default; a loaded node is slower).
FAILURE_GRACE_S = 3.0
#: A replacement for a node index sent away waits this long before it joins, doubled for every
#: earlier eviction of the index, up to ``BACKOFF_MAX_S`` (the kubelet's CrashLoopBackOff: 10 s
#: doubled up to 5 min; longer here, since each try costs the healthy nodes a regroup).
BACKOFF_FIRST_S = 30.0
BACKOFF_MAX_S = 600.0
#: How long a node joining a job that trains waits for its zygote to fork (its imports done)
#: before it joins anyway (its workers then start cold). The others train meanwhile: the wait
#: costs them nothing, the join itself the same.
JOIN_WARM_WAIT_S = 60.0


class Joining:
    """One agent's part. ``watch`` is the agent's departure watch (its ``handler``, ``agent``,
    ``latest`` round and ``killed_round``); ``leave_round()`` takes this node out of its round."""

    def __init__(self, watch: Any, node_name: Callable[[], str], leave_round: Callable[[], None]) -> None:
        self.watch = watch
        self.node_name = node_name
        self.leave_round = leave_round
        self.folder: str | None = None  # where this node's workers mark the rounds that trained
        self.rounds: set[int] = set()  # the rounds this node was a member of
        self.published: int | None = None  # the latest round this node wrote to ``progressed``
        self.thread: threading.Thread | None = None
        self.ended = threading.Event()  # clean(): the publisher thread ends too
        self.waited = False  # a replacement waits once, before its first join
        # This node's own zygote (pool/warm.py), still importing torch: a node that joins a job
        # that trains waits for it before its first join (``before_joining``).
        self.zygote: Zygote | None = None
        self.index = os.environ.get("JOB_COMPLETION_INDEX") or node_name()  # what a replacement shares

    def start(self) -> None:
        import atexit
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="notebook-elastic-progress-")
        os.environ[protocol.ENV_PROGRESS_DIR] = self.folder  # inherited by the workers
        atexit.register(self.clean)

    def clean(self) -> None:
        self.ended.set()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _key(self, handler: Any, name: str) -> str:
        return protocol.joiner_key(handler.get_run_id(), name)

    # -- before the first join, and after every one ----------------------------------------

    def before_joining(self, handler: Any) -> None:
        """Before its first join, a node that joins a job that trains waits until its workers
        can start warm, and a replacement for an index sent away waits its back-off (once
        per agent)."""
        if self.rounds or self.waited:
            return
        self.waited = True
        # Its supervisor says so where it starts the nodes (local, Slurm); on a cluster whose
        # agents send themselves away (``start``), the store does: a round without it trained.
        trains = os.environ.get(protocol.ENV_JOINER) == "1"
        if self.folder is not None and not trains:
            try:
                trains = self._trained(handler) is not None
            except Exception:
                _log.debug("the store does not say whether the job trains: join as soon as it may", exc_info=True)
        if trains:
            self._warm_first()
        if self.folder is not None:
            self._back_off(handler)

    def _warm_first(self) -> None:
        """The survivors regroup as soon as this node joins, then wait for its workers: while
        its zygote still imports torch (seconds on a node's first start, more on a GPU node) they
        would wait idle. They train on instead until it can fork them (or ``JOIN_WARM_WAIT_S``)."""
        zygote, self.zygote = self.zygote, None
        if zygote is None:
            return
        started = time.monotonic()
        warm = zygote.wait_ready(JOIN_WARM_WAIT_S)
        _log.info(
            "joins a job that trains once its workers can start warm: %s after %.2f s",
            "ready" if warm else "not ready (they start cold)",
            time.monotonic() - started,
        )

    def _back_off(self, handler: Any) -> None:
        """A replacement for an index sent away waits before it joins, longer each time."""
        try:
            store = torch_adapter.round_store(handler)
            key = self._key(handler, f"evicted/{self.index}")
            if not call_with_deadline(store.check, store_link.STORE_CALL_TIMEOUT_S, [key]):
                return
            times = int(call_with_deadline(store.add, store_link.STORE_CALL_TIMEOUT_S, key, 0))
        except Exception:
            _log.debug("the store does not say: join now", exc_info=True)
            return
        wait_s = min(BACKOFF_FIRST_S * 2 ** max(times - 1, 0), BACKOFF_MAX_S)
        emit(
            Kind.PENDING,
            node=self.node_name(),
            **Pending(
                reason="BackOff",
                message=(
                    f"node index {self.index} failed while joining {times} time(s); "
                    f"this replacement joins in {wait_s:g} s, the job trains on meanwhile"
                ),
            ),
        )
        time.sleep(wait_s)  # a SIGTERM (scale-down, stop) ends it as it would a join

    def joined(self, round_: int | None) -> None:
        if self.folder is None or round_ is None:
            return
        self.rounds.add(round_)
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="notebook-elastic-progress", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while not self.ended.wait(WATCH_INTERVAL_S):
            try:
                self._publish()
            except Exception:
                _log.debug("the store does not answer now: tried again next time", exc_info=True)

    def _publish(self) -> None:
        handler, round_ = self.watch.handler, self.watch.latest[0]
        if handler is None or round_ is None or self.published == round_:
            return
        if not protocol.progress_marked(self.folder, round_):
            return
        store = torch_adapter.round_store(handler)  # LookupError where torch does not say: caught by _run
        call_with_deadline(store.set, store_link.STORE_CALL_TIMEOUT_S, self._key(handler, "progressed"), str(round_))
        self.published = round_

    # -- when its workers failed -----------------------------------------------------------

    def leave_if_it_failed_joining(self, result: Any) -> None:
        """Exit (``EXIT_EVICTED``) when this failure is a joiner's own; return otherwise."""
        if self.folder is None:
            return
        own = self.own_failures(result)
        handler, agent, (round_, members) = self.watch.handler, self.watch.agent, self.watch.latest
        if not own or handler is None or agent is None or round_ is None or len(members) < 2:
            return
        timeout_s = store_link.STORE_CALL_TIMEOUT_S
        failed = self._key(handler, f"failed/{round_}")
        try:
            store = torch_adapter.round_store(handler)
            trained = self._trained(handler)
            if trained is None:
                return  # the job never trained (its first start): torchrun's own retries
            if trained in self.rounds or any(protocol.progress_marked(self.folder, r) for r in self.rounds):
                # An old member (it trained with the job, if only in a round not yet written to
                # the store): a normal restart, and counted, so a joiner failing now is not blamed.
                call_with_deadline(store.add, timeout_s, failed, 1)
                return
            time.sleep(FAILURE_GRACE_S)
            if call_with_deadline(store.add, timeout_s, failed, 0) > 0:
                return  # the old members' workers failed too: not this node's doing
        except Exception:
            _log.debug("the store does not say: fail as torchrun would", exc_info=True)
            return
        self._leave(handler, agent, round_, len(members) - 1, failure_text(own[0]))

    def own_failures(self, result: Any) -> list[Any]:
        """The failures of this node's workers that are their own, not a departed peer's symptom."""
        watch = self.watch
        watch_ended_them = watch.killed_round is not None and watch.killed_round == watch.latest[0]
        return [
            f
            for f in getattr(result, "failures", {}).values()
            if f.exitcode != protocol.EXIT_PEER_LOST and not (watch_ended_them and f.exitcode == -signal.SIGKILL)
        ]

    def _trained(self, handler: Any) -> int | None:
        """The job's latest round that made a step, if one did."""
        store = torch_adapter.round_store(handler)
        key = self._key(handler, "progressed")
        if not call_with_deadline(store.check, store_link.STORE_CALL_TIMEOUT_S, [key]):
            return None
        return int(call_with_deadline(store.get, store_link.STORE_CALL_TIMEOUT_S, key).decode())

    def _leave(self, handler: Any, agent: Any, round_: int, others: int, failure: str) -> None:
        for pid in torch_adapter.worker_pids(agent):  # its other local ranks, still waiting for peers
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        timeout_s = store_link.STORE_CALL_TIMEOUT_S
        me = self.node_name()
        budget = torch_adapter.restart_budget(agent)
        try:
            store = torch_adapter.round_store(handler)
            call_with_deadline(store.add, timeout_s, self._key(handler, f"evicted/{self.index}"), 1)
            # Once per node index: a replacement failing the same way is not charged again.
            claim = self._key(handler, f"charged/{self.index}")
            first = call_with_deadline(store.compare_set, timeout_s, claim, "", me) == me.encode()
        except Exception:
            first = True
        if first and budget is not None and budget[0] > 0:
            left, most = budget
            emit(
                Kind.RESTART,
                node=me,
                **Restart(reason="worker_failed", restarts_used=most - left + 1, max_restarts=most),
            )
        emit(Kind.NODE_EVICTED, node=me, **NodeEvicted(failure=failure, target=others, round=round_, index=self.index))
        self.leave_round()
        _log.warning(
            "its workers failed while joining a job that trains (%s); left the rendezvous, the job goes on at %s node(s)",
            failure,
            others,
        )
        self.clean()
        sys.stdout.flush()
        os._exit(protocol.EXIT_EVICTED)  # torchrun's shutdown would close the rendezvous on the others


def failure_text(failure: Any) -> str:
    """One line for a worker's failure: its exception (torchelastic's error file), or its exit."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message")
    lines = str(message or "").strip().splitlines()
    if lines and not lines[0].startswith("To enable traceback"):
        return lines[0][:300]
    if failure.exitcode < 0:
        return f"a worker was killed by {failure.signal_name()}"
    return f"a worker exited with code {failure.exitcode}"

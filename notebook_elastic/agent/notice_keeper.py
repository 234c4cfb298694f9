"""On a cluster, a node's notice comes as the kubelet gives it: SIGTERM to the container's first
process, SIGKILL when ``terminationGracePeriodSeconds`` are over. The agent then runs under a
keeper, its parent and the container's first process (``keep``; the standard library only, no
torch): on SIGTERM the keeper posts a notice in the job's store (``notice.py``), waits until rank
0 has saved (its answer to this notice, or to a newer one) or the grace is nearly over, and only
then passes the SIGTERM on to the agent, which stops its workers and leaves its round as
before. Any other signal is passed on at once; the keeper exits with the agent's exit status.
Where the cluster signals every process of the node at once (Slurm), the agent waits for the
keeper's word before it acts on it, and its workers for the agent's (``term.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from ..contract import protocol
from ..contract.event_types import Kind, Notice, NoticeExpired
from ..contract.protocol import LATEST_ANSWER_KEY, answer_key
from ..plumbing import log
from ..plumbing.procfs import stat_fields
from ..plumbing.store_client import StoreClient
from ..runtime import term
from ..runtime._emit import emit
from ..runtime.notice import POLL_S, post, standing, withdraw

_log = log.get("keeper")

#: What the agent needs, after the keeper passes the SIGTERM on, to stop its workers and leave
#: its round before the kubelet's SIGKILL.
LEAVE_S = 3.0
#: SIGTERMs this close after the first are the same notice: at a --time limit Slurm 22.05 sends
#: SIGTERM, SIGCONT, SIGTERM within a few milliseconds (a preemption's second SIGTERM, the end
#: of its GraceTime, comes seconds later).
BURST_S = 1.0


def saved_after(store: StoreClient, notice: dict[str, Any]) -> bool:
    """Whether rank 0 saved for this notice, or for one posted after it (one save covers both)."""
    if store.check([answer_key(notice["id"])]):
        return True
    if store.check([LATEST_ANSWER_KEY]):
        latest = json.loads(store.get(LATEST_ANSWER_KEY))
        return float(latest.get("notice_at", 0)) >= notice["at"] and bool(latest.get("saved"))
    return False


def posted_for(store: StoreClient, node: str) -> dict[str, Any] | None:
    """The notice posted for ``node`` and still running (within its grace), if one is: where the
    supervisor gives notice itself, the SIGTERM that follows it is its end, not a new notice."""
    notice = standing(store)
    if notice is None:
        return None
    try:
        fresh = time.time() - float(notice["at"]) <= float(notice["grace_s"]) + BURST_S
        return notice if notice.get("node") == node and fresh and isinstance(notice.get("id"), int) else None
    except (ValueError, KeyError, TypeError):
        return None


#: How often the keeper looks for such a request.
KILL_POLL_S = 0.5


def descends_from(pid: int, ancestor: int, depth: int = 8) -> bool:
    """Whether ``pid`` is ``ancestor``'s child, grandchild... (its workers are, through the
    agent and a launcher): a request from the store, which anyone who reaches it can write,
    never kills another process of the user."""
    for _ in range(depth):
        fields = stat_fields(pid)
        try:
            pid = int(fields[1]) if fields else 0
        except (ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


class Keeper:
    def __init__(self, child: int, endpoint: str, grace_s: float, node: str) -> None:
        self.child, self.endpoint, self.grace_s, self.node = child, endpoint, grace_s, node
        self.noticed: float | None = None  # when the first SIGTERM came (monotonic)
        self.notice: dict[str, Any] | None = None
        self.saved = False  # rank 0 answered the notice
        self.released = False  # the SIGTERM was passed on to the agent (once)

    def serve_drills(self) -> None:
        """From a thread, while the node lives: SIGKILL a worker of this node when the supervisor
        asks (the drill, as it does with a local pid), if it is one of this keeper's descendants."""
        key = protocol.KILL_KEY.format(node=self.node)
        store = None
        while True:
            time.sleep(KILL_POLL_S)
            try:
                store = store or StoreClient(self.endpoint, timeout_s=5.0)
                if not store.check([key]):
                    continue
                asked = json.loads(store.get(key))
                store.delete_key(key)
                pid = int(asked.get("pid", 0))
                if pid > 1 and descends_from(pid, os.getpid()):
                    os.kill(pid, signal.SIGKILL)
                else:
                    _log.warning("refused to kill pid %s: not a worker of this node", pid)
            except Exception:
                _log.debug("the kill-a-worker drill's request could not be read", exc_info=True)
                if store is not None:
                    store.close()
                store = None

    def on_term(self, signum: int, _frame: Any) -> None:
        now = time.monotonic()
        if self.noticed is None:
            self.noticed = now
            threading.Thread(target=self._notice_then_pass_on, daemon=True).start()
        elif now - self.noticed < BURST_S:
            _log.info("another SIGTERM %.3f s after the first: the same notice", now - self.noticed)
        elif not self.released:  # a later SIGTERM (a preemption's GraceTime is over): no more waiting
            self.released = True  # the waiting thread stops, saying nothing more
            if not self.saved and self.notice is not None:
                # The node goes without its save: the work since the last checkpoint is redone.
                emit(Kind.NOTICE_EXPIRED, node=self.node, **NoticeExpired(grace_s=self.grace_s, id=self.notice["id"]))
            self._pass_on(signum)

    def _pass_on(self, signum: int) -> None:
        if signum == signal.SIGTERM:
            term.mark(term.RELEASED)  # where Slurm signalled the agent too, it may act now (term.py)
        try:
            os.kill(self.child, signum)
        except ProcessLookupError:
            pass

    def _notice_then_pass_on(self) -> None:
        store = None
        try:
            deadline = time.monotonic() + max(0.0, self.grace_s - LEAVE_S)
            store = StoreClient(self.endpoint)
            posted = posted_for(store, self.node)
            if posted is not None:
                # The supervisor gave this node notice already (a drill's, with its own grace) and
                # its SIGTERM is that notice's end: the same notice, not a second one (a Slurm
                # preemption read two notices, 30 s then 8 s, answered "no save needed" then
                # with a save: an adversary's pass). Its answer is there already; the agent acts
                # on its SIGTERM only once released, and Slurm's own, sent to every process of the
                # node at once, must have landed (ignored: ``term.HELD``) before that, or the
                # agent takes it for a second stop in the middle of its leave.
                self.notice = notice = posted
                self._wait_held()
            else:
                at = time.time()
                said = Notice(grace_s=self.grace_s, id=int(at * 1000) % 2**31)
                self.notice = notice = post(store, self.node, self.grace_s, said["id"])  # (rank 0 sees it now)
                emit(Kind.NOTICE, node=self.node, **said)
            while time.monotonic() < deadline and not self.released:
                if saved_after(store, notice):
                    self.saved = True
                    break
                time.sleep(POLL_S)
            else:
                if not self.released:
                    emit(Kind.NOTICE_EXPIRED, node=self.node, **NoticeExpired(grace_s=self.grace_s, id=notice["id"]))
        except Exception as exc:  # no store to post in: the node goes as it would have
            _log.warning("could not give notice: %s", exc)
        finally:
            if store is not None:
                store.close()
            if not self.released:
                self.released = True
                self._pass_on(signal.SIGTERM)

    def _wait_held(self) -> None:
        """Until the agent let Slurm's SIGTERM pass (milliseconds), at most the burst's second
        (an agent whose handler is not in place yet, or one held in a long call)."""
        noticed = self.noticed if self.noticed is not None else time.monotonic()
        while time.monotonic() < noticed + BURST_S and not term.marked(term.HELD):
            time.sleep(0.005)

    def withdraw(self) -> None:
        """The agent is gone: take this node's notice down (a newer one, another node's, stays)."""
        if self.notice is None:
            return
        try:
            store = StoreClient(self.endpoint, timeout_s=2.0)
        except Exception:
            _log.debug("no store to withdraw the notice in: the supervisor takes it down when it reaps the node")
            return
        try:
            withdraw(store, ids=[self.notice["id"]])
        finally:
            store.close()


def keep() -> None:
    """Fork: the child returns and goes on as the agent; this process becomes its keeper and
    never returns (it exits with the agent's status). Only where a grace is given
    (``ENV_NOTICE_GRACE_S``, set by the cluster backends) and a store to post notices in."""
    grace = os.environ.get(protocol.ENV_NOTICE_GRACE_S)
    endpoint = os.environ.get(protocol.ENV_NOTICE_STORE)
    if not grace or not endpoint or os.environ.get(protocol.ENV_KEPT) == "1":
        return
    os.environ[protocol.ENV_KEPT] = "1"
    notice_dir = None
    if os.environ.get(protocol.ENV_TERM_TO_ALL) == "1":
        # Slurm signals every process of the step: the agent and its workers learn from this
        # private folder when the keeper lets them act on it (term.py).
        import tempfile

        notice_dir = tempfile.mkdtemp(prefix="notebook-elastic-notice-")
        os.environ[protocol.ENV_NOTICE_DIR] = notice_dir
    sys.stdout.flush()
    sys.stderr.flush()
    # A signal between the fork and the keeper's handlers would end the keeper as it ends any
    # process (Slurm's SIGTERM to the whole step, at once): held until they are in place.
    passed_on = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, *passed_on})
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return
    log.for_process("keeper")
    keeper = Keeper(child, endpoint, float(grace), os.environ.get(protocol.ENV_NODE) or socket.gethostname())
    signal.signal(signal.SIGTERM, keeper.on_term)
    for other in passed_on:
        signal.signal(other, lambda signum, _frame: keeper._pass_on(signum))
    signal.pthread_sigmask(signal.SIG_SETMASK, before)  # what came meanwhile is handled now
    if notice_dir is not None:  # Slurm: the supervisor may be on another host than these workers
        threading.Thread(target=keeper.serve_drills, name="drills", daemon=True).start()
    while True:
        try:
            _pid, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            status = 0
            break
    keeper.withdraw()
    if notice_dir is not None:
        import shutil

        shutil.rmtree(notice_dir, ignore_errors=True)
    code = os.waitstatus_to_exitcode(status)
    sys.stdout.flush()
    os._exit(code if code >= 0 else 128 - code)

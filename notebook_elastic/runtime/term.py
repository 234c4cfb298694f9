"""Slurm signals every process of a job step at once: when it cancels or preempts a node's
allocation (``scancel``, a higher-priority job, the time limit), the keeper, the agent and each
worker all get the same SIGTERM, and SIGKILL after ``KillWait`` (plus ``GraceTime`` for a
preemption). Only the keeper (``notice_keeper.py``) may act on it: it posts the notice, waits
for rank 0's save, and only then lets the agent go. Until then the agent lets Slurm's SIGTERM
pass, and the workers always do: a worker goes when the agent itself stops it (a restart, a
regroup, the shutdown after the notice), or leaves at a step boundary when told.

Two markers in the node's notice folder (``ENV_NOTICE_DIR``, made by the keeper, private,
removed with it) say who may act:
- ``released``: the keeper has let the agent go (the save is done, or the grace is over);
- ``stopping``: the agent is stopping its workers on purpose (``_shutdown``), until it starts
  the next ones;
- ``held``: the agent let Slurm's SIGTERM pass (so the keeper, releasing it at once, is not
  taken for a second stop: ``notice_keeper.py``).
Where ``ENV_TERM_TO_ALL`` is unset (locally, in a pod, where only the first process is told)
nothing here changes a handler. The standard library only: the keeper and the workers use it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ..contract import protocol
from ..plumbing import log

_log = log.get("term")

RELEASED = "released"
STOPPING = "stopping"
HELD = "held"  # the agent let a Slurm SIGTERM pass (it waits for the keeper's word)
#: How long an agent told to stop may go on before it is told again.
RESEND_S = 2.0


def folder() -> str | None:
    """The node's notice folder, where every process of the step is signalled alike."""
    if os.environ.get(protocol.ENV_TERM_TO_ALL) != "1":
        return None
    return os.environ.get(protocol.ENV_NOTICE_DIR) or None


def mark(name: str) -> None:
    where = folder()
    if where is not None:
        try:
            os.close(os.open(os.path.join(where, name), os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError:
            pass


def unmark(name: str) -> None:
    where = folder()
    if where is not None:
        try:
            os.unlink(os.path.join(where, name))
        except OSError:
            pass


def marked(name: str) -> bool:
    where = folder()
    return where is not None and os.path.exists(os.path.join(where, name))


def _call(previous: Any, signum: int, frame: Any) -> None:
    """What the handler before ours would have done."""
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:  # the default: end as the signal ends a process
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def defer(may_act: Callable[[], bool]) -> bool:
    """Let a SIGTERM through to the handler in place now only when ``may_act()``; a SIGTERM
    before that is Slurm's, which the keeper answers. Returns whether a handler was set."""
    if folder() is None:
        return False
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "_notebook_elastic_deferring", False):
        return True
    mine = os.getpid()

    def deferring(signum: int, frame: Any) -> None:
        # A child the process forked (a multiprocessing pool, say) inherits this handler: it
        # is not ours to hold, and its parent's terminate() must end it as it would anywhere.
        if os.getpid() != mine or may_act():
            _call(previous, signum, frame)
        else:
            _log.info("Slurm's SIGTERM: the keeper gives notice first")

    vars(deferring)["_notebook_elastic_deferring"] = True  # vars(): the function type declares no such attribute
    signal.signal(signal.SIGTERM, deferring)
    return True


def defer_in_worker() -> bool:
    """In a worker, at start: it goes when its agent stops it (``stopping``), never on Slurm's
    SIGTERM, even one whose handler runs after the keeper let the agent go (a worker inside a
    collective runs a Python handler only when the call returns: let through then, it died
    mid-step and its step was redone where the node was to leave at a step boundary; its agent
    tells it to leave, or stops it, and Slurm's SIGKILL after KillWait ends it if the agent
    cannot). Only in the process torch started: not in a child it spawns with multiprocessing (which imports
    this too, and whose parent's terminate() must end it); a forked child inherits the handler,
    which lets the signal through outside the process that set it."""
    import multiprocessing

    # A spawned child is named before it imports its parent's main module (which imports this).
    if multiprocessing.parent_process() is not None or multiprocessing.current_process().name != "MainProcess":
        return False
    return defer(lambda: marked(STOPPING))


def data_worker_init(worker_id: int = 0) -> None:
    """``DataLoader(..., worker_init_fn=elastic.data_worker_init)`` on Slurm: a DataLoader
    worker ends on any SIGTERM not sent by its rank (torch's own handler), so Slurm's, sent to
    every process of the node, would fail the rank before it saves. This holds SIGTERM off in
    the data worker; it still ends with its rank (torch watches the parent). Elsewhere, and
    wherever the cluster does not signal every process, it does nothing."""
    if os.environ.get(protocol.ENV_TERM_TO_ALL) == "1":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


class _Insist:
    """The agent's stop signal lands, wherever it finds the agent. torch's handler raises its
    ``SignalException`` in the agent's main thread, wherever that is: inside a store call whose
    ``except`` takes it for a lost connection, it is swallowed, and the agent trains on as if
    never told (a preempted node that never left, seen under load). So once the agent is told
    to stop, it is told again every ``RESEND_S`` until its shutdown has begun.

    Its state is only ever assigned, never guarded by a lock: ``told`` runs in a signal handler,
    which may interrupt the main thread anywhere, even inside ``told`` itself (a second SIGTERM
    while the first is handled; a lock held there deadlocked the agent for good). The watching
    thread starts with ``guard_agent``, outside any handler."""

    def __init__(self) -> None:
        self.signalled: tuple[int, float] | None = None  # (signal, when) of the stop it was told
        self.shutting_down = False
        self.thread: threading.Thread | None = None

    def watch(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, name="notebook-elastic-insist", daemon=True)
            self.thread.start()

    def told(self, signum: int) -> bool:
        """A stop signal came: False while its shutdown is under way (let it finish)."""
        if self.shutting_down:
            return False
        self.signalled = (signum, time.monotonic())
        return True

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            signalled = self.signalled  # one read: the handler may replace it meanwhile
            if signalled is not None and not self.shutting_down and time.monotonic() - signalled[1] >= RESEND_S:
                _log.warning("told to stop, still running: telling it again")
                os.kill(os.getpid(), signalled[0])

    def land(self) -> None:
        """From the agent's main thread, where it is about to join a round or start workers: a
        stop it was told that has not landed (swallowed by a store call's ``except``) is given
        again now. Its handler runs before the next line, here, outside any store call: the
        agent goes before it joins, instead of ``RESEND_S`` later, after it joined and started
        workers that the others must regroup around (an evicted joiner rejoined so under load,
        failed again and was charged a second restart)."""
        signalled = self.signalled
        if signalled is not None and not self.shutting_down:
            _log.info("told to stop, about to join or start workers: the stop lands now")
            os.kill(os.getpid(), signalled[0])

    def stopping(self) -> None:
        """Its workers are being stopped: for good if it was told to stop."""
        self.shutting_down = self.signalled is not None

    def starting(self) -> None:
        """It starts workers again: whatever stopped was not its end."""
        self.shutting_down = False


_insist = _Insist()


def guard_agent() -> None:
    """In the agent: its SIGTERM lands (``_Insist``), and where Slurm signals every process of
    the node, it waits for the keeper's word first. Set again after each start of its workers
    (torch sets its own handler then)."""
    _insist.watch()
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "_notebook_elastic_guard", False):
        return

    def guarded(signum: int, frame: Any) -> None:
        if folder() is not None and not marked(RELEASED):
            mark(HELD)  # the keeper may release it now: this SIGTERM is not taken for a second stop
            _log.info("Slurm's SIGTERM: the keeper gives notice first")
            return
        if _insist.told(signum):
            _call(previous, signum, frame)

    vars(guarded)["_notebook_elastic_guard"] = True  # vars(): the function type declares no such attribute
    signal.signal(signal.SIGTERM, guarded)


def told_to_stop() -> bool:
    """In the agent: whether a stop signal reached it (its guard was set by then: once its
    workers started), however its run then ended."""
    return _insist.signalled is not None


def agent_stops_workers(for_good: bool = True) -> None:
    """From the agent's ``_shutdown``: its workers go at once (they may ignore Slurm's SIGTERM).
    ``for_good``: the agent's end, not torch's restart of its failed workers. A restart's stop
    is not the stop the agent was told: taken for it, a stop swallowed before (an evicted joiner,
    told while it monitored workers that then failed) never landed at the next round or start
    of workers, and the joiner was charged two more restarts before it went."""
    mark(STOPPING)
    if for_good:
        _insist.stopping()


def agent_leaves() -> None:
    """From the agent's shutdown, before its workers leave at a step boundary (they take up to
    seconds): its stop has landed, and is not told again meanwhile. ``STOPPING`` is not marked
    yet (``agent_stops_workers``, once they left): a Slurm SIGTERM that a worker inside a
    collective has not handled yet (its Python handler runs when the call returns) stays held,
    and the worker leaves at the boundary. Marked first, the handler found it marked, the worker
    died mid-step and the others redid the step (a fresh-clone run's Slurm preemption in place:
    1 step redone where 0 is the claim)."""
    _insist.stopping()


def land_stop() -> None:
    """In the agent, before it joins a round or starts workers: a stop it was told lands now
    (``_Insist.land``)."""
    _insist.land()


def agent_starts_workers() -> None:
    unmark(STOPPING)
    _insist.starting()

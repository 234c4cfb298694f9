"""The job ends: a worker failed in a way no retry can mend (``StateNotSaveable``: it exits
``EXIT_FATAL``, its error file naming ``FATAL_ERROR``).

One fact per agent, learnt three ways: its worker says so over its link just before it fails
(``op: fatal``, runtime/inplace.py), its exit says so, or another node's agent wrote it in the
store (``protocol.fatal_key``). Read by whoever must then neither restart nor regroup: the
agent's restart decision (run.py) and its in-place policy (inplace.py). Before, the link's word
and the exit's were two flags in two modules, and a change to one missed the other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..contract import protocol
from ..plumbing import log
from .deadline import call_with_deadline

_log = log.get("agent.fatal")

#: A store call of the agent's own (the job's end, a round's count, a leaver's mark): a few
#: hundred bytes; no answer by then is no answer, and the decision goes on without it.
STORE_CALL_S = 5.0


def failure_message(failure: Any) -> str:
    """A torchelastic ProcessFailure's message: the error file's "Type: text" (a dict there
    when the worker recorded an exception, a string otherwise), or torch's words for a signal."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    return str(message)


def is_fatal(failure: Any) -> bool:
    """Whether a worker's failure is one no retry can mend."""
    return failure.exitcode == protocol.EXIT_FATAL and failure_message(failure).startswith(f"{protocol.FATAL_ERROR}:")


class FatalEnd:
    """Whether the job ends fatally, as this agent knows it. ``rendezvous_store`` gives the
    round's store and the run's id (None while there is none); ``node`` this node's name."""

    def __init__(
        self,
        rendezvous_store: Callable[[], tuple[Any, str] | None] = lambda: None,
        node: Callable[[], str] = lambda: "",
    ) -> None:
        self._rendezvous_store = rendezvous_store
        self._node = node
        self._here = threading.Event()  # this node's worker said so, or exited so
        self._elsewhere = threading.Event()  # another node's agent wrote it in the store
        self._told = False  # this node's end is in the store (written once)

    @property
    def ends(self) -> bool:
        return self._here.is_set() or self._elsewhere.is_set()

    def said_by_a_worker(self) -> None:
        """A worker here says it fails in a way no retry mends (its link, from a link thread):
        from now on this agent neither restarts nor regroups for a departure."""
        self._here.set()

    def after_failures(self, failures: list[Any]) -> bool:
        """This node's workers failed: whether the job ends (a failure of theirs is fatal, or
        another node's agent said so). This node's end is said in the store first, before it
        leaves its round: the other nodes' agents, which see it go, stop the same way instead of
        restarting their workers for a departure."""
        if any(is_fatal(f) for f in failures):
            self._here.set()
        if self._here.is_set():
            self._tell()
            return True
        return self._elsewhere.is_set() or (bool(failures) and self.peer_gave_up())

    def peer_gave_up(self) -> bool:
        """Whether another node's worker failed in a way no retry mends: a departure then is
        that node ending the job, not one to regroup or restart for."""
        if self.ends:
            return True
        found = self._rendezvous_store()
        if found is not None:
            store, run_id = found
            try:
                if call_with_deadline(store.check, STORE_CALL_S, [protocol.fatal_key(run_id)]):
                    self._elsewhere.set()
            except Exception:
                _log.debug("could not read whether the job ends", exc_info=True)
        return self.ends

    def _tell(self) -> None:
        if self._told:
            return
        self._told = True
        found = self._rendezvous_store()
        if found is None:
            return
        store, run_id = found
        try:
            call_with_deadline(store.set, STORE_CALL_S, protocol.fatal_key(run_id), self._node())
        except Exception:  # the others then restart for the departure and stop at their own failure
            _log.debug("could not say the job ends", exc_info=True)

"""A blocking call given a deadline: the rendezvous store client's calls.

torch's TCPStore client waits in C++ for its server's reply, and its own timeout does not
bound every call: against a server that is frozen without a connection reset (its process
stopped, its node cut off by a partition) ``get``, ``compare_set``, ``add``, ``check`` and the
constructor were still blocked after 60 s with a 5 s timeout (torch 2.13; only ``set``, which
waits for no reply, returned). The kernel would give up on the connection after ~15 minutes of
retransmissions. So the call runs on a caller thread (the client releases the GIL while it
waits) and the caller stops waiting at the deadline.

Caller threads are daemons kept for reuse: a call takes an idle one, or makes one when none is
idle (so calls from several threads at once each have their own deadline), and gives it back
when the call returns; at most ``IDLE_CALLERS_KEPT`` wait idle. A call that overruns its
deadline abandons its thread, still blocked, to its fate with the client it holds, which the
caller no longer uses; that thread ends if the call ever returns. So a thread is made per
abandoned call, not per call.

A call must not return while the interpreter ends: torch's binding retakes the GIL there, a
daemon thread that tries is ended by CPython (its pthread_exit), and the unwinding through the
binding's GIL guard, which may not throw, aborts the whole process (SIGABRT: ``terminate
called without an active exception``). An agent whose workers had all finished exited -6
instead of 0, and Kubernetes read its pod failed: a regroup's wait for a round's key, up to a
second in C++, was under way in the rendezvous probe's thread. So at the interpreter's end
(``atexit``) the calls under way are waited for, each until its deadline (a store that does
not answer is not waited for again), and a call asked for from then on by any thread but the
main one is never made: that thread waits, in Python, for the process to end.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

#: Idle caller threads kept for the next calls; a process calls from a handful of threads at once
#: (the agent's loop, its keep-alive timer), and one past this many ends when its call returns.
IDLE_CALLERS_KEPT = 4
CALLER_THREAD_NAME = "notebook-elastic-store-call"


class StoreSilent(TimeoutError):
    """A store call had no reply by its deadline: the store is frozen or cut off."""


class _Call:
    """One call handed to a caller thread, and what came of it."""

    __slots__ = ("abandoned", "args", "deadline", "error", "fn", "kwargs", "returned", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], deadline: float) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.deadline = deadline  # time.monotonic() past which its caller stops waiting
        self.returned = threading.Event()
        self.abandoned = False  # its caller stopped waiting before it returned
        self.value: Any = None
        self.error: BaseException | None = None


class _Caller:
    """A daemon thread that makes the calls handed to it, one at a time."""

    def __init__(self, pool: _Callers) -> None:
        self._pool = pool
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=CALLER_THREAD_NAME, daemon=True).start()

    def start(self, call: _Call) -> None:
        self._calls.put(call)

    def retire(self) -> None:
        """End the thread once it is idle."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call.value = call.fn(*call.args, **call.kwargs)
            except BaseException as exc:  # handed to the caller, whatever it is
                call.error = exc
            if not self._pool.returned(call):
                return  # abandoned: no call will be handed to this thread again
            # Not kept alive by an idle thread: the call's value and arguments.
            del call


class _Callers:
    """The caller threads of this process: the idle ones, the calls under way, and the lock
    that decides, for each call, whether it returned before its caller gave up on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)  # a call under way returned
        self._idle: list[_Caller] = []
        self._under_way: set[_Call] = set()  # made and not returned, abandoned ones included
        self._ending = False  # the interpreter ends: only the main thread's calls are made

    def admit(self, call: _Call) -> bool:
        """Whether ``call`` may be made: not once the interpreter ends, but from its main
        thread (whose own calls it waits for)."""
        with self._lock:
            if self._ending and threading.current_thread() is not threading.main_thread():
                return False
            self._under_way.add(call)
            return True

    def take(self) -> _Caller:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Caller(self)

    def give_back(self, caller: _Caller) -> None:
        with self._lock:
            if len(self._idle) < IDLE_CALLERS_KEPT:
                self._idle.append(caller)
                return
        caller.retire()

    def returned(self, call: _Call) -> bool:
        """Mark ``call`` returned, unless its caller gave up on it first (then False)."""
        with self._lock:
            self._under_way.discard(call)
            self._returned.notify_all()
            if call.abandoned:
                return False
            call.returned.set()
            return True

    def settle(self, call: _Call) -> bool:
        """Whether ``call`` returned; if not, its caller gives up on it."""
        with self._lock:
            if call.returned.is_set():
                return True
            call.abandoned = True
            return False

    def end(self) -> None:
        """The interpreter ends: no call is made from now on but the main thread's, and this
        returns once every call under way returned or is past its deadline (one abandoned at
        its deadline is on a store that does not answer; one abandoned because its caller's
        signal handler raised is still waited for)."""
        with self._lock:
            self._ending = True
            while True:
                left = max((call.deadline for call in self._under_way), default=0.0) - time.monotonic()
                if left <= 0:
                    return
                self._returned.wait(left)

    def forget(self) -> None:
        """In a forked child: the idle threads were not copied, only their records."""
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        self._idle = []
        self._under_way = set()
        self._ending = False


_callers = _Callers()
os.register_at_fork(after_in_child=_callers.forget)
atexit.register(_callers.end)


def call_with_deadline(fn: Callable[..., Any], timeout_s: float, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or ``StoreSilent`` once ``timeout_s`` passed without its return.
    The caller's signals are handled while it waits (a SIGTERM is not held off in C++).
    Once the interpreter ends, a thread other than the main one that calls waits here for the
    process to end, and the call is never made (see the module's docstring)."""
    call = _Call(fn, args, kwargs, time.monotonic() + timeout_s)
    if not _callers.admit(call):
        threading.Event().wait()  # in Python, where the interpreter's end stops a thread cleanly
    caller = _callers.take()
    caller.start(call)
    try:
        call.returned.wait(timeout_s)
    finally:
        # Also when a signal handler raised during the wait: a thread whose call has not
        # returned is busy, so it is left to the call and never handed another.
        if _callers.settle(call):
            _callers.give_back(caller)
    if call.abandoned:
        raise StoreSilent(f"no reply in {timeout_s:g} s")
    if call.error is not None:
        raise call.error
    return call.value

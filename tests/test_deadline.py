"""Store calls with a deadline (notebook_elastic/agent/deadline.py): caller threads are reused
from call to call, a call past its deadline abandons its thread, calls from several threads do
not wait behind each other, and results and exceptions reach the caller."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from notebook_elastic.agent.deadline import CALLER_THREAD_NAME, IDLE_CALLERS_KEPT, StoreSilent, call_with_deadline


def _callers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == CALLER_THREAD_NAME}


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_a_result_and_the_arguments_pass_through() -> None:
    assert call_with_deadline(lambda a, b=0: (a, b), 5.0, 1, b=2) == (1, 2)
    assert call_with_deadline(lambda: None, 5.0) is None


def test_sequential_calls_reuse_one_thread() -> None:
    before = _callers()
    ran_on = {call_with_deadline(threading.current_thread, 5.0) for _ in range(200)}
    assert len(ran_on) == 1
    assert ran_on.pop().name == CALLER_THREAD_NAME
    assert len(_callers() - before) <= 1


def test_an_exception_passes_through_and_the_thread_is_kept() -> None:
    class Stop(BaseException):
        pass

    def fail(exc: BaseException) -> None:
        raise exc

    first = call_with_deadline(threading.current_thread, 5.0)
    error = ValueError("bad key")
    with pytest.raises(ValueError) as raised:
        call_with_deadline(fail, 5.0, error)
    assert raised.value is error
    with pytest.raises(Stop):  # not only Exception: whatever the call raised
        call_with_deadline(fail, 5.0, Stop())
    assert call_with_deadline(threading.current_thread, 5.0) is first


def test_a_call_past_its_deadline_abandons_its_thread_and_the_next_is_answered_on_a_new_one() -> None:
    release = threading.Event()
    blocked_on: list[threading.Thread] = []

    def frozen() -> str:  # a store call against a stopped server
        blocked_on.append(threading.current_thread())
        release.wait(30)
        return "late"

    try:
        t0 = time.monotonic()
        with pytest.raises(StoreSilent, match="no reply in 0.3 s"):
            call_with_deadline(frozen, 0.3)
        assert 0.25 < time.monotonic() - t0 < 5
        t0 = time.monotonic()
        answered_on = call_with_deadline(threading.current_thread, 5.0)
        assert time.monotonic() - t0 < 1
        assert answered_on is not blocked_on[0] and blocked_on[0].is_alive()
    finally:
        release.set()
    # Its late return goes nowhere, and the thread ends rather than wait for calls forever.
    blocked_on[0].join(5)
    assert not blocked_on[0].is_alive()
    assert call_with_deadline(threading.current_thread, 5.0) is answered_on


def test_calls_from_two_threads_run_at_once_each_with_its_own_deadline() -> None:
    both_in = threading.Barrier(2, timeout=5)
    outcomes: dict[str, object] = {}

    def together(name: str) -> None:
        try:
            outcomes[name] = call_with_deadline(lambda: (both_in.wait(), threading.current_thread())[1], 5.0)
        except BaseException as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=together, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(isinstance(v, threading.Thread) for v in outcomes.values()), outcomes
    assert outcomes["a"] is not outcomes["b"]

    # One thread's blocked call does not hold up another's, nor lend it its deadline.
    release = threading.Event()
    blocked: list[object] = []
    other = threading.Thread(target=lambda: blocked.append(call_with_deadline(release.wait, 30.0, 30)))
    other.start()
    try:
        time.sleep(0.1)
        t0 = time.monotonic()
        assert call_with_deadline(lambda: "quick", 1.0) == "quick"
        assert time.monotonic() - t0 < 1
        with pytest.raises(StoreSilent):
            call_with_deadline(release.wait, 0.2, 30)
        assert other.is_alive()
    finally:
        release.set()
        other.join(10)
    assert blocked == [True]


def test_idle_threads_kept_are_bounded() -> None:
    count = IDLE_CALLERS_KEPT + 3
    all_in = threading.Barrier(count, timeout=5)
    ran_on: list[threading.Thread] = []

    def call() -> None:
        ran_on.append(call_with_deadline(lambda: (all_in.wait(), threading.current_thread())[1], 5.0))

    threads = [threading.Thread(target=call) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(set(ran_on)) == count
    assert _wait_until(lambda: sum(t.is_alive() for t in ran_on) <= IDLE_CALLERS_KEPT)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
def test_the_callers_signal_handlers_run_while_it_waits() -> None:
    class Terminated(Exception):
        pass

    def on_signal(signum: int, frame: object) -> None:
        raise Terminated

    release = threading.Event()
    previous = signal.signal(signal.SIGUSR1, on_signal)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(Terminated):
            call_with_deadline(lambda: (release.wait(30), threading.current_thread())[1], 30.0)
        assert time.monotonic() - t0 < 5
        # The interrupted call's thread is still busy with it: the next call is not handed to it.
        assert call_with_deadline(lambda: "next", 1.0) == "next"
    finally:
        timer.cancel()
        release.set()
        signal.signal(signal.SIGUSR1, previous)


def test_a_forked_child_makes_its_own_callers() -> None:
    call_with_deadline(lambda: None, 5.0)  # an idle caller in this process, not in the child
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if call_with_deadline(lambda: "child", 2.0) == "child" else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# A process whose thread keeps waiting for a store key, on a caller thread (a regroup's wait in
# the rendezvous probe's thread): its main thread ends first, and the interpreter's end, here
# slowed by a finalizer (torch's own teardown takes as long on a loaded machine), outlasts each
# wait. Old code: a wait returned during it and the process aborted (SIGABRT, exit -6).
ENDS_WHILE_A_THREAD_WAITS = """
import sys, threading, time
from datetime import timedelta
import torch.distributed as dist
from notebook_elastic.agent.deadline import call_with_deadline

store = dist.HashStore()
waiting = threading.Event()

def keep_waiting():
    while True:
        waiting.set()
        try:
            call_with_deadline(store.wait, 30.0, ["never"], timedelta(seconds=0.5))
        except RuntimeError:
            pass

class SlowEnd:
    def __del__(self):
        time.sleep(1.5)

slow_end = SlowEnd()
threading.Thread(target=keep_waiting, daemon=True).start()
waiting.wait()
time.sleep(0.2)
print("main ends", flush=True)
"""


def test_a_process_ends_cleanly_while_another_thread_waits_on_its_store() -> None:
    """The calls under way are waited for at the interpreter's end and no thread but the main
    one makes another: the process exits 0, not aborted by a call that returns into an
    interpreter that is gone."""
    import subprocess
    import sys

    ended = subprocess.run(
        [sys.executable, "-c", ENDS_WHILE_A_THREAD_WAITS], capture_output=True, text=True, timeout=120
    )
    assert ended.returncode == 0, ended.stderr[-2000:]
    assert "main ends" in ended.stdout and "terminate called" not in ended.stderr

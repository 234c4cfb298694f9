"""Slurm's SIGTERM to every process of a node (runtime/term.py): a worker holds it for the
keeper, but the processes the worker starts itself act on SIGTERM as anywhere: a forked child
(it inherits the handler) and a spawned one (it imports the runtime again) end when their
parent terminates them, and a multiprocessing pool closes at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CHECK = r"""
import multiprocessing, os, signal, tempfile, time
os.environ.update(LOCAL_RANK="0", NOTEBOOK_ELASTIC_TERM_TO_ALL="1", NOTEBOOK_ELASTIC_NOTICE_DIR=tempfile.mkdtemp())
import notebook_elastic.runtime  # a worker torch started: it holds Slurm's SIGTERM for the keeper

def child():
    import notebook_elastic.runtime  # noqa: F401
    time.sleep(30)

if __name__ == "__main__":
    print("worker holds:", getattr(signal.getsignal(signal.SIGTERM), "_notebook_elastic_deferring", False))
    for method in ("fork", "spawn"):
        ctx = multiprocessing.get_context(method)
        with ctx.Pool(1) as pool:
            pool.apply(abs, (-1,))
        p = ctx.Process(target=child)
        p.start()
        time.sleep(0.3 if method == "fork" else 3)
        p.terminate()
        p.join(10)
        print(method, "child ended by SIGTERM:", p.exitcode == -15)
"""


def test_a_workers_own_children_act_on_sigterm_as_anywhere(tmp_path):
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "worker holds: True",
        "fork child ended by SIGTERM: True",
        "spawn child ended by SIGTERM: True",
    ], done.stdout + done.stderr


AGENT = r"""
import os, sys, signal, threading, time
from notebook_elastic.runtime import term

def busy():  # the agent's other threads (keep-alive, store clients) hold the GIL at times
    while True:
        sum(range(10_000))

for _ in range(3):
    threading.Thread(target=busy, daemon=True).start()

told = []

def torchs_handler(signum, frame):  # torch's raises in the main thread; a swallowing except
    told.append(signum)             # (what once hid it) is the same as this: it is not acted on

signal.signal(signal.SIGTERM, torchs_handler)
term.guard_agent()
print("ready", flush=True)
mode, marker = sys.argv[1], sys.argv[2]
seen = None
while True:
    time.sleep(0.01)
    if mode == "twice" and len(told) >= 2:
        sys.exit(3)
    if mode == "after-burst":
        if seen is None and os.path.exists(marker):
            seen = len(told)
        if seen is not None and len(told) > seen:
            sys.exit(3)
"""


def _agent(tmp_path, mode):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTEBOOK_ELASTIC_")}
    marker = tmp_path / "burst-over"
    proc = subprocess.Popen(
        [sys.executable, str(script), mode, str(marker)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline() == "ready\n"
    return proc, marker


def test_an_agent_told_to_stop_is_told_again_until_it_stops(tmp_path):
    agent, _ = _agent(tmp_path, "twice")
    try:
        os.kill(agent.pid, signal.SIGTERM)  # not acted on: the guard tells it again
        assert agent.wait(30) == 3
    finally:
        agent.kill()


def test_a_burst_of_sigterms_never_locks_the_agent_up(tmp_path):
    """The handler runs inside whatever the main thread was doing, itself included: a lock
    taken there once held the agent forever (seen as agents outliving their supervisor)."""
    agent, marker = _agent(tmp_path, "after-burst")
    try:
        until = time.monotonic() + 1  # some land while its handler runs, at any point of it
        while time.monotonic() < until:
            os.kill(agent.pid, signal.SIGTERM)
            time.sleep(0.0005)
        marker.touch()  # its main loop still runs and it is still told again
        assert agent.wait(30) == 3
    finally:
        agent.kill()

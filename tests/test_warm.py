"""Warm worker starts: a real zygote forks real workers; the launcher behaves like the worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import pid_alive, wait_until_gone

SCRIPT = """
import json, os, random, sys, time
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "rank": os.environ.get("RANK"), "argv": sys.argv,
                  "cwd": os.getcwd(), "torch_preloaded": "torch" in sys.modules, "random": random.random(),
                  "main": __name__, "runtime_rank": __import__("notebook_elastic.runtime").runtime.rank()}), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
if sys.argv[1] == "raise":
    raise ValueError("boom")
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def zygote(tmp_path):
    path = str(tmp_path / "z.sock")
    proc = subprocess.Popen([sys.executable, "-m", "notebook_elastic.pool.warm", "serve", path])
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert time.monotonic() < deadline and proc.poll() is None, "the zygote did not start"
        time.sleep(0.05)
    yield path
    proc.terminate()
    proc.wait(60)
    assert not os.path.exists(path)  # a zygote that exits removes its socket


def launch(tmp_path, zygote_path, *args, env=None, wait=True):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    full = dict(os.environ, **(env or {}))
    if zygote_path:
        full["NOTEBOOK_ELASTIC_ZYGOTE"] = zygote_path
    else:
        full.pop("NOTEBOOK_ELASTIC_ZYGOTE", None)
    cmd = [sys.executable, "-u", "-m", "notebook_elastic.pool.warm", str(script), *args]
    if not wait:
        return subprocess.Popen(cmd, env=full, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=full, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def report(out: str) -> dict:
    import json

    return json.loads(out.splitlines()[0])


def test_a_forked_worker_is_the_process_a_cold_start_would_be(tmp_path, zygote):
    first = launch(tmp_path, zygote, "3", env={"RANK": "5"})
    second = launch(tmp_path, zygote, "0", env={"RANK": "6"})
    assert first.returncode == 3 and second.returncode == 0
    a, b = report(first.stdout), report(second.stdout)
    assert a["torch_preloaded"] and a["rank"] == "5" and b["rank"] == "6"
    assert (a["runtime_rank"], b["runtime_rank"]) == (5, 6)  # the runtime sees the worker's own env
    assert a["argv"][1:] == ["3"] and a["main"] == "__main__" and a["cwd"] == str(tmp_path)
    assert a["random"] != b["random"]  # reseeded, not the zygote's random state
    failed = launch(tmp_path, zygote, "raise")
    assert failed.returncode == 1 and "ValueError: boom" in failed.stderr


def test_signals_reach_the_worker_and_the_worker_dies_with_its_launcher(tmp_path, zygote):
    proc = launch(tmp_path, zygote, "sleep", wait=False)
    child = report(proc.stdout.readline() + "\n")["pid"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM  # the launcher exits the way its worker did
    assert wait_until_gone(lambda: [child] if pid_alive(child) else []) == []

    proc = launch(tmp_path, zygote, "sleep", wait=False)
    child = report(proc.stdout.readline() + "\n")["pid"]
    os.kill(child, signal.SIGKILL)  # the kill-a-worker drill targets the worker itself
    assert proc.wait(60) == -signal.SIGKILL

    proc = launch(tmp_path, zygote, "sleep", wait=False)
    child = report(proc.stdout.readline() + "\n")["pid"]
    proc.kill()  # the launcher dies: its worker must not go on alone
    proc.wait(60)
    assert wait_until_gone(lambda: [child] if pid_alive(child) else []) == [], "the worker outlived its launcher"


def test_without_a_zygote_the_launcher_runs_the_script_itself(tmp_path):
    done = launch(tmp_path, None, "4")
    assert done.returncode == 4 and not report(done.stdout)["torch_preloaded"]


ANOTHER_USER_CONNECTS = """
import socket, sys
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect("\\0" + sys.argv[1][1:])
try:
    conn.sendall(b'{"argv": ["x.py"], "cwd": "/", "env": {}}\\n')
    print("closed" if conn.recv(100) == b"" else "answered")
except (BrokenPipeError, ConnectionResetError):
    print("closed")
"""


def assert_another_user_is_refused(name: str) -> None:
    """A process of another user (nobody) that finds the abstract name gets the connection
    closed, not a fork (run where the tests run as root, so they can switch user)."""
    if os.getuid() != 0 or not os.path.exists("/usr/bin/python3"):
        return
    other = subprocess.run(
        ["/usr/bin/python3", "-c", ANOTHER_USER_CONNECTS, name],
        user=65534,
        group=65534,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert other.stdout.strip() == "closed", other


def abstract_listeners() -> str:
    with open("/proc/net/unix") as f:
        return f.read()


def test_an_abstract_zygote_leaves_no_file_and_serves_only_its_own_user(tmp_path):
    """The agent's zygote socket: no file in any temp folder, gone with the zygote, and a
    process of another user that finds the name gets the connection closed, not a worker."""
    name = f"@notebook-elastic-zygote-test-{os.urandom(8).hex()}"
    proc = subprocess.Popen([sys.executable, "-m", "notebook_elastic.pool.warm", "serve", name])
    try:
        deadline = time.monotonic() + 60
        while name not in abstract_listeners():
            assert time.monotonic() < deadline and proc.poll() is None, "the zygote did not start"
            time.sleep(0.05)
        done = launch(tmp_path, name, "0", env={"RANK": "2"})
        assert done.returncode == 0 and report(done.stdout)["torch_preloaded"]  # our user: served warm
        assert_another_user_is_refused(name)
    finally:
        proc.terminate()
        proc.wait(120)  # a zygote that has imported torch takes its time to finalize on 2 loaded cores
    assert name not in abstract_listeners()

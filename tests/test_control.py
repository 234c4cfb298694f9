"""The supervisor's control channel (jobfolder/control.py): authenticated, and a peer that
connects and says nothing (any local user; any host on Slurm, where it listens on every
interface) holds no one else's request; multiprocessing's own Listener ran the handshake in
accept(), so one such peer held every later request, stop included."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from notebook_elastic.jobfolder import control

KEY = b"k" * 32


@pytest.fixture
def served(monkeypatch):
    monkeypatch.setattr(control, "HANDSHAKE_S", 1.0)
    listener = control.listen(KEY)

    def answer(sock):
        try:
            conn = listener.authenticate(sock)
        except Exception:
            return
        request = json.loads(conn.recv_bytes())
        conn.send_bytes(json.dumps({"ok": True, "result": request["command"]}).encode())
        conn.close()

    def serve():
        while True:
            try:
                sock = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(sock,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield listener
    listener.close()


def test_a_silent_peer_holds_no_request_and_is_cut_off(served):
    silent = socket.create_connection(served.address)  # connects, never answers the challenge
    started = time.monotonic()
    assert control.request(served.address, KEY, "status", timeout_s=5) == "status"
    assert time.monotonic() - started < 2.0
    silent.settimeout(5)
    assert silent.recv(4096)  # the challenge it never answers
    assert silent.recv(4096) == b""  # then shut, after HANDSHAKE_S
    silent.close()


def test_a_wrong_key_gets_nothing(served):
    # A sentence, not multiprocessing's AuthenticationError: a stale supervisor.json, another program on the port.
    with pytest.raises(control.BackendError, match="is not this job's supervisor \\(it refused the job's key\\)"):
        control.request(served.address, b"x" * 32, "stop", timeout_s=5)
    assert control.request(served.address, KEY, "status", timeout_s=5) == "status"


def test_a_supervisor_that_takes_no_connection_or_gives_no_reply_is_no_answer_in_time():
    """#37 item 3: a frozen supervisor (SIGSTOP, a suspended machine) still has its connections
    taken into the kernel's backlog; the kernel's handshake then waited forever, and so did
    every stop. Each step has a deadline, past which the caller hears ``NoAnswer``."""
    frozen = socket.create_server(("127.0.0.1", 0))  # listens, never accepts: the kernel queues
    try:
        started = time.monotonic()
        with pytest.raises(control.NoAnswer, match="did not answer within 1 s during the handshake"):
            control.request(frozen.getsockname()[:2], KEY, "stop", timeout_s=5, connect_s=1.0)
        assert time.monotonic() - started < 10
    finally:
        frozen.close()
    # Authenticated, then silent: the reply's deadline.
    listener = control.listen(KEY)
    held = []

    def take() -> None:
        conn = listener.authenticate(listener.accept())
        held.append(conn)
        conn.recv_bytes()  # reads the request, never answers it

    threading.Thread(target=take, daemon=True).start()
    try:
        with pytest.raises(control.NoAnswer, match="did not answer 'scale' within 1 s"):
            control.request(listener.address, KEY, "scale", timeout_s=1.0, nodes=2)
    finally:
        listener.close()
        for conn in held:
            conn.close()
    # Nobody listening: at once, the same family.
    with socket.create_server(("127.0.0.1", 0)) as gone:
        address = gone.getsockname()[:2]
    with pytest.raises(control.NoAnswer, match="does not answer"):
        control.request(address, KEY, "stop", timeout_s=5, connect_s=1.0)


def test_each_request_is_read_once_into_its_command_and_a_bad_one_is_one_sentence():
    """The supervisor takes a request by its type (contract/commands.py), read once from the
    wire the kernel writes; what is not a command is refused in one sentence naming what."""
    from notebook_elastic.contract import commands as c

    assert c.parse({"command": "scale", "args": {"nodes": 3}}) == c.Scale(3)
    assert c.parse({"command": "set_range", "args": {"min_nodes": 1, "max_nodes": 4}}) == c.SetRange(1, 4)
    assert c.parse({"command": "kill_worker", "args": {}}) == c.KillWorker(None)
    assert c.parse({"command": "lose_node", "args": {"node": "node-1"}}) == c.RemoveNode("lose", "node-1")
    assert c.parse({"command": "preempt_node", "args": {"grace_s": 30}}) == c.RemoveNode("preempt", grace_s=30.0)
    assert c.parse({"command": "stop"}) == c.Stop() and c.parse({"command": "status", "args": None}) == c.Status()
    bad = {
        "unknown command 'rm -rf': a job's supervisor takes scale, set_range, kill_worker, preempt_node, "
        "lose_node, stop or status": {"command": "rm -rf"},
        "scale needs a whole number nodes, not 'many'": {"command": "scale", "args": {"nodes": "many"}},
        "scale needs a whole number nodes, not True": {"command": "scale", "args": {"nodes": True}},
        "set_range needs a whole number max_nodes, not None": {"command": "set_range", "args": {"min_nodes": 1}},
        "preempt_node needs grace_s in seconds, not 'soon'": {"command": "preempt_node", "args": {"grace_s": "soon"}},
        "lose_node names a node by its name, not 3": {"command": "lose_node", "args": {"node": 3}},
        "a request is a JSON object with a command, not list": ["scale"],
        "scale: its args are a JSON object, not list": {"command": "scale", "args": [3]},
    }
    for said, request in bad.items():
        with pytest.raises(ValueError) as refused:
            c.parse(request)
        assert str(refused.value) == said
    assert c.words(c.RemoveNode("lose")) == "lose a node" and c.words(c.Scale(2)) == "scale"

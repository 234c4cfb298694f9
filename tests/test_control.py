"""The supervisor's control channel (jobfolder/control.py): authenticated, and a peer that
connects and says nothing (any local user; any host on Slurm, where it listens on every
interface) holds no one else's request; multiprocessing's own Listener ran the handshake in
accept(), so one such peer held every later request, stop included."""

from __future__ import annotations

import json
import multiprocessing
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
    with pytest.raises(multiprocessing.AuthenticationError, match="digest sent was rejected"):
        control.request(served.address, b"x" * 32, "stop", timeout_s=5)
    assert control.request(served.address, KEY, "status", timeout_s=5) == "status"

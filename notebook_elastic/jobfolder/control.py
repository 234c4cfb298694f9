"""The control channel between a kernel and a job's supervisor.

JSON requests and replies over a TCP connection (loopback; every interface on Slurm)
authenticated with the job's secret key (``multiprocessing.connection``'s HMAC handshake, run
in each connection's own thread); the key lives in the job's ``supervisor.json``, readable only
by its owner. One request, one reply, per connection.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any

from ..errors import BackendError


def request(address: tuple[str, int], authkey: bytes, command: str, timeout_s: float = 60.0, **args: Any) -> Any:
    try:
        conn = Client(address, authkey=authkey)
    except (ConnectionError, OSError) as exc:
        raise BackendError(f"the job's supervisor at {address[0]}:{address[1]} does not answer ({exc})") from None
    try:
        conn.send_bytes(json.dumps({"command": command, "args": args}).encode())
        if not conn.poll(timeout_s):
            raise BackendError(f"the job's supervisor did not answer {command!r} within {timeout_s:.0f} s")
        reply = json.loads(conn.recv_bytes())
    except (EOFError, ConnectionError, OSError) as exc:
        raise BackendError(f"the job's supervisor closed the connection during {command!r} ({exc})") from None
    finally:
        conn.close()
    if not reply.get("ok"):
        raise BackendError(reply.get("error") or f"{command} failed")
    return reply.get("result")


#: How long a peer has to finish the handshake before its connection is shut.
HANDSHAKE_S = 10.0


class ControlListener:
    """The supervisor's listener. ``multiprocessing``'s own Listener runs the HMAC handshake
    inside ``accept()``: one peer that connects and says nothing (any local user; any host, on
    Slurm) held every later request, stop included. Here ``accept()`` only takes the
    connection; ``authenticate()``, run in the connection's own thread, does the handshake, and
    a peer that has not finished it within ``HANDSHAKE_S`` is cut off."""

    def __init__(self, authkey: bytes, host: str) -> None:
        self.authkey = authkey
        self._sock = socket.create_server((host, 0), backlog=64)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]

    def accept(self) -> socket.socket:
        return self._sock.accept()[0]

    def authenticate(self, sock: socket.socket) -> Connection:
        """The handshake (both ways, as multiprocessing's Listener does it); raises
        AuthenticationError, or EOFError/OSError for a peer cut off or gone."""
        shut = threading.Timer(HANDSHAKE_S, _shut, args=(sock,))
        shut.start()
        try:
            conn = Connection(os.dup(sock.fileno()))
            try:
                deliver_challenge(conn, self.authkey)
                answer_challenge(conn, self.authkey)
            except BaseException:
                conn.close()
                raise
            return conn
        finally:
            shut.cancel()
            sock.close()  # the connection holds its own descriptor

    def close(self) -> None:
        self._sock.close()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def listen(authkey: bytes, host: str = "127.0.0.1") -> ControlListener:
    """The supervisor's control listener: on loopback, or on every interface ("0.0.0.0") where
    the kernel may be on another machine than the supervisor (Slurm); authenticated either way."""
    return ControlListener(authkey, host)


def reachable(address: tuple[str, int]) -> list[Any]:
    """The listener's address as another machine reaches it."""
    host, port = address[:2]
    return [socket.gethostname() if host == "0.0.0.0" else host, port]

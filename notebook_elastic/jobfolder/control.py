"""The control channel between a kernel and a job's supervisor.

JSON requests and replies over a TCP connection (loopback; every interface on Slurm)
authenticated with the job's secret key (``multiprocessing.connection``'s HMAC handshake, run
in each connection's own thread); the key lives in the job's ``supervisor.json``, readable only
by its owner. One request, one reply, per connection. Every wait of either end has a
deadline: the supervisor cuts off a peer that does not finish the handshake (``HANDSHAKE_S``),
the kernel gives up on a supervisor that does not take its connection, finish the handshake
(``CONNECT_S``) or reply (``timeout_s``) with ``NoAnswer``, so a frozen supervisor never holds a
stop (``LocalBackend.cancel`` then ends the job's processes itself).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

from ..errors import BackendError

#: How long a kernel waits for the supervisor to take its connection and finish the handshake.
#: A live supervisor does both in a thread of its own at once; one that is frozen (SIGSTOP, a
#: suspended machine) or wedged does neither, and its kernel's TCP stack still accepts the
#: connection into the backlog: without this deadline a stop waited forever (#37).
CONNECT_S = 10.0


class NoAnswer(BackendError):
    """The supervisor took no connection, or did not finish the handshake or answer in time:
    frozen, wedged, or on a machine that does not answer. Its caller falls back to what it
    can do without it (``LocalBackend.cancel``: end the job's processes from here)."""


class _Watchdog:
    """Shuts a socket once its deadline passes, so a read or write blocked on it returns
    (EOFError/OSError); ``fired`` tells that from a peer that closed it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fired = threading.Event()
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float) -> None:
        self.disarm()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self.fired.set()
        _shut(self.sock)


def request(
    address: tuple[str, int],
    authkey: bytes,
    command: str,
    timeout_s: float = 60.0,
    *,
    connect_s: float = CONNECT_S,
    **args: Any,
) -> Any:
    """Send one command and return its result. Every step has a deadline: the connection and
    the handshake ``connect_s``, the reply ``timeout_s``; past one, ``NoAnswer`` (a sentence
    naming the supervisor's address and the step); a refusal is a ``BackendError``."""
    where = f"{address[0]}:{address[1]}"
    try:
        sock = socket.create_connection((address[0], int(address[1])), timeout=connect_s)
    except OSError as exc:
        raise NoAnswer(f"the job's supervisor at {where} does not answer ({exc})") from None
    sock.settimeout(None)  # multiprocessing's Connection reads and writes a blocking descriptor
    # The handshake's last write and the request go out back to back: with Nagle's algorithm the
    # request waited for the first one's ACK, which the supervisor delays (40 ms on Linux).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    watchdog = _Watchdog(sock)
    watchdog.arm(connect_s)
    conn: Connection | None = None
    step = "the handshake"
    try:
        conn = Connection(os.dup(sock.fileno()))
        answer_challenge(conn, authkey)
        deliver_challenge(conn, authkey)
        step = f"{command!r}"
        conn.send_bytes(json.dumps({"command": command, "args": args}).encode())
        watchdog.arm(timeout_s + connect_s)  # the reply's read too, not only its first byte
        if not conn.poll(timeout_s):
            raise NoAnswer(f"the job's supervisor at {where} did not answer {command!r} within {timeout_s:.0f} s")
        reply = json.loads(conn.recv_bytes())
    except (AuthenticationError, AssertionError, ValueError):  # another program's port; garbage for a reply
        raise BackendError(
            f"the process at {where} is not this job's supervisor (it refused the job's key); "
            "the job's supervisor.json may be stale"
        ) from None
    except (EOFError, ConnectionError, OSError) as exc:
        if watchdog.fired.is_set():
            raise NoAnswer(
                f"the job's supervisor at {where} did not answer within {connect_s:.0f} s during {step} "
                "(is it stopped, suspended or hung?)"
            ) from None
        raise BackendError(f"the job's supervisor closed the connection during {step} ({exc})") from None
    finally:
        watchdog.disarm()
        if conn is not None:
            conn.close()
        sock.close()
    if not isinstance(reply, dict):
        raise BackendError(
            f"the process at {where} is not this job's supervisor (it answered {command!r} with no record)"
        )
    if not reply.get("ok"):
        raise BackendError(str(reply.get("error") or f"{command} failed"))
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
        sock = self._sock.accept()[0]
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small writes, each awaited
        return sock

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

"""The control channel between a kernel and a job's supervisor.

JSON requests and replies over a loopback TCP connection authenticated with the job's
secret key (``multiprocessing.connection``'s HMAC handshake); the key lives in the job's
``supervisor.json``, readable only by its owner. One request, one reply, per connection.
"""

from __future__ import annotations

import json
import socket
from multiprocessing.connection import Client, Listener
from typing import Any

from ...errors import BackendError


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


def listen(authkey: bytes, host: str = "127.0.0.1") -> Listener:
    """The supervisor's control listener: on loopback, or on every interface ("0.0.0.0") where
    the kernel may be on another machine than the supervisor (Slurm); authenticated either way."""
    return Listener((host, 0), authkey=authkey)


def reachable(address: tuple[str, int]) -> list[Any]:
    """The listener's address as another machine reaches it."""
    host, port = address[:2]
    return [socket.gethostname() if host == "0.0.0.0" else host, port]

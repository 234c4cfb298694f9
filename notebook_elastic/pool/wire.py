"""The wire between a launcher and the process that forks for it (a node's zygote, the warm
pool): abstract Unix socket names, one JSON object per line, file descriptors passed beside
the first, and the check that the other end runs as our user (SO_PEERCRED)."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

from ..contract.protocol import ENV_WARM_WORKERS

TYPE_CHECKING = False  # typing's costs a worker's launcher 9 ms
if TYPE_CHECKING:
    from typing import Any

CONNECT_WAIT_S = 15.0  # the zygote may still be importing torch on a node's first start


def enabled() -> bool:
    return os.environ.get(ENV_WARM_WORKERS, "1") != "0" and sys.platform.startswith("linux")


def _address(name: str) -> str:
    """``@name`` -> the abstract socket address (environment values cannot hold the NUL)."""
    return "\0" + name[1:] if name.startswith("@") else name


def same_user(conn: socket.socket) -> bool:
    """Whether the process at the other end of ``conn`` runs as our user (SO_PEERCRED)."""
    uid: int
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return False
    return uid == os.getuid()


def _send(conn: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        socket.send_fds(conn, [data], fds)
    else:
        conn.sendall(data)


def _recv_line(conn: socket.socket, buffer: bytearray) -> dict[str, Any] | None:
    while b"\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    message: dict[str, Any] = json.loads(line)
    return message

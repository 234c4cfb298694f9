"""A client of torch's TCPStore protocol in plain Python, and the protocol's command numbers:
what the job's processes beside torch's own client use (a node's keeper, the agent's change
watch, rank 0's notice board), and what our store server (``store/wire.py``) reads. The
standard library alone: the store pod and the keeper run it without torch."""

from __future__ import annotations

import socket
import struct
from datetime import timedelta
from typing import Protocol, overload

VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND = range(10)
MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS, BARRIER = range(10, 19)
VALIDATION_MAGIC = 0x3C85F7CE
READY, NOT_READY = b"\x00", b"\x01"
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class KeyValues(Protocol):
    """The calls torch's store clients and ``StoreClient`` both answer: what a notice is posted,
    read and withdrawn with (``runtime/notice.py``), by a supervisor, a node's keeper or rank 0."""

    def set(self, key: str, value: str, /) -> None: ...
    def get(self, key: str, /) -> bytes: ...
    def add(self, key: str, value: int, /) -> int: ...
    def check(self, keys: list[str], /) -> bool: ...
    def delete_key(self, key: str, /) -> object: ...


class KeyStore(Protocol):
    """torch's store as this package calls it: a TCPStore, a PrefixStore over one, the agent's
    ``BoundedStore`` (which is not a ``torch.distributed.Store``); ``KeyValues`` and more. torch's
    type stub lacks ``append`` and ``timeout``, which every torch of the range has: their few
    callers say so."""

    def set(self, key: str, value: str, /) -> None: ...
    def get(self, key: str, /) -> bytes: ...
    def add(self, key: str, value: int, /) -> int: ...
    def check(self, keys: list[str], /) -> bool: ...
    def delete_key(self, key: str, /) -> object: ...
    def set_timeout(self, timeout: timedelta, /) -> None: ...
    def compare_set(self, key: str, expected: str, desired: str, /) -> bytes: ...
    def multi_get(self, keys: list[str], /) -> list[bytes]: ...
    @overload
    def wait(self, keys: list[str], /) -> None: ...
    @overload
    def wait(self, keys: list[str], timeout: timedelta, /) -> None: ...


def _vec(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _key(key: str) -> bytes:
    return _vec(b"/" + key.encode())  # torch's TCPStore client keeps every key under "/"


class StoreClient:
    """torch's TCPStore protocol, the few commands a notice needs (SET, CHECK, GET, DELETE_KEY,
    ADD) and the WAITs of the change watch and of rank 0's notice board, each key under "/" as
    torch's own client puts it (so both see the same keys). Plain Python: a thread blocked in it
    at the process's end ends with it (one blocked in torch's C++ client was ended by
    std::terminate when its connection closed then)."""

    def __init__(self, endpoint: str, timeout_s: float = 5.0) -> None:
        host, _, port = endpoint.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        # A SET (no reply) before a CHECK: with Nagle's algorithm the CHECK waited for the SET's
        # delayed ACK (40 ms on Linux); torch's own client sets this too.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(bytes([VALIDATE]) + struct.pack("<I", VALIDATION_MAGIC))

    def _recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            data += chunk
        return data

    def set(self, key: str, value: str) -> None:
        self.sock.sendall(bytes([SET]) + _key(key) + _vec(value.encode()))

    def check(self, keys: list[str]) -> bool:
        self.sock.sendall(bytes([CHECK]) + _U64.pack(len(keys)) + b"".join(_key(k) for k in keys))
        return self._recv(1) == READY

    def get(self, key: str) -> bytes:
        self.sock.sendall(bytes([GET]) + _key(key))
        return self._recv(_U64.unpack(self._recv(8))[0])

    def add(self, key: str, delta: int) -> int:
        self.sock.sendall(bytes([ADD]) + _key(key) + _I64.pack(delta))
        value: int = _I64.unpack(self._recv(8))[0]
        return value

    def delete_key(self, key: str) -> None:
        self.sock.sendall(bytes([DELETE_KEY]) + _key(key))
        self._recv(8)

    def wait(self, keys: list[str], timeout_s: float) -> bool:
        """WAIT until every one of ``keys`` is set: True once the store says so; False after
        ``timeout_s``, and the connection is closed (it holds a WAIT no one reads any more)."""
        self.sock.sendall(bytes([WAIT]) + _U64.pack(len(keys)) + b"".join(_key(k) for k in keys))
        self.sock.settimeout(timeout_s)
        try:
            return self._recv(1) == STOP_WAITING
        except TimeoutError:
            self.close()
            return False

    def cut(self) -> None:
        """End a WAIT under way from another thread: the connection is shut, its read returns."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()

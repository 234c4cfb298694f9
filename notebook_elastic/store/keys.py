"""The store's keys, queues and waiters, and torch's commands on them (``TCPStoreLibUvBackend``,
command by command), for ``server.py``, which owns the connections: a command's handler reads
its fields from where they landed, acts, and leaves its answer in the client's ``out``.

An answer refers to the stored values (bytes, never changed in place) instead of copying them:
a MULTI_GET naming an 8 MiB value 128 times costs 128 references, sent as the client reads
(#37 item 9: it built 1 GiB at once).
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable

from ..plumbing.store_client import (
    ADD,
    APPEND,
    BARRIER,
    CANCEL_WAIT,
    CHECK,
    COMPARE_SET,
    DELETE_KEY,
    GET,
    GETNUMKEYS,
    LIST_KEYS,
    MULTI_GET,
    MULTI_SET,
    NOT_READY,
    PING,
    QUEUE_LEN,
    QUEUE_POP,
    QUEUE_PUSH,
    READY,
    SET,
    STOP_WAITING,
    WAIT,
    WAIT_CANCELED,
)
from .wire import (
    _I64,
    _U64,
    Scan,
    count_at,
    fixed_at,
    key_at,
    value_at,
)

#: A value shorter than this goes out joined to its length; a longer one as itself.
_JOIN_BELOW = 512
#: Bits of the poller's event mask (the same in epoll and poll).
IN, OUT = 0x001, 0x004


class Client:
    """One connection's state: what it sent and was not answered yet, what it was answered and
    did not read yet."""

    __slots__ = ("sock", "fd", "inbox", "scan", "out", "queued", "validated", "awaited", "mask", "peer", "send")

    def __init__(self, sock: socket.socket, peer: object) -> None:
        self.sock = sock
        self.send = sock.send  # bound once: it is called on every command
        self.fd = sock.fileno()  # -1 once closed (its number may be another client's by then)
        self.inbox = bytearray()  # a command still arriving, or commands held back, from its start
        self.scan: Scan | None = None  # the walk of the command at the head of the inbox
        self.out: list[bytes | memoryview] = []  # answers not yet sent, in pieces
        self.queued = 0  # their bytes
        self.validated = False
        self.awaited = 0  # keys its WAIT still waits for
        self.mask = IN  # what the poller watches its socket for
        self.peer = peer

    def reply(self, data: bytes | memoryview) -> None:
        self.out.append(data)
        self.queued += len(data)

    def reply_value(self, value: bytes) -> None:
        """A byte vector: its length, then the value itself (not a copy, unless it is small)."""
        if len(value) < _JOIN_BELOW:
            data = _U64.pack(len(value)) + value
            self.out.append(data)
            self.queued += len(data)
        else:
            self.out += (_U64.pack(len(value)), value)
            self.queued += 8 + len(value)


Data = bytes | memoryview
Handler = Callable[["Keys", Client, Data, int], int]


class Keys:
    """The keys, queues and waiters; ``answer_now(client, data)`` answers a client whose WAIT
    (or BARRIER) was released by another's command."""

    def __init__(self, answer_now: Callable[[Client, bytes], None]) -> None:
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}
        self.waiting: dict[bytes, list[Client]] = {}
        self.answer_now = answer_now

    # -- the commands: each reads its fields at ``at`` and returns where it ends -------------

    def get(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        value = self.data.get(key, b"")
        if len(value) < _JOIN_BELOW:  # reply_value, inline: the most frequent answer
            reply = _U64.pack(len(value)) + value
            client.out.append(reply)
            client.queued += len(reply)
        else:
            client.reply_value(value)
        return at

    def wait(self, client: Client, data: Data, at: int) -> int:
        keys, at = self._keys(data, at)
        if self._wait(client, keys):
            client.reply(STOP_WAITING)
        return at

    def check(self, client: Client, data: Data, at: int) -> int:
        keys, at = self._keys(data, at)
        client.reply(READY if self._check(keys) else NOT_READY)
        return at

    @staticmethod
    def _keys(data: Data, at: int) -> tuple[list[bytes], int]:
        n, at = count_at(data, at)
        keys = []
        for _ in range(n):
            key, at = key_at(data, at)
            keys.append(key)
        return keys, at

    def compare_set(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        expected, at = value_at(data, at)
        desired, at = value_at(data, at)
        client.reply_value(self._compare_set(key, expected, desired))
        return at

    def set(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        value, at = value_at(data, at)
        self._set(key, value)
        return at

    def add(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        end = fixed_at(data, at, 8)
        client.reply(_I64.pack(self._add(key, _I64.unpack_from(data, at)[0])))
        return end

    def ping(self, client: Client, data: Data, at: int) -> int:
        end = fixed_at(data, at, 4)
        client.reply(bytes(data[at:end]))
        return end

    def getnumkeys(self, client: Client, data: Data, at: int) -> int:
        client.reply(_I64.pack(len(self.data)))
        return at

    def delete_key(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        client.reply(_I64.pack(1 if self.data.pop(key, None) is not None else 0))
        return at

    def append(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        value, at = value_at(data, at)
        self._set(key, self.data.get(key, b"") + value)
        return at

    def multi_get(self, client: Client, data: Data, at: int) -> int:
        keys, at = self._keys(data, at)
        stored = self.data
        for key in keys:  # references to the stored values: nothing is copied for a repeated key
            client.reply_value(stored.get(key, b""))
        return at

    def multi_set(self, client: Client, data: Data, at: int) -> int:
        n, at = count_at(data, at)
        pairs = []
        for _ in range(n):
            key, at = key_at(data, at)
            value, at = value_at(data, at)
            pairs.append((key, value))
        for key, value in pairs:  # all at once, once every pair is in (as torch's)
            self._set(key, value)
        return at

    def cancel_wait(self, client: Client, data: Data, at: int) -> int:
        self.clear_wait(client)
        client.reply(WAIT_CANCELED)
        return at

    def queue_push(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        value, at = value_at(data, at)
        self.queues.setdefault(key, deque()).append(value)
        self._wake(key, one=True)
        return at

    def queue_pop(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        queue = self.queues.setdefault(key, deque())
        client.reply(_I64.pack(len(queue)))
        if queue:
            client.reply_value(queue.popleft())
        return at

    def queue_len(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        client.reply(_I64.pack(len(self.queues.get(key, ()))))
        return at

    def list_keys(self, client: Client, data: Data, at: int) -> int:
        client.reply(_U64.pack(len(self.data)))
        for key in self.data:
            client.reply_value(key)
        return at

    def barrier(self, client: Client, data: Data, at: int) -> int:
        key, at = key_at(data, at)
        end = fixed_at(data, at, 8)
        if self._barrier(client, key, _I64.unpack_from(data, at)[0]):
            client.reply(STOP_WAITING)
        return end

    # -- the state ---------------------------------------------------------------------------

    def _set(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        if key in self.waiting:
            self._wake(key)

    def compare_set_value(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        """COMPARE_SET's answer: the value now (for the server's quick path)."""
        return self._compare_set(key, expected, desired)

    def set_value(self, key: bytes, value: bytes) -> None:
        """SET (for the server's quick path)."""
        self._set(key, value)

    def add_value(self, key: bytes, delta: int) -> int:
        """ADD's answer: the sum now (for the server's quick path); ValueError where the key
        holds no number."""
        return self._add(key, delta)

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        current = self.data.get(key)
        if current is None:
            if expected:
                self._wake(key)
                return expected  # torch's answer for a missing key: the expected value
            self._set(key, desired)
            return desired
        if current == expected:
            self.data[key] = current = desired
        self._wake(key)
        return current

    def _add(self, key: bytes, delta: int) -> int:
        current = self.data.get(key)
        value = delta + (int(current) if current is not None else 0)  # int() reads ASCII bytes
        self._set(key, b"%d" % value)
        return value

    def _barrier(self, client: Client, key: bytes, world_size: int) -> bool:
        """Count this client in; True (answer now) for the last of ``world_size``."""
        current = self.data.get(key)
        count = 1 + (int(current.decode()) if current is not None else 0)
        self.data[key] = str(count).encode()
        if count >= world_size:
            self._wake(key)
            return True
        self.waiting.setdefault(key, []).append(client)
        client.awaited = 1
        return False

    def _check(self, keys: list[bytes]) -> bool:
        return all(k in self.data or self.queues.get(k) for k in keys)

    def _wait(self, client: Client, keys: list[bytes]) -> bool:
        if self._check(keys):
            return True
        missing = [k for k in keys if k not in self.data]
        for key in missing:
            self.waiting.setdefault(key, []).append(client)
        client.awaited = len(missing)
        return False

    def _wake(self, key: bytes, *, one: bool = False) -> None:
        clients = self.waiting.get(key)
        if not clients:
            return
        if one:  # a queue push answers one waiter
            for client in clients:
                client.awaited -= 1
                if client.awaited == 0:
                    self.answer_now(client, STOP_WAITING)
                    return
            return
        del self.waiting[key]
        for client in clients:
            client.awaited -= 1
            if client.awaited == 0:
                self.answer_now(client, STOP_WAITING)

    def clear_wait(self, client: Client) -> None:
        if not client.awaited:
            return
        client.awaited = 0
        for key in [k for k, cs in self.waiting.items() if client in cs]:
            self.waiting[key] = [c for c in self.waiting[key] if c is not client]
            if not self.waiting[key]:
                del self.waiting[key]


_BY_COMMAND: dict[int, Handler] = {
    SET: Keys.set,
    COMPARE_SET: Keys.compare_set,
    GET: Keys.get,
    ADD: Keys.add,
    CHECK: Keys.check,
    WAIT: Keys.wait,
    GETNUMKEYS: Keys.getnumkeys,
    DELETE_KEY: Keys.delete_key,
    APPEND: Keys.append,
    MULTI_GET: Keys.multi_get,
    MULTI_SET: Keys.multi_set,
    CANCEL_WAIT: Keys.cancel_wait,
    PING: Keys.ping,
    QUEUE_PUSH: Keys.queue_push,
    QUEUE_POP: Keys.queue_pop,
    QUEUE_LEN: Keys.queue_len,
    LIST_KEYS: Keys.list_keys,
    BARRIER: Keys.barrier,
}
#: Each byte's handler (None: not a command; VALIDATE only comes first).
_HANDLERS: list[Handler | None] = [_BY_COMMAND.get(c) for c in range(256)]

"""A c10d TCPStore server in the standard library alone: the Kubernetes rendezvous pod's store.

torch's own server needs torch, and so an image of several GB on the node that hosts the
store (official torch images are CUDA images). This one speaks the wire protocol of torch's
TCPStore client (torch 2.13's: ``TCPStoreLibUvBackend.cpp``, whose semantics it follows
command by command, LIST_KEYS and BARRIER included), so the store pod runs on a small Python image and starts in the time
the image takes to pull. The local supervisor keeps torch's server (it has torch loaded).

The protocol: a connection's first command is VALIDATE with the magic number; every command
is one byte, then its fields, little-endian: strings and byte vectors are a uint64 length
and the bytes, integers int64, counts uint64. WAIT answers when every key exists; a client
that timed out sends CANCEL_WAIT and gets WAIT_CANCELED. One thread, non-blocking sockets.

It serves every rank of a cluster job, so no client may take it down (#26):
- back-pressure: a client whose answers pile up unread (``OUTBOX_HIGH``) is not read until it
  takes them, so one that sends GETs of an 8 MiB value without reading costs a few MiB, not
  what it asks for (it grew the server past 1 GiB);
- linear parsing: a command still arriving is not parsed again until the bytes it needs are in
  (a MULTI_SET of 8 values of 8 MiB was re-parsed from its start on every read: 21 s, others'
  calls waiting 370 ms), and one command is at most ``MAX_REQUEST_LEN`` bytes;
- out of descriptors (EMFILE), the listening socket rests (``ACCEPT_PAUSE_S``, doubling)
  instead of waking the loop at once, again and again; the backlog keeps the connections.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
import uuid
from collections import deque
from typing import cast

from .wire import (
    _I64,
    _OUT_OF_DESCRIPTORS,
    _U32,
    _U64,
    ACCEPT_PAUSE_MAX_S,
    ACCEPT_PAUSE_S,
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
    MAX_REQUEST_LEN,
    MULTI_GET,
    MULTI_SET,
    NOT_READY,
    OUTBOX_HIGH,
    PING,
    QUEUE_LEN,
    QUEUE_POP,
    QUEUE_PUSH,
    READY,
    SET,
    STOP_WAITING,
    VALIDATE,
    VALIDATION_MAGIC,
    WAIT,
    WAIT_CANCELED,
    _Incomplete,
    _Reader,
    _Refused,
    _vector,
)


class _Client:
    __slots__ = ("sock", "inbox", "outbox", "validated", "awaited", "need")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.validated = False
        self.awaited = 0  # keys its WAIT still waits for
        self.need = 0  # bytes the command at the head of the inbox needs before it is parsed again


class StoreServer:
    """Serves a bound, listening socket until ``stop()``; ``store_id``: what the store's
    ``STORE_ID_KEY`` holds, by which agents tell a replacement store from the one they lost."""

    def __init__(self, sock: socket.socket, store_id_key: str | None = None) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}
        self.waiting: dict[bytes, list[_Client]] = {}
        self.clients: dict[socket.socket, _Client] = {}
        self.store_id = uuid.uuid4().hex
        if store_id_key is not None:
            self.data[b"/" + store_id_key.encode()] = self.store_id.encode()  # torch's key prefix
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        self._accept_pause = ACCEPT_PAUSE_S
        self._accept_resumes: float | None = None  # the listening socket rests until then

    # -- the loop --------------------------------------------------------------------------

    def serve_forever(self) -> None:
        try:
            while not self._stopping:
                resumes = self._accept_resumes
                timeout = None if resumes is None else max(0.0, resumes - time.monotonic())
                for key, events in self._selector.select(timeout):
                    if key.fileobj is self.sock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    else:
                        client = self.clients.get(cast(socket.socket, key.fileobj))  # only sockets are registered
                        if client is None:
                            continue
                        if events & selectors.EVENT_READ:
                            self._read(client)
                        if events & selectors.EVENT_WRITE and client.sock in self.clients:
                            self._flush(client)
                            if client.sock in self.clients and len(client.outbox) < OUTBOX_HIGH:
                                self._process(client)  # commands held back while answers piled up
                if resumes is not None and time.monotonic() >= resumes:
                    self._accept_resumes = None
                    self._selector.register(self.sock, selectors.EVENT_READ)
        finally:
            for client in list(self.clients.values()):
                self._close(client)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()
            self.sock.close()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="store-server", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    # The backlog keeps the connection; the socket stays readable, so rest it
                    # instead of waking the loop at once, again and again (it spun a core).
                    self._selector.unregister(self.sock)
                    self._accept_resumes = time.monotonic() + self._accept_pause
                    self._accept_pause = min(2 * self._accept_pause, ACCEPT_PAUSE_MAX_S)
                return
            self._accept_pause = ACCEPT_PAUSE_S
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.clients[conn] = _Client(conn)
            self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(client)
            return
        client.inbox += chunk
        self._process(client)

    def _process(self, client: _Client) -> None:
        """Answer the whole commands in the client's inbox, while its unread answers stay
        under ``OUTBOX_HIGH``; a command still arriving waits for the bytes it needs."""
        if len(client.inbox) < client.need:
            return  # not parsed again before its bytes are in: linear, however it arrives
        reader = _Reader(client.inbox)
        try:
            while reader.at < len(client.inbox) and len(client.outbox) < OUTBOX_HIGH:
                start = reader.at
                try:
                    self._command(client, reader)
                    client.need = 0
                except _Incomplete as incomplete:
                    reader.at = start
                    client.need = incomplete.end - start
                    if client.need > MAX_REQUEST_LEN:
                        raise _Refused(f"a command of over {MAX_REQUEST_LEN} bytes") from None
                    break
        except (_Refused, ValueError):
            self._close(client)
            return
        del client.inbox[: reader.at]
        self._flush(client)

    def _send(self, client: _Client, data: bytes) -> None:
        client.outbox += data

    def _flush(self, client: _Client) -> None:
        if client.outbox:
            try:
                sent = client.sock.send(client.outbox)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._close(client)
                return
            del client.outbox[:sent]
        # Back-pressure: a client that leaves its answers unread is not read (nor answered
        # more) until it takes them; its socket's buffers hold the rest of what it sends.
        reading = selectors.EVENT_READ if len(client.outbox) < OUTBOX_HIGH else 0
        self._selector.modify(client.sock, reading | (selectors.EVENT_WRITE if client.outbox else 0))

    def _close(self, client: _Client) -> None:
        if self.clients.pop(client.sock, None) is None:
            return
        self._clear_wait(client)
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()

    # -- commands (torch's TCPStoreLibUvBackend, command by command) ------------------------

    def _command(self, client: _Client, r: _Reader) -> None:
        command = r.take(1)[0]
        if not client.validated:
            if command != VALIDATE or r.u32() != VALIDATION_MAGIC:
                raise _Refused("the first command was not VALIDATE with torch's magic number")
            client.validated = True
            return
        if command == PING:
            self._send(client, _U32.pack(r.u32()))
        elif command == SET:
            key, value = r.key(), r.payload()
            self._set(key, value)
        elif command == COMPARE_SET:
            key, expected, desired = r.key(), r.payload(), r.payload()
            self._send(client, _vector(self._compare_set(key, expected, desired)))
        elif command == GET:
            self._send(client, _vector(self.data.get(r.key(), b"")))
        elif command == ADD:
            key, delta = r.key(), r.i64()
            self._send(client, _I64.pack(self._add(key, delta)))
        elif command == CHECK:
            keys = [r.key() for _ in range(r.count())]
            self._send(client, READY if self._check(keys) else NOT_READY)
        elif command == WAIT:
            keys = [r.key() for _ in range(r.count())]
            if self._wait(client, keys):
                self._send(client, STOP_WAITING)
        elif command == GETNUMKEYS:
            self._send(client, _I64.pack(len(self.data)))
        elif command == DELETE_KEY:
            self._send(client, _I64.pack(1 if self.data.pop(r.key(), None) is not None else 0))
        elif command == APPEND:
            key, value = r.key(), r.payload()
            self._set(key, self.data.get(key, b"") + value)
        elif command == MULTI_GET:
            keys = [r.key() for _ in range(r.count())]
            self._send(client, b"".join(_vector(self.data.get(k, b"")) for k in keys))
        elif command == MULTI_SET:
            pairs = [(r.key(), r.payload()) for _ in range(r.count())]
            for key, value in pairs:
                self._set(key, value)
        elif command == CANCEL_WAIT:
            self._clear_wait(client)
            self._send(client, WAIT_CANCELED)
        elif command == QUEUE_PUSH:
            key, value = r.key(), r.payload()
            self.queues.setdefault(key, deque()).append(value)
            self._wake(key, one=True)
        elif command == QUEUE_POP:
            queue = self.queues.setdefault(r.key(), deque())
            reply = _I64.pack(len(queue))
            if queue:
                reply += _vector(queue.popleft())
            self._send(client, reply)
        elif command == QUEUE_LEN:
            self._send(client, _I64.pack(len(self.queues.get(r.key(), ()))))
        elif command == LIST_KEYS:
            self._send(client, _U64.pack(len(self.data)) + b"".join(_vector(k) for k in self.data))
        elif command == BARRIER:
            key, world_size = r.key(), r.i64()
            if self._barrier(client, key, world_size):
                self._send(client, STOP_WAITING)
        else:
            raise _Refused(f"an unknown command {command}")

    def _set(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        self._wake(key)

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
        value = delta + (int(current.decode()) if current is not None else 0)
        self._set(key, str(value).encode())
        return value

    def _barrier(self, client: _Client, key: bytes, world_size: int) -> bool:
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

    def _wait(self, client: _Client, keys: list[bytes]) -> bool:
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
                    self._reply_now(client, STOP_WAITING)
                    return
            return
        del self.waiting[key]
        for client in clients:
            client.awaited -= 1
            if client.awaited == 0:
                self._reply_now(client, STOP_WAITING)

    def _reply_now(self, client: _Client, data: bytes) -> None:
        if client.sock in self.clients:
            self._send(client, data)
            self._flush(client)

    def _clear_wait(self, client: _Client) -> None:
        if not client.awaited:
            return
        client.awaited = 0
        for key in [k for k, cs in self.waiting.items() if client in cs]:
            self.waiting[key] = [c for c in self.waiting[key] if c is not client]
            if not self.waiting[key]:
                del self.waiting[key]

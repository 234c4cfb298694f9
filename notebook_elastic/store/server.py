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

It serves every rank of a cluster job, so no client may take it down (#26, #37):
- back-pressure: a client whose answers pile up unread (``OUTBOX_HIGH``) is not read until it
  takes them; an answer refers to the stored values (bytes, never changed in place) instead of
  copying them, so one that sends GETs of an 8 MiB value without reading costs a few MiB, not
  what it asks for (it grew the server past 1 GiB), and so does one MULTI_GET naming that value
  128 times (back-pressure was checked only between commands: 1 GiB built at once);
- linear parsing: a command still arriving is walked once, resuming where it stopped
  (``wire.Scan``), and parsed once, when its bytes are in (a MULTI_SET of 8 values of 8 MiB was
  re-parsed from its start on every read: 21 s, others' calls waiting 370 ms); one command is
  at most ``MAX_REQUEST_LEN`` bytes (8 of torch's largest values fit);
- out of descriptors (EMFILE), the listening socket rests (``ACCEPT_PAUSE_S``, doubling)
  instead of waking the loop at once, again and again; the backlog keeps the connections.

It is on every rank's path, so a call costs as few system calls and as little Python as it
can (#40; benchmarks/store_server.py): the poller is epoll (poll where there is none) by
descriptor; a socket's interest changes only when its backlog of answers does; a read's bytes
are parsed where they landed, and a command's answers to it go out in one send.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..plumbing import log as _logging
from ..plumbing.store_client import (
    ADD,
    CHECK,
    COMPARE_SET,
    GET,
    NOT_READY,
    READY,
    SET,
    STOP_WAITING,
    VALIDATE,
    VALIDATION_MAGIC,
    WAIT,
)
from .keys import _HANDLERS, Client, Keys
from .keys import IN as _IN
from .keys import OUT as _OUT
from .wire import (
    _I64,
    _OUT_OF_DESCRIPTORS,
    _U32,
    _U64,
    ACCEPT_PAUSE_MAX_S,
    ACCEPT_PAUSE_S,
    MAX_STRING_LEN,
    OUTBOX_HIGH,
    Scan,
    _Incomplete,
    _Refused,
    fixed_at,
)

_log = _logging.get("store.server")

#: A send takes at most this many pieces of answers (the system's bound on one gather is 1024).
_GATHER = 512
#: What one read takes from a socket.
_READ = 1 << 16
#: An answer shorter than this is joined to its length and written at once (``_quick``); a
#: longer one goes out as the stored value itself, without a copy.
_SMALL = 4096
#: The poller's events other than "writable": readable, hung up, in error.
_NOT_OUT = ~_OUT
_write = os.write  # a socket's own send costs 0.4 us more a call
_ONE_KEY = struct.Struct("<QQ")  # a count of 1, then the key's length


class _Poller:
    """epoll where there is one, else poll: descriptors and event masks, the same bits in both.
    ``poll(timeout_s)`` is epoll's own method where there is epoll (no Python frame a turn)."""

    def __init__(self) -> None:
        self._epoll = hasattr(select, "epoll")  # epoll's timeout is in seconds, poll's in ms
        self._p: Any = select.epoll() if self._epoll else select.poll()
        self.register, self.modify, self.unregister = self._p.register, self._p.modify, self._p.unregister
        self.poll: Callable[[float | None], list[tuple[int, int]]] = self._p.poll if self._epoll else self._poll_ms

    def _poll_ms(self, timeout_s: float | None) -> list[tuple[int, int]]:
        events: list[tuple[int, int]] = self._p.poll(None if timeout_s is None else 1000 * timeout_s)
        return events

    def close(self) -> None:
        if self._epoll:
            self._p.close()


class StoreServer:
    """Serves a bound, listening socket until ``stop()``; ``store_id``: what the store's
    ``STORE_ID_KEY`` holds, by which agents tell a replacement store from the one they lost."""

    def __init__(self, sock: socket.socket, store_id_key: str | None = None) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self.keys = Keys(self._answer_now)
        self.clients: dict[int, Client] = {}  # by descriptor
        self.store_id = uuid.uuid4().hex
        if store_id_key is not None:
            self.keys.data[b"/" + store_id_key.encode()] = self.store_id.encode()  # torch's key prefix
        self._poller = _Poller()
        self._poller.register(sock.fileno(), _IN)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._poller.register(self._wake_r.fileno(), _IN)
        self._stopping = False
        self._accept_pause = ACCEPT_PAUSE_S
        self._accept_resumes: float | None = None  # the listening socket rests until then

    # -- the loop --------------------------------------------------------------------------

    def serve_forever(self) -> None:
        listen_fd, wake_fd = self.sock.fileno(), self._wake_r.fileno()
        client_of, read, quick, take, flush = self.clients.get, os.read, self._quick, self._take, self._flush
        poll = self._poller.poll
        try:
            while not self._stopping:
                resumes = self._accept_resumes
                timeout = None if resumes is None else max(0.0, resumes - time.monotonic())
                for fd, events in poll(timeout):
                    client = client_of(fd)
                    if client is None:
                        if fd == listen_fd:
                            self._accept()
                        elif fd == wake_fd:
                            self._wake_r.recv(64)
                        continue
                    if events & _NOT_OUT:  # readable, or hung up / in error: a read says which
                        try:
                            chunk = read(fd, _READ)  # a socket's own recv costs 0.5 us more a call
                        except (BlockingIOError, InterruptedError):
                            chunk = None
                        except OSError:
                            chunk = b""
                        if chunk:
                            # The usual read: one whole command from a client with nothing pending.
                            if client.queued or client.inbox or not client.validated or not quick(client, chunk):
                                take(client, chunk)
                        elif chunk is not None:  # the end of its stream, or an error
                            self._close(client)
                            continue
                    if events & _OUT and client.fd >= 0:
                        flush(client)
                        if client.inbox and client.queued < OUTBOX_HIGH and client.fd >= 0:
                            self._process_inbox(client)  # commands held back while answers piled up
                if resumes is not None and time.monotonic() >= resumes:
                    self._accept_resumes = None
                    self._poller.register(listen_fd, _IN)
        finally:
            for client in list(self.clients.values()):
                self._close(client)
            self._poller.close()
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
                conn, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    # The backlog keeps the connection; the socket stays readable, so rest it
                    # instead of waking the loop at once, again and again (it spun a core).
                    self._poller.unregister(self.sock.fileno())
                    self._accept_resumes = time.monotonic() + self._accept_pause
                    self._accept_pause = min(2 * self._accept_pause, ACCEPT_PAUSE_MAX_S)
                return
            self._accept_pause = ACCEPT_PAUSE_S
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = Client(conn, addr)
            self.clients[client.fd] = client
            self._poller.register(client.fd, _IN)

    def _take(self, client: Client, chunk: bytes) -> None:
        """A read's bytes, the general way: each whole command answered where it landed, one
        still arriving kept (``inbox``), the answers sent in one go."""
        if client.inbox:
            client.inbox += chunk
            self._process_inbox(client)
            return
        # The usual case: whole commands, parsed where they landed, each handler called here
        # (a validated client's; the first command and unknown ones through ``_command``).
        at, size, handlers, keys = 0, len(chunk), _HANDLERS, self.keys
        try:
            while at < size and client.queued < OUTBOX_HIGH:
                start = at
                try:
                    handler = handlers[chunk[at]] if client.validated else None
                    if handler is None:
                        at = self._command(client, chunk, at)
                    else:
                        at = handler(keys, client, chunk, at + 1)
                except _Incomplete:
                    client.inbox += chunk[start:]  # the rest, walked from its start as it comes
                    client.scan = Scan()
                    self._process_inbox(client)
                    return
        except (_Refused, ValueError) as exc:
            self._refuse(client, exc)
            return
        if at < size:  # held back while its answers pile up unread
            client.inbox += chunk[at:]
        self._flush(client)

    def _quick(self, client: Client, chunk: bytes) -> bool:
        """The reads that make almost all of a rendezvous, answered here: one command alone in
        the read, from a client with nothing pending; torch's client sends one at a time and
        waits for its answer. A GET, a WAIT or CHECK of one key (torch's get is a WAIT, then a
        GET), a COMPARE_SET (set_state) or an ADD of small values, a SET: parsed where it
        landed, acted on through ``keys`` (the same code as the general path), the answer
        written at once, in one system call. False: anything else (more than one command, part
        of one, a field past a limit), for the general path, which says what is wrong."""
        command, size = chunk[0], len(chunk)
        keys = self.keys
        if command == GET:
            if size < 9 or _U64.unpack_from(chunk, 1)[0] != size - 9 or size - 9 > MAX_STRING_LEN:
                return False
            value = keys.data.get(chunk[9:], b"")
            if len(value) >= _SMALL:  # the length and the value itself, not a copy of it
                client.reply_value(value)
                self._flush(client)
                return True
            reply = _U64.pack(len(value)) + value
        elif command == WAIT or command == CHECK:
            if size < 17 or _ONE_KEY.unpack_from(chunk, 1) != (1, size - 17) or size - 17 > MAX_STRING_LEN:
                return False
            key = chunk[17:]
            there = key in keys.data or bool(keys.queues.get(key))
            if command == WAIT:
                if not there:
                    return False  # it waits: the general path registers it
                reply = STOP_WAITING
            else:
                reply = READY if there else NOT_READY
        elif command == COMPARE_SET:
            if size < 25:
                return False
            n = _U64.unpack_from(chunk, 1)[0]
            at = 9 + n
            if n > MAX_STRING_LEN or at + 8 > size:
                return False
            m = _U64.unpack_from(chunk, at)[0]
            if at + 16 + m > size:
                return False
            k = _U64.unpack_from(chunk, at + 8 + m)[0]
            if at + 16 + m + k != size:
                return False
            key, expected, desired = chunk[9:at], chunk[at + 8 : at + 8 + m], chunk[at + 16 + m :]
            current = keys.compare_set_value(key, expected, desired)
            if len(current) >= _SMALL:
                client.reply_value(current)
                self._flush(client)
                return True
            reply = _U64.pack(len(current)) + current
        elif command == ADD:
            n = size - 17
            if n < 0 or n > MAX_STRING_LEN or _U64.unpack_from(chunk, 1)[0] != n:
                return False
            try:
                total = keys.add_value(chunk[9 : 9 + n], _I64.unpack_from(chunk, 9 + n)[0])
            except ValueError:
                return False  # a value that is not a number: the general path closes the client
            reply = _I64.pack(total)
        elif command == SET:
            if size < 17:
                return False
            n = _U64.unpack_from(chunk, 1)[0]
            at = 9 + n
            if n > MAX_STRING_LEN or at + 8 > size or _U64.unpack_from(chunk, at)[0] != size - at - 8:
                return False
            keys.set_value(chunk[9:at], chunk[at + 8 :])
            return True  # SET has no answer
        else:
            return False
        try:
            sent = _write(client.fd, reply)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(client)
            return True
        if sent < len(reply):
            client.reply(reply[sent:])
            self._flush(client)
        return True

    def _process_inbox(self, client: Client) -> None:
        """Answer the whole commands at the head of the client's inbox, while its unread
        answers stay under ``OUTBOX_HIGH``; one still arriving is walked as far as its bytes go."""
        inbox = client.inbox
        done = 0
        try:
            with memoryview(inbox) as view:
                while done < len(inbox) and client.queued < OUTBOX_HIGH:
                    scan = client.scan or Scan()
                    try:
                        end = scan.walk(view[done:])
                    except _Incomplete:
                        client.scan = scan
                        break
                    client.scan = None
                    if self._command(client, view[done : done + end], 0) != end:
                        raise _Refused("a command whose fields do not match its length")
                    done += end
        except (_Refused, ValueError) as exc:
            self._refuse(client, exc)
            return
        if done:
            del inbox[:done]
        self._flush(client)

    def _flush(self, client: Client) -> None:
        out = client.out
        if out:
            try:
                if len(out) == 1:
                    sent = client.send(out[0])
                elif client.queued <= _READ:  # small answers: one piece
                    joined = b"".join(out)
                    out[:] = [joined]
                    sent = client.send(joined)
                else:
                    sent = client.sock.sendmsg(out[:_GATHER])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._close(client)
                return
            if sent == client.queued:
                out.clear()
                client.queued = 0
            elif sent:
                client.queued -= sent
                done = 0
                while sent >= len(out[done]):
                    sent -= len(out[done])
                    done += 1
                del out[:done]
                if sent:
                    out[0] = memoryview(out[0])[sent:]
        # Back-pressure: a client that leaves its answers unread is not read (nor answered
        # more) until it takes them; its socket's buffers hold the rest of what it sends.
        mask = (_IN if client.queued < OUTBOX_HIGH else 0) | (_OUT if client.queued else 0)
        if mask != client.mask:
            client.mask = mask
            self._poller.modify(client.fd, mask)

    def _refuse(self, client: Client, why: BaseException) -> None:
        _log.info("closed the client at %s: %s", client.peer, why)
        self._close(client)

    def _close(self, client: Client) -> None:
        if self.clients.pop(client.fd, None) is None:
            return
        self.keys.clear_wait(client)
        try:
            self._poller.unregister(client.fd)
        except (KeyError, ValueError, OSError):
            pass
        client.sock.close()
        client.out.clear()
        client.fd = -1  # closed: its number may be another client's by now

    # -- commands ----------------------------------------------------------------------------

    def _command(self, client: Client, data: bytes | memoryview, at: int) -> int:
        """Answer the command at ``at`` in ``data`` (``keys.py``); where it ends. ``_Incomplete``
        when its bytes are not all there (nothing is done then)."""
        command = data[at]
        if not client.validated:
            if command != VALIDATE:
                raise _Refused("the first command was not VALIDATE")
            end = fixed_at(data, at + 1, 4)
            if _U32.unpack_from(data, at + 1)[0] != VALIDATION_MAGIC:
                raise _Refused("VALIDATE without torch's magic number")
            client.validated = True
            return end
        handler = _HANDLERS[command]
        if handler is None:
            raise _Refused(f"an unknown command {command}")
        return handler(self.keys, client, data, at + 1)

    def _answer_now(self, client: Client, data: bytes) -> None:
        """Answer a client released by another's command (its WAIT's keys came)."""
        if client.fd >= 0:
            client.reply(data)
            self._flush(client)

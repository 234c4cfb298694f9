"""The wire of torch's TCPStore protocol, as ``store_server`` reads and writes it: the command
numbers, torch's limits and ours, the fields of one command, and a scanner that walks a command
still arriving, resuming where it stopped, and says how many bytes it still needs (the server
parses a command once, when its bytes are all in). The standard library alone, like the server:
the store pod runs both from the runtime zip."""

from __future__ import annotations

import errno
import struct

# The command numbers and answers, defined once beside the client every process of a job uses.
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
    PING,
    QUEUE_LEN,
    QUEUE_POP,
    QUEUE_PUSH,
    SET,
    VALIDATE,
    WAIT,
)

# torch's limits: a client past them is closed, as torch's server closes it.
MAX_KEY_COUNT = 128 * 1024
MAX_STRING_LEN = 8 * 1024
MAX_PAYLOAD_LEN = 8 * 1024 * 1024
# Ours: the most one command may take: a MULTI_SET of 8 values of torch's largest, with their
# keys and lengths (torch's client sends kilobytes; counting only the values closed that one, #37
# item 14). Over it, the client is closed: torch's client raises on that call.
MAX_REQUEST_LEN = 1 + 8 + 8 * (8 + MAX_STRING_LEN + 8 + MAX_PAYLOAD_LEN)
# The answers a client may leave unread before it is not read any more.
OUTBOX_HIGH = 1024 * 1024
# Out of descriptors: the listening socket rests this long, doubling up to the most.
ACCEPT_PAUSE_S, ACCEPT_PAUSE_MAX_S = 0.05, 1.0
_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")

# Each command's fields after its byte: "4" a uint32, "8" an int64, "k" a key, "v" a value;
# a leading "*" is a count, then the rest that many times.
LAYOUT: dict[int, str] = {
    VALIDATE: "4",
    SET: "kv",
    COMPARE_SET: "kvv",
    GET: "k",
    ADD: "k8",
    CHECK: "*k",
    WAIT: "*k",
    GETNUMKEYS: "",
    DELETE_KEY: "k",
    APPEND: "kv",
    MULTI_GET: "*k",
    MULTI_SET: "*kv",
    CANCEL_WAIT: "",
    PING: "4",
    QUEUE_PUSH: "kv",
    QUEUE_POP: "k",
    QUEUE_LEN: "k",
    LIST_KEYS: "",
    BARRIER: "k8",
}


class _Incomplete(Exception):
    """The command's bytes have not all arrived yet: ``end`` is where the data must reach
    before the command is worth looking at again."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class _Refused(Exception):
    """The client broke the protocol: it is closed."""


def key_at(data: bytes | memoryview, at: int) -> tuple[bytes, int]:
    """The key at ``at`` and where it ends."""
    head = at + 8
    if head > len(data):
        raise _Incomplete(head)
    n: int = _U64.unpack_from(data, at)[0]
    if n > MAX_STRING_LEN:
        raise _Refused(f"a key of {n} bytes (at most {MAX_STRING_LEN})")
    end = head + n
    if end > len(data):
        raise _Incomplete(end)
    return bytes(data[head:end]), end


def value_at(data: bytes | memoryview, at: int) -> tuple[bytes, int]:
    """The value (a byte vector) at ``at`` and where it ends."""
    head = at + 8
    if head > len(data):
        raise _Incomplete(head)
    n: int = _U64.unpack_from(data, at)[0]
    if n > MAX_PAYLOAD_LEN:
        raise _Refused(f"a value of {n} bytes (at most {MAX_PAYLOAD_LEN})")
    end = head + n
    if end > len(data):
        raise _Incomplete(end)
    return bytes(data[head:end]), end


def count_at(data: bytes | memoryview, at: int) -> tuple[int, int]:
    end = at + 8
    if end > len(data):
        raise _Incomplete(end)
    n: int = _U64.unpack_from(data, at)[0]
    if n > MAX_KEY_COUNT:
        raise _Refused(f"{n} keys in one command (at most {MAX_KEY_COUNT})")
    return n, end


def fixed_at(data: bytes | memoryview, at: int, size: int) -> int:
    """Where a fixed field of ``size`` bytes at ``at`` ends."""
    end = at + size
    if end > len(data):
        raise _Incomplete(end)
    return end


class Scan:
    """Walks the fields of the command at the head of a client's inbox without copying them,
    resuming where it stopped when more bytes come: a command arriving in pieces is walked once
    in all, however it arrives (it was parsed from its start at every read: quadratic). ``end``
    is set once the whole command is in. ``steps`` counts the fields walked (tests read it)."""

    __slots__ = ("pos", "layout", "field", "left", "end", "steps")

    def __init__(self) -> None:
        self.pos = 0  # where the next field starts (0: the command's byte)
        self.layout = ""  # the fields of one item ("*" stripped)
        self.field = -1  # the next field of the item (-1: the count, or the command's byte)
        self.left = 1  # items still to walk
        self.end = -1
        self.steps = 0

    def walk(self, data: bytes | memoryview) -> int:
        """Where the command ends; ``_Incomplete`` (with the end of the next field) until its
        bytes are in; ``_Refused`` for a field past torch's limits or a command past ours."""
        if self.end >= 0:
            return self.end
        if self.pos == 0:
            if not data:
                raise _Incomplete(1)
            layout = LAYOUT.get(data[0])
            if layout is None:
                raise _Refused(f"an unknown command {data[0]}")
            self.pos = 1
            if layout.startswith("*"):
                self.layout, self.field = layout[1:], -1
            else:
                self.layout, self.field = layout, 0
        while True:
            self.steps += 1
            if self.field == -1:  # the count
                self.left, self.pos = count_at(data, self.pos)
                self.field = 0
            if self.left == 0 or not self.layout:
                self.end = self.pos
                return self.pos
            kind = self.layout[self.field]
            if kind == "k":
                head = fixed_at(data, self.pos, 8)
                n = _U64.unpack_from(data, self.pos)[0]
                if n > MAX_STRING_LEN:
                    raise _Refused(f"a key of {n} bytes (at most {MAX_STRING_LEN})")
            elif kind == "v":
                head = fixed_at(data, self.pos, 8)
                n = _U64.unpack_from(data, self.pos)[0]
                if n > MAX_PAYLOAD_LEN:
                    raise _Refused(f"a value of {n} bytes (at most {MAX_PAYLOAD_LEN})")
            else:
                head, n = self.pos, int(kind)
            if head + n > MAX_REQUEST_LEN:
                raise _Refused(f"a command of over {MAX_REQUEST_LEN} bytes")
            self.pos = fixed_at(data, head, n)
            self.field += 1
            if self.field == len(self.layout):
                self.field, self.left = 0, self.left - 1
                if self.left == 0:
                    self.end = self.pos
                    return self.pos


def _vector(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value

"""The wire of torch's TCPStore protocol, as ``store_server`` reads and writes it: the command
numbers, torch's limits and ours, and a reader of one command's fields that says how many bytes
it still needs (the server parses a command again only once they are in). The standard library
alone, like the server: the store pod runs both from the runtime zip."""

from __future__ import annotations

import errno
import struct

VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND = range(10)
MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS, BARRIER = range(10, 19)
VALIDATION_MAGIC = 0x3C85F7CE
READY, NOT_READY = b"\x00", b"\x01"
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"
# torch's limits: a client past them is closed, as torch's server closes it.
MAX_KEY_COUNT = 128 * 1024
MAX_STRING_LEN = 8 * 1024
MAX_PAYLOAD_LEN = 8 * 1024 * 1024
# Ours: the most one command may take (torch's client sends kilobytes; a MULTI_SET of 8 values
# of torch's largest fits), and the answers a client may leave unread before it is not read.
MAX_REQUEST_LEN = 64 * 1024 * 1024
OUTBOX_HIGH = 1024 * 1024
# Out of descriptors: the listening socket rests this long, doubling up to the most.
ACCEPT_PAUSE_S, ACCEPT_PAUSE_MAX_S = 0.05, 1.0
_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class _Incomplete(Exception):
    """The command's bytes have not all arrived yet: ``end`` is where the data must reach
    before the command is worth parsing again."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class _Refused(Exception):
    """The client broke the protocol: it is closed."""


class _Reader:
    def __init__(self, data: bytearray) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        end = self.at + n
        if end > len(self.data):
            raise _Incomplete(end)
        with memoryview(self.data) as view:
            out = bytes(view[self.at : end])
        self.at = end
        return out

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def u64(self) -> int:
        value: int = _U64.unpack(self.take(8))[0]
        return value

    def i64(self) -> int:
        value: int = _I64.unpack(self.take(8))[0]
        return value

    def key(self) -> bytes:
        n = self.u64()
        if n > MAX_STRING_LEN:
            raise _Refused(f"a key of {n} bytes (at most {MAX_STRING_LEN})")
        return self.take(n)

    def payload(self) -> bytes:
        n = self.u64()
        if n > MAX_PAYLOAD_LEN:
            raise _Refused(f"a value of {n} bytes (at most {MAX_PAYLOAD_LEN})")
        return self.take(n)

    def count(self) -> int:
        n = self.u64()
        if n > MAX_KEY_COUNT:
            raise _Refused(f"{n} keys in one command (at most {MAX_KEY_COUNT})")
        return n


def _vector(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value

"""Writing event lines: one prefixed JSON line per event, in one write, flushed."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from ..contract.protocol import EVENT_PREFIX
from ..plumbing import log as _logging

_log = _logging.get("runtime._emit")

_lock = threading.Lock()


def _default(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:
            _log.debug("a value whose item() failed: written as its repr", exc_info=True)
    return repr(value)


def encode(kind: str, fields: dict[str, Any]) -> str:
    record = {"kind": kind, "t": fields.pop("t", None) or time.time(), **fields}
    return EVENT_PREFIX + json.dumps(record, separators=(",", ":"), default=_default) + "\n"


def emit(kind: str, **fields: Any) -> None:
    """Write one event line to stdout.

    The whole line goes out in a single write (PYTHONUNBUFFERED or a flush right after), so
    lines from processes sharing a pipe do not tear as long as they stay under PIPE_BUF.
    """
    line = encode(kind, fields)
    with _lock:
        out = sys.stdout
        try:
            out.write(line)
            out.flush()
        except (ValueError, OSError):  # stdout closed while the process is exiting
            pass

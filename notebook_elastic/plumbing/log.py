"""Logging: one named logger per part (``notebook_elastic.<part>``), one set-up per process.

Each of a job's own processes (the supervisor, an agent and its keeper, a worker, the store)
calls ``for_process(role)`` once: its lines go to its standard error, which is the job folder's
``supervisor.log`` or ``logs/node-N.log`` (a pod's log on a cluster), as
``notebook-elastic ROLE: message`` (what these lines always looked like), a failure's traceback
below it. ``NOTEBOOK_ELASTIC_LOG=debug`` shows everything, each debug line with its logger's
name (the errors that are dealt with and go on, too); the default is ``info``.

In the kernel (a library there) nothing is set up: the ``notebook_elastic`` logger has a null
handler, and the notebook shows only what the magics say, unless ``NOTEBOOK_ELASTIC_LOG`` is set.
The standard library only: the worker side imports it.
"""

from __future__ import annotations

import logging
import os
import sys

from ..contract.protocol import ENV_LOG

ROOT = "notebook_elastic"

logging.getLogger(ROOT).addHandler(logging.NullHandler())


def get(part: str) -> logging.Logger:
    """The logger of one part: ``get("supervisor.nodes")`` -> ``notebook_elastic.supervisor.nodes``."""
    return logging.getLogger(f"{ROOT}.{part}")


def level(default: str = "INFO") -> int:
    """The level ``NOTEBOOK_ELASTIC_LOG`` names (debug, info, warning, error), else ``default``."""
    named = getattr(logging, (os.environ.get(ENV_LOG) or default).strip().upper(), None)
    return named if isinstance(named, int) else logging.INFO


class _Lines(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        where = f" [{record.levelname.lower()} {record.name}]" if record.levelno < logging.INFO else ""
        text = f"notebook-elastic {self.role}{where}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def for_process(role: str) -> logging.Logger:
    """Set this process's lines up (once; the first role given names them) and return the
    role's logger. Our lines stay ours: the ``notebook_elastic`` logger does not propagate to
    a root logger the user's code may configure in a worker."""
    root = logging.getLogger(ROOT)
    if not any(isinstance(h.formatter, _Lines) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Lines(role))
        root.addHandler(handler)
        root.propagate = False
        root.setLevel(level())
    return get(role)


def in_kernel() -> None:
    """In the kernel: lines on its standard error only where ``NOTEBOOK_ELASTIC_LOG`` asks."""
    if os.environ.get(ENV_LOG):
        for_process("kernel")

"""Every name of torch's we read or write that torch does not document, and the versions we
run on: the one place a torch upgrade is checked (#38 item 3).

The versions differ too: a store served on a socket bound before torch is imported needs the
legacy server before torch 2.7 (``tcp_store_server``); the range CI proves is ``TESTED_TORCH``.
"""

from __future__ import annotations

import os
import re
import socket
from datetime import timedelta
from typing import Any

#: The torch versions CI proves, as pyproject declares them (``torch>=2.4,<2.16``: the whole
#: suite on 2.13, the contract subset on 2.4.1 and 2.15.0; tests/test_torch_range.py keeps them
#: in step).
TESTED_TORCH = ((2, 4), (2, 16))


def tested_torch_text() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED_TORCH
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"


def torch_is_tested(version: tuple[int, int]) -> bool:
    return TESTED_TORCH[0] <= version < TESTED_TORCH[1]


def torch_version(text: str | None = None) -> tuple[int, int]:
    """(major, minor) of the installed torch (or of `text`), e.g. (2, 5) for "2.5.1+cu124"."""
    if text is None:
        import torch

        text = torch.__version__
    m = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def libuv_store_takes_listen_fd(version: tuple[int, int] | None = None) -> bool:
    """torch's libuv TCPStore (the default server since 2.4) refuses ``master_listen_fd``
    before 2.7 ("NotImplementedError: The libuv TCPStore backend does not support
    initialization with an listen fd")."""
    return (version or torch_version()) >= (2, 7)


def tcp_store_server(sock: socket.socket, timeout_s: float) -> Any:
    """A multi-tenant c10d TCPStore server on `sock` (bound and listening already, so
    clients may connect while torch imports). Where the libuv server cannot take the socket,
    the legacy server does (``use_libuv=False``): same protocol, every client works.

    The store closes the descriptor it is given when it goes, so it gets a duplicate of its
    own: handing it ``sock.fileno()`` made the socket's own close a second close of that
    number, by then perhaps another socket's (a test's API server lost its listener so)."""
    import torch.distributed as dist

    host, port = sock.getsockname()[:2]
    kwargs: dict[str, Any] = dict(
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        timeout=timedelta(seconds=timeout_s),
    )
    if not libuv_store_takes_listen_fd():
        kwargs["use_libuv"] = False
    try:
        return dist.TCPStore(host, port, **kwargs, master_listen_fd=os.dup(sock.fileno()))
    except NotImplementedError:
        if kwargs.get("use_libuv") is False:
            raise
        # A build whose libuv server still refuses the fd (a backport without the support).
        # (The refused duplicate is left open: closing a number the store may have closed is
        # the very double close avoided above.)
        return dist.TCPStore(host, port, **kwargs, use_libuv=False, master_listen_fd=os.dup(sock.fileno()))

"""The torch versions we run on differ in a few places; one guarded function for each.

Worker-side (imported inside training processes and images): no IPython, no kubernetes.
"""

from __future__ import annotations

import re
import socket
from datetime import timedelta
from typing import Any


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
    the legacy server does (``use_libuv=False``): same protocol, every client works."""
    import torch.distributed as dist

    host, port = sock.getsockname()[:2]
    kwargs: dict[str, Any] = dict(
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=sock.fileno(),
        timeout=timedelta(seconds=timeout_s),
    )
    if not libuv_store_takes_listen_fd():
        kwargs["use_libuv"] = False
    try:
        return dist.TCPStore(host, port, **kwargs)
    except NotImplementedError:
        if kwargs.get("use_libuv") is False:
            raise
        # A build whose libuv server still refuses the fd (a backport without the support).
        return dist.TCPStore(host, port, **kwargs, use_libuv=False)

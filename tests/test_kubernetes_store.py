"""The rendezvous store on the torch versions images carry (#17 defect 0): torch's libuv
TCPStore refuses a listen fd before 2.7, so there the store uses the legacy server.

Only torch 2.13 can be installed on this machine (the package index holds 2.13.0 and
2.14.1), so the torch-2.5 path is exercised by pinning the version the adapter sees: the
legacy server it then picks is real and serves real clients."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from notebook_elastic.runtime import torch_compat


@pytest.mark.parametrize(
    ("version", "takes_fd"),
    [("2.4.1", False), ("2.5.1+cu124", False), ("2.6.0", False), ("2.7.0", True), ("2.13.0+cpu", True)],
)
def test_which_torch_versions_need_the_legacy_store(version, takes_fd):
    assert torch_compat.libuv_store_takes_listen_fd(torch_compat.torch_version(version)) is takes_fd


@pytest.mark.parametrize("seen", [(2, 5), None])
def test_the_store_serves_clients_on_a_listen_fd(monkeypatch, seen):
    if seen is not None:
        monkeypatch.setattr(torch_compat, "torch_version", lambda text=None: seen)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    host, port = sock.getsockname()
    server = torch_compat.tcp_store_server(sock, timeout_s=10)
    if seen == (2, 5):
        assert server.libuvBackend is False  # what torch 2.5 needs for a listen fd
    client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert server.get("k") == b"v"
    del client, server
    sock.detach()  # the store owned the descriptor and closed it

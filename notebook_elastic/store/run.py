"""``python -m notebook_elastic.store.run --host H --port P``: a job's rendezvous store.

A c10d TCPStore server and nothing else: not a trainer, so losing any worker never takes
the rendezvous down (the anchors keep the store inside worker 0). Runs in the Kubernetes
rendezvous pod (the local supervisor hosts its own, torch's): binds exactly H:P and serves
until SIGTERM, with the standard library alone (``store_server``), so the pod needs a Python
image, not torch's.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import uuid
from typing import TYPE_CHECKING

from ..agent.torch_adapter import tcp_store_server
from ..contract.event_types import Kind, StoreReady
from ..contract.protocol import STORE_ID_KEY
from ..plumbing import log
from ..runtime._emit import emit
from .server import StoreServer

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore


def host_store(sock: socket.socket) -> KeyStore:
    """torch's c10d TCPStore, served on `sock` (bound and listening already, so agents may
    connect while torch imports): the local supervisor's store (the Kubernetes rendezvous
    pod serves the same protocol without torch, ``store_server``). torch < 2.7 needs the
    legacy server for a listen fd (torch_adapter). It holds a random id, by which agents
    that reconnect tell a replacement store from the one they lost."""
    store = tcp_store_server(sock, timeout_s=60)
    store.set(STORE_ID_KEY, uuid.uuid4().hex)
    return store


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default=os.environ.get("POD_IP", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=29400)
    args = parser.parse_args(argv)
    log.for_process("store")  # its lines in the store pod's log: "notebook-elastic store: ..."
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    server = StoreServer(sock, STORE_ID_KEY)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    emit(Kind.STORE_READY, **StoreReady(host=args.host, port=sock.getsockname()[1], pid=os.getpid()))
    server.serve_forever()


if __name__ == "__main__":
    main()

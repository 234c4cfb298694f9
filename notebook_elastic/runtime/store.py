"""``python -m notebook_elastic.runtime.store --host H --port P``: a job's rendezvous store.

A c10d TCPStore server and nothing else: not a trainer, so losing any worker never takes
the rendezvous down (the anchors keep the store inside worker 0). Runs in the Kubernetes
rendezvous pod (the local supervisor hosts its own). Binds exactly H:P, serves until
SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
import uuid

from ._emit import emit
from .torch_compat import STORE_ID_KEY, tcp_store_server


def host_store(sock: socket.socket) -> object:
    """The job's c10d TCPStore, served on `sock` (bound and listening already, so agents
    may connect while torch imports): the one configuration both backends' rendezvous
    stores use (the local supervisor's and the Kubernetes rendezvous pod's). torch < 2.7
    needs the legacy server for a listen fd (torch_compat). It holds a random id, by which
    agents that reconnect tell a replacement store from the one they lost."""
    store = tcp_store_server(sock, timeout_s=60)
    store.set(STORE_ID_KEY, uuid.uuid4().hex)
    return store


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default=os.environ.get("POD_IP", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=29400)
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    store = host_store(sock)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    emit("store_ready", host=args.host, port=args.port, pid=os.getpid())
    done.wait()
    del store


if __name__ == "__main__":
    main()

"""The control channel's round trip: what a kernel's request to its job's supervisor costs before
the supervisor does anything (job.scale(), stop, preempt_node, inject each make one).

Ours (jobfolder/control.py: a TCP connection per request, the HMAC handshake both ways, one JSON
request, one reply) against the standard library's own authenticated connection made the same
way (multiprocessing.connection's Listener and Client, the handshake inside), in the same run,
turn by turn. Both answer in a thread of the serving process, as the supervisor does. The
figure to read is the median and the ratio; the baseline pays Nagle's algorithm against the
peer's delayed ACK (the handshake's last write and the request go out back to back), which ours
paid too before it set TCP_NODELAY.
usage: python benchmarks/control.py [--requests N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from multiprocessing.connection import Client, Listener

sys.path.insert(0, os.path.dirname(__file__))
from _common import median, p95, report, row  # noqa: E402

from notebook_elastic.jobfolder import control  # noqa: E402

KEY = os.urandom(32)


REPLY = json.dumps({"ok": True, "result": {"target": 2}}).encode()


def _reply(conn: object) -> None:
    json.loads(conn.recv_bytes())
    conn.send_bytes(REPLY)
    conn.close()


def _serve(accept: object, answer: object) -> None:
    """Each connection answered in a thread of its own, as the supervisor does."""

    def loop() -> None:
        while True:
            threading.Thread(target=answer, args=(accept(),), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def serve_ours() -> tuple[str, int]:
    listener = control.listen(KEY)
    _serve(listener.accept, lambda sock: _reply(listener.authenticate(sock)))
    return listener.address


def serve_stdlib() -> tuple[str, int]:
    listener = Listener(("127.0.0.1", 0), authkey=KEY)
    _serve(listener.accept, _reply)
    return listener.address


def ours(address: tuple[str, int]) -> float:
    t0 = time.perf_counter()
    result = control.request(address, KEY, "scale", nodes=2)
    assert result == {"target": 2}, result
    return time.perf_counter() - t0


def stdlib(address: tuple[str, int]) -> float:
    t0 = time.perf_counter()
    conn = Client(address, authkey=KEY)
    conn.send_bytes(json.dumps({"command": "scale", "args": {"nodes": 2}}).encode())
    reply = json.loads(conn.recv_bytes())
    conn.close()
    assert reply["ok"], reply
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    a, b = serve_ours(), serve_stdlib()
    ours(a), stdlib(b)  # warm-up
    ours_s, stdlib_s = [], []
    for _ in range(args.requests):
        ours_s.append(ours(a))
        stdlib_s.append(stdlib(b))
    rows = [
        row("round trip, ours: median", median(ours_s) * 1000, "ms"),
        row("round trip, ours: p95", p95(ours_s) * 1000, "ms"),
        row("round trip, stdlib's Listener/Client: median", median(stdlib_s) * 1000, "ms"),
        row("round trip, stdlib's Listener/Client: p95", p95(stdlib_s) * 1000, "ms"),
        row("ours / stdlib's, medians", median(ours_s) / median(stdlib_s), "x", "< 1"),
    ]
    report(
        "control",
        rows,
        f"{args.requests} requests each, turn by turn, on this machine's loopback; one connection per request, "
        "the HMAC handshake both ways, as the kernel asks its supervisor.",
    )


if __name__ == "__main__":
    main()

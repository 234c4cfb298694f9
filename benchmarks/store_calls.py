"""What the deadline on the agents' rendezvous store calls costs (#17): one ``get_state`` of
torch's C10dRendezvousBackend against a real store, made directly (the baseline) and then
through our hook (each call on a helper thread with a deadline), in the same run.

An agent makes about 11 such calls a second (``num_nodes_waiting`` every 0.1 s monitor
interval, one keep-alive a second), so the added time per call times 11 is its CPU cost.

    python benchmarks/store_calls.py
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta

from _common import median, report, row

CALLS = 2000
AGENT_CALLS_PER_S = 11


def _timed(backend, calls: int) -> tuple[list[float], float]:
    """Each call's wall time, and the process's CPU time per call (all threads)."""
    out = []
    cpu0 = time.process_time()
    for _ in range(calls):
        t0 = time.perf_counter()
        backend.get_state()
        out.append(time.perf_counter() - t0)
    return out, (time.process_time() - cpu0) / calls


def main() -> None:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from notebook_elastic.agent import notebook_agent, rounds, store_link
    from notebook_elastic.store.run import host_store

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    host, port = sock.getsockname()
    server = host_store(sock)
    client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    backend = C10dRendezvousBackend(client, "bench")
    backend.set_state(b"x" * 300)  # about a two-node round's pickled state
    _timed(backend, 200)  # warm up
    walls, raw_cpu = _timed(backend, CALLS)
    raw = median(walls)
    link = store_link.StoreLink()
    assert notebook_agent.hook_store_reconnect(
        link, rounds.RendezvousHooks(), notebook_agent.AgentHooks(), lambda: 0, lambda _round: None, replaceable=True
    )
    backend = store_link.rendezvous_backend(client, "bench", link)  # what our handler calls
    _timed(backend, 200)
    walls, bounded_cpu = _timed(backend, CALLS)
    bounded = median(walls)
    added_cpu = max(0.0, bounded_cpu - raw_cpu)
    rows = [
        row("get_state wall, direct (baseline)", raw * 1e6, "us", digits=1),
        row("get_state wall, under the deadline", bounded * 1e6, "us", digits=1),
        row("wall ratio deadline / direct", bounded / raw, "x", digits=2),
        row("CPU per call, direct (baseline)", raw_cpu * 1e6, "us", digits=1),
        row("CPU per call, under the deadline", bounded_cpu * 1e6, "us", digits=1),
        row("CPU ratio deadline / direct", bounded_cpu / raw_cpu, "x", digits=2),
        row(
            f"agent CPU added ({AGENT_CALLS_PER_S} calls/s)",
            added_cpu * AGENT_CALLS_PER_S * 100,
            "% of a core",
            "< 0.5",
            added_cpu * AGENT_CALLS_PER_S < 0.005,
        ),
    ]
    report("store_calls", rows, notes=f"median of {CALLS} calls each, same store, same process")
    del backend, client, server


if __name__ == "__main__":
    main()

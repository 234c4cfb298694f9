"""The Kubernetes rendezvous store's server (#17): ours (the standard library, runtime/store_server.py)
against torch's own (what the store pod ran before, and the local supervisor runs), in the same
run, each in a process of its own, as the pod runs it.

- start: from the process's start to serving (ours needs no ``import torch``);
- memory: the server process's resident set once serving;
- latency: one rendezvous ``get_state`` call of torch's C10dRendezvousBackend (what an agent
  makes about 11 times a second), median and p95, one client;
- throughput: CLIENTS client processes making such calls as fast as they can, all at once; set
  against what a 256-node job's agents ask in steady state (256 x 11 calls a second).

    python benchmarks/store_server.py [--clients 8] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import median, p95, report, row

AGENT_CALLS_PER_S = 11
NODES = 256

TORCH_SERVER = """
import socket, sys, time
t0 = time.monotonic()
from notebook_elastic.runtime.store import host_store
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(1024)
store = host_store(sock)
print(sock.getsockname()[1], flush=True)
sys.stdin.read()
"""

CLIENT = """
import sys, time, json
from datetime import timedelta
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
port, calls = int(sys.argv[1]), int(sys.argv[2])
backend = C10dRendezvousBackend(dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60)), "bench")
backend.set_state(b"x" * 300)
for _ in range(100):
    backend.get_state()
print("ready", flush=True)
sys.stdin.readline()  # all start together
walls = []
t0 = time.perf_counter()
for _ in range(calls):
    t = time.perf_counter(); backend.get_state(); walls.append(time.perf_counter() - t)
print(json.dumps({"elapsed": time.perf_counter() - t0, "walls": walls}), flush=True)
"""


def _rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def start_ours(tmp: Path) -> tuple[subprocess.Popen, int, float]:
    from notebook_elastic.backends.kubernetes.code import runtime_zip
    from notebook_elastic.runtime.protocol import EVENT_PREFIX

    archive = tmp / "runtime.zip"
    archive.write_bytes(runtime_zip())
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "notebook_elastic.runtime.store", "--host", "127.0.0.1", "--port", "0"],
        env={"PYTHONPATH": str(archive), "PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    started = time.monotonic() - t0
    return proc, json.loads(line[len(EVENT_PREFIX) :])["port"], started


def start_torchs() -> tuple[subprocess.Popen, int, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", TORCH_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    port = int(proc.stdout.readline())  # type: ignore[union-attr]
    return proc, port, time.monotonic() - t0


def load(port: int, clients: int, calls: int) -> tuple[float, list[float]]:
    """Calls a second over all clients, and every call's wall time."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(port), str(calls)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(clients)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        t0 = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        results = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
        wall = time.perf_counter() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    walls = [w for r in results for w in r["walls"]]
    return clients * calls / wall, walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    need = NODES * AGENT_CALLS_PER_S
    rows, figures = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, start in (("torch's", start_torchs), ("ours", lambda: start_ours(Path(tmp)))):
            proc, port, started = start()
            try:
                rss = _rss_mb(proc.pid)
                _rate, one = load(port, 1, args.calls)
                rate, _walls = load(port, args.clients, args.calls)
                rss_loaded = _rss_mb(proc.pid)
            finally:
                proc.kill()
                proc.wait()
            figures[name] = (started, rss, rss_loaded, one, rate)
    t_start, t_rss, t_rss2, t_one, t_rate = figures["torch's"]
    o_start, o_rss, o_rss2, o_one, o_rate = figures["ours"]
    rows += [
        row("start to serving, torch's server (import torch)", t_start, "s"),
        row("start to serving, ours (standard library)", o_start, "s"),
        row("start: ours / torch's", o_start / t_start, "x", "<= 1", o_start <= t_start),
        row("resident memory serving, torch's", t_rss, "MB"),
        row("resident memory serving, ours", o_rss, "MB"),
        row(f"resident memory after {args.clients} clients, ours", o_rss2, "MB"),
        row("get_state latency median, torch's", median(t_one) * 1e6, "us", digits=0),
        row("get_state latency median, ours", median(o_one) * 1e6, "us", digits=0),
        row("get_state latency p95, ours", p95(o_one) * 1e6, "us", digits=0),
        row("latency: ours / torch's (median)", median(o_one) / median(t_one), "x"),
        row(f"calls a second, {args.clients} clients, torch's", t_rate, "1/s", digits=0),
        row(f"calls a second, {args.clients} clients, ours", o_rate, "1/s", digits=0),
        row("throughput: ours / torch's", o_rate / t_rate, "x"),
        row(
            f"ours / what {NODES} agents ask ({need} calls a second)",
            o_rate / need,
            "x",
            ">= 1",
            o_rate >= need,
        ),
    ]
    report(
        "store_server",
        rows,
        notes=(
            f"{os.cpu_count()} cores; each server in its own process, clients in {args.clients} processes "
            "on the same machine (they share its cores with the server)."
        ),
    )


if __name__ == "__main__":
    main()

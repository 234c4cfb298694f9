"""The Kubernetes rendezvous store's server (#17): ours (the standard library, store/server.py)
against torch's own (what the store pod ran before, and the local supervisor runs), in the same
run, each in a process of its own, as the pod runs it.

- start: from the process's start to serving (ours needs no ``import torch``);
- memory: the server process's resident set once serving;
- latency: one rendezvous ``get_state`` call of torch's C10dRendezvousBackend (what an agent
  makes about 11 times a second), median and p95, one client;
- throughput: CLIENTS client processes making such calls as fast as they can, all at once; set
  against what a 256-node job's agents ask in steady state (256 x 11 calls a second);
- hostile clients (#26), each against a fresh server: a client that sends 150 GETs of an 8 MiB
  value and never reads (the server's memory growth, and after that client closed); a MULTI_SET
  of n 8 MiB values, n = 1, 2, 4, 7, 8 (its time, and another client's worst call meanwhile; 8 is
  over our 64 MiB bound on one request: ours closes that client);
  out of descriptors (RLIMIT_NOFILE 32, 40 connections), the idle server's CPU in 3 s.

    python benchmarks/store_server.py [--clients 8] [--calls 2000] [--no-hostile]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import median, p95, report, row

_U64 = struct.Struct("<Q")
VALIDATED = bytes([0]) + struct.pack("<I", 0x3C85F7CE)  # VALIDATE with torch's magic number
GET, MULTI_SET = 3, 11
BIG = 8 * 1024 * 1024  # torch's largest value

AGENT_CALLS_PER_S = 11
NODES = 256

TORCH_SERVER = """
import socket, sys, time
t0 = time.monotonic()
from notebook_elastic.store.run import host_store
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


def _limit_descriptors(n: int | None):  # noqa: ANN202
    if n is None:
        return None

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return limit


def start_ours(tmp: Path, descriptors: int | None = None) -> tuple[subprocess.Popen, int, float]:
    from notebook_elastic.backends.kubernetes.code import runtime_zip
    from notebook_elastic.runtime.protocol import EVENT_PREFIX

    archive = tmp / "runtime.zip"
    archive.write_bytes(runtime_zip())
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "notebook_elastic.store.run", "--host", "127.0.0.1", "--port", "0"],
        env={"PYTHONPATH": str(archive), "PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_limit_descriptors(descriptors),
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    started = time.monotonic() - t0
    return proc, json.loads(line[len(EVENT_PREFIX) :])["port"], started


def start_torchs(descriptors: int | None = None) -> tuple[subprocess.Popen, int, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", TORCH_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_limit_descriptors(descriptors),
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


def _key(key: bytes) -> bytes:
    return _U64.pack(len(key)) + key


def _client(port: int):  # noqa: ANN202
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120), wait_for_workers=False)


def hoarder(port: int, pid: int) -> tuple[float, float]:
    """A client that sends 150 GETs of an 8 MiB value and never reads: the server's growth in
    MB, then once that client has closed."""
    good = _client(port)
    good.set("big", b"x" * BIG)
    good.get("big")  # SET has no answer: stored before the GETs come
    before = _rss_mb(pid)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(VALIDATED + (bytes([GET]) + _key(b"/big")) * 150)
    deadline, samples = time.monotonic() + 30, [0.0]
    while time.monotonic() < deadline:  # until the server's memory stops growing
        good.add("/tick", 1)
        time.sleep(0.5)
        samples.append(_rss_mb(pid) - before)
        if len(samples) >= 3 and abs(samples[-1] - samples[-2]) < 1 and abs(samples[-2] - samples[-3]) < 1:
            break
    grown = max(samples)
    s.close()
    good.add("/tick", 1)
    time.sleep(1)
    return grown, _rss_mb(pid) - before


def multi_set(port: int, n: int) -> tuple[float | None, float]:
    """A MULTI_SET of n 8 MiB values sent in one go: seconds until it is served (None: the
    server closed that client, the request being over its bound), and another client's
    slowest call meanwhile (ms)."""
    other, done, worst = _client(port), threading.Event(), [0.0]

    def probe() -> None:
        while not done.is_set():
            t = time.perf_counter()
            other.add("/probe", 1)
            worst[0] = max(worst[0], time.perf_counter() - t)
            time.sleep(0.01)

    body = bytes([MULTI_SET]) + _U64.pack(n) + b"".join(_key(f"/m{i}".encode()) + _key(b"v" * BIG) for i in range(n))
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(VALIDATED)
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    elapsed: float | None = None
    try:
        s.sendall(body + bytes([GET]) + _key(b"/m0"))  # the GET's answer says the MULTI_SET is done
        got = b""
        while len(got) < 8:
            chunk = s.recv(1 << 20)
            if not chunk:
                raise ConnectionResetError
            got += chunk
        elapsed = time.perf_counter() - t0
    except (ConnectionResetError, BrokenPipeError):
        pass  # over the server's bound on one request: that client is closed (None)
    done.set()
    thread.join()
    s.close()
    return elapsed, worst[0] * 1000


def idle_cpu_out_of_descriptors(proc: subprocess.Popen, port: int) -> float:
    """CPU seconds the idle server spends in 3 s with its descriptors spent (40 connections,
    RLIMIT_NOFILE 32)."""
    import psutil

    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    time.sleep(1)
    server = psutil.Process(proc.pid)
    cpu = sum(server.cpu_times()[:2])
    time.sleep(3)
    spent = sum(server.cpu_times()[:2]) - cpu
    for c in conns:
        c.close()
    return spent


def hostile(tmp: Path) -> dict[str, dict]:
    figures: dict[str, dict] = {}
    for name, start in (("torch's", start_torchs), ("ours", lambda d=None: start_ours(tmp, d))):
        out: dict = {}
        for case in ("hoarder", 1, 2, 4, 7, 8, "descriptors"):
            proc, port, _ = start(32) if case == "descriptors" else start()
            try:
                if case == "hoarder":
                    out["hoarder"] = hoarder(port, proc.pid)
                elif case == "descriptors":
                    out["descriptors"] = idle_cpu_out_of_descriptors(proc, port)
                else:
                    out[f"multi_set_{case}"] = multi_set(port, case)
            finally:
                proc.kill()
                proc.wait()
        figures[name] = out
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--no-hostile", dest="hostile", action="store_false", help="skip the hostile-client cases")
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
        bad = hostile(Path(tmp)) if args.hostile else None
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
    if bad is not None:
        theirs, ours = bad["torch's"], bad["ours"]
        for who, f in (("torch's", theirs), ("ours", ours)):
            rows.append(row(f"150 unread GETs of 8 MiB: server growth, {who}", f["hoarder"][0], "MB"))
            rows.append(row(f"  after that client closed, {who}", f["hoarder"][1], "MB"))
        rows.append(row("unread GETs: ours bounded", ours["hoarder"][0], "MB", "< 64", ours["hoarder"][0] < 64))
        for n in (1, 2, 4, 7, 8):
            for who, f in (("torch's", theirs), ("ours", ours)):
                took, worst = f[f"multi_set_{n}"]
                served = took if took is not None else "refused: over the 64 MiB bound on one request"
                rows.append(row(f"MULTI_SET of {n} x 8 MiB, {who}", served, "s" if took is not None else ""))
                rows.append(row(f"  another client's slowest call meanwhile, {who}", worst, "ms", digits=1))
        took1, took7 = ours["multi_set_1"][0], ours["multi_set_7"][0]
        rows.append(row("MULTI_SET 7 / 1, ours (linear: about 7)", took7 / took1, "x", "<= 14", took7 / took1 <= 14))
        for who, f in (("torch's", theirs), ("ours", ours)):
            rows.append(row(f"idle CPU in 3 s out of descriptors, {who}", f["descriptors"], "s", digits=2))
        rows.append(row("out of descriptors: ours rests", ours["descriptors"], "s", "< 0.1", ours["descriptors"] < 0.1))
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

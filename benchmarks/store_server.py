"""The Kubernetes rendezvous store's server (#17): ours (the standard library, store/server.py)
against torch's own (what the store pod ran before, and the local supervisor runs), in the same
run, each in a process of its own, as the pod runs it.

- start: from the process's start to serving (ours needs no ``import torch``);
- memory: the server process's resident set once serving;
- latency: one rendezvous ``get_state`` call of torch's C10dRendezvousBackend, median, one
  client;
- throughput (#40 item 2): N client processes (8 and 64) of torch's own TCPStore client making
  the calls of a mix as fast as they can, all at once: ``get_state`` alone, and ``agent`` (four
  get_state, one set_state, one add: what a rendezvous agent makes); calls a second, p99 latency
  and the server's CPU per call; set against what a 256-node job's agents ask in steady state
  (256 x 11 calls a second). Both servers are up at once and one fleet of clients, connected
  to both, serves them in turns, REPS rounds each (A B, B A, A B...): the machine is shared and
  the others' load drifts, so each pair of rounds' ratio (taken seconds apart, by the same
  client processes) is kept and their median reported, with each pair's;
- hostile clients (#26, #37), each against a fresh server: a client that sends 150 GETs of an
  8 MiB value and never reads, and one that sends one MULTI_GET naming it 128 times (the
  server's memory growth, and after that client closed); a MULTI_SET of n 8 MiB values,
  n = 1, 2, 4, 7, 8, 9 (its time, and another client's worst call meanwhile; 9 is over our
  bound on one command: ours closes that client, and torch's client raises);
  out of descriptors (RLIMIT_NOFILE 32, 40 connections), the idle server's CPU in 3 s.

    python benchmarks/store_server.py [--clients 8,64] [--calls 2000] [--reps 5] [--no-hostile]
                                      [--layout apart|shared]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import RESULTS, median, report, row

_U64 = struct.Struct("<Q")
VALIDATED = bytes([0]) + struct.pack("<I", 0x3C85F7CE)  # VALIDATE with torch's magic number
GET, MULTI_GET, MULTI_SET = 3, 10, 11
MULTI_SETS = (1, 2, 4, 7, 8, 9)  # values of 8 MiB in one MULTI_SET
BIG = 8 * 1024 * 1024  # torch's largest value
MULTI_SET_DEADLINE_S = 60.0

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

#: The clients: one process imports torch, then forks CLIENTS processes (so 64 of them start in
#: a second and share torch's pages), each with torch's TCPStore client and the c10d rendezvous
#: backend over it, connected to both servers; then rounds: each round, told which server, all
#: make the calls of MIX against it as fast as they can, at once. ``get_state``: the rendezvous
#: state's get alone (a WAIT and a GET on the wire); ``agent``: what an agent makes, four
#: get_state for one set_state (a compare_set with the token it holds: a keep-alive) and one add
#: (the exit barrier's and the joiner's counters).
FLEET = r"""
import json, os, sys, time
from datetime import timedelta
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
ports, clients, calls, mix = [int(p) for p in sys.argv[1].split(",")], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
CYCLE = {"get_state": ["get"], "agent": ["get", "get", "get", "get", "set", "add"]}[mix]

def child(w):
    sides = []
    for port in ports:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120), wait_for_workers=False)
        sides.append((store, C10dRendezvousBackend(store, "bench")))
    token = None
    def one(side, kind):
        nonlocal token
        store, backend = sides[side]
        if kind == "get":
            got = backend.get_state()
            token = got[1] if got else None
        elif kind == "set":
            got = backend.set_state(b"x" * 300, token)
            token = got[1] if got else None
        else:
            store.add("bench/count", 1)
    for side in range(len(sides)):
        token = None
        sides[side][1].set_state(b"x" * 300)
        for i in range(100):
            one(side, CYCLE[i % len(CYCLE)])
    os.write(w, b"r")
    while True:
        side = os.read(gr, 1)
        if side == b"q":
            return
        side = int(side)
        token = sides[side][1].get_state()
        token = token[1] if token else None
        walls = []
        t0 = time.perf_counter()
        for i in range(calls):
            t = time.perf_counter(); one(side, CYCLE[i % len(CYCLE)]); walls.append(time.perf_counter() - t)
        os.write(w, (json.dumps({"elapsed": time.perf_counter() - t0, "walls": walls}) + "\n").encode())

gr, gw = os.pipe()
pipes, pids = [], []
for _ in range(clients):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            child(w)
        finally:
            os._exit(0)
    os.close(w)
    pipes.append(r); pids.append(pid)
for r in pipes:
    assert os.read(r, 1) == b"r"
print("ready", flush=True)
for line in sys.stdin:
    side = line.strip()
    if side == "q":
        break
    t0 = time.perf_counter()
    os.write(gw, side.encode() * clients)
    results = []
    for r in pipes:
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = os.read(r, 1 << 20)
            assert chunk
            buf += chunk
        results.append(json.loads(buf))
    wall = time.perf_counter() - t0
    print(json.dumps({"wall": wall, "walls": [w for r in results for w in r["walls"]]}), flush=True)
os.write(gw, b"q" * clients)
for pid in pids:
    os.waitpid(pid, 0)
"""


def _rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


#: Where the servers and the clients run (``--layout``): "apart", the servers on the machine's
#: last core and the clients on the others, as a cluster runs them (the store pod on a node's
#: core of its own, the agents on other machines); "shared", everything on every core.
LAYOUT = {"layout": "apart"}


def _cores(side: str) -> set[int] | None:
    """The cores a server ("server") or the clients ("clients") run on in this layout."""
    cores = sorted(os.sched_getaffinity(0))
    if LAYOUT["layout"] != "apart" or len(cores) < 2:
        return None
    return {cores[-1]} if side == "server" else set(cores[:-1])


def _preexec(descriptors: int | None = None, side: str = "server"):  # noqa: ANN202
    cores = _cores(side)
    if descriptors is None and cores is None:
        return None

    def prepare() -> None:
        import resource

        if descriptors is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))
        if cores is not None:
            os.sched_setaffinity(0, cores)

    return prepare


def start_ours(tmp: Path, descriptors: int | None = None) -> tuple[subprocess.Popen, int, float]:
    from notebook_elastic.backends.kubernetes.code import runtime_zip
    from notebook_elastic.contract.protocol import EVENT_PREFIX

    archive = tmp / "runtime.zip"
    archive.write_bytes(runtime_zip())
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "notebook_elastic.store.run", "--host", "127.0.0.1", "--port", "0"],
        env={"PYTHONPATH": str(archive), "PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_preexec(descriptors),
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
        preexec_fn=_preexec(descriptors),
    )
    port = int(proc.stdout.readline())  # type: ignore[union-attr]
    return proc, port, time.monotonic() - t0


def load(servers: list[tuple[int, int]], clients: int, calls: int, mix: str, rounds: int) -> list[list[dict]]:
    """One fleet of ``clients`` processes connected to each of ``servers`` (port, pid), making
    ``rounds`` rounds on each, in turns A B B A A B...: each round's calls a second over all
    clients, every call's wall time, and the server's CPU seconds per call; by server."""
    import psutil

    fleet = subprocess.Popen(
        [sys.executable, "-c", FLEET, ",".join(str(port) for port, _ in servers), str(clients), str(calls), mix],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_preexec(side="clients"),
    )
    out: list[list[dict]] = [[] for _ in servers]
    try:
        assert fleet.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        ahead = list(range(len(servers)))
        sides = [i for r in range(rounds) for i in (ahead if r % 2 == 0 else ahead[::-1])]  # A B, B A, A B...
        for side in sides:
            server = psutil.Process(servers[side][1])
            user0, sys0 = server.cpu_times()[:2]
            fleet.stdin.write(f"{side}\n")  # type: ignore[union-attr]
            fleet.stdin.flush()  # type: ignore[union-attr]
            result = json.loads(fleet.stdout.readline())  # type: ignore[union-attr]
            user, system = (after - before for after, before in zip(server.cpu_times()[:2], (user0, sys0)))
            walls = result["walls"]
            out[side].append(
                {
                    "rate": len(walls) / result["wall"],
                    "walls": walls,
                    "cpu_per_call": (user + system) / len(walls),
                    "user_per_call": user / len(walls),  # the server's own code (Python, or torch's C++)
                    "system_per_call": system / len(walls),  # the kernel's, on its behalf
                }
            )
        fleet.stdin.write("q\n")  # type: ignore[union-attr]
        fleet.stdin.flush()  # type: ignore[union-attr]
        fleet.wait(timeout=60)
    finally:
        if fleet.poll() is None:
            fleet.kill()
        fleet.wait()
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def _key(key: bytes) -> bytes:
    return _U64.pack(len(key)) + key


def _client(port: int):  # noqa: ANN202
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120), wait_for_workers=False)


def hoarder(port: int, pid: int, multi_get: bool = False) -> tuple[float, float]:
    """A client that sends 150 GETs of an 8 MiB value (or one MULTI_GET naming it 128 times,
    1.5 KB) and never reads: the server's growth in MB, then once that client has closed."""
    good = _client(port)
    good.set("big", b"x" * BIG)
    good.get("big")  # SET has no answer: stored before the GETs come
    before = _rss_mb(pid)
    s = socket.create_connection(("127.0.0.1", port))
    if multi_get:
        s.sendall(VALIDATED + bytes([MULTI_GET]) + _U64.pack(128) + _key(b"/big") * 128)
    else:
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
    server closed that client, the request being over its bound, or did not answer within
    ``MULTI_SET_DEADLINE_S``: torch's server, given one of several 8 MiB values, was seen at 80 % of a core for
    minutes), and another client's slowest call meanwhile (ms)."""
    other, done, worst = _client(port), threading.Event(), [0.0]

    def probe() -> None:
        while not done.is_set():
            t = time.perf_counter()
            other.add("/probe", 1)
            worst[0] = max(worst[0], time.perf_counter() - t)
            time.sleep(0.01)

    body = bytes([MULTI_SET]) + _U64.pack(n) + b"".join(_key(f"/m{i}".encode()) + _key(b"v" * BIG) for i in range(n))
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(MULTI_SET_DEADLINE_S)
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
    except (ConnectionResetError, BrokenPipeError, TimeoutError):
        pass  # over the server's bound on one request: that client is closed; or no answer (None)
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
        for case in ("hoarder", "multi_get", *MULTI_SETS, "descriptors"):
            proc, port, _ = start(32) if case == "descriptors" else start()
            try:
                if case in ("hoarder", "multi_get"):
                    out[case] = hoarder(port, proc.pid, case == "multi_get")
                elif case == "descriptors":
                    out["descriptors"] = idle_cpu_out_of_descriptors(proc, port)
                else:
                    out[f"multi_set_{case}"] = multi_set(port, case)
            finally:
                proc.kill()
                proc.wait()
        figures[name] = out
    return figures


MIXES = ("get_state", "agent")
FIGURES = ("rate", "p99", "cpu_per_call", "user_per_call", "system_per_call")


def _figure(result: dict, what: str) -> float:
    return p99(result["walls"]) if what == "p99" else result[what]


def serve_and_load(servers: dict, clients: list[int], calls: int, rounds: int) -> dict[str, dict]:
    """Both servers up at once, each in its own process (the one not served waits in epoll and
    costs nothing): their start and memory, then each load by one fleet of clients connected to
    both, serving them in turns, round by round (``load``), so each pair of rounds is seconds
    apart, not minutes (the machine is shared: the others' load drifts). One client's latency,
    then each number of clients with each mix. By server: a list of rounds for each load."""
    procs: dict[str, tuple] = {}
    out: dict[str, dict] = {}
    names = list(servers)
    try:
        for name in names:
            procs[name] = servers[name]()
            proc, _port, started = procs[name]
            out[name] = {"start": started, "rss": _rss_mb(proc.pid)}
        targets = [(procs[name][1], procs[name][0].pid) for name in names]
        loads = [("one", 1, "get_state")] + [((n, mix), n, mix) for n in clients for mix in MIXES]
        for label, n, mix in loads:
            for name, got in zip(names, load(targets, n, calls, mix, rounds)):
                out[name][label] = got
            print(f"{label}: done", flush=True)
        for name in names:
            out[name]["rss_loaded"] = _rss_mb(procs[name][0].pid)
    finally:
        for proc, _port, _started in procs.values():
            proc.kill()
            proc.wait()
    return out


def _load_row(metric: str) -> bool:
    """A row of the loads (redone every run), not of the hostile cases."""
    return metric.startswith(("start to serving", "resident memory", "get_state latency", "ours / what")) or (
        " clients, " in metric or metric.startswith(("  each run's", "  each pair's", "  of which"))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", default="8,64", help="numbers of client processes, e.g. 8,64")
    parser.add_argument("--calls", type=int, default=2000, help="calls per client process")
    parser.add_argument(
        "--reps", type=int, default=5, help="rounds of each load on each server, in turns; medians reported"
    )
    parser.add_argument("--no-hostile", dest="hostile", action="store_false", help="skip the hostile-client cases")
    parser.add_argument(
        "--layout",
        choices=("apart", "shared"),
        default="apart",
        help="apart: the servers on the last core, the clients on the others (as on a cluster); shared: all on all",
    )
    args = parser.parse_args()
    LAYOUT["layout"] = args.layout
    name = "store_server" if args.layout == "apart" else "store_server_shared"
    clients = [int(n) for n in args.clients.split(",")]
    need = NODES * AGENT_CALLS_PER_S
    with tempfile.TemporaryDirectory() as tmp:
        servers = {"torch's": start_torchs, "ours": lambda: start_ours(Path(tmp))}
        both = serve_and_load(servers, clients, args.calls, args.reps)
        bad = hostile(Path(tmp)) if args.hostile else None
    theirs, ours = both["torch's"], both["ours"]

    def med(rounds: list[dict], f) -> float:  # noqa: ANN001
        return median([f(r) for r in rounds])

    rows = [
        row("start to serving, torch's server (import torch)", theirs["start"], "s"),
        row("start to serving, ours (standard library)", ours["start"], "s"),
        row("resident memory serving, torch's", theirs["rss"], "MB"),
        row("resident memory serving, ours", ours["rss"], "MB"),
        row(f"resident memory after {'/'.join(map(str, clients))} clients, ours", ours["rss_loaded"], "MB"),
        row(
            "get_state latency median (1 client), torch's",
            med(theirs["one"], lambda r: median(r["walls"])) * 1e6,
            "us",
            digits=0,
        ),
        row(
            "get_state latency median (1 client), ours",
            med(ours["one"], lambda r: median(r["walls"])) * 1e6,
            "us",
            digits=0,
        ),
    ]
    for n in clients:
        for mix in MIXES:
            t, o = ({f: median([_figure(r, f) for r in runs_[(n, mix)]]) for f in FIGURES} for runs_ in (theirs, ours))
            # Each pair of rounds' ratio (the same clients, on one server then at once on the
            # other), then their median.
            ratios = [b["rate"] / a["rate"] for a, b in zip(theirs[(n, mix)], ours[(n, mix)])]
            ratio = median(ratios)
            rows += [
                row(f"{n} clients, {mix}: calls a second, torch's", t["rate"], "1/s", digits=0),
                row(f"{n} clients, {mix}: calls a second, ours", o["rate"], "1/s", digits=0),
                row(f"{n} clients, {mix}: throughput ours / torch's", ratio, "x", ">= 1.0", ratio >= 1.0),
                row("  each pair's ratio", ", ".join(f"{r:.3f}" for r in ratios), "x"),
                row(f"{n} clients, {mix}: p99 latency, torch's", t["p99"] * 1e6, "us", digits=0),
                row(
                    f"{n} clients, {mix}: p99 latency, ours",
                    o["p99"] * 1e6,
                    "us",
                    "<= torch's",
                    o["p99"] <= t["p99"],
                    digits=0,
                ),
                row(f"{n} clients, {mix}: server CPU per call, torch's", t["cpu_per_call"] * 1e6, "us", digits=1),
                row(f"{n} clients, {mix}: server CPU per call, ours", o["cpu_per_call"] * 1e6, "us", digits=1),
                row(
                    "  of which its own code / the kernel's, torch's",
                    f"{t['user_per_call'] * 1e6:.1f} / {t['system_per_call'] * 1e6:.1f}",
                    "us",
                ),
                row(
                    "  of which its own code / the kernel's, ours",
                    f"{o['user_per_call'] * 1e6:.1f} / {o['system_per_call'] * 1e6:.1f}",
                    "us",
                ),
                row(
                    f"{n} clients, {mix}: one core's worth of calls a second (1 / CPU per call), ours / torch's",
                    t["cpu_per_call"] / o["cpu_per_call"],
                    "x",
                ),
            ]
    best = max(median([r["rate"] for r in ours[(n, "agent")]]) for n in clients)
    rows.append(row(f"ours / what {NODES} agents ask ({need} calls a second)", best / need, "x", ">= 1", best >= need))
    hostile_from = ""
    if bad is None:  # --no-hostile: the hostile cases' rows of the last run that had them stay
        last = RESULTS / f"{name}.json"
        if last.exists():
            earlier = json.loads(last.read_text())
            seen = {r["metric"] for r in rows}
            kept = [r for r in earlier["rows"] if r["metric"] not in seen and not _load_row(r["metric"])]
            if kept:
                rows += kept
                said = re.search(r"rows are from the run of ([0-9: -]+)\.", earlier.get("notes", ""))
                hostile_from = said.group(1) if said else earlier["when"]
    if bad is not None:
        b_theirs, b_ours = bad["torch's"], bad["ours"]
        for case, what in (
            ("hoarder", "150 unread GETs of 8 MiB"),
            ("multi_get", "one unread MULTI_GET of 8 MiB x 128"),
        ):
            for who, f in (("torch's", b_theirs), ("ours", b_ours)):
                rows.append(row(f"{what}: server growth, {who}", f[case][0], "MB"))
                rows.append(row(f"  after that client closed, {who}", f[case][1], "MB"))
            rows.append(row(f"{what}: ours bounded", b_ours[case][0], "MB", "< 64", b_ours[case][0] < 64))
        for n in MULTI_SETS:
            for who, f in (("torch's", b_theirs), ("ours", b_ours)):
                took, worst = f[f"multi_set_{n}"]
                # None: ours closed that client (over its bound on one command); torch's has no
                # bound, so its None is no answer within the deadline (or its client gave up).
                refused = (
                    "refused: over our bound on one command"
                    if who == "ours"
                    else f"no answer within {MULTI_SET_DEADLINE_S:g} s"
                )
                served = took if took is not None else refused
                rows.append(row(f"MULTI_SET of {n} x 8 MiB, {who}", served, "s" if took is not None else ""))
                rows.append(row(f"  another client's slowest call meanwhile, {who}", worst, "ms", digits=1))
        took1, took7 = b_ours["multi_set_1"][0], b_ours["multi_set_7"][0]
        rows.append(row("MULTI_SET 7 / 1, ours (linear: about 7)", took7 / took1, "x", "<= 14", took7 / took1 <= 14))
        rows.append(row("MULTI_SET of 8 x 8 MiB served, ours", b_ours["multi_set_8"][0] is not None, "", "True"))
        for who, f in (("torch's", b_theirs), ("ours", b_ours)):
            rows.append(row(f"idle CPU in 3 s out of descriptors, {who}", f["descriptors"], "s", digits=2))
        rows.append(
            row("out of descriptors: ours rests", b_ours["descriptors"], "s", "< 0.1", b_ours["descriptors"] < 0.1)
        )
    report(
        name,
        rows,
        notes=(
            f"{os.cpu_count()} cores, shared with other work; each server in its own process, clients in N processes "
            "on the same machine; "
            + (
                "layout apart: both servers on the last core, the clients on the others, as a cluster runs them "
                "(the store pod on a core of its own, the agents elsewhere); "
                if _cores("server")
                else "layout shared: the clients share every core with the server; "
            )
            + f"{args.calls} calls per client a round, {args.reps} "
            "rounds of each load on each server: both servers up at once, one fleet of clients connected to both "
            "serving them in turns (A B, B A, ...); medians of the rounds; a ratio is the median of each pair's."
            + (f" The hostile clients' rows are from the run of {hostile_from}." if hostile_from else "")
        ),
    )


if __name__ == "__main__":
    main()

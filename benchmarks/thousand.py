"""How far one job goes (#40): each cost of a job of 8, 64, 256 and 1,024 nodes, and its slope.

1. The rendezvous, by simulation (tests/rdzv_sim.py): N light agents in this process, each with
   its own connection, speaking torch's TCPStore protocol and torch's c10d rendezvous as our
   agents run it on a cluster (keep-alive 5 s x 6, last call 1 s, the state read at most once a
   second), against a store in a process of its own: ours (store/server.py, as the Kubernetes
   rendezvous pod runs it) and torch's (what the local supervisor hosts), in the same run. The
   job's range is N-1:N. Its story: a first round (all N start at once; the time until every
   agent's workers have their ranks), a steady window (the store's calls, bytes and CPU; its
   load is the share of one core its single thread uses), a node that leaves (a scale-down or
   a notice: it takes itself out) and the time until the others regroup, a node that joins and
   the time until all regroup, a node that is lost (no word from it any more: noticed by every
   survivor when its heartbeats have been missing for the keep-alive window, 30 s), each as
   seen by every agent. Three modes: ``torch`` (the rendezvous as our agents ran it before #40:
   each node writes its own join, leave and heartbeat; our holder looks for the supervisor's
   keys after every read), ``ours`` (agent/together.py: nodes say what they do in a small
   key and one write takes in many; a lost write backs off; the supervisor's keys are looked
   for only under a supervisor; each member's change watch holds a WAIT the store answers when
   its round changes, agent/change_watch.py), and ``looks``: ours without the watch, looking at
   the round's change counter twice a second instead (as before it).
2. The supervisor's and the kernel's fold (contract/job_state) fed a job of N nodes: the events
   of a first round (N nodes joining, N x 8 ranks starting), a steady stretch of metrics, a node
   lost and the regroup; CPU per event, the fold's memory, the rank map's size as the dashboard
   draws it.
3. The Kubernetes follower with N pods on the fixture (tests/k8s/), via benchmarks/k8s_scale.py's
   measurement: its connections, threads, memory, CPU.
4. Slurm's views of N allocations: squeue/scontrol output of a job with N allocations parsed as
   the backend parses it (fixture level: the output is made here, in Slurm's formats).

Medians of --repeat runs where a figure is taken more than once (the machine is shared).

    python benchmarks/thousand.py [--nodes 8,64,256,1024] [--window 20] [--full] [--parts rdzv,fold,k8s,slurm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _common import RESULTS, median, report, row  # noqa: E402

TORCH_STORE = """
import socket, sys
from notebook_elastic.store.run import host_store
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(4096)
store = host_store(sock)
print(sock.getsockname()[1], flush=True)
sys.stdin.read()
"""


def start_store(which: str, tmp: Path) -> tuple[subprocess.Popen, int]:
    """Our store as the pod runs it (the standard library, from the runtime zip), or torch's."""
    if which == "ours":
        from notebook_elastic.backends.kubernetes.code import runtime_zip
        from notebook_elastic.contract.protocol import EVENT_PREFIX

        archive = tmp / "runtime.zip"
        archive.write_bytes(runtime_zip())
        proc = subprocess.Popen(
            [sys.executable, "-S", "-m", "notebook_elastic.store.run", "--host", "127.0.0.1", "--port", "0"],
            env={"PYTHONPATH": str(archive), "PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = proc.stdout.readline()  # type: ignore[union-attr]
        return proc, json.loads(line[len(EVENT_PREFIX) :])["port"]
    proc = subprocess.Popen(
        [sys.executable, "-c", TORCH_STORE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return proc, int(proc.stdout.readline())  # type: ignore[union-attr]


def _cpu(pid: int) -> float:
    import psutil

    return sum(psutil.Process(pid).cpu_times()[:2])


# -- 1. the rendezvous ------------------------------------------------------------------------


async def _story(n: int, mode: str, port: int, store_pid: int, window_s: float, limit_s: float) -> dict[str, Any]:
    import rdzv_sim as sim

    ours = mode in ("ours", "looks")  # looks: ours before the change watch (its counter looked at twice a second)
    settings = sim.Settings(
        min_nodes=n - 1,
        max_nodes=n,
        together=ours,
        regroup=ours,
        watch=mode == "ours",
        backoff_s=0.02 if ours else 0.0,
        supervised=not ours,
    )
    fleet = sim.Fleet("127.0.0.1", port, settings)
    me = os.getpid()
    out: dict[str, Any] = {"nodes": n, "mode": mode}
    try:
        c0, m0, t0 = _cpu(store_pid), _cpu(me), time.monotonic()
        await fleet.add(n)
        try:
            await fleet.until(lambda: len(fleet.ranked_in(0)) == n, limit_s, "first round")
        except TimeoutError:
            out["first_round_s"] = None
            out["first_round_note"] = (
                f"not closed within {limit_s:g} s ({max(len(a.state.participants) for a in fleet.agents)} of {n} in)"
            )
            return out
        ranked = [a.marks.ranked[0] for a in fleet.agents]
        out["first_round_s"] = max(a.marks.rounds[0] for a in fleet.agents) - t0
        out["first_ranked_s"] = max(ranked) - t0
        out["first_round_calls"] = sum(fleet.counts.calls.values())
        out["first_round_mb"] = (fleet.counts.sent + fleet.counts.received) / 1e6
        out["first_round_store_cpu_s"] = _cpu(store_pid) - c0
        out["first_round_sim_cpu_s"] = _cpu(me) - m0
        out["distinct_ranks"] = sorted(a.marks.rank[0] for a in fleet.agents) == list(range(n))
        await asyncio.sleep(3)  # past the round's own reads
        before, c0, m0, t0 = fleet.counts.copy(), _cpu(store_pid), _cpu(me), time.monotonic()
        loads = []  # the store's load each minute (or each window, if shorter)
        while (left := window_s - (time.monotonic() - t0)) > 0.5:
            c1, t1 = _cpu(store_pid), time.monotonic()
            await asyncio.sleep(min(60.0, left))
            loads.append((_cpu(store_pid) - c1) / (time.monotonic() - t1))
        d, elapsed = fleet.counts.minus(before), time.monotonic() - t0
        out["steady_window_s"] = elapsed
        out["steady_store_load_worst_minute"] = max(loads, default=None)
        out["steady_calls_per_s"] = sum(d.calls.values()) / elapsed
        out["steady_commands_per_s"] = sum(d.commands.values()) / elapsed
        out["steady_mb_per_s"] = (d.sent + d.received) / elapsed / 1e6
        out["steady_calls"] = {k: round(v / elapsed, 1) for k, v in sorted(d.calls.items()) if v}
        out["steady_store_load"] = (_cpu(store_pid) - c0) / elapsed  # share of one core
        out["steady_sim_cpu"] = (_cpu(me) - m0) / elapsed
        out["steady_restarts"] = sum(len(a.marks.departures) + len(a.marks.waiting) for a in fleet.agents)
        round_ = fleet.latest_round()
        # A node leaves: it takes itself out; the others notice at their next look and regroup.
        leaver = fleet.agents[n // 2]
        t0 = time.monotonic()
        change = _change_counts(fleet)
        await leaver.leave()
        out["leave_regroup_s"] = await _regroup(fleet, round_, t0, limit_s)
        out["leave_agreed_s"] = _agreed(fleet, round_, t0)
        out["leave_change"] = change()
        round_ = fleet.latest_round()
        # A node joins: the others see it waiting and regroup with it.
        t0 = time.monotonic()
        change = _change_counts(fleet)
        await fleet.add(1)
        out["join_regroup_s"] = await _regroup(fleet, round_, t0, limit_s)
        out["join_agreed_s"] = _agreed(fleet, round_, t0)
        out["join_change"] = change()
        round_ = fleet.latest_round()
        # A node is lost: its heartbeats stop; every survivor notices when the window is over.
        lost = fleet.agents[n // 3]
        t0 = time.monotonic()
        change = _change_counts(fleet)
        lost.crash()
        window = settings.keep_alive_interval_s * settings.keep_alive_max_attempt

        def reacted(a: Any) -> float | None:  # when it first stopped its workers for this
            times = [t for t, _who in a.marks.departures if t >= t0] + [t for t in a.marks.waiting if t >= t0]
            return min(times) if times else None

        try:
            await fleet.until(lambda: all(reacted(a) is not None for a in fleet.live()), window + limit_s, "noticed")
        except TimeoutError:
            pass  # told below: how many noticed
        times = [t for t in (reacted(a) for a in fleet.live()) if t is not None]
        out["lost_noticed_by"] = f"{len(times)} of {len(fleet.live())}"
        out["lost_noticed_s"] = max(times) - t0 if len(times) == len(fleet.live()) else None
        out["lost_noticed_first_s"] = min(times) - t0 if times else None
        out["lost_regroup_s"] = await _regroup(fleet, round_, t0, window + limit_s)
        out["lost_agreed_s"] = _agreed(fleet, round_, t0)
        if times:  # from the first survivor that saw it (the keep-alive bound before that)
            seen = min(times)
            out["lost_agreed_after_seen_s"] = (
                None if out["lost_agreed_s"] is None else out["lost_agreed_s"] - (seen - t0)
            )
            out["lost_regroup_after_seen_s"] = (
                None if out["lost_regroup_s"] is None else out["lost_regroup_s"] - (seen - t0)
            )
        out["lost_change"] = change()  # the window's steady calls included
        out["keep_alive_window_s"] = window
        out["keep_alive_interval_s"] = settings.keep_alive_interval_s
        return out
    finally:
        fleet.close()
        await asyncio.sleep(0.2)


def _change_counts(fleet: Any) -> Any:
    """What a change of members costs from now until the returned function is called: the
    store calls by kind, the writes of the state (each the whole round) and how many lost."""
    before, writes, won = fleet.counts.copy(), fleet.state_writes, fleet.state_writes_won

    def counted() -> dict[str, Any]:
        d = fleet.counts.minus(before)
        return {
            "calls": sum(d.calls.values()),
            "by_call": {k: v for k, v in sorted(d.calls.items()) if v},
            "mb": round((d.sent + d.received) / 1e6, 1),
            "state_writes": fleet.state_writes - writes,
            "state_writes_lost": (fleet.state_writes - writes) - (fleet.state_writes_won - won),
        }

    return counted


def _agreed(fleet: Any, after_round: int, t0: float) -> float | None:
    """Seconds from ``t0`` until every live agent that was in ``after_round`` was out of it and
    (ours) knew the next round's members: the agreement, before torch's last call and the ranks."""
    times = [a.marks.agreed.get(after_round + 1) for a in fleet.live() if after_round in a.marks.ranked]
    return max(times) - t0 if times and None not in times else None


async def _regroup(fleet: Any, after_round: int, t0: float, limit_s: float) -> float | None:
    """Seconds from ``t0`` until every live agent's workers have ranks in a round after
    ``after_round``."""
    try:
        await fleet.until(
            lambda: all(max(a.marks.ranked, default=-1) > after_round for a in fleet.live()), limit_s, "a regroup"
        )
    except TimeoutError:
        return None
    return max(max(a.marks.ranked.values()) for a in fleet.live()) - t0


def rendezvous(nodes: list[int], modes: list[str], stores: list[str], window_s: float, limit_s: float) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in nodes:
            for mode in modes:
                for which in stores:
                    proc, port = start_store(which, Path(tmp))
                    try:
                        figures = asyncio.run(_story(n, mode, port, proc.pid, window_s, limit_s))
                    finally:
                        proc.kill()
                        proc.wait()
                    figures["store"] = which
                    print(json.dumps(figures), flush=True)
                    results.append(figures)
    return results


# -- 2. the fold: the supervisor's and the kernel's view of a job of N nodes ------------------------

NPROC = 8  # ranks a node: a node of 8 GPUs


def _lines(n: int, steady_s: float, t0: float) -> dict[str, list[tuple[str, str]]]:
    """A job of n nodes x NPROC ranks as its lines reach the kernel, (node, line), by phase:
    a first round, a steady stretch (rank 0's loss 10 times a second, each rank's GPU figures
    as runtime/gpu.py samples them, a line of output a node every 5 s), a node lost and the regroup without it.
    The agent's rendezvous line as agent/run.py writes it (its members: ``rendezvous_members``)."""
    from notebook_elastic.agent.run import rendezvous_members
    from notebook_elastic.contract.protocol import EVENT_PREFIX
    from notebook_elastic.runtime.gpu import interval_s

    def say(kind: str, t: float, node: str, **fields: Any) -> str:
        return EVENT_PREFIX + json.dumps({"kind": kind, "t": t, "node": node, **fields}, separators=(",", ":"))

    names = [f"big-workers-{i}" for i in range(n)]

    def round_(r: int, t: float, alive: list[int]) -> list[tuple[str, str]]:
        world = len(alive)
        members = [
            {"addr": f"10.0.{i // 256}.{i % 256}", "pid": 7, "local_id": 0, "group_rank": g}
            for g, i in enumerate(alive)
        ]
        out = []
        for g, i in enumerate(alive):
            rdzv = {"round": r, "epoch": 0, "group_rank": g, "group_world_size": world, "agent_pid": 7}
            shown = rendezvous_members(members)
            if shown is not None:
                rdzv["members"] = shown
            out.append((names[i], say("rendezvous", t, names[i], **rdzv)))
            for local in range(NPROC):
                rank = g * NPROC + local
                out.append(
                    (
                        names[i],
                        say(
                            "worker_started",
                            t + 0.5,
                            names[i],
                            rank=rank,
                            local_rank=local,
                            world_size=world * NPROC,
                            group_rank=g,
                            pid=1000 + rank,
                            restart_count=0,
                            generation=r,
                        ),
                    )
                )
        return out

    phases: dict[str, list[tuple[str, str]]] = {"first round": round_(0, t0, list(range(n)))}
    steady = []
    t = t0 + 5
    # Each rank samples its GPU every gpu.interval_s(ranks) (5 s up to 1,000 ranks): a share of
    # the ranks in each 5 s.
    per_tick = max(1, round(interval_s(n * NPROC) / 5.0))
    for step in range(int(steady_s * 10)):
        t += 0.1
        steady.append(
            (
                names[n - 1],
                say("metric", t, names[n - 1], rank=0, step=step, values={"loss": 1 / (step + 1), "lr": 0.01}),
            )
        )
        if step % 50 == 0:  # every 5 s: a line of output a node, and GPU figures (gpu.interval_s)
            for i in range(n):
                steady.append((names[i], f"rank {i * NPROC} still training, step {step}"))
            tick = step // 50
            for rank in range(n * NPROC):
                if rank % per_tick != tick % per_tick:
                    continue  # its turn comes in another 5 s of the interval
                node = names[rank // NPROC]
                steady.append(
                    (
                        node,
                        say(
                            "gpu",
                            t,
                            node,
                            rank=rank,
                            device=rank % NPROC,
                            mem_peak_bytes=2**34,
                            mem_total_bytes=2**36,
                            util_percent=90.0,
                        ),
                    )
                )
    phases["steady"] = steady
    lost = n // 3
    alive = [i for i in range(n) if i != lost]
    t += 30
    loss = [(names[lost], say("node_left", t, names[lost], reason="lost"))]
    loss += [(names[i], say("restart", t + 0.5, names[i], reason="departure")) for i in alive]
    phases["a node lost"] = loss + round_(1, t + 2, alive)
    return phases


def fold(nodes: list[int], steady_s: float) -> list[dict]:
    import gc
    import tracemalloc

    from notebook_elastic.contract.events import LineParser
    from notebook_elastic.contract.job_state import JobState
    from notebook_elastic.kernel.ui.render import header_html, ranks_html
    from notebook_elastic.kernel.ui.story import timeline_html

    results = []
    for n in nodes:
        phases = _lines(n, steady_s, time.time() - 3600)
        gc.collect()
        tracemalloc.start()
        state = JobState(max_restarts=3, nnodes=(n - 1, n))
        parsers: dict[str, LineParser] = {}
        out: dict[str, Any] = {"nodes": n, "ranks": n * NPROC}
        for phase, lines in phases.items():
            cpu = time.process_time()
            events = 0
            for node, line in lines:
                parser = parsers.get(node)
                if parser is None:
                    parser = parsers[node] = LineParser(node)
                event = parser.feed(line)
                if event is not None:
                    state.apply(event)
                    events += 1
            spent = time.process_time() - cpu
            out[f"{phase}: events"] = events
            out[f"{phase}: fold CPU s"] = spent
            out[f"{phase}: us per event"] = 1e6 * spent / max(1, events)
        current, _peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["fold memory MB"] = current / 2**20
        out["steady fold share of a core"] = out["steady: fold CPU s"] / steady_s
        t = time.perf_counter()
        html = ranks_html(state)
        out["rank map render ms"] = 1000 * (time.perf_counter() - t)
        out["rank map kB"] = len(html.encode()) / 1e3
        t = time.perf_counter()
        timeline = timeline_html(state.events)
        out["timeline render ms"] = 1000 * (time.perf_counter() - t)
        out["timeline kB"] = len(timeline.encode()) / 1e3
        t = time.perf_counter()
        header_html("big", "kubernetes", state)
        out["header render ms"] = 1000 * (time.perf_counter() - t)
        out["events kept"] = len(state.events)
        out["nodes kept"] = len(state.nodes)
        print(json.dumps(out), flush=True)
        results.append(out)
    return results


# -- 3. the Kubernetes follower with N pods (the fixture; benchmarks/k8s_scale.py's measurement) ---


def follower(nodes: list[int], window_s: float) -> list[dict]:
    import k8s_scale

    results = []
    for n in nodes:
        # Light pods start about 100 a second here: the settling grows with N.
        figures = k8s_scale.measure(n, "bounded", window_s, settle_timeout_s=60 + n / 5, warmup_s=15)
        print(json.dumps(figures), flush=True)
        results.append(figures)
    return results


# -- 4. Slurm's views of N allocations (fixture level: Slurm's output, parsed as the backend does) --


def slurm(nodes: list[int], repeat: int = 20) -> list[dict]:
    """squeue's listing of the user's jobs (this job's N allocations among as many of a same-named
    job's from another folder and of another job's) read to find this job's (``cluster.cancel``), and ``scontrol --oneliner show job``
    read for each allocation (``cluster._fields``): what the backend parses when it stops a job
    or asks why a node ended, per call, median of ``repeat``."""
    from notebook_elastic.backends.slurm import cluster

    results = []
    for n in nodes:
        # squeue --format=%i|%T|%k|%j: this job's (its folder's mark in the comment), a same-named
        # job's from another folder, and another job's.
        ours, theirs = cluster.comment("mark-a"), cluster.comment("mark-b")
        lines = [f"{1000 + i}|RUNNING|{ours}|ne-big-node-{i}" for i in range(n)]
        lines += [f"{5000 + i}|RUNNING|{theirs}|ne-big-node-{i}" for i in range(n)]
        lines += [f"{9000 + i}|RUNNING|{theirs}|ne-other-node-{i}" for i in range(n)]
        listing = "\n".join([f"999|RUNNING|{ours}|ne-big-supervisor", *lines]) + "\n"
        shown = (
            "JobId={id} JobName=ne-big-node-{i} UserId=me(1000) GroupId=me(1000) Priority=1 JobState=RUNNING "
            "Reason=None Dependency=(null) RunTime=00:10:00 TimeLimit=UNLIMITED PreemptTime=None "
            "NodeList=c{i} BatchHost=c{i} NumNodes=1 NumCPUs=8 TRES=cpu=8,mem=64G,node=1,gres/gpu=8"
        )

        def fake_run(argv: list[str], listing: str = listing) -> str:
            return listing if argv[0] == "squeue" else ""  # scancel: nothing to say

        real = cluster._run
        cluster._run = fake_run  # type: ignore[assignment]
        try:
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                ids = cluster.cancel("big", "mark-a")
                times.append(time.perf_counter() - t)
            assert ids is not None and len(ids) == n + 1, ids
        finally:
            cluster._run = real  # type: ignore[assignment]
        per_job = []
        for _ in range(repeat):
            t = time.perf_counter()
            for i in range(n):
                cluster._fields(shown.format(id=1000 + i, i=i))
            per_job.append(time.perf_counter() - t)
        out = {
            "nodes": n,
            "squeue listing kB": len(listing) / 1e3,
            "find the job's allocations ms": 1000 * median(times),
            "read every allocation's scontrol line ms": 1000 * median(per_job),
        }
        print(json.dumps(out), flush=True)
        results.append(out)
    return results


FOLLOWER_FIGURES = [
    ("connections_mean", "follower: connections to the API server", ""),
    ("threads", "follower: threads", ""),
    ("rss_mb", "follower: memory (RSS)", "MB"),
    ("cpu_percent", "follower: CPU", "% of a core"),
    ("requests_per_s", "follower: API requests a second", "1/s"),
    ("log_streams_max", "follower: log streams open", ""),
    ("line_latency_ms_p95", "follower: a loss line's delay, p95", "ms"),
    ("starts_told", "follower: pod starts told", ""),
]
SLURM_FIGURES = [
    ("find the job's allocations ms", "slurm: this job's allocations found in squeue's listing", "ms"),
    ("read every allocation's scontrol line ms", "slurm: every allocation's scontrol line read", "ms"),
]


# -- the table ----------------------------------------------------------------------------------


def slope(points: list[tuple[int, float | None]]) -> float | None:
    """How a cost grows with N: the exponent k of cost ~ N^k between the two largest N measured
    (1: linear; 2: quadratic)."""
    known = [(n, v) for n, v in points if v is not None and v > 0]
    if len(known) < 2:
        return None
    (n1, v1), (n2, v2) = known[-2], known[-1]
    return math.log(v2 / v1) / math.log(n2 / n1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,64,256,1024")
    parser.add_argument("--modes", default="torch,ours")
    parser.add_argument("--stores", default="ours,torch")
    parser.add_argument("--window", type=float, default=20.0, help="steady-state window, seconds")
    parser.add_argument("--full", action="store_true", help="a steady state of 5 minutes (issue 40's)")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds a round may take before it is called stuck")
    parser.add_argument("--parts", default="rdzv,fold,k8s,slurm")
    parser.add_argument("--k8s-window", type=float, default=15.0, help="the follower's steady window, seconds")
    parser.add_argument(
        "--fold-steady", type=float, default=60.0, help="simulated seconds of steady events fed to the fold"
    )
    parser.add_argument("--machine", default=f"{os.cpu_count()}-core CPU machine (no GPU), shared")
    args = parser.parse_args()
    nodes = [int(x) for x in args.nodes.split(",")]
    parts = set(args.parts.split(","))
    window = 300.0 if args.full else args.window
    # A part not run this time keeps its figures from the last run (``--parts`` reruns some).
    path = RESULTS / "thousand.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    data: dict[str, Any] = {k: earlier[k] for k in ("rendezvous", "fold", "follower", "slurm") if k in earlier}
    if "rdzv" in parts:
        fresh = rendezvous(nodes, args.modes.split(","), args.stores.split(","), window, args.limit)
        # ... and so does each (nodes, mode, store) not run this time.
        ran = {(r["nodes"], r["mode"], r["store"]) for r in fresh}
        kept = [r for r in data.get("rendezvous", []) if (r["nodes"], r["mode"], r["store"]) not in ran]
        data["rendezvous"] = sorted(kept + fresh, key=lambda r: (r["nodes"], r["mode"], r["store"]))
    if "fold" in parts:
        data["fold"] = fold(nodes, args.fold_steady)
    if "k8s" in parts:
        data["follower"] = follower(nodes, args.k8s_window)
    if "slurm" in parts:
        data["slurm"] = slurm(nodes)
    rows: list[dict] = []
    for key, make in (
        ("rendezvous", lambda r: rendezvous_rows(r, _sizes(r))),
        ("fold", lambda r: per_node_rows(r, _sizes(r), FOLD_FIGURES, "fold")),
        ("follower", lambda r: per_node_rows(r, _sizes(r), FOLLOWER_FIGURES, "k8s")),
        ("slurm", lambda r: per_node_rows(r, _sizes(r), SLURM_FIGURES, "slurm")),
    ):
        if key in data:
            rows += make(data[key])
    rows += goal_rows(data, max(n for r in data.values() for n in _sizes(r)))
    windows = [
        f"{r['nodes']} nodes {r['mode']} agents {r['store']} store {r['steady_window_s']:.0f} s"
        for r in data.get("rendezvous", [])
        if r.get("steady_window_s")
    ]
    said = f"; those measured before windows were recorded: {args.window:g} s" if windows else ""
    report("thousand", rows, notes=f"machine: {args.machine}; steady windows: {', '.join(windows) or window}{said}")
    saved = json.loads(path.read_text())
    saved["machine"]["name"] = args.machine
    saved.update(data)
    path.write_text(json.dumps(saved, indent=1, default=str))


def _sizes(results: list[dict]) -> list[int]:
    return sorted({r["nodes"] for r in results})


RDZV_FIGURES = [
    ("first_round_s", "first round closed (every agent in)", "s"),
    ("first_ranked_s", "first round: every agent's workers ranked", "s"),
    ("first_round_mb", "first round: bytes to and from the store", "MB"),
    ("steady_calls_per_s", "steady: store calls a second", "1/s"),
    ("steady_mb_per_s", "steady: bytes a second", "MB/s"),
    ("steady_store_load", "steady: store load (share of its one core)", "x"),
    ("leave_agreed_s", "a node leaves: every survivor agreed on the next round", "s"),
    ("leave_regroup_s", "a node leaves: all regrouped", "s"),
    ("join_agreed_s", "a node joins: everyone agreed on the next round", "s"),
    ("join_regroup_s", "a node joins: all regrouped", "s"),
    ("lost_noticed_s", "a node lost: noticed by every survivor", "s"),
    ("lost_regroup_s", "a node lost: all regrouped", "s"),
    ("lost_regroup_after_seen_s", "a node lost: all regrouped, from the first survivor that saw it", "s"),
]


FOLD_FIGURES = [
    ("first round: us per event", "fold: CPU per event, first round", "us"),
    ("steady: us per event", "fold: CPU per event, steady", "us"),
    ("steady fold share of a core", "fold: steady share of a core (target <= 0.05)", "x"),
    ("a node lost: fold CPU s", "fold: a node lost and the regroup, CPU", "s"),
    ("fold memory MB", "fold: memory after the story", "MB"),
    ("events kept", "fold: events kept (the timeline's)", ""),
    ("rank map kB", "rank map: HTML per redraw", "kB"),
    ("rank map render ms", "rank map: render", "ms"),
    ("timeline render ms", "timeline: render", "ms"),
]


def goal_rows(data: dict[str, Any], n: int) -> list[dict]:
    """#40 item 3's goals at the largest N measured (1,024 by default), each with its target:
    our agents (``together``) against our store, as a cluster job runs them."""
    rows = []
    rdzv = [r for r in data.get("rendezvous", []) if r["nodes"] == n and r["mode"] == "ours" and r["store"] == "ours"]
    if rdzv:
        r = rdzv[0]
        first = r.get("first_round_s")
        rows.append(
            row(
                f"goal, {n} nodes: first round closed",
                first or "not closed",
                "s",
                "<= 10",
                first is not None and first <= 10,
            )
        )
        load = r.get("steady_store_load")
        if load is not None:
            rows.append(
                row(f"goal, {n} nodes: steady store load (share of its one core)", load, "x", "<= 0.5", load <= 0.5)
            )
        # torch's bound: a node is dropped once its last heartbeat is older than the window, and
        # a survivor reads the state at its own keep-alive, once an interval: window + interval
        # after the lost node's last heartbeat at most.
        noticed, window = r.get("lost_noticed_s"), r.get("keep_alive_window_s")
        interval = r.get("keep_alive_interval_s", window / 6 if window else None)  # 5 s x 6
        bound = window + interval if window and interval else None
        rows.append(
            row(
                f"goal, {n} nodes: a lost node noticed by every survivor ({r.get('lost_noticed_by')})",
                noticed if noticed is not None else "not by all",
                "s",
                f"<= keep-alive window + one interval ({bound:g} s)" if bound else "",
                noticed is not None and bound is not None and noticed <= bound,
            )
        )
        # The agreement of a change of members: from the change (a lost node: from the first
        # survivor that saw it, the keep-alive bound before that) until every member knew the
        # next round's members; torch's last call (a round short of its maximum waits 1 s for
        # more) and the ranks' assignment come after it.
        for change, what in (("leave", "a node leaves"), ("join", "a node joins")):
            agreed = r.get(f"{change}_agreed_s")
            rows.append(
                row(
                    f"goal, {n} nodes: {what}, the members' agreement on the next round",
                    agreed if agreed is not None else "not agreed",
                    "s",
                    "<= 2",
                    agreed is not None and agreed <= 2,
                )
            )
    fold = [r for r in data.get("fold", []) if r["nodes"] == n]
    if fold:
        f = fold[0]
        share = f["steady fold share of a core"]
        rows.append(
            row(f"goal, {n} nodes: the kernel's fold, steady (share of a core)", share, "x", "<= 0.05", share <= 0.05)
        )
        rows.append(
            row(
                f"goal, {n} nodes: rank map per redraw (a summary past 32 nodes)",
                f["rank map kB"],
                "kB",
                "<= 64",
                f["rank map kB"] <= 64,
            )
        )
        rows.append(
            row(f"goal, {n} nodes: the fold's memory", f["fold memory MB"], "MB", "<= 64", f["fold memory MB"] <= 64)
        )
    return rows


def per_node_rows(results: list[dict], nodes: list[int], figures: list[tuple[str, str, str]], _part: str) -> list[dict]:
    rows = []
    for key, label, unit in figures:
        points = [(r["nodes"], r.get(key)) for n in nodes for r in results if r["nodes"] == n]
        k = slope(points)
        values = ", ".join(f"{n}: {'-' if v is None else round(v, 3)}" for n, v in points)
        rows.append(row(f"{label} by N ({values}); slope", k if k is not None else "n/a", unit))
    return rows


def rendezvous_rows(results: list[dict], nodes: list[int]) -> list[dict]:
    rows = []
    for key, label, unit in RDZV_FIGURES:
        for mode in sorted({r["mode"] for r in results}):
            for store in sorted({r["store"] for r in results}):
                points = [
                    (r["nodes"], r.get(key))
                    for n in nodes
                    for r in results
                    if r["nodes"] == n and r["mode"] == mode and r["store"] == store
                ]
                if not points:
                    continue
                k = slope(points)
                values = ", ".join(f"{n}: {'-' if v is None else round(v, 3)}" for n, v in points)
                rows.append(
                    row(
                        f"{label} [{mode} agents, {store} store] by N ({values}); slope",
                        k if k is not None else "n/a",
                        unit,
                    )
                )
    return rows


if __name__ == "__main__":
    main()

"""What following a big Kubernetes job costs the notebook (issue 16 item 6), by simulation.

A job of N light worker pods (8, 32, 128, 256) on the loopback API server of
tests/k8s_apiserver.py: each pod is a small Python process printing the lines an agent and its
worker print (tests/k8s_light.py; rank 0 reports a loss every 0.5 s, the other ranks print a
line every 5 s), not a torchrun agent, so 256 of them fit on 2 cores. The follower (the real
``ClusterFollower`` through the real client) runs in a process of its own, started before the
job, and prints what it receives; the API server counts requests and open log streams.

Per N, two followers, one after the other on a fresh cluster:
- ``bounded``: the follower as shipped (at most LOG_STREAMS_MAX followed logs; the others
  caught up by short reads at a paced rate);
- ``every pod``: the baseline, one followed log per pod (the follower before #16 item 6,
  reproduced by lifting the bound), in the same run.

Figures, in steady state (a window starting 15 s after every pod's start was told): API requests per
second, the follower's open TCP connections to the API server, the log streams the API server
serves, the follower's RSS and CPU; event latency: a rank-0 loss line from its print to the
follower's event (pod clock = follower clock: one machine), and a pod's start from its
container starting to the follower's ``node_joined``. Each figure grows with N as the table
shows; the ratio column is bounded / every-pod for the same N.

usage: python benchmarks/k8s_scale.py [--nodes 8,32,128,256] [--window 15] [--machine NAME]
       python benchmarks/k8s_scale.py --nodes 1024 --modes bounded --name k8s_scale_1024
(1,024 light pods are some 9 GB of processes: the every-pod baseline, 1,024 followed logs, is left
out there, and the figures go to a results file of their own)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _common import RESULTS, p95, report, row  # noqa: E402

MODES = ("bounded", "every pod")


# -- the follower's process ------------------------------------------------------------------


def follower_main(job: str, mode: str) -> None:
    """Follow ``job`` and print each event of interest with when it was received."""
    from notebook_elastic.backends.kubernetes import logs
    from notebook_elastic.backends.kubernetes.client import connect
    from notebook_elastic.backends.kubernetes.follow import ClusterFollower

    if mode == "every pod":
        logs.LOG_STREAMS_MAX = 1 << 20  # every running pod is wanted: one followed log each
    stop = threading.Event()
    out = sys.stdout
    for event in ClusterFollower(connect(), job, stop):
        if event.kind in ("job_submitted", "metric", "node_joined", "worker_started", "worker_failed"):
            out.write(json.dumps({"kind": event.kind, "node": event.node, "t": event.time, "recv": time.time()}) + "\n")
            out.flush()


# -- one measurement -------------------------------------------------------------------------


def measure(nodes: int, mode: str, window_s: float, settle_timeout_s: float, warmup_s: float) -> dict:
    import k8s_light
    import psutil
    from k8s_apiserver import FakeCluster
    from kubernetes import config

    fake = FakeCluster(gpu_slots=0)
    tmp = Path(tempfile.mkdtemp(prefix="k8s-scale-"))
    kubeconfig = fake.kubeconfig(tmp / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    err = open(tmp / "follower.err", "wb")
    # The job's code first (the notebook's launch), then the follower, then its workers: a
    # pod's start is timed from a follower that is already watching.
    code, workers = k8s_light.light_job("big", nodes, metric_every_s=0.5, quiet_every_s=5.0)
    api = config.new_client_from_config(config_file=str(kubeconfig))
    k8s_light.create(api, [code])
    proc = subprocess.Popen(
        [sys.executable, __file__, "--follower", "big", "--mode", mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    lines: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass

    threading.Thread(target=read, daemon=True).start()
    figures: dict = {"nodes": nodes, "mode": mode}
    try:
        deadline = time.monotonic() + 60
        while not any(x["kind"] == "job_submitted" for x in list(lines)):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the follower did not start: see {tmp / 'follower.err'}")
            time.sleep(0.1)
        time.sleep(1.0)  # its watches are open
        k8s_light.create(api, [workers])
        started_at: dict[str, float] = {}
        deadline = time.monotonic() + settle_timeout_s
        while time.monotonic() < deadline:
            with fake.lock:
                for pod in fake.objects.values():
                    if pod["kind"] == "Pod" and pod["metadata"]["uid"] in fake.containers:
                        started_at.setdefault(pod["metadata"]["name"], fake.containers[pod["metadata"]["uid"]].started)
            starts = {x["node"] for x in list(lines) if x["kind"] == "worker_started"}
            if len(starts) >= nodes and len(started_at) >= nodes:
                break
            time.sleep(0.5)
        figures["settled_s"] = round(settle_timeout_s - (deadline - time.monotonic()), 1)
        figures["starts_told"] = len({x["node"] for x in list(lines) if x["kind"] == "worker_started"})
        joined = [x for x in list(lines) if x["kind"] == "node_joined" and x["node"] in started_at]
        join_lat = [max(0.0, x["recv"] - started_at[x["node"]]) for x in joined]

        # Steady state: past the start-up's catch-ups (a new pod is read again 1, 2, 4, 8 s
        # after it starts while it has said nothing).
        time.sleep(warmup_s)
        follower = psutil.Process(proc.pid)
        port = int(fake.url.rsplit(":", 1)[1])
        fake.reset_log_peaks()
        cpu0 = sum(follower.cpu_times()[:2])
        t0 = time.monotonic()
        n0 = len(fake.requests)
        mark = len(lines)
        conns, rss, follows = [], [], []
        while time.monotonic() - t0 < window_s:
            conns.append(
                sum(
                    1
                    for c in follower.net_connections(kind="tcp")
                    if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
                )
            )
            rss.append(follower.memory_info().rss)
            follows.append(fake.log_follows_open)
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        cpu = sum(follower.cpu_times()[:2]) - cpu0
        requests = len(fake.requests) - n0
        metrics = [x for x in lines[mark:] if x["kind"] == "metric"]
        line_lat = [x["recv"] - x["t"] for x in metrics]
        figures.update(
            requests_per_s=round(requests / elapsed, 2),
            connections_mean=round(statistics.mean(conns), 1),
            connections_max=max(conns),
            log_streams_max=max(max(follows), fake.log_follows_peak),
            log_reads_max=fake.log_reads_peak,
            rss_mb=round(max(rss) / 2**20, 1),
            cpu_percent=round(100 * cpu / elapsed, 1),
            threads=follower.num_threads(),
            metric_lines=len(metrics),
            line_latency_ms_median=round(1000 * statistics.median(line_lat), 1) if line_lat else None,
            line_latency_ms_p95=round(1000 * p95(line_lat), 1) if line_lat else None,
            join_latency_ms_median=round(1000 * statistics.median(join_lat), 1) if join_lat else None,
            join_latency_ms_p95=round(1000 * p95(join_lat), 1) if join_lat else None,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.close()
        fake.close()
    return figures


COLUMNS = [
    ("requests_per_s", "API req/s"),
    ("connections_mean", "conns"),
    ("log_streams_max", "log streams"),
    ("log_reads_max", "log reads"),
    ("rss_mb", "RSS MB"),
    ("cpu_percent", "CPU %"),
    ("threads", "threads"),
    ("line_latency_ms_median", "line ms p50"),
    ("line_latency_ms_p95", "line ms p95"),
    ("join_latency_ms_median", "join ms p50"),
    ("join_latency_ms_p95", "join ms p95"),
    ("starts_told", "starts told"),
]


def table(results: list[dict]) -> str:
    head = ["N", "follower"] + [c[1] for c in COLUMNS]
    body = [[str(r["nodes"]), r["mode"]] + [str(r.get(k)) for k, _ in COLUMNS] for r in results]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,32,128,256")
    parser.add_argument("--window", type=float, default=15.0, help="steady-state window per run, seconds")
    parser.add_argument("--settle-timeout", type=float, default=90.0)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after every start was told")
    parser.add_argument("--machine", default=f"{os.cpu_count()}-core CPU machine (no GPU)")
    parser.add_argument("--modes", default=",".join(MODES), help="the followers to measure (bounded, every pod)")
    parser.add_argument("--name", default="k8s_scale", help="the results file's name (benchmarks/results/NAME.json)")
    parser.add_argument("--follower", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="bounded", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.follower:
        return follower_main(args.follower, args.mode)

    results = []
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes {','.join(unknown)}: not a follower here; use {' or '.join(MODES)}")
    for n in [int(x) for x in args.nodes.split(",")]:
        for mode in modes:
            figures = measure(n, mode, args.window, args.settle_timeout, args.warmup)
            print(json.dumps(figures), flush=True)
            results.append(figures)
    print()
    print(table(results))

    rows = []
    by = {(r["nodes"], r["mode"]): r for r in results}
    for n in sorted({r["nodes"] for r in results}):
        ours, base = by.get((n, "bounded"), {}), by.get((n, "every pod"), {})
        for key, label in COLUMNS[:8]:
            value, baseline = ours.get(key), base.get(key)
            ratio = round(value / baseline, 3) if value is not None and baseline else None
            rows.append(
                row(f"N={n} {label} (bounded; every pod {baseline}; ratio {ratio})", value, "", "", None, digits=2)
            )
    from notebook_elastic.backends.kubernetes.logs import CATCH_UP_READERS, LOG_STREAMS_MAX

    notes = (
        f"machine: {args.machine}. Light pods (tests/k8s_light.py), fixture API server in this process, "
        f"the follower in its own; window {args.window:.0f} s per run, {args.warmup:.0f} s after every start was told. "
        f"Bound: {LOG_STREAMS_MAX} followed logs + {CATCH_UP_READERS} catch-up reads.\n" + table(results)
    )
    report(args.name, rows, notes)
    path = RESULTS / f"{args.name}.json"
    data = json.loads(path.read_text())
    data["machine"]["name"] = args.machine
    data["by_nodes"] = results
    path.write_text(json.dumps(data, indent=1, default=str))


if __name__ == "__main__":
    main()

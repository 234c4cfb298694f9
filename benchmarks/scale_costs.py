"""What each notebook-side figure costs as the work grows (issue 16 item 5), on this machine.

1. Metric points (1k, 10k, 100k): a job's history of that many steps (written as the
   supervisor writes it, from a real job's events: benchmarks/replay.py's ``synthesize``) is
   attached to; the figures are the attach + replay time until the state holds the last step,
   the history's size on disk, the chart's first draw (every point read), a redraw after 10
   more points (what the dashboard does up to 4 times a second while a job reports), and the
   chart's SVG size (what one redraw sends to the browser). Baselines in the same run: the
   figure at 1k points (the ratio in each row is figure / figure at 1k), and for the redraw, a
   redraw that reads every point (what every redraw did before).
2. Simulated nodes x processes on the local backend (1x1, 2x1, 4x2): time from launch to the
   first step and to every rank started, steps/s of a DDP loop (a 20 ms step) in a 10 s window,
   and the memory of every process of the job (supervisor, agents, zygotes, workers; PSS, so
   the torch pages they share are counted once). On a 2-core
   machine 4x2 is 8 training processes on 2 cores: it shows the cost of the machinery, not
   speed-up; the 8x2 on 16 cores of item 5 needs a bigger machine.

usage: python benchmarks/scale_costs.py [--quick] [--machine NAME] [--shapes 1x1,2x1,4x2,8x2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from array import array

sys.path.insert(0, os.path.dirname(__file__))
from _common import DDP_TRAIN, RESULTS, ddp_namespace, report, row, stop_all_jobs  # noqa: E402
from replay import STEP_S, attach_time, synthesize  # noqa: E402

import notebook_elastic as ne  # noqa: E402
from notebook_elastic.backends.local import LocalBackend  # noqa: E402
from notebook_elastic.contract.event_types import Kind  # noqa: E402
from notebook_elastic.jobfolder.history import read_all  # noqa: E402
from notebook_elastic.kernel.ui import chart  # noqa: E402
from notebook_elastic.kernel.ui.chart import chart_svg  # noqa: E402


def template(name: str) -> list:
    """A small real job's events, the templates of the synthetic histories."""
    job = ne.launch(DDP_TRAIN, nnodes="1", nproc_per_node=1, name=name, user_ns=ddp_namespace(30))
    job.wait(180)
    return list(read_all(LocalBackend().folder(name).events_file))


def points_figures(real: list, folder, points: int) -> dict:
    name = f"costs-{points}"
    target = LocalBackend().folder(name).path
    target.mkdir(parents=True, mode=0o700)
    for f in ("spec.json", "status.json", "manifest.json"):
        if (folder.path / f).exists():
            (target / f).write_bytes((folder.path / f).read_bytes().replace(folder.name.encode(), name.encode()))
    hours = (points + 0.5) * STEP_S / 3600
    shape = synthesize(real, hours, target / "events.jsonl", False)
    replay_s = min(attach_time(name, shape["steps"]) for _ in range(2))
    steps = array("d", range(points))
    values = array("d", (1.0 / (1 + s * 1e-3) for s in range(points)))
    t = time.perf_counter()
    svg = chart_svg(steps, values, metric="loss", smoothing=0.6)
    first_ms = 1000 * (time.perf_counter() - t)
    redraws = []
    for i in range(20):
        for k in range(10):
            steps.append(points + 10 * i + k)
            values.append(0.5)
        t = time.perf_counter()
        svg = chart_svg(steps, values, metric="loss", smoothing=0.6)
        redraws.append(1000 * (time.perf_counter() - t))
    # The baseline, same arrays: a redraw that downsamples every point (what every redraw did
    # before #16 item 5: chart_svg called downsample()).
    full = []
    kept, chart.series_points = chart.series_points, chart.downsample
    try:
        for _ in range(5):
            t = time.perf_counter()
            chart_svg(steps, values, metric="loss", smoothing=0.6)
            full.append(1000 * (time.perf_counter() - t))
    finally:
        chart.series_points = kept
    return {
        "points": shape["steps"],
        "chart_redraw_every_point_ms": sorted(full)[len(full) // 2],
        "replay_s": replay_s,
        "disk_mb": (shape["history_bytes"] + shape["current_bytes"]) / 1e6,
        "chart_first_ms": first_ms,
        "chart_redraw_ms": sorted(redraws)[len(redraws) // 2],
        "svg_kb": len(svg.encode()) / 1e3,
    }


def job_memory_mb(home: str) -> float:
    import psutil

    prefix = f"NOTEBOOK_ELASTIC_JOB_DIR={home}"
    total = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if any(e.startswith(prefix) for e in (f"{k}={v}" for k, v in proc.environ().items())):
                total += proc.memory_full_info().pss  # shared pages (torch's) split among sharers
        except (psutil.Error, OSError):
            continue
    return total / 2**20


def nodes_figures(home: str, nodes: int, procs: int) -> dict:
    name = f"costs-{nodes}x{procs}"
    t0 = time.monotonic()
    job = ne.launch(DDP_TRAIN, nnodes=str(nodes), nproc_per_node=procs, name=name, user_ns=ddp_namespace(100_000))
    first = every = None
    deadline = t0 + 300
    while time.monotonic() < deadline and (first is None or every is None):
        if first is None and job.state.step is not None:
            first = time.monotonic() - t0
        ranks = {r for n in job.state.nodes.values() for r in n.ranks}
        if every is None and len(ranks) == nodes * procs and job.world_size == nodes * procs:
            every = time.monotonic() - t0
        time.sleep(0.05)
    time.sleep(2.0)
    step0, w0 = job.state.step or 0, time.monotonic()
    time.sleep(10.0)
    rate = ((job.state.step or 0) - step0) / (time.monotonic() - w0)
    memory = job_memory_mb(home)
    job.stop()
    job.wait(120)
    return {
        "nodes_x_procs": f"{nodes}x{procs}",
        "first_step_s": first,
        "all_ranks_s": every,
        "steps_per_s": rate,
        "job_memory_mb": memory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="points only up to 10k, nodes 1x1 and 2x1")
    parser.add_argument("--machine", default=f"{os.cpu_count()}-core CPU machine (no GPU)")
    parser.add_argument(
        "--shapes", help="nodes x processes to launch, e.g. 1x1,2x1,4x2,8x2 (the 8x2 of item 5 wants 16 cores)"
    )
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="ne-bench-costs-")
    os.environ["NOTEBOOK_ELASTIC_HOME"] = home
    rows: list[dict] = []
    by_points, by_nodes = [], []
    try:
        real = template("costs-template")
        assert any(e.kind == Kind.METRIC for e in real)
        folder = LocalBackend().folder("costs-template")
        for points in (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000):
            figures = points_figures(real, folder, points)
            by_points.append(figures)
            print(json.dumps(figures), flush=True)
        base = by_points[0]
        for f in by_points:
            for key, label, unit in (
                ("replay_s", "attach + replay", "s"),
                ("disk_mb", "history on disk", "MB"),
                ("chart_first_ms", "chart, first draw", "ms"),
                ("chart_redraw_ms", "chart, redraw after 10 new points", "ms"),
                ("chart_redraw_every_point_ms", "chart, redraw reading every point (before; baseline)", "ms"),
                ("svg_kb", "chart SVG per redraw (to the browser)", "kB"),
            ):
                ratio = f[key] / base[key] if base[key] else float("nan")
                rows.append(row(f"{label}, {f['points']:,} points (x{ratio:.2f} of 1k)", f[key], unit))
        shapes = ((1, 1), (2, 1)) if args.quick else ((1, 1), (2, 1), (4, 2))
        if args.shapes:
            shapes = tuple(tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(","))
        for nodes, procs in shapes:
            figures = nodes_figures(home, nodes, procs)
            by_nodes.append(figures)
            print(json.dumps(figures), flush=True)
        base = by_nodes[0]
        for f in by_nodes:
            for key, label, unit in (
                ("first_step_s", "launch -> first step", "s"),
                ("all_ranks_s", "launch -> every rank started", "s"),
                ("steps_per_s", "steps/s (20 ms step, DDP)", "1/s"),
                ("job_memory_mb", "memory of the job's processes (PSS)", "MB"),
            ):
                value = f[key]
                ratio = value / base[key] if value is not None and base[key] else float("nan")
                rows.append(row(f"{label}, {f['nodes_x_procs']} (x{ratio:.2f} of 1x1)", value, unit))
    finally:
        stop_all_jobs()
    report(
        "scale_costs",
        rows,
        notes=f"machine: {args.machine}; nodes x processes are simulated nodes on this one machine "
        "(4x2 = 8 training processes on its cores: the machinery's cost, not a speed-up)",
    )
    path = RESULTS / "scale_costs.json"
    data = json.loads(path.read_text())
    data["machine"]["name"] = args.machine
    data["by_points"], data["by_nodes"] = by_points, by_nodes
    path.write_text(json.dumps(data, indent=1, default=str))


if __name__ == "__main__":
    main()

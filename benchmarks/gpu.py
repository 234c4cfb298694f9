"""Issue #14's figures, as ratios against a baseline measured in the same run.

- a failing joiner: how long training stalls when a node that fails while joining is evicted,
  against a healthy node joining (the same scale-up, no failure); the restarts it cost;
- report() with the speed and GPU figures it now adds, against emitting the same line bare;
- torch.compile on the real inductor path: the first 2 steps (code generation, cold cache)
  against 2 eager steps of the same tiny model;
- on CUDA only: the first step of a 1-rank job on the GPU (nccl) against the same job on CPU
  (gloo), and the GPU figures the job reports. Without CUDA these rows say so.
usage: python benchmarks/gpu.py
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from contextlib import contextmanager, redirect_stdout

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from _common import report, row, stop_all_jobs, wait  # noqa: E402

import notebook_elastic as ne  # noqa: E402
import notebook_elastic.runtime as runtime  # noqa: E402
from notebook_elastic.contract.event_types import Kind  # noqa: E402
from notebook_elastic.runtime._emit import emit  # noqa: E402

# benchmarks/packaging.py would shadow the `packaging` package inductor's C++ build imports.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.abspath(os.path.dirname(__file__))]

TRAIN = """
dev = elastic.device()
model = torch.nn.Linear(32, 1).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
batches = iter(state.batch_sampler(1_000_000, 8, shuffle=False))
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
for step in state.steps(TOTAL):
    next(batches)
    loss = ddp(torch.randn(8, 32, device=dev)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item())
    time.sleep(STEP_S)
"""


@contextmanager
def cuda_visible(value: str | None):
    """Jobs launched inside see these GPUs ("" for none: CPU ranks over gloo; None: all)."""
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def namespace(total: int, step_s: float = 0.05) -> dict:
    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total, "STEP_S": step_s}


def longest_gap_s(job, after: float) -> float:
    """The longest time between two consecutive new steps after ``after``: the stall."""
    series = job.metrics["loss"]
    newest, times = -1.0, []
    for step, t in zip(series.steps, series.times):
        if step > newest:  # a step redone after a restart is not progress
            newest = step
            if t >= after:
                times.append(t)
    return max((b - a for a, b in zip(times, times[1:])), default=float("nan"))


def joiner(rows: list[dict], broken: bool) -> tuple[float, int]:
    name = "bench-bad-joiner" if broken else "bench-good-joiner"
    ifname = (
        "NCCL_SOCKET_IFNAME"
        if os.environ.get("CUDA_VISIBLE_DEVICES") != "" and torch.cuda.is_available()
        else "GLOO_SOCKET_IFNAME"
    )
    options = {"node_env": {"node-1": {ifname: "nosuch0"}}} if broken else {}
    job = ne.launch(TRAIN, nnodes="1:2", name=name, max_restarts=3, backend_options=options, user_ns=namespace(100_000))
    wait(lambda: job.state.step is not None and job.state.step >= 10, "ten steps")
    scaled_at = time.time()
    job.scale(2)
    if broken:
        wait(lambda: any(e.kind == Kind.NODE_EVICTED for e in job.events), "the eviction")
    else:
        wait(lambda: job.world_size == 2, "two nodes")
    step = job.state.step
    wait(lambda: job.state.step >= step + 20 and job.status == "running", "twenty steps after")
    gap = longest_gap_s(job, scaled_at)
    restarts = job.restarts
    job.stop()
    return gap, restarts


def report_cost(rows: list[dict]) -> None:
    n = 50_000

    def bare() -> None:
        for i in range(n):
            emit("metric", t=time.time(), rank=0, step=i, values={"loss": 0.5, "acc": 0.25})

    def ours() -> None:
        for i in range(n):
            runtime.report(step=i, loss=0.5, acc=0.25)

    best = {bare: float("inf"), ours: float("inf")}
    with redirect_stdout(open(os.devnull, "w")):
        for _ in range(3):  # alternated, best of 3: neither pays the other's warm-up
            for fn in (bare, ours):
                started = time.perf_counter()
                fn()
                best[fn] = min(best[fn], (time.perf_counter() - started) / n * 1e6)
    rows.append(row("report() per call, with speed + GPU sampling", best[ours], "us"))
    rows.append(row("  the same line emitted bare (baseline)", best[bare], "us"))
    rows.append(row("  ratio", best[ours] / best[bare], "x", "<= 1.3x", best[ours] / best[bare] <= 1.3))


def compile_cost(rows: list[dict]) -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ne-inductor-")  # cold, as a first run is

    def two_steps(model) -> float:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        started = time.perf_counter()
        for _ in range(2):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return time.perf_counter() - started

    def tiny():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    eager = two_steps(tiny())
    inductor = two_steps(torch.compile(tiny()))
    rows.append(row("torch.compile (inductor, cold): first 2 steps of a tiny MLP", inductor, "s"))
    rows.append(row("  the same 2 steps eager (baseline)", eager, "s", digits=4))
    rows.append(row("  ratio", inductor / eager, "x", digits=0))


def first_step(rows: list[dict]) -> None:
    if not torch.cuda.is_available():
        rows.append(row("first step on GPU (nccl) vs CPU (gloo)", "no CUDA here: not measured", ""))
        return
    seconds = {}
    for label, visible in (("cpu", ""), ("gpu", os.environ.get("CUDA_VISIBLE_DEVICES"))):
        with cuda_visible(visible):
            job = ne.launch(TRAIN, nnodes="1", name=f"bench-first-{label}", user_ns=namespace(30, 0.0))
            job.wait(300)
        seconds[label] = job.state.first_step_at - job.state.started_at
        if label == "gpu" and job.state.gpu_ranks:
            g = job.state.gpu_ranks[0]
            rows.append(row("GPU peak allocated, rank 0", g["mem_peak_bytes"] / 2**20, "MiB"))
            if "util_percent" in g:
                rows.append(row("GPU utilisation, rank 0 (NVML)", g["util_percent"], "%"))
    rows.append(row("first step on GPU (nccl), from submission", seconds["gpu"], "s"))
    rows.append(row("  the same on CPU (gloo) (baseline)", seconds["cpu"], "s"))
    rows.append(row("  ratio", seconds["gpu"] / seconds["cpu"], "x"))


def run() -> None:
    os.environ.setdefault("NOTEBOOK_ELASTIC_HOME", tempfile.mkdtemp(prefix="ne-bench-gpu-"))
    rows: list[dict] = []
    # Two nodes need a GPU each; with fewer, the joiner figures are taken on CPU ranks (gloo).
    with cuda_visible(None if torch.cuda.device_count() >= 2 else ""):
        good_gap, _ = joiner(rows, broken=False)
        bad_gap, bad_restarts = joiner(rows, broken=True)
    rows.append(row("training stalled by a joiner that fails in init (evicted)", bad_gap, "s"))
    rows.append(row("  by a healthy joiner (baseline)", good_gap, "s"))
    rows.append(row("  ratio", bad_gap / good_gap, "x"))
    rows.append(row("restarts charged for the failing joiner", bad_restarts, "", "1", bad_restarts == 1))
    report_cost(rows)
    with redirect_stdout(io.StringIO()):
        compile_cost(rows)
    first_step(rows)
    gpus = torch.cuda.device_count()
    report(
        "gpu",
        rows,
        notes=f"{os.cpu_count()} CPUs, {gpus} GPU(s) ({torch.cuda.get_device_name(0) if gpus else 'none'}), torch "
        f"{torch.__version__}. The joiner rows run on {'GPU ranks (nccl)' if gpus >= 2 else 'CPU ranks (gloo): two nodes need two GPUs'}; "
        "the first-step and GPU rows only where CUDA is present.",
    )


def main() -> None:
    try:
        run()
    finally:
        stop_all_jobs()


if __name__ == "__main__":
    main()

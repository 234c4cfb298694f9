"""Local backend speed, as ratios against plain torchrun on the same script in the same run.

Measures (issue 3): time to first step vs `torchrun --standalone` (target <= 1.2x); first
step with --nnodes 1:3 (ours vs torchrun's default rendezvous settings); time to resume after
scale-up, scale-down, a worker crash, a preemption and a node loss (target <= 3 s each on 2 cores, #16);
steps lost per event (target <= 1 with a commit every step); report() cost (target <= 20 us);
async vs sync checkpoint overhead for a ~10M-parameter model (target <= 10 % async); event
latency from report() to job.metrics (target p95 <= 100 ms); CPU the kernel and the
supervisor spend streaming.
usage: python benchmarks/local_backend.py [--quick]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from _common import median, p95, report, row, stop_all_jobs  # noqa: E402

import notebook_elastic as ne  # noqa: E402
import notebook_elastic.kernel.launcher as launcher  # noqa: E402
import notebook_elastic.runtime as runtime  # noqa: E402
from notebook_elastic import pool  # noqa: E402
from notebook_elastic.contract import protocol  # noqa: E402
from notebook_elastic.contract.event_types import Kind  # noqa: E402

TRAIN = """
model = torch.nn.Linear(32, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), ws=elastic.world_size(), gen=state.generation)
    time.sleep(STEP_S)
"""

STREAM = """
import time as _t
for step in range(TOTAL):
    elastic.report(step=step, loss=1.0 / (step + 1))
    if step % BURST == 0:
        _t.sleep(0.001 * BURST * 1000 / RATE)
"""


def namespace(total: int, step_s: float, **extra) -> dict:
    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total, "STEP_S": step_s, **extra}


class Clock:
    """Records when metric events reach the kernel."""

    def __init__(self, job) -> None:
        self.arrivals: list[tuple[float, dict]] = []
        self.first = threading.Event()
        job.on_event(self._on)

    def _on(self, event, job) -> None:
        if event.kind == Kind.METRIC:
            self.arrivals.append(
                (time.time(), {**event.data.get("values", {}), "step": event.data.get("step"), "t": event.time})
            )
            self.first.set()

    def first_after(self, t0: float, pred) -> tuple[float, dict] | None:
        for at, values in list(self.arrivals):
            if at >= t0 and pred(values):
                return at, values
        return None


def wait(pred, timeout=180.0, what=""):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def first_step_ours(nnodes: str, nproc: int, name: str) -> float:
    started = time.time()
    job = ne.launch(TRAIN, nnodes=nnodes, nproc_per_node=nproc, name=name, user_ns=namespace(20, 0.01))
    clock = Clock(job)
    wait(lambda: clock.first.is_set() or job.finished, what="first step")
    took = clock.arrivals[0][0] - started if clock.arrivals else float("nan")
    job.stop()
    return took


def first_step_torchrun(script: str, args: list[str], workdir: str) -> float:
    env = dict(os.environ, NOTEBOOK_ELASTIC_CHECKPOINT_DIR=os.path.join(workdir, "ckpt-torchrun"))
    shutil.rmtree(env["NOTEBOOK_ELASTIC_CHECKPOINT_DIR"], ignore_errors=True)
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args, script],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=workdir,
    )
    took = float("nan")
    for line in proc.stdout:
        if b'"kind":"metric"' in line:
            took = time.time() - started
            break
    proc.terminate()
    proc.wait()
    return took


def stop_time(rows: list[dict], runs: int) -> None:
    """job.stop() on a running 2-node x 2-proc job, until every process is gone (the test
    checks that stop leaves nothing; how fast it is lives here)."""
    took = []
    for n in range(runs):
        job = ne.launch(
            TRAIN, nnodes="1:2", nodes=2, nproc_per_node=2, name=f"bench-stop-{n}", user_ns=namespace(100000, 0.05)
        )
        wait(
            lambda job=job: job.world_size == 4 and job.status == "running" and (job.state.step or 0) >= 2,
            what="running",
        )
        started = time.monotonic()
        job.stop()
        took.append(time.monotonic() - started)
    rows.append(row("stop a running job, 2 nodes x 2 procs", median(took), "s", "<= 15 s", median(took) <= 15))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def warm_vs_cold(rows: list[dict], runs: int) -> None:
    """The same crash drill with workers forked from a warm zygote and started cold."""
    medians = {}
    for label, flag in (("cold (NOTEBOOK_ELASTIC_WARM_WORKERS=0)", "0"), ("warm (default)", "1")):
        os.environ["NOTEBOOK_ELASTIC_WARM_WORKERS"] = flag
        times = []
        for n in range(runs):
            job = ne.launch(
                TRAIN,
                nnodes="1",
                nproc_per_node=2,
                name=f"bench-warm{flag}-{n}",
                max_restarts=20,
                user_ns=namespace(100000, 0.02),
            )
            clock = Clock(job)
            wait(lambda: len(clock.arrivals) > 20, what="warm-up")  # noqa: B023
            for _ in range(2):
                gen = clock.arrivals[-1][1]["gen"]
                t0 = time.time()
                job.kill_worker()
                wait(lambda: clock.first_after(t0, lambda v: v["gen"] > gen) is not None, what="resume")  # noqa: B023
                times.append(clock.first_after(t0, lambda v: v["gen"] > gen)[0] - t0)  # noqa: B023
                time.sleep(1)
            job.stop()
        medians[flag] = median(times)
        rows.append(row(f"resume after a worker crash, 2 procs, {label}", medians[flag], "s"))
    os.environ.pop("NOTEBOOK_ELASTIC_WARM_WORKERS", None)
    rows.append(row("  warm starts: speed-up over cold starts", medians["0"] / medians["1"], "x"))


def resume_times(rows: list[dict], runs: int) -> None:
    """Scale up, scale down, kill a worker, preempt, lose a node: time to the next step."""
    results: dict[str, list[float]] = {
        k: [] for k in ("scale-up", "scale-down", "worker crash", "preemption", "node loss")
    }
    lost: dict[str, list[int]] = {k: [] for k in results}

    def measure(job, clock, label, action, pred):
        before = [v["step"] for _, v in clock.arrivals]
        t0 = time.time()
        action()
        wait(lambda: clock.first_after(t0, pred) is not None, what=label)
        at, values = clock.first_after(t0, pred)
        results[label].append(at - t0)
        resumed = [e.get("step") for e in job.events if e.kind == Kind.RESUMED and e.time >= t0]
        if resumed and before:
            lost[label].append(max(0, max(before) + 1 - resumed[0]))

    def one_run(n: int) -> None:
        job = ne.launch(
            TRAIN,
            nnodes="1:3",
            nproc_per_node=1,
            name=f"bench-resume-{n}",
            max_restarts=20,
            user_ns=namespace(100000, 0.02),
        )
        clock = Clock(job)
        wait(lambda: len(clock.arrivals) > 20, what="warm-up")
        measure(job, clock, "scale-up", lambda: job.scale(2), lambda v: v["ws"] == 2)
        time.sleep(1)
        measure(job, clock, "scale-down", lambda: job.scale(1), lambda v: v["ws"] == 1)
        time.sleep(1)
        gen = clock.arrivals[-1][1]["gen"]
        measure(job, clock, "worker crash", lambda: job.kill_worker(), lambda v: v["gen"] > gen)
        job.scale(3)
        wait(lambda: clock.arrivals[-1][1]["ws"] == 3, what="three nodes")
        time.sleep(1)
        newest = sorted(job.nodes, key=lambda name: int(name.split("-")[1]))
        measure(job, clock, "preemption", lambda: job.preempt_node(newest[-1]), lambda v: v["ws"] == 2)
        time.sleep(1)
        measure(job, clock, "node loss", lambda: job.lose_node(newest[-2]), lambda v: v["ws"] == 1)
        job.stop()

    for n in range(runs):
        one_run(n)
    for label, values in results.items():
        rows.append(
            row(f"resume after {label} (median of {len(values)})", median(values), "s", "<= 3 s", median(values) <= 3)
        )
    all_lost = [x for v in lost.values() for x in v]
    rows.append(
        row(
            "steps lost per event (worst, commit every step)",
            max(all_lost) if all_lost else float("nan"),
            "steps",
            "<= 1",
            bool(all_lost) and max(all_lost) <= 1,
        )
    )


def report_cost(rows: list[dict]) -> None:
    n = 200_000
    sink = open(os.devnull, "w")
    with redirect_stdout(sink):
        started = time.perf_counter()
        for i in range(n):
            runtime.report(step=i, loss=0.5, acc=0.25)
        took = time.perf_counter() - started
    us = took / n * 1e6
    rows.append(row("report() cost per call, 2 metrics, to a pipe-like sink", us, "us", "<= 20 us", us <= 20))


def checkpoint_overhead(rows: list[dict], workdir: str) -> None:
    """Commit every step of a ~10M-parameter model (+ Adam state): what the training thread
    pays. Async commit blocks only for the snapshot copy; the write itself still uses CPU
    and disk in the background, which on a CPU-only machine slows the step as well."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1800, 1800),
        torch.nn.ReLU(),
        torch.nn.Linear(1800, 1800),
        torch.nn.ReLU(),
        torch.nn.Linear(1800, 1800),
    )
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(256, 1800)

    def step():
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def timed(state, n=14):
        blocking, walls = [], []
        for i in range(n):
            started = time.perf_counter()
            step()
            mid = time.perf_counter()
            if state is not None:
                state.commit(step=i)
            end = time.perf_counter()
            blocking.append(end - mid)
            walls.append(end - started)
        if state is not None:
            state.flush()
        return median(blocking[2:]), median(walls[2:])

    with redirect_stdout(io.StringIO()):
        for _ in range(3):
            step()
        _, base = timed(None)
        os.environ[protocol.ENV_CHECKPOINT_DIR] = os.path.join(workdir, "ck-sync")
        sync_block, sync_wall = timed(State_(model, opt, async_commit=False))
        os.environ[protocol.ENV_CHECKPOINT_DIR] = os.path.join(workdir, "ck-async")
        async_block, async_wall = timed(State_(model, opt, async_commit=True))
    size = max(p.stat().st_size for p in __import__("pathlib").Path(workdir, "ck-async").glob("ckpt-*"))
    rows.append(row(f"training step, {params / 1e6:.1f}M-param MLP + Adam, no checkpoint", base * 1000, "ms"))
    rows.append(
        row(f"sync commit every step ({size / 1e6:.0f} MB): commit() blocks", sync_block / base * 100, "% of step")
    )
    rows.append(
        row(
            "async commit every step: commit() blocks (snapshot copy)",
            async_block / base * 100,
            "% of step",
            "<= 10 %",
            async_block / base <= 0.10,
        )
    )
    rows.append(
        row(
            "async, step + commit wall time vs no checkpoint (write shares 2 CPUs)",
            (async_wall / base - 1) * 100,
            "% slower",
        )
    )
    rows.append(row("sync, step + commit wall time vs no checkpoint", (sync_wall / base - 1) * 100, "% slower"))


def State_(model, opt, async_commit):
    return runtime.State(model=model, optimizer=opt, async_commit=async_commit, keep=1, checkpoint_every=1)


def latency_and_cpu(rows: list[dict]) -> None:
    # Event latency at a moderate rate, measured where the dashboard reads: job callbacks.
    job = ne.launch(TRAIN, nnodes="1", nproc_per_node=1, name="bench-latency", user_ns=namespace(600, 0.01))
    clock = Clock(job)
    job.wait(240)
    lat = [(at - v["t"]) * 1000 for at, v in clock.arrivals]
    rows.append(row(f"event latency report() -> job, p95 of {len(lat)}", p95(lat), "ms", "<= 100 ms", p95(lat) <= 100))
    rows.append(row("event latency, median", median(lat), "ms"))
    # CPU while a worker streams ~2,000 metrics/s.
    total, rate = 30000, 2000
    job = ne.launch(
        STREAM, nnodes="1", nproc_per_node=1, name="bench-stream", user_ns=namespace(total, 0, RATE=rate, BURST=20)
    )
    clock = Clock(job)
    wait(lambda: clock.first.is_set(), what="stream start")
    sup_pid = json.load(open(launcher.get_backend("local").folder("bench-stream").supervisor_file))["pid"]
    r0, s0, w0 = resource.getrusage(resource.RUSAGE_SELF), _proc_cpu(sup_pid), time.time()
    job.wait(240)
    r1, s1, w1 = resource.getrusage(resource.RUSAGE_SELF), _proc_cpu(sup_pid), time.time()
    wall = w1 - w0
    kernel = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / wall * 100
    got = len(clock.arrivals)
    rows.append(row(f"metrics streamed ({got} in {wall:.1f} s)", got / wall, "metrics/s"))
    rows.append(row("kernel CPU while streaming (follower + job state)", kernel, "% of a core"))
    if s0 is not None and s1 is not None:
        rows.append(row("supervisor CPU while streaming (parse + write)", (s1 - s0) / wall * 100, "% of a core"))


def _proc_cpu(pid: int) -> float | None:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    try:
        run()
    finally:
        stop_all_jobs()


def run() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one run each, skip torchrun's slow default rendezvous")
    args = parser.parse_args()
    runs = 1 if args.quick else 3
    workdir = tempfile.mkdtemp(prefix="ne-bench-")
    os.environ["NOTEBOOK_ELASTIC_HOME"] = os.path.join(workdir, "home")
    os.chdir(workdir)
    rows: list[dict] = []

    job = ne.launch(TRAIN, nnodes="1", nproc_per_node=2, name="bench-export", user_ns=namespace(20, 0.01), dry_run=True)
    script = os.path.join(workdir, "train.py")
    job.dryrun.bundle.write(script)
    # As a notebook has it after `%load_ext notebook_elastic`: the warm pool up and idle.
    pool_name = pool.ensure_pool()
    pool_pid = pool.wait_for(pool_name, 180) if pool_name else None
    ours, plain, no_pool = [], [], []
    for n in range(runs):
        plain.append(first_step_torchrun(script, ["--standalone", "--nproc-per-node", "2"], workdir))
        ours.append(first_step_ours("1", 2, f"bench-first-{n}"))
        os.environ[protocol.ENV_POOL_ON] = "0"
        try:
            no_pool.append(first_step_ours("1", 2, f"bench-nopool-{n}"))
        finally:
            os.environ.pop(protocol.ENV_POOL_ON)
    rows.append(row("first step: torchrun --standalone, 2 procs", median(plain), "s"))
    rows.append(
        row(
            "first step: notebook-elastic local, 1 node x 2 procs, warm pool",
            median(ours),
            "s",
            "<= 1.0 s",
            median(ours) <= 1.0,
        )
    )
    ratio = median(ours) / median(plain)
    rows.append(row("  ratio to plain torchrun", ratio, "x", "<= 1.2x", ratio <= 1.2))
    rows.append(row("first step: notebook-elastic local, no pool (NOTEBOOK_ELASTIC_WARM_POOL=0)", median(no_pool), "s"))
    rows.append(row("  speed-up from the warm pool", median(no_pool) / median(ours), "x"))
    elastic_ours = [first_step_ours("1:3", 2, f"bench-elastic-{n}") for n in range(runs)]
    rows.append(row("first step, --nnodes 1:3 (1 node started): notebook-elastic", median(elastic_ours), "s"))
    if not args.quick:
        port = free_port()
        store = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import torch.distributed as d, time; s=d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False, multi_tenant=True); time.sleep(600)",
            ]
        )
        time.sleep(2)
        try:
            slow = first_step_torchrun(
                script,
                [
                    "--nnodes",
                    "1:3",
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"127.0.0.1:{port}",
                    "--rdzv-conf",
                    "is_host=false",
                ],
                workdir,
            )
        finally:
            store.kill()
        rows.append(row("first step, --nnodes 1:3: torchrun's default rendezvous settings", slow, "s"))
        rows.append(row("  speed-up from our rendezvous settings", slow / median(elastic_ours), "x"))
    resume_times(rows, runs)
    stop_time(rows, runs)
    warm_vs_cold(rows, runs)
    report_cost(rows)
    checkpoint_overhead(rows, workdir)
    latency_and_cpu(rows)
    if pool_pid:
        os.kill(pool_pid, signal.SIGTERM)  # a notebook's pool would be reaped when idle
    report(
        "local_backend",
        rows,
        notes=f"{os.cpu_count()} CPUs, CPU-only torch {torch.__version__}, gloo; resume = action to the first step reported on the new world size",
    )
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

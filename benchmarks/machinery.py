"""When a job's own machinery fails: figures for the faults around torchrun (issue 18), and
what the bounded history costs and saves (issue 10).

- supervisor SIGKILL -> training again (the guardian resumes it): seconds, steps lost; beside it,
  in the same run, a crash of one worker (torchrun's own restart) as the baseline;
- SIGSTOP of one rank -> the stall event, with the production floor (30 s) and 10x the median
  step; the floor is the figure to read;
- history: events.jsonl bytes and attach (replay) time for a long job's history, full vs
  compacted (the rotation keeps status, membership and restarts exact; the chart downsampled).
usage: python benchmarks/machinery.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import DDP_TRAIN, ddp_namespace, median, report, row, stop_all_jobs  # noqa: E402

import notebook_elastic as ne  # noqa: E402
from notebook_elastic.backends.local import LocalBackend  # noqa: E402
from notebook_elastic.contract.event_types import Kind  # noqa: E402
from notebook_elastic.contract.events import Event  # noqa: E402
from notebook_elastic.contract.job_state import JobState  # noqa: E402
from notebook_elastic.jobfolder.history import compact  # noqa: E402


def wait(predicate, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark's job never got there")
        time.sleep(0.01)


def training_after(job, step: int):
    return lambda: job.status == "running" and job.state.step is not None and job.state.step > step


def supervisor_death(name: str) -> tuple[float, int]:
    job = ne.launch(DDP_TRAIN, nnodes="1:2", nodes=2, name=name, user_ns=ddp_namespace(100_000))
    try:
        wait(lambda: job.status == "running" and (job.state.step or 0) >= 20)
        folder = LocalBackend().folder(name)
        died_at = job.state.step
        os.kill(folder.supervisor()["pid"], signal.SIGKILL)
        killed = time.monotonic()
        wait(lambda: any(e.kind == Kind.RESUMED and e.get("generation", 0) >= 1_000_000 for e in job.events))
        wait(training_after(job, died_at))
        back = time.monotonic() - killed
        resumed = [e for e in job.events if e.kind == Kind.RESUMED and e.get("generation", 0) >= 1_000_000][0].get(
            "step"
        )
        return back, max(0, died_at + 1 - resumed)
    finally:
        job.stop()


def worker_crash(name: str) -> float:
    job = ne.launch(DDP_TRAIN, nnodes="1:2", nodes=2, name=name, user_ns=ddp_namespace(100_000))
    try:
        wait(lambda: job.status == "running" and (job.state.step or 0) >= 20)
        at = job.state.step
        job.kill_worker()
        killed = time.monotonic()
        wait(lambda: job.status != "running")
        wait(training_after(job, at + 1))
        return time.monotonic() - killed
    finally:
        job.stop()


def stall_detection(name: str) -> float:
    job = ne.launch(DDP_TRAIN, nproc_per_node=2, name=name, user_ns=ddp_namespace(100_000))
    try:
        wait(lambda: job.status == "running" and (job.state.step or 0) >= 20)
        pid = [e for e in job.events if e.kind == Kind.WORKER_STARTED and e.get("rank") == 1][-1].get("pid")
        os.kill(int(pid), signal.SIGSTOP)
        stopped = time.monotonic()
        wait(lambda: job.state.stall is not None, timeout=120)
        took = time.monotonic() - stopped
        os.kill(int(pid), signal.SIGCONT)
        return took
    finally:
        job.stop()


def history(points: int) -> dict:
    events = [Event(Kind.JOB_SUBMITTED, 0.0, None, {"nodes": 2, "min_nodes": 1, "max_nodes": 4, "max_restarts": 5})]
    for step in range(points):
        events.append(Event(Kind.METRIC, step * 0.1, "node-0", {"step": step, "values": {"loss": 1 / (step + 1)}}))
        if step % 100 == 0:
            events.append(Event(Kind.LOG, step * 0.1, "node-0", {"stream": "stdout", "text": f"epoch {step} " * 8}))
    kept = compact(events)
    out = {}
    for label, evs in (("full", events), ("compacted", kept)):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.writelines(e.to_line() + "\n" for e in evs)
            path = f.name
        started = time.perf_counter()
        state = JobState(max_restarts=5, nnodes=(1, 4))
        with open(path) as f:
            state.apply_all(Event.from_line(line) for line in f)
        out[label] = (os.path.getsize(path), time.perf_counter() - started)
        os.unlink(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one repetition each")
    args = parser.parse_args()
    reps = 1 if args.quick else 3
    os.environ.setdefault("NOTEBOOK_ELASTIC_HOME", tempfile.mkdtemp(prefix="ne-bench-machinery-"))
    rows = []
    try:
        deaths = [supervisor_death(f"sup-death-{i}") for i in range(reps)]
        crashes = [worker_crash(f"crash-{i}") for i in range(reps)]
        back = median([d[0] for d in deaths])
        crash = median(crashes)
        rows.append(row("supervisor SIGKILL -> training again (guardian)", back, "s", "<= 10 s", back <= 10))
        rows.append(row("  steps lost (commit every step)", max(d[1] for d in deaths), "steps", "<= 1", None))
        rows.append(row("  baseline: one worker SIGKILLed -> training again", crash, "s"))
        rows.append(row("  ratio supervisor death / worker crash", back / crash, "x"))
        stall = stall_detection("stalled")
        rows.append(
            row("SIGSTOP of one rank -> stall event (30 s floor)", stall, "s", "max(30 s, 10x step)", stall < 40)
        )
    finally:
        stop_all_jobs()
    for points in (10_000, 100_000):
        h = history(points)
        (fb, ft), (cb, ct) = h["full"], h["compacted"]
        rows.append(row(f"history of {points:,} metric points: events file", fb / 2**20, "MiB"))
        rows.append(row("  compacted", cb / 2**20, "MiB", "", None))
        rows.append(row("  attach replay, full", ft, "s"))
        rows.append(row("  attach replay, compacted", ct, "s", "<= 1 s", ct <= 1))
    report("machinery", rows, notes=json.dumps({"repetitions": reps}))


if __name__ == "__main__":
    main()

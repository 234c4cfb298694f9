"""Attaching to a long job: its history replayed into the notebook (issue 16 item 5).

A real job (2 simulated nodes, a scale-up and a scale-down) is run once; its events are the
templates of a synthetic history of H hours: a step reported every 0.1 s (loss and lr), its
checkpoint events, and its membership story (nodes joining and leaving, workers restarting,
agent lines) every 30 minutes. The history is written as the supervisor writes it: appended to
events.jsonl, rotated into the compacted events.1.jsonl past ROTATE_BYTES (the real rotate()).
Then ``ne.attach(name)`` replays it; the figure is the time until the job's state holds the
last step and its end. Two cases per size: the history as written (the current file holds what
came since the last rotation), and the same with the current file then filled with further steps
to just under ROTATE_BYTES (the worst case: the replay cost is bounded by the rotation size, not
by the hours). Target: <= 1 s for 10 h.

usage: python benchmarks/replay.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from _common import report, row, stop_all_jobs  # noqa: E402

import notebook_elastic as ne  # noqa: E402
import notebook_elastic.runtime as runtime  # noqa: E402
from notebook_elastic.backends.local import LocalBackend  # noqa: E402
from notebook_elastic.contract.event_types import Kind  # noqa: E402
from notebook_elastic.contract.events import Event  # noqa: E402
from notebook_elastic.jobfolder.history import ROTATE_BYTES, history_file, read_all, rotate  # noqa: E402

TRAIN = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), lr=0.01)
    time.sleep(0.05)
"""
STEP_S = 0.1  # a step reported every 0.1 s: 360,000 steps in 10 hours
STORY_EVERY_S = 1800.0  # a membership change (the real job's story) every 30 minutes
CHECKPOINT_EVERY_S = 10.0  # State's checkpoint events are coalesced to one per 10 s


def real_job(name: str) -> list[Event]:
    """A real job's events: start, scale up, scale down, end."""
    ns = {"torch": torch, "elastic": runtime, "time": time, "TOTAL": 80}
    job = ne.launch(TRAIN, nnodes="1:2", nproc_per_node=1, name=name, user_ns=ns)
    deadline = time.monotonic() + 180
    while (job.state.step or 0) < 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    job.scale(2)
    while (job.world_size != 2 or (job.state.step or 0) < 30) and time.monotonic() < deadline:
        time.sleep(0.1)
    job.scale(1)
    job.wait(180)
    return list(read_all(LocalBackend().folder(name).events_file))


def synthesize(real: list[Event], hours: float, events_file, stop_before_rotation: bool) -> dict:
    """Write ``hours`` of history into ``events_file`` as the supervisor would."""
    story = [e for e in real if e.kind not in (Kind.METRIC, Kind.CHECKPOINT, Kind.JOB_FINISHED)]
    checkpoint = next(e for e in real if e.kind == Kind.CHECKPOINT)
    finished = next(e for e in real if e.kind == Kind.JOB_FINISHED)
    metric_nodes = sorted({e.node for e in real if e.kind == Kind.METRIC and e.node})
    t0 = 1.7e9
    steps = int(hours * 3600 / STEP_S)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    fd = os.open(events_file, flags, 0o600)
    size = os.fstat(fd).st_size
    lines = 0
    rotations = 0
    chunk: list[str] = []

    def flush() -> None:
        nonlocal fd, size, rotations, chunk
        data = "".join(chunk).encode()
        chunk = []
        os.write(fd, data)
        size += len(data)
        if size > ROTATE_BYTES:
            os.close(fd)
            fd = rotate(events_file, flags)
            size = 0
            rotations += 1

    next_story = next_ckpt = 0.0
    for step in range(steps):
        t = step * STEP_S
        if t >= next_story:
            for e in story:
                chunk.append(Event(e.kind, t0 + t + (e.time - story[0].time) * 0.001, e.node, e.data).to_line() + "\n")
            next_story += STORY_EVERY_S
        if t >= next_ckpt:
            data = dict(checkpoint.data, step=step + 1)
            chunk.append(Event(Kind.CHECKPOINT, t0 + t, checkpoint.node, data).to_line() + "\n")
            next_ckpt += CHECKPOINT_EVERY_S
        values = {"loss": 1.0 / (1 + step * 1e-3) + 0.01 * ((step * 7919) % 13), "lr": 0.01}
        node = metric_nodes[0] if metric_nodes else "node-0"
        chunk.append(Event(Kind.METRIC, t0 + t, node, {"step": step, "values": values}).to_line() + "\n")
        lines += 1
        if len(chunk) >= 4096:
            flush()
    if chunk:
        flush()
    if stop_before_rotation:
        # Fill the current file to just under the threshold with further steps (the worst case).
        step = steps
        while size < ROTATE_BYTES - 4096:
            values = {"loss": 0.5, "lr": 0.01}
            data = (
                Event(Kind.METRIC, t0 + step * STEP_S, "node-0", {"step": step, "values": values}).to_line() + "\n"
            ).encode()
            os.write(fd, data)
            size += len(data)
            step += 1
        steps = step
    end = Event(Kind.JOB_FINISHED, t0 + steps * STEP_S + 1, None, finished.data)
    os.write(fd, (end.to_line() + "\n").encode())
    os.close(fd)
    hist = history_file(events_file)
    return {
        "steps": steps,
        "history_bytes": hist.stat().st_size if hist.exists() else 0,
        "current_bytes": events_file.stat().st_size,
        "rotations": rotations,
    }


def attach_time(name: str, last_step: int) -> float:
    started = time.perf_counter()
    job = ne.attach(name)
    while not (job.finished and job.state.step is not None and job.state.step >= last_step - 1):
        if time.perf_counter() - started > 120:
            raise RuntimeError(f"attach did not replay {name} in 120 s: {job.summary()}")
        time.sleep(0.002)
    took = time.perf_counter() - started
    job.detach()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="ne-bench-replay-")
    os.environ["NOTEBOOK_ELASTIC_HOME"] = home
    rows: list[dict] = []
    try:
        real = real_job("replay-template")
        folder = LocalBackend().folder("replay-template")
        hours_list = [1, 10] if args.quick else [0.5, 1, 2.5, 5, 10]
        for hours in hours_list:
            for before in (False, True):
                name = f"replay-{str(hours).replace('.', '-')}h-{'full' if before else 'fresh'}"
                target = LocalBackend().folder(name).path
                target.mkdir(parents=True, mode=0o700)
                for f in ("spec.json", "status.json", "manifest.json"):
                    if (folder.path / f).exists():
                        (target / f).write_bytes(
                            (folder.path / f).read_bytes().replace(b"replay-template", name.encode())
                        )
                shape = synthesize(real, hours, target / "events.jsonl", before)
                took = min(attach_time(name, shape["steps"]) for _ in range(2))
                case = "current file filled to its rotation size" if before else "as written"
                mb = (shape["history_bytes"] + shape["current_bytes"]) / 1e6
                ok = took <= 1.0 if hours == 10 else None
                rows.append(
                    row(
                        f"attach + replay, {hours:g} h ({shape['steps']:,} steps, {mb:.1f} MB on disk, {case})",
                        took,
                        "s",
                        "<= 1 s" if hours == 10 else "",
                        ok,
                    )
                )
    finally:
        stop_all_jobs()
    report("replay", rows, notes=f"{os.cpu_count()} cores; STEP_S={STEP_S}, a membership change every 30 min")


if __name__ == "__main__":
    main()

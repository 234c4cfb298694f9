"""How much State.commit() blocks the training loop (issue 16 item 3), as a share of the step.

A model whose training step takes ~5 ms on this CPU, and the ~10M-parameter model of
local_backend.py (a ~100 ms step): each trained with no checkpoint (the baseline, same run),
then committing at every step synchronously, at every step asynchronously (the old default:
a snapshot into reused buffers, written by a background thread), and with the interval State
chooses (the new default: after a save that blocked c seconds, the next waits until the loop
trained c / 0.10 seconds). Blocked share = time inside commit() / time outside it; the target
is <= 10 % for the default. Wall overhead = steps' wall time vs the baseline's.

usage: python benchmarks/checkpoint.py [--quick]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import tempfile
import time
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from _common import report, row  # noqa: E402

import notebook_elastic.runtime as runtime  # noqa: E402
from notebook_elastic.runtime import protocol  # noqa: E402

TARGET = 0.10


def mlp(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def run(model, opt, x, steps: int, folder: str | None, **state_kwargs) -> dict:
    """Train ``steps`` steps; with ``folder``, commit each through a State saving there."""
    state = None
    if folder is not None:
        os.environ[protocol.ENV_CHECKPOINT_DIR] = folder
        state = runtime.State(model=model, optimizer=opt, keep=1, **state_kwargs)
    blocked = trained = 0.0
    out = io.StringIO()
    with redirect_stdout(out):
        started = time.perf_counter()
        for i in range(steps):
            t0 = time.perf_counter()
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            t1 = time.perf_counter()
            if state is not None:
                state.commit(step=i)
            t2 = time.perf_counter()
            trained += t1 - t0
            blocked += t2 - t1
        if state is not None:
            state.flush()
        wall = time.perf_counter() - started
    saves = state._unannounced if state is not None else 0  # written since the last event
    for line in out.getvalue().splitlines():
        if line.startswith(protocol.EVENT_PREFIX) and '"kind":"checkpoint"' in line:
            saves += __import__("json").loads(line.split(" ", 1)[1])["commits"]
    return {"step_s": trained / steps, "blocked": blocked / trained, "wall": wall, "saves": saves}


def scenario(rows: list[dict], label: str, width: int, depth: int, batch: int, steps: int, workdir: str) -> None:
    torch.manual_seed(0)
    model = mlp(width, depth)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, width)
    params = sum(p.numel() for p in model.parameters())
    run(model, opt, x, 5, None)  # warm up (Adam's state exists from here on)
    base = run(model, opt, x, steps, None)
    modes = [
        ("sync, every step", dict(async_commit=False, checkpoint_every=1)),
        ("async, every step (old default)", dict(async_commit=True, checkpoint_every=1)),
        ("async, interval chosen (default)", dict(async_commit=True)),
    ]
    size_mb = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3 / 1e6
    rows.append(
        row(f"{label}: step, {params / 1e6:.2f}M params + Adam (~{size_mb:.0f} MB state)", base["step_s"] * 1000, "ms")
    )
    for name, kwargs in modes:
        got = run(model, opt, x, steps, os.path.join(workdir, f"{label}-{name}"), **kwargs)
        default = "chosen" in name
        rows.append(
            row(
                f"  {name}: commit() blocks",
                got["blocked"] * 100,
                "% of step",
                "<= 10 %" if default else "",
                got["blocked"] <= TARGET if default else None,
                digits=1,
            )
        )
        rows.append(
            row(f"  {name}: wall time vs no checkpoint", (got["wall"] / base["wall"] - 1) * 100, "% slower", digits=1)
        )
        rows.append(row(f"  {name}: saves / steps", got["saves"] / steps, "", digits=3))


def machine() -> str:
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown CPU"
    return f"{os.cpu_count()} cores, {cpu}, torch {torch.__version__}, no GPU used"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    args = parser.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ne-bench-ckpt-") as workdir:
        scenario(rows, "5 ms step", width=640, depth=3, batch=48, steps=150 if args.quick else 400, workdir=workdir)
        scenario(rows, "100 ms step", width=1800, depth=3, batch=256, steps=20 if args.quick else 40, workdir=workdir)
    report("checkpoint", rows, notes=f"machine: {machine()}")


if __name__ == "__main__":
    main()

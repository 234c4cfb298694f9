"""Shared helpers for the benchmarks: a results table and its JSON twin."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
# What the browser tests measure (never assert) lands here; the benchmarks show it.
BROWSER_FIGURES = Path(__file__).resolve().parent.parent / "test-artifacts"


#: A small DDP training cell the local-job benchmarks run (TOTAL steps of 20 ms each).
DDP_TRAIN = """
model = torch.nn.Linear(32, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item())
    time.sleep(0.02)
"""


def ddp_namespace(total: int) -> dict:
    """What DDP_TRAIN reads from the notebook."""
    import torch

    import notebook_elastic.runtime as runtime

    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total}


def browser_figures(name: str) -> dict | None:
    """The figures a browser test recorded in test-artifacts/NAME.json, if it has run."""
    path = BROWSER_FIGURES / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def report(name: str, rows: list[dict], notes: str = "") -> None:
    """Print rows as a table and write them to benchmarks/results/NAME.json."""
    columns = ["metric", "value", "unit", "target", "ok"]
    table = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(columns)]
    print()
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)))
    if notes:
        print(notes)
    RESULTS.mkdir(exist_ok=True)
    data = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": __import__("os").cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "rows": rows,
        "notes": notes,
    }
    try:
        import torch

        data["machine"]["torch"] = torch.__version__
    except ImportError:
        pass
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    print(f"wrote {path}")


def row(metric: str, value: float, unit: str, target: str = "", ok: bool | None = None, digits: int = 3) -> dict:
    return {
        "metric": metric,
        "value": round(value, digits) if isinstance(value, float) else value,
        "unit": unit,
        "target": target,
        "ok": "" if ok is None else ("yes" if ok else "NO"),
    }


def wait(predicate, what: str, timeout: float = 300) -> None:  # noqa: ANN001
    """Poll ``predicate`` until it holds; TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def stop_all_jobs() -> None:
    """Stop every local job of this benchmark's home, so a failed run leaves nothing behind."""
    from notebook_elastic.backends.local import LocalBackend

    backend = LocalBackend()
    for info in backend.list():
        try:
            backend.cancel(info.name)
        except Exception as exc:  # keep stopping the others
            print(f"could not stop {info.name}: {exc}")

"""Work lost per reclaim, with and without notice (issue 28 item 4), on the local backend.

A 2-node job (a 50 ms step) whose save takes SAVE_S seconds (0.1 and 5: a state object whose
``state_dict()`` takes that long), State choosing how often to save (under 10 % of the loop's
time: about every SAVE_S / 0.1 seconds). Once it trains at world size 2 it runs about 8 s
more, then node-1 is preempted:
- without notice (``grace_s=0``, the baseline: SIGTERM at once): the group falls back to the
  newest checkpoint;
- with notice (``grace_s=30``): rank 0 saves at the next step boundary, the node goes once
  the save is on disk, the group regroups at the saved step.
Figures: steps trained and then redone (rank 0's reports of one step by two worker groups),
seconds of work lost (redone steps x the step time), and from the preemption to the node gone.
On the Kubernetes fixture (its kubelet: SIGTERM to the container's first process, SIGKILL after
the pod's 30 s grace) the same, the pod evicted through the Eviction API: with notice (the
agent's keeper turns the SIGTERM into a save first) and without (the keeper switched off, as
before it existed: the agent stops at once).
usage: python benchmarks/notice.py [--no-fixture]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from _common import report, row, stop_all_jobs, wait  # noqa: E402

import notebook_elastic as ne  # noqa: E402
import notebook_elastic.runtime as runtime  # noqa: E402
from notebook_elastic.backends.local import LocalBackend  # noqa: E402
from notebook_elastic.contract.event_types import Kind  # noqa: E402

CELL = """
class SlowToSave:
    def state_dict(self):
        time.sleep(SAVE_S)
        return {}
    def load_state_dict(self, d):
        pass
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt, slow=SlowToSave())
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), gen=state.generation)
    time.sleep(STEP_S)
"""

STEP_S = 0.05


def reclaim(save_s: float, grace_s: float) -> dict:
    name = f"notice-{int(save_s * 1000)}ms-{int(grace_s)}"
    ns = {"torch": torch, "elastic": runtime, "time": time, "TOTAL": 100_000, "STEP_S": STEP_S, "SAVE_S": save_s}
    job = ne.launch(CELL, nnodes="1:2", nodes=2, name=name, user_ns=ns)
    try:
        wait(lambda: job.world_size == 2 and job.state.step is not None, "training at world size 2")
        at = job.state.step
        wait(lambda: job.state.step >= at + int(8 / STEP_S), "8 s more")
        taken = time.time()
        job.preempt_node("node-1", grace_s=grace_s)
        wait(lambda: any(e.kind == Kind.NODE_LEFT and e.node == "node-1" for e in job.events), "node-1 gone")
        gone = next(e.time for e in job.events if e.kind == Kind.NODE_LEFT and e.node == "node-1") - taken
        wait(lambda: job.world_size == 1 and job.status == "running", "training at world size 1")
        resumed_step = job.state.step
        wait(lambda: job.state.step >= resumed_step + 20, "20 steps at world size 1")
    finally:
        job.stop()
    gens: dict[int, set] = {}
    for line in LocalBackend().folder(name).events_file.read_text().splitlines():
        if '"kind":"metric"' in line:
            e = json.loads(line)
            gens.setdefault(e["step"], set()).add(e["values"]["gen"])
    return figures(job, sum(1 for g in gens.values() if len(g) > 1), gone)


def figures(job, redone: int, gone: float) -> dict:  # noqa: ANN001
    saved = [e for e in job.events if e.kind == Kind.SAVED_ON_NOTICE]
    return {
        "redone_steps": redone,
        "lost_s": redone * (job.state.step_time_s or STEP_S),
        "gone_s": gone,
        "saved_on_notice_s": saved[0].get("seconds") if saved else None,
    }


def reclaim_on_fixture(save_s: float, notice: bool) -> dict:
    """The same reclaim on the fixture: a worker pod evicted (the kubelet's SIGTERM, its grace)."""
    name = f"pods-{int(save_s * 1000)}ms-{'notice' if notice else 'none'}"
    ns = {"torch": torch, "elastic": runtime, "time": time, "TOTAL": 100_000, "STEP_S": STEP_S, "SAVE_S": save_s}
    # Without notice: the keeper switched off (an empty grace), as before it existed.
    env = {} if notice else {"NOTEBOOK_ELASTIC_NOTICE_GRACE_S": ""}
    job = ne.launch(
        CELL, backend="kubernetes", nnodes="1:2", nodes=2, gpus=1, pvc="ckpt", name=name, env=env, user_ns=ns
    )
    try:
        wait(lambda: job.world_size == 2 and job.state.step is not None, "two pods training")
        at = job.state.step
        wait(lambda: job.state.step >= at + int(8 / STEP_S), "8 s more")
        taken = time.time()
        victim = job.preempt_node()["node"]
        wait(lambda: any(e.kind == Kind.NODE_LEFT and e.node == victim for e in job.events), "the pod gone")
        gone = next(e.time for e in job.events if e.kind == Kind.NODE_LEFT and e.node == victim) - taken
        wait(
            lambda: any(e.kind == Kind.RESUMED and e.time > taken for e in job.events) and job.status == "running",
            "training again",
        )
        resumed = next(e for e in job.events if e.kind == Kind.RESUMED and e.time > taken)
        series = job.metrics["loss"]
        redone = len({s for s, t in zip(series.steps, series.times) if t < resumed.time and s >= resumed.get("step")})
        return figures(job, redone, gone)
    finally:
        job.stop()


def fixture_rows(rows: list[dict]) -> None:
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from k8s_apiserver import FakeCluster
    from kubernetes_backend import _pvc

    cluster = FakeCluster(gpu_slots=4)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig(Path(os.environ["NOTEBOOK_ELASTIC_HOME"]) / "kubeconfig"))
    _pvc(cluster)
    try:
        for save_s in (0.1, 5.0):
            before, after = reclaim_on_fixture(save_s, False), reclaim_on_fixture(save_s, True)
            print(json.dumps({"fixture": True, "save_s": save_s, "before": before, "after": after}), flush=True)
            add(rows, f"fixture, save {save_s:g} s", before, after, "eviction")
    finally:
        cluster.close()


def add(rows: list[dict], label: str, before: dict, after: dict, how: str) -> None:
    rows.append(row(f"{label}: steps redone per reclaim, no notice (baseline)", before["redone_steps"], "steps"))
    rows.append(
        row(
            f"{label}: steps redone per reclaim, 30 s notice",
            after["redone_steps"],
            "steps",
            "0",
            after["redone_steps"] == 0,
        )
    )
    rows.append(row(f"{label}: work lost, no notice", before["lost_s"], "s"))
    rows.append(row(f"{label}: work lost, 30 s notice", after["lost_s"], "s"))
    rows.append(row(f"{label}: {how} -> node gone, no notice", before["gone_s"], "s"))
    rows.append(
        row(f"{label}: {how} -> node gone, 30 s notice (saved in {after['saved_on_notice_s']} s)", after["gone_s"], "s")
    )


def main() -> None:
    os.environ.setdefault("NOTEBOOK_ELASTIC_HOME", tempfile.mkdtemp(prefix="ne-bench-notice-"))
    rows: list[dict] = []
    try:
        for save_s in (0.1, 5.0):
            before = reclaim(save_s, 0.0)
            after = reclaim(save_s, 30.0)
            print(json.dumps({"save_s": save_s, "before": before, "after": after}), flush=True)
            add(rows, f"local, save {save_s:g} s", before, after, "preemption")
        if "--no-fixture" not in sys.argv:
            fixture_rows(rows)
    finally:
        stop_all_jobs()
    report(
        "notice",
        rows,
        notes=f"{os.cpu_count()} CPUs, torch {torch.__version__}, 2 nodes x 1 process, a {STEP_S * 1000:.0f} ms "
        "step, State choosing the save interval; local backend and the Kubernetes fixture.",
    )


if __name__ == "__main__":
    main()

"""What a pod that fails while joining costs a Kubernetes job that trains (#14 item 2).

On the loopback API server of tests/k8s_apiserver.py (real client, real torchrun agents,
rendezvous store and gloo workers), a job at 2 pods is scaled to 3, twice, each on a fresh
cluster, in the same run:
- ``healthy``: the baseline, the third pod joins and trains;
- ``broken``: index 2 lands on a node without the job's NIC (``GLOO_SOCKET_IFNAME=nosuch0``
  there only): its workers fail in ``init_process_group``, its agent sends it away and the
  others go on at 2 (before #14 item 2 the job failed here, its budget spent by the joiner).

Figures: the longest time without a step from the scale-up until training goes on at the final
size (the healthy nodes' pause), the time from the scale-up to training at the final size, the
restarts charged, the Job's size at the end. The ratio is broken / healthy for the pause.

usage: python benchmarks/joiner_eviction.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _common import report, row  # noqa: E402

TRAIN = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(4, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item())
    time.sleep(0.05)
"""


def measure(broken: bool) -> dict:
    import torch
    from k8s_apiserver import FakeCluster

    import notebook_elastic as ne
    import notebook_elastic.runtime as runtime
    from notebook_elastic.contract.event_types import Kind

    fake = FakeCluster(gpu_slots=0)
    os.environ["KUBECONFIG"] = str(fake.kubeconfig(Path(tempfile.mkdtemp(prefix="joiner-bench-")) / "kubeconfig"))
    claim = {
        "metadata": {"name": "ckpt"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    request = urllib.request.Request(
        fake.url + "/api/v1/namespaces/default/persistentvolumeclaims",
        data=json.dumps(claim).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer fake-token"},
    )
    urllib.request.urlopen(request).read()
    if broken:
        fake.node_env_by_index[2] = {"GLOO_SOCKET_IFNAME": "nosuch0"}
    name = "broken" if broken else "healthy"
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="2:3",
        nodes=2,
        nproc_per_node=1,
        gpus=0,
        pvc="ckpt",
        name=name,
        max_restarts=3,
        user_ns={"torch": torch, "elastic": runtime, "time": time, "TOTAL": 100_000},
    )
    steps: list[tuple[float, int | None]] = []  # (when, step) each time the step changes, polled

    def until(predicate, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if job.state.finished or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {job.summary()}")
            if not steps or steps[-1][1] != job.state.step:
                steps.append((time.time(), job.state.step))
            time.sleep(0.05)

    try:
        until(lambda: job.world_size == 2 and (job.state.step or 0) >= 5)
        scaled_at = time.time()
        job.scale(3)
        size = 2 if broken else 3
        if broken:
            until(lambda: any(e.kind == Kind.NODE_EVICTED for e in job.events))
        final = {}

        def training_at_size() -> bool:
            started = [e for e in job.events if e.kind == Kind.WORKER_STARTED and e.time > scaled_at]
            if broken:
                evicted = next(e for e in job.events if e.kind == Kind.NODE_EVICTED)
                started = [e for e in started if e.time > evicted.time]
            group = [e for e in started if e.get("world_size") == size]
            if group and "step" not in final:
                final["step"], final["at"] = job.state.step, group[0].time
            return bool(group) and job.state.step is not None and job.state.step >= final["step"] + 10

        until(training_at_size)
        if broken:
            until(lambda: job.state.target == 2)
        after = [(a, b) for a, b in zip(steps, steps[1:]) if b[0] > scaled_at]
        return {
            "pause_s": max(b[0] - a[0] for a, b in after),
            "to_final_size_s": final["at"] - scaled_at,
            "restarts": job.restarts,
            "target": job.state.target,
            "status": job.status,
        }
    finally:
        job.stop()
        fake.close()


def main() -> None:
    os.environ.setdefault("NOTEBOOK_ELASTIC_HOME", tempfile.mkdtemp(prefix="joiner-bench-home-"))
    healthy = measure(broken=False)
    broken = measure(broken=True)
    rows = [
        row("healthy joiner: longest time without a step", healthy["pause_s"], "s", digits=1),
        row("healthy joiner: scale-up -> training at 3", healthy["to_final_size_s"], "s", digits=1),
        row("broken joiner: longest time without a step", broken["pause_s"], "s", digits=1),
        row("broken joiner: scale-up -> training on at 2", broken["to_final_size_s"], "s", digits=1),
        row("pause, broken / healthy", broken["pause_s"] / healthy["pause_s"], "x", digits=2),
        row("broken joiner: restarts charged", broken["restarts"], "", "<= 1", broken["restarts"] <= 1),
        row(
            "broken joiner: job status, Job size at the end",
            f"{broken['status']}, {broken['target']}",
            "",
            "running, 2",
            broken["status"] == "running" and broken["target"] == 2,
        ),
    ]
    report(
        "joiner_eviction",
        rows,
        notes="fake cluster (tests/k8s_apiserver.py) on this machine; 2:3 nodes x 1 CPU process, gloo; the "
        "broken joiner's eviction waits a 3 s grace for the old members' own failures (agent/joiner.py)",
    )


if __name__ == "__main__":
    main()

"""The Kubernetes backend on the loopback API server of tests/k8s_apiserver.py (the real
`kubernetes` client over HTTP; its kubelet runs each pod's container as a real process).

1. A bug in the cell (`1 / 0` at step 3), 2 worker pods, --max-restarts 3: how long until
   the job is reported failed, how many worker pods and worker processes it took. Ours
   (the workers Job fails at once when a pod's agent has spent its restarts:
   podFailurePolicy FailJob on exit status 3) against the baseline of the same Job without
   that rule (a plain Indexed Job replaces failed pods up to backoffLimit), same run. The
   replacements' agents find the rendezvous closed (torchrun closes it when its budget is
   spent) and exit 1 at once, so the baseline costs pods more than time here; a real Job
   controller backs off 10 s, 20 s, 40 s... between replacements, and each new pod is
   scheduled and pulls its image, so on a cluster the baseline is slower still.
2. A worker pod deleted mid-training (the preemption drill): time until the job trains
   again on the survivors and on a replacement pod.

usage: python benchmarks/kubernetes_backend.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _common import median, report, row  # noqa: E402
from k8s_apiserver import FakeCluster  # noqa: E402

TRAIN = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(4, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    BUG
    state.commit()
    elastic.report(step=step, loss=loss.item())
    time.sleep(0.05)
"""


def _launch(code: str, name: str, max_restarts: int):
    """Two CPU worker pods (1:2) with checkpoints on the `ckpt` claim."""
    import notebook_elastic as ne

    return ne.launch(
        code,
        backend="kubernetes",
        nnodes="1:2",
        nodes=2,
        gpus=0,
        pvc="ckpt",
        name=name,
        max_restarts=max_restarts,
        user_ns=_namespace(100_000),
    )


def _namespace(total: int) -> dict:
    import torch

    import notebook_elastic.runtime as runtime

    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total}


def _pvc(cluster: FakeCluster) -> None:
    body = {
        "metadata": {"name": "ckpt"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    request = urllib.request.Request(
        cluster.url + "/api/v1/namespaces/default/persistentvolumeclaims",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {cluster.token}"},
    )
    urllib.request.urlopen(request).close()


def bug_in_the_cell(cluster: FakeCluster, name: str, fail_job: bool) -> dict[str, float]:
    from notebook_elastic.backends.kubernetes import manifests
    from notebook_elastic.contract.event_types import Kind

    original = manifests.workers_job

    def without_fail_job(*args, **kwargs):
        made = original(*args, **kwargs)
        rules = made["spec"]["podFailurePolicy"]["rules"]
        made["spec"]["podFailurePolicy"]["rules"] = [r for r in rules if r["action"] != "FailJob"]
        return made

    manifests.workers_job = original if fail_job else without_fail_job
    try:
        code = TRAIN.replace("BUG", "if step == 3:\n        1 / 0")
        start = time.monotonic()
        job = _launch(code, name, max_restarts=3)
        status = job.wait(600)
        took = time.monotonic() - start
        assert status == "failed", job.summary()
        starts = sum(1 for e in job.events if e.kind == Kind.WORKER_STARTED)
        pods = cluster.pods_created(f"app.kubernetes.io/instance={name},app.kubernetes.io/component=worker")
        job.stop()
        return {"seconds": took, "pods": pods, "worker_starts": starts}
    finally:
        manifests.workers_job = original


def preemption(cluster: FakeCluster, name: str) -> dict[str, float]:
    from notebook_elastic.contract.event_types import Kind

    job = _launch(TRAIN.replace("BUG", "pass"), name, max_restarts=10)
    _wait(lambda: job.world_size == 2 and (job.state.step or 0) >= 10, "two pods training", job)
    before = len(job.events)
    t0 = time.monotonic()
    job.preempt_node()

    def trained_on(world: int) -> bool:
        started = any(e.kind == Kind.WORKER_STARTED and e.get("world_size") == world for e in job.events[before:])
        return started and job.world_size == world and job.status == "running" and _stepped_since(job, t0)

    _wait(lambda: any(e.kind == Kind.NODE_LEFT for e in job.events[before:]), "the pod to go", job)
    _wait(lambda: job.status == "running" and _stepped_since(job, t0), "training again", job)
    resumed = time.monotonic() - t0
    _wait(lambda: trained_on(2), "the replacement pod in the job", job)
    regrown = time.monotonic() - t0
    job.stop()
    return {"resumed": resumed, "regrown": regrown}


def _stepped_since(job, t0_monotonic: float) -> bool:
    """A metric arrived after t0 (event times are wall clock)."""
    since = time.time() - (time.monotonic() - t0_monotonic)
    series = job.metrics["loss"] if "loss" in job.metrics else None
    return bool(series and series.times[-1] > since + 0.5)


def _wait(predicate, what: str, job, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {job.summary()}")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ne-bench-k8s-"))
    os.environ["NOTEBOOK_ELASTIC_HOME"] = str(home / "ne-home")
    cluster = FakeCluster(gpu_slots=4)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig(home / "kubeconfig"))
    _pvc(cluster)
    ours, base, drills = [], [], []
    try:
        for i in range(args.repeat):
            ours.append(bug_in_the_cell(cluster, f"bug-ours-{i}", fail_job=True))
            base.append(bug_in_the_cell(cluster, f"bug-base-{i}", fail_job=False))
            drills.append(preemption(cluster, f"preempt-{i}"))
            print(f"round {i + 1}/{args.repeat}: ours {ours[-1]}, baseline {base[-1]}, preemption {drills[-1]}")
    finally:
        cluster.close()
    ours_s, base_s = median([r["seconds"] for r in ours]), median([r["seconds"] for r in base])
    rows = [
        row("bug in the cell -> reported failed (ours)", ours_s, "s"),
        row("bug in the cell -> reported failed (Job without FailJob)", base_s, "s"),
        row("time to failure, ours / baseline", ours_s / base_s, "x", "< 1", ours_s < base_s),
        row(
            "worker pods created (ours / baseline)",
            f"{median([r['pods'] for r in ours]):g} / {median([r['pods'] for r in base]):g}",
            "",
        ),
        row(
            "worker processes started (ours / baseline)",
            f"{median([r['worker_starts'] for r in ours]):g} / {median([r['worker_starts'] for r in base]):g}",
            "",
        ),
        row("worker pod deleted -> training again on the survivor", median([d["resumed"] for d in drills]), "s"),
        row("worker pod deleted -> replacement pod training in the job", median([d["regrown"] for d in drills]), "s"),
    ]
    report(
        "kubernetes_backend",
        rows,
        notes=f"median of {args.repeat}; loopback API server + process kubelet (tests/k8s_apiserver.py), gloo on CPU; "
        "2 worker pods x 1 process, --max-restarts 3; the fixture's Job controller recreates pods without back-off",
    )


if __name__ == "__main__":
    main()

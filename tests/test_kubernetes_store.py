"""The rendezvous store on the torch versions images carry (#17 defect 0): torch's libuv
TCPStore refuses a listen fd before 2.7, so there the store uses the legacy server.

Only torch 2.13 can be installed on this machine (the package index holds 2.13.0 and
2.14.1), so the torch-2.5 path is exercised by pinning the version the adapter sees: the
legacy server it then picks is real and serves real clients."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist
from test_kubernetes_backend import TRAIN, _post, cluster, ns  # noqa: F401 (cluster: the fixture)
from waiting import wait_for

import notebook_elastic as ne
from notebook_elastic.agent import torch_adapter
from notebook_elastic.backends.kubernetes import manifests as m
from notebook_elastic.backends.kubernetes.options import STORE_IMAGE
from notebook_elastic.contract.event_types import Kind

# What must hold on every torch of the declared range (scripts/torch_range.py).
pytestmark = pytest.mark.torch_contract


@pytest.mark.parametrize(
    ("version", "takes_fd"),
    [("2.4.1", False), ("2.5.1+cu124", False), ("2.6.0", False), ("2.7.0", True), ("2.13.0+cpu", True)],
)
def test_which_torch_versions_need_the_legacy_store(version, takes_fd):
    assert torch_adapter.libuv_store_takes_listen_fd(torch_adapter.torch_version(version)) is takes_fd


@pytest.mark.parametrize("seen", [(2, 5), None])
def test_the_store_serves_clients_on_a_listen_fd(monkeypatch, seen):
    if seen is not None:
        monkeypatch.setattr(torch_adapter, "torch_version", lambda text=None: seen)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    host, port = sock.getsockname()
    server = torch_adapter.tcp_store_server(sock, timeout_s=10)
    if seen == (2, 5):
        assert server.libuvBackend is False  # what torch 2.5 needs for a listen fd
    client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert server.get("k") == b"v"
    del client, server
    sock.detach()  # the store owned the descriptor and closed it


# -- the store under a controller, its loss survived (#17 item 5) ----------------------------


def _reports_once(job) -> tuple[dict[int, int], list[int]]:
    """The generation that last reported each step, and the steps no generation reported.
    A step may go unreported only as the last of its generation (committed, then the
    workers were restarted before the report): resuming repeats none and skips none."""
    newest: dict[int, int] = {}
    for step, gen in job.metrics["gen"].points():
        newest[int(step)] = max(int(gen), newest.get(int(step), int(gen)))
    missing = sorted(set(range(max(newest) + 1)) - set(newest))
    return newest, missing


@pytest.mark.slow
@pytest.mark.parametrize("how", ["deleted", "evicted"])
def test_a_job_survives_the_loss_of_its_store_pod(cluster, how):  # noqa: F811 (the fixture)
    """The store runs under a one-replica Deployment: its pod deleted (or evicted, as a drain
    does) is replaced, and the agents, whose store client never reconnects by itself (torch
    2.13: every call raises DistNetworkError once its server is gone, even when a new one
    serves at the same address), re-form their round on the new, empty store: a membership
    change, not a failure. Old code: a bare store pod, never replaced, and every agent failed
    on its next rendezvous sync."""
    name = f"store-{how}"
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1:2",
        nodes=2,
        nproc_per_node=1,
        gpus=0,
        pvc="ckpt",
        name=name,
        max_restarts=1,
        checkpoint_every=1,  # "resumed from the step it was at" is every-step saving's bound
        user_ns=ns(),
    )
    wait_for(lambda: job.world_size == 2 and (job.state.step or 0) >= 5, "two pods training", job=job)
    (store,) = cluster.pods(selector=m.selector(name, "rendezvous"))
    # The store on a small Python image, which the fake cluster runs without site-packages
    # (no torch): the agents and their workers above meet through the standard-library server.
    assert store["spec"]["containers"][0]["image"] == STORE_IMAGE
    assert "-S" in cluster.containers[store["metadata"]["uid"]].proc.args
    workers_before = set(job.nodes)
    round_before = max(e.get("round") for e in job.events if e.kind == Kind.RENDEZVOUS)
    path = f"/api/v1/namespaces/default/pods/{store['metadata']['name']}"
    if how == "deleted":
        _post(cluster, path, {}, method="DELETE")
    else:
        _post(
            cluster,
            path + "/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": store["metadata"]["name"]}},
        )
    step = job.state.step or 0

    def regrouped() -> bool:
        # Each agent sees its store connection fail and forms a round on the new store; the
        # workers stay in place (or, where they cannot, restart, not charged either). Both meet
        # in a later round on the new store.
        assert job.status not in ("failed", "succeeded", "stopped"), job.summary()  # old code: failed
        replaced = [e for e in job.events if e.kind == Kind.RESTART and e.get("reason") == "store_replaced"]
        replaced += [e for e in job.events if e.kind == Kind.IN_PLACE and e.get("reason") == "store"]
        latest = {e.node: e.get("round") for e in job.events if e.kind == Kind.RENDEZVOUS}
        return (
            bool(replaced)
            and all(latest.get(n, -1) > round_before for n in workers_before)
            and job.world_size == 2
            and job.status == "running"
            and (job.state.step or 0) > step + 5
            and any(e.kind in (Kind.RESUMED, Kind.IN_PLACE) for e in job.events)
        )

    wait_for(regrouped, "both agents re-formed their round on the new store and trained on", timeout=300, job=job)
    lost = [e for e in job.events if e.kind == Kind.STORE_LOST]
    assert lost and lost[0].get("reason") == how, lost
    (new_store,) = [
        p for p in cluster.pods(selector=m.selector(name, "rendezvous")) if not p["metadata"].get("deletionTimestamp")
    ]
    assert new_store["metadata"]["uid"] != store["metadata"]["uid"]
    assert new_store["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    # Not a failure: no restart charged, no worker pod lost or replaced, the Job untouched.
    assert job.restarts == 0 and not [
        e for e in job.events if e.kind == Kind.RESTART and e.get("reason") == "worker_failed"
    ]
    assert set(job.nodes) == workers_before and not [e for e in job.events if e.kind == Kind.NODE_LEFT]
    workers = cluster.get("jobs", f"{name}-workers", gv="batch/v1")
    assert workers["status"].get("failed", 0) == 0, workers["status"]
    assert job.state.membership_changes >= 1  # a regroup (in place: one change of the whole group)
    # Trained on from the step it was at (in place), or from the latest checkpoint in a later
    # generation: every step once.
    resumed = [e for e in job.events if e.kind in (Kind.RESUMED, Kind.IN_PLACE)]
    assert resumed and resumed[-1].get("step") >= step
    job.stop()
    newest, missing = _reports_once(job)
    for s in missing:
        assert s + 1 in newest and newest[s + 1] > newest.get(s - 1, -1), (s, missing)

"""A pod that fails while joining a job that trains on Kubernetes (#14 item 2): no supervisor
watches a cluster's nodes, so the agents decide from the rendezvous store, and the job must
go on at its size. Real `kubernetes` client, the loopback API server, real torchrun agents,
rendezvous store and gloo workers (tests/k8s_apiserver.py's kubelet runs pods as processes)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from k8s_apiserver import FakeCluster
from test_kubernetes_backend import TRAIN, ns  # the same training cell
from waiting import wait_for

import notebook_elastic as ne
from notebook_elastic.contract.event_types import Kind

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path, monkeypatch, home):
    fake = FakeCluster(gpu_slots=0)
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
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
    with urllib.request.urlopen(request) as answer:
        assert answer.status == 201
    yield fake
    fake.close()


def evictions(job):
    return [e for e in job.events if e.kind == Kind.NODE_EVICTED]


def test_a_pod_whose_workers_fail_while_joining_is_sent_away_and_the_job_trains_on(cluster, no_leftovers):
    # Index 2 lands on a node whose network interface is not where the job says: gloo (like
    # NCCL on a broken node) fails in init_process_group there only. Before, its agent retried
    # until its budget was spent and then closed the rendezvous on the healthy pods: the job
    # failed.
    cluster.node_env_by_index[2] = {"GLOO_SOCKET_IFNAME": "nosuch0"}
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="2:3",
        nodes=2,
        nproc_per_node=1,
        gpus=0,
        pvc="ckpt",
        name="joiner",
        max_restarts=3,
        user_ns=ns(),
    )
    wait_for(
        lambda: job.world_size == 2 and (job.state.step or 0) >= 5,
        "two pods training",
        timeout=240,
        job=job,
        give_up_when_finished=True,
    )
    healthy = {e.node for e in job.events if e.kind == Kind.NODE_JOINED}
    job.scale(3)
    wait_for(lambda: evictions(job), "the third pod to be sent away", timeout=240, job=job, give_up_when_finished=True)
    evicted = evictions(job)[0]
    assert evicted.node not in healthy and "-workers-2-" in evicted.node, evicted.describe()
    assert "nosuch0" in evicted.get("failure"), evicted.describe()  # the timeline says why
    assert evicted.get("target") == 2
    at_eviction = job.state.step
    # The healthy pods regroup without it, at their size, and train on.
    wait_for(
        lambda: job.status == "running" and job.world_size == 2 and job.state.step >= at_eviction + 10,
        "training to go on at 2",
        timeout=240,
        job=job,
        give_up_when_finished=True,
    )
    # The Job goes back to the size it had without it (else its controller would replace the pod
    # on the same node, to fail the same way again and again).
    wait_for(
        lambda: job.state.target == 2,
        "the job's target to return to 2",
        timeout=240,
        job=job,
        give_up_when_finished=True,
    )
    assert cluster.get("jobs", "joiner-workers", gv="batch/v1")["spec"]["parallelism"] == 2
    assert all("-workers-2-" in e.node for e in evictions(job)), [e.describe() for e in evictions(job)]
    left = [e for e in job.events if e.kind == Kind.NODE_LEFT]
    assert {e.node for e in left} & healthy == set(), [e.describe() for e in left]
    assert next(e for e in left if e.node == evicted.node).get("reason") == "evicted"
    # Charged once (its first failure), not once per retry until spent.
    assert job.restarts <= 1, job.summary()
    assert job.status == "running"
    # Not the Job's failure: the controller counted none, and the Job is not Failed.
    made = cluster.get("jobs", "joiner-workers", gv="batch/v1")
    assert not [c for c in made["status"].get("conditions", []) if c["type"] == "Failed"], made["status"]
    assert made["status"].get("failed", 0) == 0, made["status"]
    job.stop()

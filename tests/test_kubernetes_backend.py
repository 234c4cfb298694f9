"""The Kubernetes backend end to end: the real `kubernetes` client over HTTP against our
loopback API server (tests/k8s_apiserver.py), whose kubelet runs each pod's container as a
real process: the rendezvous store, torchrun agents, gloo workers."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import torch
from conftest import TEST_ID_ENV, cmdline, events_breaking_contract, processes_with_env
from k8s_apiserver import FakeCluster
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.backends.kubernetes import KubernetesBackend
from notebook_elastic.backends.kubernetes import manifests as m
from notebook_elastic.contract import protocol
from notebook_elastic.contract.event_types import Kind

pytestmark = pytest.mark.slow

TRAIN = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(4, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), ws=elastic.world_size(), gen=state.generation)
    time.sleep(0.05)
"""


def ns(total=100_000):
    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total}


@pytest.fixture
def cluster(tmp_path, monkeypatch, home):
    fake = FakeCluster(gpu_slots=2, namespaces=("default", "ml"))
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    add_checkpoint_claim(fake)
    yield fake
    fake.close()


def add_checkpoint_claim(fake) -> None:
    """The "ckpt" PersistentVolumeClaim the jobs keep their checkpoints on."""
    status, _ = _post(
        fake,
        "/api/v1/namespaces/default/persistentvolumeclaims",
        {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    assert status == 201


def _post(fake, path, body, method="POST"):
    import urllib.request

    req = urllib.request.Request(
        fake.url + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json", "Authorization": "Bearer fake-token"},
    )
    with urllib.request.urlopen(req) as resp:
        return resp.status, json.loads(resp.read())


def test_spot_story_on_the_fake_cluster(cluster, no_leftovers):
    """Launch 1:3 on 2 GPU slots; a worker pod is reclaimed mid-training and the job goes on;
    scaling to 3 waits Pending (insufficient GPUs) until a slot frees up; stop leaves nothing."""
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1:3",
        nodes=2,
        nproc_per_node=1,
        gpus=1,
        pvc="ckpt",
        name="spot",
        max_restarts=10,
        checkpoint_every=1,  # the resume below is bounded by the last reported step: save every step
        user_ns=ns(),
    )
    wait_for(
        lambda: job.world_size == 2 and job.state.step is not None and job.state.step >= 10,
        "two pods training",
        job=job,
    )
    joined = {e.node for e in job.events if e.kind == Kind.NODE_JOINED}
    assert len(joined) >= 2 and {n.split("-")[2] for n in joined} >= {"0", "1"}, joined  # spot-workers-INDEX-xxxxx
    # The pods are real processes that carry the test's marker (the leftover check finds them).
    pods = processes_with_env(f"{TEST_ID_ENV}={no_leftovers}")
    assert any("notebook_elastic" in cmdline(p) or "torch" in cmdline(p) for p in pods), [cmdline(p) for p in pods]
    (rdzv_before,) = [p["metadata"]["uid"] for p in cluster.pods(selector=m.selector("spot", "rendezvous"))]

    # A spot interruption: the scheduler reclaims one worker pod.
    victim = job.nodes[0]
    step_before = job.state.step
    cluster.preempt(victim)
    wait_for(
        lambda: any(e.kind == Kind.NODE_LEFT and e.node == victim for e in job.events),
        "the preempted pod to leave",
        job=job,
    )
    left = next(e for e in job.events if e.kind == Kind.NODE_LEFT and e.node == victim)
    assert left.get("reason") == "preempted"
    # The Job controller replaces it; the job keeps its step count and grows back to 2.
    wait_for(
        lambda: (
            job.status == "running"
            and job.world_size == 2
            and {e.node for e in job.events if e.kind == Kind.NODE_JOINED} - joined  # a new pod joined
            and any(e.kind in (Kind.RESUMED, Kind.IN_PLACE) and e.time > left.time for e in job.events)
        ),
        "the replacement pod",
        job=job,
    )
    # In place: the survivor kept its process and the replacement took its values; the step
    # count goes on from where it was.
    resumed = [e.get("step") for e in job.events if e.kind in (Kind.RESUMED, Kind.IN_PLACE)]
    assert resumed and resumed[-1] >= step_before
    assert [p["metadata"]["uid"] for p in cluster.pods(selector=m.selector("spot", "rendezvous"))] == [rdzv_before]

    # Scale to 3 with only 2 GPUs: the new pod waits, and says why.
    job.scale(3)
    wait_for(
        lambda: any(
            e.kind == Kind.PENDING and "Insufficient nvidia.com/gpu" in (e.get("message") or "") for e in job.events
        ),
        "the Pending reason",
        job=job,
    )
    pending = next(e for e in job.events if e.kind == Kind.PENDING)
    assert pending.get("reason") == "Unschedulable" and pending.node.startswith("spot-workers-2-")
    cluster.set_gpu_slots(3)  # the other team's job ended
    wait_for(lambda: job.world_size == 3 and job.status == "running", "three pods after a slot freed up", job=job)

    # Re-attach from a fresh "kernel": history from the pods' logs, then live events.
    again = ne.attach("spot", backend="kubernetes")
    wait_for(
        lambda: again.world_size == 3 and again.state.step is not None and again.state.step > job.state.step - 50,
        "the re-attached view",
        job=again,
    )
    assert any(e.kind == Kind.JOB_SUBMITTED for e in again.events)
    listed = {j.name: j for j in ne.jobs("kubernetes")}
    assert listed["spot"].status == "running" and listed["spot"].summary["nodes_running"] == 3

    assert job.stop() == "stopped"
    deadline = time.monotonic() + 60
    while cluster.all_objects() != [pvc for pvc in cluster.all_objects() if pvc["kind"] == "PersistentVolumeClaim"]:
        assert time.monotonic() < deadline, [o["metadata"]["name"] for o in cluster.all_objects()]
        time.sleep(0.2)
    assert not cluster.containers
    again.detach()


def test_a_finished_job_succeeds_and_logs_survive_dropped_connections(cluster):
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1:2",
        nodes=2,
        nproc_per_node=1,
        gpus=0,
        pvc="ckpt",
        name="short",
        user_ns=ns(total=120),
    )
    wait_for(lambda: job.state.step is not None and job.state.step >= 20, "training", job=job)
    dropped = cluster.drop_streams()
    assert dropped >= 3  # the pod watch and both log streams
    wait_for(lambda: len(cluster.streams) >= 3 or job.finished, "the follower to open its streams again", job=job)
    cluster.drop_streams()
    assert job.wait(240) == "succeeded", job.summary()
    reports = {}
    for point in zip(job.metrics["gen"].steps, job.metrics["gen"].values):
        reports.setdefault(point, 0)
        reports[point] += 1
    assert reports and max(reports.values()) == 1, "a log line was delivered twice"
    assert sorted({int(s) for s, _ in reports}) == list(range(120)), "a log line was lost"
    left = {e.node: e.get("reason") for e in job.events if e.kind == Kind.NODE_LEFT}
    assert set(left.values()) == {"finished"}, "\n".join(
        [e.describe() for e in job.events if e.kind != Kind.LOG][-40:] + job.logs[-60:]
    )


def test_errors_users_can_act_on(cluster, tmp_path, monkeypatch):
    cluster.deny("create", "jobs")
    with pytest.raises(
        ne.BackendError,
        match=r"your account may not create jobs\.batch in namespace 'default' \(403 Forbidden\).*Role in the documentation \(docs/how-to/rbac.md\)",
    ):
        ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=0, name="denied", user_ns=ns())
    deadline = time.monotonic() + 30
    while [o for o in cluster.all_objects() if o["kind"] != "PersistentVolumeClaim"]:  # nothing half-created is left
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cluster.denied.clear()

    with pytest.raises(ne.BackendError, match=r"namespace 'nope' does not exist"):
        ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=0, name="lost", user_ns=ns(), namespace="nope")
    with pytest.raises(ne.BackendError, match=r"--pvc 'missing': no such PersistentVolumeClaim"):
        ne.launch(TRAIN, backend="kubernetes", nnodes="1:2", gpus=0, name="nopvc", user_ns=ns(), pvc="missing")
    with pytest.raises(ne.BackendError, match=r"context 'prod' is not in .*; it has: fake"):
        ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=0, name="ctx", user_ns=ns(), context="prod")

    job = ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=0, name="taken", user_ns=ns(total=5))
    with pytest.raises(ne.BackendError, match=r'configmaps "taken-code" already exists.*choose another --name'):
        ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=0, name="taken", user_ns=ns())
    job.stop()

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-config"))
    with pytest.raises(ne.BackendError, match=r"no Kubernetes configuration: .*missing-config does not exist"):
        ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=0, name="nocfg", user_ns=ns())
    dead = FakeCluster()
    config = dead.kubeconfig(tmp_path / "dead-config")
    dead.close()
    monkeypatch.setenv("KUBECONFIG", str(config))
    with pytest.raises(ne.BackendError, match=r"API server at http://127\.0\.0\.1:\d+ is unreachable"):
        KubernetesBackend().list()


def test_more_errors_users_can_act_on(cluster, tmp_path, monkeypatch):
    # 401: stale credentials.
    cluster.token = "rotated"
    with pytest.raises(
        ne.BackendError, match=r"refused the credentials of context 'fake' \(401 Unauthorized\).*log in again"
    ):
        ne.jobs("kubernetes")
    cluster.token = "fake-token"
    # Quota: pods beyond the namespace's GPU quota are refused, clearly, and nothing is left.
    cluster.set_quota(0)
    with pytest.raises(
        ne.BackendError, match=r"resource quota is exceeded in namespace 'default': .*exceeded quota: gpu-quota"
    ):
        ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=1, name="quota", user_ns=ns(total=5), workload="pods")
    cluster.set_quota(None)
    deadline = time.monotonic() + 30
    while [o for o in cluster.all_objects() if o["kind"] != "PersistentVolumeClaim"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # A pytorchjob needs the Kubeflow operator's CRD.
    with pytest.raises(ne.BackendError, match=r"--workload pytorchjob needs the Kubeflow training operator"):
        ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=0, name="kubeflow", user_ns=ns(), workload="pytorchjob")
    cluster.crds.add("pytorchjobs.kubeflow.org")
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1:2",
        gpus=0,
        pvc="ckpt",
        name="kubeflow",
        user_ns=ns(),
        workload="pytorchjob",
    )
    made = cluster.get("pytorchjobs", "kubeflow-workers", gv="kubeflow.org/v1")
    assert (
        made["spec"]["elasticPolicy"]["maxReplicas"] == 2
        and made["metadata"]["ownerReferences"][0]["kind"] == "ConfigMap"
    )
    job.stop()
    assert cluster.get("pytorchjobs", "kubeflow-workers", gv="kubeflow.org/v1") is None


def test_a_missing_image_says_so_and_the_range_can_change(cluster):
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1",
        gpus=0,
        name="typo",
        image="registry.example/does-not-exist:1",
        user_ns=ns(),
    )
    wait_for(
        lambda: any(e.kind == Kind.PENDING and e.get("reason") == "ImagePullBackOff" for e in job.events),
        "ImagePullBackOff",
        job=job,
    )
    assert "does-not-exist" in next(e.get("message") for e in job.events if e.kind == Kind.PENDING)
    job.stop()

    job = ne.launch(
        TRAIN, backend="kubernetes", nnodes="1", gpus=0, pvc="ckpt", name="widen", max_restarts=5, user_ns=ns()
    )
    wait_for(lambda: job.world_size == 1 and (job.state.step or 0) >= 5, "one pod training", job=job)
    job.set_range(1, 2)  # new workers, in a new rendezvous epoch
    job.scale(2)
    wait_for(
        lambda: (
            job.world_size == 2
            and job.status == "running"
            and job.state.nnodes == (1, 2)
            and any(e.kind in (Kind.RESUMED, Kind.IN_PLACE) for e in job.events)
        ),
        "two pods in the new range",
        job=job,
    )
    resumed = [e for e in job.events if e.kind in (Kind.RESUMED, Kind.IN_PLACE)]
    assert resumed and resumed[-1].get("step") >= 5
    # A cluster job keeps no history on disk for the suite's contract check: its events are
    # checked here. The new range's scaled event carried its epoch as the annotation's text.
    assert any(e.kind == Kind.SCALED and e.get("reconfigured") for e in job.events)
    assert events_breaking_contract(job.events) == []
    job.stop()


def test_a_worker_pod_over_quota_is_told_and_joins_when_quota_frees(cluster):
    """Seed 000's over-quota story on a cluster: the Job controller may not create a second
    worker pod (the namespace's GPU quota is spent), so no pod exists to watch; the user
    learns it from the controller's FailedCreate Event, in the job and in the jobs list."""
    job = ne.launch(
        TRAIN, backend="kubernetes", nnodes="1:2", gpus=1, pvc="ckpt", name="quota-grow", max_restarts=5, user_ns=ns()
    )
    wait_for(lambda: job.world_size == 1 and (job.state.step or 0) >= 3, "one pod training", job=job)
    cluster.set_quota(1)
    job.scale(2)
    wait_for(
        lambda: any(e.kind == Kind.PENDING and e.get("reason") == "FailedCreate" for e in job.events),
        "the controller's refusal",
        job=job,
    )
    refused = [e for e in job.events if e.kind == Kind.PENDING and e.get("reason") == "FailedCreate"]
    assert len(refused) == 1, "a refusal the controller retries is told once"
    assert refused[0].node is None and "exceeded quota: gpu-quota" in refused[0].get("message")
    assert refused[0].describe().startswith("a worker pod could not be created: pods is forbidden: exceeded quota")
    assert "could not be created" in job.state.waiting and job.status == "running" and job.world_size == 1
    assert all(n.name != "?" for n in job.state.nodes.values())  # no phantom node for a pod that never was
    listed = {info.name: info for info in KubernetesBackend().list()}
    assert listed["quota-grow"].summary["waiting"].startswith("1 worker pod(s) could not be created: ")
    assert "limited: requests.nvidia.com/gpu=1" in listed["quota-grow"].summary["waiting"]

    cluster.set_quota(None)  # project B is done: the controller's next try succeeds
    wait_for(lambda: job.world_size == 2 and job.status == "running", "the second pod once quota frees", job=job)
    assert job.state.waiting is None
    job.stop()


def readme_role() -> list[dict]:
    """The `rules` of the minimal Role the documentation gives (docs/how-to/rbac.md)."""
    import re

    import yaml

    text = (Path(__file__).parent.parent / "docs" / "how-to" / "rbac.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        for doc in yaml.safe_load_all(block):
            if doc and doc.get("kind") == "Role":
                return doc["rules"]
    raise AssertionError("docs/how-to/rbac.md documents no Role")


def test_the_readme_role_is_enough_and_events_are_optional(cluster):
    """Everything a user does runs under exactly the README's Role; without its optional
    events rule the job still runs, it only cannot say why a pod was never created."""
    rules = readme_role()
    assert any("events" in r["resources"] for r in rules)
    # The PyTorchJob rule is optional too (only for --workload pytorchjob).
    rules = [r for r in rules if "pytorchjobs" not in r["resources"]]
    cluster.grant_only(rules)
    job = ne.launch(
        TRAIN, backend="kubernetes", nnodes="1:2", gpus=1, pvc="ckpt", name="least", max_restarts=5, user_ns=ns()
    )
    wait_for(lambda: job.world_size == 1 and (job.state.step or 0) >= 3, "one pod training", job=job)
    job.scale(2)
    wait_for(lambda: job.world_size == 2 and job.status == "running", "two pods", job=job)
    job.preempt_node()
    wait_for(lambda: any(e.kind == Kind.NODE_LEFT for e in job.events), "the preemption", job=job)
    assert [j.name for j in ne.jobs("kubernetes")] == ["least"]
    attached_at = job.state.step
    again = ne.attach("least", backend="kubernetes")
    wait_for(
        lambda: any(e.kind == Kind.JOB_SUBMITTED for e in again.events) and (again.state.step or 0) > attached_at,
        "the re-attached job's history, then live steps",
        job=again,
    )
    again.detach()
    job.stop()
    deadline = time.monotonic() + 60
    while left := [
        o["metadata"]["name"] for o in cluster.all_objects() if o["kind"] not in ("PersistentVolumeClaim", "Event")
    ]:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)
    assert not [(m, p) for m, p in cluster.forbidden if "/events" not in p], cluster.forbidden

    cluster.grant_only([r for r in rules if "events" not in r["resources"]])
    cluster.set_quota(1)
    job = ne.launch(
        TRAIN, backend="kubernetes", nnodes="1:2", nodes=2, gpus=1, pvc="ckpt", name="no-events", user_ns=ns()
    )
    wait_for(lambda: job.world_size == 1 and (job.state.step or 0) >= 3, "one pod training within quota", job=job)
    assert [p for _, p in cluster.forbidden if p.endswith("/events")], "the follower asked for events, was refused"
    assert job.state.waiting is None and job.status == "running"  # not told, and nothing broke
    listed = {info.name: info for info in KubernetesBackend().list()}
    assert listed["no-events"].status == "running"
    job.stop()


BUGGY = """
model = torch.nn.Linear(4, 1)
state = elastic.State(model=model)
for step in state.steps(TOTAL):
    if step == 3:
        1 / 0
    state.commit()
    elastic.report(step=step, loss=1.0)
    time.sleep(0.05)
"""


def failed_for_good(cluster, cell: str, name: str, max_restarts: int, exit_code: int):
    """Launch ``cell`` on two pods, wait for it to fail, and check that the Job failed at once
    on the agents' ``exit_code`` (podFailurePolicy FailJob): no pod replaced to fail again."""
    job = ne.launch(
        cell,
        backend="kubernetes",
        nnodes="1:2",
        nodes=2,
        gpus=0,
        pvc="ckpt",
        name=name,
        max_restarts=max_restarts,
        user_ns=ns(),
    )
    assert job.wait(240) == "failed", job.summary()
    workers = cluster.pods_created(f"app.kubernetes.io/instance={name},app.kubernetes.io/component=worker")
    assert workers == 2, "a pod was replaced only to fail the same way"
    made = cluster.get("jobs", f"{name}-workers", gv="batch/v1")
    failed = next(c for c in made["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy" and f"exit code {exit_code} " in failed["message"], failed
    return job


def test_a_bug_in_the_cell_fails_the_job_once_and_says_where(cluster):
    """A deterministic error: each pod's agent spends its restarts, then the Job fails at
    once (podFailurePolicy FailJob on our agent's exit status) instead of replacing pods
    that would fail the same way; the reason names the rank and the error; the finished
    job's rendezvous pod is released."""
    job = failed_for_good(cluster, BUGGY, "buggy", max_restarts=1, exit_code=protocol.EXIT_RESTARTS_SPENT)
    assert re.match(
        r"restart budget spent \(1/1\); rank \d on buggy-workers-\d-\w+ raised ZeroDivisionError: division by zero$",
        job.state.reason,
    ), job.state.reason
    assert "1 / 0" in job.failure.get("traceback")
    left = {e.get("reason") for e in job.events if e.kind == Kind.NODE_LEFT}
    assert "restart budget spent" in left, left
    deadline = time.monotonic() + 30
    while cluster.pods(selector=m.selector("buggy", "rendezvous")):  # released: a finished job holds no node
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert not any(e.kind == Kind.STORE_LOST for e in job.events)
    job.stop()


UNSAVEABLE = """
class Odd:
    pass
state = elastic.State(model=torch.nn.Linear(2, 1), odd=Odd())
for step in state.steps(TOTAL):
    state.commit()
"""


def test_a_failure_no_retry_can_mend_fails_the_job_at_once_spending_no_restart(cluster):
    """State that cannot be saved fails the same way at every retry: each pod's agent stops
    on its worker's own exit status instead of restarting, and the Job fails at once on it
    (podFailurePolicy FailJob), with the worker's sentence, not "restart budget spent"."""
    job = failed_for_good(cluster, UNSAVEABLE, "odd", max_restarts=5, exit_code=protocol.EXIT_FATAL)
    assert "State cannot save 'odd'" in job.state.reason and "budget" not in job.state.reason, job.state.reason
    # A late pod's join (a membership change, on a loaded machine) regroups without spending a
    # restart; any other restart would be the failure retried.
    spent = [e for e in job.events if e.kind == Kind.RESTART and e.get("reason") != "membership_change"]
    assert not spent, [e.describe() for e in job.events]
    left = {e.get("reason") for e in job.events if e.kind == Kind.NODE_LEFT}
    assert protocol.exit_reason(protocol.EXIT_FATAL) in left, left
    job.stop()


def test_bare_pods_that_failed_for_good_say_which_rank_failed_how(cluster):
    """--workload pods has no Job to fail: once every pod ended, the reason is still the
    worker's sentence (State that cannot be saved) or the spent budget with its root cause."""
    for cell, name, expected in (
        (UNSAVEABLE, "odd-pods", r"rank 0 on odd-pods-workers-\S+ raised StateNotSaveable: State cannot save 'odd'"),
        (
            BUGGY,
            "buggy-pods",
            r"restart budget spent \(1/1\); rank 0 on \S+ raised ZeroDivisionError: division by zero$",
        ),
    ):
        job = ne.launch(
            cell, backend="kubernetes", nnodes="1", gpus=0, name=name, max_restarts=1, workload="pods", user_ns=ns()
        )
        assert job.wait(240) == "failed", job.summary()
        assert re.match(expected, job.state.reason), job.state.reason
        job.stop()


READ_TOKEN = """
import hashlib, os, time
elastic.report(step=0, digest=int(hashlib.sha256(os.environ["HF_TOKEN"].encode()).hexdigest()[:12], 16))
time.sleep(600)  # until stopped
"""


def test_env_values_reach_the_pods_through_a_secret_only(cluster):
    """Under the README's Role: --env values go into the job's Secret (labelled and owned like
    its other objects), pods read them by secretKeyRef, no other object holds them, and stop
    deletes the Secret."""
    import hashlib

    token = "hf_" + "Wk4" * 12  # made up
    cluster.grant_only([r for r in readme_role() if "pytorchjobs" not in r["resources"]])
    job = ne.launch(
        READ_TOKEN,
        backend="kubernetes",
        nnodes="1",
        gpus=0,
        name="tokened",
        env={"HF_TOKEN": token},
        user_ns={"elastic": runtime},
    )
    wait_for(lambda: job.metrics.last("digest") is not None, "the worker's report", job=job)
    assert job.metrics.last("digest") == int(hashlib.sha256(token.encode()).hexdigest()[:12], 16)
    secret = cluster.get("secrets", "tokened-env")
    assert secret is not None and secret["metadata"]["labels"][m.INSTANCE] == "tokened"
    code = cluster.get("configmaps", "tokened-code")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == code["metadata"]["uid"]
    leaks = [o["kind"] for o in cluster.all_objects() if o["kind"] != "Secret" and token in json.dumps(o)]
    assert leaks == []
    assert token not in job.dryrun.text and token not in json.dumps(job.dryrun.request, default=str)
    # Someone deletes the Secret: a replacement pod cannot start, and the job says why.
    status, _ = _post(cluster, "/api/v1/namespaces/default/secrets/tokened-env", {}, method="DELETE")
    assert status == 200
    job.preempt_node()
    wait_for(
        lambda: any(e.kind == Kind.PENDING and e.get("reason") == "CreateContainerConfigError" for e in job.events),
        "the replacement pod's CreateContainerConfigError",
        job=job,
    )
    pending = next(e for e in job.events if e.kind == Kind.PENDING and e.get("reason") == "CreateContainerConfigError")
    assert 'secret "tokened-env" not found' in pending.get("message")
    assert job.stop() == "stopped"
    deletes = [r for r in cluster.requests if r == ("DELETE", "/api/v1/namespaces/default/secrets/tokened-env")]
    assert len(deletes) == 2  # ours above, and stop's: not left to garbage collection
    assert cluster.get("secrets", "tokened-env") is None
    assert not cluster.forbidden, cluster.forbidden


def test_names_are_refused_before_anything_is_created_and_a_pytorchjob_passes_the_webhook(cluster):
    """#17 defect 8, against the fixture that now refuses what a real server refuses."""
    from notebook_elastic.errors import SpecError

    before = {o["metadata"]["name"] for o in cluster.all_objects()}
    with pytest.raises(SpecError, match=r"starts with a digit"):
        ne.launch("print(1)", backend="kubernetes", nnodes="1", gpus=0, name="2024-run", user_ns={})
    assert {o["metadata"]["name"] for o in cluster.all_objects()} == before  # nothing created
    cluster.crds.add("pytorchjobs.kubeflow.org")
    backend = KubernetesBackend()
    from notebook_elastic.kernel.launcher import build_spec

    spec = build_spec(
        nnodes="1",
        nproc_per_node=1,
        name="ptj",
        backend="kubernetes",
        backend_options={"kubernetes": {"gpus": 0, "workload": "pytorchjob"}},
    )
    from notebook_elastic.packaging import NotebookContext, package_cell

    bundle = package_cell("print(1)", NotebookContext(namespace={}), name="ptj")
    backend.schedule(backend.submit_dryrun(spec, bundle))  # old code: the webhook's 422
    made = cluster.get("pytorchjobs", "ptj-workers", gv="kubeflow.org/v1")
    assert made["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] == "pytorch"
    backend.cancel("ptj")
    deadline = time.monotonic() + 60
    while any(o["metadata"]["name"].startswith("ptj") for o in cluster.all_objects() if o["kind"] != "Event"):
        assert time.monotonic() < deadline, [o["metadata"]["name"] for o in cluster.all_objects()]
        time.sleep(0.1)


def test_five_preemptions_on_max_restarts_1(cluster):
    """The spot story of notebooks/kubernetes.ipynb (#17 defect 7, "What must hold" 8):
    preempt_node evicts through the Eviction API (DisruptionTarget), so five reclaims on a
    job allowed one restart neither spend its budget nor the Job's backoffLimit. Old code: a
    plain DELETE ended each pod Failed, and the second one failed the Job."""
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1:2",
        nodes=2,
        nproc_per_node=1,
        gpus=0,
        pvc="ckpt",
        name="spot5",
        max_restarts=1,
        user_ns=ns(),
    )
    wait_for(lambda: job.world_size == 2 and (job.state.step or 0) >= 5, "two pods training", job=job)
    for n in range(1, 6):
        victim = job.preempt_node()["node"]
        wait_for(
            lambda victim=victim: any(e.kind == Kind.NODE_LEFT and e.node == victim for e in job.events),
            f"preemption {n} seen",
            job=job,
        )
        assert next(e for e in job.events if e.kind == Kind.NODE_LEFT and e.node == victim).get("reason") == "evicted"
        step = job.state.step or 0
        wait_for(
            lambda victim=victim, step=step: (
                job.world_size == 2 and victim not in job.nodes and (job.state.step or 0) > step + 3
            ),
            f"two pods training again after preemption {n}",
            timeout=300,
            job=job,
        )
    assert len(cluster.evictions) == 5
    workers = cluster.get("jobs", "spot5-workers", gv="batch/v1")
    assert workers["status"].get("failed", 0) == 0 and not workers["status"].get("conditions"), workers["status"]
    assert job.status == "running", job.summary()
    job.stop()


def test_a_job_that_ran_on_fewer_nodes_than_asked_succeeds(cluster):
    """#17 defect 6: 1:2 nodes asked, room for one (1 GPU slot, 1 GPU a pod). The run
    finishes on one node; the Pending index must not keep the Job open (old
    code: the Job never completed), and its late pod is terminated, not retried to failure."""
    cluster.set_gpu_slots(1)
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1:2",
        nodes=2,
        nproc_per_node=1,
        gpus=1,
        pvc="ckpt",
        name="fewer",
        user_ns=ns(total=60),
    )
    assert job.wait(300) == "succeeded", job.summary()
    workers = cluster.get("jobs", "fewer-workers", gv="batch/v1")
    types = {c["type"] for c in workers["status"]["conditions"]}
    assert {"SuccessCriteriaMet", "Complete"} <= types and "Failed" not in types, workers["status"]
    assert job.state.step == 59
    job.stop()


def test_the_workers_job_owns_everything_and_a_job_without_workers_is_expired(cluster):
    """#17 defects 5, 6: the TTL controller deletes only the Job; the ConfigMap, Service,
    Secret and the rendezvous pod (restartPolicy Always) must go with it. A job whose
    workers are gone reads `expired`, not `pending`."""
    from notebook_elastic.kernel.launcher import build_spec
    from notebook_elastic.packaging import NotebookContext, package_cell

    backend = KubernetesBackend()
    spec = build_spec(
        nnodes="1",
        nproc_per_node=1,
        name="ttl",
        backend="kubernetes",
        env={"TOKEN": "s3cret"},
        backend_options={"kubernetes": {"gpus": 0, "ttl_seconds_after_finished": 1}},
    )
    bundle = package_cell("print('done')", NotebookContext(namespace={}), name="ttl")
    backend.schedule(backend.submit_dryrun(spec, bundle))
    kinds = {o["kind"] for o in cluster.all_objects() if o["metadata"].get("labels", {}).get(m.INSTANCE) == "ttl"}
    assert {"ConfigMap", "Secret", "Service", "Deployment", "Job"} <= kinds, kinds
    deadline = time.monotonic() + 180
    while left := [o["kind"] for o in cluster.all_objects() if o["kind"] not in ("Event", "PersistentVolumeClaim")]:
        assert time.monotonic() < deadline, f"left after the TTL: {left}"  # old code: all but the Job
        time.sleep(0.1)

    job = ne.launch(TRAIN, backend="kubernetes", nnodes="1", gpus=0, name="gone", user_ns=ns())
    wait_for(lambda: (job.state.step or 0) >= 3, "training", job=job)
    job.detach()
    backend.submitter.own_code_by("gone", None)  # as a job made before this change: the ConfigMap owns all
    cluster._delete(("batch/v1", "jobs", "default", "gone-workers"), policy="Background")
    deadline = time.monotonic() + 120
    while cluster.pods(selector=m.selector("gone", "worker")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert {i.name: i.status for i in backend.list()}["gone"] == "expired"  # old code: pending
    backend.cancel("gone")


def test_the_panels_cluster_rows_show_restarts_step_and_loss_from_one_fold(cluster, tmp_path):
    """#12 item 3: one JobState fold serves both backends. The jobs panel's row of a cluster job
    (the server's registry, as GET /jobs serves it) gains restarts, step and loss, as a local
    job's row has them; the cluster's pod counts stay beside them."""
    from notebook_elastic.server.routes import Registry

    mark = tmp_path / "failed-once"
    flaky = (
        "    state.commit()\n"
        "    if step == 5 and not os.path.exists(MARK):\n"
        "        open(MARK, 'w').close()\n"
        "        raise ValueError('a flaky batch')\n"
    )
    job = ne.launch(
        TRAIN.replace("    state.commit()\n", flaky),
        backend="kubernetes",
        nnodes="1",
        nproc_per_node=1,
        gpus=0,
        pvc="ckpt",
        name="rows",
        max_restarts=3,
        user_ns={**ns(total=80), "os": os, "MARK": str(mark)},
    )
    registry = Registry()

    def row():
        infos, errors = registry.jobs()
        assert not errors, errors
        return next((i for i in infos if i.name == "rows"), None)

    try:
        wait_for(
            lambda: (
                (r := row()) is not None
                and r.summary.get("restarts") == 1
                and (r.summary.get("step") or 0) >= 10
                and r.summary.get("nodes_running") == 1
            ),
            "the panel's row to show the restart, the step and the running pod",
            job=job,
        )
        live = row()
        assert live.status == "running" and live.summary["loss"] is not None and live.summary["loss_tail"]
        assert live.summary["max_restarts"] == 3
        assert job.wait(240) == "succeeded", job.summary()
        wait_for(lambda: row().status == "succeeded", "the row to end", job=job)
        done = row()
        assert done.summary["step"] == 79 and done.summary["restarts"] == 1, done.summary
    finally:
        registry.close()

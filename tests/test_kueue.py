"""Kueue (--queue): the workers' Job queued as Kueue's webhook expects, what its Workload says
told in every view, a Kueue preemption as a notice, and scaling through workload slices, or
one sentence where the cluster has none. On the fixture's model of Kueue (tests/k8s_kueue.py),
whose objects pass Kueue's own CRDs (tests/data, release v0.19.2)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import torch
from k8s_apiserver import FakeCluster
from test_kubernetes_backend import TRAIN, add_checkpoint_claim
from test_kubernetes_manifests import make, strict
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.backends.kubernetes import grace as pod_grace
from notebook_elastic.backends.kubernetes import kueue
from notebook_elastic.backends.kubernetes import manifests as m
from notebook_elastic.contract.event_types import Kind
from notebook_elastic.errors import BackendError, SpecError
from notebook_elastic.runtime.state import NO_LIVE_VALUES

DATA = Path(__file__).parent / "data"


def crd_schema(plural: str) -> dict:
    crd = json.loads(gzip.decompress((DATA / f"kueue.x-k8s.io_{plural}.v0.19.2.json.gz").read_bytes()))
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the API server's own
    return schema


def user_ns(total: int = 100_000) -> dict:
    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total}


def kueue_cluster(tmp_path, monkeypatch, slices: bool) -> FakeCluster:
    fake = FakeCluster(gpu_slots=2, kueue=True, kueue_elastic_slices=slices)
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    add_checkpoint_claim(fake)
    return fake


@pytest.fixture
def queued(tmp_path, monkeypatch, home):
    fake = kueue_cluster(tmp_path, monkeypatch, slices=True)
    yield fake
    fake.close()


@pytest.fixture
def queued_without_slices(tmp_path, monkeypatch, home):
    fake = kueue_cluster(tmp_path, monkeypatch, slices=False)
    yield fake
    fake.close()


# -- the manifests ----------------------------------------------------------------------------


def test_a_queued_job_is_labelled_suspended_and_marked_elastic_and_passes_the_schemas():
    spec, bundle, k8s = make(nnodes="1:3", queue="team-a")
    job = m.build(spec, bundle, k8s, run_id="abcd")[-1]
    assert job["kind"] == "Job"
    assert job["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    assert job["metadata"]["annotations"][kueue.ELASTIC_ANNOTATION] == "true"
    assert job["spec"]["suspend"] is True  # as Kueue's webhook would make it: nothing runs before admission
    kubernetes_validate.validate(job, "1.31", strict=True)
    fixed = m.build(*make(nnodes="2", queue="team-a"), run_id="abcd")[-1]
    assert kueue.ELASTIC_ANNOTATION not in fixed["metadata"].get("annotations", {})  # a fixed size needs no slices
    unqueued = m.build(*make(nnodes="1:3"), run_id="abcd")[-1]
    assert "suspend" not in unqueued["spec"] and kueue.QUEUE_LABEL not in unqueued["metadata"]["labels"]


def test_a_queued_pytorchjob_is_suspended_through_its_run_policy():
    spec, bundle, k8s = make(workload="pytorchjob", nnodes="2:4", queue="team-a")
    job = m.build(spec, bundle, k8s, run_id="abcd")[-1]
    assert job["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    assert job["spec"]["runPolicy"]["suspend"] is True
    import yaml
    from test_kubernetes_manifests import CRD

    jsonschema.validate(
        job, strict(yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    )


def test_bad_queue_options_are_one_sentence_before_anything_is_built():
    with pytest.raises(SpecError, match="--queue needs a workload Kueue admits as one"):
        make(workload="pods", queue="team-a")
    with pytest.raises(SpecError, match="is not a valid Kubernetes name"):
        make(queue="Team A")
    with pytest.raises(SpecError, match="longer than 63 characters"):
        make(queue="q" * 64)


# -- what Kueue says, in our words -------------------------------------------------------------


def _wl(name, created, *conds, count=2, annotations=None, admission=None):
    return {
        "metadata": {"name": name, "creationTimestamp": created, "annotations": annotations or {}},
        "spec": {"podSets": [{"name": "main", "count": count}]},
        "status": {
            "conditions": [{"type": t, "status": s, "reason": r, "message": msg} for t, s, r, msg in conds],
            **({"admission": admission} if admission else {}),
        },
    }


def test_a_job_kueue_evicted_is_pending_while_its_pods_go_not_restarting():
    from notebook_elastic.contract.events import Event
    from notebook_elastic.contract.job_state import JobState

    state = JobState(nnodes=(1, 2))
    state.apply(Event(Kind.WORKER_STARTED, 1.0, "p-0", {"rank": 0, "local_rank": 0, "world_size": 2}))
    state.apply(Event(Kind.QUEUE, 2.0, None, {"queue": "q", "state": "evicted", "reason": "Preempted", "message": "m"}))
    state.apply(Event(Kind.PEER_LOST, 3.0, "p-1", {"round": 0, "lost": ["p-0"]}))  # the pods going, after
    state.apply(Event(Kind.NODE_LEFT, 3.1, "p-0", {"reason": "exited with code 143"}))
    assert state.status == "pending" and "preempted by Kueue" in state.waiting
    state.apply(Event(Kind.QUEUE, 4.0, None, {"queue": "q", "state": "admitted", "cluster_queue": "cq", "count": 2}))
    state.apply(Event(Kind.WORKER_STARTED, 5.0, "p-2", {"rank": 0, "local_rank": 0, "world_size": 2}))
    assert state.status == "running" and state.waiting is None


def test_the_workloads_state_is_the_newest_unfinished_ones():
    assert kueue.workload_state([]) is None
    waiting = _wl("a", "2026-01-01T00:00:00Z", ("QuotaReserved", "False", "Pending", "insufficient quota"))
    assert kueue.workload_state([waiting])["state"] == "waiting"
    admitted = _wl(
        "a",
        "2026-01-01T00:00:00Z",
        ("QuotaReserved", "True", "QuotaReserved", ""),
        ("Admitted", "True", "Admitted", ""),
        admission={"clusterQueue": "cq"},
        annotations={kueue.ELASTIC_ANNOTATION: "true"},
    )
    state = kueue.workload_state([admitted])
    assert (state["state"], state["cluster_queue"], state["elastic"]) == ("admitted", "cq", True)
    evicted = _wl("a", "2026-01-01T00:00:00Z", ("Evicted", "True", "Preempted", "higher priority"))
    assert kueue.workload_state([evicted])["reason"] == "Preempted"
    slice_ = _wl("b", "2026-01-01T00:01:00Z", ("QuotaReserved", "False", "Pending", "1 more needed"), count=3)
    state = kueue.workload_state([admitted, slice_])
    assert (state["state"], state["slice"], state["count"]) == ("waiting", True, 3)  # a scale-up waits
    finished = _wl("b", "2026-01-01T00:01:00Z", ("Finished", "True", "Succeeded", ""))
    assert kueue.workload_state([finished]) is None


# -- on the fixture's Kueue ----------------------------------------------------------------------


def test_a_queue_that_does_not_exist_or_a_cluster_without_kueue_is_refused_before_anything_is_created(
    queued, tmp_path, monkeypatch
):
    queued.kueue.add_queue("team-a", gpus=2)
    with pytest.raises(BackendError, match=r"no LocalQueue of that name in namespace 'default' \(there: team-a\)"):
        ne.launch(
            TRAIN, backend="kubernetes", nnodes="1:2", gpus=1, pvc="ckpt", name="lost", queue="nope", user_ns=user_ns()
        )
    assert not [o for o in queued.all_objects() if o["kind"] not in ("PersistentVolumeClaim", "LocalQueue")]
    plain = FakeCluster(gpu_slots=2)
    try:
        monkeypatch.setenv("KUBECONFIG", str(plain.kubeconfig(tmp_path / "plain")))
        with pytest.raises(BackendError, match=r"this cluster has no Kueue \(no kueue.x-k8s.io API\)"):
            ne.launch(TRAIN, backend="kubernetes", gpus=1, name="lost", queue="team-a", user_ns=user_ns())
        assert not plain.all_objects()
    finally:
        plain.close()


def validate_kueue_objects(cluster):
    """Every Workload and LocalQueue the fixture made passes Kueue's CRD, strictly."""
    schemas = {"Workload": crd_schema("workloads"), "LocalQueue": crd_schema("localqueues")}
    checked = 0
    for obj in cluster.all_objects():
        if obj["kind"] in schemas:
            jsonschema.validate(obj, schemas[obj["kind"]])
            checked += 1
    return checked


@pytest.mark.slow
def test_queued_admitted_preempted_readmitted_and_no_step_lost(queued, tmp_path):
    """A 2-node job in a queue of 1 GPU waits, and every view says for what; given quota it is
    admitted and trains; a workload of higher priority preempts it: the pods get the kubelet's
    SIGTERM, the job saves on that notice, and waits; readmitted, it resumes from that save."""
    queued.kueue.add_queue("team-a", gpus=1)
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1:2",
        nodes=2,
        gpus=1,
        pvc="ckpt",
        name="queued",
        queue="team-a",
        checkpoint_every=10_000,  # only the notice makes it save
        user_ns=user_ns(),
    )
    try:
        # Kueue's first word ("has not considered it yet") comes before its reason: wait for the reason
        wait_for(
            lambda: "waiting for quota in team-a" in (job.state.waiting or "") and "1 more needed" in job.state.waiting,
            "the wait and its reason",
            job=job,
        )
        assert job.status == "pending"
        assert not queued.pods(selector=m.selector("queued", "worker"))  # suspended: no worker pod
        [listed] = [j for j in ne.jobs(backend="kubernetes") if j.name == "queued"]
        assert "waiting for quota in team-a" in (listed.summary.get("waiting") or ""), listed.summary
        assert "waiting for quota in team-a" in job.summary()
        from test_cli import cli

        told = cli("status", "queued", "--backend", "kubernetes")
        assert told.returncode == 0 and "waiting: waiting for quota in team-a" in told.stdout, told
        if shutil.which("kubectl") and queued.tls_url:  # a client nobody here wrote reads Kueue's objects
            from test_kubernetes_kubectl import kubectl

            listed_by_kubectl = kubectl(queued, tmp_path, "get", "workloads", "-o", "wide").stdout
            # Reserved in, Admitted: empty while it waits, as Kueue prints them
            assert re.search(r"job-queued-workers-\w+\s+team-a\s+\d+s\n", listed_by_kubectl), listed_by_kubectl
            assert "team-a" in kubectl(queued, tmp_path, "get", "localqueues").stdout
            suspended = json.loads(
                kubectl(queued, tmp_path, "get", "job", m.workers_name("queued"), "-o", "json").stdout
            )
            assert suspended["spec"]["suspend"] is True

        queued.kueue.set_quota("team-a", 2)
        wait_for(lambda: job.world_size == 2 and (job.state.step or 0) >= 20, "two pods training", job=job)
        assert job.state.waiting is None
        assert any(e.kind == Kind.QUEUE and e.get("state") == "admitted" for e in job.events)

        urgent = queued.kueue.preempt(m.workers_name("queued"))
        wait_for(lambda: any(e.kind == Kind.SAVED_ON_NOTICE for e in job.events), "the save on notice", job=job)
        # The pods' SIGTERMs come a moment apart: each pod's keeper posts its own notice, and a
        # second one may come after the first was answered (a second save, a step or so later).
        saved = next(e for e in job.events if e.kind == Kind.SAVED_ON_NOTICE)
        # Its save, measured in the pod, is what the next launch of this name derives its grace from.
        wait_for(lambda: pod_grace.measured("queued") is not None, "the save recorded", job=job)
        wait_for(
            lambda: job.status == "pending" and "preempted by Kueue (Preempted)" in (job.state.waiting or ""),
            "the preemption told",
            job=job,
        )
        wait_for(lambda: not queued.pods(selector=m.selector("queued", "worker")), "the pods gone", job=job)
        assert job.state.restarts == 0  # a reclaim is free

        queued.kueue.finish(urgent)
        wait_for(
            lambda: any(e.kind == Kind.RESUMED and e.time > saved.time for e in job.events) and job.status == "running",
            "readmitted and training",
            job=job,
        )
        [resumed] = [e for e in job.events if e.kind == Kind.RESUMED and e.time > saved.time][:1]
        answers = [e.get("id") for e in job.events if e.kind == Kind.SAVED_ON_NOTICE and e.time < resumed.time]
        assert len(answers) == len(set(answers)) <= 2, answers  # each notice answered once
        # In place, the save on notice is not the last word: the workers train on until their own
        # pods go, and the last rank to stay saves where it leaves (SIGTERMs a moment apart may
        # split the pods over two boundaries); the job resumes from the newest save.
        assert resumed.get("step") >= saved.get("step"), (resumed.data, saved.data)
        # Every pod went at once: in place's fallback, said in one sentence (events, timeline).
        assert resumed.get("why") == NO_LIVE_VALUES and resumed.describe().endswith(f": {NO_LIVE_VALUES}"), resumed.data
        series = job.metrics["loss"]
        trained_before = [s for s, t in zip(series.steps, series.times) if t < resumed.time]
        assert max(trained_before) < resumed.get("step"), "a step after the save was trained, then redone"
        states = [e.get("state") for e in job.events if e.kind == Kind.QUEUE]
        assert states == ["waiting", "admitted", "evicted", "admitted"], states
        assert validate_kueue_objects(queued) >= 3  # the LocalQueue, the job's Workload, the urgent one
    finally:
        job.stop()


@pytest.mark.slow
def test_a_scale_up_is_a_workload_slice_the_job_trains_on_while_it_waits(queued):
    queued.kueue.add_queue("team-a", gpus=1)
    job = ne.launch(
        TRAIN, backend="kubernetes", nnodes="1:2", gpus=1, pvc="ckpt", name="sliced", queue="team-a", user_ns=user_ns()
    )
    try:
        wait_for(lambda: job.world_size == 1 and (job.state.step or 0) >= 5, "one pod training", job=job)
        job.scale(2)
        wait_for(
            lambda: "waiting for quota in team-a (a scale-up to 2 node(s))" in (job.state.waiting or ""),
            "the slice's wait",
            job=job,
        )
        step = job.state.step
        wait_for(lambda: (job.state.step or 0) >= step + 5, "training on at 1 node while the slice waits", job=job)
        assert job.world_size == 1 and job.status == "running"
        gated = queued.pods(selector=m.selector("sliced", "worker"))
        assert any(p["spec"].get("schedulingGates") for p in gated)  # the new pod waits for its slice

        queued.kueue.set_quota("team-a", 2)
        wait_for(lambda: job.world_size == 2, "the slice admitted and the job at 2 nodes", job=job)
        assert job.state.waiting is None
        workloads = [o for o in queued.all_objects() if o["kind"] == "Workload"]
        finished = [w for w in workloads if any(c["type"] == "Finished" for c in w["status"].get("conditions", []))]
        assert len(workloads) == 2 and len(finished) == 1  # the first slice replaced by the second
        assert validate_kueue_objects(queued) == 3
    finally:
        job.stop()


@pytest.mark.slow
def test_without_workload_slices_a_scale_is_refused_in_one_sentence(queued_without_slices):
    queued_without_slices.kueue.add_queue("team-a", gpus=2)
    job = ne.launch(
        TRAIN, backend="kubernetes", nnodes="1:2", gpus=1, pvc="ckpt", name="fixed", queue="team-a", user_ns=user_ns()
    )
    try:
        wait_for(
            lambda: any(e.kind == Kind.QUEUE and e.get("state") == "admitted" for e in job.events), "admitted", job=job
        )
        with pytest.raises(SpecError, match="does not enable Kueue's ElasticJobsViaWorkloadSlices feature gate"):
            job.scale(2)
        job_obj = queued_without_slices.get("jobs", m.workers_name("fixed"), gv="batch/v1")
        assert job_obj["spec"]["parallelism"] == 1  # nothing was patched
    finally:
        job.stop()

"""Following a job through the API server's bad moments (#17 defects 3 and 4): a transient
error (503, 429) is retried and never ends the view; a 403 is told once, in one sentence
naming the missing verb and resource, instead of silent retries."""

from __future__ import annotations

import os
import time

import pytest
import torch
from k8s_apiserver import FakeCluster
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.contract.event_types import Kind

pytestmark = pytest.mark.slow

CELL = """
for step in range(TOTAL):
    elastic.report(step=step, loss=1.0 / (step + 1))
    time.sleep(0.05)
"""


@pytest.fixture
def cluster(tmp_path, monkeypatch, home):
    fake = FakeCluster(gpu_slots=0)
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    yield fake
    fake.close()


def launch(name, total):
    return ne.launch(
        CELL,
        backend="kubernetes",
        nnodes="1",
        nproc_per_node=1,
        gpus=0,
        name=name,
        user_ns={"elastic": runtime, "time": time, "TOTAL": total, "torch": torch},
    )


def test_transient_api_errors_do_not_end_the_job_view(cluster):
    job = launch("flaky", total=200)
    wait_for(lambda: job.state.step is not None and job.state.step >= 5, "training", job=job)
    seen = len(cluster.requests)
    for status in (503, 429, 500, 503):  # a control-plane upgrade, a throttled client
        cluster.fail_next("GET", r"/configmaps/flaky-code$", status)
    wait_for(lambda: not cluster.failures, "the follower to meet every injected error", job=job)
    assert len(cluster.requests) > seen
    assert job.wait(240) == "succeeded", job.summary()  # old code: "stopped on request"
    assert job.state.step == 199


def test_a_forbidden_watch_is_told_once_naming_the_verb_and_resource(cluster):
    cluster.deny("watch", "pods")
    job = launch("denied", total=100_000)
    wait_for(
        lambda: any(e.kind == Kind.ERROR and e.get("error") == "Forbidden" for e in job.events), "the 403 told", job=job
    )
    told = [e for e in job.events if e.kind == Kind.ERROR and e.get("error") == "Forbidden"]
    assert "may not watch pods" in told[0].get("message"), told[0].get("message")
    assert "docs/how-to/rbac.md" in told[0].get("message")
    refused = len(cluster.forbidden)
    wait_for(lambda: len(cluster.forbidden) >= refused + 2, "the follower to retry", job=job)  # it still tries, slowly
    assert len([e for e in job.events if e.kind == Kind.ERROR and e.get("error") == "Forbidden"]) == 1
    cluster.denied.clear()  # the admin grants it: the view catches up
    wait_for(lambda: job.state.step is not None and job.state.step >= 3, "training seen once granted", job=job)
    job.stop()


def test_a_pod_deleted_while_the_watch_was_away_past_410_still_leaves(cluster):
    """The watch is away (its connection dropped, and refused while a pod goes); by the time
    it is back, its resourceVersion is too old (410 Gone). The fresh list lacks the pod:
    it is told as gone (old code: relisted only what exists, and the pod never left)."""
    from notebook_elastic.backends.kubernetes import manifests as m

    job = launch("gap", total=100_000)
    wait_for(lambda: job.state.step is not None and job.state.step >= 3 and job.nodes, "training", job=job)
    victim = job.nodes[0]
    cluster.deny("watch", "pods")
    cluster.deny("list", "pods")
    refused = len(cluster.forbidden)
    cluster.drop_streams()
    wait_for(lambda: len(cluster.forbidden) > refused, "the follower to be refused", job=job)
    cluster.preempt(victim)
    wait_for(lambda: cluster.get("pods", victim) is None, "the pod gone", job=job)
    with cluster.lock:
        del cluster.history[:-1]  # compacted: the follower's resourceVersion is now too old
    cluster.denied.clear()
    wait_for(
        lambda: any(e.kind == Kind.NODE_LEFT and e.node == victim for e in job.events), "the pod told gone", job=job
    )
    assert cluster.pods(selector=m.selector("gap", "worker"))  # and the replacement exists
    job.stop()


def test_a_quiet_pod_watch_resumes_after_compaction_thanks_to_bookmarks(cluster):
    """#17: no watch bookmarks. While the job's pods do not change, the rest of the cluster
    does and the server compacts its history; a reconnecting watch then resumes from the
    bookmark's resourceVersion instead of meeting 410 Gone and relisting."""
    from kubernetes import client, config

    job = launch("quiet", total=100_000)
    wait_for(lambda: job.state.step is not None and job.state.step >= 3 and job.nodes, "training", job=job)
    api = client.CoreV1Api(config.new_client_from_config(config_file=os.environ["KUBECONFIG"]))
    for i in range(20):  # churn elsewhere: newer resourceVersions the pod watch never sees
        api.create_namespaced_config_map("default", {"metadata": {"name": f"churn-{i}"}})
    churned = cluster.rv
    wait_for(lambda: any(b >= churned for b in cluster.bookmarks), "a bookmark past the churn", job=job)
    with cluster.lock:
        del cluster.history[:-1]  # compacted
    cluster.drop_streams()
    wait_for(lambda: len(cluster.streams) >= 3, "the follower to resume its streams", job=job)
    step = job.state.step
    wait_for(lambda: (job.state.step or 0) > step + 3, "training still followed", job=job)
    assert "pods" not in cluster.expired_watches, cluster.expired_watches  # old code: 410, relist
    job.stop()


def test_gpus_default_to_none_on_a_cluster_without_gpus(cluster):
    """#17: --gpus defaulted to --nproc-per-node even where no node has a GPU, so every worker
    stayed Pending (Insufficient nvidia.com/gpu). Where nodes can be listed and none offers
    nvidia.com/gpu, the default is CPU pods."""
    from notebook_elastic.backends.kubernetes import manifests as m

    job = ne.launch(
        CELL,
        backend="kubernetes",
        nnodes="1",
        nproc_per_node=1,
        name="cpu",
        user_ns={"elastic": runtime, "time": time, "TOTAL": 100_000, "torch": torch},
    )
    wait_for(lambda: job.state.step is not None and job.state.step >= 3, "CPU pods training", job=job)
    pod = cluster.pods(selector=m.selector("cpu", "worker"))[0]
    assert "nvidia.com/gpu" not in str(pod["spec"]["containers"][0].get("resources")), pod["spec"]["containers"][0]
    job.stop()


def test_a_job_failed_for_good_says_the_workers_sentence_or_at_least_why_it_was_not_retried():
    """The follower's reason for a Job failed by podFailurePolicy FailJob, from the condition's
    message (as the Job controller words it) and the worker failures its logs told."""
    from types import SimpleNamespace

    from notebook_elastic.backends.kubernetes.follow import ClusterFollower
    from notebook_elastic.contract import protocol
    from notebook_elastic.contract.events import Event

    def finished(code: int) -> Event:
        message = (
            f"Container worker for pod default/odd-workers-0-x5e6z failed with exit code {code} "
            "matching FailJob rule at index 2"
        )
        return Event(
            Kind.JOB_FINISHED,
            2.0,
            None,
            {"status": "failed", "reason": f"PodFailurePolicy: {message}", "budget_spent": True},
        )

    def reason(failures: list, code: int) -> str:
        view = SimpleNamespace(failures=failures, restarts=1, max_restarts=1)
        return ClusterFollower._explain(view, finished(code)).get("reason")

    unsaveable = Event(
        Kind.WORKER_FAILED,
        1.0,
        "odd-workers-0-x5e6z",
        {"rank": 0, "error": "StateNotSaveable", "message": "State cannot save 'odd'", "fatal": True},
    )
    bug = Event(
        Kind.WORKER_FAILED,
        1.0,
        "odd-workers-0-x5e6z",
        {"rank": 1, "error": "ZeroDivisionError", "message": "division by zero"},
    )
    assert (
        reason([unsaveable], protocol.EXIT_FATAL)
        == "rank 0 on odd-workers-0-x5e6z raised StateNotSaveable: State cannot save 'odd'"
    )
    # Its logs missed: the condition still says it was not retried, never "restart budget spent".
    missed = reason([], protocol.EXIT_FATAL)
    assert missed.startswith(protocol.exit_reason(protocol.EXIT_FATAL)) and "budget" not in missed, missed
    assert "exit code 7 matching FailJob" in missed
    assert reason([bug], protocol.EXIT_RESTARTS_SPENT) == (
        "restart budget spent (1/1); rank 1 on odd-workers-0-x5e6z raised ZeroDivisionError: division by zero"
    )

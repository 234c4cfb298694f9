"""The real `kubectl` as a second client of the API-server fixture (#17): a client no one here
wrote reads, describes, logs, applies (validating: it reads the fixture's OpenAPI v3 documents
and asks for server-side field validation) and deletes the objects our backend creates.
kubectl talks to the fixture's TLS listener (client-go sends no token over plain HTTP)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest
import torch
from k8s_apiserver import FakeCluster
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.backends.kubernetes import manifests as m

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("kubectl") is None,
        reason="kubectl is not installed (scripts/test.sh installs Debian's kubectl; apt-get install kubectl)",
    ),
]

CELL = """
for step in range(TOTAL):
    elastic.report(step=step, loss=1.0 / (step + 1))
    time.sleep(0.05)
"""


@pytest.fixture
def cluster(tmp_path, monkeypatch, home):
    fake = FakeCluster(gpu_slots=0)
    if fake.tls_url is None:
        fake.close()
        pytest.skip("openssl is missing: the fixture has no TLS listener for kubectl")
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    yield fake
    fake.close()


def kubectl(cluster, tmp_path, *args, stdin=None, check=True):
    config = cluster.kubectl_config(tmp_path / "kubectl-config")
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(config), "--request-timeout=30s", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done


def test_kubectl_reads_describes_logs_applies_and_deletes_our_objects(cluster, tmp_path):
    job = ne.launch(
        CELL,
        backend="kubernetes",
        nnodes="1",
        nproc_per_node=1,
        gpus=0,
        name="kc",
        user_ns={"elastic": runtime, "time": time, "TOTAL": 100_000, "torch": torch},
    )
    wait_for(lambda: job.state.step is not None and job.state.step >= 3, "the job to report steps")

    listed = kubectl(
        cluster, tmp_path, "get", "configmaps,services,deployments,pods,jobs", "-l", m.selector("kc"), "-o", "name"
    ).stdout
    names = set(listed.split())
    assert {"configmap/kc-code", "service/kc-rdzv", "deployment.apps/kc-rdzv", "job.batch/kc-workers"} <= names, names
    assert any(n.startswith("pod/kc-rdzv-") for n in names), names  # the store's pod, its ReplicaSet's
    worker = next(n.split("/")[1] for n in names if n.startswith("pod/kc-workers-"))
    table = kubectl(cluster, tmp_path, "get", "pods").stdout
    assert "NAME" in table and "STATUS" in table and worker in table  # server-side printing (Table)

    described = kubectl(cluster, tmp_path, "describe", "job", "kc-workers").stdout
    assert re.search(r"Completion Mode:\s+Indexed", described) and "kc-workers" in described, described
    assert re.search(r"Selector:\s+batch.kubernetes.io/controller-uid=", described), described
    logs = kubectl(cluster, tmp_path, "logs", worker).stdout
    assert "@@elastic" in logs

    # Server-side dry run of a whole job's manifests: validated, nothing stored.
    objects = json.loads(kubectl(cluster, tmp_path, "get", "job", "kc-workers", "-o", "json").stdout)
    assert objects["spec"]["completionMode"] == "Indexed"
    # The same job under another name, through our own manifests.
    from notebook_elastic.backends.kubernetes.options import KubernetesOptions
    from notebook_elastic.contract.spec import JobSpec
    from notebook_elastic.packaging import NotebookContext, package_cell

    other = JobSpec.from_json(dict(job.spec.to_json(), name="kc-dry"))
    bundle = package_cell("print(1)", NotebookContext(namespace={}), name="kc-dry")
    built = m.build(other, bundle, KubernetesOptions(gpus=0), run_id="x")
    manifest = "\n".join(json.dumps(o) for o in built)
    before = len(cluster.all_objects())
    applied = kubectl(cluster, tmp_path, "apply", "--dry-run=server", "-f", "-", stdin=manifest)
    assert applied.stdout.count("(server dry run)") == len(built), applied.stdout
    assert len(cluster.all_objects()) == before  # stored nothing
    bad = json.dumps(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "2024-run-rdzv"}, "spec": {"ports": [{"port": 1}]}}
    )
    refused = kubectl(cluster, tmp_path, "apply", "--dry-run=server", "-f", "-", stdin=bad, check=False)
    assert refused.returncode != 0 and "DNS-1035" in refused.stderr

    # kubectl deletes the workers' Job (background propagation): the Job owns the code
    # ConfigMap, which owns the rest, so the garbage collector removes every object (#17
    # defect 5: the ConfigMap, Service and rendezvous pod used to stay forever).
    kubectl(cluster, tmp_path, "delete", "job", "kc-workers", "--wait=true")
    assert job.wait(120) == "stopped", job.summary()
    wait_for(
        lambda: not cluster.all_objects() or all(o["kind"] == "Event" for o in cluster.all_objects()),
        "every object gone",
    )
    assert "No resources found" in kubectl(cluster, tmp_path, "get", "pods,services,configmaps").stderr


# Every Kubernetes option at once, so every field our manifests can hold is checked.
EVERY_OPTION = dict(
    nnodes="1:4",
    nproc_per_node=2,
    max_restarts=2,
    env={"WANDB_MODE": "offline"},
    image="pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime",
    rdzv_image="python:3.11-slim",
    gpus=1,
    cpu="2",
    memory="4Gi",
    tolerations=["nvidia.com/gpu:NoSchedule", "spot=true:NoExecute"],
    node_selector=["node.kubernetes.io/lifecycle=spot"],
    rdzv_tolerations=["critical=true:NoSchedule"],
    rdzv_node_selector=["node.kubernetes.io/lifecycle=on-demand"],
    priority_class="preemptible",
    rdzv_priority_class="critical",
    service_account="trainer",
    image_pull_secrets=["registry"],
    pvc="checkpoints",
    shm_size="1Gi",
    pod_security="restricted",
)


def misspelt(obj):
    """The object with its pod template's `containers` written `containerz`."""
    obj = json.loads(json.dumps(obj))
    spec = obj["spec"]
    template = spec["pytorchReplicaSpecs"]["Worker"]["template"] if "pytorchReplicaSpecs" in spec else spec["template"]
    template["spec"]["containerz"] = template["spec"].pop("containers")
    return obj


def test_kubectl_validates_our_manifests_and_refuses_a_misspelt_field(cluster, tmp_path):
    """`kubectl apply` with its default validation (no --validate=false): it finds the
    fieldValidation parameter in the fixture's OpenAPI v3 documents and sends
    fieldValidation=Strict. Every manifest of a job with every option applies without a
    warning, under each workload; a misspelt field is refused in the API server's words."""
    cluster.crds.add("pytorchjobs.kubeflow.org")
    user_ns = {"elastic": runtime, "time": time, "TOTAL": 3, "torch": torch}
    workers = {}
    for workload in ("job", "pytorchjob", "pods"):
        job = ne.launch(
            CELL,
            backend="kubernetes",
            name=f"every-{workload}",
            workload=workload,
            dry_run=True,
            user_ns=user_ns,
            **EVERY_OPTION,
        )
        objects = job.dryrun.request.objects
        applied = kubectl(
            cluster, tmp_path, "apply", "--dry-run=server", "-f", "-", stdin="\n".join(json.dumps(o) for o in objects)
        )
        assert applied.stdout.count("(server dry run)") == len(objects), applied.stdout
        assert "Warning" not in applied.stderr, applied.stderr
        workers[workload] = next((o for o in objects if o["kind"] in ("Job", "PyTorchJob")), None)
    asked = [p for method, p in cluster.requests if p.startswith("/openapi/")]
    assert "/openapi/v3" in asked and "/openapi/v3/apis/batch/v1" in asked, asked

    for kind, obj in (("Job", workers["job"]), ("PyTorchJob", workers["pytorchjob"])):
        refused = kubectl(cluster, tmp_path, "apply", "-f", "-", stdin=json.dumps(misspelt(obj)), check=False)
        assert refused.returncode != 0
        field = (
            "spec.pytorchReplicaSpecs.Worker.template.spec.containerz"
            if kind == "PyTorchJob"
            else "spec.template.spec.containerz"
        )
        assert (
            f'{kind} in version "v1" cannot be handled as a {kind}: strict decoding error: unknown field "{field}"'
            in refused.stderr
        ), refused.stderr
    assert not [o for o in cluster.all_objects() if o["kind"] in ("Job", "PyTorchJob")]  # nothing stored

    # An object that exists: kubectl sends a strategic merge patch, validated the same way.
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"lr": "0.1"}}
    kubectl(cluster, tmp_path, "apply", "-f", "-", stdin=json.dumps(config))
    changed = dict(config, data={"lr": "0.2"}, dataz={"x": "1"})
    refused = kubectl(cluster, tmp_path, "apply", "-f", "-", stdin=json.dumps(changed), check=False)
    assert refused.returncode != 0 and 'strict decoding error: unknown field "dataz"' in refused.stderr, refused.stderr
    assert cluster.get("configmaps", "settings")["data"] == {"lr": "0.1"}
    # --validate=warn asks for fieldValidation=Warn: applied, the unknown field dropped and told.
    warned = kubectl(cluster, tmp_path, "apply", "--validate=warn", "-f", "-", stdin=json.dumps(changed))
    assert 'Warning: unknown field "dataz"' in warned.stderr, warned.stderr
    stored = cluster.get("configmaps", "settings")
    assert stored["data"] == {"lr": "0.2"} and "dataz" not in stored

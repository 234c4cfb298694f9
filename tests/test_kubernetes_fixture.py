"""The API-server fixture refuses what a real API server refuses and runs the controllers our
backend depends on (#17): names, sizes, immutable Job fields, server-side dry-run, deleted
pods counted as failures unless evicted, the TTL controller, garbage collection by
propagation policy. Driven with the real `kubernetes` client; pods are short local
processes (no torch)."""

from __future__ import annotations

import socket
import sys

import pytest
from k8s_apiserver import FakeCluster
from waiting import wait_for


@pytest.fixture
def fake(no_leftovers):
    cluster = FakeCluster(gpu_slots=0)
    yield cluster
    cluster.close()


@pytest.fixture
def api(fake, tmp_path):
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(fake.kubeconfig(tmp_path / "kubeconfig")), client_configuration=configuration
    )
    with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client), client.BatchV1Api(api_client)


SLEEPER = {"name": "main", "image": "busybox", "command": [sys.executable, "-c", "import time; time.sleep(120)"]}


def indexed_job(name, n=1, **spec):
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": n,
            "parallelism": n,
            "backoffLimit": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [dict(SLEEPER)]}},
            **spec,
        },
    }


def status_of(exc_info):
    return exc_info.value.status, exc_info.value.body


def test_names_and_sizes_are_refused_as_a_real_server_does(api):
    from kubernetes.client.exceptions import ApiException

    core, batch = api
    with pytest.raises(ApiException) as err:
        core.create_namespaced_service(
            "default", {"metadata": {"name": "2024-run-rdzv"}, "spec": {"ports": [{"port": 1}]}}
        )
    assert err.value.status == 422 and "DNS-1035" in err.value.body
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "Big_Name"}, "data": {}})
    assert err.value.status == 422 and "RFC 1123" in err.value.body
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "big"}, "data": {"a": "x" * (1024 * 1024)}})
    assert err.value.status == 422 and "at most 1048576 bytes" in err.value.body
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job("default", indexed_job("j" * 64))
    assert err.value.status == 422
    assert core.list_namespaced_config_map("default").items == []  # nothing was stored


def test_immutable_job_fields_and_elastic_indexed_scaling(api, fake):
    from kubernetes.client.exceptions import ApiException

    _, batch = api
    rules = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    batch.create_namespaced_job("default", indexed_job("w", n=1, podFailurePolicy=rules))
    # Elastic Indexed Job: completions and parallelism move together.
    batch.patch_namespaced_job("w", "default", {"spec": {"completions": 2, "parallelism": 2}})
    for patch in (
        {"spec": {"completions": 3}},  # completions != parallelism
        {"spec": {"completionMode": "NonIndexed"}},
        {"spec": {"podFailurePolicy": None}},  # removing it
        {"spec": {"template": {"spec": {"restartPolicy": "OnFailure"}}}},
    ):
        with pytest.raises(ApiException) as err:
            batch.patch_namespaced_job("w", "default", patch)
        assert err.value.status == 422 and "immutable" in err.value.body, patch
    job = batch.read_namespaced_job("w", "default")
    assert (job.spec.completions, job.spec.parallelism, job.spec.completion_mode) == (2, 2, "Indexed")
    assert job.spec.pod_failure_policy is not None
    wait_for(lambda: len(fake.pods()) == 2, "two pods", timeout=60)
    assert sorted(p["spec"]["hostname"] for p in fake.pods()) == ["w-0", "w-1"]  # as the controller names them


def test_server_side_dry_run_validates_and_stores_nothing(api, fake):
    from kubernetes.client.exceptions import ApiException

    core, batch = api
    made = core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"a": "b"}}, dry_run="All")
    assert made.metadata.name == "c" and fake.get("configmaps", "c") is None
    with pytest.raises(ApiException) as err:
        core.create_namespaced_service(
            "default", {"metadata": {"name": "9-svc"}, "spec": {"ports": [{"port": 1}]}}, dry_run="All"
        )
    assert err.value.status == 422
    batch.create_namespaced_job("default", indexed_job("w"))
    batch.patch_namespaced_job("w", "default", {"spec": {"completions": 3, "parallelism": 3}}, dry_run="All")
    batch.delete_namespaced_job("w", "default", dry_run="All")
    assert fake.get("jobs", "w", gv="batch/v1")["spec"]["completions"] == 1


def test_a_deleted_pod_fails_and_counts_an_evicted_one_does_not(api, fake):
    """Deleting a Job's pod makes it Failed and spends backoffLimit; the Eviction API adds
    DisruptionTarget, which the podFailurePolicy's Ignore rule skips."""
    core, batch = api
    rules = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}
    batch.create_namespaced_job("default", indexed_job("w", backoffLimit=1, podFailurePolicy=rules))

    def running():
        return [
            p
            for p in fake.pods()
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    for _ in range(3):  # three evictions: none counts
        wait_for(lambda: len(running()) == 1, "a running pod", timeout=60)
        victim = running()[0]["metadata"]["name"]
        core.create_namespaced_pod_eviction(
            victim, "default", {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": victim}}
        )
        wait_for(lambda victim=victim: fake.get("pods", victim) is None, "the evicted pod to go", timeout=60)
    assert fake.evictions and (batch.read_namespaced_job("w", "default").status.failed or 0) == 0
    for expected_failed in (1, 2):  # plain deletes count; the second goes past backoffLimit 1
        wait_for(lambda: len(running()) == 1, "a running pod", timeout=60)
        victim = running()[0]["metadata"]["name"]
        core.delete_namespaced_pod(victim, "default", grace_period_seconds=0)
        wait_for(
            lambda n=expected_failed: (batch.read_namespaced_job("w", "default").status.failed or 0) == n,
            "the failure counted",
            timeout=60,
        )
    wait_for(
        lambda: any(
            c.type == "Failed" and c.reason == "BackoffLimitExceeded"
            for c in batch.read_namespaced_job("w", "default").status.conditions or []
        ),
        "BackoffLimitExceeded",
        timeout=60,
    )


def test_ttl_after_finished_and_propagation_policies(api, fake):
    core, batch = api
    job = indexed_job("t", ttlSecondsAfterFinished=1)
    job["spec"]["template"]["spec"]["containers"] = [dict(SLEEPER, command=[sys.executable, "-c", "pass"])]
    batch.create_namespaced_job("default", job)
    wait_for(
        lambda: fake.get("jobs", "t", gv="batch/v1") is None,
        "the TTL controller to delete the finished Job",
        timeout=60,
    )
    wait_for(lambda: not fake.pods(), "its pods to be collected", timeout=60)

    # A ConfigMap owning a Service: Background deletes the dependent, Orphan keeps it.
    for policy, kept in (("Background", False), ("Orphan", True)):
        owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
        core.create_namespaced_service(
            "default", {"metadata": {"name": "dep", "ownerReferences": [ref]}, "spec": {"ports": [{"port": 1}]}}
        )
        core.delete_namespaced_config_map("owner", "default", propagation_policy=policy)
        wait_for(lambda: fake.get("configmaps", "owner") is None, "the owner gone", timeout=60)
        assert (fake.get("services", "dep") is not None) == kept, policy
        if kept:
            assert fake.get("services", "dep")["metadata"]["ownerReferences"] == []
            core.delete_namespaced_service("dep", "default")
    # A Job deleted without a policy orphans its pods (the API's default for Jobs).
    batch.create_namespaced_job("default", indexed_job("o"))
    wait_for(lambda: len(fake.pods()) == 1, "a pod", timeout=60)
    batch.delete_namespaced_job("o", "default")
    assert len(fake.pods()) == 1 and fake.pods()[0]["metadata"]["ownerReferences"] == []
    core.delete_namespaced_pod(fake.pods()[0]["metadata"]["name"], "default", grace_period_seconds=0)
    wait_for(lambda: not fake.pods(), "the orphan deleted", timeout=60)


def test_discovery_and_transient_errors(api, fake):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, _ = api
    groups = client.ApisApi(core.api_client).get_api_versions()
    assert {g.name for g in groups.groups} >= {"batch", "policy"}
    resources = {r.name for r in core.get_api_resources().resources}
    assert {"pods", "pods/log", "pods/eviction", "services", "configmaps"} <= resources
    fake.fail_next("GET", r"/configmaps$", 503)
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map("default")
    assert err.value.status == 503
    core.list_namespaced_config_map("default")  # once only


# A server that starts listening a moment after its container starts, and answers each
# connection with its pod's address: which pod a Service reached, and when it is ready.
LATE_SERVER = (
    "import os, socket, time; time.sleep(3); s = socket.socket(); "
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((os.environ['POD_IP'], 7000)); s.listen(8)\n"
    "while True:\n    c, _ = s.accept(); c.sendall(os.environ['POD_IP'].encode()); c.close()"
)


def test_a_deployment_replaces_its_pod_and_a_service_reaches_only_ready_pods(api, fake):
    """#17 item 5: the rendezvous store runs under a one-replica Deployment, behind a Service.
    The fixture runs the Deployment and ReplicaSet controllers (a deleted or evicted pod is
    replaced at once), the kubelet's tcpSocket readiness probe, and kube-proxy: the Service's
    ClusterIP forwards to Ready pods only, and refuses connections while there are none.
    Old fixture: no apps/v1 (404), Service names rewritten to one pod's address for good."""
    from kubernetes import client

    core, _ = api
    apps = client.AppsV1Api(core.api_client)
    labels = {"app": "store"}
    container = {
        "name": "store",
        "image": "python",
        "command": [sys.executable, "-c", LATE_SERVER],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "c10d", "containerPort": 7000}],
        "readinessProbe": {"tcpSocket": {"port": "c10d"}, "periodSeconds": 1},
    }
    service = core.create_namespaced_service(
        "default",
        {"metadata": {"name": "store"}, "spec": {"selector": labels, "ports": [{"port": 7001, "targetPort": "c10d"}]}},
    )
    address = (service.spec.cluster_ip, 7001)
    apps.create_namespaced_deployment(
        "default",
        {
            "metadata": {"name": "store"},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            },
        },
    )

    def pod():
        live = [p for p in fake.pods(selector="app=store") if not p["metadata"].get("deletionTimestamp")]
        return live[0] if len(live) == 1 else None

    def ready(p):
        return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))

    def answer():
        with socket.create_connection(address, timeout=2) as s:
            return s.recv(100).decode()

    wait_for(lambda: pod() and pod()["status"].get("phase") == "Running", "the Deployment's pod running", timeout=60)
    first = pod()
    assert first["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    if not ready(first):  # running, not yet serving: not an endpoint, so the ClusterIP refuses
        with pytest.raises(ConnectionRefusedError):
            answer()
    wait_for(lambda: (p := pod()) and ready(p), "the readiness probe to pass", timeout=60)
    wait_for(lambda: _answers(answer) == first["status"]["podIP"], "the Service to reach the pod", timeout=60)

    # Deleted, then evicted: each time another pod, and the Service follows it.
    for how in ("delete", "evict"):
        gone = pod()
        name = gone["metadata"]["name"]
        if how == "delete":
            core.delete_namespaced_pod(name, "default")
        else:
            eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="default"))
            core.create_namespaced_pod_eviction(name, "default", eviction)
        wait_for(
            lambda uid=gone["metadata"]["uid"]: (p := pod()) and p["metadata"]["uid"] != uid,
            f"a new pod ({how})",
            timeout=60,
        )
        wait_for(lambda: (p := pod()) and ready(p), "the replacement ready", timeout=60)
        new = pod()
        wait_for(
            lambda ip=new["status"]["podIP"]: _answers(answer) == ip, "the Service to reach the replacement", timeout=60
        )
    wait_for(
        lambda: fake.get("deployments", "store", gv="apps/v1")["status"]["readyReplicas"] == 1, "its status", timeout=60
    )

    apps.delete_namespaced_deployment("store", "default", propagation_policy="Background")
    wait_for(lambda: not fake.pods(selector="app=store"), "the ReplicaSet and its pods collected", timeout=60)
    assert not [o for o in fake.all_objects() if o["kind"] == "ReplicaSet"]
    wait_for(lambda: _answers(answer) is None, "the Service without endpoints refusing", timeout=60)
    core.delete_namespaced_service("store", "default")


def _answers(ask):
    try:
        return ask()
    except OSError:
        return None


# The body of the API server's own field-validation integration test
# (kubernetes test/integration/apiserver/field_validation_test.go, invalidBodyJSON): the
# expected sentences below are that test's, word for word.
INVALID_DEPLOYMENT = b"""{
  "apiVersion": "apps/v1", "kind": "Deployment",
  "metadata": {"name": "dupename", "name": "NAME", "labels": {"app": "nginx"}, "unknownMeta": "metaVal"},
  "spec": {
    "unknown1": "val1", "unknownDupe": "valDupe", "unknownDupe": "valDupe2", "paused": true, "paused": false,
    "selector": {"matchLabels": {"app": "nginx"}},
    "template": {"metadata": {"labels": {"app": "nginx"}}, "spec": {"containers": [{
      "name": "nginx", "image": "nginx:latest", "unknownNested": "val1",
      "imagePullPolicy": "Always", "imagePullPolicy": "Never"}]}}}}"""
STRICT_POST = (
    'strict decoding error: duplicate field "metadata.name", unknown field "metadata.unknownMeta", '
    'unknown field "spec.unknown1", unknown field "spec.unknownDupe", duplicate field "spec.paused", '
    'unknown field "spec.template.spec.containers[0].unknownNested", '
    'duplicate field "spec.template.spec.containers[0].imagePullPolicy"'
)
SMP = b"""{"spec": {"unknown1": "val1", "unknownDupe": "valDupe", "unknownDupe": "valDupe2",
  "paused": true, "paused": false,
  "template": {"spec": {"containers": [{"name": "nginx", "unknownNested": "val1",
    "imagePullPolicy": "Always", "imagePullPolicy": "Never"}]}}}}"""
STRICT_SMP = (
    'strict decoding error: duplicate field "spec.unknownDupe", duplicate field "spec.paused", '
    'duplicate field "spec.template.spec.containers[0].imagePullPolicy", '
    'unknown field "spec.template.spec.containers[0].unknownNested", unknown field "spec.unknown1", '
    'unknown field "spec.unknownDupe"'
)


def raw_request(fake, method, path, body, content_type="application/json"):
    """A request as bytes: duplicate keys cannot be sent through a client that builds JSON
    from a dict. Returns (status, Status or object, the Warning headers' texts)."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        fake.url + path,
        data=body,
        method=method,
        headers={"Authorization": f"Bearer {fake.token}", "Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, headers, data = response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        status, headers, data = err.code, err.headers, err.read()
    warnings = [json.loads(w.split(" - ", 1)[1]) for w in headers.get_all("Warning") or []]
    return status, json.loads(data), warnings


def test_field_validation_strict_warn_and_ignore_as_the_api_server_words_them(fake):
    deployments = "/apis/apps/v1/namespaces/default/deployments"
    status, body, warnings = raw_request(
        fake, "POST", deployments + "?fieldValidation=Strict", INVALID_DEPLOYMENT.replace(b"NAME", b"strict")
    )
    assert status == 400 and body["reason"] == "BadRequest", body
    assert body["message"] == f'Deployment in version "v1" cannot be handled as a Deployment: {STRICT_POST}'
    assert fake.get("deployments", "strict", gv="apps/v1") is None

    # Warn (also the default without the parameter): created, each issue in a Warning header.
    for name, query in (("warn", "?fieldValidation=Warn"), ("default", "")):
        status, body, warnings = raw_request(
            fake, "POST", deployments + query, INVALID_DEPLOYMENT.replace(b"NAME", name.encode())
        )
        assert status == 201, body
        assert ", ".join(warnings) == STRICT_POST.removeprefix("strict decoding error: ")
    status, body, warnings = raw_request(
        fake, "POST", deployments + "?fieldValidation=Ignore", INVALID_DEPLOYMENT.replace(b"NAME", b"ignore")
    )
    assert status == 201 and warnings == [], (body, warnings)

    # A strategic merge patch: the patch's duplicates, then the patched object's unknown fields.
    status, body, _ = raw_request(
        fake,
        "PATCH",
        deployments + "/warn?fieldValidation=Strict",
        SMP,
        "application/strategic-merge-patch+json",
    )
    assert status == 422 and body["reason"] == "Invalid", body
    assert body["message"].startswith(' "" is invalid: patch: Invalid value: "map[spec:map[') and body[
        "message"
    ].endswith(STRICT_SMP), body["message"]
    status, _, warnings = raw_request(
        fake, "PATCH", deployments + "/warn", SMP, "application/strategic-merge-patch+json"
    )
    assert status == 200 and ", ".join(warnings) == STRICT_SMP.removeprefix("strict decoding error: ")

    # A custom resource: duplicates first, then what pruning would drop, sorted.
    fake.crds.add("pytorchjobs.kubeflow.org")
    status, body, _ = raw_request(
        fake,
        "POST",
        "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs?fieldValidation=Strict",
        b'{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "p", "name": "p", "x": 1},'
        b' "spec": {"runPolicy": {}, "pytorchReplicaSpecs": {"Worker": {"replicas": 1, "replicas": 2,'
        b' "template": {"spec": {"containerz": []}}}}}}',
    )
    assert status == 400, body
    assert body["message"] == (
        'PyTorchJob in version "v1" cannot be handled as a PyTorchJob: strict decoding error: '
        'duplicate field "metadata.name", duplicate field "spec.pytorchReplicaSpecs.Worker.replicas", '
        'unknown field "metadata.x", unknown field "spec.pytorchReplicaSpecs.Worker.template.spec.containerz"'
    )
    status, body, _ = raw_request(fake, "POST", deployments + "?fieldValidation=strict", b"{}")
    assert status == 400 and '"strict"' in body["message"] and "Strict" in body["message"], body


def test_openapi_v3_documents_say_where_each_kind_takes_field_validation(fake):
    """What kubectl reads before `apply`: the root lists one document per group-version; in
    it, each kind's PATCH carries its group-version-kind and a fieldValidation parameter, and
    the schemas are the real ones (Kubernetes 1.31, the Kubeflow CRD)."""
    fake.crds.add("pytorchjobs.kubeflow.org")
    status, root, _ = raw_request(fake, "GET", "/openapi/v3", None)
    assert status == 200 and set(root["paths"]) == {"api/v1", "apis/apps/v1", "apis/batch/v1", "apis/kubeflow.org/v1"}
    for gv_path, kind, schema in (
        ("api/v1", "Pod", "io.k8s.api.core.v1.Pod"),
        ("apis/batch/v1", "Job", "io.k8s.api.batch.v1.Job"),
        ("apis/kubeflow.org/v1", "PyTorchJob", "org.kubeflow.v1.PyTorchJob"),
    ):
        status, doc, _ = raw_request(fake, "GET", root["paths"][gv_path]["serverRelativeURL"], None)
        assert status == 200, doc
        patches = [
            item["patch"]
            for item in doc["paths"].values()
            if "patch" in item and item["patch"]["x-kubernetes-group-version-kind"]["kind"] == kind
        ]
        assert len(patches) == 1 and any(p["name"] == "fieldValidation" for p in patches[0]["parameters"])
        assert doc["components"]["schemas"][schema]["x-kubernetes-group-version-kind"][0]["kind"] == kind
        if kind == "Job":  # what kubectl's strategic merge patches are computed from
            containers = doc["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
            assert containers["x-kubernetes-patch-merge-key"] == "name" and containers["type"] == "array"

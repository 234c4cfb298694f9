"""Kubernetes manifests: pure functions of the spec, validated against the real schemas.

Built-in kinds with kubernetes-validate in strict mode (1.31, where elastic Indexed Jobs
became GA, and the newest it knows); the PyTorchJob against the Kubeflow training operator's
CRD schema (tests/data, release v1.9.0, unchanged) with jsonschema, made strict so a
misspelt field fails instead of being pruned.
"""

from __future__ import annotations

import base64
import copy
import io
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from notebook_elastic.backends.kubernetes import manifests as m
from notebook_elastic.backends.kubernetes.options import DEFAULT_IMAGE, parse_options, parse_toleration
from notebook_elastic.errors import SpecError
from notebook_elastic.launcher import build_spec
from notebook_elastic.packaging import NotebookContext, package_cell

CRD = Path(__file__).parent / "data" / "kubeflow.org_pytorchjobs.v1.9.0.yaml"
VERSIONS = [
    "1.31.0",
    max(
        (
            p.name.split("-")[0].lstrip("v")
            for p in (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema").iterdir()
            if p.name.endswith("-local-strict")
        ),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    ),
]


def make(nnodes="1:4", workload="job", **options):
    options.setdefault("pvc", "checkpoints")
    k8s = parse_options(workload=workload, **options)
    spec = build_spec(
        nnodes=nnodes,
        nproc_per_node=2,
        name="spot-train",
        backend="kubernetes",
        backend_options={"kubernetes": k8s.to_json()},
        env={"WANDB_MODE": "offline"},
    )
    ctx = NotebookContext(namespace={"lr": 0.1})
    bundle = package_cell("print(lr)", ctx, name=spec.name)
    return spec, bundle, k8s


@pytest.mark.parametrize("version", VERSIONS)
def test_every_built_in_manifest_passes_strict_schema_validation(version):
    spec, bundle, k8s = make(
        tolerations=["nvidia.com/gpu:NoSchedule", "spot=true:NoExecute"],
        node_selector=["node.kubernetes.io/lifecycle=spot"],
        rdzv_node_selector=["node.kubernetes.io/lifecycle=on-demand"],
        priority_class="preemptible",
        service_account="trainer",
        image_pull_secrets=["registry"],
        cpu="8",
        memory="32Gi",
    )
    objects = m.build(spec, bundle, k8s, run_id="abcd")
    owner = dict(objects[0], metadata=dict(objects[0]["metadata"], uid="0b0c7d5e-1111-2222-3333-444455556666"))
    pods_mode = m.build(spec, bundle, parse_options(workload="pods", pvc="checkpoints"), run_id="abcd")
    for obj in [objects[0]] + [m.owned_by(o, owner) for o in objects[1:]] + pods_mode[3:]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_shape_of_the_job():
    spec, bundle, k8s = make(tolerations=["nvidia.com/gpu:NoSchedule"], rdzv_node_selector=["lifecycle=on-demand"])
    code, service, rdzv, job = m.build(spec, bundle, k8s, run_id="abcd")
    assert [o["kind"] for o in (code, service, rdzv, job)] == ["ConfigMap", "Service", "Pod", "Job"]
    for obj in (code, service, rdzv, job):
        labels = obj["metadata"]["labels"]
        assert (
            labels[m.NAME] == "notebook-elastic"
            and labels[m.INSTANCE] == "spot-train"
            and labels[m.MANAGED_BY] == "notebook-elastic"
        )
    # The script, its payload and the runtime travel in the ConfigMap.
    assert code["data"][m.SCRIPT] == bundle.script
    runtime = zipfile.ZipFile(io.BytesIO(base64.b64decode(code["binaryData"][m.RUNTIME_ZIP])))
    names = set(runtime.namelist())
    assert {
        "notebook_elastic/__init__.py",
        "notebook_elastic/runtime/agent.py",
        "notebook_elastic/runtime/store.py",
        "cloudpickle/__init__.py",
    } <= names
    # The rendezvous is its own pod, on its own nodes, not a trainer.
    assert rdzv["spec"]["containers"][0]["command"] == ["python", "-m", "notebook_elastic.runtime.store"]
    assert rdzv["spec"]["nodeSelector"] == {"lifecycle": "on-demand"} and "tolerations" not in rdzv["spec"]
    assert service["spec"]["selector"] == {m.INSTANCE: "spot-train", m.COMPONENT: "rendezvous"}
    # Workers: an elastic Indexed Job running our agent with the fast rendezvous settings.
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == job["spec"]["parallelism"] == 1
    assert job["spec"]["podFailurePolicy"]["rules"][0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    pod = job["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    args = worker["args"]
    assert args[args.index("--nnodes") + 1] == "1:4" and args[args.index("--nproc-per-node") + 1] == "2"
    assert args[args.index("--rdzv-endpoint") + 1] == "spot-train-rdzv:29400"
    conf = dict(kv.split("=") for kv in args[args.index("--rdzv-conf") + 1].split(","))
    assert conf == {
        "join_timeout": "1800",
        "last_call_timeout": "1",
        "keep_alive_interval": "1",
        "keep_alive_max_attempt": "3",
        "is_host": "false",
    }
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "2"  # --gpus defaults to --nproc-per-node
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    env = {e["name"]: e for e in worker["env"]}
    assert env["NOTEBOOK_ELASTIC_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1" and env["WANDB_MODE"]["value"] == "offline"
    mounts = {v["mountPath"]: v["name"] for v in worker["volumeMounts"]}
    assert mounts == {"/opt/notebook-elastic": "code", "/dev/shm": "dshm", "/checkpoints": "checkpoints"}
    assert worker["image"] == DEFAULT_IMAGE


def test_cpu_pods_ask_for_no_gpu_and_owner_references_point_at_the_configmap():
    spec, bundle, k8s = make(gpus=0)
    code, service, rdzv, job = m.build(spec, bundle, k8s, run_id="abcd")
    assert "resources" not in job["spec"]["template"]["spec"]["containers"][0]
    made = dict(code, metadata=dict(code["metadata"], uid="u-1"))
    owned = m.owned_by(job, made)
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "spot-train-code", "uid": "u-1", "blockOwnerDeletion": True}
    ]
    assert "ownerReferences" not in job["metadata"]  # pure: the input is untouched


def strict(schema):
    """The CRD's structural schema as jsonschema: int-or-string, and no unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.pop("x-kubernetes-int-or-string", False):
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            preserve = node.get("x-kubernetes-preserve-unknown-fields")
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not preserve
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def test_pytorchjob_passes_the_kubeflow_crd_schema():
    crd = yaml.safe_load(CRD.read_text())
    schema = strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    spec, bundle, k8s = make(workload="pytorchjob", nnodes="2:4")
    objects = m.build(spec, bundle, k8s, run_id="abcd")
    job = objects[-1]
    assert job["kind"] == "PyTorchJob"
    jsonschema.validate(job, schema)
    policy = job["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"], policy["rdzvHost"], policy["rdzvBackend"]) == (
        2,
        4,
        "spot-train-rdzv",
        "c10d",
    )
    broken = copy.deepcopy(job)
    broken["spec"]["elasticPolicy"]["maxReplica"] = 4  # a typo must not pass
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_refusals_before_anything_is_sent():
    with pytest.raises(
        SpecError, match=r"--nnodes 1:4 may run on several pods, which must share their checkpoints: pass --pvc NAME"
    ):
        spec, bundle, k8s = make(pvc=None)
        m.build(spec, bundle, parse_options(), run_id="x")
    spec, _bundle, k8s = make()
    big = package_cell("print(len(blob))", NotebookContext(namespace={"blob": b"x" * 1_200_000}), name=spec.name)
    with pytest.raises(
        SpecError, match=r"over the 1 MiB a ConfigMap may hold \(`blob` \(1\.2 MB\)\); load large data .*\(--pvc\)"
    ):
        m.build(spec, big, k8s, run_id="x")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpus": "two"}, r"--gpus 'two' must be a whole number"),
        ({"gpus": -1}, r"--gpus -1 must be 0 or more"),
        ({"cpu": "lots"}, r"--cpu 'lots' is not a Kubernetes quantity"),
        ({"memory": "16 GB"}, r"--memory '16 GB' is not a Kubernetes quantity"),
        ({"tolerations": ["gpu:Sometimes"]}, r"the effect must be one of NoSchedule"),
        ({"node_selector": ["no-value"]}, r"write it as label=value"),
        ({"namespace": "Team_A"}, r"--namespace 'Team_A' is not a valid Kubernetes name"),
        ({"workload": "deployment"}, r"--workload 'deployment' is unknown"),
        ({"image": "my image"}, r"--image 'my image' is not an image reference"),
        ({"pvc": "Bad/Name"}, r"--pvc 'Bad/Name' is not a valid Kubernetes name"),
    ],
)
def test_bad_kubernetes_options_are_one_clear_sentence(kwargs, message):
    with pytest.raises(SpecError, match=message):
        parse_options(**kwargs)


def test_tolerations_parse_like_kubectl_taints():
    assert parse_toleration("spot=true:NoSchedule") == {
        "key": "spot",
        "operator": "Equal",
        "value": "true",
        "effect": "NoSchedule",
    }
    assert parse_toleration("nvidia.com/gpu") == {"key": "nvidia.com/gpu", "operator": "Exists"}


def test_dry_run_prints_every_object_as_yaml_and_sends_nothing(shell, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "does-not-exist"))  # a dry run needs no cluster
    shell.user_ns["lr"] = 0.1
    shell.run_cell_magic(
        "elastic_train",
        "--backend kubernetes --nnodes 1:3 --nproc-per-node 4 --pvc ckpt --name spot-demo --rdzv-node-selector lifecycle=on-demand --toleration spot=true:NoSchedule --dry-run",
        "print(lr)\n",
    )
    out = capsys.readouterr().out
    docs = [d for d in yaml.safe_load_all(out) if d]  # the whole output is one YAML stream
    assert "# Manifest of job 'spot-demo'" in out
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Pod", "Job"]
    assert docs[-1]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "<" in docs[0]["binaryData"]["runtime.zip"]  # binary shown as a size, not dumped

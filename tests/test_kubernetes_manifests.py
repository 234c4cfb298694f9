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
from notebook_elastic.kernel.launcher import build_spec
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
        pod_security="restricted",
    )
    objects = m.build(spec, bundle, k8s, run_id="abcd")
    owner = dict(objects[0], metadata=dict(objects[0]["metadata"], uid="0b0c7d5e-1111-2222-3333-444455556666"))
    pods_mode = m.build(spec, bundle, parse_options(workload="pods", pvc="checkpoints"), run_id="abcd")
    assert [o["kind"] for o in objects[:2]] == ["ConfigMap", "Secret"]
    for obj in [objects[0]] + [m.owned_by(o, owner) for o in objects[1:]] + pods_mode[4:]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_shape_of_the_job():
    spec, bundle, k8s = make(tolerations=["nvidia.com/gpu:NoSchedule"], rdzv_node_selector=["lifecycle=on-demand"])
    code, secret, service, rdzv, job = m.build(spec, bundle, k8s, run_id="abcd")
    assert [o["kind"] for o in (code, secret, service, rdzv, job)] == [
        "ConfigMap",
        "Secret",
        "Service",
        "Deployment",
        "Job",
    ]
    for obj in (code, secret, service, rdzv, job):
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
        "notebook_elastic/runtime/worker.py",
        "notebook_elastic/agent/run.py",
        "notebook_elastic/store/run.py",
        "notebook_elastic/pool/warm.py",
        "cloudpickle/__init__.py",
    } <= names
    # The rendezvous is its own pod, on its own nodes, not a trainer, under a one-replica
    # Deployment (replaced when deleted, evicted or lost with its node; never two at once).
    assert rdzv["spec"]["replicas"] == 1 and rdzv["spec"]["strategy"] == {"type": "Recreate"}
    assert rdzv["spec"]["selector"]["matchLabels"].items() <= rdzv["spec"]["template"]["metadata"]["labels"].items()
    store = rdzv["spec"]["template"]["spec"]
    assert store["containers"][0]["command"] == ["python", "-m", "notebook_elastic.store.run"]
    assert store["nodeSelector"] == {"lifecycle": "on-demand"} and "tolerations" not in store
    assert store["containers"][0]["image"] == "python:3.12-slim"  # Python alone, unless --rdzv-image
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
    # Heartbeats sized for clusters (#17: 1 s x 3 declared live agents dead under load), and
    # the store client waits as long as the join for a rendezvous pod still starting.
    assert conf == {
        "join_timeout": "1800",
        "last_call_timeout": "1",
        "keep_alive_interval": "5",
        "keep_alive_max_attempt": "6",
        "read_timeout": "1800",
        "is_host": "false",
    }
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "2"  # --gpus defaults to --nproc-per-node
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    env = {e["name"]: e for e in worker["env"]}
    assert env["NOTEBOOK_ELASTIC_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1"
    assert env["WANDB_MODE"] == {
        "name": "WANDB_MODE",
        "valueFrom": {"secretKeyRef": {"name": "spot-train-env", "key": "WANDB_MODE"}},
    }
    mounts = {v["mountPath"]: v["name"] for v in worker["volumeMounts"]}
    assert mounts == {"/opt/notebook-elastic": "code", "/dev/shm": "dshm", "/checkpoints": "checkpoints"}
    assert worker["image"] == DEFAULT_IMAGE


def test_cpu_pods_ask_for_no_gpu_and_owner_references_point_at_the_configmap():
    spec, bundle, k8s = make(gpus=0)
    code, _secret, service, rdzv, job = m.build(spec, bundle, k8s, run_id="abcd")
    # No GPU, but requests (#17: without any, CPU workers ran BestEffort, evicted first): one
    # CPU and 2 GiB per process by default, and no limit that was not asked for.
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
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
    # Kubeflow's webhook requires a container named "pytorch" in every replica spec (#17).
    assert [c["name"] for c in job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]] == [
        "pytorch"
    ]
    # Its pods restart in place (OnFailure): bounded, or an agent whose budget is spent restarts forever.
    assert job["spec"]["runPolicy"]["backoffLimit"] == max(spec.max_restarts, 1) >= 1
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
        ({"gpus": "two"}, r"--gpus \(GPUs per pod\) must be a whole number, not 'two' \(for example 1, or 0"),
        ({"gpus": 2.5}, r"--gpus \(GPUs per pod\) must be a whole number, not 2\.5"),
        ({"gpus": -1}, r"--gpus -1 must be 0 or more"),
        ({"cpu": "lots"}, r"--cpu 'lots' is not a Kubernetes quantity"),
        ({"memory": "16 GB"}, r"--memory '16 GB' is not a Kubernetes quantity"),
        ({"tolerations": ["gpu:Sometimes"]}, r"the effect must be one of NoSchedule"),
        ({"node_selector": ["no-value"]}, r"write it as label=value"),
        ({"namespace": "Team_A"}, r"--namespace 'Team_A' is not a valid Kubernetes name"),
        ({"workload": "deployment"}, r"--workload 'deployment' is unknown"),
        ({"image": "my image"}, r"--image 'my image' is not an image reference"),
        ({"pvc": "Bad/Name"}, r"--pvc 'Bad/Name' is not a valid Kubernetes name"),
        ({"grace": 2}, r"--grace 2 is outside 5\.\.86400 seconds: the job saves on notice within the grace less 3 s"),
        (
            {"grace": "soon"},
            r"--grace \(seconds between the kubelet's SIGTERM and its SIGKILL\) must be a whole number",
        ),
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
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Deployment", "Job"]
    assert docs[-1]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "<" in docs[0]["binaryData"]["runtime.zip"]  # binary shown as a size, not dumped
    assert "# notice: a worker pod is given 30 s between the kubelet's SIGTERM and its SIGKILL" in out
    assert "(the default: no save of a job named spot-demo measured here yet)" in out


def test_the_grace_is_the_pods_and_the_notice_keepers():
    """--grace sets the worker pods' terminationGracePeriodSeconds and tells the agent's keeper
    the same (it passes the kubelet's SIGTERM on once the job saved, within that grace)."""
    for grace in (None, 90):
        spec, bundle, k8s = make(**({"grace": grace} if grace else {}))
        job = m.build(spec, bundle, k8s, run_id="abcd")[-1]
        pod = job["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert pod["terminationGracePeriodSeconds"] == (grace or 30)
        assert env["NOTEBOOK_ELASTIC_NOTICE_GRACE_S"] == str(grace or 30)
        assert env["NOTEBOOK_ELASTIC_NOTICE_STORE"] == "spot-train-rdzv:29400"


def test_the_default_grace_is_derived_from_the_last_measured_save_and_the_dry_run_says_so(home):
    """No --grace: 30 s before any save of a job of this name was measured; once a follower
    recorded one (41 s), 1.5 x it + 5 s (67 s); a --grace given wins. The dry-run says which."""
    from notebook_elastic.backends.kubernetes import KubernetesBackend
    from notebook_elastic.backends.kubernetes import grace as pod_grace

    backend = KubernetesBackend(namespace="default")
    spec, bundle, _ = make()
    text = backend.submit_dryrun(spec, bundle).text
    assert "given 30 s" in text and "the default: no save of a job named spot-train measured here yet" in text
    pod_grace.record("spot-train", 41.0)
    dry = backend.submit_dryrun(spec, bundle)
    assert "given 67 s" in dry.text and "derived from the last run's longest save, 41.0 s" in dry.text
    pod = dry.request.objects[-1]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 67
    spec, bundle, _ = make(grace=45)
    dry = backend.submit_dryrun(spec, bundle)
    assert "given 45 s" in dry.text and "(--grace)" in dry.text
    assert pod_grace.derived(1.0) == 30 and pod_grace.derived(None) == 30


@pytest.mark.parametrize(
    "record", ['{"save_s": NaN}', '{"save_s": Infinity}', '{"save_s": 1e30}', '{"save_s": -4}', '{"save_s": "x"}', "[]"]
)
def test_a_damaged_record_of_the_last_save_gives_the_default_grace_and_says_so(home, record):
    """#37 item 16: a saved-grace record holding NaN or Infinity made the launch raise a bare
    ValueError/OverflowError; 1e30 made a terminationGracePeriodSeconds of 1.5e30. A damaged
    record is no measure: the default grace, and the dry-run says why."""
    from notebook_elastic.backends.kubernetes import KubernetesBackend
    from notebook_elastic.backends.kubernetes import grace as pod_grace

    backend = KubernetesBackend(namespace="default")
    spec, bundle, _ = make()
    pod_grace.record("spot-train", 1.0)  # the folder and file as a follower makes them
    pod_grace._path("spot-train").write_text(record)
    dry = backend.submit_dryrun(spec, bundle)
    pod = dry.request.objects[-1]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30
    assert "given 30 s" in dry.text and "the record of the last run's save" in dry.text and "is damaged" in dry.text
    # A worker's report is no better: what no save can take is never recorded.
    for reported in (float("nan"), float("inf"), -1.0, 1e30):
        pod_grace.record("spot-train", reported)
        assert pod_grace.measured("spot-train") is None
    # A long save, but a real one: the grace it derives stays within what --grace takes.
    pod_grace.record("spot-train", 80_000.0)
    assert pod_grace.derived(pod_grace.measured("spot-train")) == 86_400


SECRET_VALUE = "hf_" + "Qx7" * 12  # made up


def test_env_values_go_into_a_secret_and_nowhere_else():
    """--env values: in the job's Secret (created with the values only at submit), read by
    secretKeyRef; never in the ConfigMap, an annotation, a pod spec or the dry-run."""
    k8s = parse_options(workload="job", pvc="checkpoints")
    spec = build_spec(
        nnodes="1:2",
        name="tok",
        backend="kubernetes",
        backend_options={"kubernetes": k8s.to_json()},
        env={"HF_TOKEN": SECRET_VALUE, "WANDB_MODE": "offline"},
    )
    bundle = package_cell("print(1)", NotebookContext(namespace={}), name=spec.name)
    objects = m.build(spec, bundle, k8s, run_id="abcd")
    assert SECRET_VALUE not in yaml.safe_dump_all(objects) and "offline" not in m.to_yaml(objects)
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert secret["metadata"]["name"] == "tok-env"
    assert secret["metadata"]["labels"] == m.labels("tok", "env")
    assert secret["stringData"] == {"HF_TOKEN": m.SECRET_PLACEHOLDER, "WANDB_MODE": m.SECRET_PLACEHOLDER}
    created = m.with_env_values(secret, spec.env)
    assert created["stringData"] == {"HF_TOKEN": SECRET_VALUE, "WANDB_MODE": "offline"}
    assert secret["stringData"]["HF_TOKEN"] == m.SECRET_PLACEHOLDER  # the dry-run's copy is untouched
    worker = objects[-1]["spec"]["template"]["spec"]["containers"][0]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in worker["env"] if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {
        "HF_TOKEN": {"name": "tok-env", "key": "HF_TOKEN"},
        "WANDB_MODE": {"name": "tok-env", "key": "WANDB_MODE"},
    }
    # The annotation keeps the names, so set_range can rebuild the references.
    assert '"env":["HF_TOKEN","WANDB_MODE"]' in objects[0]["metadata"]["annotations"][m.ANNOTATION_SPEC]
    without = build_spec(nnodes="1", name="plain", backend="kubernetes", backend_options={"kubernetes": k8s.to_json()})
    assert "Secret" not in [o["kind"] for o in m.build(without, bundle, k8s, run_id="abcd")]


def named(name, nnodes="1:4"):
    k8s = parse_options(pvc="checkpoints")
    spec = build_spec(
        nnodes=nnodes, nproc_per_node=1, name=name, backend="kubernetes", backend_options={"kubernetes": k8s.to_json()}
    )
    return spec, package_cell("print(1)", NotebookContext(namespace={}), name=spec.name), k8s


def test_names_a_real_server_would_refuse_are_refused_first():
    """#17 defect 8: `2024-run` made a Service `2024-run-rdzv` (not DNS-1035) after its
    ConfigMap existed; an Indexed Job's pod hostnames (<job>-workers-<index>) passed 63."""
    with pytest.raises(SpecError, match=r"--name '2024-run' starts with a digit.*DNS-1035.*like 'run-2024-run'"):
        m.build(*named("2024-run"), run_id="x")
    long = "a" * 52  # the longest --name allows
    m.build(*named(long, nnodes="1:4"), run_id="x")  # a-...-workers-3: 62 characters
    with pytest.raises(
        SpecError, match=r"too long for 101 nodes: .* 64 characters, over Kubernetes' 63; use a name of at most 51"
    ):
        m.build(*named(long, nnodes="1:101"), run_id="x")


def test_cluster_heartbeats_are_overridable():
    k8s = parse_options(pvc="checkpoints")
    spec = build_spec(
        nnodes="1:2",
        nproc_per_node=1,
        name="hb",
        backend="kubernetes",
        backend_options={"kubernetes": k8s.to_json()},
        rdzv_conf="keep_alive_interval=2,keep_alive_max_attempt=10",
    )
    for obj in m.build(spec, package_cell("print(1)", NotebookContext(namespace={}), name="hb"), k8s, run_id="x"):
        if obj["kind"] == "Job":
            args = obj["spec"]["template"]["spec"]["containers"][0]["args"]
            conf = dict(kv.split("=") for kv in args[args.index("--rdzv-conf") + 1].split(","))
            assert (conf["keep_alive_interval"], conf["keep_alive_max_attempt"], conf["read_timeout"]) == (
                "2",
                "10",
                "1800",
            )
    pytorchjob = m.pytorchjob(spec, k8s, rdzv_id="r", epoch=0, target=1)
    conf = {kv["key"]: kv["value"] for kv in pytorchjob["spec"]["elasticPolicy"]["rdzvConf"]}
    assert (conf["keep_alive_interval"], conf["read_timeout"]) == ("2", "1800")


def test_pod_security_restricted_pods_pass_that_level():
    """#17: a namespace enforcing the "restricted" Pod Security Standard refused our pods.
    The checks below are that standard's (non-root, no privilege escalation, all
    capabilities dropped, RuntimeDefault seccomp), on every container we make."""
    spec, bundle, k8s = make(pod_security="restricted")
    objects = m.build(spec, bundle, k8s, run_id="abcd")
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "Job")]
    assert len(pods) == 2
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    baseline = m.build(*make()[:2], make()[2], run_id="abcd")
    assert all("securityContext" not in o["spec"]["template"]["spec"] for o in baseline if o["kind"] == "Deployment")
    with pytest.raises(SpecError, match=r"--pod-security 'strict' is unknown; choose one of: baseline, restricted"):
        parse_options(pod_security="strict")


def test_the_store_never_gets_the_workers_priority_class():
    """#17: a low, preemptible priority class for spot workers made the rendezvous pod the
    scheduler's first victim too. The store has its own (--rdzv-priority-class), or none."""
    spec, bundle, k8s = make(priority_class="preemptible")
    objects = m.build(spec, bundle, k8s, run_id="x")
    rdzv = next(o for o in objects if o["kind"] == "Deployment")
    job = next(o for o in objects if o["kind"] == "Job")
    assert "priorityClassName" not in rdzv["spec"]["template"]["spec"]
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "preemptible"
    spec, bundle, k8s = make(priority_class="preemptible", rdzv_priority_class="training-critical")
    rdzv = next(o for o in m.build(spec, bundle, k8s, run_id="x") if o["kind"] == "Deployment")
    assert rdzv["spec"]["template"]["spec"]["priorityClassName"] == "training-critical"


def _store_pod(**options):
    spec, bundle, k8s = make(**options)
    return next(o for o in m.build(spec, bundle, k8s, run_id="x") if o["kind"] == "Deployment")["spec"]["template"][
        "spec"
    ]


@pytest.mark.parametrize(
    "tolerations",
    [
        ["spot=true:NoSchedule"],
        ["cloud.google.com/gke-spot=true:NoSchedule"],
        ["kubernetes.azure.com/scalesetpriority=spot:NoSchedule"],
    ],
)
def test_the_store_keeps_off_spot_nodes_when_the_workers_tolerate_spot(tolerations):
    """#17 item 5: workers on spot, the store on on-demand nodes by default. A NotIn affinity
    on the clouds' spot labels, not an "on-demand" nodeSelector: that would leave the store
    Pending forever on a cluster whose nodes carry no such label."""
    affinity = _store_pod(tolerations=tolerations)["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    avoided = {e["key"]: e["values"] for e in term["matchExpressions"] if e["operator"] == "NotIn"}
    assert avoided["karpenter.sh/capacity-type"] == ["spot"] and avoided["cloud.google.com/gke-spot"] == ["true"]
    assert avoided["eks.amazonaws.com/capacityType"] == ["SPOT"]
    # The user's own choice wins; without spot workers there is nothing to keep off.
    assert "affinity" not in _store_pod(tolerations=tolerations, rdzv_node_selector=["pool=system"])
    assert "affinity" not in _store_pod(tolerations=["nvidia.com/gpu:NoSchedule"])


def test_the_store_image_is_an_option():
    """The store needs only Python (its server is the standard library): --rdzv-image names
    any image with Python 3; by default a small Python image beside Docker Hub's PyTorch
    images, the workers' own beside a private registry's (test_store_image.py)."""
    assert _store_pod(rdzv_image="registry.example/torch-cpu:2.13")["containers"][0]["image"] == (
        "registry.example/torch-cpu:2.13"
    )
    assert _store_pod(image="registry.example/train:1")["containers"][0]["image"] == "registry.example/train:1"
    with pytest.raises(SpecError, match=r"--rdzv-image 'a b' is not an image reference"):
        parse_options(rdzv_image="a b")


def test_the_default_image_carries_a_tested_torch_and_an_untested_one_is_told(monkeypatch, tmp_path, home):
    """#17: the default image carried torch 2.5.1, outside the range pyproject declares
    tested (the agent reaches into torch internals). The default now names the tested torch,
    and an official PyTorch image with another is told in one sentence, in the dry-run and
    at launch, before anything starts."""
    import notebook_elastic as ne
    from notebook_elastic.agent import torch_adapter
    from notebook_elastic.backends.kubernetes.options import image_torch

    assert torch_adapter.torch_is_tested(image_torch(DEFAULT_IMAGE))
    assert image_torch("ghcr.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime") == (2, 5)
    assert image_torch("registry.example/team/train:2.5.1") is None  # unknown until the pod runs
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "does-not-exist"))  # a dry run needs no cluster
    assert torch_adapter.torch_is_tested(image_torch("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"))  # in range now
    old = "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"
    job = ne.launch("print(1)", backend="kubernetes", image=old, gpus=0, name="old-torch", dry_run=True, user_ns={})
    (warning,) = [w for w in job.dryrun.bundle.launch_warnings if "torch" in w]
    assert warning == (
        f"--image {old} carries torch 2.3, outside the torch notebook-elastic is tested with (>=2.4,<2.16): "
        f"the job may run degraded or fail; use an image with a tested torch, like {DEFAULT_IMAGE}"
    )
    assert f"# warning: {warning}" in job.dryrun.text
    quiet = ne.launch("print(1)", backend="kubernetes", gpus=0, name="new-torch", dry_run=True, user_ns={})
    assert not [w for w in quiet.dryrun.bundle.launch_warnings if "torch" in w]

"""Kubernetes objects of a job, as pure functions of the spec, the bundle and the options.

- ``<job>-code`` ConfigMap: the script, its payload and the worker runtime (a zip of
  ``notebook_elastic.runtime`` and cloudpickle), so any image with torch runs it. The owner
  of everything else: deleting it deletes the job.
- ``<job>-env`` Secret (only when ``--env`` was given): the values, which pods read by
  ``secretKeyRef``; never in the ConfigMap, an annotation or a pod spec. Built here with
  placeholders (``SECRET_PLACEHOLDER``), so dry-runs never hold a value: ``with_env_values``
  puts the values in right before it is created.
- ``<job>-rdzv`` Deployment (one replica) + Service: the c10d rendezvous store, not a trainer
  (with its own image, node selector, tolerations and priority class; kept off spot nodes by
  default when the workers tolerate spot), so losing any worker never takes the rendezvous
  down, and a store pod that is deleted, evicted or loses its node is replaced: the agents
  re-form their round on the new store (runtime/torch_compat.py).
- ``<job>-workers``: an Indexed Job (elastic: scaled by patching completions and
  parallelism together, Kubernetes >= 1.31), or plain pods, or a Kubeflow PyTorchJob with
  an elasticPolicy. Each worker pod runs our torchrun agent with the fast rendezvous
  settings and a join timeout long enough for a cluster autoscaler.
"""

from __future__ import annotations

import base64
import io
import json
import os
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from ... import defaults
from ..._version import __version__
from ...errors import SpecError
from ...plan import LaunchPlan, Place, launch_plan
from ...plan import rdzv_id as run_rdzv_id
from ...runtime import protocol
from ...runtime.payload import PAYLOAD_SUFFIX
from .options import DEFAULT_IMAGE, KubernetesOptions

NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "app.kubernetes.io/managed-by"
VERSION = "app.kubernetes.io/version"
APP = "notebook-elastic"
ANNOTATION_SPEC = "notebook-elastic.io/spec"
ANNOTATION_NOTEBOOK = "notebook-elastic.io/notebook"
ANNOTATION_EPOCH = "notebook-elastic.io/rdzv-epoch"
ANNOTATION_RUN = "notebook-elastic.io/run-id"

CODE_MOUNT = "/opt/notebook-elastic"
SCRIPT = "script.py"
PAYLOAD = "script" + PAYLOAD_SUFFIX
RUNTIME_ZIP = "runtime.zip"
MODULES_ZIP = "modules.zip"  # the notebook's own modules the code imports, when there are any
FILES_ZIP = "files.zip"  # files the code reads by a relative name, unpacked into the working directory
CHECKPOINT_MOUNT = "/checkpoints"
PYTORCHJOB_CONTAINER = "pytorch"  # the name Kubeflow's PyTorchJob webhook requires
MAX_HOSTNAME = 63  # a pod's hostname (an Indexed Job's pods: <job>-<index>) is a DNS-1123 label
MAX_CONFIGMAP_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's data


def labels(job: str, component: str) -> dict[str, str]:
    return {NAME: APP, INSTANCE: job, COMPONENT: component, MANAGED_BY: APP, VERSION: __version__}


def selector(job: str, component: str | None = None) -> str:
    parts = [f"{NAME}={APP}", f"{INSTANCE}={job}"]
    if component:
        parts.append(f"{COMPONENT}={component}")
    return ",".join(parts)


def code_name(job: str) -> str:
    return f"{job}-code"


def rdzv_name(job: str) -> str:
    return f"{job}-rdzv"


def workers_name(job: str) -> str:
    return f"{job}-workers"


def env_name(job: str) -> str:
    return f"{job}-env"


SECRET_PLACEHOLDER = defaults.HIDDEN_VALUE


def env_secret(spec: Any) -> dict[str, Any] | None:
    """The Secret holding the ``--env`` values (placeholders here), or None without any."""
    if not spec.env:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": env_name(spec.name), "labels": labels(spec.name, "env")},
        "type": "Opaque",
        "stringData": {key: SECRET_PLACEHOLDER for key in sorted(spec.env)},
    }


def with_env_values(secret: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The Secret to create: its placeholders replaced by the values (kept in memory only)."""
    out = json.loads(json.dumps(secret))
    out["stringData"] = {key: env[key] for key in out["stringData"]}
    return out


@lru_cache(maxsize=1)
def runtime_zip() -> bytes:
    """notebook_elastic.runtime (+ the package's light __init__) and cloudpickle, zipped with
    fixed timestamps so the same code gives the same bytes."""
    import cloudpickle

    package = Path(__file__).resolve().parents[2]
    files: list[tuple[str, Path]] = [(f"notebook_elastic/{n}", package / n) for n in ("__init__.py", "_version.py")]
    files += [(f"notebook_elastic/runtime/{p.name}", p) for p in sorted((package / "runtime").glob("*.py"))]
    cp = Path(cloudpickle.__file__).parent
    files += [(f"cloudpickle/{p.name}", p) for p in sorted(cp.glob("*.py"))]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, path in files:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    return buf.getvalue()


def pod_workdir(image: str | None) -> str:
    """Where relative paths land in a worker pod: the image's own working directory (we keep it,
    so images that run code from their WORKDIR keep working), inside the container's
    filesystem, which is gone when the pod is."""
    if not image or image == DEFAULT_IMAGE:
        return f"/workspace, the working directory of the default image {DEFAULT_IMAGE}"
    return f"the working directory (WORKDIR) of the image {image}"


def modules_zip(files: dict[str, bytes]) -> bytes:
    """The notebook's own files, zipped with fixed timestamps (modules import from the zip)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname in sorted(files):
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[arcname])
    return buf.getvalue()


def code_configmap(
    spec: Any, bundle: Any, options: KubernetesOptions, *, run_id: str, epoch: int = 0
) -> dict[str, Any]:
    binary = {RUNTIME_ZIP: runtime_zip()}
    if bundle.payload:
        binary[PAYLOAD] = bundle.payload
    if getattr(bundle, "modules", None):
        binary[MODULES_ZIP] = modules_zip(bundle.modules)
    if getattr(bundle, "workdir_files", None):
        binary[FILES_ZIP] = modules_zip(bundle.workdir_files)
    size = len(bundle.script.encode()) + sum(len(v) for v in binary.values())
    if size > MAX_CONFIGMAP_BYTES:
        biggest = sorted((i for i in bundle.manifest.items if i.size), key=lambda i: -i.size)[:2]
        named = ", ".join(f"`{i.name}` ({i.size / 1e6:.1f} MB)" for i in biggest)
        raise SpecError(
            f"the packaged cell is {size / 1e6:.1f} MB, over the 1 MiB a ConfigMap may hold ({named}); load "
            "large data inside the cell from a PersistentVolumeClaim (--pvc) or bake it into the image (--image)"
        )
    spec_json = spec.to_json()
    spec_json.pop("backend_options", None)
    annotations = {
        ANNOTATION_SPEC: json.dumps(spec_json, separators=(",", ":")),
        ANNOTATION_EPOCH: str(epoch),
        ANNOTATION_RUN: run_id,
    }
    if spec.notebook:
        annotations[ANNOTATION_NOTEBOOK] = str(spec.notebook)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": code_name(spec.name), "labels": labels(spec.name, "code"), "annotations": annotations},
        "data": {SCRIPT: bundle.script},
        "binaryData": {k: base64.b64encode(v).decode() for k, v in binary.items()},
    }


def cluster_place(spec: Any, options: KubernetesOptions) -> Place:
    """A cluster as a launch plan sees it: the store behind the job's Service, the script in
    the code ConfigMap, each pod advertising its own IP; GPUs are the device plugin's."""
    return Place(
        rdzv_endpoint=f"{rdzv_name(spec.name)}:{options.rdzv_port}",
        local_addr="$(POD_IP)",
        script=f"{CODE_MOUNT}/{SCRIPT}",
        join_timeout_s=defaults.JOIN_TIMEOUT_S_CLUSTER,
        rdzv_conf=CLUSTER_RDZV_CONF,
        checkpoint_dir=CHECKPOINT_MOUNT,
        env={
            # The notebook's own modules (if shipped) import from their zip; a missing entry is harmless.
            "PYTHONPATH": f"{CODE_MOUNT}/{RUNTIME_ZIP}:{CODE_MOUNT}/{MODULES_ZIP}",
            protocol.ENV_WORKDIR_FILES: f"{CODE_MOUNT}/{FILES_ZIP}",  # unpacked if shipped
            protocol.ENV_STORE_REPLACEABLE: "1",  # the store pod's Deployment brings it back
        },
    )


def plan_for(spec: Any, options: KubernetesOptions, *, rdzv_id: str, epoch: int) -> LaunchPlan:
    return launch_plan(spec, cluster_place(spec, options), rdzv_id=rdzv_id, epoch=epoch)


def _env(spec: Any, plan: LaunchPlan) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": protocol.ENV_NODE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        *({"name": k, "value": v} for k, v in plan.env.items()),
        # The run's generations start above any in a reused checkpoint folder (runtime/state.py).
        {"name": protocol.ENV_RUN, "value": plan.rdzv_id},
    ]
    # The values live in the job's Secret: a pod spec (readable by anyone who may list pods,
    # and kept in the Job object) names them only.
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": env_name(spec.name), "key": k}}} for k in plan.secret_env
    ]
    return env


def _code_volume(spec: Any) -> dict[str, Any]:
    return {"name": "code", "configMap": {"name": code_name(spec.name)}}


# The Pod Security Standard "restricted" (namespaces may enforce it): not root, no privilege
# escalation, every capability dropped, the runtime's default seccomp profile. The official
# torch images run as root, so a non-root uid is named; fsGroup makes the volumes writable.
RESTRICTED_UID = 1000


def _secure(pod_spec: dict[str, Any], options: KubernetesOptions) -> None:
    if options.pod_security != "restricted":
        return
    pod_spec["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": RESTRICTED_UID,
        "runAsGroup": RESTRICTED_UID,
        "fsGroup": RESTRICTED_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for container in pod_spec["containers"]:
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }


def _place(
    pod_spec: dict[str, Any],
    options: KubernetesOptions,
    node_selector: dict,
    tolerations: list,
    priority_class: str | None,
) -> None:
    """Where a pod may run and as whom: its own selector/tolerations/priority, the job's identity."""
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod_spec["tolerations"] = list(tolerations)
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    if options.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]


# Labels of spot (preemptible) nodes across the clouds and autoscalers that set one, with
# the values that mean spot. A NotIn affinity on each keeps a pod off spot nodes and, unlike
# an "on-demand" nodeSelector, never leaves it Pending on a cluster whose nodes carry none.
SPOT_NODE_LABELS = {
    "karpenter.sh/capacity-type": ["spot"],
    "eks.amazonaws.com/capacityType": ["SPOT"],
    "cloud.google.com/gke-spot": ["true"],
    "cloud.google.com/gke-preemptible": ["true"],
    "kubernetes.azure.com/scalesetpriority": ["spot"],
    "node.kubernetes.io/lifecycle": ["spot", "preemptible"],
}


def tolerates_spot(tolerations: list[dict[str, Any]]) -> bool:
    """Whether the workers' tolerations are for spot nodes (a key or value naming spot or
    preemptible, or a cloud's spot label)."""
    for tol in tolerations:
        words = f"{tol.get('key', '')}={tol.get('value', '')}".lower()
        if tol.get("key") in SPOT_NODE_LABELS or "spot" in words or "preemptible" in words:
            return True
    return False


def off_spot_affinity() -> dict[str, Any]:
    expressions = [{"key": k, "operator": "NotIn", "values": v} for k, v in SPOT_NODE_LABELS.items()]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
        }
    }


def rendezvous_pod_spec(spec: Any, options: KubernetesOptions) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "containers": [
            {
                "name": "rendezvous",
                "image": options.store_image,
                "command": ["python", "-m", "notebook_elastic.runtime.store"],
                "args": ["--host", "$(POD_IP)", "--port", str(options.rdzv_port)],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "PYTHONPATH", "value": f"{CODE_MOUNT}/{RUNTIME_ZIP}"},
                    {"name": "PYTHONUNBUFFERED", "value": "1"},
                ],
                "ports": [{"name": "c10d", "containerPort": options.rdzv_port}],
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                # Only a store that serves is behind the Service: a replacement still starting
                # is not an endpoint, so agents keep waiting for it instead of failing on it.
                "readinessProbe": {"tcpSocket": {"port": options.rdzv_port}, "periodSeconds": 2},
                "volumeMounts": [{"name": "code", "mountPath": CODE_MOUNT, "readOnly": True}],
            }
        ],
        "volumes": [_code_volume(spec)],
        "terminationGracePeriodSeconds": 5,
    }
    # Its own priority class, never the workers' (a low "preemptible" one for spot workers would
    # make the store the scheduler's first victim, and every agent would fail with it).
    _place(pod_spec, options, options.rdzv_node_selector, options.rdzv_tolerations, options.rdzv_priority_class)
    if not options.rdzv_node_selector and tolerates_spot(options.tolerations):
        pod_spec["affinity"] = off_spot_affinity()
    _secure(pod_spec, options)
    return pod_spec


def rendezvous_deployment(spec: Any, options: KubernetesOptions) -> dict[str, Any]:
    """The store under a one-replica Deployment: its pod deleted, evicted (a drain, a
    preemption) or lost with its node is replaced by the ReplicaSet controller, and a drain or
    the Cluster Autoscaler may move it (a bare pod blocks both). ``Recreate``: never two
    stores at once."""
    pod_labels = labels(spec.name, "rendezvous")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": rdzv_name(spec.name), "labels": labels(spec.name, "rendezvous")},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {INSTANCE: spec.name, COMPONENT: "rendezvous"}},
            "template": {"metadata": {"labels": pod_labels}, "spec": rendezvous_pod_spec(spec, options)},
        },
    }


def rendezvous_service(spec: Any, options: KubernetesOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": rdzv_name(spec.name), "labels": labels(spec.name, "rendezvous")},
        "spec": {
            "selector": {INSTANCE: spec.name, COMPONENT: "rendezvous"},
            "ports": [{"name": "c10d", "port": options.rdzv_port, "targetPort": options.rdzv_port, "protocol": "TCP"}],
        },
    }


# Rendezvous settings sized for clusters, under the user's --rdzv-conf (which wins): the local
# 1 s x 3 heartbeat declared live agents dead under CPU load on the fixture (network, image
# pulls and starved nodes are worse), so a departure is noticed after 30 s here; and the
# agents' store client waits as long as the join (torch's read_timeout default is 60 s), so
# workers that start before the rendezvous pod serves (image pull, autoscaled pool) wait.
CLUSTER_RDZV_CONF = {
    "keep_alive_interval": "5",
    "keep_alive_max_attempt": "6",
    "read_timeout": str(defaults.JOIN_TIMEOUT_S_CLUSTER),
}


def worker_pod_spec(
    spec: Any, options: KubernetesOptions, *, rdzv_id: str, epoch: int, restart_policy: str = "Never"
) -> dict[str, Any]:
    gpus = options.gpus_per_pod(spec.nproc_per_node)
    resources: dict[str, Any] = {}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    # Always some requests (Burstable, not BestEffort: evicted last); a memory limit only when asked.
    resources["requests"] = options.requests(spec.nproc_per_node)
    if options.memory:
        resources.setdefault("limits", {})["memory"] = options.memory
    mounts = [{"name": "code", "mountPath": CODE_MOUNT, "readOnly": True}]
    volumes: list[dict[str, Any]] = [_code_volume(spec)]
    if options.shm_size:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}})
    if options.pvc:
        mounts.append({"name": "checkpoints", "mountPath": spec.checkpoint_dir or CHECKPOINT_MOUNT})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": options.pvc}})
    plan = plan_for(spec, options, rdzv_id=rdzv_id, epoch=epoch)
    container: dict[str, Any] = {
        "name": "worker",
        "image": options.image,
        "command": list(plan.agent_prefix),
        "args": list(plan.torchrun_args),
        "env": _env(spec, plan),
        "volumeMounts": mounts,
    }
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "containers": [container],
        "volumes": volumes,
        # torchrun's agent stops its workers on SIGTERM, then leaves the rendezvous.
        "terminationGracePeriodSeconds": 30,
    }
    _place(pod_spec, options, options.node_selector, options.tolerations, options.priority_class)
    _secure(pod_spec, options)
    return pod_spec


def workers_job(spec: Any, options: KubernetesOptions, *, rdzv_id: str, epoch: int, target: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": workers_name(spec.name),
            "labels": labels(spec.name, "worker"),
            "annotations": {
                ANNOTATION_EPOCH: str(epoch),
                "notebook-elastic.io/nnodes": f"{spec.nnodes[0]}:{spec.nnodes[1]}",
            },
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": target,
            "parallelism": target,
            "backoffLimit": max(spec.max_restarts, 1),
            "podFailurePolicy": {
                "rules": [
                    # A preempted or evicted pod is replaced without counting as a failure.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    # Its workers failed --max-restarts times over: the job has failed. A new
                    # pod would only fail the same way again (a bug in the cell, say).
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "worker",
                            "operator": "In",
                            "values": [protocol.EXIT_RESTARTS_SPENT],
                        },
                    },
                ]
            },
            # The agents finish together, so one index that succeeded means the training is
            # done: an index still Pending (fewer nodes than asked ran the job) must not keep
            # the Job open, nor a late pod meeting a closed rendezvous fail it (Kubernetes >=
            # 1.31, beta and on by default; GA in 1.33). Lingering pods are terminated.
            "successPolicy": {"rules": [{"succeededCount": 1}]},
            "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
            "template": {
                "metadata": {"labels": labels(spec.name, "worker")},
                "spec": worker_pod_spec(spec, options, rdzv_id=rdzv_id, epoch=epoch),
            },
        },
    }


def worker_pod(spec: Any, options: KubernetesOptions, *, rdzv_id: str, epoch: int, index: int) -> dict[str, Any]:
    """A plain worker pod (``--workload pods``, for clusters without elastic Indexed Jobs)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{workers_name(spec.name)}-{index}",
            "labels": {**labels(spec.name, "worker"), "notebook-elastic.io/index": str(index)},
        },
        "spec": worker_pod_spec(spec, options, rdzv_id=rdzv_id, epoch=epoch),
    }


def pytorchjob(spec: Any, options: KubernetesOptions, *, rdzv_id: str, epoch: int, target: int) -> dict[str, Any]:
    """A Kubeflow PyTorchJob with an elasticPolicy, pointed at our rendezvous service."""
    plan = plan_for(spec, options, rdzv_id=rdzv_id, epoch=epoch)
    lo, hi = plan.nnodes
    pod_spec = worker_pod_spec(spec, options, rdzv_id=rdzv_id, epoch=epoch, restart_policy="OnFailure")
    # Kubeflow's webhook refuses a PyTorchJob without a container named "pytorch".
    pod_spec["containers"][0]["name"] = PYTORCHJOB_CONTAINER
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": workers_name(spec.name),
            "labels": labels(spec.name, "worker"),
            "annotations": {ANNOTATION_EPOCH: str(epoch)},
        },
        "spec": {
            "elasticPolicy": {
                "minReplicas": lo,
                "maxReplicas": hi,
                "rdzvBackend": "c10d",
                "rdzvHost": rdzv_name(spec.name),
                "rdzvPort": options.rdzv_port,
                "rdzvId": rdzv_id,
                "rdzvConf": [{"key": k, "value": v} for k, v in plan.rdzv_conf.items()],
                "maxRestarts": spec.max_restarts,
            },
            "nprocPerNode": str(spec.nproc_per_node),
            "runPolicy": {"cleanPodPolicy": "All", "ttlSecondsAfterFinished": options.ttl_seconds_after_finished},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": target,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "metadata": {"labels": labels(spec.name, "worker")},
                        "spec": pod_spec,
                    },
                }
            },
        },
    }


def check(spec: Any, options: KubernetesOptions) -> None:
    """Refusals that depend on the cluster shape, before anything is sent."""
    if not spec.name[:1].isalpha():
        hint = f"run-{spec.name}"
        raise SpecError(
            f"--name {spec.name!r} starts with a digit, but the job's rendezvous Service ({rdzv_name(spec.name)}) "
            f"must be a DNS-1035 name that starts with a letter; use a name like {hint!r}"
        )
    hostname = f"{workers_name(spec.name)}-{spec.max_nodes - 1}"  # the Job controller names pods' hosts so
    if len(hostname) > MAX_HOSTNAME:
        room = MAX_HOSTNAME - (len(hostname) - len(spec.name))
        raise SpecError(
            f"--name {spec.name!r} is too long for {spec.max_nodes} nodes: the last worker's hostname "
            f"{hostname!r} would be {len(hostname)} characters, over Kubernetes' {MAX_HOSTNAME}; "
            f"use a name of at most {room} characters"
        )
    if spec.max_nodes > 1 and not options.pvc:
        raise SpecError(
            f"--nnodes {spec.nnodes[0]}:{spec.nnodes[1]} may run on several pods, which must share their "
            "checkpoints: pass --pvc NAME (a ReadWriteMany PersistentVolumeClaim, e.g. on EFS or NFS)"
        )
    if spec.checkpoint_dir and not os.path.isabs(spec.checkpoint_dir):
        raise SpecError(f"--checkpoint-dir {spec.checkpoint_dir!r} must be an absolute path inside the pod")


def build(
    spec: Any, bundle: Any, options: KubernetesOptions, *, run_id: str, epoch: int = 0, target: int | None = None
) -> list[dict[str, Any]]:
    """Every object of the job, in creation order (owner first)."""
    check(spec, options)
    target = spec.initial_nodes if target is None else target
    rdzv_id = run_rdzv_id(spec.name, run_id, epoch)
    objects = [code_configmap(spec, bundle, options, run_id=run_id, epoch=epoch)]
    secret = env_secret(spec)
    if secret is not None:
        objects.append(secret)  # before any pod that reads it
    objects += [rendezvous_service(spec, options), rendezvous_deployment(spec, options)]
    if options.workload == "pytorchjob":
        objects.append(pytorchjob(spec, options, rdzv_id=rdzv_id, epoch=epoch, target=target))
    elif options.workload == "pods":
        objects += [worker_pod(spec, options, rdzv_id=rdzv_id, epoch=epoch, index=i) for i in range(target)]
    else:
        objects.append(workers_job(spec, options, rdzv_id=rdzv_id, epoch=epoch, target=target))
    return objects


def without_gpus(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with no ``nvidia.com/gpu`` limit in its pod specs (CPU pods on a CPU cluster)."""
    out = json.loads(json.dumps(obj))
    specs = []
    if out["kind"] == "Pod":
        specs.append(out["spec"])
    elif out["kind"] == "Job":
        specs.append(out["spec"]["template"]["spec"])
    elif out["kind"] == "PyTorchJob":
        specs += [r["template"]["spec"] for r in out["spec"]["pytorchReplicaSpecs"].values()]
    for pod_spec in specs:
        for c in pod_spec.get("containers", []):
            limits = (c.get("resources") or {}).get("limits") or {}
            limits.pop("nvidia.com/gpu", None)
            if not limits:
                (c.get("resources") or {}).pop("limits", None)
    return out


def owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with an ownerReference to ``owner`` (as created: it has a uid)."""
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "blockOwnerDeletion": True,
    }
    out = json.loads(json.dumps(obj))
    out["metadata"]["ownerReferences"] = [ref]
    return out


def to_yaml(objects: list[dict[str, Any]]) -> str:
    import yaml

    shown = []
    for obj in objects:
        obj = json.loads(json.dumps(obj))
        for key in list(obj.get("binaryData", {})):
            obj["binaryData"][key] = f"<{len(base64.b64decode(obj['binaryData'][key]))} bytes, base64>"
        shown.append(obj)
    return yaml.safe_dump_all(shown, sort_keys=False, width=120)

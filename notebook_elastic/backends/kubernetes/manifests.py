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
  re-form their round on the new store (agent/store_link.py).
- ``<job>-workers``: an Indexed Job (elastic: scaled by patching completions and
  parallelism together, Kubernetes >= 1.31), or plain pods, or a Kubeflow PyTorchJob with
  an elasticPolicy. Each worker pod runs our torchrun agent with the fast rendezvous
  settings and a join timeout long enough for a cluster autoscaler.

The objects are built in ``naming.py`` (labels, names), ``code.py`` (ConfigMap, Secret),
``rendezvous.py`` (the store), ``workers.py`` (the workers) and ``podspec.py`` (what pods
share); this module checks the spec against the cluster's rules and builds them all.
"""

from __future__ import annotations

import base64
import json
import os
from typing import TYPE_CHECKING, Any

from ...contract.plan import rdzv_id as run_rdzv_id
from ...errors import SpecError
from .code import (
    SECRET_PLACEHOLDER,
    code_configmap,
    env_secret,
    modules_zip,
    pod_workdir,
    runtime_zip,
    with_env_values,
)
from .naming import (
    ANNOTATION_EPOCH,
    ANNOTATION_NOTEBOOK,
    ANNOTATION_RUN,
    ANNOTATION_SPEC,
    APP,
    CHECKPOINT_MOUNT,
    CODE_MOUNT,
    COMPONENT,
    FILES_ZIP,
    INSTANCE,
    MANAGED_BY,
    MAX_CONFIGMAP_BYTES,
    MAX_HOSTNAME,
    MODULES_ZIP,
    NAME,
    PAYLOAD,
    PYTORCHJOB_CONTAINER,
    RUNTIME_ZIP,
    SCRIPT,
    VERSION,
    code_name,
    env_name,
    labels,
    rdzv_name,
    selector,
    workers_name,
)
from .options import KubernetesOptions
from .podspec import (
    RESTRICTED_UID,
    SPOT_NODE_LABELS,
    off_spot_affinity,
    tolerates_spot,
)
from .rendezvous import (
    rendezvous_deployment,
    rendezvous_pod_spec,
    rendezvous_service,
)
from .workers import (
    CLUSTER_RDZV_CONF,
    cluster_place,
    plan_for,
    pytorchjob,
    worker_pod,
    worker_pod_spec,
    workers_job,
)

if TYPE_CHECKING:
    from ...contract.spec import JobSpec
    from ...packaging import Bundle

# The builders, and every name that was defined here before the objects moved out (still
# imported from here: ``from notebook_elastic.backends.kubernetes import manifests as m``).
__all__ = [
    "ANNOTATION_EPOCH",
    "ANNOTATION_NOTEBOOK",
    "ANNOTATION_RUN",
    "ANNOTATION_SPEC",
    "APP",
    "CHECKPOINT_MOUNT",
    "CLUSTER_RDZV_CONF",
    "CODE_MOUNT",
    "COMPONENT",
    "FILES_ZIP",
    "INSTANCE",
    "MANAGED_BY",
    "MAX_CONFIGMAP_BYTES",
    "MAX_HOSTNAME",
    "MODULES_ZIP",
    "NAME",
    "PAYLOAD",
    "PYTORCHJOB_CONTAINER",
    "RESTRICTED_UID",
    "RUNTIME_ZIP",
    "SCRIPT",
    "SECRET_PLACEHOLDER",
    "SPOT_NODE_LABELS",
    "VERSION",
    "build",
    "check",
    "cluster_place",
    "code_configmap",
    "code_name",
    "env_name",
    "env_secret",
    "labels",
    "modules_zip",
    "off_spot_affinity",
    "owned_by",
    "plan_for",
    "pod_workdir",
    "pytorchjob",
    "rdzv_name",
    "rendezvous_deployment",
    "rendezvous_pod_spec",
    "rendezvous_service",
    "runtime_zip",
    "selector",
    "to_yaml",
    "tolerates_spot",
    "with_env_values",
    "without_gpus",
    "worker_pod",
    "worker_pod_spec",
    "workers_job",
    "workers_name",
]


def check(spec: JobSpec, options: KubernetesOptions) -> None:
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
    spec: JobSpec, bundle: Bundle, options: KubernetesOptions, *, run_id: str, epoch: int = 0, target: int | None = None
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
    out: dict[str, Any] = json.loads(json.dumps(obj))
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
    out: dict[str, Any] = json.loads(json.dumps(obj))
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
    text: str = yaml.safe_dump_all(shown, sort_keys=False, width=120)  # PyYAML is untyped here
    return text

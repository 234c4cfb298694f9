"""The job's workers as objects: the worker pod spec (our torchrun agent, from the launch
plan for a cluster), under an elastic Indexed Job, as plain pods, or under a Kubeflow
PyTorchJob with an elasticPolicy."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ... import defaults
from ...contract import protocol
from ...contract.plan import LaunchPlan, Place, launch_plan
from .kueue import apply_queue, apply_queue_pytorchjob
from .naming import (
    ANNOTATION_EPOCH,
    CHECKPOINT_MOUNT,
    CODE_MOUNT,
    FILES_ZIP,
    MODULES_ZIP,
    PYTORCHJOB_CONTAINER,
    RUNTIME_ZIP,
    SCRIPT,
    labels,
    rdzv_name,
    workers_name,
)
from .options import KubernetesOptions
from .podspec import _code_volume, _env, _place, _secure

if TYPE_CHECKING:
    from ...contract.spec import JobSpec


def cluster_place(spec: JobSpec, options: KubernetesOptions) -> Place:
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
            protocol.ENV_AGENTS_EVICT: "1",  # no supervisor: a pod failing while it joins sends itself away
            # The kubelet's SIGTERM is a notice: the job saves before the pod goes (notice_keeper.py).
            protocol.ENV_NOTICE_GRACE_S: str(options.pod_grace),
            # NOTEBOOK_ELASTIC_LOG=debug in the kernel: the pods' lines at that level too (plumbing/log.py).
            **({protocol.ENV_LOG: os.environ[protocol.ENV_LOG]} if os.environ.get(protocol.ENV_LOG) else {}),
        },
    )


def plan_for(spec: JobSpec, options: KubernetesOptions, *, rdzv_id: str, epoch: int) -> LaunchPlan:
    return launch_plan(spec, cluster_place(spec, options), rdzv_id=rdzv_id, epoch=epoch)


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
    spec: JobSpec, options: KubernetesOptions, *, rdzv_id: str, epoch: int, restart_policy: str = "Never"
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
        # The kubelet's SIGTERM is a notice: the agent's keeper has rank 0 save first, then the
        # agent stops its workers and leaves the rendezvous, all within this grace.
        "terminationGracePeriodSeconds": options.pod_grace,
    }
    _place(pod_spec, options, options.node_selector, options.tolerations, options.priority_class)
    _secure(pod_spec, options)
    return pod_spec


def workers_job(spec: JobSpec, options: KubernetesOptions, *, rdzv_id: str, epoch: int, target: int) -> dict[str, Any]:
    job = _workers_job(spec, options, rdzv_id=rdzv_id, epoch=epoch, target=target)
    return apply_queue(job, options.queue, elastic=spec.nnodes[0] < spec.nnodes[1])


def _workers_job(spec: JobSpec, options: KubernetesOptions, *, rdzv_id: str, epoch: int, target: int) -> dict[str, Any]:
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
                    # Its workers failed while it joined a job that trains: it left, and the
                    # job goes on without it. Not the job's failure; the index gets a new pod
                    # (elsewhere, perhaps), which backs off before it joins and is charged no
                    # more (agent/joiner.py), unless the follower lowers the Job first.
                    {
                        "action": "Ignore",
                        "onExitCodes": {
                            "containerName": "worker",
                            "operator": "In",
                            "values": [protocol.EXIT_EVICTED],
                        },
                    },
                    # Its workers failed --max-restarts times over, or in a way no retry can
                    # mend (state that cannot be saved): the job has failed. A new pod would
                    # only fail the same way again (a bug in the cell, say).
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "worker",
                            "operator": "In",
                            "values": list(protocol.EXITS_FAILED_FOR_GOOD),
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


def worker_pod(spec: JobSpec, options: KubernetesOptions, *, rdzv_id: str, epoch: int, index: int) -> dict[str, Any]:
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


def pytorchjob(spec: JobSpec, options: KubernetesOptions, *, rdzv_id: str, epoch: int, target: int) -> dict[str, Any]:
    """A Kubeflow PyTorchJob with an elasticPolicy, pointed at our rendezvous service."""
    plan = plan_for(spec, options, rdzv_id=rdzv_id, epoch=epoch)
    lo, hi = plan.nnodes
    pod_spec = worker_pod_spec(spec, options, rdzv_id=rdzv_id, epoch=epoch, restart_policy="OnFailure")
    # Kubeflow's webhook refuses a PyTorchJob without a container named "pytorch".
    pod_spec["containers"][0]["name"] = PYTORCHJOB_CONTAINER
    obj = {
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
            "runPolicy": {
                "cleanPodPolicy": "All",
                "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
                # Its pods restart in place (OnFailure): an agent that spent its budget, or gave
                # up on a failure that repeats, would otherwise be restarted forever. The
                # operator fails the job once its containers restarted this often, as a Job's.
                "backoffLimit": max(spec.max_restarts, 1),
            },
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
    return apply_queue_pytorchjob(obj, options.queue)

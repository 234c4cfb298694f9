"""The job's rendezvous store as objects: a one-replica Deployment (replaced when its pod is
deleted, evicted or loses its node; kept off spot nodes when the workers tolerate spot) and
the Service the agents reach it by."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .naming import CODE_MOUNT, COMPONENT, INSTANCE, RUNTIME_ZIP, labels, rdzv_name
from .options import KubernetesOptions
from .podspec import _code_volume, _place, _secure, off_spot_affinity, tolerates_spot

if TYPE_CHECKING:
    from ...contract.spec import JobSpec


def rendezvous_pod_spec(spec: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "containers": [
            {
                "name": "rendezvous",
                "image": options.store_image,
                "command": ["python", "-m", "notebook_elastic.store.run"],
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


def rendezvous_deployment(spec: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
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


def rendezvous_service(spec: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": rdzv_name(spec.name), "labels": labels(spec.name, "rendezvous")},
        "spec": {
            "selector": {INSTANCE: spec.name, COMPONENT: "rendezvous"},
            "ports": [{"name": "c10d", "port": options.rdzv_port, "targetPort": options.rdzv_port, "protocol": "TCP"}],
        },
    }

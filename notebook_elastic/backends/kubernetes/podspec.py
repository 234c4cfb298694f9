"""What every pod of a job shares: the code volume, the environment a launch plan gives a
worker, the Pod Security Standard "restricted" when asked, where a pod may run and as whom,
and how to keep a pod off spot nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...contract import protocol
from ...contract.plan import LaunchPlan
from .naming import code_name, env_name
from .options import KubernetesOptions

if TYPE_CHECKING:
    from ...contract.spec import JobSpec


def _env(spec: JobSpec, plan: LaunchPlan) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": protocol.ENV_NODE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        *({"name": k, "value": v} for k, v in plan.env.items()),
        # The run's generations start above any in a reused checkpoint folder (runtime/checkpoints.py).
        {"name": protocol.ENV_RUN, "value": plan.rdzv_id},
        # Rank 0 logs to MLflow/W&B itself: the job lives on without the notebook.
        {"name": protocol.ENV_TRACK, "value": getattr(spec, "track", None) or "auto"},
    ]
    # The values live in the job's Secret: a pod spec (readable by anyone who may list pods,
    # and kept in the Job object) names them only.
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": env_name(spec.name), "key": k}}} for k in plan.secret_env
    ]
    return env


def _code_volume(spec: JobSpec) -> dict[str, Any]:
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
    node_selector: dict[str, str],
    tolerations: list[dict[str, str]],
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


def tolerates_spot(tolerations: list[dict[str, str]]) -> bool:
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

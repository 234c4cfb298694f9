"""Controlling a job on a cluster: scale (an Indexed Job's completions and parallelism
patched together), change the range (new workers in a new rendezvous epoch), the preemption
and node-loss drills (the Eviction API, or a pod deleted without notice), and stop
(every object deleted, idempotently). ``JobControl`` is held by ``KubernetesBackend``; a
new range's workers are created through the backend's ``Submitter`` (``submit.py``)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

from ...contract import protocol
from ...contract.plan import rdzv_id
from ...contract.spec import out_of_range
from ...errors import BackendError, JobNotFound, SpecError
from ..base import DrillAnswer, RangeAnswer, ScaleAnswer
from . import kueue
from . import manifests as m
from .client import Connection, explain, is_missing
from .options import KubernetesOptions
from .submit import Submitter


def spec_of(cm: Any) -> dict[str, Any]:
    """The job's spec, as its code ConfigMap keeps it."""
    spec: dict[str, Any] = json.loads((cm.metadata.annotations or {}).get(m.ANNOTATION_SPEC, "{}"))
    return spec


def workload_of(cm: Any) -> str:
    """What runs the job's workers (``job``, ``pods`` or ``pytorchjob``), as its code ConfigMap says."""
    workload: str = (cm.metadata.annotations or {}).get("notebook-elastic.io/workload", "job")
    return workload


class JobControl:
    """What may be done to a running job. ``connection`` gives the backend's connection (made
    on first use), ``code`` a job's code ConfigMap (None once it is gone), and ``submitter``
    creates the workers of a new range."""

    def __init__(self, connection: Callable[[], Connection], code: Callable[[str], Any], submitter: Submitter) -> None:
        self.connection = connection
        self.code = code
        self.submitter = submitter

    def _require(self, name: str) -> tuple[Any, dict[str, Any]]:
        cm = self.code(name)
        if cm is None:
            raise JobNotFound(
                f"no job named {name!r} in namespace {self.connection().namespace!r} (see %elastic_jobs kubernetes)"
            )
        return cm, spec_of(cm)

    def scale(self, name: str, nodes: int) -> ScaleAnswer:
        conn = self.connection()
        cm, spec = self._require(name)
        lo, hi = self._range(name, spec)
        if not lo <= nodes <= hi:
            raise SpecError(out_of_range(nodes, lo, hi))
        workload = workload_of(cm)
        try:
            if workload == "job":
                job = conn.batch().read_namespaced_job(m.workers_name(name), conn.namespace)
                refused = kueue.scale_refusal(conn.custom(), conn.namespace, job, nodes)
                if refused:
                    raise SpecError(refused)
                # Elastic Indexed Jobs (Kubernetes >= 1.31): completions and parallelism move together.
                conn.batch().patch_namespaced_job(
                    m.workers_name(name), conn.namespace, {"spec": {"completions": nodes, "parallelism": nodes}}
                )
            elif workload == "pytorchjob":
                conn.custom().patch_namespaced_custom_object(
                    "kubeflow.org",
                    "v1",
                    conn.namespace,
                    "pytorchjobs",
                    m.workers_name(name),
                    {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": nodes}}}},
                )
            else:
                raise BackendError("scaling plain worker pods is not supported; use the default --workload job")
        except (BackendError, SpecError):
            raise
        except Exception as exc:
            raise explain(exc, f"scale job {name!r} to {nodes} pods", conn) from None
        return ScaleAnswer(target=nodes)

    def _range(self, name: str, spec: dict[str, Any]) -> tuple[int, int]:
        try:
            conn = self.connection()
            job = conn.batch().read_namespaced_job(m.workers_name(name), conn.namespace)
            lo, hi = (int(x) for x in (job.metadata.annotations or {})["notebook-elastic.io/nnodes"].split(":"))
            return lo, hi
        except Exception:
            lo, hi = spec.get("nnodes", [1, 1])
            return int(lo), int(hi)

    def set_range(self, name: str, min_nodes: int, max_nodes: int) -> RangeAnswer:
        """torchrun fixes --nnodes per agent, and a Job's pod template cannot change: new
        workers are created in a new rendezvous epoch; they resume from the checkpoint."""
        conn = self.connection()
        cm, spec_json = self._require(name)
        if workload_of(cm) != "job":
            raise BackendError("changing the range is supported for the default --workload job")
        from ...contract.spec import JobSpec

        try:
            job = conn.batch().read_namespaced_job(m.workers_name(name), conn.namespace)
        except Exception as exc:
            raise explain(exc, f"read the workers of {name!r}", conn) from None
        epoch = int((job.metadata.annotations or {}).get(m.ANNOTATION_EPOCH, "0")) + 1
        spec = JobSpec.from_json({**spec_json, "nnodes": [min_nodes, max_nodes]}).validated()
        target = min(max(job.spec.parallelism or min_nodes, min_nodes), max_nodes)
        options = KubernetesOptions.from_json(
            {**json.loads((cm.metadata.annotations or {}).get("notebook-elastic.io/options", "{}"))}
        )
        run_id = (cm.metadata.annotations or {}).get(m.ANNOTATION_RUN, "r")
        new_job = m.workers_job(spec, options, rdzv_id=rdzv_id(name, run_id, epoch), epoch=epoch, target=target)
        # Keep the running job's pod template except for the agent's range and epoch.
        template = conn.api.sanitize_for_serialization(job.spec.template)
        container = template["spec"]["containers"][0]
        new_container = new_job["spec"]["template"]["spec"]["containers"][0]
        container["args"] = new_container["args"]
        fresh = {e["name"]: e for e in new_container["env"] if e["name"] in (protocol.ENV_RDZV_EPOCH, protocol.ENV_RUN)}
        container["env"] = [fresh.get(e["name"], e) for e in container.get("env", [])]
        new_job["spec"]["template"] = template
        new_job["spec"]["template"].get("metadata", {}).get("labels", {}).pop("controller-uid", None)
        for key in ("batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name", "job-name", "controller-uid"):
            new_job["spec"]["template"].get("metadata", {}).get("labels", {}).pop(key, None)
        try:
            self.submitter.own_code_by(name, None)  # else deleting the old Job would delete the whole job
            conn.batch().delete_namespaced_job(
                m.workers_name(name), conn.namespace, propagation_policy="Background", grace_period_seconds=30
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    conn.batch().read_namespaced_job(m.workers_name(name), conn.namespace)
                except Exception as exc:
                    if is_missing(exc):
                        break
                time.sleep(0.2)
            owner = conn.api.sanitize_for_serialization(cm)
            owner.setdefault("apiVersion", "v1")
            owner.setdefault("kind", "ConfigMap")
            made = self.submitter.create(m.owned_by(new_job, owner), f"create the new workers of {name!r}")
            self.submitter.own_code_by(name, made)
        except BackendError:
            raise
        except Exception as exc:
            raise explain(exc, f"change the range of {name!r}", conn) from None
        return RangeAnswer(target=target, reconfigured=True, epoch=epoch)

    def inject(self, name: str, fault: str, target: int | str | None = None) -> DrillAnswer:
        """A drill on a worker pod: ``preempt_node`` evicts it, ``lose_node`` deletes it at once
        (``target``: its name; a random running one when None)."""
        conn = self.connection()
        self._require(name)
        if fault == "kill_worker":
            raise BackendError(
                "the kill-a-worker drill is local only; on Kubernetes use preempt_node (it deletes a worker pod)"
            )
        if fault not in ("preempt_node", "lose_node"):
            raise BackendError(f"unknown fault {fault!r}: use preempt_node or lose_node")
        pods = [
            p
            for p in conn.core().list_namespaced_pod(conn.namespace, label_selector=m.selector(name, "worker")).items
            if p.status and p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]
        if target is None:
            if not pods:
                raise BackendError(f"job {name!r} has no running worker pod to preempt")
            victim = random.choice(pods).metadata.name
        else:
            if target not in {p.metadata.name for p in pods}:
                raise BackendError(
                    f"{target!r} is not a running worker pod of {name!r} (running: {', '.join(p.metadata.name for p in pods) or 'none'})"
                )
            victim = str(target)
        try:
            if fault == "preempt_node":
                # The Eviction API, as a drain or a spot handler uses it: the pod gets the
                # DisruptionTarget condition, so the Job's podFailurePolicy ignores it (a plain
                # DELETE ends it Failed and spends backoffLimit), and PodDisruptionBudgets apply.
                from kubernetes import client

                eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=victim, namespace=conn.namespace))
                conn.core().create_namespaced_pod_eviction(victim, conn.namespace, eviction)
            else:  # lose_node: the node dies without notice, and nothing marks the pod
                conn.core().delete_namespaced_pod(victim, conn.namespace, grace_period_seconds=0)
        except Exception as exc:
            raise explain(
                exc, f"evict pod {victim}" if fault == "preempt_node" else f"delete pod {victim}", conn
            ) from None
        return DrillAnswer(node=victim)

    def cancel(self, name: str) -> None:
        """Delete every object of the job. Idempotent."""
        conn = self.connection()
        ns = conn.namespace
        cm = self.code(name)
        # The README's Role grants PyTorchJobs only to those who use them: touch one only
        # for a job that made one (or when the code ConfigMap, which says, is already gone).
        pytorchjob = cm is None or workload_of(cm) == "pytorchjob"
        # Likewise the env Secret: only a job launched with --env has one.
        has_env = cm is None or bool(spec_of(cm).get("env"))
        steps: list[Callable[[], object]] = [
            lambda: conn.batch().delete_namespaced_job(m.workers_name(name), ns, propagation_policy="Background"),
            lambda: (
                pytorchjob
                and conn.custom().delete_namespaced_custom_object(
                    "kubeflow.org", "v1", ns, "pytorchjobs", m.workers_name(name)
                )
            ),
            lambda: conn.apps().delete_namespaced_deployment(m.rdzv_name(name), ns, propagation_policy="Background"),
            lambda: conn.core().delete_collection_namespaced_pod(ns, label_selector=m.selector(name)),
            lambda: conn.core().delete_namespaced_service(m.rdzv_name(name), ns),
            lambda: has_env and conn.core().delete_namespaced_secret(m.env_name(name), ns),
            lambda: conn.core().delete_namespaced_config_map(m.code_name(name), ns, propagation_policy="Background"),
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:
                from kubernetes.client.exceptions import ApiException

                if is_missing(exc) or (isinstance(exc, ApiException) and exc.status == 405):
                    continue
                if step in (steps[1], steps[5]) and cm is None and isinstance(exc, ApiException) and exc.status == 403:
                    continue  # not granted, and nothing says the job made one
                raise explain(exc, f"stop job {name!r}", conn) from None

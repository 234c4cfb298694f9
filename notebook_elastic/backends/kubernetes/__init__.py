"""The Kubernetes backend: elastic torchrun on cluster pods, no operator needed.

Objects come from ``manifests.py`` (pure); this class creates them in order with the
official client, lists and re-attaches jobs by label, scales (patching an Indexed Job's
completions and parallelism together), changes the range (new workers in a new rendezvous
epoch), runs the preemption drill (evicting a worker pod through the Eviction API), stops (deleting everything,
idempotently), and follows pods and logs (``follow.py``).
"""

from __future__ import annotations

import json
import random
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...errors import BackendError, JobNotFound, SpecError
from ...events import FINAL_STATUSES, Event
from ...plan import rdzv_id
from ...runtime import protocol
from ..base import Backend, DryRun, JobInfo
from . import manifests as m
from .client import Connection, connect, explain, is_missing
from .follow import ClusterFollower
from .options import KubernetesOptions
from .watch import _ts
from .workload import refusal

__all__ = ["KubernetesBackend", "KubernetesOptions"]


class KubernetesBackend(Backend):
    name = "kubernetes"

    def __init__(
        self, namespace: str | None = None, context: str | None = None, connection: Connection | None = None
    ) -> None:
        self._namespace = namespace
        self._context = context
        self._conn = connection

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            self._conn = connect(self._context, self._namespace)
        return self._conn

    def _options(self, spec: Any) -> KubernetesOptions:
        return KubernetesOptions.from_json(spec.backend_options.get("kubernetes"))

    # -- submit --------------------------------------------------------------------------

    def submit_dryrun(self, spec: Any, bundle: Any) -> DryRun:
        options = self._options(spec)
        run_id = secrets.token_hex(4)
        objects = m.build(spec, bundle, options, run_id=run_id)
        plan = m.plan_for(spec, options, rdzv_id=rdzv_id(spec.name, run_id, 0), epoch=0)
        namespace = options.namespace or self._namespace or "<the context's namespace>"
        shipped = sorted(getattr(bundle, "modules", {}) or {})
        text = (
            f"# kubernetes backend: {len(objects)} objects in namespace {namespace}; every object but the ConfigMap\n"
            "# gets an ownerReference to it at creation, so deleting the ConfigMap deletes the job.\n"
            f"# working directory of the workers: {m.pod_workdir(options.image)}; relative paths resolve there,\n"
            "# and what the code writes there vanishes with the pod.\n"
            + (
                f"# the notebook's own modules, shipped in the ConfigMap ({m.MODULES_ZIP}, on the workers' path): "
                + ", ".join(shipped)
                + "\n"
                if shipped
                else ""
            )
            + (
                f"# files the code reads by a relative name, unpacked into that working directory ({m.FILES_ZIP}): "
                + ", ".join(sorted(bundle.workdir_files))
                + "\n"
                if getattr(bundle, "workdir_files", None)
                else ""
            )
            + (
                "# --gpus not given: --nproc-per-node GPUs per worker pod, or none on a cluster where no node\n"
                "# offers nvidia.com/gpu (checked at launch where nodes may be listed).\n"
                if options.gpus is None
                else ""
            )
            + "".join(f"# warning: {w}\n" for w in getattr(bundle, "launch_warnings", []))
            + "# each worker pod runs the launch plan:\n"
            + "".join(f"#{line}\n" for line in plan.text().splitlines())
            + m.to_yaml(objects)
        )
        return DryRun(
            "kubernetes", spec, bundle, {"objects": objects, "run_id": run_id, "options": options.to_json()}, text
        )

    def schedule(self, dryrun: DryRun) -> None:
        conn = self.conn
        objects = dryrun.request["objects"]
        options = KubernetesOptions.from_json(dryrun.request["options"])
        self._check_namespace()
        if options.pvc:
            try:
                conn.core().read_namespaced_persistent_volume_claim(options.pvc, conn.namespace)
            except Exception as exc:
                if is_missing(exc):
                    raise BackendError(
                        f"--pvc {options.pvc!r}: no such PersistentVolumeClaim in namespace {conn.namespace!r}; create it first"
                    ) from None
                raise explain(exc, "read the checkpoint volume claim", conn) from None
        if options.workload == "pytorchjob" and not self.has_pytorchjob_crd():
            raise BackendError(
                "--workload pytorchjob needs the Kubeflow training operator (CRD pytorchjobs.kubeflow.org) on this cluster; use the default --workload job"
            )
        if options.gpus is None and not self._cluster_has_gpus():
            # --gpus defaults to --nproc-per-node, which on a cluster without GPUs leaves every
            # worker Pending forever: there, the default is CPU pods.
            options.gpus = 0
            objects = [m.without_gpus(o) for o in objects]
        code = dict(objects[0])
        code["metadata"] = dict(
            code["metadata"],
            annotations={
                **code["metadata"]["annotations"],
                "notebook-elastic.io/workload": options.workload,
                "notebook-elastic.io/options": json.dumps(options.to_json(), separators=(",", ":")),
            },
        )
        owner = self._create(code, "create the job's code ConfigMap")
        created = [owner]
        try:
            for obj in objects[1:]:
                if obj["kind"] == "Secret":  # the dry-run holds placeholders; the values, only now
                    obj = m.with_env_values(obj, dryrun.spec.env)
                created.append(
                    self._create(m.owned_by(obj, owner), f"create the {obj['kind']} {obj['metadata']['name']}")
                )
            if created[-1]["kind"] in ("Job", "PyTorchJob"):
                self._own_code_by(dryrun.spec.name, created[-1])
        except BackendError:
            self.cancel(dryrun.spec.name)  # nothing half-created is left behind
            raise

    def _own_code_by(self, name: str, workers: dict[str, Any] | None) -> None:
        """The workers' Job (or PyTorchJob) owns the code ConfigMap, which owns the rest: so
        the TTL controller, `kubectl delete job` or a `stop` that deletes the workers removes
        every object of the job, not only the Job (a dead kernel left the ConfigMap, Service
        and the always-restarting rendezvous pod forever). The ConfigMap still owns the Job,
        so deleting it removes everything too. Not blocking: with a reference each way,
        foreground deletion of either must not wait on the other. None: no owner (the
        workers are being replaced)."""
        refs = (
            [
                {
                    "apiVersion": workers["apiVersion"],
                    "kind": workers["kind"],
                    "name": workers["metadata"]["name"],
                    "uid": workers["metadata"]["uid"],
                    "blockOwnerDeletion": False,
                }
            ]
            if workers
            else []
        )
        try:
            self.conn.core().patch_namespaced_config_map(
                m.code_name(name),
                self.conn.namespace,
                [{"op": "add", "path": "/metadata/ownerReferences", "value": refs}],
            )
        except Exception as exc:
            raise explain(exc, f"make the workers of {name!r} own its code ConfigMap", self.conn) from None

    def _check_namespace(self) -> None:
        conn = self.conn
        try:
            conn.core().read_namespace(conn.namespace)
        except Exception as exc:
            if is_missing(exc):
                raise BackendError(
                    f"namespace {conn.namespace!r} does not exist; create it or pass --namespace NAME"
                ) from None
            from kubernetes.client.exceptions import ApiException

            if isinstance(exc, ApiException) and exc.status == 403:
                return  # may not read namespaces: fine, creating objects will tell
            raise explain(exc, "check the namespace", conn) from None

    def _cluster_has_gpus(self) -> bool:
        """Whether any node offers nvidia.com/gpu. Unknown (nodes are cluster-scoped, and the
        README's Role does not grant them) counts as yes: the default stays as it was."""
        try:
            nodes = self.conn.core().list_node().items
        except Exception:
            return True
        if not nodes:
            return True
        return any(int((n.status.allocatable or {}).get("nvidia.com/gpu", "0") or 0) > 0 for n in nodes)

    def has_pytorchjob_crd(self) -> bool:
        try:
            self.conn.extensions().read_custom_resource_definition("pytorchjobs.kubeflow.org")
            return True
        except Exception:
            return False

    def _create(self, obj: dict[str, Any], action: str) -> dict[str, Any]:
        conn = self.conn
        ns = conn.namespace
        kind = obj["kind"]
        try:
            if kind == "ConfigMap":
                made = conn.core().create_namespaced_config_map(ns, obj)
            elif kind == "Secret":
                made = conn.core().create_namespaced_secret(ns, obj)
                made.data = made.string_data = None  # the values stay out of everything we keep
            elif kind == "Service":
                made = conn.core().create_namespaced_service(ns, obj)
            elif kind == "Pod":
                made = conn.core().create_namespaced_pod(ns, obj)
            elif kind == "Deployment":
                made = conn.apps().create_namespaced_deployment(ns, obj)
            elif kind == "Job":
                made = conn.batch().create_namespaced_job(ns, obj)
            elif kind == "PyTorchJob":
                return conn.custom().create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", obj)
            else:
                raise BackendError(f"cannot create a {kind}")
        except BackendError:
            raise
        except Exception as exc:
            raise explain(exc, action, conn) from None
        return conn.api.sanitize_for_serialization(made)

    # -- query ---------------------------------------------------------------------------

    def _code(self, name: str) -> Any:
        try:
            return self.conn.core().read_namespaced_config_map(m.code_name(name), self.conn.namespace)
        except Exception as exc:
            if is_missing(exc):
                return None
            raise explain(exc, f"read job {name!r}", self.conn) from None

    def describe(self, name: str) -> JobInfo | None:
        cm = self._code(name)
        if cm is None:
            return None
        return self._info(cm)

    def _info(self, cm: Any) -> JobInfo:
        conn = self.conn
        name = cm.metadata.labels.get(m.INSTANCE, cm.metadata.name)
        annotations = cm.metadata.annotations or {}
        try:
            spec = json.loads(annotations.get(m.ANNOTATION_SPEC, "{}"))
        except ValueError:
            return JobInfo(
                name, "kubernetes", "damaged", damaged="its spec annotation is unreadable", location=conn.namespace
            )
        pods = conn.core().list_namespaced_pod(conn.namespace, label_selector=m.selector(name, "worker")).items
        phases = [p.status.phase for p in pods if p.status and not p.metadata.deletion_timestamp]
        status = "pending"
        if phases.count("Running"):
            status = "running"
        try:
            job = conn.batch().read_namespaced_job(m.workers_name(name), conn.namespace)
            for cond in job.status.conditions or []:
                if cond.status == "True" and cond.type in ("Complete", "Failed"):
                    status = "succeeded" if cond.type == "Complete" else "failed"
            target = job.spec.parallelism
        except Exception as exc:
            target = len(pods)
            if is_missing(exc) and self._workload(cm) == "job" and not pods:
                # The workers and their Job are gone (deleted, or the TTL) while the code
                # ConfigMap stayed: nothing will run again. Not "pending" forever.
                status = "expired"
        lo, hi = spec.get("nnodes", [1, 1])
        waiting = None
        if status in ("pending", "running") and target and phases.count("Running") < target:
            waiting = self._why_waiting(name, pods, missing=target - len(phases))
        summary = {
            "waiting": waiting,
            "status": status,
            "nodes_running": phases.count("Running"),
            "nodes_pending": phases.count("Pending"),
            "target": target,
            "min_nodes": lo,
            "max_nodes": hi,
            "max_restarts": spec.get("max_restarts"),
            "nproc_per_node": spec.get("nproc_per_node"),
            "started_at": _ts(cm.metadata.creation_timestamp),
        }
        return JobInfo(
            name,
            "kubernetes",
            status,
            summary,
            notebook=spec.get("notebook"),
            created=summary["started_at"],
            location=conn.namespace,
        )

    def _why_waiting(self, name: str, pods: list[Any], missing: int) -> str | None:
        """Why workers the job asked for are not running: the controller could not create
        them (its FailedCreate Event: quota) or the scheduler has no room (PodScheduled)."""
        if missing > 0:
            try:
                events = (
                    self.conn.core()
                    .list_namespaced_event(
                        self.conn.namespace, field_selector=f"involvedObject.name={m.workers_name(name)}"
                    )
                    .items
                )
            except Exception:
                events = []  # no right to read events: say nothing rather than fail the list
            refused = [e for e in events if e.type == "Warning" and e.reason == "FailedCreate"]
            if refused:
                latest = max(refused, key=lambda e: _ts(e.last_timestamp or e.metadata.creation_timestamp) or 0)
                return f"{missing} worker pod(s) could not be created: {refusal(latest.message)}"
        for pod in pods:
            for cond in (pod.status.conditions or []) if pod.status else []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    return f"{pod.metadata.name} pending: {cond.reason}: {cond.message}"
        return None

    def list(self) -> list[JobInfo]:
        conn = self.conn
        try:
            cms = (
                conn.core()
                .list_namespaced_config_map(conn.namespace, label_selector=f"{m.NAME}={m.APP},{m.COMPONENT}=code")
                .items
            )
        except Exception as exc:
            raise explain(exc, "list jobs", conn) from None
        return [self._info(cm) for cm in cms]

    def script(self, name: str) -> str | None:
        cm = self._code(name)
        return (cm.data or {}).get(m.SCRIPT) if cm is not None else None

    def follow(self, name: str, stop: threading.Event) -> Iterator[Event]:
        return iter(ClusterFollower(self.conn, name, stop))

    def history(self, name: str) -> Iterator[Event]:
        """Everything the cluster still has: the pods' logs from their start, then stops."""
        stop = threading.Event()
        follower = ClusterFollower(self.conn, name, stop)
        deadline = time.monotonic() + 10
        events = []
        threading.Timer(max(0.0, deadline - time.monotonic()), stop.set).start()
        for event in follower:
            events.append(event)
        return iter(sorted(events, key=lambda e: e.time))

    # -- control -------------------------------------------------------------------------

    def _require(self, name: str) -> tuple[Any, dict[str, Any]]:
        cm = self._code(name)
        if cm is None:
            raise JobNotFound(
                f"no job named {name!r} in namespace {self.conn.namespace!r} (see %elastic_jobs kubernetes)"
            )
        return cm, self._spec_of(cm)

    def _spec_of(self, cm: Any) -> dict[str, Any]:
        return json.loads((cm.metadata.annotations or {}).get(m.ANNOTATION_SPEC, "{}"))

    def _workload(self, cm: Any) -> str:
        return (cm.metadata.annotations or {}).get("notebook-elastic.io/workload", "job")

    def scale(self, name: str, nodes: int) -> dict[str, Any]:
        conn = self.conn
        cm, spec = self._require(name)
        lo, hi = self._range(name, spec)
        if not lo <= nodes <= hi:
            raise SpecError(
                f"cannot scale to {nodes} nodes: the job's range is {lo}:{hi}; widen it with set_range() first"
            )
        workload = self._workload(cm)
        try:
            if workload == "job":
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
        except BackendError:
            raise
        except Exception as exc:
            raise explain(exc, f"scale job {name!r} to {nodes} pods", conn) from None
        return {"target": nodes}

    def _range(self, name: str, spec: dict[str, Any]) -> tuple[int, int]:
        try:
            job = self.conn.batch().read_namespaced_job(m.workers_name(name), self.conn.namespace)
            lo, hi = (int(x) for x in (job.metadata.annotations or {})["notebook-elastic.io/nnodes"].split(":"))
            return lo, hi
        except Exception:
            lo, hi = spec.get("nnodes", [1, 1])
            return int(lo), int(hi)

    def set_range(self, name: str, min_nodes: int, max_nodes: int) -> dict[str, Any]:
        """torchrun fixes --nnodes per agent, and a Job's pod template cannot change: new
        workers are created in a new rendezvous epoch; they resume from the checkpoint."""
        conn = self.conn
        cm, spec_json = self._require(name)
        if self._workload(cm) != "job":
            raise BackendError("changing the range is supported for the default --workload job")
        from ...spec import JobSpec

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
            self._own_code_by(name, None)  # else deleting the old Job would delete the whole job
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
            made = self._create(m.owned_by(new_job, owner), f"create the new workers of {name!r}")
            self._own_code_by(name, made)
        except BackendError:
            raise
        except Exception as exc:
            raise explain(exc, f"change the range of {name!r}", conn) from None
        return {"target": target, "reconfigured": True, "epoch": epoch}

    def inject(self, name: str, fault: str, target: Any = None, **options: Any) -> dict[str, Any]:
        conn = self.conn
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
            victim = target
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
        return {"node": victim}

    def cancel(self, name: str) -> None:
        """Delete every object of the job. Idempotent."""
        conn = self.conn
        ns = conn.namespace
        cm = self._code(name)
        # The README's Role grants PyTorchJobs only to those who use them: touch one only
        # for a job that made one (or when the code ConfigMap, which says, is already gone).
        pytorchjob = cm is None or self._workload(cm) == "pytorchjob"
        # Likewise the env Secret: only a job launched with --env has one.
        has_env = cm is None or bool(self._spec_of(cm).get("env"))
        steps = [
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


FINAL = FINAL_STATUSES

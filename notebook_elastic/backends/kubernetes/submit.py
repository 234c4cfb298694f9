"""Submitting a job to a cluster: the dry-run (the objects and the launch plan, as text),
and creating them in order, the code ConfigMap first as the owner of the rest, with nothing
half-created left behind on a refusal. ``Submitter`` is held by ``KubernetesBackend``, and
lent to its ``JobControl`` (``control.py``), which creates a range's new workers with it."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...agent.notice_keeper import LEAVE_S
from ...contract.plan import rdzv_id
from ...errors import BackendError
from ...plumbing import log as _logging
from ..base import DryRun
from . import grace, kueue
from . import manifests as m
from .client import Connection, explain, is_missing
from .options import KubernetesOptions

if TYPE_CHECKING:
    from ...contract.spec import JobSpec
    from ...packaging import Bundle

_log = _logging.get("backends.kubernetes.submit")


@dataclass(frozen=True)
class ClusterRequest:
    """What a job on a cluster would be: its objects in the order they are created, the run's
    id (its rendezvous and its objects' annotations carry it), and its Kubernetes options (the
    grace resolved; the GPUs, when not given, decided as it is scheduled)."""

    objects: list[dict[str, Any]]
    run_id: str
    options: KubernetesOptions


class Submitter:
    """``submit_dryrun`` and ``schedule``, and the creation of each object. ``connection``
    gives the backend's connection, made on first use (a dry-run needs none); ``namespace``
    is the one the backend was given, if any; ``cancel`` deletes what a refused schedule made."""

    def __init__(
        self, connection: Callable[[], Connection], namespace: str | None, cancel: Callable[[str], None]
    ) -> None:
        self.connection = connection
        self.namespace = namespace
        self.cancel = cancel

    def _options(self, spec: JobSpec) -> KubernetesOptions:
        """The job's options, its pods' grace resolved: the user's, else derived from the last
        save measured for a job of this name here (grace.py)."""
        options = KubernetesOptions.from_json(spec.backend_options.get("kubernetes"))
        if options.grace is None:
            options.grace = grace.derived(grace.measured(spec.name))
        return options

    def submit_dryrun(self, spec: JobSpec, bundle: Bundle) -> DryRun:
        options = self._options(spec)
        run_id = secrets.token_hex(4)
        objects = m.build(spec, bundle, options, run_id=run_id)
        plan = m.plan_for(spec, options, rdzv_id=rdzv_id(spec.name, run_id, 0), epoch=0)
        namespace = options.namespace or self.namespace or "<the context's namespace>"
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
            + (
                f"# notice: a worker pod is given {options.grace} s between the kubelet's SIGTERM and its SIGKILL\n"
                f"# ({grace.why(options.grace_given, grace.measured(spec.name), spec.name)});\n"
                f"# the job saves on that notice first, so a save must end within {options.pod_grace - LEAVE_S:g} s\n"
                "# (a save measured longer is told while the job runs, with the --grace that would hold it).\n"
            )
            + (
                f"# queue: the workers' Job is created suspended in Kueue's LocalQueue {options.queue}; it starts when\n"
                "# Kueue admits it (the views say what quota it waits for), and a Kueue preemption is a notice.\n"
                + (
                    "# scaling while admitted needs Kueue's ElasticJobsViaWorkloadSlices gate (the Job is marked elastic).\n"
                    if spec.nnodes[0] < spec.nnodes[1]
                    else ""
                )
                if options.queue
                else ""
            )
            + "".join(f"# warning: {w}\n" for w in getattr(bundle, "launch_warnings", []))
            + "# each worker pod runs the launch plan:\n"
            + "".join(f"#{line}\n" for line in plan.text().splitlines())
            + m.to_yaml(objects)
        )
        return DryRun("kubernetes", spec, bundle, ClusterRequest(objects, run_id, options), text)

    def schedule(self, dryrun: DryRun) -> None:
        conn = self.connection()
        if not isinstance(dryrun.request, ClusterRequest):
            raise BackendError(f"a dry-run of the {dryrun.backend} backend cannot be scheduled on a cluster")
        objects = dryrun.request.objects
        options = dataclasses.replace(dryrun.request.options)  # its own: what the cluster has decides a default here
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
        if options.queue:
            kueue.check_queue(conn.custom(), conn.namespace, options.queue)
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
        owner = self.create(code, "create the job's code ConfigMap")
        created = [owner]
        try:
            for obj in objects[1:]:
                if obj["kind"] == "Secret":  # the dry-run holds placeholders; the values, only now
                    obj = m.with_env_values(obj, dryrun.spec.env)
                created.append(
                    self.create(m.owned_by(obj, owner), f"create the {obj['kind']} {obj['metadata']['name']}")
                )
            if created[-1]["kind"] in ("Job", "PyTorchJob"):
                self.own_code_by(dryrun.spec.name, created[-1])
        except BackendError:
            self.cancel(dryrun.spec.name)  # nothing half-created is left behind
            raise

    def own_code_by(self, name: str, workers: dict[str, Any] | None) -> None:
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
        conn = self.connection()
        try:
            conn.core().patch_namespaced_config_map(
                m.code_name(name),
                conn.namespace,
                [{"op": "add", "path": "/metadata/ownerReferences", "value": refs}],
            )
        except Exception as exc:
            raise explain(exc, f"make the workers of {name!r} own its code ConfigMap", conn) from None

    def _check_namespace(self) -> None:
        conn = self.connection()
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
            nodes = self.connection().core().list_node().items
        except Exception:
            _log.debug("the cluster's nodes could not be listed: GPUs not checked", exc_info=True)
            return True
        if not nodes:
            return True
        return any(int((n.status.allocatable or {}).get("nvidia.com/gpu", "0") or 0) > 0 for n in nodes)

    def has_pytorchjob_crd(self) -> bool:
        try:
            self.connection().extensions().read_custom_resource_definition("pytorchjobs.kubeflow.org")
            return True
        except Exception:
            _log.debug("no PyTorchJob CRD readable", exc_info=True)
            return False

    def create(self, obj: dict[str, Any], action: str) -> dict[str, Any]:
        conn = self.connection()
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
                resource: dict[str, Any] = conn.custom().create_namespaced_custom_object(
                    "kubeflow.org", "v1", ns, "pytorchjobs", obj
                )
                return resource
            else:
                raise BackendError(f"cannot create a {kind}")
        except BackendError:
            raise
        except Exception as exc:
            raise explain(exc, action, conn) from None
        kept: dict[str, Any] = conn.api.sanitize_for_serialization(made)
        return kept

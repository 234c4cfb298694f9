"""Kueue: a job queued for quota (``--queue NAME``), as Kueue's own integration for
``batch/v1`` Jobs expects it, and what its Workload says, as events.

- The workers' Job carries the ``kueue.x-k8s.io/queue-name`` label and is created
  suspended (``spec.suspend: true``, what Kueue's mutating webhook would set): Kueue makes
  a Workload for it, admits it when the ClusterQueue behind the LocalQueue has quota, and
  only then unsuspends it. The rendezvous store is no workload and runs at once.
- An elastic job (MIN < MAX) also carries ``kueue.x-k8s.io/elastic-job: "true"``: where
  the cluster enables Kueue's ``ElasticJobsViaWorkloadSlices`` gate, Kueue copies it onto
  the Workload, and a scale-up is admitted as a new workload slice while the job trains on
  (a scale-down is recorded in place). Where the Workload lacks it, the gate is off, and a
  change of size would make Kueue stop the whole job and queue it again: ``scale_refusal``
  says so before anything is patched.
- What the Workload says becomes a ``queue`` event: ``waiting`` (the quota it waits for,
  in Kueue's words), ``admitted`` (to which ClusterQueue), ``evicted`` (preempted by a
  workload of higher priority, or its quota reclaimed): Kueue suspends the Job, its pods get
  the kubelet's SIGTERM, which is a notice (the job saves first), and it waits for quota
  again; readmitted, it resumes from that save.

The names are Kueue's (``pkg/constants``, ``pkg/controller/constants``,
``apis/kueue/v1beta2``); Workloads are read at ``v1beta2`` (Kueue >= 0.15), else ``v1beta1``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal, TypedDict, TypeGuard

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

from ...contract.event_types import Kind, Queue
from ...errors import BackendError
from ...plumbing import log as _logging

_log = _logging.get("backends.kubernetes.kueue")

GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # newest first; both serve the fields read here
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # on each Workload Kueue makes for a Job


def apply_queue(job: dict[str, Any], queue: str | None, elastic: bool) -> dict[str, Any]:
    """The workers' Job, queued in ``queue``: labelled, suspended and, when its range lets
    it change size, marked elastic. Unchanged without a queue."""
    if not queue:
        return job
    meta = job["metadata"]
    meta["labels"] = {**meta.get("labels", {}), QUEUE_LABEL: queue}
    if elastic:
        meta["annotations"] = {**meta.get("annotations", {}), ELASTIC_ANNOTATION: "true"}
    job["spec"]["suspend"] = True
    return job


def apply_queue_pytorchjob(obj: dict[str, Any], queue: str | None) -> dict[str, Any]:
    """A Kubeflow PyTorchJob, queued: labelled and suspended through its runPolicy (Kueue's
    kubeflow integration; it has no workload slices, so its size is fixed while admitted)."""
    if not queue:
        return obj
    obj["metadata"]["labels"] = {**obj["metadata"].get("labels", {}), QUEUE_LABEL: queue}
    obj["spec"]["runPolicy"]["suspend"] = True
    return obj


def _is(cond: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    """Whether a Workload condition is there and true (then it is a dict: read its reason)."""
    return cond is not None and cond.get("status") == "True"


class WorkloadState(TypedDict):
    """What Kueue says of a job: a ``queue`` event's fields (``Queue``) but the queue's name,
    which the caller adds (``Queue(queue=..., **state)``: mypy checks each field against it)."""

    state: Literal["waiting", "admitted", "evicted"]
    reason: NotRequired[str]
    message: NotRequired[str]
    cluster_queue: NotRequired[str]
    workload: NotRequired[str]
    count: NotRequired[int]
    elastic: NotRequired[bool]
    slice: NotRequired[bool]


def workload_state(workloads: list[dict[str, Any]]) -> WorkloadState | None:
    """What Kueue says of a job, from its Workloads (several while a slice replaces another):
    the newest one not finished decides. ``state`` is ``admitted``, ``evicted`` or
    ``waiting``; None when Kueue has made none yet, or all are finished."""
    live = [w for w in workloads if not _is(_condition(w, "Finished"))]
    if not live:
        return None
    # A pending slice (a scale-up) waits beside the admitted one it is to replace: the job
    # trains on, and the slice's wait is what there is to say.
    live.sort(key=lambda w: (w["metadata"].get("creationTimestamp") or "", w["metadata"].get("name", "")))
    wl = live[-1]
    status = wl.get("status") or {}
    elastic = (wl["metadata"].get("annotations") or {}).get(ELASTIC_ANNOTATION) == "true"
    count = sum(int(ps.get("count", 0)) for ps in (wl.get("spec") or {}).get("podSets", []))
    name = wl["metadata"]["name"]
    evicted = _condition(wl, "Evicted")
    admitted = _condition(wl, "Admitted")
    if _is(admitted):
        admission = status.get("admission") or {}
        return WorkloadState(
            workload=name,
            elastic=elastic,
            count=count,
            state="admitted",
            cluster_queue=admission.get("clusterQueue", ""),
        )
    if _is(evicted):
        return WorkloadState(
            workload=name,
            elastic=elastic,
            count=count,
            state="evicted",
            reason=evicted.get("reason", ""),
            message=evicted.get("message", ""),
        )
    reserved = _condition(wl, "QuotaReserved") or {}
    return WorkloadState(
        workload=name,
        elastic=elastic,
        count=count,
        state="waiting",
        reason=reserved.get("reason", "Pending"),
        message=reserved.get("message", "") or "Kueue has not considered it yet",
        slice=len(live) > 1,
    )


def _condition(wl: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (wl.get("status") or {}).get("conditions", []) if c.get("type") == kind), None)


def list_workloads(custom: Any, namespace: str, job_uid: str) -> list[dict[str, Any]]:
    """The Workloads Kueue made for the Job of this uid (by Kueue's own label)."""
    last: Exception | None = None
    for version in VERSIONS:
        try:
            listed = custom.list_namespaced_custom_object(
                GROUP, version, namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={job_uid}"
            )
            return list(listed.get("items", []))
        except Exception as exc:
            from kubernetes.client.exceptions import ApiException

            if isinstance(exc, ApiException) and exc.status == 404:
                last = exc
                continue  # an older Kueue: the next version
            raise
    raise last or BackendError("no Kueue API on this cluster")


def check_queue(custom: Any, namespace: str, queue: str) -> None:
    """Before anything is created: the LocalQueue exists (a Job labelled for a queue that
    does not exist waits forever, suspended). Nothing to say where we may not read queues."""
    from kubernetes.client.exceptions import ApiException

    for version in VERSIONS:
        try:
            listed = custom.list_namespaced_custom_object(GROUP, version, namespace, "localqueues")
        except ApiException as exc:
            if exc.status == 404:
                continue
            if exc.status in (401, 403):
                return  # may not list queues: Kueue, if it is there, tells through the Workload
            raise
        names = sorted(q["metadata"]["name"] for q in listed.get("items", []))
        if queue in names:
            return
        raise BackendError(
            f"--queue {queue!r}: no LocalQueue of that name in namespace {namespace!r}"
            + (f" (there: {', '.join(names)})" if names else " (it has none)")
            + "; pass one of them, or ask the cluster's admin for one (kubectl get localqueues)"
        )
    raise BackendError(
        f"--queue {queue!r}: this cluster has no Kueue (no {GROUP} API); launch without --queue, "
        "or on a cluster where Kueue is installed"
    )


def scale_refusal(custom: Any, namespace: str, job: Any, nodes: int) -> str | None:
    """Why a queued job may not change size now (one sentence), or None. Kueue admits a size,
    not a range: without workload slices a new size makes it stop the whole job and queue it
    again; with them, a scale-up is admitted on its own while the job trains on."""
    queue = (job.metadata.labels or {}).get(QUEUE_LABEL)
    if not queue or nodes == (job.spec.parallelism or 0):
        return None
    try:
        state = workload_state(list_workloads(custom, namespace, job.metadata.uid))
    except Exception:
        _log.debug("Workloads we may not read: Kueue, if it refuses, says so on the Job", exc_info=True)
        return None  # Workloads we may not read: Kueue, if it refuses, says so on the Job
    if state is None or state["state"] != "admitted":
        return None  # not admitted: the size is still the job's to choose, Kueue admits what it asks
    if state["elastic"]:
        return None
    return (
        f"cannot scale to {nodes} nodes: the job is admitted by Kueue (queue {queue!r}) at "
        f"{state['count']} node(s), and this cluster does not enable Kueue's ElasticJobsViaWorkloadSlices "
        "feature gate, without which a new size makes Kueue stop the whole job and queue it again; "
        "ask the cluster's admin to enable it, or stop the job and launch it at the size you want"
    )


class QueueWatch:
    """Each change of what Kueue says of the job, as one ``queue`` event."""

    def __init__(self, custom: Any, namespace: str, queue: str, emit: Callable[..., None]) -> None:
        self.custom = custom
        self.namespace = namespace
        self.queue = queue
        self.emit = emit
        self.last: tuple[Any, ...] | None = None

    def poll(self, job_uid: str) -> None:
        state = workload_state(list_workloads(self.custom, self.namespace, job_uid))
        if state is None:
            return
        key = (state["state"], state.get("reason"), state.get("message"), state.get("count"))
        if key == self.last:
            return
        self.last = key
        self.emit(Kind.QUEUE, None, **Queue(queue=self.queue, **state))

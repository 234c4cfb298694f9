"""Kueue, as the fake API server's controllers model it: enough for a test to tell a job
queued -> admitted -> preempted -> readmitted, and a scale-up admitted as a workload slice.

What is modelled, after Kueue's own code (kubernetes-sigs/kueue v0.19):
- the Job webhook's defaulting (``pkg/controller/jobs/job/job_webhook.go``): a Job labelled
  ``kueue.x-k8s.io/queue-name`` is created suspended; with the ElasticJobsViaWorkloadSlices
  gate on and the ``kueue.x-k8s.io/elastic-job`` annotation, its pod template gets the
  ``kueue.x-k8s.io/elastic-job`` scheduling gate, lifted for the pods a slice admits;
- the job reconciler (``pkg/controller/jobframework/reconciler.go``): one Workload per Job
  (``job-<name>-<hash>``, owned by the Job, labelled with its uid, one pod set ``main`` of
  ``parallelism`` pods), the Job unsuspended once its Workload is admitted and suspended
  again when it is evicted; a Job whose size no longer matches its admitted Workload is
  stopped and queued again at the new size, unless it is elastic, when a scale-down is
  recorded in place and a scale-up is a new slice that replaces the old once admitted
  (``pkg/workloadslicing``);
- the scheduler: a LocalQueue points at a ClusterQueue with a nominal quota of
  ``nvidia.com/gpu`` (kept here, not served: ClusterQueues are cluster-scoped); a Workload is
  admitted, oldest first, when its GPUs fit beside those of the admitted ones, else it waits
  with Kueue's message; a LocalQueue that does not exist makes it inadmissible;
- preemption (``preempt``): a workload of higher priority is admitted in the same
  ClusterQueue and the job's Workload is evicted (``Evicted``/``Preempted`` conditions, as
  ``pkg/workload`` sets them); ``finish`` ends that workload and frees its quota.

Objects are checked against Kueue's CRDs (tests/data, release v0.19.2) by the tests.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store import Store

GROUP = "kueue.x-k8s.io"
GV = f"{GROUP}/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ELASTIC = "kueue.x-k8s.io/elastic-job"  # the annotation and the scheduling gate share this name
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
SLICE_REPLACES = "kueue.x-k8s.io/workload-slice-replacement-for"
FLAVOR = "default-flavor"
GPU = "nvidia.com/gpu"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def condition(type_: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now(),
    }


def set_condition(wl: dict[str, Any], new: dict[str, Any]) -> None:
    conds = wl.setdefault("status", {}).setdefault("conditions", [])
    for i, c in enumerate(conds):
        if c["type"] == new["type"]:
            if (c["status"], c["reason"], c["message"]) != (new["status"], new["reason"], new["message"]):
                conds[i] = new
            return
    conds.append(new)


def is_true(wl: dict[str, Any], type_: str) -> bool:
    return any(c["type"] == type_ and c["status"] == "True" for c in (wl.get("status") or {}).get("conditions", []))


class Kueue:
    """Kueue's webhook, job reconciler and scheduler over the fake cluster's objects."""

    def __init__(self, store: Store, elastic_slices: bool = False) -> None:
        self.store = store  # the cluster's objects (tests/k8s/store.py)
        self.elastic_slices = elastic_slices  # the ElasticJobsViaWorkloadSlices feature gate
        self.quota: dict[str, int] = {}  # ClusterQueue -> nominal nvidia.com/gpu
        self.lock = threading.RLock()

    # -- what an admin or a test does ---------------------------------------------------

    def add_queue(self, name: str, gpus: int, namespace: str = "default") -> None:
        """A LocalQueue ``name`` over a ClusterQueue ``cluster-<name>`` of ``gpus`` GPUs."""
        cq = f"cluster-{name}"
        self.quota[cq] = gpus
        code, body = self.store.create(
            GV, "localqueues", namespace, {"metadata": {"name": name}, "spec": {"clusterQueue": cq}}
        )
        assert code == 201, body

    def set_quota(self, queue: str, gpus: int) -> None:
        self.quota[f"cluster-{queue}"] = gpus

    def preempt(self, job: str, namespace: str = "default") -> str:
        """A workload of higher priority takes the job's quota: it is admitted at once in the
        same ClusterQueue and the job's admitted Workload is evicted. Returns its name."""
        with self.lock:
            [wl] = [w for w in self._workloads(namespace, job) if is_true(w, "Admitted")]
            cq = wl["status"]["admission"]["clusterQueue"]
            usage = self._gpus(wl)
            intruder = {
                "metadata": {"name": f"urgent-{job}"[:63], "labels": {}},
                "spec": {
                    "queueName": wl["spec"]["queueName"],
                    "priority": 1000,
                    "podSets": [{"name": "main", "count": 1, "template": self._template(usage)}],
                },
            }
            code, made = self.store.create(GV, "workloads", namespace, intruder)
            assert code == 201, made
            self._admit(made, cq)
            message = (
                f"Preempted to accommodate a workload (UID: {made['metadata']['uid']}, JobUID: UNKNOWN) "
                "due to prioritization in the ClusterQueue"
            )
            self._evict(wl, "Preempted", message, preempted="InClusterQueue")
            return made["metadata"]["name"]

    def finish(self, workload: str, namespace: str = "default") -> None:
        """A workload ends (its job done): its quota is free again."""
        wl = self.store.get("workloads", workload, namespace, GV)
        set_condition(wl, condition("Finished", True, "Succeeded", "Job finished successfully"))
        self.store.put("MODIFIED", wl)

    # -- the Job webhook ------------------------------------------------------------------

    def default_job(self, job: dict[str, Any]) -> None:
        """Kueue's mutating webhook on a Job being created."""
        meta = job.get("metadata") or {}
        if not (meta.get("labels") or {}).get(QUEUE_LABEL):
            return
        job.setdefault("spec", {})["suspend"] = True
        if self.elastic_slices and (meta.get("annotations") or {}).get(ELASTIC) == "true":
            pod_spec = job["spec"].setdefault("template", {}).setdefault("spec", {})
            gates = pod_spec.setdefault("schedulingGates", [])
            if not any(g.get("name") == ELASTIC for g in gates):
                gates.append({"name": ELASTIC})

    # -- the controllers, one pass ----------------------------------------------------------

    def reconcile(self) -> None:
        with self.lock:
            for job in self._jobs():
                self._reconcile_job(job)
            self._schedule()
            for job in self._jobs():
                self._sync_job(job)

    def _jobs(self) -> list[dict[str, Any]]:
        with self.store.lock:
            return [
                copy.deepcopy(o)
                for k, o in self.store.objects.items()
                if k[1] == "jobs" and (o["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            ]

    def _workloads(self, namespace: str, job_name: str | None = None, live: bool = True) -> list[dict[str, Any]]:
        with self.store.lock:
            out = [
                copy.deepcopy(o)
                for k, o in self.store.objects.items()
                if k[0] == GV and k[1] == "workloads" and k[2] == namespace
            ]
        if job_name is not None:
            out = [
                w
                for w in out
                if any(
                    r.get("kind") == "Job" and r.get("name") == job_name
                    for r in w["metadata"].get("ownerReferences", [])
                )
            ]
        if live:
            out = [w for w in out if not is_true(w, "Finished")]
        return sorted(out, key=lambda w: (w["metadata"]["creationTimestamp"], int(w["metadata"]["resourceVersion"])))

    @staticmethod
    def _gpus(wl: dict[str, Any]) -> int:
        total = 0
        for ps in wl["spec"]["podSets"]:
            per_pod = sum(
                int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0))
                for c in ps["template"]["spec"].get("containers", [])
            )
            total += per_pod * int(ps.get("count", 1))
        return total

    @staticmethod
    def _template(gpus: int) -> dict[str, Any]:
        return {
            "spec": {
                "containers": [{"name": "c", "image": "urgent", "resources": {"limits": {GPU: str(gpus)}}}],
                "restartPolicy": "Never",
            }
        }

    def _job_done(self, job: dict[str, Any]) -> bool:
        return any(
            c.get("status") == "True" and c["type"] in ("Complete", "Failed")
            for c in (job.get("status") or {}).get("conditions", [])
        )

    def _elastic(self, job: dict[str, Any]) -> bool:
        return self.elastic_slices and (job["metadata"].get("annotations") or {}).get(ELASTIC) == "true"

    def _new_workload(self, job: dict[str, Any], replaces: dict[str, Any] | None = None) -> None:
        meta = job["metadata"]
        count = int(job["spec"].get("parallelism", 1))
        suffix = hashlib.sha256(f"{meta['uid']}/{count}/{time.time_ns()}".encode()).hexdigest()[:5]
        template = copy.deepcopy(job["spec"]["template"])
        template.get("spec", {}).pop("schedulingGates", None)
        annotations = {}
        if self._elastic(job):
            annotations[ELASTIC] = "true"
            if replaces is not None:
                annotations[SLICE_REPLACES] = f"{meta['namespace']}/{replaces['metadata']['name']}"
        wl = {
            "metadata": {
                "name": f"job-{meta['name']}-{suffix}"[:253],
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "queueName": meta["labels"][QUEUE_LABEL],
                "active": True,
                "podSets": [{"name": "main", "count": count, "template": template}],
            },
        }
        code, body = self.store.create(GV, "workloads", meta["namespace"], wl)
        assert code == 201, body

    def _reconcile_job(self, job: dict[str, Any]) -> None:
        ns = job["metadata"]["namespace"]
        if self._job_done(job):
            for wl in self._workloads(ns, job["metadata"]["name"]):
                set_condition(wl, condition("Finished", True, "Succeeded", "Job finished successfully"))
                self.store.put("MODIFIED", wl)
            return
        workloads = self._workloads(ns, job["metadata"]["name"])
        if not workloads:
            self._new_workload(job)
            return
        latest = workloads[-1]
        want = int(job["spec"].get("parallelism", 1))
        have = latest["spec"]["podSets"][0]["count"]
        if want == have:
            return
        if not is_true(latest, "QuotaReserved"):
            # Waiting at the wrong size (or a waiting slice the job no longer wants): replaced
            # on the next pass, by a workload (or a slice) of the size the Job asks now.
            self.store.delete(self.store.key(latest))
            return
        if self._elastic(job):
            if want < have:  # scale-down: recorded in place, the quota given back at once
                latest["spec"]["podSets"][0]["count"] = want
                for psa in latest["status"]["admission"]["podSetAssignments"]:
                    psa["count"] = want
                    psa["resourceUsage"] = {GPU: str(self._gpus(latest))}
                self.store.put("MODIFIED", latest)
            else:  # scale-up: a new slice, admitted on its own
                self._new_workload(job, replaces=latest)
            return
        # Not elastic: the Job no longer matches what was admitted; Kueue stops it and
        # queues it again at its new size.
        self._evict(latest, "JobOutOfSync", "The job no longer matches its admitted workload")
        self.store.delete(self.store.key(latest))

    def _cluster_queue(self, wl: dict[str, Any]) -> str | None:
        lq = self.store.get("localqueues", wl["spec"]["queueName"], wl["metadata"]["namespace"], GV)
        return lq["spec"]["clusterQueue"] if lq else None

    def _schedule(self) -> None:
        namespaces = set(self.store.namespaces)
        pending = []
        used: dict[str, int] = {}
        for ns in namespaces:
            for wl in self._workloads(ns):
                if is_true(wl, "QuotaReserved"):
                    cq = wl["status"]["admission"]["clusterQueue"]
                    used[cq] = used.get(cq, 0) + self._gpus(wl)
                else:
                    pending.append(wl)
        pending.sort(key=lambda w: (-int(w["spec"].get("priority", 0)), w["metadata"]["creationTimestamp"]))
        for wl in pending:
            cq = self._cluster_queue(wl)
            if cq is None:
                self._pend(wl, "Inadmissible", f"LocalQueue {wl['spec']['queueName']} doesn't exist")
                continue
            if not wl["spec"].get("active", True):
                continue
            need = self._gpus(wl)
            replaced = self._replaced(wl)
            if replaced is not None and is_true(replaced, "QuotaReserved"):
                need -= self._gpus(replaced)  # a slice reuses the quota of the one it replaces
            free = self.quota.get(cq, 0) - used.get(cq, 0)
            if need <= free:
                used[cq] = used.get(cq, 0) + need
                self._admit(wl, cq)
                if replaced is not None:
                    set_condition(
                        replaced,
                        condition("Finished", True, "WorkloadSliceReplaced", f"Replaced by {wl['metadata']['name']}"),
                    )
                    self.store.put("MODIFIED", replaced)
            else:
                self._pend(
                    wl,
                    "Pending",
                    f"couldn't assign flavors to pod set main: insufficient unused quota for {GPU} in flavor "
                    f"{FLAVOR}, {need - max(free, 0)} more needed",
                )

    def _replaced(self, wl: dict[str, Any]) -> dict[str, Any] | None:
        key = (wl["metadata"].get("annotations") or {}).get(SLICE_REPLACES)
        if not key:
            return None
        ns, name = key.split("/", 1)
        return self.store.get("workloads", name, ns, GV)

    def _pend(self, wl: dict[str, Any], reason: str, message: str) -> None:
        before = copy.deepcopy(wl.get("status"))
        set_condition(wl, condition("QuotaReserved", False, reason, message))
        if wl.get("status") != before:
            self.store.put("MODIFIED", wl)

    def _admit(self, wl: dict[str, Any], cq: str) -> None:
        wl.setdefault("status", {})["admission"] = {
            "clusterQueue": cq,
            "podSetAssignments": [
                {
                    "name": ps["name"],
                    "count": ps["count"],
                    "flavors": {GPU: FLAVOR},
                    "resourceUsage": {GPU: str(self._gpus(wl))},
                }
                for ps in wl["spec"]["podSets"]
            ],
        }
        set_condition(wl, condition("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cq}"))
        set_condition(wl, condition("Admitted", True, "Admitted", "The workload is admitted"))
        if any(c["type"] == "Evicted" for c in wl["status"]["conditions"]):
            set_condition(wl, condition("Evicted", False, "QuotaReserved", "Previously: evicted"))
            set_condition(wl, condition("Preempted", False, "QuotaReserved", "Previously: preempted"))
        self.store.put("MODIFIED", wl)

    def _evict(self, wl: dict[str, Any], reason: str, message: str, preempted: str | None = None) -> None:
        set_condition(wl, condition("Evicted", True, reason, message))
        if preempted:
            set_condition(wl, condition("Preempted", True, preempted, message))
        set_condition(wl, condition("QuotaReserved", False, "Pending", message))
        set_condition(wl, condition("Admitted", False, "NoReservation", "The workload has no reservation"))
        wl["status"].pop("admission", None)
        self.store.put("MODIFIED", wl)

    def _sync_job(self, job: dict[str, Any]) -> None:
        """Unsuspend a Job whose Workload is admitted; suspend one that has none admitted;
        lift the slice gate from the pods an admitted slice covers."""
        if self._job_done(job):
            return
        ns = job["metadata"]["namespace"]
        workloads = self._workloads(ns, job["metadata"]["name"])
        admitted = [w for w in workloads if is_true(w, "Admitted")]
        suspended = bool(job["spec"].get("suspend"))
        if admitted and suspended:
            self._patch_job(job, False)
        elif not admitted and not suspended:
            self._patch_job(job, True)
        if admitted and self._elastic(job):
            count = admitted[-1]["spec"]["podSets"][0]["count"]
            with self.store.lock:
                pods = [
                    o
                    for k, o in self.store.objects.items()
                    if k[1] == "pods"
                    and k[2] == ns
                    and any(r.get("uid") == job["metadata"]["uid"] for r in o["metadata"].get("ownerReferences", []))
                ]
            for pod in pods:
                gates = pod["spec"].get("schedulingGates") or []
                index = int(pod["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index", 0))
                if gates and index < count:
                    ungated = copy.deepcopy(pod)
                    ungated["spec"]["schedulingGates"] = [g for g in gates if g.get("name") != ELASTIC]
                    self.store.put("MODIFIED", ungated)

    def _patch_job(self, job: dict[str, Any], suspend: bool) -> None:
        with self.store.lock:
            current = self.store.objects.get(self.store.key(job))
            if current is None:
                return
            updated = copy.deepcopy(current)
            updated["spec"]["suspend"] = suspend
            self.store.put("MODIFIED", updated)

"""The batch/v1 Job controller: one pod per index up to parallelism, replacements for pods that
failed or vanished (a terminating one waited for), scale by completions/parallelism, the
Complete/Failed/SuccessCriteriaMet/Suspended conditions, backoffLimit, podFailurePolicy, the
TTL controller, and admission applied to the pods it creates (a FailedCreate Warning Event,
1 s back-off). PyTorchJobs are stored and served, never run: no controller of theirs here."""

from __future__ import annotations

import copy
import random
import string
import time
from typing import TYPE_CHECKING, Any

from .objects import now_rfc3339, parse_rfc3339

if TYPE_CHECKING:
    from .pods import Quota
    from .store import Store

# The fixture's own mark on a pod its Job's suspension terminated (the real controller keeps
# this in memory): such a pod's end is no failure of the Job.
SUSPENDED_BY_JOB = "fake.k8s/terminated-by-suspend"


def pod_failure_action(rules: list[dict[str, Any]], pod: dict[str, Any]) -> tuple[str, str]:
    """The Job controller's podFailurePolicy: the first rule matching a failed pod (by a
    pod condition, or by a container's exit code) gives the action; none -> Count."""
    meta = pod["metadata"]
    for index, rule in enumerate(rules):
        for cond in rule.get("onPodConditions", []):
            if any(
                c.get("type") == cond["type"] and c.get("status") == cond.get("status", "True")
                for c in pod["status"].get("conditions", [])
            ):
                return (
                    rule["action"],
                    f"Pod {meta['namespace']}/{meta['name']} has condition {cond['type']} matching {rule['action']} rule at index {index}",
                )
        codes = rule.get("onExitCodes")
        if codes:
            for cs in pod["status"].get("containerStatuses", []):
                code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
                if code in (None, 0) or codes.get("containerName") not in (None, cs.get("name")):
                    continue
                if (code in codes["values"]) == (codes.get("operator", "In") == "In"):
                    return rule["action"], (
                        f"Container {cs.get('name')} for pod {meta['namespace']}/{meta['name']} failed with exit "
                        f"code {code} matching {rule['action']} rule at index {index}"
                    )
    return "Count", ""


class JobController:
    """Indexed (and NonIndexed) Jobs, reconciled on every pass of the controllers."""

    def __init__(self, store: Store, quota: Quota) -> None:
        self.store = store
        self.quota = quota  # admission, for the pods the controller creates
        self.finished_pods: dict[str, dict[str, Any]] = {}  # pod uid -> its last state, until its Job counted it
        self.create_backoff: dict[str, float] = {}  # job uid -> when its controller may try again

    def run(self) -> None:
        with self.store.lock:
            jobs = [copy.deepcopy(o) for k, o in self.store.objects.items() if k[1] == "jobs"]
        for job in jobs:
            self._reconcile(job)

    def _reconcile(self, job: dict[str, Any]) -> None:
        spec, status = job["spec"], job.setdefault("status", {})
        done = [
            c for c in status.get("conditions", []) if c.get("status") == "True" and c["type"] in ("Complete", "Failed")
        ]
        if done:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and time.time() >= parse_rfc3339(done[0]["lastTransitionTime"]) + int(ttl):
                self.store.delete(self.store.key(job), policy="Background")  # the TTL controller
            return
        ns, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
        with self.store.lock:
            pods = [
                copy.deepcopy(o)
                for k, o in self.store.objects.items()
                if k[1] == "pods"
                and k[2] == ns
                and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))
            ]
            live = {p["metadata"]["uid"] for p in pods}
            pods += [
                copy.deepcopy(o)
                for pod_uid, o in self.finished_pods.items()
                if pod_uid not in live and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))
            ]
        completions, parallelism = int(spec.get("completions", 1)), int(spec.get("parallelism", 1))
        suspended = bool(spec.get("suspend"))
        succeeded = set(status.get("completedIndexesList", []))
        failed = int(status.get("failed", 0))
        counted = set(status.get("countedFailures", []))
        rules = (spec.get("podFailurePolicy") or {}).get("rules", [])
        fail_job: str | None = None
        active: dict[int, dict] = {}
        for pod in pods:
            idx = int(pod["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index", -1))
            phase = pod["status"].get("phase")
            if phase == "Succeeded":
                succeeded.add(idx)
            elif phase == "Failed" and idx >= completions:
                continue  # an index scaled away: the controller deleted it, not a failure
            elif phase == "Failed" and pod["metadata"].get("annotations", {}).get(SUSPENDED_BY_JOB):
                self.finished_pods.pop(pod["metadata"]["uid"], None)
                continue  # terminated because its Job was suspended: not a failure
            elif phase == "Failed":
                action, message = pod_failure_action(rules, pod)
                if action == "FailJob":
                    fail_job = message
                if pod["metadata"]["uid"] not in counted and action != "Ignore":
                    failed += 1
                    counted.add(pod["metadata"]["uid"])
            elif not pod["metadata"].get("deletionTimestamp"):
                active[idx] = pod
            if phase in ("Succeeded", "Failed"):
                self.finished_pods.pop(pod["metadata"]["uid"], None)  # counted: the finalizer goes
        new_status = dict(
            status,
            completedIndexesList=sorted(succeeded),
            failed=failed,
            countedFailures=sorted(counted),
            active=len(active),
            succeeded=len(succeeded),
        )
        conditions = []
        lingering: list[dict[str, Any]] = []  # pods to terminate once the status says why
        if fail_job is not None or failed > int(spec.get("backoffLimit", 6)):
            conditions = [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy" if fail_job is not None else "BackoffLimitExceeded",
                    "message": fail_job or "Job has reached the specified backoff limit",
                    "lastTransitionTime": now_rfc3339(),
                }
            ]
            for pod in active.values():
                self.store.delete(self.store.key(pod), grace=5)
        elif completions and len([i for i in succeeded if i < completions]) >= completions:
            conditions = [{"type": "Complete", "status": "True", "lastTransitionTime": now_rfc3339()}]
        elif self._success_policy_met(spec, succeeded):
            # successPolicy: SuccessCriteriaMet, the lingering pods terminated, then Complete.
            conditions = [
                {
                    "type": "SuccessCriteriaMet",
                    "status": "True",
                    "reason": "SuccessPolicy",
                    "lastTransitionTime": now_rfc3339(),
                },
                {"type": "Complete", "status": "True", "reason": "SuccessPolicy", "lastTransitionTime": now_rfc3339()},
            ]
            # As the real controller: the condition first, then the lingering pods terminated
            # (a pod's end read before the condition looked like a failure, exit 143).
            lingering = list(active.values())
        elif suspended:
            # A suspended Job (Kueue holds it): its running pods are terminated with their
            # grace, not counted as failures, and none is created until it is resumed.
            for pod in active.values():
                self._suspend_pod(pod)
            active.clear()
            conditions = [
                {
                    "type": "Suspended",
                    "status": "True",
                    "reason": "JobSuspended",
                    "message": "Job suspended",
                    "lastTransitionTime": now_rfc3339(),
                }
            ]
        else:
            for idx, pod in list(active.items()):
                if idx >= completions:  # scaled down: the highest indexes go
                    self.store.delete(
                        self.store.key(pod), grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30))
                    )
                    active.pop(idx)
            running = len(active)
            for idx in range(completions):
                if running >= parallelism:
                    break
                if idx in active or idx in succeeded:
                    continue
                with self.store.lock:
                    terminating = any(
                        o["metadata"].get("deletionTimestamp")
                        and o["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == str(idx)
                        for k, o in self.store.objects.items()
                        if k[1] == "pods"
                        and k[2] == ns
                        and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))
                    )
                if terminating:
                    continue  # podReplacementPolicy: TerminatingOrFailed -> Failed: wait for it to go
                if not self._create_pod(job, idx):
                    break  # refused (quota): try again on the next sync
                running += 1
        if conditions:
            kept = [c for c in status.get("conditions", []) if c["type"] == "Suspended"]
            if conditions[0]["type"] != "Suspended" or not kept:
                new_status["conditions"] = conditions
        elif any(c["type"] == "Suspended" and c["status"] == "True" for c in status.get("conditions", [])):
            new_status["conditions"] = [
                {
                    "type": "Suspended",
                    "status": "False",
                    "reason": "JobResumed",
                    "message": "Job resumed",
                    "lastTransitionTime": now_rfc3339(),
                }
            ]
        with self.store.lock:
            current = self.store.objects.get(self.store.key(job))
            if current is None or current["metadata"]["uid"] != uid:
                return
            if current.get("status") != new_status:
                updated = copy.deepcopy(current)
                updated["status"] = new_status
                self.store.put("MODIFIED", updated)
        for pod in lingering:
            self.store.delete(self.store.key(pod), grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30)))

    def _suspend_pod(self, pod: dict[str, Any]) -> None:
        with self.store.lock:
            current = self.store.objects.get(self.store.key(pod))
            if current is None or current["metadata"].get("deletionTimestamp"):
                return
            marked = copy.deepcopy(current)
            marked["metadata"].setdefault("annotations", {})[SUSPENDED_BY_JOB] = "true"
            self.store.put("MODIFIED", marked)
        self.store.delete(self.store.key(pod), grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30)))

    @staticmethod
    def _success_policy_met(spec: dict[str, Any], succeeded: set[int]) -> bool:
        for rule in (spec.get("successPolicy") or {}).get("rules", []):
            count = rule.get("succeededCount")
            if count is not None and len(succeeded) >= int(count):
                return True
        return False

    def _create_pod(self, job: dict[str, Any], index: int) -> bool:
        template = copy.deepcopy(job["spec"]["template"])
        meta = template.setdefault("metadata", {})
        labels = meta.setdefault("labels", {})
        labels.update(
            {
                "batch.kubernetes.io/job-completion-index": str(index),
                "job-name": job["metadata"]["name"],
                "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
            }
        )
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job['metadata']['name']}-{index}-{suffix}",
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job["metadata"]["name"],
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": template["spec"],
        }
        for c in pod["spec"].get("containers", []):
            c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
        if job["spec"].get("completionMode") == "Indexed":
            pod["spec"]["hostname"] = f"{job['metadata']['name']}-{index}"  # as the real controller does
        # Admission applies to the controller too: a pod over quota is not created, and the
        # Job gets a FailedCreate Warning (the controller retries on its next sync).
        uid = job["metadata"]["uid"]
        if time.monotonic() < self.create_backoff.get(uid, 0.0):
            return False
        refusal = self.quota.refusal(job["metadata"]["namespace"], pod)
        if refusal:
            self.store.record_event(job, "Warning", "FailedCreate", f"Error creating: {refusal}")
            self.create_backoff[uid] = time.monotonic() + 1.0
            return False
        code, answer = self.store.create("v1", "pods", job["metadata"]["namespace"], pod)
        if code != 201:
            self.store.record_event(job, "Warning", "FailedCreate", f"Error creating: {answer['message']}")
            self.create_backoff[uid] = time.monotonic() + 1.0
            return False
        return True

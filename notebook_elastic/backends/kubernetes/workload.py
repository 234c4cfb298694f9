"""The job's own objects as events: the controller's warnings (a worker pod it may not
create), scale changes and the end from the workers' Job, pods or PyTorchJob, the code
ConfigMap as the job's existence, and at the end the rendezvous released. ``WorkloadEvents``
is held by ``ClusterFollower``, which asks it whether the job exists (``code``); the pod
watch (``pods.py``) reads ``released`` and tells it when a worker pod starts."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

from ...contract import protocol
from ...contract.event_types import Error, Kind, Pending, Scaled
from ...plumbing import log as _logging
from . import kueue
from . import manifests as m
from .client import is_missing
from .pods import first_container, terminated_state
from .watch import Backoff, Followed, Transient, Watcher, _ts, is_forbidden

_log = _logging.get("backends.kubernetes.workload")

POD_NAME = re.compile(r'pods "[^"]*"')


def refusal(message: str | None) -> str:
    """A controller's "Error creating: pods "w-0-x7k2p" is forbidden: ..." without the parts
    that change on every retry (the pod's random name), as users read it."""
    return POD_NAME.sub("pods", message or "").removeprefix("Error creating: ")


class WorkloadEvents:
    """The controller's warnings and the workload's status, folded into events. Before the
    end is told, ``catch_up_all`` reads the rest of every pod's log (log following's)."""

    def __init__(self, followed: Followed, watcher: Watcher, catch_up_all: Callable[[], None]) -> None:
        self.conn = followed.conn
        self.job = followed.job
        self.stop = followed.stop
        self.emit = followed.emit
        self.watcher = watcher
        self.catch_up_all = catch_up_all
        self.core = self.conn.core()
        self.lock = threading.Lock()  # guards warned: the event watch adds, the pod watch clears
        self.warned: set[tuple[str, str]] = set()  # (reason, message) of warnings told
        self.released = False  # we deleted the rendezvous pod of a finished job
        self.queue_watch: kueue.QueueWatch | None = None  # a job queued in Kueue: its Workload's word

    def worker_started(self) -> None:
        """A worker pod could be created: a refusal told before is told again if it comes back."""
        with self.lock:
            self.warned.clear()

    def watch_events(self) -> None:
        """Warnings about the workers' controller object (Job or PyTorchJob), as events.

        A worker pod the controller may not create (the namespace's quota is spent, a
        webhook or a PodSecurity policy refuses it) never exists, so no pod watch can tell
        it; the controller says so only in a FailedCreate Event. Each distinct refusal is
        told once (the controller retries, and the message differs only in the pod's
        random name); a pod that starts after it clears the slate. Without the right to
        list events this is skipped: the rest of following works unchanged."""
        self.watcher.watch(
            self.core.list_namespaced_event,
            self._on_cluster_event,
            optional=True,  # no right to read events (see the Role in docs/how-to/rbac.md)
            field_selector=f"involvedObject.name={m.workers_name(self.job)}",
        )

    def _on_cluster_event(self, kind: str, event: Any) -> None:
        if kind == "DELETED" or event.type != "Warning":
            return
        message = refusal(event.message)
        key = (event.reason, message)
        with self.lock:
            if key in self.warned:
                return
            self.warned.add(key)
        t = _ts(event.last_timestamp or event.event_time or event.metadata.creation_timestamp)
        if event.reason == "FailedCreate":
            self.emit(Kind.PENDING, None, t, **Pending(reason="FailedCreate", message=message, component="workers"))
        else:
            self.emit(Kind.ERROR, None, t, **Error(error=event.reason, message=message))

    def watch_workload(self) -> None:
        """Scale changes and the job's end, from the workers' controller object."""
        batch = self.conn.batch()
        last_parallelism = None
        last_range = None
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            try:
                cm = self.code()
            except Transient:
                backoff.wait()  # the job is still there as far as we know: ask again
                continue
            if cm is None or cm.metadata.deletion_timestamp:
                self._finish("stopped", "stopped on request (the job's objects were deleted)")
                return
            workload = ((cm.metadata.annotations or {}).get("notebook-elastic.io/workload")) or "job"
            try:
                if workload == "job":
                    job = batch.read_namespaced_job(m.workers_name(self.job), self.conn.namespace)
                    spec, status = job.spec, job.status
                    epoch = (job.metadata.annotations or {}).get(m.ANNOTATION_EPOCH)
                    nnodes = (job.metadata.annotations or {}).get("notebook-elastic.io/nnodes")
                    if spec.parallelism != last_parallelism or nnodes != last_range:
                        lo, hi = (int(x) for x in (nnodes or "1:1").split(":"))
                        if last_parallelism is not None:
                            scaled = Scaled(
                                target=spec.parallelism, min_nodes=lo, max_nodes=hi, reconfigured=nnodes != last_range
                            )
                            if epoch is not None and epoch.isdigit():  # the annotation's text: the contract's number
                                scaled["epoch"] = int(epoch)
                            self.emit(Kind.SCALED, **scaled)
                        last_parallelism, last_range = spec.parallelism, nnodes
                    self._poll_queue(job)
                    for cond in status.conditions or []:
                        if cond.status == "True" and cond.type == "Complete":
                            self._finish("succeeded", None)
                            return
                        if cond.status == "True" and cond.type == "Failed":
                            spent = cond.reason == "PodFailurePolicy" and "FailJob" in (cond.message or "")
                            self._finish("failed", f"{cond.reason}: {cond.message}", budget_spent=spent)
                            return
                elif workload == "pods":
                    pods = self.core.list_namespaced_pod(
                        self.conn.namespace, label_selector=m.selector(self.job, "worker")
                    ).items
                    phases = [p.status.phase for p in pods]
                    if pods and all(p == "Succeeded" for p in phases):
                        self._finish("succeeded", None)
                        return
                    if pods and all(p in ("Succeeded", "Failed") for p in phases):
                        # As a Job's FailJob: an agent that spent its budget, or gave up on a
                        # failure that repeats, says which rank failed how (the follower's words).
                        ended = (terminated_state(first_container(p)) for p in pods)
                        codes = (t.exit_code for t in ended if t is not None)
                        code = next((c for c in codes if c in protocol.EXITS_FAILED_FOR_GOOD), None)
                        why = f" (exit code {code})" if code is not None else ""
                        self._finish("failed", f"every worker pod failed{why}", budget_spent=code is not None)
                        return
                else:
                    obj = self.conn.custom().get_namespaced_custom_object(
                        "kubeflow.org", "v1", self.conn.namespace, "pytorchjobs", m.workers_name(self.job)
                    )
                    for cond in (obj.get("status") or {}).get("conditions", []):
                        if cond.get("status") == "True" and cond.get("type") in ("Succeeded", "Failed"):
                            self._finish(cond["type"].lower(), cond.get("message"))
                            return
            except Exception as exc:
                if not is_missing(exc):
                    if is_forbidden(exc):
                        self.watcher.forbidden(exc, f"read the workers of job {self.job!r}")
                    backoff.wait()
                    continue
                # The workload is being replaced (range change) or was deleted.
            backoff.reset()
            self.stop.wait(0.5)

    def _poll_queue(self, job: Any) -> None:
        """A job queued in Kueue: what its Workload says, each change once (kueue.py)."""
        queue = (job.metadata.labels or {}).get(kueue.QUEUE_LABEL)
        if not queue:
            return
        if self.queue_watch is None:
            self.queue_watch = kueue.QueueWatch(self.conn.custom(), self.conn.namespace, queue, self.emit)
        try:
            self.queue_watch.poll(job.metadata.uid)
        except Exception as exc:
            if is_forbidden(exc):
                self.watcher.forbidden(exc, f"read the Kueue Workload of job {self.job!r}")

    def code(self) -> Any:
        """The job's code ConfigMap, None once it is gone (404). Any other failure is no
        answer about the job: ``Transient`` (a 403 is told once), and the caller asks again;
        only a real end (the object deleted, the workload finished) ends the view."""
        try:
            return self.core.read_namespaced_config_map(m.code_name(self.job), self.conn.namespace)
        except Exception as exc:
            if is_missing(exc):
                return None
            if is_forbidden(exc):
                self.watcher.forbidden(exc, f"read job {self.job!r}")
            raise Transient(str(exc)) from exc

    def _finish(self, status: str, reason: str | None, budget_spent: bool = False) -> None:
        time.sleep(1.0)  # let the followed streams deliver the last lines first
        self.catch_up_all()  # and read the rest of every pod's log, so its tail is told before the end
        data: dict[str, Any] = {"status": status}
        if reason:
            data["reason"] = reason
        if budget_spent:
            data["budget_spent"] = True
        if status in ("succeeded", "failed"):
            self._release_rendezvous()
        self.emit(Kind.JOB_FINISHED, **data)

    def _release_rendezvous(self) -> None:
        """The workers are done: the rendezvous store's Deployment (its store serves until
        stopped) and its Service go, so a finished job holds no node. The code ConfigMap, the
        Job and the worker pods stay for their logs until `stop` or ttlSecondsAfterFinished."""
        self.released = True
        for delete in (
            lambda name, ns: self.conn.apps().delete_namespaced_deployment(name, ns, propagation_policy="Background"),
            self.core.delete_namespaced_service,
        ):
            try:
                delete(m.rdzv_name(self.job), self.conn.namespace)
            except Exception:
                _log.debug("gone already, or not ours to delete: `stop` removes it", exc_info=True)

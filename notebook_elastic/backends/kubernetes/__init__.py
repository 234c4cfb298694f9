"""The Kubernetes backend: elastic torchrun on cluster pods, no operator needed.

Objects come from ``manifests.py`` (pure); this class creates them in order with the
official client, lists and re-attaches jobs by label, scales (patching an Indexed Job's
completions and parallelism together), changes the range (new workers in a new rendezvous
epoch), runs the preemption drill (evicting a worker pod through the Eviction API), stops (deleting everything,
idempotently), and follows pods and logs (``follow.py``). The class holds a ``Submitter``
(``submit.py``) and a ``JobControl`` (``control.py``) and hands the ``Backend`` calls to them;
what a cluster has of a job (describe, list, follow) is here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...contract.event_types import FINAL_STATUSES, Kind, Queue
from ...contract.events import Event
from ...contract.job_state.records import JobSummary
from ...plumbing import log as _logging
from ..base import Backend, DrillAnswer, DryRun, JobInfo, RangeAnswer, ScaleAnswer
from . import kueue
from . import manifests as m
from .client import Connection, connect, explain, is_missing
from .control import JobControl, workload_of
from .follow import ClusterFollower
from .options import KubernetesOptions
from .submit import Submitter
from .watch import _ts
from .workload import refusal

_log = _logging.get("backends.kubernetes")

__all__ = ["KubernetesBackend", "KubernetesOptions"]


class KubernetesBackend(Backend):
    """A job's objects on a cluster: submitting (its ``submitter``), controlling (its
    ``control``), and here what is there (describe, list, follow)."""

    name = "kubernetes"

    def __init__(
        self, namespace: str | None = None, context: str | None = None, connection: Connection | None = None
    ) -> None:
        self._namespace = namespace
        self._context = context
        self._conn = connection
        self.submitter = Submitter(lambda: self.conn, namespace, self.cancel)
        self.control = JobControl(lambda: self.conn, self._code, self.submitter)

    @property
    def conn(self) -> Connection:
        """The connection to the cluster, made on first use (a dry-run needs none)."""
        if self._conn is None:
            self._conn = connect(self._context, self._namespace)
        return self._conn

    # -- submit and control (submit.py, control.py) ---------------------------------------

    def submit_dryrun(self, spec: Any, bundle: Any) -> DryRun:
        return self.submitter.submit_dryrun(spec, bundle)

    def schedule(self, dryrun: DryRun) -> None:
        self.submitter.schedule(dryrun)

    def has_pytorchjob_crd(self) -> bool:
        return self.submitter.has_pytorchjob_crd()

    def scale(self, name: str, nodes: int) -> ScaleAnswer:
        return self.control.scale(name, nodes)

    def set_range(self, name: str, min_nodes: int, max_nodes: int) -> RangeAnswer:
        """torchrun fixes --nnodes per agent, and a Job's pod template cannot change: new
        workers are created in a new rendezvous epoch; they resume from the checkpoint."""
        return self.control.set_range(name, min_nodes, max_nodes)

    def inject(
        self,
        name: str,
        fault: str,
        target: int | str | None = None,
        *,
        return_after_s: float | None = None,
        grace_s: float | None = None,
    ) -> DrillAnswer:
        """The pod's own grace is its notice, and a cluster gives capacity back by itself:
        ``grace_s`` and ``return_after_s`` are the local drill's."""
        return self.control.inject(name, fault, target)

    def cancel(self, name: str) -> None:
        """Delete every object of the job. Idempotent."""
        self.control.cancel(name)

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
            queued = self._queue_words(job) if status == "pending" or phases.count("Running") < (target or 0) else None
        except Exception as exc:
            queued = None
            target = len(pods)
            if is_missing(exc) and workload_of(cm) == "job" and not pods:
                # The workers and their Job are gone (deleted, or the TTL) while the code
                # ConfigMap stayed: nothing will run again. Not "pending" forever.
                status = "expired"
        lo, hi = spec.get("nnodes", [1, 1])
        waiting = None
        if status in ("pending", "running") and queued:
            waiting = queued
        elif status in ("pending", "running") and target and phases.count("Running") < target:
            waiting = self._why_waiting(name, pods, missing=target - len(phases))
        summary = JobSummary(
            waiting=waiting,
            status=status,
            nodes_running=phases.count("Running"),
            nodes_pending=phases.count("Pending"),
            target=target,
            min_nodes=lo,
            max_nodes=hi,
            max_restarts=spec.get("max_restarts"),
            nproc_per_node=spec.get("nproc_per_node"),
            started_at=_ts(cm.metadata.creation_timestamp),
        )
        return JobInfo(
            name,
            "kubernetes",
            status,
            summary,
            notebook=spec.get("notebook"),
            created=summary["started_at"],
            location=conn.namespace,
        )

    def _queue_words(self, job: Any) -> str | None:
        """What Kueue says of a queued job that is not admitted (the views' "waiting")."""
        queue = (job.metadata.labels or {}).get(kueue.QUEUE_LABEL)
        if not queue:
            return None
        try:
            state = kueue.workload_state(
                kueue.list_workloads(self.conn.custom(), self.conn.namespace, job.metadata.uid)
            )
        except Exception:
            _log.debug("no right to read Workloads: the pods' own reasons are told instead", exc_info=True)
            return None  # no right to read Workloads: the pods' own reasons are told instead
        if state is None:
            return f"waiting for Kueue to queue it in {queue}"
        if state["state"] == "admitted":
            return None
        return Event(Kind.QUEUE, 0, None, dict(Queue(queue=queue, **state))).describe()

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

    def follow(self, name: str, stop: threading.Event) -> ClusterFollower:
        return ClusterFollower(self.conn, name, stop)  # iterable; takes follow_pod() asks

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


FINAL = FINAL_STATUSES

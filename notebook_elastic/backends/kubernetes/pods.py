"""Worker and rendezvous pods as events: ``pending`` with the scheduler's or the kubelet's
reason, ``node_joined`` when a pod runs (its log followed from then on), a restarted
container, ``node_left`` with why (finished, preempted, evicted, deleted, OOMKilled, exit
code), ``store_lost`` when the rendezvous pod goes. ``PodEvents`` is held by
``ClusterFollower``; it tells log following (``logs.py``) and the workload's events
(``workload.py``) what it sees of the pods, through the narrow ``PodLogs`` and
``PodWorkload``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...contract import protocol
from ...contract.event_types import Error, Kind, NodeJoined, NodeLeft, Pending, StoreLost
from ...contract.events import LineParser
from ...plumbing import log as _logging
from . import manifests as m
from .cursor import LogCursor
from .watch import Followed, Watcher

_log = _logging.get("backends.kubernetes.pods")

WAITING_REASONS = {
    "ImagePullBackOff",
    "ErrImagePull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "InvalidImageName",
    "CreateContainerError",
}


@dataclass
class PodView:
    """What we last knew of a pod, to turn changes into events."""

    name: str
    phase: str = ""
    running_seen: bool = False
    reported_pending: str = ""
    restart_count: int = 0
    left: bool = False
    ip: str | None = None  # its pod IP: the address its agent gives the rendezvous
    index: int | None = None  # its Indexed Job completion index
    failing: bool = False  # a rank of its raised (its log is followed until a new group starts)
    cursor: LogCursor = field(default_factory=LogCursor)  # where its log was left
    lock: threading.Lock = field(default_factory=threading.Lock)
    parser: LineParser = field(init=False)

    def __post_init__(self) -> None:
        self.parser = LineParser(self.name)


def first_container(pod: Any) -> Any:
    """The status of a pod's container (ours run one); None before the kubelet reports it."""
    statuses = (pod.status.container_statuses or []) if pod.status else []
    return statuses[0] if statuses else None


def terminated_state(container: Any) -> Any:
    """How a container ended (exit code, reason), or None while it has not."""
    return container.state.terminated if container is not None and container.state else None


def pod_disruption(pod: Any) -> str | None:
    for cond in pod.status.conditions or [] if pod.status else []:
        if cond.type == "DisruptionTarget" and cond.status == "True":
            reason = cond.reason or ""
            if "Preemption" in reason:
                return "preempted"
            if "Eviction" in reason or "Taint" in reason:
                return "evicted"
            return reason or "disrupted"
    return None


#: ``store_lost``'s reason for a store pod whose node went silent (read after "rendezvous store POD").
STORE_CUT_OFF = "lost (its node stopped answering)"


def node_unreachable(pod: Any) -> bool:
    """Whether the control plane evicted ``pod`` because its node stopped answering: the node
    lifecycle controller marked it not ready (no kubelet reports it) and the taint eviction
    controller deleted it for the node's NoExecute ``unreachable``/``not-ready`` taint
    (DisruptionTarget ``DeletionByTaintManager``). A NoExecute taint someone put on a live node
    evicts too, but leaves the pod ready until its kubelet stops it."""
    if not pod.metadata.deletion_timestamp or not pod.status:
        return False
    conditions = {c.type: c for c in pod.status.conditions or []}
    target, ready = conditions.get("DisruptionTarget"), conditions.get("Ready")
    return (
        target is not None
        and target.status == "True"
        and target.reason == "DeletionByTaintManager"
        and ready is not None
        and ready.status != "True"
    )


class PodLogs(Protocol):
    """What the pod watch tells log following (``logs.LogFollower``)."""

    def pod_started(self, view: PodView) -> None: ...

    def pod_restarted(self, view: PodView) -> None: ...

    def pod_ended(self, view: PodView) -> None: ...


class PodWorkload(Protocol):
    """What the pod watch reads of, and tells, the workload's events (``workload.WorkloadEvents``)."""

    @property
    def released(self) -> bool:
        """Whether we deleted the rendezvous store of a finished job (its pod's end is no news)."""
        ...

    def worker_started(self) -> None: ...


class PodEvents:
    """The pod watch's handlers. ``pods`` (guarded by ``pods_lock``) is shared with log
    following, which reads what this writes."""

    def __init__(
        self,
        followed: Followed,
        watcher: Watcher,
        pods: dict[str, PodView],
        pods_lock: threading.Lock,
        logs: PodLogs,
        workload: PodWorkload,
    ) -> None:
        self.conn = followed.conn
        self.job = followed.job
        self.stop = followed.stop
        self.emit = followed.emit
        self.watcher = watcher
        self.pods = pods
        self.pods_lock = pods_lock
        self.logs = logs
        self.workload = workload
        self.core = self.conn.core()
        self.success_met = False  # the workers' Job met its successPolicy

    def watch_pods(self) -> None:
        self.watcher.watch(
            self.core.list_namespaced_pod,
            self._on_pod,
            relisted=self._pods_relisted,
            bookmarks=True,
            label_selector=m.selector(self.job),
        )

    def _pods_relisted(self, present: set[str]) -> None:
        """Worker pods we followed that a fresh list no longer has were deleted while the
        watch was away (a 410 after a long disconnection): they left."""
        with self.pods_lock:
            gone = [
                v
                for v in self.pods.values()
                if v.name not in present and not v.left and not v.name.startswith(m.rdzv_name(self.job))
            ]
            for view in gone:
                view.left = True
        for view in gone:
            self.emit(Kind.NODE_LEFT, view.name, **NodeLeft(reason="deleted", exitcode=None))

    def _on_pod(self, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        component = (pod.metadata.labels or {}).get(m.COMPONENT)
        with self.pods_lock:
            view = self.pods.setdefault(name, PodView(name))
        status = pod.status
        phase = (status.phase if status else "") or "Pending"
        container = first_container(pod)
        if component == "rendezvous":
            self._on_rendezvous_pod(kind, pod, view, phase, container)
            return
        if view.left:
            return
        if status and status.pod_ip:
            view.ip = status.pod_ip
        index = (pod.metadata.labels or {}).get("batch.kubernetes.io/job-completion-index")
        if index is not None and index.isdigit():
            view.index = int(index)
        # Pending: why.
        if phase == "Pending":
            reason = ""
            for cond in status.conditions or [] if status else []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    reason = f"{cond.reason}: {cond.message}"
            if (
                container
                and container.state
                and container.state.waiting
                and container.state.waiting.reason in WAITING_REASONS
            ):
                w = container.state.waiting
                reason = f"{w.reason}: {w.message or ''}".strip()
            if reason and reason != view.reported_pending:
                view.reported_pending = reason
                head, _, message = reason.partition(": ")
                self.emit(Kind.PENDING, name, **Pending(reason=head, message=message))
        if (
            container
            and container.state
            and container.state.waiting
            and container.state.waiting.reason == "CrashLoopBackOff"
        ):
            reason = f"CrashLoopBackOff: {container.state.waiting.message or ''}"
            if reason != view.reported_pending:
                view.reported_pending = reason
                self.emit(
                    Kind.PENDING,
                    name,
                    **Pending(reason="CrashLoopBackOff", message=container.state.waiting.message or ""),
                )
        # Running: it joined; its log is read (followed, or caught up: logs.py).
        started = container and container.state and (container.state.running or container.state.terminated)
        if started and not view.running_seen:
            view.running_seen = True
            self.workload.worker_started()  # a pod could be created: tell a new refusal again
            self.emit(
                Kind.NODE_JOINED,
                name,
                **NodeJoined(
                    ip=status.pod_ip,
                    index=(pod.metadata.labels or {}).get("batch.kubernetes.io/job-completion-index"),
                ),
            )
            self.logs.pod_started(view)
        if container and container.restart_count and container.restart_count > view.restart_count:
            view.restart_count = container.restart_count
            self.emit(
                Kind.ERROR,
                name,
                **Error(error="ContainerRestarted", message=f"container restarted ({container.restart_count}x)"),
            )
            self.logs.pod_restarted(view)
        # Gone: why.
        disruption = pod_disruption(pod)
        terminated = terminated_state(container)
        if phase in ("Succeeded", "Failed") or kind == "DELETED" or pod.metadata.deletion_timestamp:
            if phase == "Succeeded":
                reason = "finished"
            elif disruption:
                reason = disruption
            elif status and status.reason == "Evicted":
                reason = "evicted"
            elif terminated is not None and terminated.reason == "OOMKilled":
                reason = "OOMKilled"
            elif phase == "Failed":
                reason = protocol.exit_reason(terminated.exit_code) if terminated is not None else "failed"
            else:
                reason = "deleted"
            if kind == "DELETED" or phase in ("Succeeded", "Failed"):
                view.left = True
                if reason != "finished" and not disruption and self._success_met():
                    # The Job met its successPolicy (another index succeeded: the agents
                    # finish together) and the controller terminated this one while it
                    # exited: it finished, it did not fail.
                    reason = "finished"
                self.emit(
                    Kind.NODE_LEFT,
                    name,
                    **NodeLeft(reason=reason, exitcode=terminated.exit_code if terminated is not None else None),
                )
                self.logs.pod_ended(view)
                if kind == "MODIFIED" and terminated is not None and terminated.exit_code == protocol.EXIT_EVICTED:
                    self._size_without(view)  # seen as it happened: an old pod a new kernel lists is history

    def _size_without(self, view: PodView) -> None:
        """A worker pod sent itself away: its workers failed while it joined (agent/joiner.py).
        The Job goes back to the size it had without it, as the local supervisor lowers its
        target; else the controller replaces the pod (its podFailurePolicy ignores the exit)
        and the replacement, on the same node, fails the same way. Only for the highest index
        (an Indexed Job scales down from the top) and while the Job still asks for it."""
        if view.index is None:
            return
        batch = self.conn.batch()
        try:
            job = batch.read_namespaced_job(m.workers_name(self.job), self.conn.namespace)
            lo = int(((job.metadata.annotations or {}).get("notebook-elastic.io/nnodes") or "1:1").split(":")[0])
            if job.spec.parallelism != view.index + 1 or job.spec.completions != view.index + 1 or view.index < lo:
                return
            size = {"spec": {"completions": view.index, "parallelism": view.index}}
            batch.patch_namespaced_job(m.workers_name(self.job), self.conn.namespace, size)
        except Exception:
            _log.debug("not a Job workload, gone, or not ours to patch: the pod is replaced", exc_info=True)
            return

    def _success_met(self) -> bool:
        """Whether the workers' Job has met its successPolicy (SuccessCriteriaMet, or
        Complete). Read when a worker pod ends, not from the 0.5 s poll: the controller sets
        the condition before it terminates the lingering pods."""
        if self.success_met:
            return True
        try:
            job = self.conn.batch().read_namespaced_job(m.workers_name(self.job), self.conn.namespace)
        except Exception:
            _log.debug("not a Job workload, gone, or unreadable: say what the pod says", exc_info=True)
            return False  # not a Job workload, gone, or unreadable: say what the pod says
        self.success_met = any(
            c.status == "True" and c.type in ("SuccessCriteriaMet", "Complete") for c in job.status.conditions or []
        )
        return self.success_met

    def _on_rendezvous_pod(self, kind: str, pod: Any, view: PodView, phase: str, container: Any) -> None:
        cut_off = node_unreachable(pod)
        if (kind == "DELETED" or cut_off) and not view.left and not self.stop.is_set() and not self.workload.released:
            # Its Deployment starts another; the agents re-form their round on it. A pod whose
            # node stopped answering is never confirmed deleted (no kubelet): it stays
            # Terminating, so its eviction is the news, told once.
            view.left = True
            evicted = any(
                c.type == "DisruptionTarget" and c.status == "True"
                for c in ((pod.status.conditions or []) if pod.status else [])
            )
            reason = STORE_CUT_OFF if cut_off else "evicted" if evicted else "deleted"
            self.emit(Kind.STORE_LOST, pod.metadata.name, **StoreLost(reason=reason))
        if container and container.restart_count and container.restart_count > view.restart_count:
            view.restart_count = container.restart_count
            self.emit(
                Kind.ERROR,
                pod.metadata.name,
                **Error(error="RendezvousRestarted", message="the rendezvous store restarted; agents rejoin"),
            )
        if phase == "Pending":
            reason = ""
            for cond in pod.status.conditions or [] if pod.status else []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    reason = f"{cond.reason}: {cond.message}"
            if reason and reason != view.reported_pending:
                view.reported_pending = reason
                head, _, message = reason.partition(": ")
                self.emit(
                    Kind.PENDING, pod.metadata.name, **Pending(reason=head, message=message, component="rendezvous")
                )

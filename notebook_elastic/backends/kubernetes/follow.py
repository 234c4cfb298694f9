"""Following a job on a cluster: a pod watch plus a bounded number of log streams, as events.

The watch is a real watch (not a one-off list): pods that appear later (a replacement
for a preempted worker, a scale-up) are followed too, and it resumes from its last
resourceVersion after a dropped connection (relisting on 410 Gone). Logs are read with
timestamps: rank 0's pod and failing pods followed, the others caught up by short reads
(``logs.py``: at most ``LOG_STREAMS_MAX`` streams per job, whatever its size); after a drop
the follower skips exactly the lines it already had, so nothing is duplicated or lost; a
restarted container's previous log is read with ``previous=True``. Pod phases and reasons become events: ``pending`` with
the scheduler's message (Unschedulable: Insufficient nvidia.com/gpu), ImagePullBackOff,
CrashLoopBackOff, and a worker pod the controller may not create (FailedCreate: quota);
``node_joined`` when a pod runs; ``node_left`` with the reason
(finished, preempted, evicted, deleted, OOMKilled, exit code).

``ClusterFollower`` holds its parts and starts their threads: a ``Watcher`` (``watch.py``:
watches and retries, a 403 told once), ``PodEvents`` (``pods.py``), a ``LogFollower``
(``logs.py``) and ``WorkloadEvents`` (``workload.py``: the controller's warnings, the
workload's scale and end). Each part's threads tell events through ``emit`` into the one
queue that iterating drains; the pods seen are the one state two parts share (the pod watch
writes them, log following reads them).
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...contract import protocol
from ...contract.event_types import SCHEMA_VERSION, Checkpoint, JobFinished, JobSubmitted, Kind, Restart, WorkerFailed
from ...contract.events import Event
from ...contract.job_state import budget_spent_reason, describe_failure
from . import grace
from . import manifests as m
from .client import Connection
from .logs import LogFollower
from .pods import WAITING_REASONS, PodEvents, PodView, pod_disruption
from .watch import (
    RETRY_FIRST_S,
    RETRY_MAX_S,
    WATCH_TIMEOUT_S,
    Backoff,
    Followed,
    Transient,
    Watcher,
    _ts,
    is_forbidden,
    parse_time,
)
from .workload import POD_NAME, WorkloadEvents, refusal

# The follower, and the names that were defined here before its parts moved out (still imported from here).
__all__ = [
    "POD_NAME",
    "RETRY_FIRST_S",
    "RETRY_MAX_S",
    "WAITING_REASONS",
    "WATCH_TIMEOUT_S",
    "Backoff",
    "ClusterFollower",
    "PodView",
    "Transient",
    "is_forbidden",
    "parse_time",
    "pod_disruption",
    "refusal",
]


class ClusterFollower:
    """Iterating yields the job's events until it finishes or ``stop`` is set; the watches
    run in threads of their own and feed one queue."""

    def __init__(self, conn: Connection, job: str, stop: threading.Event) -> None:
        self.conn = conn
        self.job = job
        self.stop = stop
        self.events: queue.Queue[Event] = queue.Queue()
        self.failures: list[Event] = []  # worker_failed events, oldest first
        self.restarts = 0
        self.max_restarts: int | None = None
        self.finished = threading.Event()
        self.longest_save_s = 0.0  # rank 0's longest save this run (grace.py)
        # The pods seen: the pod watch writes them, log following reads them.
        self.pods: dict[str, PodView] = {}
        self.pods_lock = threading.Lock()
        # Each part is given the ones it calls, so they are made in that order: the pod watch
        # tells log following and the workload's events; the workload's end waits on the logs.
        followed = Followed(conn, job, stop, self.emit)
        self.watcher = Watcher(followed)
        self.logs = LogFollower(followed, self.pods, self.pods_lock, self.events.put, self.watcher.forbidden)
        self.workload = WorkloadEvents(followed, self.watcher, self.logs.catch_up_all)
        self.pod_events = PodEvents(followed, self.watcher, self.pods, self.pods_lock, self.logs, self.workload)

    def emit(self, kind: str, node: str | None = None, t: float | None = None, **data: Any) -> None:
        self.events.put(Event(kind, t if t is not None else time.time(), node, data))

    def follow_pod(self, pod: str) -> None:
        """Follow this pod's log live (a dashboard or a user opened it), within the bound:
        it takes a slot before pods nobody asked for."""
        self.logs.follow_pod(pod)

    def unfollow_pod(self, pod: str) -> None:
        """The pod is no longer asked for: its slot goes back to the others."""
        self.logs.unfollow_pod(pod)

    # -- the stream -------------------------------------------------------------------

    def __iter__(self) -> Iterator[Event]:
        backoff = Backoff(self.stop)
        while True:  # a transient error (or a 403, told once) is no answer about the job
            try:
                code = self.workload.code()
                break
            except Transient:
                while not self.events.empty():
                    yield self.events.get()
                if self.stop.is_set():
                    return
                backoff.wait()
        if code is None:
            yield Event(
                Kind.JOB_FINISHED,
                time.time(),
                None,
                dict(JobFinished(status="stopped", reason="the job's objects are gone from the cluster")),
            )
            return
        self._submitted(code)
        threads = [
            threading.Thread(target=self.pod_events.watch_pods, name=f"watch-pods-{self.job}", daemon=True),
            threading.Thread(target=self.workload.watch_workload, name=f"watch-job-{self.job}", daemon=True),
            threading.Thread(target=self.workload.watch_events, name=f"watch-events-{self.job}", daemon=True),
        ]
        for t in threads:
            t.start()
        self.logs.start()
        while True:
            try:
                event = self.events.get(timeout=0.1)
            except queue.Empty:
                if self.stop.is_set():
                    return
                continue
            event = self._explain(event)
            yield event
            if event.kind == Kind.JOB_FINISHED:
                self.finished.set()
                self.stop.set()
                return

    def _explain(self, event: Event) -> Event:
        """Keep the worker failures and restarts seen so far; a job that failed because its
        restart budget is spent then says which rank raised what, like the local backend."""
        ms = event.fields(Checkpoint).get("ms")
        if event.kind == Kind.CHECKPOINT and ms:
            save_s = float(ms) / 1000
            if save_s > self.longest_save_s:  # what the next launch of this name derives its grace from
                self.longest_save_s = save_s
                grace.record(self.job, save_s)
        if event.kind == Kind.WORKER_FAILED:
            self.failures.append(event)
        elif event.kind == Kind.RESTART and event.fields(Restart).get("reason") == "worker_failed":
            restart = event.fields(Restart)
            self.restarts = max(self.restarts, int(restart.get("restarts_used") or 0))
            self.max_restarts = restart.get("max_restarts", self.max_restarts)
        # (budget_spent: the workload watch's own mark on its job_finished, taken off here; no
        # event that leaves the follower carries it.)
        elif event.kind == Kind.JOB_FINISHED and event.data.get("budget_spent"):
            data = {k: v for k, v in event.data.items() if k != "budget_spent"}
            fatal = next((f for f in self.failures if f.fields(WorkerFailed).get("fatal")), None)
            if fatal is not None:  # not retried: no budget was spent on it
                data["reason"] = describe_failure(fatal)
            elif re.search(rf"\bexit code {protocol.EXIT_FATAL}\b", data.get("reason", "")):  # its log was missed
                data["reason"] = f"{protocol.exit_reason(protocol.EXIT_FATAL)} ({data.get('reason')})"
            else:
                data["reason"] = budget_spent_reason(
                    self.failures, self.restarts, self.max_restarts, data.get("reason", "")
                )
            return Event(event.kind, event.time, event.node, data)
        return event

    def _submitted(self, cm: Any) -> None:
        import json

        spec = json.loads((cm.metadata.annotations or {}).get(m.ANNOTATION_SPEC, "{}"))
        options = json.loads((cm.metadata.annotations or {}).get("notebook-elastic.io/options", "{}"))
        lo, hi = spec.get("nnodes", [1, 1])
        self.max_restarts = spec.get("max_restarts")
        submitted = JobSubmitted(
            schema=SCHEMA_VERSION,
            name=self.job,
            nodes=spec.get("nodes") or lo,
            min_nodes=lo,
            max_nodes=hi,
            nproc_per_node=spec.get("nproc_per_node"),
            max_restarts=spec.get("max_restarts"),
            backend="kubernetes",
            namespace=self.conn.namespace,
            notebook=spec.get("notebook"),
        )
        if options.get("grace"):
            submitted["grace_s"] = options["grace"]
        self.emit(Kind.JOB_SUBMITTED, t=_ts(cm.metadata.creation_timestamp), **submitted)

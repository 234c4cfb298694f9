"""Following a job on a cluster: a pod watch plus a log follower per pod, as events.

The watch is a real watch (not a one-off list): pods that appear later (a replacement
for a preempted worker, a scale-up) are followed too, and it resumes from its last
resourceVersion after a dropped connection (relisting on 410 Gone). Each worker pod's log
is followed with timestamps; after a drop the follower reconnects and skips exactly the
lines it already had, so nothing is duplicated or lost; a restarted container's previous
log is read with ``previous=True``. Pod phases and reasons become events: ``pending`` with
the scheduler's message (Unschedulable: Insufficient nvidia.com/gpu), ImagePullBackOff,
CrashLoopBackOff, and a worker pod the controller may not create (FailedCreate: quota);
``node_joined`` when a pod runs; ``node_left`` with the reason
(finished, preempted, evicted, deleted, OOMKilled, exit code).
"""

from __future__ import annotations

import datetime as dt
import queue
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...events import Event, Kind, LineParser
from ...job_state import budget_spent_reason
from ...runtime import protocol
from . import manifests as m
from .client import Connection, explain, is_missing

WATCH_TIMEOUT_S = 30
RETRY_FIRST_S = 0.5  # a transient API error (429, 5xx, a dropped connection) is retried after this,
RETRY_MAX_S = 15.0  # doubling up to this: a control-plane upgrade takes minutes, not forever


class Transient(Exception):
    """The API server could not answer now (429, 5xx, unreachable): try again later."""


def is_forbidden(exc: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException) and exc.status in (401, 403)


class Backoff:
    """Doubling waits between retries of one failing call; reset by a success."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.delay_s = RETRY_FIRST_S

    def wait(self) -> None:
        self.stop.wait(self.delay_s)
        self.delay_s = min(self.delay_s * 2, RETRY_MAX_S)

    def reset(self) -> None:
        self.delay_s = RETRY_FIRST_S


POD_NAME = re.compile(r'pods "[^"]*"')


def refusal(message: str | None) -> str:
    """A controller's "Error creating: pods "w-0-x7k2p" is forbidden: ..." without the parts
    that change on every retry (the pod's random name), as users read it."""
    return POD_NAME.sub("pods", message or "").removeprefix("Error creating: ")


WAITING_REASONS = {
    "ImagePullBackOff",
    "ErrImagePull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "InvalidImageName",
    "CreateContainerError",
}


def parse_time(text: str) -> float:
    """RFC 3339 (nanoseconds allowed) -> epoch seconds."""
    text = text.rstrip("Z")
    whole, _, frac = text.partition(".")
    base = dt.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return parse_time(str(value))


@dataclass
class PodView:
    """What we last knew of a pod, to turn changes into events."""

    name: str
    phase: str = ""
    running_seen: bool = False
    reported_pending: str = ""
    restart_count: int = 0
    left: bool = False
    log_threads: list[threading.Thread] = field(default_factory=list)


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


class ClusterFollower:
    def __init__(self, conn: Connection, job: str, stop: threading.Event) -> None:
        self.conn = conn
        self.job = job
        self.stop = stop
        self.events: queue.Queue[Event] = queue.Queue()
        self.pods: dict[str, PodView] = {}
        self.warned: set[tuple[str, str]] = set()  # (reason, message) of warnings told
        self.failures: list[Event] = []  # worker_failed events, oldest first
        self.released = False  # we deleted the rendezvous pod of a finished job
        self.restarts = 0
        self.max_restarts: int | None = None
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.core = conn.core()
        self.refused: set[str] = set()  # the 403 sentences told (each once)
        self.success_met = False  # the workers' Job met its successPolicy

    def emit(self, kind: str, node: str | None = None, t: float | None = None, **data: Any) -> None:
        self.events.put(Event(kind, t if t is not None else time.time(), node, data))

    def _forbidden(self, exc: BaseException, action: str) -> None:
        """Say once which right is missing (the verb and resource from the API server's
        message, in client.explain's words); the caller keeps retrying slowly, so a Role
        granted later is picked up."""
        message = str(explain(exc, action, self.conn))
        with self.lock:
            if message in self.refused:
                return
            self.refused.add(message)
        self.emit(Kind.ERROR, None, error="Forbidden", message=message)

    # -- the stream -------------------------------------------------------------------

    def __iter__(self) -> Iterator[Event]:
        backoff = Backoff(self.stop)
        while True:  # a transient error (or a 403, told once) is no answer about the job
            try:
                code = self._code()
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
                {"status": "stopped", "reason": "the job's objects are gone from the cluster"},
            )
            return
        self._submitted(code)
        threads = [
            threading.Thread(target=self._watch_pods, name=f"watch-pods-{self.job}", daemon=True),
            threading.Thread(target=self._watch_workload, name=f"watch-job-{self.job}", daemon=True),
            threading.Thread(target=self._watch_events, name=f"watch-events-{self.job}", daemon=True),
        ]
        for t in threads:
            t.start()
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
        if event.kind == Kind.WORKER_FAILED:
            self.failures.append(event)
        elif event.kind == Kind.RESTART and event.get("reason") == "worker_failed":
            self.restarts = max(self.restarts, int(event.get("restarts_used") or 0))
            self.max_restarts = event.get("max_restarts", self.max_restarts)
        elif event.kind == Kind.JOB_FINISHED and event.get("budget_spent"):
            data = {k: v for k, v in event.data.items() if k != "budget_spent"}
            data["reason"] = budget_spent_reason(
                self.failures, self.restarts, self.max_restarts, data.get("reason", "")
            )
            return Event(event.kind, event.time, event.node, data)
        return event

    def _submitted(self, cm: Any) -> None:
        import json

        spec = json.loads((cm.metadata.annotations or {}).get(m.ANNOTATION_SPEC, "{}"))
        lo, hi = spec.get("nnodes", [1, 1])
        self.max_restarts = spec.get("max_restarts")
        self.emit(
            Kind.JOB_SUBMITTED,
            t=_ts(cm.metadata.creation_timestamp),
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

    # -- pods -------------------------------------------------------------------------

    def _watch(
        self,
        list_fn: Any,
        handle: Any,
        *,
        optional: bool = False,
        relisted: Any = None,
        bookmarks: bool = False,
        **selector: str,
    ) -> None:
        """A watch that lives as long as the follower, as an informer does it: list, then
        watch from the list's resourceVersion; after a dropped connection resume from the
        last resourceVersion seen; after 410 Gone list again (ADDED for what exists; the
        handlers dedupe) and give ``relisted`` the names listed, so what was deleted while
        the watch was away is told too. ``optional``: a 401/403 ends it quietly."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        rv: str | None = None
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            if rv is None:
                try:
                    listed = list_fn(self.conn.namespace, **selector)
                except ApiException as exc:
                    if optional and exc.status in (401, 403):
                        return
                    if exc.status in (401, 403):
                        self._forbidden(exc, f"follow job {self.job!r}")
                    backoff.wait()
                    continue
                except Exception:
                    backoff.wait()
                    continue
                for obj in listed.items:
                    handle("ADDED", obj)
                if relisted is not None:
                    relisted({obj.metadata.name for obj in listed.items})
                rv = listed.metadata.resource_version
            w = watch.Watch()
            try:
                for item in w.stream(
                    list_fn,
                    self.conn.namespace,
                    resource_version=rv,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    # A quiet watch keeps a fresh resourceVersion (only where the model's required
                    # fields allow a bookmark's bare metadata: V1Pod yes, CoreV1Event no).
                    **({"allow_watch_bookmarks": True} if bookmarks else {}),
                    **selector,
                ):
                    if self.stop.is_set():
                        w.stop()
                        return
                    if item["type"] == "BOOKMARK":
                        # Only a resourceVersion (the client keeps the object a raw dict): resume
                        # from there, not from before the server's compaction.
                        rv = w.resource_version or rv
                        continue
                    obj = item["object"]
                    rv = obj.metadata.resource_version
                    handle(item["type"], obj)
                    backoff.reset()
            except ApiException as exc:
                if optional and exc.status in (401, 403):
                    return
                if exc.status == 410:
                    rv = None
                    continue
                if exc.status in (401, 403):
                    self._forbidden(exc, f"follow job {self.job!r}")
                backoff.wait()
            except Exception:
                backoff.wait()  # dropped connection: resume from rv

    def _watch_pods(self) -> None:
        self._watch(
            self.core.list_namespaced_pod,
            self._on_pod,
            relisted=self._pods_relisted,
            bookmarks=True,
            label_selector=m.selector(self.job),
        )

    def _pods_relisted(self, present: set[str]) -> None:
        """Worker pods we followed that a fresh list no longer has were deleted while the
        watch was away (a 410 after a long disconnection): they left."""
        with self.lock:
            gone = [
                v
                for v in self.pods.values()
                if v.name not in present and not v.left and not v.name.startswith(m.rdzv_name(self.job))
            ]
            for view in gone:
                view.left = True
        for view in gone:
            self.emit(Kind.NODE_LEFT, view.name, reason="deleted", exitcode=None)

    def _on_pod(self, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        component = (pod.metadata.labels or {}).get(m.COMPONENT)
        with self.lock:
            view = self.pods.setdefault(name, PodView(name))
        status = pod.status
        phase = (status.phase if status else "") or "Pending"
        statuses = (status.container_statuses or []) if status else []
        container = statuses[0] if statuses else None
        if component == "rendezvous":
            self._on_rendezvous_pod(kind, pod, view, phase, container)
            return
        if view.left:
            return
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
                self.emit(Kind.PENDING, name, reason=head, message=message)
        if (
            container
            and container.state
            and container.state.waiting
            and container.state.waiting.reason == "CrashLoopBackOff"
        ):
            reason = f"CrashLoopBackOff: {container.state.waiting.message or ''}"
            if reason != view.reported_pending:
                view.reported_pending = reason
                self.emit(Kind.PENDING, name, reason="CrashLoopBackOff", message=container.state.waiting.message or "")
        # Running: it joined; follow its log.
        started = container and container.state and (container.state.running or container.state.terminated)
        if started and not view.running_seen:
            view.running_seen = True
            with self.lock:
                self.warned.clear()  # a pod could be created: tell a new refusal again
            self.emit(
                Kind.NODE_JOINED,
                name,
                ip=status.pod_ip,
                index=(pod.metadata.labels or {}).get("batch.kubernetes.io/job-completion-index"),
            )
            self._start_log_follower(view, previous=False)
        if container and container.restart_count and container.restart_count > view.restart_count:
            view.restart_count = container.restart_count
            self.emit(
                Kind.ERROR,
                name,
                error="ContainerRestarted",
                message=f"container restarted ({container.restart_count}x)",
            )
            self._start_log_follower(view, previous=True)
        # Gone: why.
        disruption = pod_disruption(pod)
        terminated = container.state.terminated if container and container.state else None
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
                    reason=reason,
                    exitcode=terminated.exit_code if terminated is not None else None,
                )

    def _success_met(self) -> bool:
        """Whether the workers' Job has met its successPolicy (SuccessCriteriaMet, or
        Complete). Read when a worker pod ends, not from the 0.5 s poll: the controller sets
        the condition before it terminates the lingering pods."""
        if self.success_met:
            return True
        try:
            job = self.conn.batch().read_namespaced_job(m.workers_name(self.job), self.conn.namespace)
        except Exception:
            return False  # not a Job workload, gone, or unreadable: say what the pod says
        self.success_met = any(
            c.status == "True" and c.type in ("SuccessCriteriaMet", "Complete") for c in job.status.conditions or []
        )
        return self.success_met

    def _on_rendezvous_pod(self, kind: str, pod: Any, view: PodView, phase: str, container: Any) -> None:
        if kind == "DELETED" and not self.stop.is_set() and not self.released:
            # Its Deployment starts another; the agents re-form their round on it.
            evicted = any(
                c.type == "DisruptionTarget" and c.status == "True"
                for c in ((pod.status.conditions or []) if pod.status else [])
            )
            self.emit(Kind.STORE_LOST, pod.metadata.name, reason="evicted" if evicted else "deleted")
        if container and container.restart_count and container.restart_count > view.restart_count:
            view.restart_count = container.restart_count
            self.emit(
                Kind.ERROR,
                pod.metadata.name,
                error="RendezvousRestarted",
                message="the rendezvous store restarted; agents rejoin",
            )
        if phase == "Pending":
            reason = ""
            for cond in pod.status.conditions or [] if pod.status else []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    reason = f"{cond.reason}: {cond.message}"
            if reason and reason != view.reported_pending:
                view.reported_pending = reason
                head, _, message = reason.partition(": ")
                self.emit(Kind.PENDING, pod.metadata.name, reason=head, message=message, component="rendezvous")

    # -- logs -------------------------------------------------------------------------

    def _start_log_follower(self, view: PodView, previous: bool) -> None:
        t = threading.Thread(target=self._follow_log, args=(view.name, previous), name=f"log-{view.name}", daemon=True)
        view.log_threads.append(t)
        t.start()

    def _follow_log(self, pod: str, previous: bool) -> None:
        parser = LineParser(pod)
        last_ts: str | None = None  # RFC 3339 with nanoseconds: sorts as text
        at_last_ts = 0  # lines seen with exactly that timestamp
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            since = None
            if last_ts is not None:
                since = max(1, int(time.time() - parse_time(last_ts)) + 2)
            try:
                resp = self.core.read_namespaced_pod_log(
                    pod,
                    self.conn.namespace,
                    follow=not previous,
                    previous=previous,
                    timestamps=True,
                    since_seconds=since,
                    _preload_content=False,
                )
            except Exception as exc:
                if is_missing(exc):
                    return
                if is_forbidden(exc):
                    self._forbidden(exc, f"read the log of pod {pod}")
                backoff.wait()
                continue
            backoff.reset()
            skipped_at_last = 0
            buffer = b""
            try:
                for chunk in resp.stream(4096):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for raw in lines:
                        stamp, _, text = raw.decode("utf-8", "replace").partition(" ")
                        if last_ts is not None:
                            if stamp < last_ts:
                                continue
                            if stamp == last_ts and skipped_at_last < at_last_ts:
                                skipped_at_last += 1
                                continue
                        if stamp == last_ts:
                            at_last_ts += 1
                            skipped_at_last += 1
                        else:
                            last_ts, at_last_ts, skipped_at_last = stamp, 1, 1
                        event = parser.feed(text, parse_time(stamp))
                        if event is not None:
                            self.events.put(event)
                ended = True
            except Exception:
                ended = False  # dropped mid-stream: reconnect and skip what we have
            finally:
                resp.release_conn()
            if previous:
                return
            if ended and self._container_done(pod):
                return
            time.sleep(0.2)

    def _container_done(self, pod: str) -> bool:
        try:
            obj = self.core.read_namespaced_pod(pod, self.conn.namespace)
        except Exception as exc:
            return is_missing(exc)
        statuses = obj.status.container_statuses or [] if obj.status else []
        return bool(statuses and statuses[0].state and statuses[0].state.terminated) or obj.status.phase in (
            "Succeeded",
            "Failed",
        )

    # -- the controller's warnings ------------------------------------------------------

    def _watch_events(self) -> None:
        """Warnings about the workers' controller object (Job or PyTorchJob), as events.

        A worker pod the controller may not create (the namespace's quota is spent, a
        webhook or a PodSecurity policy refuses it) never exists, so no pod watch can tell
        it; the controller says so only in a FailedCreate Event. Each distinct refusal is
        told once (the controller retries, and the message differs only in the pod's
        random name); a pod that starts after it clears the slate. Without the right to
        list events this is skipped: the rest of following works unchanged."""
        self._watch(
            self.core.list_namespaced_event,
            self._on_cluster_event,
            optional=True,  # no right to read events (see the README's Role)
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
            self.emit(Kind.PENDING, None, t, reason="FailedCreate", message=message, component="workers")
        else:
            self.emit(Kind.ERROR, None, t, error=event.reason, message=message)

    # -- the workload (Job / PyTorchJob / pods) -----------------------------------------

    def _watch_workload(self) -> None:
        """Scale changes and the job's end, from the workers' controller object."""
        batch = self.conn.batch()
        last_parallelism = None
        last_range = None
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            try:
                cm = self._code()
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
                            self.emit(
                                Kind.SCALED,
                                target=spec.parallelism,
                                min_nodes=lo,
                                max_nodes=hi,
                                reconfigured=nnodes != last_range,
                                epoch=epoch,
                            )
                        last_parallelism, last_range = spec.parallelism, nnodes
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
                        self._finish("failed", "every worker pod failed")
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
                        self._forbidden(exc, f"read the workers of job {self.job!r}")
                    backoff.wait()
                    continue
                # The workload is being replaced (range change) or was deleted.
            backoff.reset()
            self.stop.wait(0.5)

    def _code(self) -> Any:
        """The job's code ConfigMap, None once it is gone (404). Any other failure is no
        answer about the job: ``Transient`` (a 403 is told once), and the caller asks again;
        only a real end (the object deleted, the workload finished) ends the view."""
        try:
            return self.core.read_namespaced_config_map(m.code_name(self.job), self.conn.namespace)
        except Exception as exc:
            if is_missing(exc):
                return None
            if is_forbidden(exc):
                self._forbidden(exc, f"read job {self.job!r}")
            raise Transient(str(exc)) from exc

    def _finish(self, status: str, reason: str | None, budget_spent: bool = False) -> None:
        time.sleep(1.0)  # let the log followers deliver the last lines first
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
                pass  # gone already, or not ours to delete: `stop` removes it

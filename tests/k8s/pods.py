"""Pods beyond the kubelet: the scheduler (GPU slots on the one node, scheduling gates), the
namespace's GPU ResourceQuota (admission), disruptions (a preemption, a node cut off, the
Eviction API: each marks the pod DisruptionTarget), and the pods/log subresource (``follow``,
``timestamps``, ``sinceSeconds``, ``previous``; open streams counted)."""

from __future__ import annotations

import copy
import os
import select
import signal
import socket
import time
from typing import TYPE_CHECKING, Any

from .kubelet import set_ready
from .objects import now_rfc3339, parse_rfc3339, status_error

if TYPE_CHECKING:
    from .kubelet import Kubelet
    from .server import Streams
    from .services import Network
    from .store import Store


def pod_gpus(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod["spec"].get("containers", []):
        limits = (c.get("resources") or {}).get("limits") or {}
        total += int(limits.get("nvidia.com/gpu", 0))
    return total


class Quota:
    """A namespace ResourceQuota on requests.nvidia.com/gpu, as admission applies it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gpus: int | None = None  # None: no quota

    def refusal(self, ns: str, pod: dict[str, Any]) -> str | None:
        """The admission message for a pod beyond the namespace's GPU quota, else None."""
        if self.gpus is None:
            return None
        with self.store.lock:
            used = sum(
                pod_gpus(o)
                for k, o in self.store.objects.items()
                if k[1] == "pods" and k[2] == ns and o["status"].get("phase") in ("Pending", "Running")
            )
        asked = pod_gpus(pod)
        if used + asked <= self.gpus:
            return None
        name = pod.get("metadata", {}).get("name", "")
        return (
            f'pods "{name}" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu={asked}, '
            f"used: requests.nvidia.com/gpu={used}, limited: requests.nvidia.com/gpu={self.gpus}"
        )


class Scheduler:
    """The scheduler of the one node: pods placed oldest first while their GPUs fit."""

    def __init__(self, store: Store, network: Network, kubelet: Kubelet, gpu_slots: int) -> None:
        self.store = store
        self.network = network  # a scheduled pod gets its address
        self.kubelet = kubelet  # and its container starts
        self.gpu_slots = gpu_slots

    def set_gpu_slots(self, n: int) -> None:
        with self.store.lock:
            self.gpu_slots = n
            self.store.changed.notify_all()

    def schedule(self) -> None:
        with self.store.lock:
            pods = [o for k, o in self.store.objects.items() if k[1] == "pods"]
            used = sum(
                pod_gpus(p)
                for p in pods
                if p["spec"].get("nodeName")
                and p["status"].get("phase") in ("Pending", "Running")
                and not p["metadata"].get("deletionTimestamp")
            )
            for pod in sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"]):
                if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                    continue
                if pod["spec"].get("schedulingGates"):
                    # Not considered until every gate is lifted (Kueue's slice gate, here).
                    conds = pod["status"].setdefault("conditions", [])
                    if not any(c.get("reason") == "SchedulingGated" for c in conds):
                        new = copy.deepcopy(pod)
                        new["status"]["conditions"] = [
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "SchedulingGated",
                                "message": "Scheduling is blocked due to non-empty scheduling gates",
                                "lastTransitionTime": now_rfc3339(),
                            }
                        ]
                        self.store.put("MODIFIED", new)
                    continue
                need = pod_gpus(pod)
                if need and used + need > self.gpu_slots:
                    conds = pod["status"].setdefault("conditions", [])
                    msg = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
                    if not any(c.get("reason") == "Unschedulable" for c in conds):
                        new = copy.deepcopy(pod)
                        new["status"]["conditions"] = [
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "message": msg,
                                "lastTransitionTime": now_rfc3339(),
                            }
                        ]
                        self.store.put("MODIFIED", new)
                    continue
                used += need
                new = copy.deepcopy(pod)
                new["spec"]["nodeName"] = "fake-node"
                new["status"]["conditions"] = [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}
                ]
                new["status"]["podIP"] = self.network.alloc_ip()
                stored = self.store.put("MODIFIED", new)
                self.kubelet.start_container(stored)


class Disruptions:
    """What ends a pod from outside: a preemption or spot reclaim, its node cut off by a
    network partition, the Eviction API (policy/v1 Eviction on pods/NAME/eviction)."""

    def __init__(self, store: Store, kubelet: Kubelet) -> None:
        self.store = store
        self.kubelet = kubelet
        self.evictions: list[str] = []  # pods evicted through the Eviction API

    def preempt(self, pod_name: str, namespace: str = "default", reason: str = "PreemptionByScheduler") -> None:
        """What a scheduler preemption or a spot reclaim does: mark, then delete the pod."""
        with self.store.lock:
            pod = self.store.objects.get(("v1", "pods", namespace, pod_name))
            if pod is None:
                raise KeyError(pod_name)
            pod = copy.deepcopy(pod)
            pod["status"].setdefault("conditions", []).append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "message": "the node was reclaimed",
                    "lastTransitionTime": now_rfc3339(),
                }
            )
            self.store.put("MODIFIED", pod)
        self.store.delete(("v1", "pods", namespace, pod_name), grace=5)

    def cut_off(self, pod_name: str, namespace: str = "default") -> int:
        """What losing a pod's node to a network partition does: its processes go silent where
        they are, holding their connections open (SIGSTOP: no reply and no reset, as packets
        dropped on the way), and the node lifecycle controller, no longer hearing from the
        kubelet, first marks the pod not ready (``MarkPodsNotReady``: its Ready condition
        False, nothing else of its status changes, as no kubelet reports it), then evicts it
        (the taint eviction controller: DisruptionTarget ``DeletionByTaintManager``, then a
        deletionTimestamp). No kubelet confirms the deletion: the pod stays Terminating, out of
        its Services' endpoints and replaced by its ReplicaSet, and its processes stay frozen
        until the cluster closes (SIGKILLed then, as a node that never comes back). Returns the
        frozen process group."""
        key = ("v1", "pods", namespace, pod_name)
        with self.store.lock:
            pod = self.store.objects.get(key)
            if pod is None:
                raise KeyError(pod_name)
            container = self.kubelet.containers[pod["metadata"]["uid"]]
            os.killpg(container.proc.pid, signal.SIGSTOP)
            pod = copy.deepcopy(pod)
            set_ready(pod, False)
            pod = self.store.put("MODIFIED", pod)
            pod["status"].setdefault("conditions", []).append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByTaintManager",
                    "message": "Taint manager: deleting due to NoExecute taint node.kubernetes.io/unreachable",
                    "lastTransitionTime": now_rfc3339(),
                }
            )
            pod["metadata"]["deletionTimestamp"] = now_rfc3339()
            pod["metadata"]["deletionGracePeriodSeconds"] = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
            self.store.put("MODIFIED", pod)
            return container.proc.pid

    def evict(self, h: Any, ns: str, name: str, body: dict[str, Any], dry_run: bool) -> None:
        """The Eviction API (policy/v1 Eviction on pods/NAME/eviction): the pod gets the
        DisruptionTarget condition (reason EvictionByEvictionAPI), then is deleted gracefully;
        a Job's podFailurePolicy can then ignore it. No PodDisruptionBudgets here."""
        if body.get("kind") not in (None, "Eviction") or (body.get("metadata") or {}).get("name") not in (None, name):
            return h._json(
                400,
                status_error(400, "BadRequest", "the body of an eviction must be a policy/v1 Eviction naming the pod"),
            )
        key = ("v1", "pods", ns, name)
        with self.store.lock:
            pod = self.store.objects.get(key)
            if pod is None:
                return h._json(404, status_error(404, "NotFound", f'pods "{name}" not found'))
            if dry_run:
                return h._json(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})
            if not pod["metadata"].get("deletionTimestamp"):
                pod = copy.deepcopy(pod)
                pod["status"].setdefault("conditions", []).append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "message": "Eviction API: evicting",
                        "lastTransitionTime": now_rfc3339(),
                    }
                )
                self.store.put("MODIFIED", pod)
        grace = (body.get("deleteOptions") or {}).get("gracePeriodSeconds")
        self.store.delete(key, grace=float(grace) if grace is not None else None)
        self.evictions.append(name)
        return h._json(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})


class PodLogs:
    """The pods/log subresource, read from the kubelet's log files, and how many log requests
    are answered at once (a follower's held streams and its one-shot reads)."""

    def __init__(self, store: Store, kubelet: Kubelet, streams: Streams) -> None:
        self.store = store
        self.kubelet = kubelet
        self.streams = streams
        # Log requests being answered now, and the most at once since the last reset_peaks().
        self.follows_open = 0
        self.reads_open = 0
        self.follows_peak = 0
        self.reads_peak = 0

    def reset_peaks(self) -> None:
        with self.store.lock:
            self.follows_peak, self.reads_peak = self.follows_open, self.reads_open

    def serve(self, h: Any, ns: str, name: str, q: dict[str, str]) -> None:
        follow = q.get("follow") in ("true", "1") and q.get("previous") not in ("true", "1")
        with self.store.lock:
            if follow:
                self.follows_open += 1
                self.follows_peak = max(self.follows_peak, self.follows_open)
            else:
                self.reads_open += 1
                self.reads_peak = max(self.reads_peak, self.reads_open)
        try:
            self._answer(h, ns, name, q)
        finally:
            with self.store.lock:
                if follow:
                    self.follows_open -= 1
                else:
                    self.reads_open -= 1

    @staticmethod
    def _client_gone(h: Any) -> bool:
        """The client closed its end (a quiet followed log would otherwise be served until its
        container ends, as a kubelet notices a closed connection at once)."""
        try:
            # poll, not select: serving a thousand pods, this process holds descriptors past
            # select's 1,024, where select raised and every followed log was dropped unended.
            ready = select.poll()
            ready.register(h.connection, select.POLLIN)
            return bool(ready.poll(0)) and h.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _answer(self, h: Any, ns: str, name: str, q: dict[str, str]) -> None:
        pod = self.store.get("pods", name, ns)
        if pod is None:
            return h._json(404, status_error(404, "NotFound", f'pods "{name}" not found'))
        uid = pod["metadata"]["uid"]
        previous = q.get("previous") in ("true", "1")
        with self.store.lock:
            container = self.kubelet.containers.get(uid)
            path = (
                self.kubelet.previous_logs.get(uid)
                if previous
                else (container.log_path if container else self.kubelet.previous_logs.get(uid))
            )
        if path is None:
            if previous:
                return h._json(
                    400,
                    status_error(
                        400, "BadRequest", f'previous terminated container "worker" in pod "{name}" not found'
                    ),
                )
            return h._json(
                400,
                status_error(
                    400, "BadRequest", f'container "worker" in pod "{name}" is waiting to start: ContainerCreating'
                ),
            )
        follow = q.get("follow") in ("true", "1") and not previous
        timestamps = q.get("timestamps") in ("true", "1")
        since = float(q["sinceSeconds"]) if "sinceSeconds" in q else None
        cutoff = time.time() - since if since is not None else None
        self.streams.start(h, "text/plain")
        try:
            with open(path, "rb") as f:
                buffer = b""
                while True:
                    chunk = f.read(65536)
                    if chunk:
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        out = []
                        for line in lines:
                            stamp, _, text = line.partition(b" ")
                            if cutoff is not None and parse_rfc3339(stamp.decode()) < cutoff:
                                continue
                            out.append(line if timestamps else text)
                        if out:
                            self.streams.chunk(h, b"\n".join(out) + b"\n")
                        continue
                    if not follow or self.store.closed:
                        break
                    with self.store.lock:
                        running = (
                            self.kubelet.containers.get(uid) is container
                            and container is not None
                            and container.proc.poll() is None
                        )
                    if not running:
                        time.sleep(0.1)
                        if not f.read(1):
                            break
                        f.seek(-1, os.SEEK_CUR)
                        continue
                    if self._client_gone(h):
                        return
                    time.sleep(0.05)
        except OSError:
            return
        self.streams.end(h)

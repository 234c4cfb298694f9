"""The API server's storage: every object by (group/version, plural, namespace, name), the
history of changes watches read (increasing resourceVersions, compacted), and what the
registry does on create (defaulting, validation, 409), on delete (graceful pod termination,
garbage collection by propagation policy) and for Events (aggregated as the recorder does)."""

from __future__ import annotations

import base64
import copy
import random
import string
import threading
import uuid
from typing import TYPE_CHECKING, Any

from .objects import GROUPS, RESOURCES, match_labels, now_rfc3339, status_error, validate

if TYPE_CHECKING:
    from .cluster import FakeCluster


class Store:
    """The objects, their history and the registry's verbs; one lock for the whole cluster."""

    def __init__(self, cluster: FakeCluster, namespaces: tuple[str, ...]) -> None:
        self.cluster = cluster  # the kubelet terminates deleted pods; the network gives Services their IP
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (gv, plural, ns, name)
        self.history: list[tuple[int, str, tuple, dict]] = []  # (rv, type, key, object)
        self.rv = 1000
        self.namespaces = set(namespaces)
        self.closed = False  # the cluster is closing: whoever waits on a change stops

    def pods(self, namespace: str = "default", selector: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                copy.deepcopy(o)
                for (gv, pl, ns, _), o in self.objects.items()
                if pl == "pods" and ns == namespace and match_labels(o["metadata"].get("labels", {}), selector)
            ]

    def pods_created(self, selector: str, namespace: str = "default") -> int:
        """How many distinct pods matching `selector` were ever created (deleted ones too)."""
        with self.lock:
            return len(
                {
                    o["metadata"]["uid"]
                    for _, _, key, o in self.history
                    if key[1] == "pods"
                    and key[2] == namespace
                    and match_labels(o["metadata"].get("labels", {}), selector)
                }
            )

    def get(self, plural: str, name: str, namespace: str = "default", gv: str = "v1") -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get((gv, plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def all_objects(self) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for o in self.objects.values()]

    def key(self, obj: dict[str, Any]) -> tuple[str, str, str, str]:
        api = obj["apiVersion"]
        plural = next(pl for (gv, pl), kind in RESOURCES.items() if kind == obj["kind"] and gv == api)
        return (api, plural, obj["metadata"].get("namespace", "default"), obj["metadata"]["name"])

    def put(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            key = self.key(obj)
            if kind == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
            self.history.append((self.rv, kind, key, copy.deepcopy(obj)))
            if len(self.history) > 5000:
                del self.history[:1000]
            self.changed.notify_all()
            return copy.deepcopy(obj)

    def create(
        self, gv: str, plural: str, ns: str, body: dict[str, Any], dry_run: bool = False
    ) -> tuple[int, dict[str, Any]]:
        if ns not in self.namespaces:
            return 404, status_error(404, "NotFound", f'namespaces "{ns}" not found')
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = meta.get("name")
        if not name:
            return 422, status_error(422, "Invalid", f"{plural} is invalid: metadata.name: Required value")
        body["apiVersion"], body["kind"] = gv, RESOURCES[(gv, plural)]
        if plural in ("deployments", "replicasets"):
            body.setdefault("spec", {}).setdefault("replicas", 1)
            if plural == "deployments":
                body["spec"].setdefault("strategy", {"type": "RollingUpdate"})
        if plural == "jobs" and self.cluster.kueue is not None:
            self.cluster.kueue.default_job(body)  # Kueue's mutating webhook
        if plural == "jobs":
            body.setdefault("spec", {}).setdefault("parallelism", 1)
            if body["spec"].get("completionMode", "NonIndexed") != "Indexed":
                body["spec"].setdefault("completions", body["spec"]["parallelism"])
        refused = validate(gv, plural, body)
        if refused:
            return refused
        with self.lock:
            if (gv, plural, ns, name) in self.objects:
                group = GROUPS[gv]
                return 409, status_error(
                    409, "AlreadyExists", f'{plural}{"." + group if group else ""} "{name}" already exists'
                )
            meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            if plural == "pods":
                body.setdefault("status", {"phase": "Pending", "conditions": []})
                body["status"]["phase"] = "Pending"
            if plural == "services" and not dry_run:
                body["spec"]["clusterIP"] = self.cluster.network.alloc_ip()
            if plural == "secrets":
                data = body.get("data") or {}
                for key, value in (body.pop("stringData", None) or {}).items():
                    data[key] = base64.b64encode(str(value).encode()).decode()
                body["data"] = data
            if plural in ("deployments", "replicasets"):
                body.setdefault("status", {})
            if plural == "jobs":
                body.setdefault("status", {})
                # The API server's defaulting: a selector on the Job's uid, and its labels on the template.
                uid_labels = {
                    "batch.kubernetes.io/controller-uid": meta["uid"],
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": meta["uid"],
                    "job-name": name,
                }
                body["spec"].setdefault(
                    "selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": meta["uid"]}}
                )
                template_meta = body["spec"].setdefault("template", {}).setdefault("metadata", {})
                template_meta["labels"] = {**(template_meta.get("labels") or {}), **uid_labels}
            if dry_run:  # validated and defaulted, never stored
                meta.pop("uid")
                return 201, copy.deepcopy(body)
            return 201, self.put("ADDED", body)

    def record_event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about `obj`, aggregated like the real recorder: same object, reason and
        message -> count + 1 and a new lastTimestamp on the one Event."""
        meta = obj["metadata"]
        with self.lock:
            for key, ev in self.objects.items():
                if (
                    key[1] == "events"
                    and ev["involvedObject"].get("uid") == meta["uid"]
                    and ev["reason"] == reason
                    and ev["message"] == message
                ):
                    updated = copy.deepcopy(ev)
                    updated.update(count=ev["count"] + 1, lastTimestamp=now_rfc3339())
                    self.put("MODIFIED", updated)
                    return
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                    "namespace": meta["namespace"],
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": now_rfc3339(),
                },
                "involvedObject": {
                    "apiVersion": obj["apiVersion"],
                    "kind": obj["kind"],
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "type": type_,
                "reason": reason,
                "message": message,
                "count": 1,
                "firstTimestamp": now_rfc3339(),
                "lastTimestamp": now_rfc3339(),
                "source": {"component": "job-controller"},
            }
            self.put("ADDED", event)

    def delete(
        self, key: tuple[str, str, str, str], grace: float | None = None, policy: str | None = None
    ) -> dict[str, Any] | None:
        """Delete as the API server and the garbage collector do: `Orphan` strips the owner
        reference from dependents, `Background` deletes them after the owner, `Foreground`
        before it. Without a policy a batch/v1 Job orphans its pods (the API's default for
        Jobs, kept for compatibility; kubectl asks for Background), everything else cascades."""
        if policy is None:
            policy = "Orphan" if key[1] == "jobs" else "Background"
        with self.lock:
            obj = self.objects.get(key)
            if obj is None:
                return None
            if policy == "Orphan":
                self.orphan(obj["metadata"]["uid"])
            elif policy == "Foreground" and key[1] != "pods":
                self.collect_garbage(obj["metadata"]["uid"], wait=True)
                obj = self.objects.get(key)
                if obj is None:
                    return None
            if key[1] == "pods":
                if obj["metadata"].get("deletionTimestamp"):
                    return copy.deepcopy(obj)
                obj = copy.deepcopy(obj)
                obj["metadata"]["deletionTimestamp"] = now_rfc3339()
                obj["metadata"]["deletionGracePeriodSeconds"] = int(
                    grace if grace is not None else obj["spec"].get("terminationGracePeriodSeconds", 30)
                )
                self.put("MODIFIED", obj)
                threading.Thread(target=self.cluster.kubelet.terminate_pod, args=(key, obj), daemon=True).start()
                return obj
            self.put("DELETED", copy.deepcopy(obj))
        self.collect_garbage(obj["metadata"]["uid"])
        return obj

    def orphan(self, owner_uid: str) -> None:
        with self.lock:
            for o in list(self.objects.values()):
                refs = o["metadata"].get("ownerReferences", [])
                if any(r.get("uid") == owner_uid for r in refs):
                    new = copy.deepcopy(o)
                    new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner_uid]
                    self.put("MODIFIED", new)

    def collect_garbage(self, owner_uid: str, wait: bool = False) -> None:
        """Delete the dependents of a deleted owner (those whose every owner is gone). With
        `wait` (foreground deletion) the lock is released while pods terminate."""
        with self.lock:
            dependents = [
                k
                for k, o in self.objects.items()
                if any(r.get("uid") == owner_uid for r in o["metadata"].get("ownerReferences", []))
            ]
        for key in dependents:
            self.delete(key, grace=1, policy="Foreground" if wait else "Background")
        if wait:
            with self.lock:
                while any(k in self.objects for k in dependents) and not self.closed:
                    self.changed.wait(0.1)

"""The apps/v1 controllers our backend's store uses: Deployments (one ReplicaSet each, named by
its pod-template-hash; a rollout is refused at validation) and ReplicaSets (a pod deleted or
evicted replaced at once, without waiting for it to terminate)."""

from __future__ import annotations

import copy
import hashlib
import json
import random
import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store import Store


class Apps:
    """The Deployment and ReplicaSet controllers, one pass each."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def run_deployments(self) -> None:
        """The Deployment controller, for what our backend uses: one ReplicaSet per Deployment,
        named and labelled by its pod-template-hash, with the Deployment's replicas; its status
        from the ReplicaSet's. (Rollouts are not implemented: a changed template is refused.)"""
        with self.store.lock:
            deployments = [copy.deepcopy(o) for k, o in self.store.objects.items() if k[1] == "deployments"]
        for dep in deployments:
            meta, spec = dep["metadata"], dep["spec"]
            ns = meta["namespace"]
            template = spec["template"]
            digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
            rs_name = f"{meta['name']}-{digest}"
            with self.store.lock:
                current = self.store.objects.get(self.store.key(dep))
                if current is None or current["metadata"]["uid"] != meta["uid"]:
                    continue  # deleted meanwhile: nothing for it
                rs = self.store.objects.get(("apps/v1", "replicasets", ns, rs_name))
                if rs is None:
                    labels = {**(template.get("metadata") or {}).get("labels", {}), "pod-template-hash": digest}
                    self.store.create(
                        "apps/v1",
                        "replicasets",
                        ns,
                        {
                            "metadata": {
                                "name": rs_name,
                                "labels": labels,
                                "ownerReferences": [
                                    {
                                        "apiVersion": "apps/v1",
                                        "kind": "Deployment",
                                        "name": meta["name"],
                                        "uid": meta["uid"],
                                        "controller": True,
                                        "blockOwnerDeletion": True,
                                    }
                                ],
                            },
                            "spec": {
                                "replicas": spec.get("replicas", 1),
                                "selector": {
                                    "matchLabels": {**spec["selector"]["matchLabels"], "pod-template-hash": digest}
                                },
                                "template": {"metadata": {"labels": labels}, "spec": copy.deepcopy(template["spec"])},
                            },
                        },
                    )
                    continue
                if rs["spec"].get("replicas") != spec.get("replicas", 1):
                    updated = copy.deepcopy(rs)
                    updated["spec"]["replicas"] = spec.get("replicas", 1)
                    self.store.put("MODIFIED", updated)
                rs_status = rs.get("status") or {}
                status = {
                    "replicas": rs_status.get("replicas", 0),
                    "updatedReplicas": rs_status.get("replicas", 0),
                    "readyReplicas": rs_status.get("readyReplicas", 0),
                    "availableReplicas": rs_status.get("readyReplicas", 0),
                }
                if current.get("status") != status:
                    updated = copy.deepcopy(current)
                    updated["status"] = status
                    self.store.put("MODIFIED", updated)

    def run_replicasets(self) -> None:
        """The ReplicaSet controller: as many active pods (not terminating, not finished) as
        its replicas, a new one at once for one deleted or evicted (it does not wait for the
        old one to terminate); the extras deleted."""
        with self.store.lock:
            sets = [copy.deepcopy(o) for k, o in self.store.objects.items() if k[1] == "replicasets"]
        for rs in sets:
            meta = rs["metadata"]
            ns, uid = meta["namespace"], meta["uid"]
            with self.store.lock:
                current = self.store.objects.get(self.store.key(rs))
                if current is None or current["metadata"]["uid"] != uid:
                    continue
                owned = [
                    o
                    for k, o in self.store.objects.items()
                    if k[1] == "pods"
                    and k[2] == ns
                    and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))
                ]
                active = [
                    p
                    for p in owned
                    if not p["metadata"].get("deletionTimestamp")
                    and p["status"].get("phase") not in ("Succeeded", "Failed")
                ]
                want = int(current["spec"].get("replicas", 1))
                for _ in range(want - len(active)):
                    template = copy.deepcopy(current["spec"]["template"])
                    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
                    code, answer = self.store.create(
                        "v1",
                        "pods",
                        ns,
                        {
                            "metadata": {
                                "name": f"{meta['name']}-{suffix}",
                                "labels": (template.get("metadata") or {}).get("labels", {}),
                                "ownerReferences": [
                                    {
                                        "apiVersion": "apps/v1",
                                        "kind": "ReplicaSet",
                                        "name": meta["name"],
                                        "uid": uid,
                                        "controller": True,
                                        "blockOwnerDeletion": True,
                                    }
                                ],
                            },
                            "spec": template["spec"],
                        },
                    )
                    if code != 201:
                        self.store.record_event(
                            current, "Warning", "FailedCreate", f"Error creating: {answer['message']}"
                        )
                        break
                extras = sorted(active, key=lambda p: p["metadata"]["creationTimestamp"])[want:]
                ready = sum(
                    1
                    for p in active
                    if any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in p["status"].get("conditions", [])
                    )
                )
                status = {"replicas": len(active), "readyReplicas": ready, "availableReplicas": ready}
                if current.get("status") != status:
                    updated = copy.deepcopy(current)
                    updated["status"] = status
                    self.store.put("MODIFIED", updated)
            for pod in extras:
                self.store.delete(self.store.key(pod))

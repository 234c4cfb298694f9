"""What kubectl reads before anything else: the legacy discovery documents (``/api``, ``/apis``,
each group-version's resource list with short names and subresources), the OpenAPI v3
documents (built from real schemas: openapi.py), and the CustomResourceDefinitions installed."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from . import kueue, openapi
from .objects import GROUPS, RESOURCES, now_rfc3339

KINDS_SHORT = {
    "pods": ["po"],
    "services": ["svc"],
    "configmaps": ["cm"],
    "persistentvolumeclaims": ["pvc"],
    "events": ["ev"],
    "deployments": ["deploy"],
    "replicasets": ["rs"],
}
SUBRESOURCES = {"pods": ["log", "eviction", "status"], "jobs": ["status"], "pytorchjobs": ["status"]}
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class Discovery:
    """The API groups this cluster serves: the built-in ones, kubeflow.org/v1 once its CRD is
    installed (``crds``), Kueue's when it is."""

    def __init__(self, lock: threading.RLock, crds: tuple[str, ...], with_kueue: bool) -> None:
        self.lock = lock
        self.crds = set(crds)
        self.with_kueue = with_kueue  # Kueue installed: its group served
        self._openapi_cache: tuple[tuple[str, ...], dict[str, bytes]] | None = None  # (crds, documents)

    def document(self, path: str) -> dict[str, Any] | None:
        """The legacy discovery documents kubectl reads before anything else (it asks for the
        aggregated kind first and falls back to these)."""
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }
        groups = sorted({gv for gv in GROUPS if gv != "v1" and self.serves(gv)} | {"policy/v1"})
        if path == "/apis":
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": gv.split("/")[0],
                        "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                        "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
                    }
                    for gv in groups
                ],
            }
        gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
        if gv not in groups and gv != "v1":
            return None
        resources = []
        for (g, plural), kind in RESOURCES.items():
            if g != gv:
                continue
            resources.append(
                {
                    "name": plural,
                    "singularName": kind.lower(),
                    "namespaced": True,
                    "kind": kind,
                    "verbs": VERBS,
                    "shortNames": KINDS_SHORT.get(plural, []),
                }
            )
            for sub in SUBRESOURCES.get(plural, []):
                verbs = {"log": ["get"], "eviction": ["create"], "status": ["get", "patch", "update"]}[sub]
                resources.append(
                    {
                        "name": f"{plural}/{sub}",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "Eviction" if sub == "eviction" else kind,
                        "verbs": verbs,
                    }
                )
        if gv == "v1":
            resources.append(
                {
                    "name": "namespaces",
                    "singularName": "namespace",
                    "namespaced": False,
                    "kind": "Namespace",
                    "verbs": ["get", "list"],
                    "shortNames": ["ns"],
                }
            )
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    def serves(self, gv: str) -> bool:
        """Whether this cluster has the API group: the CRDs installed, or built in."""
        if gv == "kubeflow.org/v1":
            return bool(self.crds)
        if gv == kueue.GV:
            return self.with_kueue
        return True

    def openapi_documents(self) -> dict[str, bytes]:
        """Each served group-version's OpenAPI v3 document (kubeflow.org/v1 once its CRD is)."""
        with self.lock:
            key = tuple(sorted(self.crds))
            if self._openapi_cache is None or self._openapi_cache[0] != key:
                by_gv: dict[str, dict[str, str]] = {}
                for (gv, plural), kind in RESOURCES.items():
                    if self.serves(gv) and gv != kueue.GV:  # Kueue's schemas: tests/data, not served
                        by_gv.setdefault(gv, {})[plural] = kind
                docs = {gv: json.dumps(openapi.gv_document(gv, res)).encode() for gv, res in by_gv.items()}
                self._openapi_cache = (key, docs)
            return self._openapi_cache[1]

    def openapi_paths(self) -> tuple[str, ...]:
        return (
            "/openapi/v3",
            *("/openapi/v3/api/v1" if gv == "v1" else f"/openapi/v3/apis/{gv}" for gv in self.openapi_documents()),
        )

    def serve_openapi(self, h: Any, path: str) -> None:
        docs = self.openapi_documents()
        if path == "/openapi/v3":
            body = json.dumps(openapi.root(docs)).encode()
        else:
            gv = path.removeprefix("/openapi/v3/").removeprefix("api/").removeprefix("apis/")
            body = docs[gv]
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    @staticmethod
    def crd(name: str) -> dict[str, Any]:
        """The real CustomResourceDefinition object (tests/data), as the API server returns it."""
        import yaml

        crd = yaml.safe_load(openapi.CRD_FILE.read_text())
        crd["metadata"].update(
            name=name,
            uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            resourceVersion="1",
            creationTimestamp=now_rfc3339(),
        )
        return crd

"""A loopback Kubernetes API server for tests: the real ``kubernetes`` client talks to it.

No API server can be had on these machines (no kube-apiserver, k3s, kind or kwok; no
Docker engine), so this is the boundary we fake, faithfully enough for our backend:

- HTTP on 127.0.0.1 (stdlib), the REST paths and verbs the client uses for ConfigMaps,
  Secrets (``stringData`` stored as base64 ``data``, as the real server does), Services,
  Pods (+ logs), PVCs, Namespaces, batch/v1 Jobs, apps/v1 Deployments and ReplicaSets, CRDs
  and kubeflow PyTorchJobs:
  create (201, 409 when taken), get, list with label selectors, watch (chunked JSON lines;
  ADDED for what exists first, then changes; increasing resourceVersions; 410 for a
  resourceVersion too old), merge patch, delete (pods terminate gracefully; ownerReference
  garbage collection; deleteCollection by label).
- A scheduler with N GPU slots: pods asking for more ``nvidia.com/gpu`` than is free stay
  Pending with the scheduler's Unschedulable message; ``set_gpu_slots`` and ``preempt``
  reproduce a reclaim (DisruptionTarget condition, then deletion).
- A kubelet that runs each container's command as a local process: env (values, the
  downward API and ``secretKeyRef``; a missing Secret or key leaves the container waiting in
  CreateContainerConfigError, as a real kubelet does), ``$(VAR)`` expansion in args, ConfigMap volumes written to a temp dir (paths
  under their mountPath rewritten; ``/checkpoints`` with no volume there is the pod's own folder, as
  a container's writable layer is, never the machine's), one 127.A.B.N address per pod (each cluster has a /24 of
  its own), Service names resolved to their ClusterIP (the cluster DNS), stdout+stderr
  kept as the pod log (``follow``, ``timestamps``, ``sinceSeconds``, ``previous``),
  restartPolicy honoured, tcpSocket readiness probes (a pod is Ready once its probe passes);
  ``node_env_by_index`` puts a Job's index on a node unlike the others (a NIC named otherwise).
- kube-proxy: each Service port's ClusterIP listens while the Service has Ready endpoints and
  forwards every connection to one of them (a userspace proxy); without any, connections are
  refused. So a Service follows its pods: a replaced store pod is reached at the same name.
- The Deployment controller (one ReplicaSet per Deployment, named by its pod-template-hash;
  a changed template, a rollout, is refused) and the ReplicaSet controller (a pod deleted or
  evicted is replaced at once, without waiting for it to terminate).
- An Indexed Job controller: one pod per index up to parallelism, replacements for pods
  that failed or vanished, scale by completions/parallelism, Complete/Failed conditions,
  podFailurePolicy's Ignore for DisruptionTarget; a pod over the namespace's GPU quota is
  not created and the Job gets a FailedCreate Warning Event (aggregated, 1 s backoff).
- Events (list/watch with fieldSelector), RBAC as a Role's rules (``grant_only``) or single
  denials (403 with the API server's message), and dropped connections, on demand.
- Strict where the real server is (#17): names (DNS-1123; Services DNS-1035), a ConfigMap
  over 1 MiB, a pod hostname over 63, immutable Job fields (completions only with an equal
  parallelism in an Indexed Job; completionMode, podFailurePolicy, template), 422 as the
  real server words it; server-side dry-run (``dryRun=All``: validated, never stored); JSON,
  merge and strategic-merge patches; a deleted pod is Failed before it goes and its Job
  counts it, unless evicted through the Eviction API (``pods/eviction``: DisruptionTarget);
  the TTL controller; garbage collection honouring ``propagationPolicy`` (a Job deleted
  without one orphans its pods, as the API's default for Jobs); the Job's defaulted selector.
- For the real ``kubectl`` (``kubectl_config``): a TLS listener, discovery (``/api``,
  ``/apis``, resource lists), Table output for ``get``, and OpenAPI v3 (``/openapi/v3`` and
  one document per group-version, built from real schemas: ``k8s_openapi.py``), so
  ``kubectl apply`` validates as it does against a real server: server-side, with
  ``fieldValidation=Strict``. Field validation as the API server does it on create, update
  and patch: ``Strict`` refuses unknown and duplicate fields in its words (400 for a
  body, 422 for a patch), ``Warn`` (the default) says them in ``Warning`` headers,
  ``Ignore`` says nothing; unknown fields are never stored. ``/openapi/v2`` answers 404
  (kubectl only reads it from a server without v3).
- Not real, and so not pretended: Service names are rewritten to the ClusterIP in a
  container's command and env when it starts (no DNS server); nodeSelector and affinity are
  not evaluated (one node); no PodDisruptionBudgets, admission webhooks or Pod Security
  admission.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import fnmatch
import hashlib
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import k8s_kueue
import k8s_openapi

CONTAINER_CHECKPOINTS = "/checkpoints"
# The fixture's own mark on a pod its Job's suspension terminated (the real controller keeps
# this in memory): such a pod's end is no failure of the Job.
SUSPENDED_BY_JOB = "fake.k8s/terminated-by-suspend"  # the backend's default checkpoint folder (naming.CHECKPOINT_MOUNT)

# (group/version, plural) -> kind
RESOURCES = {
    ("v1", "configmaps"): "ConfigMap",
    ("v1", "secrets"): "Secret",
    ("v1", "services"): "Service",
    ("v1", "pods"): "Pod",
    ("v1", "persistentvolumeclaims"): "PersistentVolumeClaim",
    ("v1", "events"): "Event",
    ("batch/v1", "jobs"): "Job",
    ("apps/v1", "deployments"): "Deployment",
    ("apps/v1", "replicasets"): "ReplicaSet",
    ("kubeflow.org/v1", "pytorchjobs"): "PyTorchJob",
    # Kueue's (k8s_kueue.py), served only by a cluster made with kueue=True.
    (k8s_kueue.GV, "workloads"): "Workload",
    (k8s_kueue.GV, "localqueues"): "LocalQueue",
}
GROUPS = {
    "v1": "",
    "batch/v1": "batch",
    "apps/v1": "apps",
    "kubeflow.org/v1": "kubeflow.org",
    k8s_kueue.GV: k8s_kueue.GROUP,
}


class ContainerConfigError(Exception):
    """What the kubelet reports when a container's env cannot be built (a missing Secret)."""


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp_nano(t: float) -> str:
    whole = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{int((t % 1) * 1e9):09d}Z"


def status_error(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def match_labels(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    for part in selector.split(","):
        part = part.strip()
        if "!=" in part:
            k, v = part.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in part:
            k, v = part.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif part and part not in labels:
            return False
    return True


def match_fields(obj: dict[str, Any], selector: str | None) -> bool:
    """fieldSelector as the API server reads it: `a.b=v,c!=w` over the object's fields."""
    if not selector:
        return True
    for part in selector.split(","):
        negate = "!=" in part
        path, value = part.split("!=" if negate else "=", 1)
        current: Any = obj
        for step in path.lstrip("=").strip().split("."):
            current = current.get(step) if isinstance(current, dict) else None
        if (str(current) == value.lstrip("=")) == negate:
            return False
    return True


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


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CONFIGMAP_LIMIT = 1024 * 1024  # the API server's limit on a ConfigMap's data + binaryData
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


def invalid(kind: str, name: str, field: str, value: Any, detail: str) -> tuple[int, dict[str, Any]]:
    """A 422 as the API server words it: `Kind "name" is invalid: field: Invalid value: ...`."""
    message = f'{kind} "{name}" is invalid: {field}: Invalid value: {json.dumps(value)}: {detail}'
    body = status_error(422, "Invalid", message)
    body["details"] = {
        "name": name,
        "kind": kind.split(".")[0].lower(),
        "causes": [{"reason": "FieldValueInvalid", "message": detail, "field": field}],
    }
    return 422, body


def validate(
    gv: str, plural: str, obj: dict[str, Any], old: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]] | None:
    """What the real API server refuses among what our backend sends: object names (DNS-1123
    subdomains; Services and namespaces DNS-1035/1123 labels), a ConfigMap over 1 MiB, a Pod's
    hostname over 63 characters, and the Job fields that may not change (elastic Indexed Jobs:
    completions only together with an equal parallelism). None when it passes."""
    kind = RESOURCES[(gv, plural)]
    shown = kind if not GROUPS[gv] else f"{kind}.{GROUPS[gv]}"
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    if plural == "services":
        if not DNS1035_LABEL.match(name) or len(name) > 63:
            return invalid(
                shown,
                name,
                "metadata.name",
                name,
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
            )
    elif not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        return invalid(
            shown,
            name,
            "metadata.name",
            name,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        )
    if plural == "jobs" and len(name) > 63:
        return invalid(shown, name, "metadata.name", name, "must be no more than 63 characters")
    if plural == "configmaps":
        size = sum(len(k) + len(v) for k, v in (obj.get("data") or {}).items())
        size += sum(len(k) + len(base64.b64decode(v)) for k, v in (obj.get("binaryData") or {}).items())
        if size > CONFIGMAP_LIMIT:
            code, body = (
                422,
                status_error(
                    422,
                    "Invalid",
                    f'ConfigMap "{name}" is invalid: []: Too long: must have at most {CONFIGMAP_LIMIT} bytes',
                ),
            )
            return code, body
    if plural == "pods":
        hostname = (obj.get("spec") or {}).get("hostname")
        if hostname is not None and (len(hostname) > 63 or not DNS1123_LABEL.match(hostname)):
            return invalid(
                shown, name, "spec.hostname", hostname, "must be no more than 63 characters and a DNS-1123 label"
            )
        containers = (obj.get("spec") or {}).get("containers") or []
        if not containers:
            return status_error_422(shown, name, "spec.containers: Required value")
    if plural == "pytorchjobs":
        # Kubeflow's validating webhook (pkg/webhooks/pytorch/pytorchjob_webhook.go).
        for rtype, rspec in ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).items():
            containers = (((rspec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
            if not any(c.get("name") == "pytorch" for c in containers):
                return 422, status_error(
                    422,
                    "Invalid",
                    'admission webhook "validate-kubeflow-org-v1-pytorchjob.kubeflow.org" denied the request: '
                    f"spec.pytorchReplicaSpecs[{rtype}].template.spec.containers: Required value: must have at least "
                    "one container with name pytorch",
                )
    if plural in ("deployments", "replicasets"):
        spec = obj.get("spec") or {}
        want = ((spec.get("selector") or {}).get("matchLabels")) or {}
        have = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if not want or (spec.get("selector") or {}).get("matchExpressions"):
            return status_error_422(shown, name, "spec.selector: Required value (matchLabels only here)")
        if any(have.get(k) != v for k, v in want.items()):
            return invalid(
                shown, name, "spec.template.metadata.labels", have, "`selector` does not match template `labels`"
            )
        strategy = (spec.get("strategy") or {}).get("type", "RollingUpdate")
        if plural == "deployments" and strategy not in ("Recreate", "RollingUpdate"):
            return status_error_422(shown, name, f'spec.strategy.type: Unsupported value: "{strategy}"')
        if old is not None:
            before = old.get("spec") or {}
            if json.dumps(spec.get("selector"), sort_keys=True) != json.dumps(before.get("selector"), sort_keys=True):
                return invalid(shown, name, "spec.selector", spec.get("selector"), "field is immutable")
            if json.dumps(spec.get("template"), sort_keys=True) != json.dumps(before.get("template"), sort_keys=True):
                # A rollout (a new ReplicaSet, the old scaled down) is not implemented: refused.
                return status_error_422(
                    shown, name, "spec.template: changing the pod template is not supported by the test API server"
                )
    if plural == "jobs":
        spec = obj.get("spec") or {}
        for rule in (spec.get("successPolicy") or {}).get("rules", []):
            if "succeededIndexes" in rule:  # not implemented here: refused, never half-honoured
                return status_error_422(
                    shown, name, "spec.successPolicy.rules[0].succeededIndexes: not supported by the test API server"
                )
            if spec.get("completionMode") != "Indexed":
                return status_error_422(
                    shown, name, "spec.successPolicy: Invalid value: requires Indexed completion mode"
                )
            if int(rule.get("succeededCount", 0)) > int(spec.get("completions") or 0):
                return invalid(
                    shown,
                    name,
                    "spec.successPolicy.rules[0].succeededCount",
                    rule["succeededCount"],
                    "must be less than or equal to 'completions'",
                )
        if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
            return status_error_422(shown, name, "spec.completions: Required value: when completion mode is Indexed")
        if old is not None:
            before = old.get("spec") or {}
            for field in (
                "completionMode",
                "podFailurePolicy",
                "successPolicy",
                "selector",
                "template",
                "backoffLimitPerIndex",
            ):
                if json.dumps(spec.get(field), sort_keys=True) != json.dumps(before.get(field), sort_keys=True):
                    return invalid(shown, name, f"spec.{field}", spec.get(field), "field is immutable")
            if spec.get("completions") != before.get("completions"):
                elastic = spec.get("completionMode") == "Indexed" and spec.get("completions") == spec.get("parallelism")
                if not elastic:
                    return invalid(shown, name, "spec.completions", spec.get("completions"), "field is immutable")
    return None


def status_error_422(kind: str, name: str, detail: str) -> tuple[int, dict[str, Any]]:
    return 422, status_error(422, "Invalid", f'{kind} "{name}" is invalid: {detail}')


def json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 (add, replace, remove, test), the `application/json-patch+json` kind."""
    out = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op["value"]:
                raise ValueError(f"test operation failed at {op['path']}")
        elif op["op"] == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                parent.pop(last)
        elif op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif op["op"] == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        else:
            raise ValueError(f"unsupported json patch op {op['op']!r}")
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch, for the fields we use: maps merge; lists of objects with a
    `name` merge by name (containers, env, ports, volumes); other lists replace."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        elif (
            isinstance(v, list)
            and isinstance(out.get(k), list)
            and all(isinstance(i, dict) and "name" in i for i in v + out[k])
        ):
            merged = {i["name"]: i for i in out[k]}
            for item in v:
                merged[item["name"]] = strategic_merge_patch(merged.get(item["name"]), item)
            out[k] = list(merged.values())
        else:
            out[k] = strategic_merge_patch(out.get(k), v)
    return out


def age(created: str | None) -> str:
    seconds = max(0, int(time.time() - _parse(created or now_rfc3339())))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def table(gv: str, plural: str, items: list[dict[str, Any]], rv: str) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table, what `kubectl get` asks for (server-side printing)."""
    columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    extra: list[tuple[str, Any]] = []
    if plural == "pods":
        extra = [
            (
                "Ready",
                lambda o: (
                    f"{sum(1 for c in o['status'].get('containerStatuses', []) if c.get('ready'))}/{len(o['spec'].get('containers', []))}"
                ),
            ),
            (
                "Status",
                lambda o: "Terminating" if o["metadata"].get("deletionTimestamp") else o["status"].get("phase", ""),
            ),
            ("Restarts", lambda o: sum(c.get("restartCount", 0) for c in o["status"].get("containerStatuses", []))),
        ]
    elif plural == "jobs":
        extra = [
            (
                "Status",
                lambda o: next(
                    (c["type"] for c in o.get("status", {}).get("conditions", []) if c.get("status") == "True"),
                    "Running",
                ),
            ),
            ("Completions", lambda o: f"{o.get('status', {}).get('succeeded', 0)}/{o['spec'].get('completions')}"),
        ]
    elif plural == "services":
        extra = [
            ("Type", lambda o: o["spec"].get("type", "ClusterIP")),
            ("Cluster-IP", lambda o: o["spec"].get("clusterIP", "")),
        ]
    elif plural == "workloads":  # Kueue's printer columns

        def cond(o: dict[str, Any], type_: str) -> str:
            return next((c["status"] for c in o.get("status", {}).get("conditions", []) if c["type"] == type_), "")

        extra = [
            ("Queue", lambda o: o["spec"].get("queueName", "")),
            ("Reserved in", lambda o: (o.get("status", {}).get("admission") or {}).get("clusterQueue", "")),
            ("Admitted", lambda o: cond(o, "Admitted")),
            ("Finished", lambda o: cond(o, "Finished")),
        ]
    elif plural == "configmaps":
        extra = [("Data", lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {}))]
    columns += [{"name": n, "type": "string", "format": "", "description": n, "priority": 0} for n, _ in extra]
    columns.append({"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0})
    rows = [
        {
            "cells": [o["metadata"]["name"], *[f(o) for _, f in extra], age(o["metadata"].get("creationTimestamp"))],
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]},
        }
        for o in items
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": columns,
        "rows": rows,
    }


class ServiceProxy:
    """kube-proxy for one port of a Service: a listener on its ClusterIP that forwards each
    connection to one Ready endpoint (a userspace proxy). It listens only while the Service
    has Ready endpoints: without any, a connection is refused, as kube-proxy's REJECT rule
    does. Forwarded connections end when either side closes (a deleted pod's do)."""

    def __init__(self, ip: str, port: int, endpoints: Any) -> None:
        self.endpoints = endpoints  # () -> [(ip, port)] of the Ready endpoints, read per connection
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, port))
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.closed = False
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name=f"kube-proxy-{ip}:{port}").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            targets = self.endpoints()
            try:
                if not targets:
                    raise OSError("no endpoints")
                backend = socket.create_connection(random.choice(targets), timeout=2)
                backend.settimeout(None)
            except OSError:
                client.close()
                continue
            self.open += [client, backend]
            for a, b in ((client, backend), (backend, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
            if s in self.open:
                self.open.remove(s)

    def close(self, connections: bool = False) -> None:
        self.closed = True
        self.sock.close()
        if connections:
            for s in list(self.open):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class Container:
    """A pod's container, run as a local process by the fake kubelet."""

    def __init__(self, proc: subprocess.Popen, log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.started = time.time()


class FakeCluster:
    """State, controllers and the HTTP front of the fake API server."""

    def __init__(
        self,
        gpu_slots: int = 4,
        namespaces: tuple[str, ...] = ("default",),
        crds: tuple[str, ...] = (),
        kueue: bool = False,
        kueue_elastic_slices: bool = False,
    ) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (gv, plural, ns, name)
        self.history: list[tuple[int, str, tuple, dict]] = []  # (rv, type, key, object)
        self.rv = 1000
        self.gpu_slots = gpu_slots
        self.namespaces = set(namespaces)
        self.crds = set(crds)
        # Kueue installed (its CRDs served, its controllers run), with or without its
        # ElasticJobsViaWorkloadSlices feature gate.
        self.kueue = k8s_kueue.Kueue(self, elastic_slices=kueue_elastic_slices) if kueue else None
        self.denied: set[tuple[str, str]] = set()  # (verb, plural)
        self.rules: list[dict[str, Any]] | None = None  # RBAC: only these rules, when set
        self.forbidden: list[tuple[str, str]] = []  # (method, path) answered 403
        self.token = "fake-token"  # requests with another bearer token get 401
        self.quota_gpus: int | None = None  # a ResourceQuota on requests.nvidia.com/gpu
        # A Job's pods of index N land on a node unlike the others (a NIC named otherwise, a
        # broken driver, a library missing there): what that node does differently, as
        # environment its containers see. The same index lands there again when replaced.
        self.node_env_by_index: dict[int, dict[str, str]] = {}
        self.create_backoff: dict[str, float] = {}  # job uid -> when its controller may try again
        self.root = Path(tempfile.mkdtemp(prefix="fake-k8s-"))
        self.containers: dict[str, Container] = {}  # pod uid -> running container
        self.previous_logs: dict[str, Path] = {}  # pod uid -> last terminated container's log
        self.next_ip = 2
        self.next_block = 0  # which /24 after the cluster's own the next addresses come from
        self.subnet = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"  # within 127.0.0.0/8
        self.streams: list[Any] = []  # open watch/log connections, for drop_streams()
        self.requests: list[tuple[str, str]] = []
        # Log requests being answered now, and the most at once since the last reset_log_peaks():
        # a follower's held streams (follow=true) and its one-shot reads.
        self.log_follows_open = 0
        self.log_reads_open = 0
        self.log_follows_peak = 0
        self.log_reads_peak = 0
        self.failures: list[tuple[str, str, int]] = []  # (method, path regex, status) answered once each
        self.evictions: list[str] = []  # pods evicted through the Eviction API
        self.expired_watches: list[str] = []  # plurals of watches answered 410 Gone
        self.bookmarks: list[int] = []  # resourceVersions sent in BOOKMARK events
        self.bookmark_interval_s = 1.0  # the real server sends one about every minute
        self.finished_pods: dict[str, dict[str, Any]] = {}  # pod uid -> its last state, until its Job counted it
        self.proxies: dict[tuple[str, str, int], ServiceProxy] = {}  # (ns, service, port) -> kube-proxy
        self.probes: dict[str, tuple[float, int]] = {}  # container's pod uid -> (last probe, failures in a row)
        self.closed = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # The same API over TLS, for kubectl: client-go sends no bearer token over plain HTTP.
        self.tls_server = self._tls_server()
        self.tls_url = f"https://127.0.0.1:{self.tls_server.server_address[1]}" if self.tls_server else None
        self.threads = [
            threading.Thread(target=self.server.serve_forever, daemon=True),
            threading.Thread(target=self._controllers, daemon=True),
        ]
        if self.tls_server is not None:
            self.threads.append(threading.Thread(target=self.tls_server.serve_forever, daemon=True))
        for t in self.threads:
            t.start()

    # -- helpers used by tests ---------------------------------------------------------

    def kubeconfig(self, path: Path, namespace: str = "default", context: str = "fake") -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "fake-token"}}],
                    "contexts": [
                        {"name": context, "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}
                    ],
                    "current-context": context,
                }
            )
        )
        return path

    def _tls_server(self) -> ThreadingHTTPServer | None:
        """A TLS listener with a throwaway self-signed certificate (openssl), or None without openssl."""
        import ssl

        if shutil.which("openssl") is None:
            return None
        cert, key = self.root / "tls.crt", self.root / "tls.key"
        made = subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            capture_output=True,
        )
        if made.returncode != 0:
            return None
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.tls_ca = cert
        return server

    def kubectl_config(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig for the real kubectl: the TLS listener, its certificate as the CA."""
        if self.tls_url is None:
            raise RuntimeError("no TLS listener (openssl is missing)")
        ca = base64.b64encode(self.tls_ca.read_bytes()).decode()
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "fake", "cluster": {"server": self.tls_url, "certificate-authority-data": ca}}
                    ],
                    "users": [{"name": "tester", "user": {"token": self.token}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def fail_next(self, method: str, path_regex: str, status: int = 500) -> None:
        """Answer the next `method` request whose path matches with `status` (a transient
        API error: 429, 500, 503), once; call again for more."""
        self.failures.append((method, path_regex, status))

    def set_quota(self, gpus: int | None) -> None:
        """A namespace ResourceQuota: pods beyond it are refused at creation (403)."""
        self.quota_gpus = gpus

    def deny(self, verb: str, plural: str) -> None:
        self.denied.add((verb, plural))

    def grant_only(self, rules: list[dict[str, Any]] | None) -> None:
        """RBAC as a Role's `rules` (apiGroups, resources incl. pods/log, verbs): every other
        request is 403 Forbidden. None grants everything again."""
        self.rules = rules

    def _granted(self, verb: str, group: str, resource: str) -> bool:
        if (verb, resource.split("/")[0]) in self.denied or (verb, "*") in self.denied:
            return False
        if self.rules is None:
            return True
        return any(
            group in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r.get("verbs", [])
            for r in self.rules
        )

    def set_gpu_slots(self, n: int) -> None:
        with self.lock:
            self.gpu_slots = n
            self.changed.notify_all()

    def preempt(self, pod_name: str, namespace: str = "default", reason: str = "PreemptionByScheduler") -> None:
        """What a scheduler preemption or a spot reclaim does: mark, then delete the pod."""
        with self.lock:
            pod = self.objects.get(("v1", "pods", namespace, pod_name))
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
            self._store("MODIFIED", pod)
        self._delete(("v1", "pods", namespace, pod_name), grace=5)

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
        with self.lock:
            pod = self.objects.get(key)
            if pod is None:
                raise KeyError(pod_name)
            container = self.containers[pod["metadata"]["uid"]]
            os.killpg(container.proc.pid, signal.SIGSTOP)
            pod = copy.deepcopy(pod)
            _set_ready(pod, False)
            pod = self._store("MODIFIED", pod)
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
            self._store("MODIFIED", pod)
            return container.proc.pid

    def drop_streams(self) -> int:
        """Cut every open watch and log stream mid-flight, as a flaky network would."""
        with self.lock:
            streams, self.streams = self.streams, []
        for s in streams:
            try:
                s.connection.shutdown(2)
            except OSError:
                pass
        return len(streams)

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

    def close(self) -> None:
        self.closed = True
        with self.lock:
            proxies, self.proxies = list(self.proxies.values()), {}
        for proxy in proxies:
            proxy.close(connections=True)
        with self.lock:
            uids = list(self.containers)
        for uid in uids:
            self._kill_container(uid, grace=2)
        self.server.shutdown()
        self.server.server_close()
        if self.tls_server is not None:
            self.tls_server.shutdown()
            self.tls_server.server_close()
        self.drop_streams()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- storage -----------------------------------------------------------------------

    def _key(self, obj: dict[str, Any]) -> tuple[str, str, str, str]:
        api = obj["apiVersion"]
        plural = next(pl for (gv, pl), kind in RESOURCES.items() if kind == obj["kind"] and gv == api)
        return (api, plural, obj["metadata"].get("namespace", "default"), obj["metadata"]["name"])

    def _store(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            key = self._key(obj)
            if kind == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
            self.history.append((self.rv, kind, key, copy.deepcopy(obj)))
            if len(self.history) > 5000:
                del self.history[:1000]
            self.changed.notify_all()
            return copy.deepcopy(obj)

    def _create(
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
        if plural == "jobs" and self.kueue is not None:
            self.kueue.default_job(body)  # Kueue's mutating webhook
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
                body["spec"]["clusterIP"] = self._alloc_ip()
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
            return 201, self._store("ADDED", body)

    def _quota_refusal(self, ns: str, pod: dict[str, Any]) -> str | None:
        """The admission message for a pod beyond the namespace's GPU quota, else None."""
        if self.quota_gpus is None:
            return None
        with self.lock:
            used = sum(
                self._gpus(o)
                for k, o in self.objects.items()
                if k[1] == "pods" and k[2] == ns and o["status"].get("phase") in ("Pending", "Running")
            )
        asked = self._gpus(pod)
        if used + asked <= self.quota_gpus:
            return None
        name = pod.get("metadata", {}).get("name", "")
        return (
            f'pods "{name}" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu={asked}, '
            f"used: requests.nvidia.com/gpu={used}, limited: requests.nvidia.com/gpu={self.quota_gpus}"
        )

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
                    self._store("MODIFIED", updated)
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
            self._store("ADDED", event)

    @staticmethod
    def _crd(name: str) -> dict[str, Any]:
        """The real CustomResourceDefinition object (tests/data), as the API server returns it."""
        import yaml

        crd = yaml.safe_load((Path(__file__).parent / "data" / "kubeflow.org_pytorchjobs.v1.9.0.yaml").read_text())
        crd["metadata"].update(
            name=name,
            uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            resourceVersion="1",
            creationTimestamp=now_rfc3339(),
        )
        return crd

    def _alloc_ip(self) -> str:
        """The next address of this cluster's own loopback /24 (127.A.B.2-250), so two fake
        clusters at once (a CI run beside a developer's) never share a pod's IP and port; a
        cluster of more pods than that goes on in the next /24s (127.A.B+1...), so no two live
        pods share an address (tests/k8s_light.py's hundreds of pods)."""
        ip = self.next_ip
        self.next_ip += 1
        if self.next_ip > 250:
            self.next_ip = 2
            self.next_block += 1
        a, b = self.subnet.split(".")[1:]
        return f"127.{a}.{(int(b) + self.next_block) % 256}.{ip}"

    def _delete(
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
                self._orphan(obj["metadata"]["uid"])
            elif policy == "Foreground" and key[1] != "pods":
                self._collect_garbage(obj["metadata"]["uid"], wait=True)
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
                self._store("MODIFIED", obj)
                threading.Thread(target=self._terminate_pod, args=(key, obj), daemon=True).start()
                return obj
            self._store("DELETED", copy.deepcopy(obj))
        self._collect_garbage(obj["metadata"]["uid"])
        return obj

    def _orphan(self, owner_uid: str) -> None:
        with self.lock:
            for o in list(self.objects.values()):
                refs = o["metadata"].get("ownerReferences", [])
                if any(r.get("uid") == owner_uid for r in refs):
                    new = copy.deepcopy(o)
                    new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner_uid]
                    self._store("MODIFIED", new)

    def _collect_garbage(self, owner_uid: str, wait: bool = False) -> None:
        """Delete the dependents of a deleted owner (those whose every owner is gone). With
        `wait` (foreground deletion) the lock is released while pods terminate."""
        with self.lock:
            dependents = [
                k
                for k, o in self.objects.items()
                if any(r.get("uid") == owner_uid for r in o["metadata"].get("ownerReferences", []))
            ]
        for key in dependents:
            self._delete(key, grace=1, policy="Foreground" if wait else "Background")
        if wait:
            with self.lock:
                while any(k in self.objects for k in dependents) and not self.closed:
                    self.changed.wait(0.1)

    # -- HTTP --------------------------------------------------------------------------

    def _handler(self):
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for warning in self.warnings:  # as the API server sends them (RFC 7234 warn-code 299)
                    self.send_header("Warning", f"299 - {json.dumps(warning)}")
                self.end_headers()
                self.wfile.write(data)

            def _read_body(self) -> None:
                # Always consume the body, even for a request that is refused: the
                # connection is kept alive and the next request starts after it.
                length = int(self.headers.get("Content-Length", 0) or 0)
                raw = self.rfile.read(length) if length else b""
                self.raw = raw
                self.warnings: list[str] = []
                self.body = json.loads(raw) if raw.strip() else {}

            def _body(self) -> Any:
                return self.body

            def do_GET(self) -> None:
                self._read_body()
                cluster._route(self, "GET")

            def do_POST(self) -> None:
                self._read_body()
                cluster._route(self, "POST")

            def do_PATCH(self) -> None:
                self._read_body()
                cluster._route(self, "PATCH")

            def do_PUT(self) -> None:
                self._read_body()
                cluster._route(self, "PUT")

            def do_DELETE(self) -> None:
                self._read_body()
                cluster._route(self, "DELETE")

        return Handler

    _PATH = re.compile(
        r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
        r"(?:/namespaces/(?P<ns>[^/]+))?(?:/(?P<plural>[a-z]+))?(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
    )

    def _discovery(self, path: str) -> dict[str, Any] | None:
        """The legacy discovery documents kubectl reads before anything else (it asks for the
        aggregated kind first and falls back to these)."""
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }
        groups = sorted({gv for gv in GROUPS if gv != "v1" and self._serves(gv)} | {"policy/v1"})
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

    def _serves(self, gv: str) -> bool:
        """Whether this cluster has the API group: the CRDs installed, or built in."""
        if gv == "kubeflow.org/v1":
            return bool(self.crds)
        if gv == k8s_kueue.GV:
            return self.kueue is not None
        return True

    def _route(self, h: Any, method: str) -> None:
        url = urlparse(h.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.requests.append((method, url.path))
        if h.headers.get("Authorization") != f"Bearer {self.token}":
            return h._json(401, status_error(401, "Unauthorized", "Unauthorized"))
        if url.path == "/version":
            return h._json(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake", "platform": "linux/amd64"})
        path = url.path.rstrip("/") or "/"
        if method == "GET" and (
            path in ("/api", "/apis", "/api/v1") or path.count("/") == 3 and path.startswith("/apis/")
        ):
            doc = self._discovery(path)
            if doc is not None:
                return h._json(200, doc)
        if method == "GET" and url.path.startswith("/openapi/v3") and url.path.rstrip("/") in self._openapi_paths():
            return self._serve_openapi(h, url.path.rstrip("/"))
        if url.path.startswith("/openapi/"):
            # /openapi/v2 (protobuf-first; kubectl reads it only from servers without v3).
            return h._json(404, status_error(404, "NotFound", "the server could not find the requested resource"))
        if url.path.startswith("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"):
            name = url.path.rsplit("/", 1)[1]
            if name in self.crds:
                return h._json(200, self._crd(name))
            return h._json(
                404, status_error(404, "NotFound", f'customresourcedefinitions.apiextensions.k8s.io "{name}" not found')
            )
        m = self._PATH.match(url.path)
        if not m:
            return h._json(
                404, status_error(404, "NotFound", f"the server could not find the requested resource ({url.path})")
            )
        gv = m.group("core") or f"{m.group('group')}/{m.group('version')}"
        ns, plural, name, sub = m.group("ns"), m.group("plural"), m.group("name"), m.group("sub")
        if gv == "v1" and ns is None and plural == "nodes" and method == "GET":
            # The one node the scheduler places pods on (cluster-scoped: RBAC by ClusterRole).
            if not self._granted("list" if not name else "get", "", "nodes"):
                self.forbidden.append((method, url.path))
                return h._json(
                    403,
                    status_error(
                        403,
                        "Forbidden",
                        'nodes is forbidden: User "tester" cannot list resource "nodes" in API group "" at the cluster scope',
                    ),
                )
            allocatable = {"cpu": "16", "memory": "64Gi", "pods": "110"}
            if self.gpu_slots:
                allocatable["nvidia.com/gpu"] = str(self.gpu_slots)
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "fake-node", "uid": "fake-node-uid"},
                "status": {"allocatable": allocatable, "capacity": allocatable},
            }
            return h._json(
                200,
                {
                    "apiVersion": "v1",
                    "kind": "NodeList",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": [node],
                },
            )
        if plural is None and ns is not None and gv == "v1":
            # GET /api/v1/namespaces/NAME
            if ns in self.namespaces:
                return h._json(
                    200,
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}, "status": {"phase": "Active"}},
                )
            return h._json(404, status_error(404, "NotFound", f'namespaces "{ns}" not found'))
        if (gv, plural) not in RESOURCES or not self._serves(gv):
            return h._json(
                404, status_error(404, "NotFound", f"the server could not find the requested resource ({plural})")
            )
        if sub is not None and sub not in SUBRESOURCES.get(plural, []):
            return h._json(
                404, status_error(404, "NotFound", f"the server could not find the requested resource ({plural}/{sub})")
            )
        verb = {
            "GET": "get" if name else ("watch" if q.get("watch") in ("true", "1") else "list"),
            "POST": "create",
            "PATCH": "patch",
            "PUT": "update",
            "DELETE": "delete" if name else "deletecollection",
        }[method]
        group = GROUPS[gv]
        resource = f"{plural}/{sub}" if sub else plural
        if not self._granted(verb, group, resource):
            self.forbidden.append((method, url.path))
            return h._json(
                403,
                status_error(
                    403,
                    "Forbidden",
                    f'{plural}{"." + group if group else ""} is forbidden: User "tester" cannot {verb} resource "{resource}" in API group "{group}" in the namespace "{ns}"',
                ),
            )
        if self.failures:
            method_, path_, code_ = self.failures[0]
            if method_ == method and re.search(path_, url.path):
                self.failures.pop(0)
                reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}.get(code_, "Unknown")
                return h._json(code_, status_error(code_, reason, f"injected {code_} for {url.path}"))
        ns = ns or "default"
        dry_run = q.get("dryRun") == "All"
        if "dryRun" in q and not dry_run:
            return h._json(
                400, status_error(400, "BadRequest", f"unsupported dryRun value {q['dryRun']!r}; only All is supported")
            )
        directive = q.get("fieldValidation", "Warn")  # the server's default since 1.27
        if method in ("POST", "PUT", "PATCH") and directive not in ("Ignore", "Warn", "Strict"):
            return h._json(
                400,
                status_error(
                    400,
                    "BadRequest",
                    f'fieldValidation: Unsupported value: "{directive}": supported values: "Ignore", "Strict", "Warn"',
                ),
            )
        if method in ("POST", "PUT") and sub is None and directive != "Ignore" and h.raw.strip():
            # Server-side field validation: the strict decoder's unknown and duplicate fields.
            body_kind = h._body().get("kind") if isinstance(h._body(), dict) else None
            kind = body_kind if isinstance(body_kind, str) and body_kind else RESOURCES[(gv, plural)]
            issues = k8s_openapi.create_issues(gv, RESOURCES[(gv, plural)], k8s_openapi.parse_pairs(h.raw))
            stored = self.get(plural, name, ns or "default", gv) if method == "PUT" and name else None
            if stored is not None:  # the fixture's own bookkeeping sent back (see _patch_field_validation)
                issues = [i for i in issues if i not in k8s_openapi.unknown_fields(gv, RESOURCES[(gv, plural)], stored)]
            if issues and directive == "Strict":
                version = gv.rsplit("/", 1)[-1]
                return h._json(
                    400,
                    status_error(
                        400,
                        "BadRequest",
                        f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: '
                        + ", ".join(issues),
                    ),
                )
            h.warnings.extend(issues)
        if method == "POST" and sub == "eviction":
            return self._evict(h, ns, name, h._body(), dry_run)
        if method == "POST" and sub is not None:
            return h._json(405, status_error(405, "MethodNotAllowed", f"create is not supported on {plural}/{sub}"))
        if method == "POST" and plural == "pods":
            refusal = self._quota_refusal(ns, h._body())
            if refusal:
                return h._json(403, status_error(403, "Forbidden", refusal))
        if method == "POST":
            body = k8s_openapi.prune(gv, RESOURCES[(gv, plural)], h._body())  # unknown fields never stored
            code, body = self._create(gv, plural, ns, body, dry_run=dry_run)
            return h._json(code, body)
        if method == "GET" and sub == "log":
            return self._serve_log(h, ns, name, q)
        wants_table = "as=Table" in (h.headers.get("Accept") or "")
        if method == "GET" and name:
            obj = self.get(plural, name, ns, gv)
            if obj is None:
                return h._json(
                    404, status_error(404, "NotFound", f'{plural}{"." + group if group else ""} "{name}" not found')
                )
            if wants_table:
                return h._json(200, table(gv, plural, [obj], obj["metadata"]["resourceVersion"]))
            return h._json(200, obj)
        if method == "GET" and q.get("watch") in ("true", "1"):
            return self._serve_watch(h, gv, plural, ns, q)
        if method == "GET":
            with self.lock:
                items = [
                    copy.deepcopy(o)
                    for (g, pl, n, _), o in self.objects.items()
                    if g == gv
                    and pl == plural
                    and n == ns
                    and match_labels(o["metadata"].get("labels", {}), q.get("labelSelector"))
                    and match_fields(o, q.get("fieldSelector"))
                ]
                rv = str(self.rv)
            if wants_table:
                return h._json(200, table(gv, plural, items, rv))
            return h._json(
                200,
                {
                    "apiVersion": gv,
                    "kind": RESOURCES[(gv, plural)] + "List",
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                },
            )
        if method in ("PATCH", "PUT"):
            patch = h._body()
            content_type = (h.headers.get("Content-Type") or "").split(";")[0]
            with self.lock:
                obj = self.objects.get((gv, plural, ns, name))
                if obj is None:
                    return h._json(404, status_error(404, "NotFound", f'{plural} "{name}" not found'))
                try:
                    if method == "PUT":
                        new = dict(
                            patch,
                            metadata=dict(
                                obj["metadata"],
                                **{
                                    k: v
                                    for k, v in (patch.get("metadata") or {}).items()
                                    if k in ("labels", "annotations", "ownerReferences")
                                },
                            ),
                        )
                    elif content_type == "application/json-patch+json" or isinstance(patch, list):
                        new = json_patch(obj, patch)
                    elif content_type == "application/strategic-merge-patch+json":
                        if (gv, plural) == ("kubeflow.org/v1", "pytorchjobs"):
                            return h._json(
                                415,
                                status_error(
                                    415,
                                    "UnsupportedMediaType",
                                    "strategic merge patch is not supported for custom resources; use a merge patch",
                                ),
                            )
                        new = strategic_merge_patch(obj, patch)
                    elif content_type in ("application/merge-patch+json", ""):
                        new = merge_patch(obj, patch)
                    else:
                        return h._json(
                            415,
                            status_error(
                                415,
                                "UnsupportedMediaType",
                                f"the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type})",
                            ),
                        )
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    return h._json(422, status_error(422, "Invalid", f"the patch could not be applied: {exc}"))
                for immutable in ("name", "namespace", "uid", "creationTimestamp"):
                    new.setdefault("metadata", {})[immutable] = obj["metadata"][immutable]
                new["apiVersion"], new["kind"] = obj["apiVersion"], obj["kind"]
                if method == "PATCH" and sub is None and directive != "Ignore":
                    refused = self._patch_field_validation(h, gv, plural, content_type, patch, new, obj, directive)
                    if refused:
                        return h._json(*refused)
                if sub is None:
                    # Unknown fields are never stored; the status is kept as it was patched
                    # (the Job controller's own bookkeeping lives there, see _reconcile_job).
                    pruned = k8s_openapi.prune(gv, RESOURCES[(gv, plural)], new)
                    if "status" in new:
                        pruned["status"] = new["status"]
                    new = pruned
                refused = validate(gv, plural, new, old=obj)
                if refused:
                    return h._json(*refused)
                if dry_run:
                    return h._json(200, new)
                return h._json(200, self._store("MODIFIED", new))
        if method == "DELETE" and name:
            body = h._body()
            grace = body.get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
            policy = body.get("propagationPolicy") or q.get("propagationPolicy")
            if policy not in (None, "Orphan", "Background", "Foreground"):
                return h._json(
                    400,
                    status_error(
                        400, "BadRequest", f"propagationPolicy {policy!r} is not one of Orphan, Background, Foreground"
                    ),
                )
            if dry_run:
                obj = self.get(plural, name, ns, gv)
                if obj is None:
                    return h._json(404, status_error(404, "NotFound", f'{plural} "{name}" not found'))
                return h._json(200, obj)
            obj = self._delete((gv, plural, ns, name), grace=float(grace) if grace is not None else None, policy=policy)
            if obj is None:
                return h._json(
                    404, status_error(404, "NotFound", f'{plural}{"." + group if group else ""} "{name}" not found')
                )
            if plural in ("pods", "services", "persistentvolumeclaims") or obj["metadata"].get("deletionTimestamp"):
                return h._json(200, obj)  # these answer with the object, as the real API does
            return h._json(
                200,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Success",
                    "details": {"name": name, "kind": plural, "uid": obj["metadata"]["uid"]},
                },
            )
        if method == "DELETE":
            if dry_run:
                return h._json(
                    200, {"apiVersion": gv, "kind": RESOURCES[(gv, plural)] + "List", "metadata": {}, "items": []}
                )
            with self.lock:
                keys = [
                    k
                    for k, o in self.objects.items()
                    if k[0] == gv
                    and k[1] == plural
                    and k[2] == ns
                    and match_labels(o["metadata"].get("labels", {}), q.get("labelSelector"))
                ]
            for key in keys:
                self._delete(key)
            return h._json(
                200, {"apiVersion": gv, "kind": RESOURCES[(gv, plural)] + "List", "metadata": {}, "items": []}
            )
        return h._json(405, status_error(405, "MethodNotAllowed", "method not allowed"))

    def _openapi_documents(self) -> dict[str, bytes]:
        """Each served group-version's OpenAPI v3 document (kubeflow.org/v1 once its CRD is)."""
        with self.lock:
            key = tuple(sorted(self.crds))
            if getattr(self, "_openapi_cache", (None,))[0] != key:
                by_gv: dict[str, dict[str, str]] = {}
                for (gv, plural), kind in RESOURCES.items():
                    if self._serves(gv) and gv != k8s_kueue.GV:  # Kueue's schemas: tests/data, not served
                        by_gv.setdefault(gv, {})[plural] = kind
                docs = {gv: json.dumps(k8s_openapi.gv_document(gv, res)).encode() for gv, res in by_gv.items()}
                self._openapi_cache = (key, docs)
            return self._openapi_cache[1]

    def _openapi_paths(self) -> tuple[str, ...]:
        return (
            "/openapi/v3",
            *("/openapi/v3/api/v1" if gv == "v1" else f"/openapi/v3/apis/{gv}" for gv in self._openapi_documents()),
        )

    def _serve_openapi(self, h: Any, path: str) -> None:
        docs = self._openapi_documents()
        if path == "/openapi/v3":
            body = json.dumps(k8s_openapi.root(docs)).encode()
        else:
            gv = path.removeprefix("/openapi/v3/").removeprefix("api/").removeprefix("apis/")
            body = docs[gv]
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _patch_field_validation(
        self,
        h: Any,
        gv: str,
        plural: str,
        content_type: str,
        patch: Any,
        new: dict[str, Any],
        old: dict[str, Any],
        directive: str,
    ) -> tuple[int, dict[str, Any]] | None:
        """Strict/Warn field validation of a patch, as the API server's patch handler does it:
        a refusal is a 422 naming the field `patch` (the patch map as Go prints it for a
        strategic merge patch, the patched object's JSON otherwise)."""
        kind = RESOURCES[(gv, plural)]
        pairs = k8s_openapi.parse_pairs(h.raw)
        if content_type == "application/json-patch+json" or isinstance(patch, list):
            issues = k8s_openapi.json_patch_issues(gv, kind, pairs, new)
        else:
            issues = k8s_openapi.patch_issues(gv, kind, pairs, new)
        # Fields the fixture itself keeps in a stored object (the Job controller's counters
        # in its status) are no client's doing: a real server's stored objects have none.
        issues = [i for i in issues if i not in k8s_openapi.unknown_fields(gv, kind, old)]
        if not issues:
            return None
        if directive == "Warn":
            h.warnings.extend(issues)
            return None
        if content_type == "application/strategic-merge-patch+json":
            value = k8s_openapi.go_value(patch)
        else:
            value = json.dumps(new, separators=(",", ":"))
        detail = "strict decoding error: " + ", ".join(issues)
        body = status_error(422, "Invalid", f' "" is invalid: patch: Invalid value: {json.dumps(value)}: {detail}')
        body["details"] = {
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {json.dumps(value)}: {detail}",
                    "field": "patch",
                }
            ]
        }
        return 422, body

    def _evict(self, h: Any, ns: str, name: str, body: dict[str, Any], dry_run: bool) -> None:
        """The Eviction API (policy/v1 Eviction on pods/NAME/eviction): the pod gets the
        DisruptionTarget condition (reason EvictionByEvictionAPI), then is deleted gracefully;
        a Job's podFailurePolicy can then ignore it. No PodDisruptionBudgets here."""
        if body.get("kind") not in (None, "Eviction") or (body.get("metadata") or {}).get("name") not in (None, name):
            return h._json(
                400,
                status_error(400, "BadRequest", "the body of an eviction must be a policy/v1 Eviction naming the pod"),
            )
        key = ("v1", "pods", ns, name)
        with self.lock:
            pod = self.objects.get(key)
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
                self._store("MODIFIED", pod)
        grace = (body.get("deleteOptions") or {}).get("gracePeriodSeconds")
        self._delete(key, grace=float(grace) if grace is not None else None)
        self.evictions.append(name)
        return h._json(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})

    def _start_stream(self, h: Any, content_type: str) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        with self.lock:
            self.streams.append(h)

    @staticmethod
    def _chunk(h: Any, data: bytes) -> None:
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()

    def _end_stream(self, h: Any) -> None:
        try:
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            pass
        with self.lock:
            if h in self.streams:
                self.streams.remove(h)

    def _serve_watch(self, h: Any, gv: str, plural: str, ns: str, q: dict[str, str]) -> None:
        selector = q.get("labelSelector")
        fields = q.get("fieldSelector")
        timeout = float(q.get("timeoutSeconds", 300))
        since = q.get("resourceVersion")
        with self.lock:
            oldest = self.history[0][0] if self.history else self.rv
            if since and since not in ("0", "") and int(since) < oldest - 1:
                self.expired_watches.append(plural)
                gone = status_error(410, "Expired", f"too old resource version: {since} ({oldest})")
                self._start_stream(h, "application/json")
                self._chunk(h, json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                return self._end_stream(h)
            if since in (None, "", "0"):
                initial = [
                    ("ADDED", copy.deepcopy(o))
                    for k, o in self.objects.items()
                    if k[0] == gv and k[1] == plural and k[2] == ns
                ]
                cursor = self.rv
            else:
                initial = []
                cursor = int(since)
        self._start_stream(h, "application/json")
        deadline = time.monotonic() + timeout
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        last_bookmark = time.monotonic()
        try:
            for kind, obj in initial:
                if match_labels(obj["metadata"].get("labels", {}), selector) and match_fields(obj, fields):
                    self._chunk(h, json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            while time.monotonic() < deadline and not self.closed:
                with self.lock:
                    pending = [
                        (rv, kind, obj)
                        for rv, kind, key, obj in self.history
                        if rv > cursor and key[0] == gv and key[1] == plural and key[2] == ns
                    ]
                    if not pending:
                        if bookmarks and time.monotonic() - last_bookmark >= self.bookmark_interval_s:
                            # Nothing of this kind is unsent up to the latest resourceVersion:
                            # a BOOKMARK carries it, so a quiet watch can resume after compaction.
                            cursor, last_bookmark = self.rv, time.monotonic()
                            mark = {
                                "kind": RESOURCES[(gv, plural)],
                                "apiVersion": gv,
                                "metadata": {"resourceVersion": str(cursor)},
                            }
                            self.bookmarks.append(cursor)
                            pending = [(cursor, "BOOKMARK", mark)]
                        else:
                            self.changed.wait(0.5)
                            continue
                for rv, kind, obj in pending:
                    cursor = rv
                    if kind == "BOOKMARK" or (
                        match_labels(obj["metadata"].get("labels", {}), selector) and match_fields(obj, fields)
                    ):
                        self._chunk(h, json.dumps({"type": kind, "object": obj}).encode() + b"\n")
        except OSError:
            return
        self._end_stream(h)

    def reset_log_peaks(self) -> None:
        with self.lock:
            self.log_follows_peak, self.log_reads_peak = self.log_follows_open, self.log_reads_open

    def _serve_log(self, h: Any, ns: str, name: str, q: dict[str, str]) -> None:
        follow = q.get("follow") in ("true", "1") and q.get("previous") not in ("true", "1")
        with self.lock:
            if follow:
                self.log_follows_open += 1
                self.log_follows_peak = max(self.log_follows_peak, self.log_follows_open)
            else:
                self.log_reads_open += 1
                self.log_reads_peak = max(self.log_reads_peak, self.log_reads_open)
        try:
            self._answer_log(h, ns, name, q)
        finally:
            with self.lock:
                if follow:
                    self.log_follows_open -= 1
                else:
                    self.log_reads_open -= 1

    @staticmethod
    def _client_gone(h: Any) -> bool:
        """The client closed its end (a quiet followed log would otherwise be served until its
        container ends, as a kubelet notices a closed connection at once)."""
        try:
            ready, _, _ = select.select([h.connection], [], [], 0)
            return bool(ready) and h.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _answer_log(self, h: Any, ns: str, name: str, q: dict[str, str]) -> None:
        pod = self.get("pods", name, ns)
        if pod is None:
            return h._json(404, status_error(404, "NotFound", f'pods "{name}" not found'))
        uid = pod["metadata"]["uid"]
        previous = q.get("previous") in ("true", "1")
        with self.lock:
            container = self.containers.get(uid)
            path = (
                self.previous_logs.get(uid)
                if previous
                else (container.log_path if container else self.previous_logs.get(uid))
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
        self._start_stream(h, "text/plain")
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
                            if cutoff is not None and _parse(stamp.decode()) < cutoff:
                                continue
                            out.append(line if timestamps else text)
                        if out:
                            self._chunk(h, b"\n".join(out) + b"\n")
                        continue
                    if not follow or self.closed:
                        break
                    with self.lock:
                        running = (
                            self.containers.get(uid) is container
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
        self._end_stream(h)

    # -- controllers: scheduler, kubelet, job controller ---------------------------------

    def _controllers(self) -> None:
        while not self.closed:
            try:
                self._schedule()
                self._reap_containers()
                self._probe_readiness()
                self._run_services()
                self._run_jobs()
                self._run_deployments()
                self._run_replicasets()
                if self.kueue is not None:
                    self.kueue.reconcile()
            except Exception:  # a controller bug must surface in the test, not kill the thread silently
                import traceback

                traceback.print_exc()
            time.sleep(0.1)

    @staticmethod
    def _gpus(pod: dict[str, Any]) -> int:
        total = 0
        for c in pod["spec"].get("containers", []):
            limits = (c.get("resources") or {}).get("limits") or {}
            total += int(limits.get("nvidia.com/gpu", 0))
        return total

    def _schedule(self) -> None:
        with self.lock:
            pods = [o for k, o in self.objects.items() if k[1] == "pods"]
            used = sum(
                self._gpus(p)
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
                        self._store("MODIFIED", new)
                    continue
                need = self._gpus(pod)
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
                        self._store("MODIFIED", new)
                    continue
                used += need
                new = copy.deepcopy(pod)
                new["spec"]["nodeName"] = "fake-node"
                new["status"]["conditions"] = [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}
                ]
                new["status"]["podIP"] = self._alloc_ip()
                stored = self._store("MODIFIED", new)
                self._start_container(stored)

    def _env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/root"),
            "HOSTNAME": pod["metadata"]["name"],
        }
        # The test marker (tests/conftest.py: the leftover check finds pods by it) and the test's
        # private temp folder (where zygote sockets go) reach every pod.
        for key in ("NOTEBOOK_ELASTIC_TEST_ID", "LANG", "TMPDIR"):
            if key in os.environ:
                env[key] = os.environ[key]
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = self._expand(str(item["value"]), env)
            elif "valueFrom" in item and "secretKeyRef" in item["valueFrom"]:
                ref = item["valueFrom"]["secretKeyRef"]
                secret = self.get("secrets", ref["name"], pod["metadata"]["namespace"])
                if secret is None:
                    raise ContainerConfigError(f'secret "{ref["name"]}" not found')
                if ref["key"] not in (secret.get("data") or {}):
                    raise ContainerConfigError(f"couldn't find key {ref['key']} in Secret {ref['name']}")
                env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            elif "valueFrom" in item and "fieldRef" in item["valueFrom"]:
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                value = {
                    "metadata.name": pod["metadata"]["name"],
                    "metadata.namespace": pod["metadata"]["namespace"],
                    "status.podIP": pod["status"].get("podIP", ""),
                }.get(path, "")
                env[item["name"]] = value
        if "JOB_COMPLETION_INDEX" not in env and "batch.kubernetes.io/job-completion-index" in pod["metadata"].get(
            "labels", {}
        ):
            env["JOB_COMPLETION_INDEX"] = pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        index = pod["metadata"].get("labels", {}).get("batch.kubernetes.io/job-completion-index")
        if index is not None and index.isdigit():
            env.update(self.node_env_by_index.get(int(index), {}))
        return env

    @staticmethod
    def _expand(text: str, env: dict[str, str]) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)

    def _resolve_services(self, text: str, ns: str) -> str:
        """Cluster DNS: a Service name becomes its ClusterIP (kube-proxy forwards to a Ready
        endpoint: ``_run_services``); a headless Service's, the address of a Ready pod."""
        with self.lock:
            services = [o for k, o in self.objects.items() if k[1] == "services" and k[2] == ns]
        for svc in services:
            name = svc["metadata"]["name"]
            ip = svc["spec"].get("clusterIP")
            if not ip or ip == "None":
                ready = self._ready_pods(svc)
                if not ready:
                    continue
                ip = ready[0]["status"]["podIP"]
            for host in (f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}.svc", f"{name}.{ns}", name):
                text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?=[:/]|$)", ip, text)
        return text

    def _wait_container(self, pod: dict[str, Any], container: dict[str, Any], reason: str, message: str) -> None:
        """The container cannot start (yet): the pod stays Pending with the kubelet's reason."""
        with self.lock:
            current = self.objects.get(self._key(pod))
            if current is None:
                return
            new = copy.deepcopy(current)
            new["status"]["containerStatuses"] = [
                {
                    "name": container["name"],
                    "ready": False,
                    "restartCount": 0,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ]
            self._store("MODIFIED", new)

    def _start_container(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        ns = pod["metadata"]["namespace"]
        container = pod["spec"]["containers"][0]
        if "does-not-exist" in container.get("image", ""):
            # The registry has no such image: the kubelet backs off pulling it, forever.
            with self.lock:
                current = self.objects.get(self._key(pod))
                if current is not None:
                    new = copy.deepcopy(current)
                    new["status"]["containerStatuses"] = [
                        {
                            "name": container["name"],
                            "ready": False,
                            "restartCount": 0,
                            "image": container["image"],
                            "imageID": "",
                            "state": {
                                "waiting": {
                                    "reason": "ImagePullBackOff",
                                    "message": f'Back-off pulling image "{container["image"]}"',
                                }
                            },
                        }
                    ]
                    self._store("MODIFIED", new)
            return
        pod_dir = self.root / uid
        pod_dir.mkdir(parents=True, exist_ok=True)
        mounts: dict[str, str] = {}
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            vol = volumes.get(mount["name"], {})
            host = pod_dir / "volumes" / mount["name"]
            if "configMap" in vol:
                cm = self.get("configmaps", vol["configMap"]["name"], ns)
                host.mkdir(parents=True, exist_ok=True)
                for key, value in (cm or {}).get("data", {}).items():
                    (host / key).write_text(value)
                for key, value in (cm or {}).get("binaryData", {}).items():
                    (host / key).write_bytes(base64.b64decode(value))
            elif "persistentVolumeClaim" in vol:
                host = self.root / "pvc" / ns / vol["persistentVolumeClaim"]["claimName"]
                host.mkdir(parents=True, exist_ok=True)
            else:
                host.mkdir(parents=True, exist_ok=True)
            if mount["mountPath"] == "/dev/shm":
                continue
            mounts[mount["mountPath"]] = str(host)
        # A path in the image's own filesystem (the default checkpoint folder without a PVC)
        # is the container's, not the machine's: jobs never share it, as on a real node.
        mounts.setdefault(CONTAINER_CHECKPOINTS, str(pod_dir / "rootfs" / CONTAINER_CHECKPOINTS.lstrip("/")))
        try:
            env = self._env(pod, container)
        except ContainerConfigError as exc:
            self._wait_container(pod, container, "CreateContainerConfigError", str(exc))
            return

        def rewrite(text: str) -> str:
            text = self._expand(text, env)
            for path, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(path, host)
            return self._resolve_services(text, ns)

        env = {k: rewrite(v) for k, v in env.items()}
        argv = [rewrite(a) for a in container.get("command", []) + container.get("args", [])]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
            if _bare_python_image(container.get("image", "")):
                # Docker's official Python image has the standard library and nothing else:
                # no site-packages here either (no torch, no cloudpickle), so code that needs
                # more fails here as it would in that image.
                argv[1:1] = ["-S"]
        log_path = pod_dir / f"log-{int(time.time() * 1000)}.txt"
        log = open(log_path, "wb")
        reader_r, reader_w = os.pipe()
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=str(pod_dir),
            stdin=subprocess.DEVNULL,
            stdout=reader_w,
            stderr=reader_w,
            start_new_session=True,
        )
        os.close(reader_w)
        threading.Thread(target=self._pump_log, args=(reader_r, log), daemon=True).start()
        with self.lock:
            self.containers[uid] = Container(proc, log_path)
            current = self.objects.get(self._key(pod))
            if current is None:
                return
            new = copy.deepcopy(current)
            new["status"]["phase"] = "Running"
            restarts = (new["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0)
            # With a readinessProbe the container is Ready only once the probe passes.
            ready = not container.get("readinessProbe")
            self.probes.pop(uid, None)
            _set_ready(new, ready)
            new["status"]["containerStatuses"] = [
                {
                    "name": container["name"],
                    "ready": ready,
                    "restartCount": restarts,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "state": {"running": {"startedAt": now_rfc3339()}},
                }
            ]
            new["status"]["startTime"] = new["status"].get("startTime") or now_rfc3339()
            self._store("MODIFIED", new)

    @staticmethod
    def _pump_log(fd: int, log: Any) -> None:
        """The container runtime: timestamp every line as it arrives."""
        with os.fdopen(fd, "rb") as pipe:
            for line in iter(pipe.readline, b""):
                log.write(stamp_nano(time.time()).encode() + b" " + line.rstrip(b"\n") + b"\n")
                log.flush()
        log.close()

    def _reap_containers(self) -> None:
        with self.lock:
            done = [(uid, c) for uid, c in self.containers.items() if c.proc.poll() is not None]
        for uid, c in done:
            time.sleep(0.05)  # let the log pump catch the last lines
            code = c.proc.returncode
            with self.lock:
                self.containers.pop(uid, None)
                self.previous_logs[uid] = c.log_path
                key = next((k for k, o in self.objects.items() if o["metadata"]["uid"] == uid), None)
                if key is None:
                    continue
                pod = copy.deepcopy(self.objects[key])
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                exit_code = code if code >= 0 else 128 - code
                reason = (
                    "Completed"
                    if code == 0
                    else ("OOMKilled" if code == -9 and os.environ.get("FAKE_K8S_OOM") else "Error")
                )
                restarts = pod["status"]["containerStatuses"][0].get("restartCount", 0)
                policy = pod["spec"].get("restartPolicy", "Always")
                if policy == "Always" or (policy == "OnFailure" and code != 0):
                    _set_ready(pod, False)
                    pod["status"]["containerStatuses"][0].update(
                        ready=False,
                        restartCount=restarts + 1,
                        state={"waiting": {"reason": "ContainerCreating"}},
                        lastState={"terminated": {"exitCode": exit_code, "reason": reason}},
                    )
                    stored = self._store("MODIFIED", pod)
                    self._start_container(stored)
                    continue
                pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
                _set_ready(pod, False)
                pod["status"]["containerStatuses"][0].update(
                    ready=False,
                    state={"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": now_rfc3339()}},
                )
                self._store("MODIFIED", pod)

    def _kill_container(self, uid: str, grace: float) -> None:
        with self.lock:
            c = self.containers.get(uid)
        if c is None:
            return
        # As a container runtime stops a container: SIGTERM to its first process alone (PID 1,
        # which passes it on as it sees fit), SIGKILL at the end of the grace period; when the
        # first process ends, whatever else ran in the container ends with it (the PID namespace).
        try:
            os.kill(c.proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            c.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(c.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        c.proc.wait()
        with self.lock:
            self.containers.pop(uid, None)
            self.previous_logs[uid] = c.log_path

    def _terminate_pod(self, key: tuple[str, str, str, str], pod: dict[str, Any]) -> None:
        grace = float(pod["metadata"].get("deletionGracePeriodSeconds", 30))
        self._kill_container(pod["metadata"]["uid"], grace=max(grace, 0.2))
        with self.lock:
            current = self.objects.get(key)
            if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
                return
            gone = copy.deepcopy(current)
            statuses = gone["status"].get("containerStatuses") or []
            if statuses and "running" in (statuses[0].get("state") or {}):
                statuses[0]["state"] = {"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": now_rfc3339()}}
            if gone["status"].get("phase") not in ("Succeeded", "Failed"):
                # A deleted pod that was not done is Failed before it goes (Kubernetes >= 1.26):
                # its Job counts it against backoffLimit unless a DisruptionTarget condition
                # (the Eviction API, a preemption) lets podFailurePolicy ignore it.
                gone["status"]["phase"] = "Failed"
                self._store("MODIFIED", gone)
                gone = copy.deepcopy(gone)
            if any(r.get("kind") == "Job" for r in gone["metadata"].get("ownerReferences", [])):
                self.finished_pods[gone["metadata"]["uid"]] = copy.deepcopy(gone)  # the Job's tracking finalizer
            self._store("DELETED", gone)
        self._collect_garbage(pod["metadata"]["uid"])

    # -- readiness, Services (kube-proxy), Deployments and ReplicaSets -------------------

    def _probe_readiness(self) -> None:
        """The kubelet's tcpSocket readiness probes: every periodSeconds; Ready after one
        success, not Ready after failureThreshold failures in a row (default 3)."""
        now = time.monotonic()
        with self.lock:
            due = []
            for key, pod in self.objects.items():
                uid = pod["metadata"]["uid"]
                if key[1] != "pods" or uid not in self.containers or pod["metadata"].get("deletionTimestamp"):
                    continue
                container = pod["spec"]["containers"][0]
                probe = container.get("readinessProbe") or {}
                if "tcpSocket" not in probe:
                    continue
                last, failures = self.probes.get(uid, (0.0, 0))
                if now - last < float(probe.get("periodSeconds", 10)):
                    continue
                port = probe["tcpSocket"]["port"]
                if isinstance(port, str):
                    port = next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == port), 0)
                due.append((key, uid, pod["status"].get("podIP"), int(port), failures, probe))
        for key, uid, ip, port, failures, probe in due:
            try:
                socket.create_connection((ip, port), timeout=float(probe.get("timeoutSeconds", 1))).close()
                ok = True
            except OSError:
                ok = False
            failures = 0 if ok else failures + 1
            with self.lock:
                self.probes[uid] = (now, failures)
                pod = self.objects.get(key)
                if pod is None or pod["metadata"]["uid"] != uid or uid not in self.containers:
                    continue
                statuses = pod["status"].get("containerStatuses") or [{}]
                ready = bool(statuses[0].get("ready"))
                if ok and not ready or not ok and ready and failures >= int(probe.get("failureThreshold", 3)):
                    new = copy.deepcopy(pod)
                    new["status"]["containerStatuses"][0]["ready"] = ok
                    _set_ready(new, ok)
                    self._store("MODIFIED", new)

    def _ready_pods(self, svc: dict[str, Any]) -> list[dict[str, Any]]:
        """The pods behind a Service: selected, with an address, Ready, not terminating."""
        sel = svc["spec"].get("selector") or {}
        ns = svc["metadata"]["namespace"]
        with self.lock:
            return [
                p
                for k, p in self.objects.items()
                if k[1] == "pods"
                and k[2] == ns
                and sel
                and p["status"].get("podIP")
                and all(p["metadata"].get("labels", {}).get(k2) == v for k2, v in sel.items())
                and not p["metadata"].get("deletionTimestamp")
                and any(
                    c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions", [])
                )
            ]

    def _endpoints(self, ns: str, name: str, port: int) -> list[tuple[str, int]]:
        with self.lock:
            svc = self.objects.get(("v1", "services", ns, name))
        if svc is None:
            return []
        spec_port = next((p for p in svc["spec"].get("ports", []) if int(p["port"]) == port), None)
        if spec_port is None:
            return []
        target = spec_port.get("targetPort", port)
        out = []
        for pod in self._ready_pods(svc):
            number = target
            if isinstance(target, str):
                number = next(
                    (
                        p["containerPort"]
                        for c in pod["spec"].get("containers", [])
                        for p in c.get("ports", [])
                        if p.get("name") == target
                    ),
                    None,
                )
            if number is not None:
                out.append((pod["status"]["podIP"], int(number)))
        return out

    def _run_services(self) -> None:
        """kube-proxy: a listener on each Service port's ClusterIP while it has Ready endpoints."""
        with self.lock:
            services = [copy.deepcopy(o) for k, o in self.objects.items() if k[1] == "services"]
        wanted = set()
        for svc in services:
            ip, ns, name = svc["spec"].get("clusterIP"), svc["metadata"]["namespace"], svc["metadata"]["name"]
            if not ip or ip == "None":
                continue
            for spec_port in svc["spec"].get("ports", []):
                key = (ns, name, int(spec_port["port"]))
                if not self._endpoints(*key):
                    continue
                wanted.add(key)
                if key not in self.proxies:
                    self.proxies[key] = ServiceProxy(ip, key[2], lambda key=key: self._endpoints(*key))
        for key in [k for k in self.proxies if k not in wanted]:
            self.proxies.pop(key).close()

    def _run_deployments(self) -> None:
        """The Deployment controller, for what our backend uses: one ReplicaSet per Deployment,
        named and labelled by its pod-template-hash, with the Deployment's replicas; its status
        from the ReplicaSet's. (Rollouts are not implemented: a changed template is refused.)"""
        with self.lock:
            deployments = [copy.deepcopy(o) for k, o in self.objects.items() if k[1] == "deployments"]
        for dep in deployments:
            meta, spec = dep["metadata"], dep["spec"]
            ns = meta["namespace"]
            template = spec["template"]
            digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
            rs_name = f"{meta['name']}-{digest}"
            with self.lock:
                current = self.objects.get(self._key(dep))
                if current is None or current["metadata"]["uid"] != meta["uid"]:
                    continue  # deleted meanwhile: nothing for it
                rs = self.objects.get(("apps/v1", "replicasets", ns, rs_name))
                if rs is None:
                    labels = {**(template.get("metadata") or {}).get("labels", {}), "pod-template-hash": digest}
                    self._create(
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
                    self._store("MODIFIED", updated)
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
                    self._store("MODIFIED", updated)

    def _run_replicasets(self) -> None:
        """The ReplicaSet controller: as many active pods (not terminating, not finished) as
        its replicas, a new one at once for one deleted or evicted (it does not wait for the
        old one to terminate); the extras deleted."""
        with self.lock:
            sets = [copy.deepcopy(o) for k, o in self.objects.items() if k[1] == "replicasets"]
        for rs in sets:
            meta = rs["metadata"]
            ns, uid = meta["namespace"], meta["uid"]
            with self.lock:
                current = self.objects.get(self._key(rs))
                if current is None or current["metadata"]["uid"] != uid:
                    continue
                owned = [
                    o
                    for k, o in self.objects.items()
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
                    code, answer = self._create(
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
                        self.record_event(current, "Warning", "FailedCreate", f"Error creating: {answer['message']}")
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
                    self._store("MODIFIED", updated)
            for pod in extras:
                self._delete(self._key(pod))

    def _run_jobs(self) -> None:
        with self.lock:
            jobs = [copy.deepcopy(o) for k, o in self.objects.items() if k[1] == "jobs"]
        for job in jobs:
            self._reconcile_job(job)

    def _reconcile_job(self, job: dict[str, Any]) -> None:
        spec, status = job["spec"], job.setdefault("status", {})
        done = [
            c for c in status.get("conditions", []) if c.get("status") == "True" and c["type"] in ("Complete", "Failed")
        ]
        if done:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and time.time() >= _parse(done[0]["lastTransitionTime"]) + int(ttl):
                self._delete(self._key(job), policy="Background")  # the TTL controller
            return
        ns, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
        with self.lock:
            pods = [
                copy.deepcopy(o)
                for k, o in self.objects.items()
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
                self._delete(self._key(pod), grace=5)
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
                    self._delete(self._key(pod), grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30)))
                    active.pop(idx)
            running = len(active)
            for idx in range(completions):
                if running >= parallelism:
                    break
                if idx in active or idx in succeeded:
                    continue
                with self.lock:
                    terminating = any(
                        o["metadata"].get("deletionTimestamp")
                        and o["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == str(idx)
                        for k, o in self.objects.items()
                        if k[1] == "pods"
                        and k[2] == ns
                        and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))
                    )
                if terminating:
                    continue  # podReplacementPolicy: TerminatingOrFailed -> Failed: wait for it to go
                if not self._create_job_pod(job, idx):
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
        with self.lock:
            current = self.objects.get(self._key(job))
            if current is None or current["metadata"]["uid"] != uid:
                return
            if current.get("status") != new_status:
                updated = copy.deepcopy(current)
                updated["status"] = new_status
                self._store("MODIFIED", updated)
        for pod in lingering:
            self._delete(self._key(pod), grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30)))

    def _suspend_pod(self, pod: dict[str, Any]) -> None:
        with self.lock:
            current = self.objects.get(self._key(pod))
            if current is None or current["metadata"].get("deletionTimestamp"):
                return
            marked = copy.deepcopy(current)
            marked["metadata"].setdefault("annotations", {})[SUSPENDED_BY_JOB] = "true"
            self._store("MODIFIED", marked)
        self._delete(self._key(pod), grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30)))

    @staticmethod
    def _success_policy_met(spec: dict[str, Any], succeeded: set[int]) -> bool:
        for rule in (spec.get("successPolicy") or {}).get("rules", []):
            count = rule.get("succeededCount")
            if count is not None and len(succeeded) >= int(count):
                return True
        return False

    def _create_job_pod(self, job: dict[str, Any], index: int) -> bool:
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
        refusal = self._quota_refusal(job["metadata"]["namespace"], pod)
        if refusal:
            self.record_event(job, "Warning", "FailedCreate", f"Error creating: {refusal}")
            self.create_backoff[uid] = time.monotonic() + 1.0
            return False
        code, answer = self._create("v1", "pods", job["metadata"]["namespace"], pod)
        if code != 201:
            self.record_event(job, "Warning", "FailedCreate", f"Error creating: {answer['message']}")
            self.create_backoff[uid] = time.monotonic() + 1.0
            return False
        return True


def _bare_python_image(image: str) -> bool:
    """Docker's official Python images (python:3.12-slim, docker.io/library/python:3.12)."""
    name = image.strip().removeprefix("docker.io/").removeprefix("library/")
    return name == "python" or name.startswith(("python:", "python@"))


def _set_ready(pod: dict[str, Any], ready: bool) -> None:
    """The pod's Ready condition (what Services and `kubectl get` read)."""
    conditions = [c for c in pod["status"].get("conditions", []) if c.get("type") != "Ready"]
    conditions.append({"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_rfc3339()})
    pod["status"]["conditions"] = conditions


def _parse(stamp: str) -> float:
    stamp = stamp.rstrip("Z")
    whole, _, frac = stamp.partition(".")
    try:
        base = dt.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        return 0.0
    return base + (float("0." + frac) if frac else 0.0)


__all__ = ["FakeCluster", "fnmatch"]

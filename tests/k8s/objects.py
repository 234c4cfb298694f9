"""The objects the API-server fixture stores, and what the API server does to them on their
way in: the kinds served (``RESOURCES``), Status errors, label and field selectors, the three
patch kinds (JSON, merge, strategic merge), validation where the real server refuses, and the
Table ``kubectl get`` asks for. Plain functions over plain dicts: no state."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import re
import time
from typing import Any

from . import kueue

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
    # Kueue's (kueue.py), served only by a cluster made with kueue=True.
    (kueue.GV, "workloads"): "Workload",
    (kueue.GV, "localqueues"): "LocalQueue",
}
GROUPS = {
    "v1": "",
    "batch/v1": "batch",
    "apps/v1": "apps",
    "kubeflow.org/v1": "kubeflow.org",
    kueue.GV: kueue.GROUP,
}


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp_nano(t: float) -> str:
    whole = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{int((t % 1) * 1e9):09d}Z"


def parse_rfc3339(stamp: str) -> float:
    stamp = stamp.rstrip("Z")
    whole, _, frac = stamp.partition(".")
    try:
        base = dt.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        return 0.0
    return base + (float("0." + frac) if frac else 0.0)


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
    seconds = max(0, int(time.time() - parse_rfc3339(created or now_rfc3339())))
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

"""The REST verbs on a resource once the request is let in (server.py): create, get, list (as
a Table for kubectl), watch (chunked JSON lines from the history; 410 for a resourceVersion
too old; BOOKMARKs), update and the three patch kinds, delete and deletecollection; server-side
dry-run; field validation as the API server does it (``Strict``, ``Warn``, ``Ignore``)."""

from __future__ import annotations

import copy
import json
import time
from typing import TYPE_CHECKING, Any

from . import openapi
from .objects import (
    RESOURCES,
    json_patch,
    match_fields,
    match_labels,
    merge_patch,
    status_error,
    strategic_merge_patch,
    table,
    validate,
)

if TYPE_CHECKING:
    from .pods import Disruptions, PodLogs, Quota
    from .server import Streams
    from .store import Store


class Rest:
    """The verbs, and what the watches did (for tests to read)."""

    def __init__(self, store: Store, streams: Streams, quota: Quota, disruptions: Disruptions, logs: PodLogs) -> None:
        self.store = store
        self.streams = streams
        self.quota = quota  # admission of pods
        self.disruptions = disruptions  # pods/eviction
        self.logs = logs  # pods/log
        self.expired_watches: list[str] = []  # plurals of watches answered 410 Gone
        self.bookmarks: list[int] = []  # resourceVersions sent in BOOKMARK events
        self.bookmark_interval_s = 1.0  # the real server sends one about every minute

    def serve(
        self,
        h: Any,
        method: str,
        q: dict[str, str],
        gv: str,
        plural: str,
        ns: str,
        name: str | None,
        sub: str | None,
        group: str,
        dry_run: bool,
        directive: str,
    ) -> None:
        if method in ("POST", "PUT") and sub is None and directive != "Ignore" and h.raw.strip():
            # Server-side field validation: the strict decoder's unknown and duplicate fields.
            body_kind = h._body().get("kind") if isinstance(h._body(), dict) else None
            kind = body_kind if isinstance(body_kind, str) and body_kind else RESOURCES[(gv, plural)]
            issues = openapi.create_issues(gv, RESOURCES[(gv, plural)], openapi.parse_pairs(h.raw))
            stored = self.store.get(plural, name, ns or "default", gv) if method == "PUT" and name else None
            if stored is not None:  # the fixture's own bookkeeping sent back (see _field_validation)
                issues = [i for i in issues if i not in openapi.unknown_fields(gv, RESOURCES[(gv, plural)], stored)]
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
        if method == "POST":
            return self._create(h, gv, plural, ns, name, sub, dry_run)
        if method == "GET":
            return self._read(h, q, gv, plural, ns, name, sub, group)
        if method in ("PATCH", "PUT"):
            return self._update(h, method, gv, plural, ns, name, sub, dry_run, directive)
        if method == "DELETE":
            return self._delete(h, q, gv, plural, ns, name, group, dry_run)
        return h._json(405, status_error(405, "MethodNotAllowed", "method not allowed"))

    def _create(self, h: Any, gv: str, plural: str, ns: str, name: str | None, sub: str | None, dry_run: bool) -> None:
        if sub == "eviction":
            return self.disruptions.evict(h, ns, name, h._body(), dry_run)
        if sub is not None:
            return h._json(405, status_error(405, "MethodNotAllowed", f"create is not supported on {plural}/{sub}"))
        if plural == "pods":
            refusal = self.quota.refusal(ns, h._body())
            if refusal:
                return h._json(403, status_error(403, "Forbidden", refusal))
        body = openapi.prune(gv, RESOURCES[(gv, plural)], h._body())  # unknown fields never stored
        code, body = self.store.create(gv, plural, ns, body, dry_run=dry_run)
        return h._json(code, body)

    def _read(
        self, h: Any, q: dict[str, str], gv: str, plural: str, ns: str, name: str | None, sub: str | None, group: str
    ) -> None:
        if sub == "log":
            return self.logs.serve(h, ns, name, q)
        wants_table = "as=Table" in (h.headers.get("Accept") or "")
        if name:
            obj = self.store.get(plural, name, ns, gv)
            if obj is None:
                return h._json(
                    404, status_error(404, "NotFound", f'{plural}{"." + group if group else ""} "{name}" not found')
                )
            if wants_table:
                return h._json(200, table(gv, plural, [obj], obj["metadata"]["resourceVersion"]))
            return h._json(200, obj)
        if q.get("watch") in ("true", "1"):
            return self.watch(h, gv, plural, ns, q)
        with self.store.lock:
            items = [
                copy.deepcopy(o)
                for (g, pl, n, _), o in self.store.objects.items()
                if g == gv
                and pl == plural
                and n == ns
                and match_labels(o["metadata"].get("labels", {}), q.get("labelSelector"))
                and match_fields(o, q.get("fieldSelector"))
            ]
            rv = str(self.store.rv)
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

    def _update(
        self,
        h: Any,
        method: str,
        gv: str,
        plural: str,
        ns: str,
        name: str | None,
        sub: str | None,
        dry_run: bool,
        directive: str,
    ) -> None:
        patch = h._body()
        content_type = (h.headers.get("Content-Type") or "").split(";")[0]
        with self.store.lock:
            obj = self.store.objects.get((gv, plural, ns, name))
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
                refused = self._field_validation(h, gv, plural, content_type, patch, new, obj, directive)
                if refused:
                    return h._json(*refused)
            if sub is None:
                # Unknown fields are never stored; the status is kept as it was patched
                # (the Job controller's own bookkeeping lives there, see jobs.py).
                pruned = openapi.prune(gv, RESOURCES[(gv, plural)], new)
                if "status" in new:
                    pruned["status"] = new["status"]
                new = pruned
            refused = validate(gv, plural, new, old=obj)
            if refused:
                return h._json(*refused)
            if dry_run:
                return h._json(200, new)
            return h._json(200, self.store.put("MODIFIED", new))

    def _delete(
        self, h: Any, q: dict[str, str], gv: str, plural: str, ns: str, name: str | None, group: str, dry_run: bool
    ) -> None:
        if name:
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
                obj = self.store.get(plural, name, ns, gv)
                if obj is None:
                    return h._json(404, status_error(404, "NotFound", f'{plural} "{name}" not found'))
                return h._json(200, obj)
            obj = self.store.delete(
                (gv, plural, ns, name), grace=float(grace) if grace is not None else None, policy=policy
            )
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
        if dry_run:
            return h._json(
                200, {"apiVersion": gv, "kind": RESOURCES[(gv, plural)] + "List", "metadata": {}, "items": []}
            )
        with self.store.lock:
            keys = [
                k
                for k, o in self.store.objects.items()
                if k[0] == gv
                and k[1] == plural
                and k[2] == ns
                and match_labels(o["metadata"].get("labels", {}), q.get("labelSelector"))
            ]
        for key in keys:
            self.store.delete(key)
        return h._json(200, {"apiVersion": gv, "kind": RESOURCES[(gv, plural)] + "List", "metadata": {}, "items": []})

    def _field_validation(
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
        pairs = openapi.parse_pairs(h.raw)
        if content_type == "application/json-patch+json" or isinstance(patch, list):
            issues = openapi.json_patch_issues(gv, kind, pairs, new)
        else:
            issues = openapi.patch_issues(gv, kind, pairs, new)
        # Fields the fixture itself keeps in a stored object (the Job controller's counters
        # in its status) are no client's doing: a real server's stored objects have none.
        issues = [i for i in issues if i not in openapi.unknown_fields(gv, kind, old)]
        if not issues:
            return None
        if directive == "Warn":
            h.warnings.extend(issues)
            return None
        if content_type == "application/strategic-merge-patch+json":
            value = openapi.go_value(patch)
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

    def watch(self, h: Any, gv: str, plural: str, ns: str, q: dict[str, str]) -> None:
        selector = q.get("labelSelector")
        fields = q.get("fieldSelector")
        timeout = float(q.get("timeoutSeconds", 300))
        since = q.get("resourceVersion")
        with self.store.lock:
            oldest = self.store.history[0][0] if self.store.history else self.store.rv
            if since and since not in ("0", "") and int(since) < oldest - 1:
                self.expired_watches.append(plural)
                gone = status_error(410, "Expired", f"too old resource version: {since} ({oldest})")
                self.streams.start(h, "application/json")
                self.streams.chunk(h, json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                return self.streams.end(h)
            if since in (None, "", "0"):
                initial = [
                    ("ADDED", copy.deepcopy(o))
                    for k, o in self.store.objects.items()
                    if k[0] == gv and k[1] == plural and k[2] == ns
                ]
                cursor = self.store.rv
            else:
                initial = []
                cursor = int(since)
        self.streams.start(h, "application/json")
        deadline = time.monotonic() + timeout
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        last_bookmark = time.monotonic()
        try:
            for kind, obj in initial:
                if match_labels(obj["metadata"].get("labels", {}), selector) and match_fields(obj, fields):
                    self.streams.chunk(h, json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            while time.monotonic() < deadline and not self.store.closed:
                with self.store.lock:
                    pending = [
                        (rv, kind, obj)
                        for rv, kind, key, obj in self.store.history
                        if rv > cursor and key[0] == gv and key[1] == plural and key[2] == ns
                    ]
                    if not pending:
                        if bookmarks and time.monotonic() - last_bookmark >= self.bookmark_interval_s:
                            # Nothing of this kind is unsent up to the latest resourceVersion:
                            # a BOOKMARK carries it, so a quiet watch can resume after compaction.
                            cursor, last_bookmark = self.store.rv, time.monotonic()
                            mark = {
                                "kind": RESOURCES[(gv, plural)],
                                "apiVersion": gv,
                                "metadata": {"resourceVersion": str(cursor)},
                            }
                            self.bookmarks.append(cursor)
                            pending = [(cursor, "BOOKMARK", mark)]
                        else:
                            self.store.changed.wait(0.5)
                            continue
                for rv, kind, obj in pending:
                    cursor = rv
                    if kind == "BOOKMARK" or (
                        match_labels(obj["metadata"].get("labels", {}), selector) and match_fields(obj, fields)
                    ):
                        self.streams.chunk(h, json.dumps({"type": kind, "object": obj}).encode() + b"\n")
        except OSError:
            return
        self.streams.end(h)

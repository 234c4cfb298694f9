"""OpenAPI documents and server-side field validation for the API-server fixture (#17).

Nothing here is written by hand: the built-in kinds' schemas are the Kubernetes 1.31 OpenAPI
definitions as the ``kubernetes-validate`` package ships them (converted back from its JSON
Schema form: ``["string", "null"]`` types become ``"string"``, ``#/$defs/`` references become
``#/components/schemas/``, the ``enum`` it adds to ``apiVersion``/``kind`` is dropped), and
the PyTorchJob's is the Kubeflow CRD in tests/data. From them:

- ``/openapi/v3`` and one document per group-version, the way kubectl reads them: it looks
  for the PATCH operation carrying the kind's ``x-kubernetes-group-version-kind`` and a
  ``fieldValidation`` query parameter; finding it, ``kubectl apply`` skips client-side
  validation and sends ``fieldValidation=Strict`` (its default, ``--validate=strict``).
- ``field_issues``: what the API server's strict decoder reports for a body
  (``unknown field "spec.x"``, ``duplicate field "metadata.name"``), in the order it
  reports them: for a built-in kind's create/update in document order (a field both unknown
  and duplicated is reported as unknown only); for a custom resource the duplicates first,
  then the unknown fields sorted (pruning); for patches the patch's duplicates, then the
  patched object's unknown fields sorted.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

KUBE_VERSION = "1.31.0"
CRD_FILE = Path(__file__).parent.parent / "data" / "kubeflow.org_pytorchjobs.v1.9.0.yaml"
REF = "#/components/schemas/"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
PYTORCHJOB = "org.kubeflow.v1.PyTorchJob"


class Pairs(list):
    """A JSON object as decoded with its keys in order and duplicates kept."""


def parse_pairs(raw: bytes | str) -> Any:
    return json.loads(raw, object_pairs_hook=Pairs)


def _from_json_schema(node: Any) -> Any:
    """Undo kubernetes-validate's JSON Schema conversion, back to the OpenAPI form."""
    if isinstance(node, list):
        return [_from_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = REF + value.rsplit("/", 1)[1]
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            out[key] = types[0] if len(types) == 1 else types
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _from_json_schema(schema) for name, schema in value.items()}
            if "x-kubernetes-group-version-kind" in node:
                for field in ("apiVersion", "kind"):
                    if isinstance(out[key].get(field), dict):
                        out[key][field].pop("enum", None)
        else:
            out[key] = _from_json_schema(value)
    return out


@functools.cache
def schemas() -> dict[str, dict[str, Any]]:
    """Every definition by name: the built-in ones, and the PyTorchJob from its CRD."""
    import importlib.util

    import yaml

    # Found, not imported: importing kubernetes_validate (jsonschema) costs a second.
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("kubernetes-validate is not installed: pip install -e .[test]")
    path = (
        Path(spec.submodule_search_locations[0])
        / "kubernetes-json-schema"
        / f"v{KUBE_VERSION}-local"
        / "_definitions.json"
    )
    defs = {name: _from_json_schema(s) for name, s in json.loads(path.read_text())["$defs"].items()}
    crd = yaml.load(CRD_FILE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = crd["spec"]["versions"][0]
    job = dict(version["schema"]["openAPIV3Schema"])
    # As the API server publishes a CRD: its root metadata is the real ObjectMeta.
    job["properties"] = dict(job["properties"], metadata={"$ref": REF + OBJECT_META})
    job["x-kubernetes-group-version-kind"] = [
        {"group": crd["spec"]["group"], "version": version["name"], "kind": crd["spec"]["names"]["kind"]}
    ]
    defs[PYTORCHJOB] = job
    return defs


@functools.cache
def _by_kind() -> dict[tuple[str, str], str]:
    """(group/version, kind) -> definition name."""
    out = {}
    for name, schema in schemas().items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            gv = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            out[(gv, gvk["kind"])] = name
    return out


def definition(gv: str, kind: str) -> str | None:
    return _by_kind().get((gv, kind))


def _closure(names: list[str]) -> dict[str, dict[str, Any]]:
    defs, seen, todo = schemas(), {}, list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = defs[name]

        def refs(node: Any) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    if k == "$ref" and isinstance(v, str):
                        todo.append(v.removeprefix(REF))
                    else:
                        refs(v)
            elif isinstance(node, list):
                for v in node:
                    refs(v)

        refs(seen[name])
    return dict(sorted(seen.items()))


def _param(name: str, description: str, type_: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "schema": {"type": type_, "uniqueItems": True}}


_DRY_RUN = _param("dryRun", "When present, indicates that modifications should not be persisted.")
_FIELD_MANAGER = _param(
    "fieldManager", "fieldManager is a name associated with the actor or entity making these changes."
)
_FIELD_VALIDATION = _param(
    "fieldValidation",
    "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing "
    "unknown or duplicate fields. Valid values are: - Ignore - Warn - Strict",
)


def gv_document(gv: str, resources: dict[str, str], namespaced: bool = True) -> dict[str, Any]:
    """The OpenAPI v3 document of one group-version: its resources' paths and their schemas.
    `resources` maps plural -> kind."""
    prefix = "/api/v1" if gv == "v1" else f"/apis/{gv}"
    group, _, version = gv.rpartition("/")
    paths: dict[str, Any] = {}
    names = [OBJECT_META, "io.k8s.apimachinery.pkg.apis.meta.v1.Status", "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"]
    for plural, kind in sorted(resources.items()):
        name = definition(gv, kind)
        if name is None:
            continue
        names.append(name)
        gvk = {"group": group, "version": version, "kind": kind}
        body = {"$ref": REF + name}

        def op(action: str, params: list[dict[str, Any]], request: Any = None, *, kind=kind, gvk=gvk, body=body):
            o: dict[str, Any] = {
                "operationId": f"{action}{kind}",
                "parameters": params,
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": body}}}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
            }
            if request is not None:
                o["requestBody"] = {"content": request, "required": True}
            return o

        write = [_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION]
        patch_types = {
            t: {"schema": {"$ref": REF + "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"}}
            for t in (
                "application/apply-patch+yaml",
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            )
        }
        base = f"{prefix}/namespaces/{{namespace}}/{plural}" if namespaced else f"{prefix}/{plural}"
        paths[base] = {
            "get": op("list", []),
            "post": op("post", write, {"application/json": {"schema": body}}),
            "delete": op("deletecollection", [_DRY_RUN]),
        }
        paths[base + "/{name}"] = {
            "get": op("get", []),
            "put": op("put", write, {"application/json": {"schema": body}}),
            "patch": op(
                "patch", [*write, _param("force", "Force is going to force Apply requests.", "boolean")], patch_types
            ),
            "delete": op("delete", [_DRY_RUN]),
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": f"v{KUBE_VERSION}"},
        "paths": paths,
        "components": {"schemas": _closure(names)},
    }


def root(documents: dict[str, bytes]) -> dict[str, Any]:
    """/openapi/v3: where each group-version's document is (by content hash, as the real one)."""
    return {
        "paths": {
            ("api/v1" if gv == "v1" else f"apis/{gv}"): {
                "serverRelativeURL": ("/openapi/v3/api/v1" if gv == "v1" else f"/openapi/v3/apis/{gv}")
                + "?hash="
                + hashlib.sha512(doc).hexdigest()[:128].upper()
            }
            for gv, doc in sorted(documents.items())
        }
    }


# -- server-side field validation ------------------------------------------------------


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = schemas()[schema["$ref"].removeprefix(REF)]
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _resolve(schema["allOf"][0])
    return schema


def _is_object(schema: dict[str, Any]) -> bool:
    t = schema.get("type")
    return t == "object" or "properties" in schema or "additionalProperties" in schema


def _child(schema: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The schema of field `key`, {} when anything goes there, None when it is unknown."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return {}
    props = schema.get("properties")
    if props is not None and key in props:
        return props[key]
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return extra
    if extra is True or (props is None and extra is None):
        return {}  # a free-form object (RawExtension, FieldsV1, Patch, an untyped map)
    return None


def _walk(value: Any, schema: dict[str, Any], path: str, issues: list[str], typed: bool) -> None:
    schema = _resolve(schema)
    if isinstance(value, Pairs):
        if not _is_object(schema) and schema:
            return
        seen: dict[str, bool] = {}
        for key, item in value:
            where = f"{path}.{key}" if path else key
            sub = _child(schema, key) if schema else {}
            if key in seen:
                if seen[key] or not typed:
                    issues.append(f'duplicate field "{where}"')
            elif sub is None:
                if typed:
                    issues.append(f'unknown field "{where}"')
            seen[key] = sub is not None
            if sub is not None:
                _walk(item, sub, where, issues, typed)
    elif isinstance(value, list):
        items = schema.get("items") if schema else {}  # {}: anything goes, duplicates still count
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _walk(item, items, f"{path}[{i}]", issues, typed)


def _unknown(value: Any, schema: dict[str, Any], path: str, out: list[str]) -> None:
    schema = _resolve(schema)
    if isinstance(value, dict):
        if not _is_object(schema):
            return
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            sub = _child(schema, key)
            if sub is None:
                out.append(f'unknown field "{where}"')
            elif sub:
                _unknown(item, sub, where, out)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _unknown(item, schema["items"], f"{path}[{i}]", out)


def _plain(value: Any) -> Any:
    if isinstance(value, Pairs):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def unknown_fields(gv: str, kind: str, obj: dict[str, Any]) -> set[str]:
    name = definition(gv, kind)
    out: list[str] = []
    if name is not None:
        _unknown(obj, {"$ref": REF + name}, "", out)
    return set(out)


def create_issues(gv: str, kind: str, body: Any) -> list[str]:
    """What a strict decode of a create/update body reports, in the server's order."""
    name = definition(gv, kind)
    if name is None:
        return []
    issues: list[str] = []
    if name != PYTORCHJOB:
        _walk(body, {"$ref": REF + name}, "", issues, typed=True)
        return issues
    # A custom resource: the JSON decoder's duplicates, then what pruning drops, sorted.
    _walk(body, {}, "", issues, typed=False)
    unknown: list[str] = []
    _unknown(_plain(body), {"$ref": REF + name}, "", unknown)
    return issues + sorted(unknown)


def patch_issues(gv: str, kind: str, patch: Any, patched: dict[str, Any]) -> list[str]:
    """A merge or strategic-merge patch: the patch's duplicates, then the result's unknown fields."""
    name = definition(gv, kind)
    if name is None:
        return []
    issues: list[str] = []
    _walk(patch, {}, "", issues, typed=False)
    unknown: list[str] = []
    _unknown(patched, {"$ref": REF + name}, "", unknown)
    return issues + sorted(unknown)


def json_patch_issues(gv: str, kind: str, ops: Any, patched: dict[str, Any]) -> list[str]:
    """A JSON patch: unknown or repeated keys of its operations, then the result's unknown fields."""
    name = definition(gv, kind)
    if name is None:
        return []
    issues = []
    for i, op in enumerate(ops if isinstance(ops, list) else []):
        seen = set()
        for key, _ in op if isinstance(op, Pairs) else []:
            if key in seen:
                issues.append(f'json patch duplicate field "[{i}].{key}"')
            elif key not in ("op", "path", "from", "value"):
                issues.append(f'json patch unknown field "[{i}].{key}"')
            seen.add(key)
    unknown: list[str] = []
    _unknown(patched, {"$ref": REF + name}, "", unknown)
    return issues + sorted(unknown)


def go_value(value: Any) -> str:
    """Go's `%+v` of a decoded JSON value (the API server prints a patch map this way)."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_value(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_value(v) for v in value) + "]"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def prune(gv: str, kind: str, obj: Any) -> Any:
    """The object as the server keeps it: what the schema does not know is dropped (a built-in
    kind's decoder ignores it; a custom resource's is pruned), whatever fieldValidation said."""
    name = definition(gv, kind)
    if name is None or not isinstance(obj, dict):
        return obj
    return _pruned(obj, {"$ref": REF + name})


def _pruned(value: Any, schema: dict[str, Any]) -> Any:
    schema = _resolve(schema)
    if isinstance(value, dict) and _is_object(schema):
        out = {}
        for key, item in value.items():
            sub = _child(schema, key)
            if sub is not None:
                out[key] = _pruned(item, sub) if sub else item
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_pruned(item, schema["items"]) for item in value]
    return value

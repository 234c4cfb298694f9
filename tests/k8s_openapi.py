"""OpenAPI documents and server-side field validation for the API-server fixture, by its old
name: it is ``tests/k8s/openapi.py``."""

from __future__ import annotations

from k8s.openapi import (
    CRD_FILE,
    KUBE_VERSION,
    OBJECT_META,
    PYTORCHJOB,
    REF,
    Pairs,
    create_issues,
    definition,
    go_value,
    gv_document,
    json_patch_issues,
    parse_pairs,
    patch_issues,
    prune,
    root,
    schemas,
    unknown_fields,
)

__all__ = [
    "CRD_FILE",
    "KUBE_VERSION",
    "OBJECT_META",
    "PYTORCHJOB",
    "REF",
    "Pairs",
    "create_issues",
    "definition",
    "go_value",
    "gv_document",
    "json_patch_issues",
    "parse_pairs",
    "patch_issues",
    "prune",
    "root",
    "schemas",
    "unknown_fields",
]

"""The loopback Kubernetes API server for tests, by its old name: the fixture is the package
``tests/k8s/`` (its docstring says what it models and where each part lives); this module
keeps ``from k8s_apiserver import FakeCluster`` working."""

from __future__ import annotations

from k8s import (
    CONTAINER_CHECKPOINTS,
    GROUPS,
    RESOURCES,
    SUSPENDED_BY_JOB,
    Container,
    ContainerConfigError,
    ServiceProxy,
    json_patch,
    match_fields,
    match_labels,
    merge_patch,
    now_rfc3339,
    pod_failure_action,
    stamp_nano,
    status_error,
    strategic_merge_patch,
    table,
    validate,
)
from k8s.cluster import FakeCluster

__all__ = [
    "CONTAINER_CHECKPOINTS",
    "GROUPS",
    "RESOURCES",
    "SUSPENDED_BY_JOB",
    "Container",
    "ContainerConfigError",
    "FakeCluster",
    "ServiceProxy",
    "json_patch",
    "match_fields",
    "match_labels",
    "merge_patch",
    "now_rfc3339",
    "pod_failure_action",
    "stamp_nano",
    "status_error",
    "strategic_merge_patch",
    "table",
    "validate",
]

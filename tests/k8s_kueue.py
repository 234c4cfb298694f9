"""Kueue as the API-server fixture models it, by its old name: it is ``tests/k8s/kueue.py``."""

from __future__ import annotations

from k8s.kueue import (
    ELASTIC,
    FLAVOR,
    GPU,
    GROUP,
    GV,
    JOB_UID_LABEL,
    QUEUE_LABEL,
    SLICE_REPLACES,
    Kueue,
    condition,
    is_true,
    now,
    set_condition,
)

__all__ = [
    "ELASTIC",
    "FLAVOR",
    "GPU",
    "GROUP",
    "GV",
    "JOB_UID_LABEL",
    "QUEUE_LABEL",
    "SLICE_REPLACES",
    "Kueue",
    "condition",
    "is_true",
    "now",
    "set_condition",
]

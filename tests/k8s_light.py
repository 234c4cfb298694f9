"""A job of many light worker pods on the fixture cluster, by its old name: it is
``tests/k8s/light.py``."""

from __future__ import annotations

from k8s.light import WORKER, create, light_job

__all__ = ["WORKER", "create", "light_job"]

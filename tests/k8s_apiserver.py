"""The loopback Kubernetes API server for tests, by its old name: the fixture is the package
``tests/k8s/`` (its docstring says what it models and where each part lives); this module
keeps ``from k8s_apiserver import FakeCluster`` working."""

from __future__ import annotations

from k8s import *  # noqa: F403  # the package's public names, as they were here
from k8s import __all__  # noqa: F401

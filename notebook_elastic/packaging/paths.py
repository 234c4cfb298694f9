"""Where modules come from: the import path of a fresh interpreter like the workers', and
the path entry a module was found under (is it the notebook's own, or installed?)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Iterable

_FRESH_PATH_CACHE: dict[tuple[str, str, tuple[str, ...]], frozenset[str]] = {}


def fresh_sys_path(extra: Iterable[str] = ()) -> frozenset[str]:
    """sys.path of a fresh interpreter like the workers' (this Python, this environment)."""
    key = (sys.executable, os.environ.get("PYTHONPATH", ""), tuple(extra))
    if key not in _FRESH_PATH_CACHE:
        out = subprocess.run(
            [sys.executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=60,
        )
        paths = json.loads(out.stdout) if out.returncode == 0 else list(sys.path)
        _FRESH_PATH_CACHE[key] = frozenset(os.path.realpath(p) for p in [*paths, *extra] if p)
    return _FRESH_PATH_CACHE[key]


def module_location(module: types.ModuleType) -> list[str]:
    """The sys.path entries a module was found under ([] for built-in modules)."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
    is_package = hasattr(module, "__path__")
    if origin in (None, "built-in", "frozen", "namespace"):
        if is_package:
            return [os.path.dirname(os.path.realpath(p)) for p in module.__path__]
        return []
    path = os.path.realpath(origin)
    parent = os.path.dirname(path)
    return [os.path.dirname(parent) if is_package else parent]

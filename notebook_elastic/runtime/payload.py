"""Loading the data values a packaged script carries beside it.

The payload is one pickle of ``{name: bytes}``, each value pickled on its own (by
cloudpickle on the notebook side), so a script can unpickle plain data before its
definitions and values that refer to notebook classes after them. Values that share
objects (a model and an optimizer over its parameters) are pickled together under one
``shared:...`` key, and each of their names maps to ``("shared", KEY)``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

from ..contract import protocol

PAYLOAD_SUFFIX = ".payload.pkl"


def payload_path_for(script: str | os.PathLike[str]) -> Path:
    script = Path(script)
    return script.with_name(script.stem + PAYLOAD_SUFFIX)


class Payload:
    """Read-only mapping of the shipped values; each is unpickled when first asked for."""

    def __init__(self, path: Path, raw: dict[str, bytes]) -> None:
        self.path = path
        self._raw = raw
        self._values: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._values:
            raw = self._raw[name]
            if isinstance(raw, tuple) and raw[0] == "shared":
                # Values that share objects (a model and its optimizer) were pickled together.
                self._values.update(pickle.loads(self._raw[raw[1]]))
            else:
                self._values[name] = pickle.loads(raw)
        return self._values[name]

    def __contains__(self, name: str) -> bool:
        return name in self._raw

    def __len__(self) -> int:
        return sum(1 for name in self._raw if not name.startswith("shared:"))


def load_payload(script: str | os.PathLike[str], sha256: str | None = None) -> Payload:
    """The payload of ``script`` (``NAME.payload.pkl`` beside it, or $NOTEBOOK_ELASTIC_PAYLOAD)."""
    path = Path(os.environ.get(protocol.ENV_PAYLOAD) or payload_path_for(script))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"payload file {path} is missing: this script was packaged with data values from the "
            f"notebook; keep {path.name} beside the script (or set {protocol.ENV_PAYLOAD})"
        ) from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(
            f"payload file {path} does not belong to this script (checksum differs): export the "
            "script and its payload again, together"
        )
    return Payload(path, pickle.loads(data))


def secret(name: str) -> str:
    """A credential the packager withheld: read from this worker's environment."""
    try:
        return os.environ[name]
    except KeyError:
        raise RuntimeError(
            f"{name} looks like a credential and was not shipped with the script; give it to the "
            f"workers as an environment variable (--env {name}=... or a Kubernetes secret), or ship "
            f"it explicitly with --ship {name}"
        ) from None


def main_attr(name: str) -> Any:
    """Unpickling helper: a class or function the script itself defines at its top level."""
    import sys

    return getattr(sys.modules["__main__"], name)

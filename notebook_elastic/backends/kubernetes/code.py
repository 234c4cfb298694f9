"""The job's code and secrets as objects: the ``<job>-code`` ConfigMap (the script, its
payload, the worker runtime and the notebook's own modules and files, zipped reproducibly;
refused over the 1 MiB a ConfigMap holds) and the ``<job>-env`` Secret, built with
placeholders so that dry-runs never hold a value."""

from __future__ import annotations

import base64
import io
import json
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import defaults
from ...errors import SpecError
from .naming import (
    ANNOTATION_EPOCH,
    ANNOTATION_NOTEBOOK,
    ANNOTATION_RUN,
    ANNOTATION_SPEC,
    FILES_ZIP,
    MAX_CONFIGMAP_BYTES,
    MODULES_ZIP,
    PAYLOAD,
    RUNTIME_ZIP,
    SCRIPT,
    code_name,
    env_name,
    labels,
)
from .options import DEFAULT_IMAGE, KubernetesOptions

if TYPE_CHECKING:
    from ...contract.spec import JobSpec
    from ...packaging import Bundle

SECRET_PLACEHOLDER = defaults.HIDDEN_VALUE


def env_secret(spec: JobSpec) -> dict[str, Any] | None:
    """The Secret holding the ``--env`` values (placeholders here), or None without any."""
    if not spec.env:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": env_name(spec.name), "labels": labels(spec.name, "env")},
        "type": "Opaque",
        "stringData": {key: SECRET_PLACEHOLDER for key in sorted(spec.env)},
    }


def with_env_values(secret: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The Secret to create: its placeholders replaced by the values (kept in memory only)."""
    out: dict[str, Any] = json.loads(json.dumps(secret))
    out["stringData"] = {key: env[key] for key in out["stringData"]}
    return out


#: The packages a pod runs (tests/test_layers.py keeps them free of kernel-side imports).
POD_PACKAGES = ("runtime", "plumbing", "agent", "store", "pool")
#: The modules of ours beside them a pod runs: the package's light __init__, and the shared
#: vocabulary they speak, the events and the cross-process names (with its package's __init__,
#: which imports nothing).
POD_MODULES = (
    "__init__.py",
    "_version.py",
    "contract/__init__.py",
    "contract/event_types.py",
    "contract/protocol.py",
)


@lru_cache(maxsize=1)
def runtime_zip() -> bytes:
    """What runs in a pod: notebook_elastic's runtime (the workers' side), plumbing, agent,
    store and pool packages (+ the package's light __init__ and the shared vocabulary) and
    cloudpickle, zipped with fixed timestamps so the same code gives the same bytes."""
    import cloudpickle

    package = Path(__file__).resolve().parents[2]
    files: list[tuple[str, Path]] = [(f"notebook_elastic/{n}", package / n) for n in POD_MODULES]
    for part in POD_PACKAGES:
        files += [(f"notebook_elastic/{part}/{p.name}", p) for p in sorted((package / part).glob("*.py"))]
    cp = Path(cloudpickle.__file__).parent
    files += [(f"cloudpickle/{p.name}", p) for p in sorted(cp.glob("*.py"))]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, path in files:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    return buf.getvalue()


def pod_workdir(image: str | None) -> str:
    """Where relative paths land in a worker pod: the image's own working directory (we keep it,
    so images that run code from their WORKDIR keep working), inside the container's
    filesystem, which is gone when the pod is."""
    if not image or image == DEFAULT_IMAGE:
        return f"/workspace, the working directory of the default image {DEFAULT_IMAGE}"
    return f"the working directory (WORKDIR) of the image {image}"


def modules_zip(files: dict[str, bytes]) -> bytes:
    """The notebook's own files, zipped with fixed timestamps (modules import from the zip)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname in sorted(files):
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[arcname])
    return buf.getvalue()


def code_configmap(
    spec: JobSpec, bundle: Bundle, options: KubernetesOptions, *, run_id: str, epoch: int = 0
) -> dict[str, Any]:
    binary = {RUNTIME_ZIP: runtime_zip()}
    if bundle.payload:
        binary[PAYLOAD] = bundle.payload
    if getattr(bundle, "modules", None):
        binary[MODULES_ZIP] = modules_zip(bundle.modules)
    if getattr(bundle, "workdir_files", None):
        binary[FILES_ZIP] = modules_zip(bundle.workdir_files)
    size = len(bundle.script.encode()) + sum(len(v) for v in binary.values())
    if size > MAX_CONFIGMAP_BYTES:
        biggest = sorted((i for i in bundle.manifest.items if i.size), key=lambda i: -i.size)[:2]
        named = ", ".join(f"`{i.name}` ({i.size / 1e6:.1f} MB)" for i in biggest)
        raise SpecError(
            f"the packaged cell is {size / 1e6:.1f} MB, over the 1 MiB a ConfigMap may hold ({named}); load "
            "large data inside the cell from a PersistentVolumeClaim (--pvc) or bake it into the image (--image)"
        )
    spec_json = spec.to_json()
    spec_json.pop("backend_options", None)
    annotations = {
        ANNOTATION_SPEC: json.dumps(spec_json, separators=(",", ":")),
        ANNOTATION_EPOCH: str(epoch),
        ANNOTATION_RUN: run_id,
    }
    if spec.notebook:
        annotations[ANNOTATION_NOTEBOOK] = str(spec.notebook)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": code_name(spec.name), "labels": labels(spec.name, "code"), "annotations": annotations},
        "data": {SCRIPT: bundle.script},
        "binaryData": {k: base64.b64encode(v).decode() for k, v in binary.items()},
    }

"""``notebook-elastic debug JOB``: one file to attach to a bug report.

A gzipped tar, private to its owner (0600), of what a maintainer needs to see what happened:
the job's events, its status and outcome, the supervisor's and guardian's records and log, the
agents' logs (their last ``LOG_TAIL_BYTES`` each), what was shipped (the manifest: names and
sizes), the generated script (the cell's code: say so before sharing it), the spec and the launch
plan (each node's agent command, rendezvous and environment), and the versions of Python, torch,
CUDA, NCCL and the Jupyter stack. Never in it: the ``--env`` values (``secret.json``; each value
is also replaced wherever a log printed it), the payload (the notebook's values the cell used) or
the checkpoints; credentials in URLs are stripped (``runtime.tracking.scrub``).
"""

from __future__ import annotations

import io
import json
import os
import platform
import sys
import tarfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from ...contract.plan import launch_plan, rdzv_id
from ...jobfolder.folder import JobFolder
from ...jobfolder.place import local_place
from ...runtime.tracking import scrub

LOG_TAIL_BYTES = 2 * 1024 * 1024  # of each log: the end is where the failure is
PACKAGES = ("notebook-elastic", "torch", "ipykernel", "ipywidgets", "jupyterlab", "jupyter_server", "kubernetes")


def versions() -> dict[str, Any]:
    """Python, the OS, this package and its neighbours, and torch's CUDA and NCCL."""
    found: dict[str, Any] = {"python": sys.version, "platform": platform.platform()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    try:
        import torch

        found["torch_cuda"] = torch.version.cuda
        found["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            nccl_version: Callable[[], tuple[Any, ...]] = torch.cuda.nccl.version  # torch leaves it unannotated
            found["nccl"] = ".".join(map(str, nccl_version()))
            found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as exc:  # a broken torch is worth reporting too
        found["torch_error"] = f"{type(exc).__name__}: {exc}"
    return found


def _plan_text(folder: JobFolder) -> str:
    from ...contract.spec import JobSpec

    try:
        spec = JobSpec.from_json(folder.spec())
        place = local_place(spec, folder, gpus=[])
        return launch_plan(spec, place, rdzv_id=rdzv_id(spec.name, "<run>", 0)).text() + "\n"
    except Exception as exc:
        return f"(the plan could not be rebuilt: {type(exc).__name__}: {exc})\n"


def _tail(path: Path, limit: int = LOG_TAIL_BYTES) -> bytes:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        data = f.read()
    if size > limit:
        data = f"[... the first {size - limit} bytes left out ...]\n".encode() + data
    return data


def _hide(data: bytes, secrets: dict[str, str]) -> bytes:
    text = data.decode("utf-8", "replace")
    for key, value in secrets.items():
        if len(value) >= 4:  # shorter values are words, not secrets worth hunting
            text = text.replace(value, f"<--env {key} hidden>")
    return scrub(text).encode()


def write(folder: JobFolder, out: Path) -> list[str]:
    """Write the bundle of ``folder``'s job to ``out``; the names it holds."""
    secrets = {str(k): str(v) for k, v in (folder.secret().get("env") or {}).items()}
    members: dict[str, bytes] = {
        "versions.json": json.dumps(versions(), indent=1).encode(),
        "plan.txt": _plan_text(folder).encode(),
        "README.txt": (
            f"notebook-elastic debug bundle of job {folder.name!r}, made {time.strftime('%Y-%m-%d %H:%M:%S %z')}.\n"
            "Holds: events, status, outcome, the supervisor's records and log, the agents' logs (their ends), "
            "the manifest, the generated script (the cell's code), the spec and the launch plan, versions.\n"
            "Never: --env values (hidden wherever printed), the payload, checkpoints, URL credentials.\n"
        ).encode(),
    }
    named = [
        folder.events_file,
        folder.status_file,
        folder.outcome_file,
        folder.supervisor_file,
        folder.guardian_file,
        folder.supervisor_log,
        folder.spec_file,
        folder.manifest_file,
        folder.script,
    ]
    logs = sorted(folder.logs.glob("*.log")) if folder.logs.is_dir() else []
    for path in [*named, *logs]:
        if path.is_file():
            members[str(path.relative_to(folder.path))] = _hide(_tail(path), secrets)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"{folder.name}-debug/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
    os.chmod(out, 0o600)
    return sorted(members)

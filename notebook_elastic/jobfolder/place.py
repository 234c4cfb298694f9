"""This machine as a launch plan sees it: which GPUs it shows (one per local rank), where the
store and the job folder are.

The local backend simulates nodes on one machine; each node's ranks get GPUs of their own
(``CUDA_VISIBLE_DEVICES`` per agent), never one another's: NCCL refuses two ranks on one
device, and a job that asks for more than there are is refused before anything starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from .. import defaults
from ..contract import protocol
from ..contract.plan import Place
from .folder import JobFolder


def visible_gpus() -> list[str]:
    """GPU ids to split across agents: CUDA_VISIBLE_DEVICES, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def seen_by() -> str:
    """How ``visible_gpus()`` found them, as a refusal names it."""
    where = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"CUDA_VISIBLE_DEVICES={where}" if where is not None else "nvidia-smi -L"


def local_place(
    spec: Any,
    folder: JobFolder,
    *,
    gpus: list[str],
    store_port: int | None = None,
    supervisor_pid: int | None = None,
    files_sha256: dict[str, str] | None = None,
    store_host: str | None = None,
) -> Place:
    """This machine as a launch plan sees it: the supervisor's store on loopback (at
    ``store_host`` where the nodes are other machines: Slurm), the job
    folder's script and logs, the notebook's folder on the workers' path. The store port,
    the supervisor and the files' digests are known once the supervisor runs; a dry-run
    shows the rest."""
    cwd = spec.backend_options.get("cwd") or os.getcwd()
    env = {
        protocol.ENV_JOB_DIR: str(folder.path),
        # A round waiting on this machine looks again every 0.1 s (a store on loopback: cheap).
        protocol.ENV_RDZV_POLL_S: str(defaults.RDZV_POLL_S_LOCAL),
        # Files the notebook imports from its own folder import the same way here.
        "PYTHONPATH": os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p),
    }
    if supervisor_pid is not None:
        env[protocol.ENV_SUPERVISOR_PID] = str(supervisor_pid)
    if files_sha256 is not None:
        env[protocol.ENV_FILES_SHA256] = json.dumps(files_sha256)
    return Place(
        rdzv_endpoint=f"{store_host or '127.0.0.1'}:{store_port if store_port is not None else '<supervisor store port>'}",
        # Each agent's own address where the nodes are other machines (torchrun's default).
        local_addr="" if store_host else "127.0.0.1",
        script=str(folder.script),
        join_timeout_s=defaults.JOIN_TIMEOUT_S_LOCAL,
        rdzv_conf={"last_call_timeout": str(defaults.LAST_CALL_TIMEOUT_S_LOCAL)},
        python=sys.executable,
        # torchrun's per-worker error files: in the private job folder, not a
        # /tmp/torchelastic_* folder left behind by every agent.
        log_dir=str(folder.torchelastic_logs),
        checkpoint_dir=str(folder.checkpoints),
        gpus=tuple(gpus),
        gpus_seen_by=seen_by(),
        env=env,
    )

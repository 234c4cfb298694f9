"""Which GPUs this machine shows, and whether a job's range fits them: one GPU per local rank.

The local backend simulates nodes on one machine; each node's ranks get GPUs of their own
(``CUDA_VISIBLE_DEVICES`` per agent), never one another's: NCCL refuses two ranks on one
device, and a job that asks for more than there are is refused before anything starts.
"""

from __future__ import annotations

import os
import subprocess


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


def placement_problem(max_nodes: int, nproc_per_node: int, gpus: list[str]) -> str | None:
    """The sentence refusing a range whose largest size needs more GPUs than are visible
    (None when it fits, or on a machine without GPUs: CPU jobs are not limited)."""
    need = max_nodes * nproc_per_node
    if not gpus or need <= len(gpus):
        return None
    where = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"CUDA_VISIBLE_DEVICES={where}" if where is not None else "nvidia-smi -L"
    most = len(gpus) // nproc_per_node
    fix = (
        f"use at most {most} node(s) with --nproc-per-node {nproc_per_node} (--nnodes 1:{most})"
        if most
        else f"use --nproc-per-node {len(gpus)} or fewer"
    )
    return (
        f"{max_nodes} node(s) x {nproc_per_node} process(es) need {need} GPUs, one per rank; "
        f"{len(gpus)} {'is' if len(gpus) == 1 else 'are'} visible ({seen}): {fix}"
    )

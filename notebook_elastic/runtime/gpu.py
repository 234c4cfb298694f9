"""What a GPU user reads beside the loss, sampled in the worker: this rank's peak allocated
memory (``torch.cuda.max_memory_allocated``) and its device's utilisation (NVML, through
``torch.cuda.utilization``, only when ``pynvml`` is installed).

Sampled from ``report()`` at most once every ``SAMPLE_EVERY_S`` per rank (less often in a job
of more than a thousand ranks: ``interval_s``), only once CUDA is initialised in the process: a
CPU job pays one clock read per report and sends nothing.
"""

from __future__ import annotations

import sys
import time

from ..contract.event_types import Gpu

SAMPLE_EVERY_S = 5.0
#: The most GPU lines a second a whole job sends: each is parsed and folded by the kernel (about
#: 40 us), and every rank of 1,024 nodes of 8 sending one each 5 s cost it 8 % of a core
#: (``benchmarks/thousand.py``; its goal is 5 %). Up to 1,000 ranks each still samples every 5 s.
JOB_LINES_PER_S = 200.0


def interval_s(world_size: int) -> float:
    """How often each rank of a job of ``world_size`` ranks samples its GPU."""
    return max(SAMPLE_EVERY_S, world_size / JOB_LINES_PER_S)


_next_at = 0.0
_nvml_ok = True  # False once NVML failed: never tried again in this process


def sample(now: float | None = None, world_size: int = 1, rank: int = 0) -> Gpu | None:
    """This rank's GPU figures (its ``gpu`` event), or None (not yet time, no CUDA, torch not imported)."""
    global _next_at, _nvml_ok
    now = time.monotonic() if now is None else now
    if now < _next_at:
        return None
    _next_at = now + interval_s(world_size)
    torch = sys.modules.get("torch")  # never imported here: a job without torch has no GPU figures
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    index = torch.cuda.current_device()
    out = Gpu(
        rank=rank,
        device=index,
        mem_peak_bytes=int(torch.cuda.max_memory_allocated(index)),
        mem_total_bytes=int(torch.cuda.get_device_properties(index).total_memory),
    )
    if _nvml_ok:
        try:
            out["util_percent"] = int(torch.cuda.utilization(index))  # maps CUDA_VISIBLE_DEVICES to NVML
        except Exception:  # no pynvml, no NVML library, a MIG slice: the figure is just absent
            _nvml_ok = False
    return out

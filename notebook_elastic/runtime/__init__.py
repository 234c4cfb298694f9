"""The worker runtime: what packaged cells call inside training processes.

``report(step=..., loss=...)``, ``State(model=..., optimizer=...)``, ``run(main)``. Imports
nothing from IPython, ipywidgets or kubernetes, and torch only when needed, so it runs in
any container image that has torch and cloudpickle.
"""

from __future__ import annotations

import operator
import os as _os
import time as _time
from typing import Any

from ..contract import protocol as _protocol
from ..contract.event_types import Kind as _Kind
from ..contract.event_types import Metric as _Metric
from ..contract.protocol import ENV_TRACK, EVENT_PREFIX
from ..plumbing import log as _log
from . import gpu as _gpu
from . import inplace as _inplace
from . import pod_tracking as _pod_tracking
from . import term as _term
from ._emit import emit
from .payload import load_payload, secret
from .state import State
from .state import samples_per_step as _samples_per_step
from .state import saving_seconds as _saving_seconds
from .term import data_worker_init
from .worker import StaleGenerationError, StateNotSaveable, WorkerInfo, device, guard_against_orphaning, init, run

__all__ = [
    "EVENT_PREFIX",
    "State",
    "StaleGenerationError",
    "StateNotSaveable",
    "WorkerInfo",
    "data_worker_init",
    "device",
    "emit",
    "init",
    "load_payload",
    "rank",
    "report",
    "run",
    "secret",
    "world_size",
]

guard_against_orphaning()
if _os.environ.get("LOCAL_RANK") is not None:
    _log.for_process("worker")  # our lines in its output: "notebook-elastic worker: ..."
    _term.defer_in_worker()  # Slurm's SIGTERM to every process of the node: the keeper answers it

_TRACKED = bool(_os.environ.get(ENV_TRACK))  # Kubernetes pods (runtime/pod_tracking.py)
_auto_step = 0
_progress_marked: str | None = "-"  # the round this process marked as one its group made a step in


def rank() -> int:
    """This worker's global rank now (it follows the group when the job changes in place)."""
    return int(_os.environ.get("RANK", 0))


def world_size() -> int:
    return int(_os.environ.get("WORLD_SIZE", 1))


_FLOAT_MAX = 1.7976931348623157e308


def _step(step: Any) -> int:
    """``step=`` must be a whole number (a Python, NumPy or 0-d integer tensor one)."""
    if isinstance(step, bool):
        raise TypeError(f"report(step=...) takes a whole number, not {step!r}")
    try:
        return operator.index(step)
    except TypeError:
        raise TypeError(f"report(step=...) takes a whole number, not {step!r} (a {type(step).__name__})") from None


def _number(name: str, value: Any) -> float | int:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        number: float | int = item()  # a tensor's or a NumPy scalar's
        return number
    if isinstance(value, bool):
        return int(value)
    raise TypeError(f"report() takes numbers: {name}={value!r} is a {type(value).__name__}")


def report(*, step: int | None = None, all_ranks: bool = False, **metrics: Any) -> None:
    """Send metrics to the notebook: one line, flushed. Cheap enough to call every step.

    Only global rank 0 reports unless ``all_ranks=True`` (then each line carries its rank).
    Without ``step``, a per-process counter numbers the calls.
    """
    global _auto_step, _progress_marked
    round_now = _os.environ.get(_protocol.ENV_ROUND)
    if _progress_marked != round_now:  # once per group: it has made a step (every rank says it)
        _progress_marked = round_now
        _protocol.mark_progress()
        _inplace.machinery().progressed()
    rank_now = rank()
    gpu = _gpu.sample(world_size=world_size(), rank=rank_now)  # every rank, every few seconds, only on CUDA
    if gpu is not None:
        emit(_Kind.GPU, t=_time.time(), **gpu)
    if rank_now != 0 and not all_ranks:
        return
    if step is None:
        step = _auto_step
        _auto_step += 1
    elif type(step) is not int:
        step = _step(step)
    for name, value in metrics.items():
        if type(value) is not float and type(value) is not int:
            metrics[name] = _number(name, value)
        elif type(value) is int and not -_FLOAT_MAX <= value <= _FLOAT_MAX:
            digits = int(value.bit_length() * 0.30103) + 1
            raise TypeError(
                f"report() takes numbers a chart can hold: {name} is an integer of about {digits} digits, "
                "more than a float holds; report it scaled (or as a float)"
            )
    said = _Metric(rank=rank_now, step=step, values=metrics)
    samples = _samples_per_step()
    if samples:  # the State's data cursor knows the global batch: samples/s without asking
        said["samples_per_step"] = samples
    saving = _saving_seconds() if rank_now == 0 else None
    if saving is not None and saving[1] > 0:  # what State's commits blocked of the loop so far
        said["blocked_s"], said["loop_s"] = round(saving[0], 4), round(saving[1], 3)
    emit(_Kind.METRIC, t=_time.time(), **said)
    if _TRACKED and rank_now == 0:  # a pod's rank 0 logs to MLflow/W&B itself
        _pod_tracking.observe(step, metrics)

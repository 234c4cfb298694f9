"""The pods' grace (``--grace``, their terminationGracePeriodSeconds) when none is given: derived
from the save a job of this name last measured on this cluster and namespace.

A save on notice must fit in the grace, less the seconds the agent needs to leave
(``notice_keeper.LEAVE_S``). The pods' grace is fixed when they are made, and a save is first
measured in the pods, so the measure is kept: the follower records rank 0's longest save of
each job (``record``, in the notebook-elastic home, one small file per job name),
and the next launch of that name takes 1.5 times it plus the agent's leave and a step's margin,
at least ``DEFAULT_S`` (``derived``). The dry-run says which it is and why. A first run has no
measure: ``DEFAULT_S``, and a save longer than its grace allows is a warning while it runs
(``job_state``).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from ... import defaults
from ...agent.notice_keeper import LEAVE_S
from .options import DEFAULT_GRACE_S as DEFAULT_S
from .options import MAX_GRACE_S

MARGIN_S = 2.0  # a step in flight when the notice comes


def _path(job: str) -> Path:
    return defaults.home() / "kubernetes-saves" / f"{re.sub(r'[^a-z0-9.-]', '_', job)}.json"


def measured(job: str) -> float | None:
    """Rank 0's longest save of the last run of ``job``, in seconds; None if none was seen, or
    if the record is damaged: not a number of seconds a save can take (NaN, infinite, negative,
    over ``MAX_GRACE_S``, as a corrupted or planted file may hold). The default then holds, as
    for a first run, rather than a launch that fails on it or a grace of 10^30 s (#37)."""
    try:
        save_s = float(json.loads(_path(job).read_text())["save_s"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return None
    return save_s if math.isfinite(save_s) and 0 <= save_s <= MAX_GRACE_S else None


def record(job: str, save_s: float) -> None:
    """Keep this run's longest save (a follower keeps its run's longest; a new run's replaces
    the old run's record)."""
    if not (math.isfinite(save_s) and 0 <= save_s <= MAX_GRACE_S):
        return  # not a save's time (a worker may report anything): the last record stays
    path = _path(job)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"save_s": round(save_s, 3)}))
        os.replace(tmp, path)
    except OSError:
        pass  # a home we cannot write: the next launch takes the default


def derived(save_s: float | None) -> int:
    """The grace that holds a save of ``save_s`` seconds with room to spare."""
    if save_s is None or not math.isfinite(save_s):
        return DEFAULT_S
    return min(MAX_GRACE_S, max(DEFAULT_S, math.ceil(save_s * 1.5 + LEAVE_S + MARGIN_S)))


def why(given: bool, save_s: float | None, job: str) -> str:
    """The dry-run's words for where the grace came from."""
    if given:
        return "--grace"
    if save_s is None and _path(job).exists():
        return f"the default: the record of the last run's save, {_path(job)}, is damaged (delete it)"
    if save_s is None:
        return f"the default: no save of a job named {job} measured here yet"
    return f"derived from the last run's longest save, {save_s:.1f} s: 1.5 x it + {LEAVE_S + MARGIN_S:g} s, at least {DEFAULT_S}"

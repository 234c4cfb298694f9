"""What the Slurm cluster says, through its own clients: its partitions and their time limits
(``sinfo``), and why an allocation waits (``squeue``). Errors Slurm would give after the submit
are given before it, in one sentence."""

from __future__ import annotations

import shutil
import subprocess

from ...errors import BackendError, SpecError
from .options import SlurmOptions, minutes

TIMEOUT_S = 20


def _run(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise BackendError(
            f"no Slurm client here ({argv[0]} is not on the PATH): run from a login node of the cluster, "
            "or install Slurm's client commands"
        )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise BackendError(f"{' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def partitions() -> dict[str, float | None]:
    """Every partition and its time limit in minutes (None: unlimited); the default one first."""
    found: dict[str, float | None] = {}
    default: str | None = None
    for line in _run(["sinfo", "--noheader", "--format=%P|%l"]).splitlines():
        name, _, limit = line.strip().partition("|")
        if not name:
            continue
        if name.endswith("*"):
            name = default = name[:-1]
        try:
            found[name] = minutes(limit)
        except ValueError:
            found[name] = None
    if default is not None:
        found = {default: found[default], **{k: v for k, v in found.items() if k != default}}
    return found


def check(options: SlurmOptions) -> str:
    """The partition the nodes run in, after the checks Slurm would make at submit time."""
    known = partitions()
    if not known:
        raise BackendError("sinfo lists no partition: this Slurm cluster has none up for you")
    partition = options.partition or next(iter(known))
    if partition not in known:
        raise SpecError(
            f"--partition {partition!r} is not a partition of this cluster; choose one of: {', '.join(known)}"
        )
    limit = known[partition]
    if options.time is not None and limit is not None:
        asked = minutes(options.time)
        if asked is not None and asked > limit:
            raise SpecError(
                f"--time {options.time} is over partition {partition!r}'s limit of {limit:g} minutes; "
                "ask for less, or choose another partition"
            )
    return partition


def pending_reason(job_id: str) -> str | None:
    """Why an allocation waits (squeue's reason: Priority, Resources, QOSMaxGRESPerUser...)."""
    try:
        out = _run(["squeue", "--noheader", "--jobs", job_id, "--format=%r"]).strip()
    except (BackendError, subprocess.TimeoutExpired):
        return None
    return out or None

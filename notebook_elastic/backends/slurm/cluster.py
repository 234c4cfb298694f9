"""What the Slurm cluster says, through its own clients: its partitions and their time limits
(``sinfo``), and why an allocation waits (``squeue``). Errors Slurm would give after the submit
are given before it, in one sentence."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

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


def _fields(text: str) -> dict[str, str]:
    """``Key=Value`` words of scontrol's one-line output."""
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def notice_s() -> float:
    """The notice Slurm gives a node before SIGKILL, whatever ends it: KillWait after its
    SIGTERM (a scancel, a time limit, a stop). A preemption gives the partition's GraceTime
    more, but its SIGTERM looks the same, so the keeper counts on KillWait alone (it passes the
    notice on at once when rank 0 has saved, or at Slurm's second SIGTERM). 30 s (Slurm's
    default) when Slurm cannot say."""
    try:
        config = _run(["scontrol", "show", "config"])
    except (BackendError, subprocess.TimeoutExpired):
        return 30.0
    m = re.search(r"^KillWait\s*=\s*(\d+)", config, re.M)
    return float(m.group(1)) if m else 30.0


#: A job's states before its end is known (its step may end before the job does).
NOT_ENDED = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUED")
ENDS = {"TIMEOUT": "timeout", "CANCELLED": "cancelled", "NODE_FAIL": "node_fail", "PREEMPTED": "preempted"}


def _job(job_id: str) -> dict[str, str] | None:
    """``scontrol show job``'s fields for a job; ``{"JobState": "GONE"}`` when Slurm no longer
    knows it, None when Slurm does not answer."""
    try:
        done = subprocess.run(
            ["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return {"JobState": "GONE"} if "Invalid job id" in (done.stderr + done.stdout) else None
    return _fields(done.stdout)


def submit(argv: list[str], env: dict[str, str]) -> str:
    """``sbatch --parsable ...``: the new job's id."""
    if shutil.which(argv[0]) is None:
        raise BackendError(f"no Slurm client here ({argv[0]} is not on the PATH)")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    if done.returncode != 0:
        raise BackendError(f"sbatch refused the job's supervisor: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip().split(";")[0]


def supervisor_runs(info: Mapping[str, Any], state_of: Callable[[str], str] | None = None) -> bool | None:
    """Whether a job's supervisor on another machine runs, told by its own allocation (its
    record's ``slurm_job``): while Slurm holds it running, completing or suspended, and while
    Slurm does not answer. ``state_of``: how the allocation's state is read (asked now by
    default; the server's cache). None for a record without one: not Slurm's to tell."""
    job = info.get("slurm_job")
    if not job:
        return None
    state = state_of(str(job)) if state_of is not None else job_state(str(job))[0]
    return state == "" or (state in NOT_ENDED and state != "PENDING")


def job_state(job_id: str) -> tuple[str, str]:
    """(JobState, Reason) of a job; ("", "") when Slurm does not answer, ("GONE", "") when it
    no longer knows the job."""
    job = _job(job_id) or {}
    return job.get("JobState", ""), job.get("Reason", "")


def job_comment(job_id: str) -> str | None:
    """The comment Slurm keeps for a job (a site's job_submit plugin may have replaced the one
    given); None when Slurm does not answer or no longer knows it."""
    job = _job(job_id)
    if job is None or job.get("JobState") == "GONE":
        return None
    return job.get("Comment", "")


def job_names(job: str) -> re.Pattern[str]:
    """The names of one job's allocations: ne-JOB-supervisor, ne-JOB-node-N (not ne-JOB-2's)."""
    return re.compile(rf"ne-{re.escape(job)}-(supervisor|node-\d+)")


def comment(mark: str) -> str:
    """What each allocation of a job carries (``--comment``, ``squeue``'s ``%k``): its folder's
    mark (``mark.py``). A name is not enough: another folder (another home, another machine)
    may hold a job of the same name."""
    return f"notebook-elastic:{mark}"


def allocations(names: re.Pattern[str], mark: str, states: str | None = None) -> list[tuple[str, str, str]] | None:
    """This user's allocations that carry ``mark`` and whose name ``names`` matches, as (id,
    name, state); only those in ``states`` (squeue's ``--states``) when given. None when Slurm
    does not answer."""
    argv = ["squeue", "--me", "--noheader", "--format=%i|%T|%k|%j", *([f"--states={states}"] if states else [])]
    try:
        out = _run(argv)
    except (BackendError, subprocess.TimeoutExpired):
        return None
    found = []
    for line in out.splitlines():
        parts = line.strip().split("|", 3)  # the name last: another job's may hold a '|'
        if len(parts) == 4 and parts[2] == comment(mark) and names.fullmatch(parts[3]):
            found.append((parts[0], parts[3], parts[1]))
    return found


def _scancel(ids: list[str], *options: str) -> bool:
    """``scancel --me OPTIONS IDS``: by id, and only this user's (an id of another user's job is
    never acted on, whatever the caller was told). One that ended meanwhile is skipped. Whether
    Slurm answered (False: it did not, or refused: nothing may have been done)."""
    if not ids:
        return True
    try:
        _run(["scancel", "--me", *options, *ids])
    except subprocess.TimeoutExpired:
        return False
    except BackendError as exc:
        # "Invalid job id" for one that ended meanwhile: the others were acted on.
        return "Invalid job id" in str(exc) or "already completing or completed" in str(exc)
    return True


def cancel(job: str, mark: str) -> list[str] | None:
    """scancel every allocation of job ``job`` that carries its folder's ``mark`` (its
    supervisor's, its nodes', waiting or running); their ids. None when Slurm did not answer
    (nothing may have been cancelled)."""
    found = allocations(job_names(job), mark)
    if found is None:
        return None
    ids = [i for i, _, _ in found]
    return ids if _scancel(ids) else None


def cancel_ids(ids: list[str]) -> bool:
    """scancel these allocations (ids the caller holds: the supervisor's it submitted); whether
    Slurm answered."""
    return _scancel([i for i in ids if i])


def signal_node(name: str, mark: str, signal_name: str | None, state: str | None = None) -> None:
    """Signal every process of the allocation named ``name`` that carries ``mark``
    (``scancel --signal``), or cancel it (``signal_name`` None); only one in ``state`` when
    given (squeue's and scancel's filter both: one whose state changed in between is left to
    the caller's next call)."""
    ids = [i for i, _, _ in allocations(re.compile(re.escape(name)), mark, state) or []]
    _scancel(ids, *([f"--signal={signal_name}"] if signal_name else []), *([f"--state={state}"] if state else []))


def ended_why(name: str, mark: str, wait_s: float = 5.0) -> str | None:
    """Why Slurm ended the newest allocation named ``name`` that carries ``mark``: "preempted"
    (it has a PreemptTime), "timeout", "cancelled", "node_fail"; None when it ended by itself or
    Slurm no longer knows it. Its step can end before the job does: a job not ended yet is asked
    again for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        found = allocations(re.compile(re.escape(name)), mark, "all")
        if not found:
            return None
        newest = max((i for i, _, _ in found), key=lambda i: int(re.sub(r"\D", "", i) or 0))
        job = _job(newest)
        if job is None:
            return None
        if job.get("PreemptTime", "None") not in ("None", "Unknown", ""):
            return "preempted"
        state = job.get("JobState", "")
        if state not in NOT_ENDED or time.monotonic() > deadline:
            return ENDS.get(state)
        time.sleep(0.2)


def wait_ended(ids: list[str], timeout_s: float) -> bool:
    """Wait (up to ``timeout_s``) until Slurm holds none of these allocations pending or
    running: whether it came to that."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = [job_state(i)[0] for i in ids]
        if all(s and s not in NOT_ENDED for s in states):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)

"""The Slurm options of a job (``--partition``, ``--account``, ``--qos``, ``--time``,
``--gpus-per-node``, ``--constraint``, ``--slurm-arg``), checked for form here, against the
cluster in ``cluster.py``; and the ``srun`` each node's agent runs under."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import SpecError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
# Slurm's time formats: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS,
# DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS ("UNLIMITED" is the partition's own word).
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def minutes(text: str) -> float | None:
    """A Slurm time as minutes (None: UNLIMITED/infinite); ValueError when it is not one."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME.match(text)
    if not m:
        raise ValueError(text)
    days, a, b, c = m.groups()
    if days is not None:  # D-H[:M[:S]]
        h, mi, s = int(a), int(b or 0), int(c or 0)
        return int(days) * 1440 + h * 60 + mi + s / 60
    if c is not None:  # H:M:S
        return int(a) * 60 + int(b) + int(c) / 60
    if b is not None:  # M:S
        return int(a) + int(b) / 60
    return float(a)  # M


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    gpus_per_node: int | None = None
    constraint: str | None = None
    slurm_args: list[str] = field(default_factory=list)
    supervisor_in: str | None = None  # the supervisor's allocation's partition (None: the nodes'), or "here"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> SlurmOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})

    def srun(self, job: str, node: str, nproc_per_node: int, comment: str) -> list[str]:
        """The ``srun`` a node's agent runs under: one task on one node, its own allocation,
        named after the job and the node (``squeue`` shows which is which) and carrying the
        job's mark (``comment``: ``mark.py``), the environment passed on, and the job's options."""
        argv = [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={max(1, nproc_per_node)}",
            f"--job-name=ne-{job}-{node}",
            f"--comment={comment}",
            "--export=ALL",
            "--kill-on-bad-exit=1",
        ]
        for flag, value in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--time", self.time),
            ("--constraint", self.constraint),
        ):
            if value:
                argv.append(f"{flag}={value}")
        if self.gpus_per_node:
            argv.append(f"--gpus-per-node={self.gpus_per_node}")
        return [*argv, *self.slurm_args, "--"]

    def sbatch_supervisor(
        self, job: str, log: str, command: list[str], comment: str, minutes: float | None = None
    ) -> list[str]:
        """The ``sbatch`` of the job's supervisor: one small task of its own (``ne-JOB-supervisor``,
        carrying the job's mark: ``comment``), in the supervisor's partition (the nodes' by default), charged as the nodes are, its
        output appended to the job's supervisor.log; its time the partition's limit (``minutes``;
        without --time Slurm would give it the partition's DefaultTime), so it outlives nodes
        that are replaced at theirs."""
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name=ne-{job}-supervisor",
            f"--comment={comment}",
            "--ntasks=1",
            "--cpus-per-task=1",
            "--export=ALL",
            f"--output={log.replace('%', '%%')}",  # sbatch expands %j, %u... in the path
            "--open-mode=append",
            # Before its time limit, the supervisor alone is told (its nodes' sruns are in its
            # step: Slurm's SIGTERM to all would make each end its node at once): it stops the
            # job, each node saving first, and the job can be resumed.
            "--signal=B:TERM@60",
        ]
        partition = self.supervisor_in or self.partition
        for flag, value in (("--partition", partition), ("--account", self.account), ("--qos", self.qos)):
            if value:
                argv.append(f"{flag}={value}")
        if minutes is not None:
            argv.append(f"--time={int(minutes)}")
        return [*argv, "--wrap", "exec " + " ".join(shlex.quote(c) for c in command)]


#: The srun options notebook-elastic sets itself (``SlurmOptions.srun``), or that would hide a
#: node from its job (its output read by the supervisor, its own allocation): the long name,
#: the short letter, and what to do instead. sbatch's own (--parsable, --wrap, --open-mode) too:
#: they are never given to srun, and a user who writes them means the supervisor's, which is ours.
OURS: dict[str, tuple[str | None, str]] = {
    "--job-name": ("J", "remove it (squeue shows each node as ne-JOB-node-N)"),
    "--comment": (None, "remove it (the comment holds the job's mark)"),
    "--nodes": ("N", "remove it (each node is an allocation of one node; --nnodes sets how many)"),
    "--ntasks": ("n", "remove it (one agent per node; --nproc-per-node sets the ranks)"),
    "--cpus-per-task": ("c", "remove it (it follows --nproc-per-node)"),
    "--export": (None, "remove it (the environment is passed on; give variables with --env)"),
    "--kill-on-bad-exit": ("K", "remove it"),
    "--output": ("o", "remove it (the node's output goes to the job's logs/)"),
    "--error": ("e", "remove it (the node's output goes to the job's logs/)"),
    "--input": ("i", "remove it"),
    "--label": ("l", "remove it (the job reads each node's lines as they are)"),
    "--jobid": (None, "remove it (each node is an allocation of its own)"),
    "--parsable": (None, "remove it"),
    "--wrap": (None, "remove it"),
    "--open-mode": (None, "remove it"),
    "--partition": ("p", "use --partition instead (it is checked against the cluster)"),
    "--account": ("A", "use --account instead"),
    "--qos": ("q", "use --qos instead"),
    "--time": ("t", "use --time instead (it is checked against the partition's limit)"),
    "--constraint": ("C", "use --constraint instead"),
    "--gpus-per-node": (None, "use --gpus-per-node instead"),
}
#: srun options that are a prefix of one of ours but an option of their own (exact names win).
_OWN_PREFIXES = ("--gpus",)
#: srun's short options that take no value: "-uJx" is -u then -J x.
_SHORT_FLAGS = set("EHkKlOQsuvXZhV")


def ours(arg: str) -> tuple[str, str] | None:
    """(the option of ours ``arg`` sets, what to do instead), or None. srun (getopt) takes a
    long option's unambiguous prefix for it (``--job-na=x`` is ``--job-name=x``), and short
    flags run together (``-lJx``): both are read as srun reads them."""
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        if name in OURS:
            return name, OURS[name][1]
        if name not in _OWN_PREFIXES and len(name) > 2:
            for full, (_, instead) in OURS.items():
                if full.startswith(name):
                    return full, instead
        return None
    by_letter = {letter: (full, instead) for full, (letter, instead) in OURS.items() if letter}
    for letter in arg[1:]:
        if letter in by_letter:
            return by_letter[letter]
        if letter not in _SHORT_FLAGS:
            return None  # an option that takes a value: the rest is its value
    return None


def parse_options(
    *,
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    time: str | None = None,
    gpus_per_node: int | str | None = None,
    constraint: str | None = None,
    slurm_args: Iterable[str] = (),
    supervisor_in: str | None = None,
) -> SlurmOptions:
    """Validated options from flag values (``SpecError`` on the first bad one)."""
    for flag, value in (
        ("--partition", partition),
        ("--account", account),
        ("--qos", qos),
        ("--supervisor-in", supervisor_in),
    ):
        if value is not None and not _NAME.match(value):
            raise SpecError(f"{flag} {value!r} is not a Slurm name (letters, digits, '_', '.', ':', '-')")
    if time is not None:
        try:
            if minutes(str(time)) is None:
                raise ValueError(time)
        except ValueError:
            raise SpecError(
                f"--time {time!r} is not a Slurm time limit; write MINUTES, HH:MM:SS or D-HH:MM (like 90, 2:00:00, 1-12:00)"
            ) from None
    gpus = None
    if gpus_per_node is not None:
        try:
            gpus = int(gpus_per_node)
        except (TypeError, ValueError):
            gpus = -1
        if gpus < 0:
            raise SpecError(f"--gpus-per-node {gpus_per_node!r} must be a whole number of GPUs, 0 or more")
    args = [str(a) for a in slurm_args]
    for arg in args:
        if not arg.startswith("-") or any(c.isspace() for c in arg.split("=", 1)[0]):
            raise SpecError(
                f"--slurm-arg {arg!r} is not an srun option; give one option each, like --slurm-arg=--mem=32G"
            )
        taken = ours(arg)
        if taken is not None:
            flag, instead = taken
            raise SpecError(
                f"--slurm-arg {arg!r} sets {flag}, which notebook-elastic sets itself for each node "
                f"(its allocations are named, marked and read by the job); {instead}"
            )
    return SlurmOptions(
        partition=partition,
        account=account,
        qos=qos,
        time=str(time) if time is not None else None,
        gpus_per_node=gpus,
        constraint=constraint,
        slurm_args=args,
        supervisor_in=supervisor_in,
    )

"""The launch plan: what every node of a job runs, as a pure function of the job spec and the
place it runs on. The one place a torchrun command line is built: the local supervisor runs
the plan, the Kubernetes manifests embed it, and every dry-run prints it.

A plan holds no secret: ``--env`` values are named (``secret_env``) and filled in by the
backend that starts the processes (the local supervisor from the job's 0600 secret file, a
pod from the job's Secret).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import defaults
from ..contract import protocol
from ..errors import SpecError

#: The module each node runs: torchrun's agent with our rendezvous and departure handling.
AGENT_MODULE = "notebook_elastic.agent.run"
#: Environment every node of every backend gets, whatever the job.
FIXED_ENV = {
    # Each agent's own store is not shared with the rendezvous: the store host outlives agents.
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    "LOGLEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class Place:
    """Where a plan runs: what the backends differ in.

    ``gpus`` are the GPUs the place shows to one machine, split one per local rank across the
    simulated nodes (local); a cluster leaves them empty and asks its device plugin instead.
    """

    rdzv_endpoint: str  # host:port of the c10d store
    local_addr: str  # the address each agent advertises to its peers ("": torchrun's default, its host's)
    script: str  # the training script, as the agents see it
    join_timeout_s: int
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)  # the place's sizing, under the job's own
    python: str = "python"
    log_dir: str | None = None  # torchrun's per-worker error files
    checkpoint_dir: str = ""  # where State writes, unless the spec names a folder
    gpus: tuple[str, ...] = ()
    gpus_seen_by: str = "nvidia-smi -L"  # how ``gpus`` were found, for the refusal's sentence
    env: Mapping[str, str] = field(default_factory=dict)  # the backend's own additions


@dataclass(frozen=True)
class NodePlan:
    """One node: the command it runs, the environment it adds, its GPUs."""

    index: int
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class LaunchPlan:
    place: Place
    nnodes: tuple[int, int]
    nproc_per_node: int
    max_restarts: int
    rdzv_id: str
    rdzv_conf: Mapping[str, str]
    epoch: int
    torchrun_args: tuple[str, ...]  # torchrun's own arguments, the script last
    env: Mapping[str, str]  # what every node adds to its environment
    secret_env: tuple[str, ...]  # the --env names, whose values the backend fills in
    nodes: tuple[NodePlan, ...]  # the nodes a (re)start begins with

    @property
    def agent_prefix(self) -> tuple[str, ...]:
        """The interpreter and module; a warm standby agent is started with these alone."""
        return (self.place.python, "-m", AGENT_MODULE)

    @property
    def argv(self) -> tuple[str, ...]:
        return (*self.agent_prefix, *self.torchrun_args)

    def node(self, index: int, gpus: Sequence[str] = ()) -> NodePlan:
        """Node ``index`` (``node-INDEX``), on ``gpus`` (one per local rank, or none)."""
        if gpus and len(gpus) != self.nproc_per_node:
            raise ValueError(f"node-{index}: {len(gpus)} GPUs for {self.nproc_per_node} local ranks")
        name = f"node-{index}"
        env = {protocol.ENV_NODE: name}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        return NodePlan(index, name, self.argv, env, tuple(gpus))

    def text(self, *, indent: str = "  ") -> str:
        """The plan as a dry-run prints it: the command, the rendezvous, what each node gets."""
        lo, hi = self.nnodes
        lines = [f"{indent}agent command (one per node, {lo} to {hi} nodes):"]
        args = list(self.argv)
        pairs, i = [" ".join(args[:3])], 3
        while i < len(args):
            if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
                pairs.append(f"{args[i]} {args[i + 1]}")
                i += 2
            else:
                pairs.append(args[i])
                i += 1
        lines.append(indent * 2 + (" \\\n" + indent * 3).join(pairs))
        lines.append(f"{indent}rendezvous: c10d at {self.place.rdzv_endpoint}, id {self.rdzv_id}")
        shown = {**self.env, **{k: defaults.HIDDEN_VALUE for k in self.secret_env}}
        lines.append(f"{indent}environment of every node:")
        lines += [f"{indent * 2}{k}={v}" for k, v in sorted(shown.items())]
        if any(node.gpus for node in self.nodes):
            lines += [f"{indent}{node.name}: GPUs {','.join(node.gpus)}" for node in self.nodes]
        else:
            lines.append(f"{indent}GPUs: none assigned here (a CPU job, or the cluster's device plugin chooses)")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "rdzv_endpoint": self.place.rdzv_endpoint,
            "rdzv_id": self.rdzv_id,
            "rdzv_conf": dict(self.rdzv_conf),
            "env": {**self.env, **{k: defaults.HIDDEN_VALUE for k in self.secret_env}},
            "nodes": [{"name": n.name, "gpus": list(n.gpus)} for n in self.nodes],
        }


def rdzv_id(job: str, run: str, epoch: int) -> str:
    """The rendezvous of one run's epoch: a new range or a resumed run never meets an old one."""
    return f"{job}-{run}-e{epoch}"


def placement_problem(max_nodes: int, nproc_per_node: int, gpus: Sequence[str], seen_by: str) -> str | None:
    """The sentence refusing a range whose largest size needs more GPUs than are visible
    (None when it fits, or without GPUs: CPU jobs are not limited)."""
    need = max_nodes * nproc_per_node
    if not gpus or need <= len(gpus):
        return None
    most = len(gpus) // nproc_per_node
    fix = (
        f"use at most {most} node(s) with --nproc-per-node {nproc_per_node} (--nnodes 1:{most})"
        if most
        else f"use --nproc-per-node {len(gpus)} or fewer"
    )
    return (
        f"{max_nodes} node(s) x {nproc_per_node} process(es) need {need} GPUs, one per rank; "
        f"{len(gpus)} {'is' if len(gpus) == 1 else 'are'} visible ({seen_by}): {fix}"
    )


def rdzv_conf(spec: Any, place: Place) -> dict[str, str]:
    """Our measured rendezvous settings (defaults.py), the place's sizing (a cluster's slower
    heartbeats), then the job's own ``--rdzv-conf``, which wins."""
    conf = defaults.rdzv_conf(join_timeout_s=place.join_timeout_s, is_host=False)
    conf.update(place.rdzv_conf)
    conf.update(spec.rdzv_conf)
    return conf


def launch_plan(
    spec: Any,
    place: Place,
    *,
    rdzv_id: str,
    epoch: int = 0,
    nnodes: tuple[int, int] | None = None,
    nodes: int | None = None,
) -> LaunchPlan:
    """The plan of ``spec`` on ``place``: the range ``nnodes`` (default the spec's), starting
    with ``nodes`` nodes (default the spec's initial size), each on GPUs of its own.

    Raises ``SpecError`` when the range's largest size needs more GPUs than the place shows.
    """
    lo, hi = nnodes or spec.nnodes
    n = spec.nproc_per_node
    problem = placement_problem(hi, n, place.gpus, place.gpus_seen_by)
    if problem:
        raise SpecError(f"--nnodes {lo}:{hi}: {problem}")
    conf = rdzv_conf(spec, place)
    args = [
        "--nnodes",
        f"{lo}:{hi}",
        "--nproc-per-node",
        str(n),
        "--max-restarts",
        str(spec.max_restarts),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        place.rdzv_endpoint,
        "--rdzv-id",
        rdzv_id,
        "--rdzv-conf",
        ",".join(f"{k}={v}" for k, v in conf.items()),
        "--monitor-interval",
        str(spec.monitor_interval_s),
        *(["--local-addr", place.local_addr] if place.local_addr else []),
    ]
    if place.log_dir:
        args += ["--log-dir", place.log_dir]
    args.append(place.script)
    env = {
        protocol.ENV_JOB: spec.name,
        protocol.ENV_CHECKPOINT_DIR: spec.checkpoint_dir or place.checkpoint_dir,
        protocol.ENV_RDZV_EPOCH: str(epoch),
        protocol.ENV_NOTICE_STORE: place.rdzv_endpoint,  # notices before a node goes (runtime/notice.py)
        protocol.ENV_COLLECTIVE_TIMEOUT_S: f"{float(spec.collective_timeout_s):g}",
        **({protocol.ENV_CHECKPOINT_EVERY: str(spec.checkpoint_every)} if spec.checkpoint_every else {}),
        **({protocol.ENV_IN_PLACE: "0"} if spec.torchrun_restarts else {}),
        **FIXED_ENV,
        **place.env,
    }
    start = spec.initial_nodes if nodes is None else nodes
    plan = LaunchPlan(
        place=place,
        nnodes=(lo, hi),
        nproc_per_node=n,
        max_restarts=spec.max_restarts,
        rdzv_id=rdzv_id,
        rdzv_conf=conf,
        epoch=epoch,
        torchrun_args=tuple(args),
        env=env,
        secret_env=tuple(sorted(spec.env)),
        nodes=(),
    )
    gpus = list(place.gpus)
    initial = tuple(plan.node(i, gpus[i * n : (i + 1) * n] if gpus else ()) for i in range(start))
    return replace(plan, nodes=initial)

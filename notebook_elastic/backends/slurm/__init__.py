"""The Slurm backend: each node of the job is a Slurm allocation running one torchrun agent.

It is the local backend's job folder, supervisor and store, with the nodes placed by Slurm:
the supervisor (detached on the machine the job is launched from: a login node, or the compute
node JupyterHub's batch spawner or Open OnDemand gave the kernel) starts each node's agent under
``srun`` (one task on one node, its own allocation, named ``ne-JOB-node-N``), so scaling, the
range, the drills, departures free of the budget, stalls, resume and every view are the local
backend's. An allocation that waits says why (``squeue``'s reason) in a ``pending`` event; one
that Slurm cancels or preempts is a node that left, and the job regroups without it.

Before anything is submitted the options are checked against the cluster (``sinfo``): an
unknown partition, a ``--time`` over the partition's limit, no Slurm client here.

What this first part does not do yet (#29): the supervisor as an allocation of its own, a
store reachable from other hosts (the agents meet the supervisor's store on loopback, so the
allocations must land on the machine the job was launched from: a one-host cluster, or a
partition of that host), and Slurm's ``--signal`` as a notice.
"""

from __future__ import annotations

from typing import Any

from ..base import DryRun
from ..local import LocalBackend
from . import cluster
from .options import SlurmOptions

__all__ = ["SlurmBackend"]


class SlurmBackend(LocalBackend):
    """A local job folder and supervisor whose nodes are Slurm allocations."""

    name = "slurm"

    def submit_dryrun(self, spec: Any, bundle: Any) -> DryRun:
        dry = super().submit_dryrun(spec, bundle)
        options = SlurmOptions.from_json(spec.backend_options.get("slurm"))
        srun = " ".join(options.srun(spec.name, "node-N", spec.nproc_per_node))
        try:
            where = f"partition {cluster.check(options)}"
        except Exception as exc:  # a dry-run shows what it would do, and what Slurm would refuse
            where = f"not checked against the cluster: {exc}"
        text = dry.text.replace("local backend:", "slurm backend:", 1)
        text += f"\n  each node is a Slurm allocation ({where}): {srun} <the agent's command above>"
        return DryRun("slurm", spec, bundle, {**dry.request, "srun": srun}, text)

    def schedule(self, dryrun: DryRun) -> None:
        cluster.check(SlurmOptions.from_json(dryrun.spec.backend_options.get("slurm")))  # before anything
        super().schedule(dryrun)

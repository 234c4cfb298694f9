"""The Slurm backend: each node of the job is a Slurm allocation running one torchrun agent.

It is the local backend's job folder, supervisor and store, with the nodes placed by Slurm
(``supervisor/slurm_nodes.py``): the supervisor runs as a small allocation of its own (``sbatch``,
``ne-JOB-supervisor``; ``--supervisor-in here`` keeps it on the launching machine) and starts
each node's agent under ``srun`` (one task on one node, its own allocation, ``ne-JOB-node-N``),
so scaling, the range, the drills, departures free of the budget, stalls, resume and every view
are the local backend's. The store and the control channel listen on every interface of the
supervisor's machine (its host name is what the agents and the kernel reach); the job folder
must be on a file system the kernel, the supervisor and the nodes share.

An allocation that waits says why (``squeue``'s reason) in a ``pending`` event. Slurm's
SIGTERM to a node (a preemption, ``scancel``, the time limit) is a notice: rank 0 saves first
(``runtime/term.py``); a preempted node, or one whose time is up, is replaced by a new
allocation that joins when Slurm grants it; a cancelled one is not replaced. Before anything is
submitted the options are checked against the cluster (``sinfo``): an unknown partition, a
``--time`` over the partition's limit, no Slurm client here.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ...errors import BackendError
from ...jobfolder.folder import JobFolder
from ...jobfolder.follow import SUPERVISOR_START_TIMEOUT_S
from ...pool import ENV_POOL
from ...runtime import protocol
from ..base import DryRun
from ..local import RESUMABLE_STATUSES, SUPERVISOR_MODULE, LocalBackend, _tail
from . import cluster
from .options import SlurmOptions

__all__ = ["SlurmBackend"]

#: How long a launch waits for the supervisor's allocation while Slurm keeps it pending.
SUPERVISOR_WAIT_S = 120.0


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
        options = SlurmOptions.from_json(dryrun.spec.backend_options.get("slurm"))
        cluster.check(options)  # before anything
        if options.supervisor_in not in (None, "here"):
            cluster.check(SlurmOptions(partition=options.supervisor_in))
        super().schedule(dryrun)

    def _start_supervisor(self, folder: JobFolder, name: str, *, resume: bool = False) -> None:
        """The supervisor as a small allocation of its own (``sbatch``), so that the job lives in
        the cluster, not on the kernel's machine; ``--supervisor-in here`` runs it here, as the
        local backend does."""
        options = SlurmOptions.from_json((folder.spec().get("backend_options") or {}).get("slurm"))
        if options.supervisor_in == "here":
            super()._start_supervisor(folder, name, resume=resume)
            return
        env = dict(os.environ)
        env.pop(ENV_POOL, None)  # no warm pool on the allocation's machine
        env[protocol.ENV_JOB_DIR] = str(folder.path)
        command = [sys.executable, "-m", SUPERVISOR_MODULE]
        command += [*(["--resume"] if resume else []), str(folder.path)]
        known = cluster.partitions()
        limit = known.get(options.supervisor_in or options.partition or next(iter(known), ""))
        argv = options.sbatch_supervisor(name, str(folder.supervisor_log), command, minutes=limit)
        job_id = cluster.submit(argv, env)
        submitted, granted = time.monotonic(), None
        unknown = 0
        while folder.supervisor() is None:
            state, reason = cluster.job_state(job_id)
            now = time.monotonic()
            unknown = unknown + 1 if not state else 0
            if state == "GONE" or (state and state not in cluster.NOT_ENDED) or unknown > 20:
                cluster.cancel(name)
                raise BackendError(
                    f"the supervisor's allocation (Slurm job {job_id}) ended ({state or 'Slurm does not answer'}) "
                    f"before the job started: {_tail(folder.supervisor_log)}"
                )
            if state and state != "PENDING" and granted is None:
                granted = now  # its start is timed from here, not from the wait in the queue
            if (granted is None and now - submitted > SUPERVISOR_WAIT_S) or (
                granted is not None and now - granted > SUPERVISOR_START_TIMEOUT_S
            ):
                cluster.cancel(name)
                waits = f"still waits ({reason})" if granted is None else f"did not start the supervisor ({state})"
                raise BackendError(
                    f"the supervisor's allocation (Slurm job {job_id}) {waits} after {now - submitted:.0f} s and was "
                    "cancelled; choose a partition with room (--supervisor-in PARTITION), or run it on this "
                    "machine (--supervisor-in here)"
                )
            time.sleep(0.5 if granted is None else 0.1)

    def resume(self, name: str, *, guarded: bool = False) -> None:
        """As the local backend resumes, once nothing of the job is left in Slurm: a supervisor
        thought lost (on another machine) must not meet its successor."""
        info = self.describe(name)
        if info is not None and (info.status in RESUMABLE_STATUSES or (guarded and info.status == "recovering")):
            cluster.cancel(name)
        super().resume(name, guarded=guarded)

    def cancel(self, name: str, timeout_s: float = 30.0) -> None:
        """Stop the job as the local backend does, then cancel any allocation of it Slurm still
        holds (a supervisor that never started, a node that waits)."""
        try:
            super().cancel(name, timeout_s)
        finally:
            cluster.cancel(name)

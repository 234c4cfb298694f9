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

Every allocation of the job carries its folder's mark (``mark.py``), and every action on Slurm
takes only this user's allocations that carry it: a job of the same name elsewhere (another
home, another machine) is never cancelled, signalled or read as this one.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ...contract.events import FINAL_STATUSES
from ...errors import BackendError
from ...jobfolder.folder import JobFolder
from ...jobfolder.follow import SUPERVISOR_START_TIMEOUT_S
from ...pool import ENV_POOL
from ...runtime import protocol
from ..base import DryRun
from ..local import SUPERVISOR_MODULE, LocalBackend, _tail
from . import cluster
from .mark import mark_for_run, own_mark
from .options import SlurmOptions

__all__ = ["SlurmBackend"]

#: How long a launch waits for the supervisor's allocation while Slurm keeps it pending.
SUPERVISOR_WAIT_S = 120.0
#: How long a resume waits for what is left of the earlier run to end once cancelled (its nodes
#: end at Slurm's SIGTERM: their store went with their supervisor).
LEFTOVERS_WAIT_S = 30.0


def _job_name(folder: JobFolder) -> str:
    """The name the job's allocations are named after: its spec's (a folder renamed by hand
    keeps it), else the folder's."""
    try:
        name = folder.spec().get("name")
    except (OSError, ValueError):
        name = None
    return name if isinstance(name, str) and name else folder.name


class SlurmBackend(LocalBackend):
    """A local job folder and supervisor whose nodes are Slurm allocations."""

    name = "slurm"

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        super().__init__(home)
        # The mark of each job this backend ran, kept for the case its folder goes: stop() still
        # finds its allocations (job name -> (allocations' name, mark)).
        self._marks: dict[str, tuple[str, str]] = {}

    def _mark(self, name: str) -> tuple[str, str] | None:
        """(the name its allocations are named after, the mark they carry) of job ``name``, from
        its folder (or from this backend's memory when the folder went); None when it has none
        of its own (it never ran in Slurm with one, or the folder is a copy)."""
        folder = self.folder(name)
        mark = own_mark(folder)
        if mark is not None:
            self._marks[name] = (_job_name(folder), mark)
            return self._marks[name]
        return None if folder.path.exists() else self._marks.get(name)

    def _cancel_all(self, name: str, wait_s: float = 0.0) -> None:
        """Cancel every allocation of job ``name`` (only those carrying its mark); wait up to
        ``wait_s`` for them to end."""
        marked = self._mark(name)
        if marked is None:
            return  # nothing of its own in Slurm: never cancel by a name alone
        ids = cluster.cancel(*marked)
        if ids and wait_s:
            cluster.wait_ended(ids, wait_s)

    def submit_dryrun(self, spec: Any, bundle: Any) -> DryRun:
        dry = super().submit_dryrun(spec, bundle)
        options = SlurmOptions.from_json(spec.backend_options.get("slurm"))
        srun = " ".join(options.srun(spec.name, "node-N", spec.nproc_per_node, cluster.comment("<the folder's mark>")))
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
        info = self.describe(dryrun.spec.name)
        if info is not None and info.status in (*FINAL_STATUSES, "lost", "damaged"):
            # Its folder goes to the history: what Slurm still holds of that run (a lost
            # supervisor's nodes) is cancelled now, while its mark is at hand.
            self._cancel_all(dryrun.spec.name)
        super().schedule(dryrun)

    def _start_supervisor(self, folder: JobFolder, name: str, *, resume: bool = False) -> None:
        """The supervisor as a small allocation of its own (``sbatch``), so that the job lives in
        the cluster, not on the kernel's machine; ``--supervisor-in here`` runs it here, as the
        local backend does."""
        options = SlurmOptions.from_json((folder.spec().get("backend_options") or {}).get("slurm"))
        mark = mark_for_run(folder)  # before anything is submitted: a stop meanwhile finds it
        self._marks[name] = (_job_name(folder), mark)
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
        argv = options.sbatch_supervisor(
            _job_name(folder), str(folder.supervisor_log), command, cluster.comment(mark), minutes=limit
        )
        job_id = cluster.submit(argv, env)
        submitted, granted = time.monotonic(), None
        unknown = 0
        while folder.supervisor() is None:
            state, reason = cluster.job_state(job_id)
            now = time.monotonic()
            unknown = unknown + 1 if not state else 0
            if state == "GONE" or (state and state not in cluster.NOT_ENDED) or unknown > 20:
                cluster.cancel_ids([job_id])
                raise BackendError(
                    f"the supervisor's allocation (Slurm job {job_id}) ended ({state or 'Slurm does not answer'}) "
                    f"before the job started: {_tail(folder.supervisor_log)}"
                )
            if state and state != "PENDING" and granted is None:
                granted = now  # its start is timed from here, not from the wait in the queue
            if (granted is None and now - submitted > SUPERVISOR_WAIT_S) or (
                granted is not None and now - granted > SUPERVISOR_START_TIMEOUT_S
            ):
                cluster.cancel_ids([job_id])
                waits = f"still waits ({reason})" if granted is None else f"did not start the supervisor ({state})"
                raise BackendError(
                    f"the supervisor's allocation (Slurm job {job_id}) {waits} after {now - submitted:.0f} s and was "
                    "cancelled; choose a partition with room (--supervisor-in PARTITION), or run it on this "
                    "machine (--supervisor-in here)"
                )
            time.sleep(0.5 if granted is None else 0.1)

    def _before_resume(self, name: str) -> None:
        """Once nothing of the job's earlier run is left in Slurm (its own allocations, by its
        mark): a supervisor thought lost (on another machine) must not meet its successor. The
        new supervisor then runs as it was launched: in an allocation of its own
        (``_start_supervisor``), or here with ``--supervisor-in here``."""
        self._cancel_all(name, wait_s=LEFTOVERS_WAIT_S)

    def cancel(self, name: str, timeout_s: float = 30.0) -> None:
        """Stop the job as the local backend does, then cancel any allocation of it Slurm still
        holds (a supervisor that never started, a node that waits)."""
        try:
            super().cancel(name, timeout_s)
        finally:
            self._cancel_all(name)

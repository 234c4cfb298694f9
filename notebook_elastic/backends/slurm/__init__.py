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

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ...contract import protocol
from ...contract.event_types import FINAL_STATUSES
from ...contract.protocol import ENV_POOL
from ...errors import BackendError
from ...jobfolder.folder import JobFolder
from ...jobfolder.follow import SUPERVISOR_START_TIMEOUT_S
from ..base import DryRun
from ..local import SUPERVISOR_MODULE, FolderRequest, LocalBackend, _tail
from . import cluster
from .mark import cancel_marked, job_name, mark_for_run, name_in, own_mark
from .options import SlurmOptions

if TYPE_CHECKING:
    from ...contract.spec import JobSpec
    from ...packaging import Bundle

__all__ = ["SlurmBackend"]

#: How long a launch waits for the supervisor's allocation while Slurm keeps it pending.
SUPERVISOR_WAIT_S = 120.0


class SlurmBackend(LocalBackend):
    """A local job folder and supervisor whose nodes are Slurm allocations."""

    name = "slurm"

    def __init__(
        self, home: str | os.PathLike[str] | None = None, *, slurm_state: Callable[[str], str] | None = None
    ) -> None:
        super().__init__(home, slurm_state=slurm_state)
        # The mark of each job this backend ran, kept for the case its folder goes: stop() still
        # finds its allocations (job name -> (allocations' name, mark)).
        self._marks: dict[str, tuple[str, str]] = {}

    def _mark(self, folder: JobFolder, spec: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
        """(the name its allocations are named after, the mark they carry) of the job in
        ``folder`` (``spec``: its spec, where the caller read it), from the folder (or from this
        backend's memory when the folder went); None when it has none of its own (it never ran in
        Slurm with one, or the folder is a copy)."""
        mark = own_mark(folder)
        if mark is not None:
            self._marks[folder.name] = (job_name(folder) if spec is None else name_in(spec, folder), mark)
            return self._marks[folder.name]
        return None if folder.path.exists() else self._marks.get(folder.name)

    def _clear_leftovers(self, folder: JobFolder, spec: Mapping[str, Any] | None, wait_s: float = 0.0) -> None:
        """Cancel every allocation of the job in ``folder`` (only those carrying its mark, from its
        folder or, once the folder is gone, this backend's memory); wait up to ``wait_s`` for them
        to end. Before a resume: a supervisor thought lost (on another machine) must not meet its
        successor, which then runs as it was launched (in an allocation of its own, or here
        with ``--supervisor-in here``). BackendError when Slurm does not answer."""
        marked = self._mark(folder, spec)
        if marked is not None:  # else nothing of its own in Slurm: never cancel by a name alone
            cancel_marked(*marked, wait_s=wait_s)

    def submit_dryrun(self, spec: JobSpec, bundle: Bundle) -> DryRun:
        dry = super().submit_dryrun(spec, bundle)
        options = SlurmOptions.from_json(spec.backend_options.get("slurm"))
        srun = " ".join(options.srun(spec.name, "node-N", spec.nproc_per_node, cluster.comment("<the folder's mark>")))
        try:
            where = f"partition {cluster.check(options)}"
        except Exception as exc:  # a dry-run shows what it would do, and what Slurm would refuse
            where = f"not checked against the cluster: {exc}"
        text = dry.text.replace("local backend:", "slurm backend:", 1)
        text += f"\n  each node is a Slurm allocation ({where}): {srun} <the agent's command above>"
        assert isinstance(dry.request, FolderRequest)  # the local backend's
        return DryRun("slurm", spec, bundle, dataclasses.replace(dry.request, srun=srun), text)

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
        asked = time.time()
        options = SlurmOptions.from_json((folder.spec().get("backend_options") or {}).get("slurm"))
        mark = mark_for_run(folder)  # before anything is submitted: a stop meanwhile finds it
        self._marks[name] = (job_name(folder), mark)
        if options.supervisor_in == "here":
            super()._start_supervisor(folder, name, resume=resume)
            return
        env = dict(os.environ)
        env.pop(ENV_POOL, None)  # no warm pool on the allocation's machine
        env[protocol.ENV_JOB_DIR] = str(folder.path)
        env[protocol.ENV_SLURM_MARK] = mark  # what its nodes carry, whatever its host's view of the folder
        command = [sys.executable, "-m", SUPERVISOR_MODULE]
        command += [*(["--resume"] if resume else []), str(folder.path)]
        known = cluster.partitions()
        limit = known.get(options.supervisor_in or options.partition or next(iter(known), ""))
        argv = options.sbatch_supervisor(
            job_name(folder), str(folder.supervisor_log), command, cluster.comment(mark), minutes=limit
        )
        try:
            job_id = cluster.submit(argv, env)
        except (BackendError, subprocess.TimeoutExpired):
            # sbatch may have ended after Slurm took the job (a stop meanwhile ends the job's
            # processes, sbatch among them; a timeout): whatever carries its mark goes.
            for _ in range(2):  # again a moment later: one registered as this one looked
                cluster.cancel(job_name(folder), mark)
                time.sleep(1.0)
            stopped = self._stopped_since(folder, asked)
            if stopped:
                raise BackendError(
                    f"job {name!r} was {stopped} before its supervisor started; what it had submitted to Slurm "
                    "was cancelled"
                ) from None
            raise
        kept = cluster.job_comment(job_id)
        if kept is not None and kept != cluster.comment(mark):
            cluster.cancel_ids([job_id])
            raise BackendError(
                f"this Slurm cluster replaced the comment of job {name!r}'s supervisor allocation (Slurm job "
                f"{job_id}: {kept!r}); notebook-elastic marks each allocation with it to act on the job's own "
                "only, so it was cancelled and nothing runs; ask the cluster's admins to keep --comment as given"
            )
        submitted, granted = time.monotonic(), None
        unknown = 0
        while folder.supervisor() is None:
            stopped = self._stopped_since(folder, asked)
            if stopped:
                # Stopped (by another kernel, the CLI, the panel) while its allocation waited, or
                # before sbatch had answered (that stop found nothing in Slurm yet).
                done = cluster.cancel_ids([job_id])
                raise BackendError(
                    f"job {name!r} was {stopped} before its supervisor started; its allocation "
                    + (
                        f"(Slurm job {job_id}) was cancelled"
                        if done
                        else f"(Slurm job {job_id}) could not be cancelled, Slurm did not answer: scancel {job_id}"
                    )
                )
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

    @staticmethod
    def _stopped_since(folder: JobFolder, since: float) -> str | None:
        """The job's final status when it was written after ``since`` (a stop while its
        supervisor was being started), else None."""
        status = folder.status() or {}
        final = status.get("status")
        return str(final) if final in FINAL_STATUSES and float(status.get("updated") or 0) >= since else None

    def cancel(self, name: str, timeout_s: float = 30.0) -> None:
        """Stop the job as the local backend does, then cancel any allocation of it Slurm still
        holds (a supervisor that never started, a node that waits)."""
        try:
            super().cancel(name, timeout_s)
        finally:
            self._clear_leftovers(self.folder(name), None)

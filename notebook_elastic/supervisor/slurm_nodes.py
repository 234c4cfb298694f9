"""How the supervisor places a node on Slurm: the agent's command under ``srun`` (its own
allocation), the environment that makes Slurm's SIGTERM a notice, srun's word on a node that
waits, and Slurm's word on why a node's allocation ended.

Slurm signals every process of a step at once and SIGKILLs them ``KillWait`` seconds later
(``GraceTime`` earlier for a preemption): the agent runs under the keeper, which turns that
SIGTERM into a notice (rank 0 saves first); the agent and its workers wait for the keeper's
word (``runtime/term.py``). A node Slurm preempts (or whose time limit is up) is replaced by a
new allocation, which waits in the queue (its reason told) and joins when Slurm grants it: the
job shrinks, trains on, and grows back. A node someone ``scancel``s is a departure the job
does not replace. Either is free: no restart is charged.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..backends.slurm import cluster
from ..backends.slurm.mark import supervisor_mark
from ..backends.slurm.options import SlurmOptions
from ..contract import protocol
from ..contract.event_types import Kind, Pending
from ..contract.protocol import ENV_POOL, KILL_KEY
from ..jobfolder.folder import JobFolder
from .placement import Departure, Placement

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore
    from .nodes import Agent

#: After Slurm was asked to end a node's step at once, how long before its srun is killed too.
SRUN_KILL_AFTER_S = 10.0

#: slurmstepd's line, through srun, for a step Slurm cancelled (and why, where it says).
STEP_CANCELLED = re.compile(r"\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+( DUE TO (PREEMPTION|TIME LIMIT))?")
#: What Slurm sets for the allocation it runs a process in (sbatch's and srun's output
#: variables): a node's srun must not see the supervisor's (or a batch-spawned kernel's), or it
#: would run as a step of that allocation instead of one of its own. The user's own input
#: variables (SLURM_ACCOUNT, SLURM_MPI_TYPE, SRUN_*...) stay.
ALLOCATION_VARS = re.compile(
    r"SLURM_(JOB_\w+|JOBID|STEP_\w+|STEPID|NODELIST|NODEID|NNODES|NTASKS|NPROCS|TASKS_PER_NODE|CPUS_ON_NODE"
    r"|CPUS_PER_TASK|MEM_PER_\w+|PROCID|LOCALID|TASK_PID|GTIDS|SUBMIT_\w+|CLUSTER_NAME|PRIO_PROCESS|NODE_ALIASES"
    r"|LAUNCH_NODE_IPADDR|UMASK|WORKING_CLUSTER|EXPORT_ENV|SCRIPT_CONTEXT|GPUS_ON_NODE|TOPOLOGY_ADDR\w*"
    r"|SRUN_COMM_\w+|DISTRIBUTION|CPU_BIND\w*|OPEN_MODE)|SLURMD_NODENAME"
)
#: srun's line for an allocation Slurm does not grant at once.
SRUN_QUEUED = re.compile(r"srun: job (\d+) queued and waiting for resources")
#: srun's own error, not a task's ("srun: error: HOST: task 0: Exited with exit code 1"): before
#: anything of the node ran, Slurm's reason for refusing its allocation ("Unable to allocate
#: resources: Requested node configuration is not available", "Invalid generic resource...").
SRUN_ERROR = re.compile(r"srun: error: (?!\S+: tasks? [\d,-]+: )(.+)")


class SlurmPlacement(Placement):
    """A node in a Slurm allocation of its own: its agent under srun, reached from other hosts."""

    bind_address = "0.0.0.0"
    warm_spares = False  # none for Slurm's allocations
    pids_here = False  # a pid on another host tells nothing here

    def __init__(self, spec: Any, folder: JobFolder, emit: Callable[..., None]) -> None:
        self.spec = spec
        self.options = SlurmOptions.from_json(spec.backend_options.get("slurm"))
        # Every allocation of this job carries it, and only those are acted on: another job of
        # the same name (another home, another machine) is never touched (mark.py).
        self.mark = supervisor_mark(folder)
        self._emit = emit
        self._grace_s: float | None = None  # the notice Slurm gives: KillWait (+ GraceTime), asked once
        self._cancelled: dict[str, str] = {}  # node -> why slurmstepd said its step was cancelled
        self._errors: dict[str, list[str]] = {}  # node -> srun's errors before anything of it ran
        self._ran: set[str] = set()  # nodes whose step printed a line of its own
        self._killed_at: dict[str, float] = {}  # node -> when Slurm was asked to end its step (monotonic)

    def store_host(self) -> str | None:
        return socket.gethostname()

    def supervisor_pid(self) -> int | None:
        # Under srun an agent's parent is Slurm's step daemon; srun, the supervisor's child,
        # ends the step when it goes.
        return None

    def stop_grace_s(self, base_s: float) -> float:
        # Each node's notice: its keeper waits that long for rank 0's save, and a little more.
        return max(base_s, self.grace_s() + 5.0)

    def kill_rank(self, pid: int, node: str, rank: int, store: KeyStore | None) -> bool:
        """Through the node's keeper (the worker may be on another host, where its pid is not
        ours: notice_keeper.py)."""
        if store is None:  # no store now: the drill cannot reach the node
            return False
        try:
            store.set(KILL_KEY.format(node=node), json.dumps({"pid": pid, "rank": rank}))
        except Exception:  # no store now: the drill cannot reach the node
            return False
        return True

    def notice_s(self) -> float | None:
        return self.grace_s()  # KillWait: the node's keeper turns Slurm's SIGTERM into a notice

    def grace_s(self) -> float:
        if self._grace_s is None:
            self._grace_s = cluster.notice_s()
        return self._grace_s

    def command(self, name: str, command: list[str], env: dict[str, str]) -> list[str]:
        """The agent's command under srun; ``env`` gains what a node on Slurm needs."""
        # Its workers are started inside its own allocation, never forked by a warm pool on the
        # machine the job was launched from (outside Slurm's accounting and limits).
        env.pop(ENV_POOL, None)
        # Its own allocation, even from within the supervisor's: srun must not see that one.
        for key in [k for k in env if ALLOCATION_VARS.fullmatch(k)]:
            del env[key]
        env[protocol.ENV_TERM_TO_ALL] = "1"
        env[protocol.ENV_NOTICE_GRACE_S] = f"{self.grace_s():g}"
        srun = self.options.srun(self.spec.name, name, self.spec.nproc_per_node, cluster.comment(self.mark))
        return [*srun, *command]

    def says(self, node: str, line: str) -> None:
        """srun's own word on a node's allocation: waiting (with squeue's reason), as a pending
        node; its step cancelled (by scancel, a preemption, or the supervisor itself)."""
        if node not in self._ran:
            error = SRUN_ERROR.match(line.strip())
            if error:
                self._errors.setdefault(node, []).append(error.group(1).strip())
            elif line.strip() and not line.startswith(("srun:", "slurmstepd")):
                self._ran.add(node)
        cancelled = STEP_CANCELLED.search(line)
        if cancelled:
            why = {"PREEMPTION": "preempted", "TIME LIMIT": "timeout"}.get(cancelled.group(2) or "", "cancelled")
            self._cancelled[node] = why
        m = SRUN_QUEUED.match(line)
        if m:
            reason = cluster.pending_reason(m.group(1)) or "Resources"
            self._emit(Kind.PENDING, node, **Pending(reason=reason, message=f"Slurm job {m.group(1)} waits ({reason})"))

    def refused(self, node: str) -> str | None:
        """Slurm's sentence when it refused the node's allocation (srun said why and ended
        before anything of the node ran), else None."""
        errors = self._errors.get(node)
        if node in self._ran or not errors:
            return None
        return "; ".join(dict.fromkeys(errors))

    def term(self, agent: Agent) -> None:
        """Stop a node as Slurm itself would (scale-down, a drill, stop): SIGTERM to every process
        of its step, which the keeper turns into a notice (a save first); a node still waiting for
        its allocation is cancelled. (srun, signalled, would kill the step outright.)"""
        name = f"ne-{self.spec.name}-{agent.name}"
        cluster.signal_node(name, self.mark, None, state="PENDING")  # first: one granted meanwhile is signalled next
        cluster.signal_node(name, self.mark, "TERM", state="RUNNING")

    def kill(self, agent: Agent) -> None:
        """End every process of the node's step at once (a lost node, a stop past its grace).
        Slurm turns ``scancel --signal=KILL`` into a cancel (SIGTERM, and SIGKILL after
        KillWait: a notice), and killing srun leaves the step to that same path; SIGUSR2,
        which none of the node's processes handles but the keeper, which passes it on, ends
        each at once, as SIGKILL would. A node still waiting for its allocation is cancelled.
        Its processes are in Slurm's step, not under srun (killed, srun would leave them to
        Slurm's KillWait): Slurm ends them, and srun with them; srun is killed only if it is
        still there ``SRUN_KILL_AFTER_S`` later (asked again until then, nothing is done)."""
        asked = self._killed_at.get(agent.name)
        if asked is None:
            self._killed_at[agent.name] = time.monotonic()
            name = f"ne-{self.spec.name}-{agent.name}"
            cluster.signal_node(name, self.mark, "USR2", state="RUNNING")
            cluster.signal_node(name, self.mark, None, state="PENDING")
        elif time.monotonic() - asked > SRUN_KILL_AFTER_S:
            super().kill(agent)

    def why_ended(self, node: str) -> str | None:
        """Why Slurm ended a node's allocation: "preempted" (a higher-priority job took it),
        "timeout" (its --time is up), "cancelled" (scancel), "node_fail"; None when Slurm did
        not end it (the agent ended by itself) or cannot say."""
        why = cluster.ended_why(f"ne-{self.spec.name}-{node}", self.mark, wait_s=3.0)
        return why or self._cancelled.get(node)

    def departure(self, node: str) -> Departure | None:
        """Slurm took the node: preempted or out of time, a new allocation takes its place (it
        waits in the queue until Slurm gives the node back); cancelled, failed, or refused (its
        allocation never granted: Slurm's own sentence), it is not replaced. Either is a
        departure, free of the restart budget."""
        refused = self.refused(node)
        if refused is not None:
            # Slurm's own sentence, in the node's departure and so in the timeline.
            return Departure(f"refused by Slurm: {refused}", lower="refused by Slurm")
        why = self.why_ended(node)
        if why in ("preempted", "timeout"):
            return Departure("preempted by Slurm" if why == "preempted" else "its Slurm time limit was up")
        if why in ("cancelled", "node_fail"):
            return Departure("cancelled in Slurm" if why == "cancelled" else "its Slurm node failed", lower=why)
        return None

    def gone(self, node: str, withdraw_notice: Callable[[], None]) -> None:
        """A node reaped: the notice its keeper posted comes down (it may have had no time to),
        and whatever Slurm still holds under its name (its srun was killed, and with
        InactiveLimit=0 the allocation would outlive it) is cancelled."""
        withdraw_notice()
        cluster.signal_node(f"ne-{self.spec.name}-{node}", self.mark, None)

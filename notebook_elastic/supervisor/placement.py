"""Where a node runs: the one collaborator the supervisor asks about a node's place, so that no
part of it branches on the backend (#38 item 2).

``Placement`` is a node on this machine: its agent a child of the supervisor (forked by the warm
pool where there is one, or started from a warm spare), signalled directly, dying with the
supervisor. ``SlurmPlacement`` (``slurm_nodes.py``) is a node in a Slurm allocation of its own:
its agent under ``srun``, signalled through Slurm, its departures explained by Slurm.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import pool

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore
    from .nodes import Agent


@dataclass(frozen=True)
class Departure:
    """Why a node's place ended it, when the place knows (Slurm: a preemption, a cancel): the
    reason told in its ``node_left``, and whether it is replaced (``lower`` names why not)."""

    reason: str
    lower: str | None = None  # not replaced: the target drops, for this reason


class Placement:
    """A node on this machine (the local backend)."""

    #: Where the store and the control channel listen (agents and kernels reach them there).
    bind_address = "127.0.0.1"
    #: A standby agent kept warm for the next scale-up (it saves its torch import).
    warm_spares = True
    #: A worker's pid names a process on this machine (a stall is diagnosed from it).
    pids_here = True

    def store_host(self) -> str | None:
        """The host name the agents reach the store at (None: loopback)."""
        return None

    def supervisor_pid(self) -> int | None:
        """The process an agent dies with (its parent-death signal): this supervisor."""
        return os.getpid()

    def command(self, name: str, command: list[str], env: dict[str, str]) -> list[str]:
        """The command that starts node ``name``'s agent; ``env`` may gain what the place needs.
        Forked by the warm pool when there is one: a light launcher stands in for the agent."""
        return pool.through_pool(command, env) or command

    def says(self, node: str, line: str) -> None:
        """A line of the node's output, for what the place itself says in it (nothing here)."""

    def term(self, agent: Agent) -> None:
        """Stop the node on purpose (scale-down, a drill, stop): SIGTERM to its agent, which
        stops its workers (in place: at a step boundary) and leaves its round."""
        agent.proc.send_signal(signal.SIGTERM)

    def notice_s(self) -> float | None:
        """The notice a node's SIGTERM gives it here, where its keeper turns SIGTERM into one (rank
        0 saves first); None where the agent acts on it at once (here)."""
        return None

    def kill(self, agent: Agent) -> None:
        """End the node at once (a lost node, a stop past its grace): its whole process group."""
        os.killpg(agent.proc.pid, signal.SIGKILL)

    def departure(self, node: str) -> Departure | None:
        """Why the place ended a node that ended on its own (None: it did not; a lost node)."""
        return None

    def gone(self, node: str, withdraw_notice: Callable[[], None]) -> None:
        """A node reaped: whatever the place still holds of it is let go."""

    def stop_grace_s(self, base_s: float) -> float:
        """How long stopping nodes may take before they are killed."""
        return base_s

    def kill_rank(self, pid: int, node: str, rank: int, store: KeyStore | None) -> bool:
        """SIGKILL one rank's process (the kill-a-worker drill); False when it is gone."""
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

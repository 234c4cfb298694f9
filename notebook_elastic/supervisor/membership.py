"""The supervisor's course as a state machine (#38 item 1): the job's membership is one typed
value (``Membership``: how many nodes it runs, in what range, in which rendezvous epoch, when
preempted capacity comes back), each change of it a named transition that makes a new value
(``scaled``, ``ranged``, ``lowered``, ``returning``, ``returned``); the supervisor's life is a
``Phase`` (starting, running, stopping, ended); and how a job ends is a function of what is
left of it (``ending``), not of the loop that asks. torch's rendezvous is the model
(``_RendezvousState`` and its small operations).

    STARTING --store hosted--> RUNNING --stop (request, SIGTERM, a fatal failure, files changed)--> STOPPING
       RUNNING or STOPPING --no agent left (ending() says how)--> ENDED

A transition never signals a process: the parts that do (``Nodes``, ``Commands``) take the new
value and act on the difference. ``Course`` holds the current value and phase: the one place the
parts read them and change them (each part is handed it, not the supervisor).
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from ..contract.event_types import Kind, Scaled
from ..contract.spec import out_of_range

#: A folder deleted under the job: no checkpoint or record can be written any more.
DELETED = "deleted"


class Phase(Enum):
    STARTING = "starting"  # the store is not hosted yet
    RUNNING = "running"
    STOPPING = "stopping"  # told to stop: every node is going; those left at the deadline are killed
    ENDED = "ended"  # the outcome is written; the control channel is closed


@dataclass(frozen=True)
class Membership:
    """How many nodes the job runs (``target``), within ``range``, in rendezvous ``epoch`` (new
    agents, a new epoch: torchrun bakes the range into every agent), and the monotonic times at
    which preempted capacity comes back (``returns``, sorted)."""

    target: int
    range: tuple[int, int]
    epoch: int = 0
    returns: tuple[float, ...] = ()

    @property
    def min_nodes(self) -> int:
        return self.range[0]

    @property
    def max_nodes(self) -> int:
        return self.range[1]

    def scaled(self, nodes: int) -> Membership:
        """Run ``nodes`` nodes (``ValueError``, one sentence, outside the range)."""
        lo, hi = self.range
        if not lo <= nodes <= hi:
            raise ValueError(out_of_range(nodes, lo, hi))
        return dataclasses.replace(self, target=nodes)

    def ranged(self, min_nodes: int, max_nodes: int) -> Membership:
        """A new range: the target kept inside it, and a new epoch (its agents are new)."""
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"range {min_nodes}:{max_nodes} is invalid: need 1 <= MIN <= MAX")
        target = min(max(self.target, min_nodes), max_nodes)
        return dataclasses.replace(self, range=(min_nodes, max_nodes), target=target, epoch=self.epoch + 1)

    def resumed_at(self, min_nodes: int, max_nodes: int, target: int | None) -> Membership:
        """A resumed run goes on with the range and size its run was left at (the slider,
        scale()), not the spec's first ones (#39 item 3); the epoch is the run's own."""
        if not 1 <= min_nodes <= max_nodes:
            return self
        return dataclasses.replace(
            self, range=(min_nodes, max_nodes), target=min(max(target or min_nodes, min_nodes), max_nodes)
        )

    def lowered(self) -> Membership:
        """A node taken away that is not replaced (lost, cancelled, evicted): one node fewer."""
        return dataclasses.replace(self, target=max(0, self.target - 1))

    def returning(self, at: float) -> Membership:
        """Preempted capacity that comes back at (monotonic) ``at``."""
        returns = list(self.returns)
        bisect.insort(returns, at)
        return dataclasses.replace(self, returns=tuple(returns))

    def returned(self, now: float) -> Membership | None:
        """The next capacity due by ``now`` back: a node more, up to the range's top (None:
        none is due)."""
        if not self.returns or self.returns[0] > now:
            return None
        return dataclasses.replace(self, target=min(self.target + 1, self.range[1]), returns=self.returns[1:])

    @property
    def waits_for_capacity(self) -> bool:
        """Whether preempted capacity is still to come back (a job with no node left waits)."""
        return bool(self.returns)


class Course:
    """The job's course as the supervisor's parts share it: the membership (replaced by its
    transitions; those that are not a reconfiguration announce themselves in a ``scaled``
    event here), the phase, and why the job stops when nobody asked it to (a failure no retry
    mends, files changed under it). The sink's thread sets ``fatal``; the main loop the rest."""

    def __init__(self, membership: Membership, emit: Callable[..., None]) -> None:
        self.membership = membership
        self.phase = Phase.STARTING
        self.stop_deadline: float | None = None  # stopping: when the nodes left are killed (monotonic)
        self.fatal: str | None = None  # why the job stops now, when retrying is pointless
        self.fatal_node: str | None = None  # whose agent ends on its own (its worker exited EXIT_FATAL)
        self.files_reason: str | None = None  # set once a changed file stopped the job
        self._emit = emit

    @property
    def stopping(self) -> bool:
        """Told to stop (a request, SIGTERM, a failure no retry mends): every node is going."""
        return self.phase is Phase.STOPPING

    def stop(self, grace_s: float) -> bool:
        """Into the stopping phase (False: already there); the nodes left after ``grace_s`` are killed."""
        if self.phase is Phase.STOPPING:
            return False
        self.phase = Phase.STOPPING
        self.stop_deadline = time.monotonic() + grace_s
        return True

    def scale(self, nodes: int) -> Membership:
        """The job runs ``nodes`` nodes from now on (``ValueError`` outside its range)."""
        self.membership = scaled = self.membership.scaled(nodes)
        self._emit(Kind.SCALED, **Scaled(target=nodes, min_nodes=scaled.min_nodes, max_nodes=scaled.max_nodes))
        return scaled

    def lower(self, node: str, reason: str) -> Membership:
        """A node taken away is not replaced: the target says so, in an event of its own, so
        every view of the target (the dashboard's nodes box, the panel) follows."""
        self.membership = lowered = self.membership.lowered()
        self._emit(
            Kind.SCALED,
            node,
            **Scaled(target=lowered.target, min_nodes=lowered.min_nodes, max_nodes=lowered.max_nodes, reason=reason),
        )
        return lowered

    def take_back(self, now: float) -> None:
        """Preempted capacity due by ``now`` comes back, a node more each (none while stopping)."""
        while not self.stopping and (back := self.membership.returned(now)) is not None:
            self.membership = back
            self._emit(
                Kind.SCALED,
                **Scaled(target=back.target, min_nodes=back.min_nodes, max_nodes=back.max_nodes, returned=True),
            )


def ending(
    phase: Phase,
    exit_codes: Iterable[int | None],
    *,
    folder: str | None,
    files_changed: str | None,
    fatal: str | None,
    waits_for_capacity: bool,
) -> tuple[str, str | None] | None:
    """How the job ends once no agent of it is left (``exit_codes``: theirs), or None while it
    goes on (capacity comes back later). ``folder`` is ``DELETED`` when the job folder went.
    The first that holds decides: the folder gone, files changed, a failure no retry mends, a
    stop asked for, a node that finished its work, a job waiting for capacity; else it failed
    (the caller says how: ``failure_reason``)."""
    if folder == DELETED:
        return "lost", None
    if files_changed is not None:
        return "failed", files_changed
    if fatal:
        return "failed", fatal
    if phase == Phase.STOPPING:
        return "stopped", "stopped on request"
    if any(code == 0 for code in exit_codes):
        return "succeeded", None
    if waits_for_capacity:
        return None
    return "failed", None

"""What each kind of event does to a job's state: ``Fold`` holds the ``JobState`` it folds
into and has one ``_on_<kind>`` method per kind, each assigning the state's attributes.
``JobState._apply`` calls ``Fold.apply`` (a kind without a method is only kept in the history).

Each method reads its event as its kind's class of the event contract (``e.fields(Stall)``),
so the type checker holds every key it reads to that class. Keys are read with ``.get`` and a
default, required ones too: a worker may send anything, and an event missing a field is folded
as far as it goes rather than dropped at the first (``JobState.apply`` drops what raises)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

from ...agent.notice_keeper import LEAVE_S
from ..event_types import (
    Checkpoint,
    CheckpointFailed,
    Degraded,
    DiskFull,
    Gpu,
    InPlace,
    JobFinished,
    JobResumed,
    JobSubmitted,
    NodeJoined,
    NodeLeft,
    Plan,
    Queue,
    Recovering,
    Regrouped,
    Rendezvous,
    Restart,
    Resumed,
    Scaled,
    Stall,
    Status,
    Tracking,
    WorkerExited,
    WorkerFailed,
    WorkerStarted,
)
from ..events import Event, degraded_text, describe, steps_done
from .records import Marker, NodeInfo, RankInfo

#: Beside the agent's leave, a pod's grace keeps this for a step in flight when the notice comes
#: (the least --grace, LEAVE_S + 2, leaves a second for a save).
SAVE_MARGIN_S = 1.0

if TYPE_CHECKING:
    from . import JobState


def quiet_departure(reason: str | None) -> bool:
    """A node that left because the job was done or told to stop: no disruption, so no
    marker on the chart and no line in the timeline (a clean run looked disrupted, #39 item 5)."""
    return reason == "finished" or str(reason or "").startswith("stopped")


class Fold:
    """The fold's per-kind steps, applied to ``state``."""

    def __init__(self, state: JobState) -> None:
        self.state = state
        # The world-size marker of the newest group, until that group's resume says the step it
        # starts from (the marker is first placed at the last step reported before the change).
        self._size_marker: int | None = None
        # A node left because the job is being stopped: the others go too, and what they say on
        # their way (a peer vanished, restarting) is no restart (their SIGTERMs land one by one).
        self._stopping = False
        # Nodes whose agent restarts its workers, until one of them starts again: a change in
        # place is a restart for none of the others only while this is empty (``_on_regrouped``).
        self._restarting: set[str] = set()

    def apply(self, e: Event) -> None:
        """Do what ``e``'s kind does to the state; a kind without an ``_on_<kind>`` does nothing."""
        handler = getattr(self, f"_on_{e.kind}", None)
        if handler is not None:
            handler(e)

    def _mark(self, e: Event, kind: str, label: str, step: int | None = None) -> None:
        self.state.markers.append(Marker(self.state.step if step is None else step, e.time, kind, label))

    def _node(self, name: str | None) -> NodeInfo:
        name = name or "?"
        node = self.state.nodes.get(name)
        if node is None:
            node = self.state.nodes[name] = NodeInfo(name)
        return node

    def _on_job_submitted(self, e: Event) -> None:
        d = e.fields(JobSubmitted)
        self._take_size(e, d)
        self.state.grace_s = d.get("grace_s", self.state.grace_s)

    def _take_size(self, e: Event, d: JobSubmitted | JobResumed) -> None:
        """What a job's first event and each resume's both say: its size, budget and GPUs."""
        self.state.started_at = self.state.started_at or e.time
        self.state.max_restarts = d.get("max_restarts", self.state.max_restarts)
        self.state.nnodes = (d.get("min_nodes", self.state.nnodes[0]), d.get("max_nodes", self.state.nnodes[1]))
        self.state.target = d.get("nodes", self.state.target)
        self.state.nproc_per_node = d.get("nproc_per_node")
        self.state.gpus = d.get("gpus") or 0

    def _on_recovering(self, e: Event) -> None:
        self.state.status = Status.RECOVERING
        self.state.reason = e.fields(Recovering).get("reason")

    def _on_job_resumed(self, e: Event) -> None:
        """The same job, continued in its folder: its history stays, its outcome does not."""
        self.state.status = Status.PENDING
        self.state.reason = None
        self.state.finished_at = None
        self._stopping = False
        self.state.waiting = None
        self.state.restarts = 0  # the budget starts again, as the event says
        self.state.resumes += 1
        self.state.failures.clear()
        for node in self.state.nodes.values():
            node.restart_count = 0
        self._mark(e, "resumed", "job resumed")
        self._take_size(e, e.fields(JobResumed))  # the grace stays: only job_submitted tells it

    def _on_stall(self, e: Event) -> None:
        self.state.stall = e.fields(Stall).copy()
        self._mark(e, "stall", f"stalled at step {steps_done(e.fields(Stall).get('step'))}")

    def _on_stall_cleared(self, e: Event) -> None:
        self.state.stall = None

    def _on_scaled(self, e: Event) -> None:
        d = e.fields(Scaled)
        self.state.target = d.get("target", self.state.target)
        self.state.nnodes = (d.get("min_nodes", self.state.nnodes[0]), d.get("max_nodes", self.state.nnodes[1]))

    def _on_node_joined(self, e: Event) -> None:
        self.state.waiting, self.state.waiting_node = None, None
        node = self._node(e.node)
        node.status = "starting"
        node.agent_pid = e.fields(NodeJoined).get("pid")
        node.joined_at = e.time
        node.left_reason = None
        node.left_at = None
        node.ranks.clear()
        self._mark(e, "node_joined", f"{node.name} joined")

    def _on_pending(self, e: Event) -> None:
        if e.node is None:  # about the job, not a node (its controller cannot create a pod)
            self.state.waiting, self.state.waiting_node = describe(e), None
            return
        node = self._node(e.node)
        node.status = "pending"
        # Why it waits (squeue's reason, the scheduler's message) shows where the job's wait does:
        # the dashboard, the panel, the CLI; until that node starts or goes. A wait of the job's
        # own (Kueue's quota, a pod that cannot be created) says more, and stays.
        if self.state.waiting is None or self.state.waiting_node is not None:
            self.state.waiting, self.state.waiting_node = describe(e), node.name

    def _node_came_or_went(self, e: Event) -> None:
        if self.state.waiting_node is not None and self.state.waiting_node == e.node:
            self.state.waiting, self.state.waiting_node = None, None

    def _on_agent_started(self, e: Event) -> None:
        self._node_came_or_went(e)

    def _on_queue(self, e: Event) -> None:
        """Kueue's word on the job: while it waits for quota (or, evicted, waits again) that
        is why it is not training; a scale-up's slice that waits leaves the job running."""
        d = e.fields(Queue)
        queue_state = d.get("state")
        if queue_state == "admitted":
            self.state.waiting = None
            self.state.held_by_queue = False
            self._mark(e, "admitted", f"admitted by Kueue ({d.get('cluster_queue') or d.get('queue')})")
            return
        self.state.waiting = describe(e)
        if queue_state == "evicted":
            self.state.held_by_queue = True
            if not self.state.finished:
                self.state.status = Status.PENDING
            self._mark(e, "preempted", f"preempted by Kueue ({d.get('reason') or 'evicted'})")

    def _on_node_left(self, e: Event) -> None:
        self._node_came_or_went(e)
        d = e.fields(NodeLeft)
        node = self._node(e.node)
        self._restarting.discard(node.name)  # gone: it restarts nothing any more
        in_the_running_group = bool(node.ranks)  # cleared when a group without it started
        node.status = "left"
        node.left_reason = d.get("reason")
        node.left_at = e.time
        if not quiet_departure(d.get("reason")):  # the timeline tells these not either (#39 item 5)
            self._mark(e, "node_left", f"{node.name} left ({node.left_reason})")
        if str(d.get("reason") or "").startswith("stopped"):
            self._stopping = True
        # A node stopped with the job or done with its work is no reason to regroup, and neither
        # is one with no rank in the group now training (a joiner, or a departure the survivors
        # already regrouped without: a loaded supervisor may tell node_left after their restart).
        if (
            not self.state.finished
            and not self._stopping
            and d.get("reason") != "finished"
            and self.state.status == Status.RUNNING
            and in_the_running_group
        ):
            self.state.status = Status.RESTARTING

    def _on_rendezvous(self, e: Event) -> None:
        self._node_came_or_went(e)
        d = e.fields(Rendezvous)
        node = self._node(e.node)
        node.group_rank = d.get("group_rank")
        if node.status not in ("left",):
            node.status = "starting"
        self.state.round = d.get("round")

    def _on_regrouped(self, e: Event) -> None:
        """A node's agent formed the new round and kept its workers: in place, nothing restarts.
        Where no node restarts its workers in this change either, the job is running again (its
        kept workers re-form at once): "restarting" until the first of them said so kept the
        stall watcher off, and a survivor stuck in the old group's last collective held the job
        for gloo's 120 s with no word of it, the stall timeout set or not (an adversary's pass)."""
        if e.fields(Regrouped).get("kept") and not self._restarting and not self._stopping:
            if not self.state.finished and self.state.status == Status.RESTARTING:
                self.state.status = Status.RUNNING

    def _on_restart(self, e: Event) -> None:
        d = e.fields(Restart)
        node = self._node(e.node)
        if d.get("reason") == "worker_failed":
            node.restart_count = max(node.restart_count, int(d.get("restarts_used", 0)))
            if node.restart_count > self.state.restarts:
                self.state.restarts = node.restart_count
                self._mark(e, "restart", f"restart {self.state.restarts}/{self.state.max_restarts}")
        else:
            self.state.membership_changes += 1
        if self._before_its_group(node, d.get("written")):
            return  # counted and kept, but the restart it announced is over
        if self._stopping and d.get("reason") != "worker_failed":
            return  # a peer stopped with the job: the group ends, it does not regroup
        if self._outside_the_group(node):
            return  # its own restart, outside the group training
        node.status = "restarting"
        self._restarting.add(node.name)
        if not self.state.finished:
            self.state.status = Status.RESTARTING

    @staticmethod
    def _before_its_group(node: NodeInfo, written: float | None) -> bool:
        """Whether an agent's line about its group (an exit, a restart), ``written`` at that
        time (the agent's own clock: local agents; read times cannot tell), was written before
        the node's ranks now training started: read late (another pipe than its workers' lines,
        another reader thread), it tells of the group replaced, not of the one training."""
        if not isinstance(written, (int, float)):  # unvalidated: whatever the line held
            return False
        return any(r.started_at is not None and r.started_at > written for r in node.ranks.values())

    def _on_gpu(self, e: Event) -> None:
        d = e.fields(Gpu)
        rank = int(d.get("rank", 0))
        figures = {
            "rank": rank,  # first, as the listings have always shown it
            "device": d.get("device"),
            "mem_peak_bytes": d.get("mem_peak_bytes"),
            "mem_total_bytes": d.get("mem_total_bytes"),
            "util_percent": d.get("util_percent"),
        }
        # What the worker sent, its figures that are there (a worker may send anything: the
        # listings check what they show).
        self.state.gpu[rank] = cast(Gpu, {k: v for k, v in figures.items() if v is not None})

    def _on_worker_started(self, e: Event) -> None:
        d = e.fields(WorkerStarted)
        node = self._node(e.sender)
        generation = d.get("generation")
        if generation is not None and self.state.generation is not None and generation < self.state.generation:
            return  # a late line from a superseded group
        self._restarting.discard(node.name)
        if generation != self.state.generation:
            # A new worker group: drop ranks of the previous one everywhere.
            for other in self.state.nodes.values():
                other.ranks.clear()
            self.state.generation = generation
        rank = int(d.get("rank", 0))
        node.ranks[rank] = RankInfo(
            rank, int(d.get("local_rank", 0)), d.get("pid"), int(d.get("restart_count", 0)), generation, e.time
        )
        node.status = "running"
        node.restart_count = max(node.restart_count, int(d.get("restart_count", 0)))
        world = int(d.get("world_size", 1))
        if world != self.state.world_size:
            if self.state.world_size:
                self._mark(e, "world_size", f"world size {self.state.world_size} \u2192 {world}")
                self._size_marker = len(self.state.markers) - 1
            self.state.world_size = world
        if self.state.started_at is None:
            self.state.started_at = e.time
        if not self.state.finished:
            self.state.status = Status.RUNNING

    def _on_worker_failed(self, e: Event) -> None:
        d = e.fields(WorkerFailed)
        if d.get("cause") == "peer":  # its collective broke because a peer left: a symptom
            if not self.state.finished:
                self.state.status = Status.RESTARTING
            return
        self.state.failures.append(e)
        failures = self.state.failures
        if len(failures) == 1 or failures[-2].fields(WorkerFailed).get("generation") != d.get("generation"):
            self._mark(e, "failure", f"rank {d.get('rank')} failed: {d.get('error')}")
        if not self.state.finished:
            self.state.status = Status.RESTARTING

    def _on_peer_lost(self, e: Event) -> None:
        if self._outside_the_group(self._node(e.node)):
            return
        if not self.state.finished:
            self.state.status = Status.RESTARTING

    def _outside_the_group(self, node: NodeInfo) -> bool:
        """Whether ``node`` has no rank in the group now training while another node has: a node
        the survivors regrouped without (in place, its departure is over for them), whose agent
        then sees the members of its old round vanish. What it says is its own end, not the
        job's: the job stays running (under load the panel stayed "restarting" for good while
        the survivors trained on in place)."""
        return (
            self.state.status == Status.RUNNING and not node.ranks and any(n.ranks for n in self.state.nodes.values())
        )

    def _on_worker_exited(self, e: Event) -> None:
        node = self.state.nodes.get(e.node) if e.node else None
        if node is not None and self._before_its_group(node, e.fields(WorkerExited).get("written")):
            return
        if not self.state.finished and self.state.status == Status.RUNNING:
            self.state.status = Status.RESTARTING

    def _on_plan(self, e: Event) -> None:
        self.state.total_steps = e.fields(Plan).get("total")

    def _on_resumed(self, e: Event) -> None:
        """Marked where training goes on: the checkpoint's next step, which is behind the last
        step reported when the group saved less often than it reported. A world-size change
        takes effect there too: its marker moves from the last step of the old size."""
        d = e.fields(Resumed)
        step = d.get("step")
        self._mark(e, "resumed", f"resumed from step {step}", step=step)
        generation = d.get("generation")
        if self._size_marker is not None and step is not None and generation in (None, self.state.generation):
            old = self.state.markers[self._size_marker]
            self.state.markers[self._size_marker] = Marker(step, old.time, old.kind, old.label)
            self._size_marker = None

    def _on_in_place(self, e: Event) -> None:
        """The members changed and the kept workers did not restart: a membership change, not a
        restart (the budget is untouched). The world-size marker moves to the step the new
        group trains from, and says so."""
        d = e.fields(InPlace)
        self._restarting.clear()  # the change is over: its new group trains
        self.state.membership_changes += 1
        self.state.in_place_changes += 1
        step = d.get("step")
        if self._size_marker is not None and step is not None:
            old = self.state.markers[self._size_marker]
            self.state.markers[self._size_marker] = Marker(step, old.time, old.kind, f"{old.label} in place")
            self._size_marker = None
        if not self.state.finished:
            self.state.status = Status.RUNNING

    def _on_checkpoint_failed(self, e: Event) -> None:
        d = e.fields(CheckpointFailed)
        if d.get("final"):  # stays: the job ends without its last step saved
            self.state.warning = describe(e)
        elif d.get("disk_full"):
            self.state.warning = (
                f"checkpoints are not being saved: {d.get('folder') or 'the checkpoint disk'} is full; "
                f"training goes on and saving is tried again every {d.get('retry_s', 30):.0f} s"
            )

    def _on_disk_full(self, e: Event) -> None:
        self.state.warning = e.fields(DiskFull).get("message")

    def _on_tracking(self, e: Event) -> None:
        where = e.fields(Tracking)
        self.state.tracking[str(where.get("tracker"))] = where.copy()

    def _on_degraded(self, e: Event) -> None:
        self.state.warning = degraded_text(e.fields(Degraded))

    def _on_checkpoint(self, e: Event) -> None:
        if self.state.warning and self.state.warning.startswith("checkpoints are not being saved"):
            self.state.warning = None
        d = e.fields(Checkpoint)
        self.state.saving.saves += int(d.get("commits") or 1)
        if d.get("blocked_pct") is not None:
            self.state.checkpointing = {
                "every": d.get("every"),
                "chosen": d.get("chosen"),
                "blocked_pct": d.get("blocked_pct"),
            }
        step = d.get("step")
        if isinstance(step, int) and (self.state.step is None or step - 1 > self.state.step):
            self.state._saw_step(step - 1, e.time)  # the state's, shared with its metric fold
        self._check_grace(d)

    def _check_grace(self, d: Checkpoint) -> None:
        """Kubernetes: a pod's grace (--grace) must hold a save on notice; once a save is
        measured longer than that allows, say what grace would (the pods' is fixed at launch).
        The room for a save is the grace less the agent's leave and a second's margin (a
        step in flight): the one the check and the sentence both use (#37: the sentence
        said a room one second longer than the check's, "1.5 s, more than ... (2 s)")."""
        save_s = (d.get("ms") or 0) / 1000
        grace_s = self.state.grace_s
        if not grace_s or self.state.warning:
            return
        room_s = grace_s - LEAVE_S - SAVE_MARGIN_S
        if save_s <= room_s:
            return
        enough = math.ceil(save_s * 1.5 + LEAVE_S + 2)
        leaves = (
            f"leaves for a save on notice ({room_s:g} s)"
            if room_s > 0
            else f"leaves no time for a save on notice (its agent needs {LEAVE_S:g} s to leave)"
        )
        self.state.warning = (
            f"a save takes {_above(save_s, room_s)} s, more than a pod's grace of {grace_s:g} s (--grace) {leaves}: "
            f"a reclaim will cost the steps since the last save; relaunch with --grace {enough} or more"
        )

    def _on_job_finished(self, e: Event) -> None:
        d = e.fields(JobFinished)
        self.state.status = d.get("status", Status.FAILED)
        self.state.reason = d.get("reason")
        self.state.finished_at = e.time
        for node in self.state.nodes.values():
            if node.status != "left":
                node.status = "left"
                node.left_reason = node.left_reason or "finished"


def _above(seconds: float, bound: float) -> str:
    """``seconds`` with the fewest decimals (one at least) that still read above ``bound``:
    1.04 s over a room of 1 s is "1.04", not "1.0"."""
    for decimals in range(1, 7):
        text = f"{seconds:.{decimals}f}"
        if float(text) > bound:
            return text
    return repr(seconds)

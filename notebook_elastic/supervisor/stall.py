"""Stall watching: a running job whose step has not moved for long enough is stalled; the
supervisor says which ranks stopped and which wait, and with ``--stall-timeout`` restarts
the group. Held by the ``Supervisor``, which calls ``watch`` on each turn of its loop; handed the
folded state (under the sink's lock), where each rank's process is, and a way to kill one."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from .. import defaults
from ..contract.event_types import Kind, Stall, StallCleared, SupervisorFrozen
from ..contract.job_state import JobState
from ..contract.spec import JobSpec
from ..plumbing.procfs import is_stopped
from .nodes import Workers
from .placement import Placement
from .sink import EventSink


@dataclass
class StallClock:
    """When the job last made progress, and what was said about a stall since."""

    step: int | None = None
    since: float = 0.0  # monotonic time of the last progress (or of the group's start)
    step_s: list[float] = field(default_factory=list)  # recent seconds per step, for the median
    announced: bool = False
    restarted: bool = False
    tick: float | None = None  # monotonic time of the supervisor's previous look


#: A gap this long between two turns of the supervisor's loop (it turns every 0.05 s) is a
#: freeze of its own (SIGSTOP, a laptop's suspend, a machine that stopped scheduling it), not
#: the job's: the workers trained on meanwhile, their reports wait unread in the pipes.
FROZEN_S = 5.0


class Stalls:
    """Watches the job's step for a stall (called from the supervisor's main loop)."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        sink: EventSink,
        state: JobState,
        emit: Callable[..., None],
        workers: Workers,
        placement: Placement,
        kill_rank: Callable[[int], bool],
    ) -> None:
        self.spec = spec
        self.sink = sink
        self.state = state  # read under the sink's lock: the sink's thread folds into it
        self.emit = emit
        self.workers = workers
        self.placement = placement
        self.kill_rank = kill_rank  # SIGKILL a rank's process (Commands.kill_rank)
        self.stall_after_s = float(spec.backend_options.get("stall_after_s", defaults.STALL_AFTER_S))
        self.clock = StallClock(since=time.monotonic())
        # Every worker process said started, by pid: its newest rank. A worker kept in place says
        # its rank in the new group only once it is in it; until then the workers map (the
        # newest group's) has the new ranks alone.
        self._seen: dict[int, int] = {}

    def started(self, pid: int, rank: int) -> None:
        self._seen[pid] = rank

    def watch(self, now: float) -> None:
        """A running job whose step has not moved for max(stall_after_s, 10 x the median step
        time) is stalled (a SIGSTOPped rank, a hung collective, a stuck filesystem look the
        same): say which ranks stopped and which wait; with --stall-timeout, restart the group."""
        with self.sink.lock:
            step, status = self.state.step, self.state.status
        clock = self.clock
        last, clock.tick = clock.tick, now
        if last is not None and now - last >= FROZEN_S:
            # Not the job's stall: ours. What the ranks did meanwhile is still being read, so
            # the stall clock starts again (neither a "stalled" event nor a restart for it).
            self.emit(Kind.SUPERVISOR_FROZEN, **SupervisorFrozen(for_s=round(now - last, 1), step=step))
            clock.since = now
            return
        if step != clock.step or status != "running":
            if clock.announced and status == "running":
                self.emit(Kind.STALL_CLEARED, **StallCleared(step=step, for_s=round(now - clock.since, 1)))
            if step is not None and clock.step is not None and step > clock.step and status == "running":
                clock.step_s = [*clock.step_s[-49:], (now - clock.since) / (step - clock.step)]
            clock.step, clock.since, clock.announced, clock.restarted = step, now, False, False
            return
        if step is None:
            return
        stalled_s = now - clock.since
        median = sorted(clock.step_s)[len(clock.step_s) // 2] if clock.step_s else 0.0
        threshold = max(self.stall_after_s, 10 * median)
        if not clock.announced and stalled_s >= threshold:
            stopped, waiting = self._stalled_ranks()
            self.emit(
                Kind.STALL,
                **Stall(
                    step=step,
                    for_s=round(stalled_s, 1),
                    stopped=stopped,
                    waiting=waiting,
                    restart_after_s=self.spec.stall_timeout_s,
                ),
            )
            clock.announced = True
        limit = self.spec.stall_timeout_s
        if clock.announced and limit and not clock.restarted and stalled_s >= max(threshold, limit):
            stopped, waiting = self._stalled_ranks()
            killed = False
            for rank in stopped or waiting:  # a hang with no stopped rank: the whole group
                if rank in self.workers:
                    killed = self.kill_rank(rank) or killed  # the agent restarts the group: one restart
            if killed:  # (none was: nothing done here, nor said; the stall stands as told)
                self.emit(Kind.STALL_CLEARED, **StallCleared(step=step, for_s=round(stalled_s, 1), restarted=True))
            clock.restarted = True

    def _stalled_ranks(self) -> tuple[list[int], list[int]]:
        """Ranks of the newest group whose process is stopped, and the others (waiting). Here,
        every live worker process by its newest rank: one kept in place into a group still
        forming is named by the rank it had (a stopped one went unnamed, and the joiner was said
        to wait for nobody: an adversary's pass)."""
        if not self.placement.pids_here:  # a pid on another host (Slurm) tells nothing here: every rank waits
            newest = max((g for _p, _n, g in self.workers.values() if g is not None), default=None)
            return [], sorted(rank for rank, (_p, _n, gen) in self.workers.items() if gen == newest)
        stopped: set[int] = set()
        waiting: set[int] = set()
        for pid, rank in list(self._seen.items()):
            if not psutil.pid_exists(pid):
                del self._seen[pid]  # ended: no rank of the job any more
                continue
            (stopped if is_stopped(pid) else waiting).add(rank)
        return sorted(stopped), sorted(waiting - stopped)

"""The supervisor's nodes: each a torchrun agent (``notebook_elastic.agent.run``) in a
process group of its own, started cold or from the warm spare, given its share of the GPUs;
its output logged (rotated, above the disk's free-space floor) and parsed into the sink;
signalled, reaped, and started or stopped until as many run as the target says.
Held by the ``Supervisor``; handed the job's spec, folder and files, the course (target, range,
epoch, phase: read, and lowered when a node goes unreplaced), the placement, the store's board,
the sink, the notices and emit, not the supervisor."""

from __future__ import annotations

import heapq
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any

from ..contract import protocol
from ..contract.event_types import DiskFull, FilesChanged, Kind, NodeEvicted, NodeJoined, NodeLeft
from ..contract.events import LineParser
from ..contract.job_state import JobState
from ..contract.plan import LaunchPlan, launch_plan, rdzv_id
from ..contract.spec import JobSpec
from ..jobfolder.folder import JobFolder
from ..jobfolder.place import local_place, visible_gpus
from ..jobfolder.processes import kill_together
from .board import Board
from .membership import Course
from .notices import Notices
from .placement import Placement
from .sink import EventSink

#: A node log is rotated (node-N.log -> node-N.log.1) at this size: two of them at most.
NODE_LOG_CAP_BYTES = 32 * 1024 * 1024
#: How long stopping nodes may take before they are killed (on Slurm, more: its nodes' notice).
STOP_GRACE_S = 10.0
#: How long a reader whose agent's output ended waits for the agent's exit before it wakes the loop.
REAP_WAIT_S = 1.0
#: The longest the next warm spare waits for the job to grow with the one taken before it.
SPARE_AFTER_S = 10.0
#: Below this much free space (or 5 % of the disk, the smaller), output is no longer logged,
#: so events and status still find room.
LOG_FLOOR_BYTES = 64 * 1024 * 1024


#: Where each rank's process is: rank -> (pid, node, generation), kept by the supervisor's observer.
Workers = dict[int, tuple[int, str, Any]]


@dataclass
class Agent:
    name: str
    proc: subprocess.Popen[bytes]
    started: float
    epoch: int
    exit_reason: str | None = None  # set when we signal it on purpose
    gpus: list[str] = field(default_factory=list)  # its ranks' devices, its own alone
    progressed: bool = False  # a worker group it was part of made a step (a report or a commit)
    failure: str | None = None  # its workers' latest own failure, in words
    log_bytes: int = 0  # written to its current log file
    reaped: bool = False
    agent_pid: int | None = None  # the torchrun agent's own (forked by the warm pool): its rendezvous id
    round: tuple[int, int] | None = None  # (epoch, round) of the latest round it formed (none: a joiner)
    signaled: bool = False  # it said a SIGTERM came (from us or its place: scancel, a preemption)
    readers: list[threading.Thread] = field(default_factory=list)
    parsers: list[LineParser] = field(default_factory=list)
    log: IO[bytes] = field(kw_only=True)  # its node's log file, opened with it (unbuffered)
    log_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def stdin(self) -> IO[bytes]:
        """Its stdin, where a spare reads its orders: a pipe (``Nodes._spawn`` opens one for each)."""
        assert self.proc.stdin is not None
        return self.proc.stdin


class Nodes:
    """Starting, logging, signalling and reaping the job's agents."""

    def __init__(
        self,
        spec: JobSpec,
        folder: JobFolder,
        *,
        files_sha256: dict[str, str],
        run_id: str,
        course: Course,
        placement: Placement,
        board: Board,
        sink: EventSink,
        state: JobState,
        notices: Notices,
        emit: Callable[..., None],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.spec = spec
        self.folder = folder
        self.files_sha256 = files_sha256  # what every agent checks its files against
        self.run_id = run_id
        self.course = course
        self.placement = placement
        self.board = board
        self.sink = sink
        self.state = state  # the fold: whether the job trains yet (a spare is kept once it does)
        self.notices = notices
        self.emit = emit
        # The supervisor's loop looks now, not at its next turn (up to 0.05 s): an agent's output
        # ended, so it is dying or dead, and its peers wait for its reaping (GONE_KEY) to regroup.
        self.wake = wake
        self.agents: dict[str, Agent] = {}
        self.next_index = 0
        # Numbers of nodes replaced by a change of the range: their successors take them, so a
        # range change does not rename every node (#39 item 5); the lowest first.
        self.reusable: list[int] = []
        self.gpus = visible_gpus()
        self.free_gpus = list(self.gpus)  # handed to a node when it starts, back when it is reaped
        self.spare: Agent | None = None
        self.spare_retry_at = 0.0
        # A warm spare saves a scale-up its process start: an agent up, torch imported, told who it
        # is on its stdin (none for Slurm's allocations). With the warm pool it is a fork of the
        # pool's like any agent (its memory the pool's until written): the pool saves the import,
        # the spare the launcher's start, the fork and the agent's own start (0.17 s of 0.7 s, #41).
        self.warm_spare = bool(spec.backend_options.get("warm_spare", True)) and placement.warm_spares
        # The job's world size when a spare was taken, and until when the next waits for it to
        # change: its start (a fork, an agent's start) competed on a small machine with the
        # joiner's workers it was to follow, 0.05 to 0.1 s of a scale-up's 0.25 s on 2 cores.
        self.spare_after: tuple[int, float] | None = None
        self._space_checked = 0.0  # when the disk's free space was last looked at (monotonic)
        self._space_ok = True
        self._written_since_check = 0

    def plan(self, nnodes: tuple[int, int] | None = None) -> LaunchPlan:
        """What the agents of this epoch run (every node is started from it)."""
        place = local_place(
            self.spec,
            self.folder,
            gpus=self.gpus,
            store_port=self.board.port,
            supervisor_pid=self.placement.supervisor_pid(),  # an agent dies with it
            files_sha256=self.files_sha256,
            store_host=self.placement.store_host(),
        )
        return launch_plan(
            self.spec,
            place,
            rdzv_id=rdzv_id(self.spec.name, self.run_id, self.course.membership.epoch),
            epoch=self.course.membership.epoch,
            nnodes=nnodes or self.course.membership.range,
            nodes=0,
        )

    def _agent_env(self, plan: LaunchPlan, node_env: dict[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.spec.env)  # the --env values (from secret.json): the plan only names them
        env.update(plan.env)
        env.update(node_env)
        return env

    def _take_gpus(self) -> list[str] | None:
        """GPUs for one more node, one per local rank, none in use by a live node (None: not
        enough are free yet, a node on its way out still holds its own)."""
        if not self.gpus:
            return []
        n = self.spec.nproc_per_node
        if len(self.free_gpus) < n:
            return None
        taken, self.free_gpus = self.free_gpus[:n], self.free_gpus[n:]
        return taken

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> Agent:
        env = dict(env)
        command = self.placement.command(name, command, env)  # here, or under srun
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=self.spec.backend_options.get("cwd") or None,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        agent = Agent(
            name,
            proc,
            time.time(),
            self.course.membership.epoch,
            log=open(self.folder.logs / f"{name}.log", "ab", buffering=0),
        )
        launchers: dict[int, int] = {}  # its workers' launchers, told on one stream, named on the other
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            parser = LineParser(name, stream, agent_clock=True, launchers=launchers)  # an agent on this machine
            t = threading.Thread(target=self._read, args=(agent, parser, pipe), name=f"{name}-{stream}", daemon=True)
            t.start()
            agent.parsers.append(parser)
            agent.readers.append(t)
        return agent

    def start_agent(self) -> Agent | None:
        gpus = self._take_gpus()
        if gpus is None:
            return None
        if self.reusable:
            index = heapq.heappop(self.reusable)
        else:
            index = self.next_index
            self.next_index += 1
        plan = self.plan()
        node = plan.node(index, gpus)
        name = node.name
        # A drill for a broken machine: this node's own environment (a wrong network interface,
        # a module missing from its path), as in backend_options={"node_env": {"node-1": {...}}}.
        node_env = {**node.env, **(self.spec.backend_options.get("node_env") or {}).get(name, {})}
        if any(a.progressed for a in self.staying_agents()):
            node_env[protocol.ENV_JOINER] = "1"  # it joins a job that trains: its failure must not end it
        env = self._agent_env(plan, node_env)
        spare, self.spare = self.spare, None
        agent: Agent | None = None
        if spare is not None and spare.alive:
            # A warm spare: Python and torch are already imported. It takes the node's name, log
            # and place before it is told who it is: its first words (agent_started, with the pid
            # its peers know it by, which GONE_KEY names once it dies) may come at once, and a
            # spare's are dropped (a node lost later then stayed in its peers' round 2 s longer).
            self._take_name(spare, name)
            self.agents[name] = spare
            node_env = {k: v for k, v in env.items() if os.environ.get(k) != v}
            order = json.dumps({"env": node_env, "argv": list(plan.torchrun_args)}) + "\n"
            try:
                spare.stdin.write(order.encode())
                spare.stdin.close()
                agent = spare if spare.alive else None
            except OSError:
                pass
            if agent is None:
                del self.agents[name]  # it died untold: a cold start takes the name
        if agent is not None:
            self.spare_after = (self.state.world_size, time.monotonic() + SPARE_AFTER_S)
            agent.epoch = self.course.membership.epoch
            agent.started = time.time()
        else:
            agent = self._spawn(name, list(node.argv), env)
            agent.stdin.close()
        agent.gpus = gpus
        self.agents[name] = agent
        joined = NodeJoined(pid=agent.proc.pid, epoch=self.course.membership.epoch, warm=agent is spare)
        if gpus:
            joined["gpus"] = gpus
        self.emit(Kind.NODE_JOINED, name, **joined)
        return agent

    def _take_name(self, agent: Agent, name: str) -> None:
        """A spare becomes node ``name``: its log file, its lines and its events under that name."""
        with agent.log_lock:
            agent.log.close()  # unbuffered: nothing left to flush
            try:
                os.replace(self.folder.logs / f"{agent.name}.log", self.folder.logs / f"{name}.log")
            except OSError:
                pass
            agent.log = open(self.folder.logs / f"{name}.log", "ab", buffering=0)
            agent.name = name
        for parser in agent.parsers:
            parser.node = name

    def reuse_names_of(self, agents: list[Agent]) -> None:
        """These agents were replaced, not lost (a new range bakes a new --nnodes into every
        agent): the next nodes started take their names."""
        for agent in agents:
            number = agent.name.rpartition("-")[2]
            if agent.name.startswith("node-") and number.isdigit() and int(number) not in self.reusable:
                heapq.heappush(self.reusable, int(number))

    def keep_a_spare(self) -> None:
        """Once the job runs and can still grow, keep one standby agent warm."""
        wanted = (
            self.warm_spare
            and not self.course.stopping
            and self.state.world_size > 0
            and not self.finishing()
            # A job no node of which stays grows by no spare: it ends (a node that spent the
            # budget, reaped before the fold's world size said so, had one started and stopped
            # at once, CI) or waits for capacity, whose node then starts anew.
            and bool(self.staying_agents())
            # Not yet reaped counts: one that exited since this round's reap may have finished.
            and sum(not a.reaped for a in self.agents.values()) < self.course.membership.max_nodes
        )
        if self.spare is not None and not self.spare.alive:
            self.spare = None
            self.spare_retry_at = time.monotonic() + 30  # it died unused: do not respawn in a loop
        if self.spare_after is not None and (
            self.state.world_size != self.spare_after[0] or time.monotonic() > self.spare_after[1]
        ):
            self.spare_after = None  # the job grew with the last one (or never will): the next now
        if wanted and self.spare is None and time.monotonic() >= self.spare_retry_at and self.spare_after is None:
            plan = self.plan()
            env = self._agent_env(plan, {protocol.ENV_NODE: "spare"})
            self.spare = self._spawn(f"spare-{self.next_index}", [*plan.agent_prefix, "--standby"], env)
        elif not wanted:
            self.dismiss_spare()

    def dismiss_spare(self) -> int | None:
        """The standby agent is told it is not needed (it exits): the job ends, or cannot grow
        now. Its pid, if there was one."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        spare.stdin.close()  # "not needed": it exits
        return spare.proc.pid

    def _read(self, agent: Agent, parser: LineParser, pipe: IO[bytes]) -> None:
        for raw in iter(pipe.readline, b""):
            now = time.time()
            if self.output_allowed():
                with agent.log_lock:
                    self._log(agent, raw)
            line = raw.decode("utf-8", "replace")
            self.placement.says(agent.name, line)
            event = parser.feed(line, now)
            if event is not None and not agent.name.startswith("spare-"):
                self.sink.put(event)
        pipe.close()
        # Its output ends as it exits (its descriptors close before its parent may reap it): the
        # loop is woken once it can be reaped, or after REAP_WAIT_S where it lives on without.
        try:
            agent.proc.wait(timeout=REAP_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        self.wake()

    def _log(self, agent: Agent, raw: bytes) -> None:
        """Append to the node's log, rotated at NODE_LOG_CAP_BYTES (node-N.log.1 keeps the last
        part); a write that fails (disk full) is dropped, never fatal."""
        try:
            if agent.log_bytes + len(raw) > NODE_LOG_CAP_BYTES:
                agent.log.close()
                current = self.folder.logs / f"{agent.name}.log"
                os.replace(current, current.with_name(current.name + ".1"))
                agent.log = open(current, "ab", buffering=0)
                agent.log_bytes = 0
            agent.log.write(raw)
            agent.log_bytes += len(raw)
        except (OSError, ValueError):
            pass

    def output_allowed(self) -> bool:
        """Whether the disk has room for output above the floor (checked once a second): below
        it, output is dropped so that events and the status still find room."""
        now = time.monotonic()
        self._written_since_check += 1
        if now - self._space_checked < 1.0 and self._written_since_check < 64:
            return self._space_ok  # looked again each second, or every 64 lines (fast printers)
        self._written_since_check = 0
        self._space_checked = now
        try:
            fs = os.statvfs(self.folder.path)
        except OSError:
            return self._space_ok
        floor = min(LOG_FLOOR_BYTES, fs.f_blocks * fs.f_frsize // 20)
        ok = fs.f_bavail * fs.f_frsize >= floor
        if self._space_ok and not ok:
            free = fs.f_bavail * fs.f_frsize
            self.emit(
                Kind.DISK_FULL,
                **DiskFull(
                    message=f"the job folder's disk has {free // 1024} KiB free: worker output is no longer written "
                    "to logs/ (training goes on)"
                ),
            )
        self._space_ok = ok
        return ok

    def signal_agent(self, agent: Agent, sig: int, reason: str, workers: tuple[int, ...] = ()) -> None:
        """Signal a node's agent; a SIGKILL ends the node at once, with ``workers`` (its workers'
        pids) and its agent killed together where their pids are this machine's."""
        if agent.exit_reason is None:
            agent.exit_reason = reason
        self._regroup_without(agent)
        try:
            if sig == signal.SIGKILL:
                if self.placement.pids_here:
                    kill_together(self.folder.path, [*workers, *filter(None, [agent.agent_pid])])
                self.placement.kill(agent)  # the whole node at once
            elif sig == signal.SIGTERM:
                self.placement.term(agent)  # on purpose: its workers leave, or save first
            else:
                agent.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def files_changed(self, paths: list[str], node: str | None) -> None:
        """Someone changed the script or payload: stop everything rather than run it."""
        if self.course.files_reason is not None:
            return
        self.course.files_reason = protocol.files_changed_reason(paths)
        self.emit(Kind.FILES_CHANGED, node, **FilesChanged(files=paths, reason=self.course.files_reason))
        self.course.stop(self.stop_grace_s())
        for agent in self.alive_agents():
            self.signal_agent(agent, signal.SIGTERM, "stopped: " + protocol.exit_reason(protocol.EXIT_FILES_CHANGED))

    def stop_grace_s(self) -> float:
        """How long stopping nodes may take before they are killed: on Slurm, each node's notice
        (its keeper waits that long for rank 0's save) and a little more."""
        return self.placement.stop_grace_s(STOP_GRACE_S)

    def alive_agents(self) -> list[Agent]:
        return [a for a in self.agents.values() if not a.reaped and a.alive]

    def _survivors(self) -> int | None:
        """The staying nodes that were in a round: in place, survivors of a departure regroup
        without a joiner still starting (``Board.publish_target``). None where every worker
        restarts at each round: a round more is a restart more, so they wait for the target."""
        if self.spec.torchrun_restarts:
            return None
        return len([a for a in self.staying_agents() if a.round is not None and not a.signaled])

    def signaled(self, agent: Agent) -> None:
        """The agent said a SIGTERM came: from its place (a scancel, Slurm's preemption) where
        not from us. It leaves its round at a step boundary; the survivors regroup without it."""
        agent.signaled = True
        self._regroup_without(agent)

    def _regroup_without(self, agent: Agent) -> None:
        """``agent`` is going or gone: where it is a member of the latest round, its survivors
        regroup without a joiner still starting (``Board.regroup``). One that is not (left
        already, a joiner) changes no round: a joiner's round is not closed without it."""
        if agent.round is not None and agent.round == self.board.latest_round:
            self.board.regroup(self.course.membership.target, self._survivors())

    def staying_agents(self) -> list[Agent]:
        """Live agents not already told to go (a preempted node takes a moment to leave)."""
        return [a for a in self.alive_agents() if a.exit_reason is None]

    def reap(self) -> None:
        for agent in list(self.agents.values()):
            if agent.reaped or agent.alive:
                continue
            agent.reaped = True
            died = agent.exit_reason in (None, "lost")
            self.free_gpus = [g for g in self.gpus if g in self.free_gpus or g in agent.gpus]
            for t in agent.readers:
                t.join(timeout=2.0)  # let its last lines in before it is declared gone
            code = agent.proc.returncode
            if code == protocol.EXIT_FILES_CHANGED and agent.exit_reason is None:
                agent.exit_reason = protocol.exit_reason(code)
                self.files_changed(protocol.changed_files(self.files_sha256) or sorted(self.files_sha256), agent.name)
            if code == protocol.EXIT_FATAL and agent.exit_reason is None:
                # Its workers failed in a way a retry would repeat: the job stops (not a lost node).
                agent.exit_reason = protocol.exit_reason(code)
                self.sink.flush()  # its worker's worker_failed, read above, says why: fold it first
                self.course.fatal = self.course.fatal or agent.failure or f"{agent.name}: {agent.exit_reason}"
            if (
                code == protocol.EXIT_RESTARTS_SPENT
                and agent.exit_reason is None
                and not agent.progressed
                and not self.course.stopping
                and any(a.progressed for a in self.staying_agents())
            ):
                # A joiner whose budget (--max-restarts 0) was spent failing to join: it left its
                # round without closing it; the others train on.
                agent.exit_reason = "evicted"
                self.course.lower(agent.name, "evicted")
                failure = agent.failure or f"its workers failed at their start ({protocol.exit_reason(code)})"
                self.emit(
                    Kind.NODE_EVICTED,
                    agent.name,
                    **NodeEvicted(failure=failure, target=self.course.membership.target),
                )
            # Told to go on purpose (SIGTERM), it left its round itself; killed or dead, it did not.
            self._regroup_without(agent)
            self.board.publish_gone(agent.agent_pid, died=died)
            if agent.exit_reason is None and not self.course.stopping:
                departure = self.placement.departure(agent.name)  # its place ended it (Slurm)
                if departure is not None:
                    agent.exit_reason = departure.reason
                    if departure.lower is not None:
                        self.course.lower(agent.name, departure.lower)
            # Its keeper's notice (Slurm) comes down with it: it may have had no time to.
            self.placement.gone(agent.name, partial(self.notices.withdraw_for, agent.name, self.board.store))
            reason = agent.exit_reason or protocol.exit_reason(code)
            if agent.exit_reason is None and code != 0 and not self.course.stopping:
                # It died on its own (restart budget spent, rendezvous error, killed from
                # outside): a lost node, not replaced.
                self.course.lower(agent.name, "lost")
            self.emit(Kind.NODE_LEFT, agent.name, **NodeLeft(reason=reason, exitcode=code))
            if agent.log:
                agent.log.close()

    def finishing(self) -> bool:
        """Workers succeeded somewhere (a node left with exit 0): the job is ending, so no agent
        is started and no spare kept (a spare spawned as node-1 finished before node-0 was an
        orphan at the end)."""
        return any(a.proc.returncode == 0 for a in self.agents.values() if a.reaped)

    def converge(self) -> None:
        """Start or stop agents until as many run as the target says."""
        if self.course.stopping or self.course.fatal is not None:
            # A fatal verdict stops the job in this same turn of the loop: the node whose exit
            # said so (reaped just before, its worker's event not yet folded) is not replaced.
            return
        # Agents on their way out do not count: counting a preempted node-0 that is still
        # shutting down made the target look exceeded, and the survivor was scaled down too.
        alive = self.staying_agents()
        self.board.publish_target(self.course.membership.target, self._survivors())  # before a new agent asks to join
        if self.finishing():
            return
        target = self.course.membership.target
        while len(alive) < target:
            agent = self.start_agent()
            if agent is None:
                break  # its GPUs are still held by a node on its way out: next round
            alive.append(agent)
        if len(alive) > target:
            for agent in sorted(alive, key=lambda a: a.started)[target:]:
                self._scale_down(agent, stays=target)

    def _scale_down(self, agent: Agent, stays: int) -> None:
        """Where the place turns SIGTERM into a notice (Slurm: the node's keeper posts one, not
        knowing that others stay, and rank 0 saved for it at every scale-down), the supervisor's
        own notice comes first and says how many stay: rank 0 answers it at once with no save
        (in place, they keep every value), the SIGTERM follows (``Notices.watch``), and the
        keeper takes it as the notice that SIGTERM ends. Elsewhere, or with nothing to save, the
        SIGTERM at once (in place the node leaves at a step boundary)."""
        notice_s = self.placement.notice_s()
        if notice_s and stays > 0 and self.notices.give(agent, notice_s, stays=stays):
            agent.exit_reason = "scaled_down"  # going: not a node to keep, pick or stop again
            return
        self.signal_agent(agent, signal.SIGTERM, "scaled_down")

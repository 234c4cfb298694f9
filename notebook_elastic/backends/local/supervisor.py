"""``python -m notebook_elastic.backends.local.supervisor JOB_DIR``: one detached process per job.

It runs in its own session, so a kernel crash or restart does not touch training, and the
kernel is never forked. It
- hosts the job's c10d rendezvous store (no agent hosts it, so any node may die);
- runs one torchrun agent per simulated node (``notebook_elastic.runtime.agent``), each in
  its own process group, CPU + gloo here, a share of the GPUs where there are some;
- scales by starting agents (no restart) and stopping them (SIGTERM: one restart of the
  survivors), and restarts all agents with a new rendezvous epoch when the range changes;
- injects faults on request (SIGKILL a worker, SIGTERM an agent = preemption, SIGKILL an
  agent = node loss);
- runs only the script and payload that were launched: their sha256 (given by the kernel)
  goes to every agent, which checks it before every (re)start of its workers (torchrun
  restarts them on its own); an agent that finds a changed file exits, and the job fails
  (``files_changed``) instead of running it;
- parses every line the agents and workers print into events (``events.LineParser``),
  appends them to ``events.jsonl``, keeps ``status.json`` current, and when the last agent
  is gone writes ``job_finished`` and leaves no process of the job behind.
Requests come over an authenticated loopback connection (``control.py``).
"""

from __future__ import annotations

import json
import os
import queue
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ... import defaults
from ...errors import SpecError
from ...events import Event, Kind, LineParser
from ...job_state import JobState, budget_spent_reason, describe_failure
from ...plan import LaunchPlan, launch_plan, rdzv_id
from ...runtime import protocol
from ...runtime.payload import payload_path_for
from ...runtime.state import newest_generation
from ...runtime.store import host_store
from ...spec import JobSpec
from .control import listen
from .folder import JOB_UMASK, JobFolder, kill_all, process_start_ticks, processes_of, write_json_atomic
from .history import ROTATE_BYTES, read_all
from .place import local_place, visible_gpus
from .sink import EventSink
from .tensorboard import TensorBoardWriter
from .tensorboard import available as tensorboard_available

STOP_GRACE_S = 10.0
#: At the end, processes that are on their way out (a spare agent, zygotes) get this long to go
#: by themselves; what is left after it is an orphan, killed and counted.
EXIT_GRACE_S = 5.0
#: A node log is rotated (node-N.log -> node-N.log.1) at this size: two of them at most.
NODE_LOG_CAP_BYTES = 32 * 1024 * 1024
#: Below this much free space (or 5 % of the disk, the smaller), output is no longer logged,
#: so events and status still find room.
LOG_FLOOR_BYTES = 64 * 1024 * 1024


@dataclass
class StallClock:
    """When the job last made progress, and what was said about a stall since."""

    step: int | None = None
    since: float = 0.0  # monotonic time of the last progress (or of the group's start)
    step_s: list[float] = field(default_factory=list)  # recent seconds per step, for the median
    announced: bool = False
    restarted: bool = False


def _is_ours(pid: int, *marks: bytes) -> bool:
    """Whether the process's command line carries one of ``marks`` (a zygote, the guardian)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return any(mark in cmdline for mark in marks)


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, D, T for stopped, ...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@dataclass
class Agent:
    name: str
    proc: subprocess.Popen
    started: float
    epoch: int
    exit_reason: str | None = None  # set when we signal it on purpose
    gpus: list[str] = field(default_factory=list)  # its ranks' devices, its own alone
    progressed: bool = False  # a worker group it was part of made a step (a report or a commit)
    failure: str | None = None  # its workers' latest own failure, in words
    log_bytes: int = 0  # written to its current log file
    reaped: bool = False
    readers: list[threading.Thread] = field(default_factory=list)
    parsers: list[LineParser] = field(default_factory=list)
    log: IO[bytes] | None = None
    log_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Supervisor:
    def __init__(self, folder: JobFolder, resume: bool = False) -> None:
        self.folder = folder
        self.resume = resume
        self.spec = JobSpec.from_json(folder.spec())
        # spec.json names the --env variables; their values are in the 0600 secret.json.
        secret = folder.secret()
        self.spec.env.update(secret.get("env") or {})
        files_sha256 = secret.get("files_sha256")
        if files_sha256 is None:  # a folder written by hand: trust the files as they are now
            paths = [folder.script, payload_path_for(folder.script)]
            files_sha256 = {str(p): protocol.sha256_of(p) for p in paths if p.exists()}
        self.files_sha256: dict[str, str] = dict(files_sha256)
        self.files_reason: str | None = None  # set once a changed file stopped the job
        self.range = self.spec.nnodes
        self.target = self.spec.initial_nodes
        # Above every generation already in the checkpoint folder (a resumed job, a reused
        # --checkpoint-dir): this run's groups read those checkpoints and are never fenced off.
        newest = newest_generation(Path(self.spec.checkpoint_dir or folder.checkpoints))
        self.epoch = newest // protocol.GENERATION_EPOCH_STRIDE + 1 if newest >= 0 else 0
        self.run_id = uuid.uuid4().hex[:8]
        self.agents: dict[str, Agent] = {}
        self.next_index = 0
        self.returns: list[float] = []  # times at which preempted capacity comes back
        self.stopping = False
        self.stop_deadline: float | None = None
        self.commands: queue.SimpleQueue[tuple[dict, Any]] = queue.SimpleQueue()
        self.workers: dict[int, tuple[int, str, Any]] = {}  # rank -> (pid, node, generation)
        self.state = JobState(max_restarts=self.spec.max_restarts, nnodes=self.range, target=self.target)
        self.folder.logs.mkdir(exist_ok=True)
        self._space_checked = 0.0
        self._space_ok = True
        self._written_since_check = 0
        self.tensorboard: TensorBoardWriter | None = None  # once torch is imported (run())
        self.sink = EventSink(
            folder.events_file,
            self.state,
            self._observe,
            self._output_allowed,
            int(self.spec.backend_options.get("events_rotate_bytes", ROTATE_BYTES)),
        )
        self.authkey = secrets.token_bytes(32)
        self.gpus = visible_gpus()
        self.free_gpus = list(self.gpus)  # handed to a node when it starts, back when it is reaped
        self.spare: Agent | None = None
        self.spare_retry_at = 0.0
        self.warm_spare = bool(self.spec.backend_options.get("warm_spare", True))
        self.stall_after_s = float(self.spec.backend_options.get("stall_after_s", defaults.STALL_AFTER_S))
        self.stall = StallClock(since=time.monotonic())
        self.failures_seen: dict[tuple, int] = {}
        self.fatal: str | None = None  # why the job stops now, when retrying is pointless
        self.evictions: queue.SimpleQueue[str] = queue.SimpleQueue()  # nodes to send away (sink -> loop)

    # -- events --------------------------------------------------------------------------

    def emit(self, kind: str, node: str | None = None, **data: Any) -> None:
        self.sink.put(Event(kind, time.time(), node, data))

    def _observe(self, e: Event) -> None:
        """Called by the sink thread for every event: track where each rank's process is."""
        self._watch_joiners(e)
        # TensorBoard files are output like the workers' lines: above the free-space floor only,
        # so the history and the outcome still find room on a filling disk.
        if self.tensorboard is not None and e.kind in (Kind.METRIC, Kind.GPU) and self._output_allowed():
            self.tensorboard.observe(e, self.state)
        if e.kind == Kind.WORKER_STARTED:
            gen = e.get("generation")
            stale = [r for r, (_p, _n, g) in self.workers.items() if g != gen]
            for r in stale:
                del self.workers[r]
            self.workers[int(e.get("rank", 0))] = (int(e.get("pid")), e.node or "", gen)
        elif e.kind in (Kind.WORKER_FINISHED,):
            self.workers.pop(int(e.get("rank", -1)), None)
        elif e.kind == Kind.WORKER_FAILED and e.get("cause") != "peer" and self.fatal is None:
            # A failure that will come back at every retry is not retried to the end of the budget.
            key = (e.get("rank"), e.get("step"), e.get("error"), e.get("message"))
            self.failures_seen[key] = self.failures_seen.get(key, 0) + 1
            what = describe_failure(e)
            budget_left = self.state.restarts < self.state.max_restarts  # else the budget path says it
            if e.get("fatal"):
                self.fatal = what
            elif self.failures_seen[key] >= 2 and e.get("step") is not None and budget_left:
                self.fatal = f"fails the same way every time: {what} (twice at step {e.get('step')})"

    def _watch_joiners(self, e: Event) -> None:
        """A node whose workers fail before any group it joined made a step, while other nodes
        have trained, fails while joining (a module missing there, a broken GPU, NCCL or gloo
        init failing on it alone): torchrun would retry it, pulling the healthy nodes into
        every retry, until its budget is spent, and then close the rendezvous on them all.
        It is sent away once its first failure has been charged (one restart)."""
        agent = self.agents.get(e.node or "")
        if e.kind in (Kind.METRIC, Kind.CHECKPOINT):
            rank = e.get("rank")
            newest = max((g for _p, _n, g in self.workers.values() if g is not None), default=None)
            if rank in self.workers and self.workers[rank][2] == newest:
                for _pid, node, gen in list(self.workers.values()):
                    if gen == newest and node in self.agents:
                        self.agents[node].progressed = True
            return
        if agent is None or agent.progressed:
            return
        if e.kind == Kind.WORKER_FAILED and e.get("cause") != "peer":
            agent.failure = describe_failure(e)
        elif (
            e.kind == Kind.WORKER_EXITED
            and (e.get("exitcode") or 0) > 0
            and e.get("exitcode") != protocol.EXIT_PEER_LOST
        ):
            agent.failure = agent.failure or f"a worker on {agent.name} exited with code {e.get('exitcode')}"
        elif e.kind == Kind.RESTART and e.get("reason") == "worker_failed" and agent.failure:
            if any(a.progressed for a in self.staying_agents() if a is not agent):
                self.evictions.put(agent.name)

    def _evict(self, name: str) -> None:
        """Send away a node that failed while joining: the others go on at their size."""
        agent = self.agents.get(name)
        if agent is None or not agent.alive or agent.exit_reason is not None or self.stopping:
            return
        self.signal_agent(agent, signal.SIGTERM, "evicted")  # SIGTERM: it leaves the round, never closes it
        self._lower_target(agent.name, "evicted")
        self.emit(Kind.NODE_EVICTED, agent.name, failure=agent.failure, target=self.target)

    # -- agents --------------------------------------------------------------------------

    def _plan(self, nnodes: tuple[int, int] | None = None) -> LaunchPlan:
        """What the agents of this epoch run (every node is started from it)."""
        place = local_place(
            self.spec,
            self.folder,
            gpus=self.gpus,
            store_port=self.store_port,
            supervisor_pid=os.getpid(),
            files_sha256=self.files_sha256,
        )
        return launch_plan(
            self.spec,
            place,
            rdzv_id=rdzv_id(self.spec.name, self.run_id, self.epoch),
            epoch=self.epoch,
            nnodes=nnodes or self.range,
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
            name, proc, time.time(), self.epoch, log=open(self.folder.logs / f"{name}.log", "ab", buffering=0)
        )
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            parser = LineParser(name, stream)
            t = threading.Thread(target=self._read, args=(agent, parser, pipe), name=f"{name}-{stream}", daemon=True)
            t.start()
            agent.parsers.append(parser)
            agent.readers.append(t)
        return agent

    def start_agent(self) -> Agent | None:
        gpus = self._take_gpus()
        if gpus is None:
            return None
        index = self.next_index
        self.next_index += 1
        plan = self._plan()
        node = plan.node(index, gpus)
        name = node.name
        # A drill for a broken machine: this node's own environment (a wrong network interface,
        # a module missing from its path), as in backend_options={"node_env": {"node-1": {...}}}.
        node_env = {**node.env, **(self.spec.backend_options.get("node_env") or {}).get(name, {})}
        if any(a.progressed for a in self.staying_agents()):
            node_env[protocol.ENV_JOINER] = "1"  # it joins a job that trains: its failure must not end it
        env = self._agent_env(plan, node_env)
        spare, self.spare = self.spare, None
        if spare is not None and spare.alive:
            # A warm spare: Python and torch are already imported; tell it who it is.
            node_env = {k: v for k, v in env.items() if os.environ.get(k) != v}
            order = json.dumps({"env": node_env, "argv": list(plan.torchrun_args)}) + "\n"
            try:
                spare.proc.stdin.write(order.encode())  # type: ignore[union-attr]
                spare.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                spare = None
        if spare is not None and spare.alive:
            agent = spare
            with agent.log_lock:
                agent.log.close()  # type: ignore[union-attr]  # unbuffered: nothing left to flush
                try:
                    os.replace(self.folder.logs / f"{agent.name}.log", self.folder.logs / f"{name}.log")
                except OSError:
                    pass
                agent.log = open(self.folder.logs / f"{name}.log", "ab", buffering=0)
            agent.name = name
            agent.epoch = self.epoch
            agent.started = time.time()
            for parser in agent.parsers:
                parser.node = name
        else:
            agent = self._spawn(name, list(node.argv), env)
            agent.proc.stdin.close()  # type: ignore[union-attr]
        agent.gpus = gpus
        self.agents[name] = agent
        self.emit(
            Kind.NODE_JOINED,
            name,
            pid=agent.proc.pid,
            epoch=self.epoch,
            warm=agent is spare,
            **({"gpus": gpus} if gpus else {}),
        )
        return agent

    def _keep_a_spare(self) -> None:
        """Once the job runs and can still grow, keep one standby agent warm."""
        wanted = (
            self.warm_spare
            and not self.stopping
            and self.state.world_size > 0
            and len(self.alive_agents()) < self.range[1]
        )
        if self.spare is not None and not self.spare.alive:
            self.spare = None
            self.spare_retry_at = time.monotonic() + 30  # it died unused: do not respawn in a loop
        if wanted and self.spare is None and time.monotonic() >= self.spare_retry_at:
            plan = self._plan()
            env = self._agent_env(plan, {protocol.ENV_NODE: "spare"})
            self.spare = self._spawn(f"spare-{self.next_index}", [*plan.agent_prefix, "--standby"], env)
        elif not wanted and self.spare is not None:
            self.spare.proc.stdin.close()  # type: ignore[union-attr]
            self.spare = None

    def _read(self, agent: Agent, parser: LineParser, pipe: IO[bytes]) -> None:
        for raw in iter(pipe.readline, b""):
            now = time.time()
            if self._output_allowed():
                with agent.log_lock:
                    self._log(agent, raw)
            event = parser.feed(raw.decode("utf-8", "replace"), now)
            if event is not None and not agent.name.startswith("spare-"):
                self.sink.put(event)
        pipe.close()

    def _log(self, agent: Agent, raw: bytes) -> None:
        """Append to the node's log, rotated at NODE_LOG_CAP_BYTES (node-N.log.1 keeps the last
        part); a write that fails (disk full) is dropped, never fatal."""
        try:
            if agent.log_bytes + len(raw) > NODE_LOG_CAP_BYTES:
                agent.log.close()  # type: ignore[union-attr]
                current = self.folder.logs / f"{agent.name}.log"
                os.replace(current, current.with_name(current.name + ".1"))
                agent.log = open(current, "ab", buffering=0)
                agent.log_bytes = 0
            agent.log.write(raw)  # type: ignore[union-attr]
            agent.log_bytes += len(raw)
        except (OSError, ValueError):
            pass

    def _output_allowed(self) -> bool:
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
                message=f"the job folder's disk has {free // 1024} KiB free: worker output is no longer written "
                "to logs/ (training goes on)",
            )
        self._space_ok = ok
        return ok

    def signal_agent(self, agent: Agent, sig: int, reason: str) -> None:
        if agent.exit_reason is None:
            agent.exit_reason = reason
        try:
            if sig == signal.SIGKILL:
                os.killpg(agent.proc.pid, signal.SIGKILL)  # the whole node: agent and anything in its group
            else:
                agent.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def alive_agents(self) -> list[Agent]:
        return [a for a in self.agents.values() if not a.reaped and a.alive]

    def staying_agents(self) -> list[Agent]:
        """Live agents not already told to go (a preempted node takes a moment to leave)."""
        return [a for a in self.alive_agents() if a.exit_reason is None]

    def _reap(self) -> None:
        for agent in list(self.agents.values()):
            if agent.reaped or agent.alive:
                continue
            agent.reaped = True
            self.free_gpus = [g for g in self.gpus if g in self.free_gpus or g in agent.gpus]
            for t in agent.readers:
                t.join(timeout=2.0)  # let its last lines in before it is declared gone
            code = agent.proc.returncode
            if code == protocol.EXIT_FILES_CHANGED and agent.exit_reason is None:
                agent.exit_reason = protocol.exit_reason(code)
                self._files_changed(protocol.changed_files(self.files_sha256) or sorted(self.files_sha256), agent.name)
            if (
                code == protocol.EXIT_RESTARTS_SPENT
                and agent.exit_reason is None
                and not agent.progressed
                and not self.stopping
                and any(a.progressed for a in self.staying_agents())
            ):
                # A joiner whose budget (--max-restarts 0) was spent failing to join: it left its
                # round without closing it; the others train on.
                agent.exit_reason = "evicted"
                self._lower_target(agent.name, "evicted")
                failure = agent.failure or f"its workers failed at their start ({protocol.exit_reason(code)})"
                self.emit(Kind.NODE_EVICTED, agent.name, failure=failure, target=self.target)
            reason = agent.exit_reason or protocol.exit_reason(code)
            if agent.exit_reason is None and code != 0 and not self.stopping:
                # It died on its own (restart budget spent, rendezvous error, killed from
                # outside): a lost node, not replaced.
                self._lower_target(agent.name, "lost")
            self.emit(Kind.NODE_LEFT, agent.name, reason=reason, exitcode=code)
            if agent.log:
                agent.log.close()

    def _converge(self) -> None:
        """Start or stop agents until as many run as the target says."""
        if self.stopping:
            return
        # Agents on their way out do not count: counting a preempted node-0 that is still
        # shutting down made the target look exceeded, and the survivor was scaled down too.
        alive = self.staying_agents()
        if any(a.proc.returncode == 0 for a in self.agents.values() if a.reaped):
            return  # the job is finishing: workers succeeded somewhere
        while len(alive) < self.target:
            agent = self.start_agent()
            if agent is None:
                break  # its GPUs are still held by a node on its way out: next round
            alive.append(agent)
        if len(alive) > self.target:
            for agent in sorted(alive, key=lambda a: a.started)[self.target :]:
                self.signal_agent(agent, signal.SIGTERM, "scaled_down")

    # -- commands ------------------------------------------------------------------------

    def _pick_agent(self, node: str | None) -> Agent:
        alive = self.staying_agents()
        if node is None:
            if not alive:
                raise ValueError("no node is running right now")
            return random.choice(alive)
        for agent in alive:
            if agent.name == node:
                return agent
        names = ", ".join(a.name for a in alive) or "none"
        raise ValueError(f"node {node!r} is not running (running: {names})")

    def do_scale(self, nodes: int) -> dict:
        lo, hi = self.range
        if not lo <= nodes <= hi:
            raise ValueError(
                f"cannot scale to {nodes} nodes: the job's range is {lo}:{hi}; widen it with set_range() first"
            )
        self.target = nodes
        self.emit(Kind.SCALED, target=nodes, min_nodes=lo, max_nodes=hi)
        self._converge()
        return {"target": nodes}

    def do_set_range(self, min_nodes: int, max_nodes: int) -> dict:
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"range {min_nodes}:{max_nodes} is invalid: need 1 <= MIN <= MAX")
        if (min_nodes, max_nodes) == tuple(self.range):
            return {"target": self.target, "reconfigured": False}
        try:
            self._plan((min_nodes, max_nodes))  # refused here, before any agent is stopped
        except SpecError as e:
            raise ValueError(str(e).replace("--nnodes", "range", 1)) from None
        self.range = (min_nodes, max_nodes)
        self.target = min(max(self.target, min_nodes), max_nodes)
        # torchrun bakes --nnodes into every agent: a new range means new agents, in a new
        # rendezvous epoch, resuming from the latest checkpoint.
        self.epoch += 1
        old = self.alive_agents()
        for agent in old:
            self.signal_agent(agent, signal.SIGTERM, "reconfigured")
        deadline = time.monotonic() + STOP_GRACE_S
        while any(a.alive for a in old) and time.monotonic() < deadline:
            time.sleep(0.05)
        for agent in old:
            if agent.alive:
                self.signal_agent(agent, signal.SIGKILL, "reconfigured")
                agent.proc.wait()
        self._reap()
        self.emit(Kind.SCALED, target=self.target, min_nodes=min_nodes, max_nodes=max_nodes, reconfigured=True)
        self._converge()
        return {"target": self.target, "reconfigured": True}

    def do_kill_worker(self, rank: int | None = None) -> dict:
        if not self.workers:
            raise ValueError(
                "no worker is running right now (the job is starting or restarting); try again in a moment"
            )
        if rank is None:
            rank = random.choice(sorted(self.workers))
        if rank not in self.workers:
            raise ValueError(f"rank {rank} is not running (running ranks: {sorted(self.workers)})")
        pid, node, _gen = self.workers[rank]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            raise ValueError(f"rank {rank} (pid {pid}) already exited") from None
        self.emit(Kind.FAULT, node, fault="kill_worker", target=f"rank {rank}", rank=rank, pid=pid)
        return {"rank": rank, "pid": pid, "node": node}

    def _lower_target(self, node: str, reason: str) -> None:
        """A node taken away is not replaced: the target says so, in an event of its own, so
        every view of the target (the dashboard's nodes box, the panel) follows."""
        self.target = max(0, self.target - 1)
        self.emit(
            Kind.SCALED, node, target=self.target, min_nodes=self.range[0], max_nodes=self.range[1], reason=reason
        )

    def do_remove_node(
        self, node: str | None = None, how: str = "preempt", return_after_s: float | None = None
    ) -> dict:
        agent = self._pick_agent(node)
        self._lower_target(agent.name, "lost" if how == "lose" else "preempted")
        if how == "lose":
            self.signal_agent(agent, signal.SIGKILL, "lost")
        else:
            self.signal_agent(agent, signal.SIGTERM, "preempted")
        if return_after_s is not None:
            self.returns.append(time.monotonic() + float(return_after_s))
        self.emit(Kind.FAULT, agent.name, fault=f"{how}_node", target=agent.name, return_after_s=return_after_s)
        return {"node": agent.name, "target": self.target}

    def _files_changed(self, paths: list[str], node: str | None) -> None:
        """Someone changed the script or payload: stop everything rather than run it."""
        if self.files_reason is not None:
            return
        self.files_reason = protocol.files_changed_reason(paths)
        self.emit(Kind.FILES_CHANGED, node, files=paths, reason=self.files_reason)
        self.stopping = True
        self.stop_deadline = time.monotonic() + STOP_GRACE_S
        for agent in self.alive_agents():
            self.signal_agent(agent, signal.SIGTERM, "stopped: " + protocol.exit_reason(protocol.EXIT_FILES_CHANGED))

    def do_stop(self) -> dict:
        if not self.stopping:
            self.stopping = True
            self.stop_deadline = time.monotonic() + STOP_GRACE_S
            for agent in self.alive_agents():
                self.signal_agent(agent, signal.SIGTERM, "stopped")
        return {"stopping": True}

    def do_status(self) -> dict:
        with self.sink.lock:
            return self.state.summary()

    def _handle(self, request: dict) -> Any:
        command = request.get("command")
        args = request.get("args") or {}
        if self.stopping and command not in ("stop", "status"):
            raise ValueError(f"the job is stopping, so it cannot {command.replace('_', ' ')}")
        if command == "scale":
            return self.do_scale(int(args["nodes"]))
        if command == "set_range":
            return self.do_set_range(int(args["min_nodes"]), int(args["max_nodes"]))
        if command == "kill_worker":
            return self.do_kill_worker(args.get("rank"))
        if command in ("preempt_node", "lose_node"):
            how = "lose" if command == "lose_node" else "preempt"
            return self.do_remove_node(args.get("node"), how, args.get("return_after_s"))
        if command == "stop":
            return self.do_stop()
        if command == "status":
            return self.do_status()
        raise ValueError(f"unknown command {command!r}")

    def _serve(self, listener: Any) -> None:
        while True:
            try:
                conn = listener.accept()
            except Exception:
                if self.closed:
                    return
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        try:
            request = json.loads(conn.recv_bytes())
            done: queue.SimpleQueue = queue.SimpleQueue()
            self.commands.put((request, done))
            conn.send_bytes(json.dumps(done.get(timeout=120), default=str).encode())
        except Exception:
            pass
        finally:
            conn.close()

    # -- main ----------------------------------------------------------------------------

    def run(self) -> int:
        self.closed = False
        signal.signal(signal.SIGTERM, lambda *_: self.commands.put(({"command": "stop"}, queue.SimpleQueue())))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Listen first, host the store on that socket once torch is imported: agents can be
        # started meanwhile (their connections wait in the backlog), saving a torch import.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        self.store_port = sock.getsockname()[1]
        listener = listen(self.authkey)
        write_json_atomic(
            self.folder.supervisor_file,
            {
                "pid": os.getpid(),
                "start_ticks": process_start_ticks(os.getpid()),
                "control": list(listener.address),
                "authkey": self.authkey.hex(),
                "rdzv_port": self.store_port,
                "started": time.time(),
            },
            mode=0o600,
        )
        threading.Thread(target=self._serve, args=(listener,), daemon=True).start()
        spec = self.spec
        before = None
        if self.resume:
            # The history so far, folded, so status.json goes on from it (steps, metrics).
            history = list(read_all(self.folder.events_file))
            with self.sink.lock:
                self.state.apply_all(history)
                before = self.state.status if self.state.finished else "lost"
        self.emit(
            Kind.JOB_RESUMED if self.resume else Kind.JOB_SUBMITTED,
            **({"after": before} if self.resume else {}),
            name=spec.name,
            nodes=self.target,
            min_nodes=self.range[0],
            max_nodes=self.range[1],
            nproc_per_node=spec.nproc_per_node,
            max_restarts=spec.max_restarts,
            backend="local",
            gpus=len(self.gpus),
            notebook=spec.notebook,
        )
        self._converge()
        store = host_store(sock)
        if tensorboard_available():  # metrics come only through the store: none was missed
            self.tensorboard = TensorBoardWriter(self.folder.path / "tensorboard")
        status = self._loop()
        self._finish(status)
        del store
        self.closed = True
        listener.close()
        return 0

    def _loop(self) -> tuple[str, str | None]:
        last_status = last_folder_check = 0.0
        while True:
            try:
                request, reply = self.commands.get(timeout=0.05)
                try:
                    reply.put({"ok": True, "result": self._handle(request)})
                except Exception as exc:
                    reply.put({"ok": False, "error": str(exc)})
            except queue.Empty:
                pass
            while not self.evictions.empty():
                self._evict(self.evictions.get())
            self._reap()
            now = time.monotonic()
            while self.returns and self.returns[0] <= now and not self.stopping:
                self.returns.pop(0)
                self.target = min(self.target + 1, self.range[1])
                self.emit(
                    Kind.SCALED, target=self.target, min_nodes=self.range[0], max_nodes=self.range[1], returned=True
                )
            self.returns.sort()
            self._converge()
            self._keep_a_spare()
            self._watch_for_stalls(now)
            if self.fatal and not self.stopping:
                self.do_stop()
            if now - last_folder_check > 1.0:
                last_folder_check = now
                if self._folder_deleted():
                    # Its folder was deleted: no checkpoint or record can be written any more.
                    for agent in self.alive_agents():
                        self.signal_agent(agent, signal.SIGKILL, "stopped")
                    for agent in self.agents.values():
                        agent.proc.wait()
                    return "lost", "its job folder was deleted while it ran"
            if self.stopping and self.stop_deadline and now > self.stop_deadline:
                for agent in self.alive_agents():
                    self.signal_agent(agent, signal.SIGKILL, "stopped")
            if self.sink.changed.is_set() and time.monotonic() - last_status > 0.25:
                self.sink.changed.clear()
                last_status = time.monotonic()
                self._write_status()
            if not self.alive_agents() and all(a.reaped for a in self.agents.values()):
                if self.files_reason is not None:
                    return "failed", self.files_reason
                if self.fatal:
                    return "failed", self.fatal
                if self.stopping:
                    return "stopped", "stopped on request"
                if any(a.proc.returncode == 0 for a in self.agents.values()):
                    return "succeeded", None
                if self.returns:
                    continue  # capacity comes back later: wait for it
                return "failed", self._failure_reason()

    def _folder_deleted(self) -> bool:
        """Whether the job folder was deleted (a worker's checkpoint mkdir may have made a new
        one at the same path since: it has no events file)."""
        return not self.folder.events_file.exists()

    def _watch_for_stalls(self, now: float) -> None:
        """A running job whose step has not moved for max(stall_after_s, 10 x the median step
        time) is stalled (a SIGSTOPped rank, a hung collective, a stuck filesystem look the
        same): say which ranks stopped and which wait; with --stall-timeout, restart the group."""
        with self.sink.lock:
            step, status = self.state.step, self.state.status
        clock = self.stall
        if step != clock.step or status != "running":
            if clock.announced and status == "running":
                self.emit(Kind.STALL_CLEARED, step=step, for_s=round(now - clock.since, 1))
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
                step=step,
                for_s=round(stalled_s, 1),
                stopped=stopped,
                waiting=waiting,
                restart_after_s=self.spec.stall_timeout_s,
            )
            clock.announced = True
        limit = self.spec.stall_timeout_s
        if clock.announced and limit and not clock.restarted and stalled_s >= max(threshold, limit):
            stopped, waiting = self._stalled_ranks()
            for rank in stopped or waiting:  # a hang with no stopped rank: the whole group
                pid = self.workers.get(rank, (None,))[0]
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)  # the agent restarts the group: one restart
                    except OSError:
                        pass
            self.emit(Kind.STALL_CLEARED, step=step, for_s=round(stalled_s, 1), restarted=True)
            clock.restarted = True

    def _stalled_ranks(self) -> tuple[list[int], list[int]]:
        """Ranks of the newest group whose process is stopped (T), and the others (waiting)."""
        newest = max((g for _p, _n, g in self.workers.values() if g is not None), default=None)
        stopped, waiting = [], []
        for rank, (pid, _node, gen) in sorted(self.workers.items()):
            if gen != newest:
                continue
            (stopped if process_state(pid) in ("T", "t") else waiting).append(rank)
        return stopped, waiting

    def _failure_reason(self) -> str:
        with self.sink.lock:
            state = self.state
            if state.failures:
                return budget_spent_reason(state.failures, state.restarts, state.max_restarts, "")
            reasons = sorted({a.exit_reason or f"exit code {a.proc.returncode}" for a in self.agents.values()})
            if all(a.exit_reason in ("preempted", "lost") for a in self.agents.values()):
                return f"no node left to run on (all {', '.join(reasons)})"
            return f"every node's agent exited ({', '.join(reasons)})"

    def _write_status(self) -> None:
        with self.sink.lock:
            summary = self.state.summary()
        summary.update(
            name=self.spec.name,
            backend="local",
            target=self.target,
            min_nodes=self.range[0],
            max_nodes=self.range[1],
            supervisor_pid=os.getpid(),
            notebook=self.spec.notebook,
            updated=time.time(),
        )
        try:
            write_json_atomic(self.folder.status_file, summary)
        except OSError:
            self.sink.changed.set()  # a full disk: try again at the next round

    def _finish(self, outcome: tuple[str, str | None]) -> None:
        status, reason = outcome
        spare_pid = None
        if self.spare is not None:
            spare_pid = self.spare.proc.pid
            self.spare.proc.stdin.close()  # type: ignore[union-attr]  # "not needed": it exits
            self.spare = None

        # The spare agent and the zygotes (still importing torch under load, they read their
        # orders only afterwards) and the job's guardian are machinery, not orphans: ended here.
        def machinery_of(pid: int) -> bool:
            return pid == spare_pid or _is_ours(pid, b"notebook_elastic.runtime.warm\0serve", b"local.guardian")

        deadline = time.monotonic() + EXIT_GRACE_S
        while [p for p in processes_of(self.folder.path) if not machinery_of(p)] and time.monotonic() < deadline:
            time.sleep(0.05)
        machinery = [p for p in processes_of(self.folder.path) if machinery_of(p)]
        for pid in machinery:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        leftovers = [p for p in kill_all(self.folder.path, grace_s=2.0) if p not in machinery]
        data: dict[str, Any] = {"status": status}
        if reason:
            data["reason"] = reason
        if leftovers:
            data["orphans_killed"] = len(leftovers)
        self.emit(Kind.JOB_FINISHED, **data)
        self.sink.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if not self.folder.events_file.exists():
            return  # deleted under us: nothing left to record in
        self._write_status()
        info = self.folder.supervisor() or {}
        info["exited"] = True
        try:
            write_json_atomic(self.folder.supervisor_file, info, mode=0o600)
        except OSError:
            pass  # a full disk: the process is gone all the same, which is what readers check


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # Everything the job creates from here on (logs, events, checkpoints, by the supervisor,
    # its agents and their workers) is private to its owner, whatever the kernel's umask.
    os.umask(JOB_UMASK)
    if args and args[0] == "--detach":
        # Leave the kernel's process tree: the kernel reaps this short-lived parent at once,
        # and the supervisor lives on under init, in the session it was started in.
        args = args[1:]
        if os.fork() > 0:
            os._exit(0)
    resume = args[:1] == ["--resume"]
    folder = JobFolder(args[1] if resume else args[0])
    os.chdir(folder.spec().get("backend_options", {}).get("cwd") or folder.path)
    return Supervisor(folder, resume=resume).run()


if __name__ == "__main__":
    sys.exit(main())

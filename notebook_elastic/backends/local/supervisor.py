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
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ... import defaults
from ..._warm import remove_sockets_of
from ...events import Event, Kind, LineParser
from ...job_state import JobState, budget_spent_reason
from ...runtime import protocol
from ...runtime.state import newest_generation
from ...runtime.store import host_store
from ...spec import JobSpec
from .control import listen
from .folder import JobFolder, kill_all, process_start_ticks, write_json_atomic

STOP_GRACE_S = 10.0


@dataclass
class Agent:
    name: str
    proc: subprocess.Popen
    started: float
    epoch: int
    exit_reason: str | None = None  # set when we signal it on purpose
    reaped: bool = False
    readers: list[threading.Thread] = field(default_factory=list)
    parsers: list[LineParser] = field(default_factory=list)
    log: IO[bytes] | None = None
    log_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class EventSink:
    """The single writer of events.jsonl; folds every event into the supervisor's JobState."""

    def __init__(self, path: Path, state: JobState, observe: Any) -> None:
        self.file = open(path, "a", buffering=1 << 16)
        self.state = state
        self.observe = observe
        self.lock = threading.Lock()
        self.queue: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        self.changed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="event-sink", daemon=True)
        self.thread.start()

    def put(self, event: Event) -> None:
        self.queue.put(event)

    def _run(self) -> None:
        while True:
            event = self.queue.get()
            batch = [event]
            while True:  # drain what is waiting, then flush once
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            done = False
            with self.lock:
                for item in batch:
                    if item is None:
                        done = True
                        continue
                    try:
                        line = item.to_line()
                    except (TypeError, ValueError):  # not JSON (a worker sent something odd): dropped
                        continue
                    self.file.write(line + "\n")
                    self.state.apply(item)  # never raises: a bad event is dropped there
                    try:
                        self.observe(item)
                    except Exception:  # an observer's bug must not stop the history
                        traceback.print_exc()
                self.file.flush()
            self.changed.set()
            if done:
                self.file.close()
                return

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)


class Supervisor:
    def __init__(self, folder: JobFolder, resume: bool = False) -> None:
        self.folder = folder
        self.resume = resume
        self.spec = JobSpec.from_json(folder.spec())
        self.range = self.spec.nnodes
        self.target = self.spec.initial_nodes
        # Above every generation already in the checkpoint folder (a resumed job, a reused
        # --checkpoint-dir): this run's groups read those checkpoints and are never fenced off.
        newest = newest_generation(Path(self.spec.checkpoint_dir or folder.checkpoints))
        self.epoch = newest // protocol.GENERATION_EPOCH_STRIDE + 1 if newest >= 0 else 0
        self.rdzv_base = f"{self.spec.name}-{uuid.uuid4().hex[:8]}"
        self.agents: dict[str, Agent] = {}
        self.next_index = 0
        self.returns: list[float] = []  # times at which preempted capacity comes back
        self.stopping = False
        self.stop_deadline: float | None = None
        self.commands: queue.SimpleQueue[tuple[dict, Any]] = queue.SimpleQueue()
        self.workers: dict[int, tuple[int, str, Any]] = {}  # rank -> (pid, node, generation)
        self.state = JobState(max_restarts=self.spec.max_restarts, nnodes=self.range, target=self.target)
        self.folder.logs.mkdir(exist_ok=True)
        self.sink = EventSink(folder.events_file, self.state, self._observe)
        self.authkey = secrets.token_bytes(32)
        self.gpus = _visible_gpus()
        self.spare: Agent | None = None
        self.spare_retry_at = 0.0
        self.warm_spare = bool(self.spec.backend_options.get("warm_spare", True))

    # -- events --------------------------------------------------------------------------

    def emit(self, kind: str, node: str | None = None, **data: Any) -> None:
        self.sink.put(Event(kind, time.time(), node, data))

    def _observe(self, e: Event) -> None:
        """Called by the sink thread for every event: track where each rank's process is."""
        if e.kind == Kind.WORKER_STARTED:
            gen = e.get("generation")
            stale = [r for r, (_p, _n, g) in self.workers.items() if g != gen]
            for r in stale:
                del self.workers[r]
            self.workers[int(e.get("rank", 0))] = (int(e.get("pid")), e.node or "", gen)
        elif e.kind in (Kind.WORKER_FINISHED,):
            self.workers.pop(int(e.get("rank", -1)), None)

    # -- agents --------------------------------------------------------------------------

    def _agent_command(self) -> list[str]:
        lo, hi = self.range
        conf = defaults.rdzv_conf(join_timeout_s=defaults.JOIN_TIMEOUT_S_LOCAL, is_host=False)
        conf.update(self.spec.rdzv_conf)
        return [
            sys.executable,
            "-m",
            "notebook_elastic.runtime.agent",
            "--nnodes",
            f"{lo}:{hi}",
            "--nproc-per-node",
            str(self.spec.nproc_per_node),
            "--max-restarts",
            str(self.spec.max_restarts),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{self.store_port}",
            "--rdzv-id",
            f"{self.rdzv_base}-e{self.epoch}",
            "--rdzv-conf",
            ",".join(f"{k}={v}" for k, v in conf.items()),
            "--monitor-interval",
            str(self.spec.monitor_interval_s),
            "--local-addr",
            "127.0.0.1",
            str(self.folder.script),
        ]  # [3:] are torchrun's own arguments

    def _agent_env(self, name: str, index: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.spec.env)
        cwd = self.spec.backend_options.get("cwd") or os.getcwd()
        env.update(
            {
                protocol.ENV_JOB: self.spec.name,
                protocol.ENV_JOB_DIR: str(self.folder.path),
                protocol.ENV_NODE: name,
                protocol.ENV_CHECKPOINT_DIR: self.spec.checkpoint_dir or str(self.folder.checkpoints),
                protocol.ENV_SUPERVISOR_PID: str(os.getpid()),
                protocol.ENV_RDZV_EPOCH: str(self.epoch),
                protocol.ENV_COLLECTIVE_TIMEOUT_S: str(self.spec.collective_timeout_s),
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "LOGLEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
                # Files the notebook imports from its own folder import the same way here.
                "PYTHONPATH": os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p),
            }
        )
        if self.gpus:
            n = self.spec.nproc_per_node
            share = [self.gpus[(index * n + i) % len(self.gpus)] for i in range(n)]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(share)
        return env

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
        agent = Agent(name, proc, time.time(), self.epoch, log=open(self.folder.logs / f"{name}.log", "ab"))
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            parser = LineParser(name, stream)
            t = threading.Thread(target=self._read, args=(agent, parser, pipe), name=f"{name}-{stream}", daemon=True)
            t.start()
            agent.parsers.append(parser)
            agent.readers.append(t)
        return agent

    def start_agent(self) -> Agent:
        index = self.next_index
        self.next_index += 1
        name = f"node-{index}"
        env = self._agent_env(name, index)
        spare, self.spare = self.spare, None
        if spare is not None and spare.alive:
            # A warm spare: Python and torch are already imported; tell it who it is.
            node_env = {k: v for k, v in env.items() if os.environ.get(k) != v}
            order = json.dumps({"env": node_env, "argv": self._agent_command()[3:]}) + "\n"
            try:
                spare.proc.stdin.write(order.encode())  # type: ignore[union-attr]
                spare.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                spare = None
        if spare is not None and spare.alive:
            agent = spare
            with agent.log_lock:
                agent.log.close()  # type: ignore[union-attr]
                os.replace(self.folder.logs / f"{agent.name}.log", self.folder.logs / f"{name}.log")
                agent.log = open(self.folder.logs / f"{name}.log", "ab")
            agent.name = name
            agent.epoch = self.epoch
            agent.started = time.time()
            for parser in agent.parsers:
                parser.node = name
        else:
            agent = self._spawn(name, self._agent_command(), env)
            agent.proc.stdin.close()  # type: ignore[union-attr]
        self.agents[name] = agent
        self.emit(Kind.NODE_JOINED, name, pid=agent.proc.pid, epoch=self.epoch, warm=agent is spare)
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
            env = self._agent_env("spare", self.next_index)
            self.spare = self._spawn(f"spare-{self.next_index}", [*self._agent_command()[:3], "--standby"], env)
        elif not wanted and self.spare is not None:
            self.spare.proc.stdin.close()  # type: ignore[union-attr]
            self.spare = None

    def _read(self, agent: Agent, parser: LineParser, pipe: IO[bytes]) -> None:
        for raw in iter(pipe.readline, b""):
            now = time.time()
            with agent.log_lock:
                agent.log.write(raw)  # type: ignore[union-attr]
            event = parser.feed(raw.decode("utf-8", "replace"), now)
            if event is not None and not agent.name.startswith("spare-"):
                self.sink.put(event)
        pipe.close()

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
            remove_sockets_of(agent.proc.pid)
            for t in agent.readers:
                t.join(timeout=2.0)  # let its last lines in before it is declared gone
            code = agent.proc.returncode
            reason = agent.exit_reason or protocol.exit_reason(code)
            if agent.exit_reason is None and code != 0 and not self.stopping:
                # It died on its own (restart budget spent, rendezvous error, killed from
                # outside): a lost node, not replaced.
                self.target = max(0, self.target - 1)
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
            alive.append(self.start_agent())
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

    def do_remove_node(
        self, node: str | None = None, how: str = "preempt", return_after_s: float | None = None
    ) -> dict:
        agent = self._pick_agent(node)
        self.target = max(0, self.target - 1)
        if how == "lose":
            self.signal_agent(agent, signal.SIGKILL, "lost")
        else:
            self.signal_agent(agent, signal.SIGTERM, "preempted")
        if return_after_s is not None:
            self.returns.append(time.monotonic() + float(return_after_s))
        self.emit(Kind.FAULT, agent.name, fault=f"{how}_node", target=agent.name, return_after_s=return_after_s)
        return {"node": agent.name, "target": self.target}

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
            with open(self.folder.events_file, "rb") as f:
                history = [e for e in (_parse(line) for line in f) if e is not None]
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
        status = self._loop()
        self._finish(status)
        del store
        self.closed = True
        listener.close()
        return 0

    def _loop(self) -> tuple[str, str | None]:
        last_status = 0.0
        while True:
            try:
                request, reply = self.commands.get(timeout=0.05)
                try:
                    reply.put({"ok": True, "result": self._handle(request)})
                except Exception as exc:
                    reply.put({"ok": False, "error": str(exc)})
            except queue.Empty:
                pass
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
            if self.stopping and self.stop_deadline and now > self.stop_deadline:
                for agent in self.alive_agents():
                    self.signal_agent(agent, signal.SIGKILL, "stopped")
            if self.sink.changed.is_set() and time.monotonic() - last_status > 0.25:
                self.sink.changed.clear()
                last_status = time.monotonic()
                self._write_status()
            if not self.alive_agents() and all(a.reaped for a in self.agents.values()):
                if self.stopping:
                    return "stopped", "stopped on request"
                if any(a.proc.returncode == 0 for a in self.agents.values()):
                    return "succeeded", None
                if self.returns:
                    continue  # capacity comes back later: wait for it
                return "failed", self._failure_reason()

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
        write_json_atomic(self.folder.status_file, summary)

    def _finish(self, outcome: tuple[str, str | None]) -> None:
        status, reason = outcome
        if self.spare is not None:
            self.spare.proc.stdin.close()  # type: ignore[union-attr]
            self.spare = None
        leftovers = kill_all(self.folder.path, grace_s=2.0)
        data: dict[str, Any] = {"status": status}
        if reason:
            data["reason"] = reason
        if leftovers:
            data["orphans_killed"] = len(leftovers)
        self.emit(Kind.JOB_FINISHED, **data)
        self.sink.close()
        self._write_status()
        info = self.folder.supervisor() or {}
        info["exited"] = True
        write_json_atomic(self.folder.supervisor_file, info, mode=0o600)


def _visible_gpus() -> list[str]:
    """GPU ids to split across agents: CUDA_VISIBLE_DEVICES, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
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


def _parse(line: bytes) -> Event | None:
    try:
        return Event.from_line(line.decode("utf-8", "replace"))
    except (ValueError, KeyError, TypeError):
        return None  # a torn last line of a supervisor that died mid-write


if __name__ == "__main__":
    sys.exit(main())

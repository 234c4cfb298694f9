"""The supervisor's commands, as the kernel sends them over the control connection
(``control.py``): scale, set the range (new agents in a new rendezvous epoch), the drills
(kill a worker, preempt or lose a node), stop, status. ``_answer`` queues each request; the
supervisor's main loop runs them one at a time. Held by the ``Supervisor``; handed the course
(its membership, its phase), which they change, the nodes they steer, and what a drill or the
status reads (the workers table, the notices, the store's board, the fold), not the supervisor."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ..contract import commands
from ..contract.event_types import Fault, Kind, Scaled
from ..contract.job_state import JobState
from ..errors import SpecError
from ..plumbing import log as _logging
from .board import Board
from .membership import Course, Phase
from .nodes import Agent, Nodes, Workers
from .notices import Notices
from .placement import Placement
from .sink import EventSink

_log = _logging.get("supervisor.commands")

#: The kernel's requests (and SIGTERM's stop), each with where its answer goes, run one at a
#: time by the supervisor's main loop.
Requests = queue.SimpleQueue[tuple[dict[str, Any], queue.SimpleQueue[dict[str, Any]]]]

#: After a control connection could not be accepted, the wait before the next try.
ACCEPT_RETRY_S = 0.1


def _never(command: NoReturn) -> NoReturn:
    """What no command reaches (typing.assert_never, which Python 3.10 lacks)."""
    raise AssertionError(f"a command no case takes: {command!r}")


class Commands:
    """What the kernel may ask of a running job."""

    def __init__(
        self,
        *,
        course: Course,
        nodes: Nodes,
        board: Board,
        placement: Placement,
        workers: Workers,
        notices: Notices,
        sink: EventSink,
        state: JobState,
        emit: Callable[..., None],
        requests: Requests,
    ) -> None:
        self.course = course
        self.nodes = nodes
        self.board = board
        self.placement = placement
        self.workers = workers
        self.notices = notices
        self.sink = sink
        self.state = state  # read under the sink's lock: the sink's thread folds into it
        self.emit = emit
        self.requests = requests

    def _pick_agent(self, node: str | None) -> Agent:
        alive = self.nodes.staying_agents()
        if node is None:
            if not alive:
                raise ValueError("no node is running right now")
            return random.choice(alive)
        for agent in alive:
            if agent.name == node:
                return agent
        names = ", ".join(a.name for a in alive) or "none"
        raise ValueError(f"node {node!r} is not running (running: {names})")

    def do_scale(self, nodes: int) -> dict[str, Any]:
        self.course.scale(nodes)
        self.nodes.converge()
        return {"target": nodes}

    def do_set_range(self, min_nodes: int, max_nodes: int) -> dict[str, Any]:
        ranged = self.course.membership.ranged(min_nodes, max_nodes)  # refused here when invalid
        if ranged.range == self.course.membership.range:
            return {"target": self.course.membership.target, "reconfigured": False}
        try:
            self.nodes.plan((min_nodes, max_nodes))  # refused here, before any agent is stopped
        except SpecError as e:
            raise ValueError(str(e).replace("--nnodes", "range", 1)) from None
        # torchrun bakes --nnodes into every agent: a new range means new agents, in a new
        # rendezvous epoch, resuming from the latest checkpoint.
        self.course.membership = ranged
        old = self.nodes.alive_agents()
        for agent in old:
            self.nodes.signal_agent(agent, signal.SIGTERM, "reconfigured")
        deadline = time.monotonic() + self.nodes.stop_grace_s()
        while any(a.alive for a in old) and time.monotonic() < deadline:
            time.sleep(0.05)
        for agent in old:
            if agent.alive:
                self.nodes.signal_agent(agent, signal.SIGKILL, "reconfigured")
                try:
                    agent.proc.wait(timeout=15)  # on Slurm its step ends first, then its srun
                except subprocess.TimeoutExpired:
                    os.killpg(agent.proc.pid, signal.SIGKILL)
                    agent.proc.wait()
        self.nodes.reap()
        self.nodes.reuse_names_of(old)  # the new agents are the same nodes, told a new range
        self.emit(
            Kind.SCALED,
            **Scaled(target=ranged.target, min_nodes=min_nodes, max_nodes=max_nodes, reconfigured=True),
        )
        self.nodes.converge()
        return {"target": ranged.target, "reconfigured": True}

    def do_kill_worker(self, rank: int | None = None) -> dict[str, Any]:
        if not self.workers:
            raise ValueError(
                "no worker is running right now (the job is starting or restarting); try again in a moment"
            )
        if rank is None:
            rank = random.choice(sorted(self.workers))
        if rank not in self.workers:
            raise ValueError(f"rank {rank} is not running (running ranks: {sorted(self.workers)})")
        pid, node, _gen = self.workers[rank]
        if not self.kill_rank(rank):
            raise ValueError(f"rank {rank} (pid {pid}) already exited")
        self.emit(Kind.FAULT, node, **Fault(fault="kill_worker", target=f"rank {rank}", rank=rank, pid=pid))
        return {"rank": rank, "pid": pid, "node": node}

    def kill_rank(self, rank: int) -> bool:
        """SIGKILL a rank's process: here, or on Slurm through its node's keeper (the worker may
        be on another host, where its pid is not ours: notice_keeper.py). False when it is gone."""
        pid, node, _gen = self.workers[rank]
        return self.placement.kill_rank(pid, node, rank, self.board.store)

    def do_remove_node(
        self,
        node: str | None = None,
        how: str = "preempt",
        return_after_s: float | None = None,
        grace_s: float | None = None,
    ) -> dict[str, Any]:
        """Take a node away: lost (SIGKILL, no notice), or preempted (SIGTERM), after a notice
        of ``grace_s`` seconds when given (the job saves first: notices.py)."""
        if grace_s is not None and not 0 <= float(grace_s) <= 3600:
            raise ValueError(f"grace_s={grace_s!r}: give 0 to 3600 seconds (0: no notice)")
        grace_s = None if grace_s is None else float(grace_s)
        agent = self._pick_agent(node)
        self.course.lower(agent.name, "lost" if how == "lose" else "preempted")
        noticed = False
        if how == "lose":
            workers = tuple(pid for pid, node, _gen in self.workers.values() if node == agent.name)
            self.nodes.signal_agent(agent, signal.SIGKILL, "lost", workers)
        elif grace_s and self.notices.give(
            agent, grace_s, stays=len([a for a in self.nodes.staying_agents() if a is not agent])
        ):
            agent.exit_reason = "preempted"  # going: not a node to keep, pick or stop again
            noticed = True
        else:
            self.nodes.signal_agent(agent, signal.SIGTERM, "preempted")
        if return_after_s is not None:
            self.course.membership = self.course.membership.returning(time.monotonic() + float(return_after_s))
        fault = Fault(fault=f"{how}_node", target=agent.name, return_after_s=return_after_s)
        if noticed and grace_s is not None:  # (noticed: a notice of grace_s seconds was given)
            fault["grace_s"] = grace_s
        self.emit(Kind.FAULT, agent.name, **fault)
        return {
            "node": agent.name,
            "target": self.course.membership.target,
            **({"grace_s": grace_s} if noticed else {}),
        }

    def do_stop(self, leave: str | None = None) -> dict[str, Any]:
        """Stop every node but ``leave`` (one ending on its own); any left at the deadline is killed."""
        if self.course.stop(self.nodes.stop_grace_s()):
            for agent in self.nodes.alive_agents():
                if agent.name != leave:
                    self.nodes.signal_agent(agent, signal.SIGTERM, "stopped")
        return {"stopping": True}

    def do_status(self) -> dict[str, Any]:
        with self.sink.lock:
            return {**self.state.summary()}

    def handle(self, request: dict[str, Any]) -> Any:
        """Carry out one request of the kernel's (typed once: ``contract/commands.py``)."""
        command = commands.parse(request)
        if self.course.stopping and not isinstance(command, commands.WHILE_STOPPING):
            raise ValueError(f"the job is stopping, so it cannot {commands.words(command)}")
        match command:
            case commands.Scale(nodes):
                return self.do_scale(nodes)
            case commands.SetRange(min_nodes, max_nodes):
                return self.do_set_range(min_nodes, max_nodes)
            case commands.KillWorker(rank):
                return self.do_kill_worker(rank)
            case commands.RemoveNode(how, node, return_after_s, grace_s):
                return self.do_remove_node(node, how, return_after_s, grace_s)
            case commands.Stop():
                return self.do_stop()
            case commands.Status():
                return self.do_status()
            case _:  # every command is taken above: the type checker says so when one is added
                _never(command)

    def serve(self, listener: Any) -> None:
        while True:
            try:
                conn = listener.accept()
            except Exception:
                if self.course.phase is Phase.ENDED:
                    return
                time.sleep(ACCEPT_RETRY_S)  # out of descriptors, say: never spin on it
                continue
            threading.Thread(target=self._answer, args=(listener, conn), daemon=True).start()

    def _answer(self, listener: Any, sock: Any) -> None:
        try:
            conn = listener.authenticate(sock)
        except Exception:
            _log.debug("a control connection that did not authenticate", exc_info=True)
            return
        try:
            request = json.loads(conn.recv_bytes())
            done: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
            self.requests.put((request, done))
            conn.send_bytes(json.dumps(done.get(timeout=120), default=str).encode())
        except Exception:
            _log.debug("a control request failed or its caller left", exc_info=True)
        finally:
            conn.close()

"""``python -m notebook_elastic.supervisor.run JOB_DIR``: one detached process per job.

It runs in its own session, so a kernel crash or restart does not touch training. It
- hosts the job's c10d rendezvous store (no agent hosts it, so any node may die);
- runs one torchrun agent per simulated node (``notebook_elastic.agent.run``), each in
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
Requests come over an authenticated connection (``control.py``; loopback, every interface on Slurm).
"""

from __future__ import annotations

import os
import queue
import secrets
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..contract import protocol
from ..contract.event_types import (
    SCHEMA_VERSION,
    AgentStarted,
    Error,
    JobFinished,
    Kind,
    Metric,
    NodeEvicted,
    Rendezvous,
    Restart,
    Tracking,
    WorkerExited,
    WorkerFailed,
    WorkerFinished,
    WorkerStarted,
)
from ..contract.events import Event
from ..contract.job_state import JobState, describe_failure
from ..contract.plan import rdzv_id
from ..contract.spec import JobSpec
from ..jobfolder.control import listen, reachable
from ..jobfolder.folder import JOB_UMASK, JobFolder, write_json_atomic
from ..jobfolder.follow import LOST_FOLDER, SUPERVISOR_START_TIMEOUT_S
from ..jobfolder.history import ROTATE_BYTES, read_all
from ..jobfolder.processes import process_start_ticks
from ..plumbing import log
from ..runtime.payload import payload_path_for
from ..runtime.state import newest_generation
from ..runtime.tracking import tensorboard_link
from ..store.run import host_store
from .board import Board
from .commands import Commands, Requests
from .membership import DELETED, Course, Membership, Phase, ending
from .nodes import Nodes, Workers
from .notices import Notices
from .outcome import Outcome
from .placement import Placement
from .repeats import Repeats
from .sink import EventSink
from .slurm_nodes import SlurmPlacement
from .stall import Stalls
from .tensorboard import TensorBoardWriter
from .tensorboard import available as tensorboard_available
from .trackers import TRACKER_CLASSES, Tracker, requested

_log = log.get("supervisor")
#: Put in the requests to turn the loop now (an event it acts on came): no command, no reply.
WAKE: tuple[dict[str, Any], queue.SimpleQueue[dict[str, Any]]] = ({}, queue.SimpleQueue())


class Supervisor:
    """One job's supervisor: where its parts are built and wired, the event sink's observer, and
    the main loop. It holds its collaborators: the course (membership and phase, membership.py),
    the board (the store and what the agents read in it), the nodes (agents started, logged,
    signalled, reaped), the commands the kernel sends, the stall watch, the notices and the
    outcome; each keeps its own state and is handed the others it uses, never the supervisor."""

    def __init__(self, folder: JobFolder, resume: bool = False, start_lock: int | None = None) -> None:
        self.folder = folder
        self.resume = resume
        self.start_lock = start_lock  # the folder's (JobFolder.hold_start), let go once announced
        self.spec = JobSpec.from_json(folder.spec())
        # spec.json names the --env variables; their values are in the 0600 secret.json.
        secret = folder.secret()
        self.spec.env.update(secret.get("env") or {})
        files_sha256 = secret.get("files_sha256")
        if files_sha256 is None:  # a folder written by hand: trust the files as they are now
            paths = [folder.script, payload_path_for(folder.script)]
            files_sha256 = {str(p): protocol.sha256_of(p) for p in paths if p.exists()}
        self.files_sha256: dict[str, str] = dict(files_sha256)
        # Above every generation already in the checkpoint folder (a resumed job, a reused
        # --checkpoint-dir): this run's groups read those checkpoints and are never fenced off.
        newest = newest_generation(Path(self.spec.checkpoint_dir or folder.checkpoints))
        # The job's membership, one typed value its transitions replace, and its phase (membership.py).
        self.course = Course(
            Membership(
                target=self.spec.initial_nodes,
                range=self.spec.nnodes,
                epoch=newest // protocol.GENERATION_EPOCH_STRIDE + 1 if newest >= 0 else 0,
            ),
            self.emit,
        )
        self.run_id = uuid.uuid4().hex[:8]
        # The kernel's requests (and SIGTERM's stop), run one at a time by the main loop.
        self.requests: Requests = queue.SimpleQueue()
        self.workers: Workers = {}  # rank -> (pid, node, generation)
        self.state = JobState(
            max_restarts=self.spec.max_restarts,
            nnodes=self.course.membership.range,
            target=self.course.membership.target,
        )
        self.folder.logs.mkdir(exist_ok=True)
        self.tensorboard: TensorBoardWriter | None = None  # once torch is imported (run())
        self.trackers: list[Tracker] = []  # MLflow, W&B: --track or their variables (run())
        self.board = Board()  # the store, once hosted: what the agents read beside their round
        self.authkey = secrets.token_bytes(32)
        # Where a node runs: here, or on Slurm each node an allocation of its own.
        self.placement = SlurmPlacement(self.spec, folder, self.emit) if self.spec.backend == "slurm" else Placement()
        self.repeats = Repeats()  # a failure that comes back at every retry stops the job
        self.evictions: queue.SimpleQueue[str] = queue.SimpleQueue()  # nodes to send away (sink -> loop)
        # The sink first (every part is handed it); what it calls back is the parts' built below.
        self.sink = EventSink(
            folder.events_file,
            self.state,
            self._observe,
            lambda: self.nodes.output_allowed(),
            int(self.spec.backend_options.get("events_rotate_bytes", ROTATE_BYTES)),
            status_changed=lambda: self.outcome.status_folded(),
        )
        # Nodes given notice before they go (preempt_node(grace_s=...)): let go once rank 0 saved.
        self.notices = Notices(
            lambda: self.board.store,
            self.emit,
            lambda agent: self.nodes.signal_agent(agent, signal.SIGTERM, "preempted"),
        )
        self.nodes: Nodes = Nodes(
            self.spec,
            folder,
            files_sha256=self.files_sha256,
            run_id=self.run_id,
            course=self.course,
            placement=self.placement,
            board=self.board,
            sink=self.sink,
            state=self.state,
            notices=self.notices,
            emit=self.emit,
            wake=lambda: self.requests.put(WAKE),
        )
        self.commands = Commands(
            course=self.course,
            nodes=self.nodes,
            board=self.board,
            placement=self.placement,
            workers=self.workers,
            notices=self.notices,
            sink=self.sink,
            state=self.state,
            emit=self.emit,
            requests=self.requests,
        )
        self.stalls = Stalls(
            self.spec,
            sink=self.sink,
            state=self.state,
            emit=self.emit,
            workers=self.workers,
            placement=self.placement,
            kill_rank=self.commands.kill_rank,
        )
        self.outcome: Outcome = Outcome(
            self.spec,
            folder,
            course=self.course,
            nodes=self.nodes,
            sink=self.sink,
            state=self.state,
            emit=self.emit,
        )

    def emit(self, kind: str, node: str | None = None, **data: Any) -> None:
        self.sink.put(Event(kind, time.time(), node, data))

    def _observe(self, e: Event) -> None:
        """Called by the sink thread for every event: track where each rank's process is."""
        self._watch_joiners(e)
        self.notices.observe(e)
        if e.kind == Kind.SAVED_ON_NOTICE:
            self.requests.put(WAKE)  # the node goes at once, not at the loop's next turn (up to 0.05 s)
        # TensorBoard files, like workers' lines, only above the free-space floor (room for the outcome).
        if self.tensorboard is not None and e.kind in (Kind.METRIC, Kind.GPU) and self.nodes.output_allowed():
            self.tensorboard.observe(e, self.state)
        if e.kind == Kind.METRIC and self.trackers and self.nodes.output_allowed():
            for tracker in self.trackers:
                tracker.observe(e, self.state)
        if e.kind == Kind.RENDEZVOUS:
            formed = e.fields(Rendezvous)
            epoch = int(formed.get("epoch") or 0)
            round_ = formed.get("round")
            self.board.round_formed(rdzv_id(self.spec.name, self.run_id, epoch), epoch, round_)
            if e.node in self.nodes.agents and round_ is not None:
                self.nodes.agents[e.node].round = (epoch, int(round_))
        if e.kind == Kind.AGENT_SIGNALED and e.node in self.nodes.agents:
            self.nodes.signaled(self.nodes.agents[e.node])
        if e.kind == Kind.AGENT_STARTED and e.node in self.nodes.agents:
            self.nodes.agents[e.node].agent_pid = e.fields(AgentStarted).get("pid")
        if e.kind == Kind.WORKER_STARTED:
            started = e.fields(WorkerStarted)
            gen = started.get("generation")
            stale = [r for r, (_p, _n, g) in self.workers.items() if g != gen]
            for r in stale:
                del self.workers[r]
            self.workers[int(started.get("rank", 0))] = (int(started["pid"]), e.node or "", gen)
            self.stalls.started(int(started["pid"]), int(started.get("rank", 0)))
        elif e.kind in (Kind.WORKER_FINISHED,):
            self.workers.pop(int(e.fields(WorkerFinished).get("rank", -1)), None)
        elif e.kind == Kind.WORKER_FAILED:
            self._failed(e)

    def _failed(self, e: Event) -> None:
        """A worker's failure that will come back at every retry is not retried to the end of
        the budget: a fatal one, or the same one twice at the same step (``repeats.py``)."""
        if self.course.fatal is not None:
            return
        said = self.repeats.verdict(e, self.workers, self.state.restarts, self.state.max_restarts)
        if said is not None:
            if said[1]:
                self.course.fatal_node = e.node  # first: the loop stops the job as soon as fatal is set
            self.course.fatal = said[0]

    def _tracker_opened(self, where: Tracking) -> None:
        self.emit(Kind.TRACKING, **where)

    def _tracker_failed(self, message: str) -> None:
        log.get("supervisor").warning("%s", message)  # supervisor.log: told even after the history closed
        self.emit(Kind.ERROR, **Error(error="tracker", message=message))

    def _watch_joiners(self, e: Event) -> None:
        """A node whose workers fail before any group it joined made a step, while other nodes
        have trained, fails while joining (a module missing there, a broken GPU, NCCL or gloo
        init failing on it alone): torchrun would retry it, pulling the healthy nodes into
        every retry, until its budget is spent, and then close the rendezvous on them all.
        It is sent away once its first failure has been charged (one restart)."""
        agent = self.nodes.agents.get(e.node or "")
        if e.kind in (Kind.METRIC, Kind.CHECKPOINT):
            # (A checkpoint event carries no rank: only a metric's marks its generation's nodes.)
            rank = e.fields(Metric).get("rank") if e.kind == Kind.METRIC else None
            newest = max((g for _p, _n, g in self.workers.values() if g is not None), default=None)
            if rank in self.workers and self.workers[rank][2] == newest:
                for _pid, node, gen in list(self.workers.values()):
                    if gen == newest and node in self.nodes.agents:
                        self.nodes.agents[node].progressed = True
            return
        if agent is None or agent.progressed:
            return
        exitcode = e.fields(WorkerExited).get("exitcode") if e.kind == Kind.WORKER_EXITED else None
        if e.kind == Kind.WORKER_FAILED and e.fields(WorkerFailed).get("cause") != "peer":
            agent.failure = describe_failure(e)
        elif e.kind == Kind.WORKER_EXITED and (exitcode or 0) > 0 and exitcode != protocol.EXIT_PEER_LOST:
            agent.failure = agent.failure or f"a worker on {agent.name} exited with code {exitcode}"
        elif e.kind == Kind.RESTART and e.fields(Restart).get("reason") == "worker_failed" and agent.failure:
            if any(a.progressed for a in self.nodes.staying_agents() if a is not agent):
                self.evictions.put(agent.name)

    def _evict(self, name: str) -> None:
        """Send away a node that failed while joining: the others go on at their size."""
        agent = self.nodes.agents.get(name)
        if agent is None or not agent.alive or agent.exit_reason is not None or self.course.stopping:
            return
        self.nodes.signal_agent(agent, signal.SIGTERM, "evicted")  # SIGTERM: it leaves the round, never closes it
        self.course.lower(agent.name, "evicted")
        self.emit(
            Kind.NODE_EVICTED, agent.name, **NodeEvicted(failure=agent.failure, target=self.course.membership.target)
        )

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.requests.put(({"command": "stop"}, queue.SimpleQueue())))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Listen first, host the store there once torch is imported: agents started meanwhile wait in the backlog.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        bind = self.placement.bind_address  # Slurm: reached from other hosts
        sock.bind((bind, 0))
        sock.listen(512)
        self.board.port = sock.getsockname()[1]
        listener = listen(self.authkey, bind)
        spec, before = self.spec, None
        # A stop that finds no supervisor.json yet writes the job's end itself (the CLI, a
        # kernel, while Slurm started this one). The start lock makes such a stop wait; where it
        # could not be had (a file system without locks), the stops are counted here and looked
        # for once this file is written, so a supervisor that started under one stops at once.
        unguarded = not self.resume and self.start_lock is None
        stops_before = self._stops_recorded() if unguarded else 0
        self.folder.keep_room()  # the room for the last records; a resumed job's old outcome cleared
        if self.resume:
            # The history so far, folded, so status.json goes on from it (steps, metrics).
            history = list(read_all(self.folder.events_file))
            with self.sink.lock:
                self.state.apply_all(history)
                before = self.state.status if self.state.finished else "lost"
                # The range and the size the run was left at (the slider, scale()), not the
                # spec's first ones (#39 item 3: a resume put a 1:4 job back to 1:2).
                self.course.membership = self.course.membership.resumed_at(*self.state.nnodes, self.state.target)
        self.emit(
            Kind.JOB_RESUMED if self.resume else Kind.JOB_SUBMITTED,
            **({"after": before} if self.resume else {}),
            schema=SCHEMA_VERSION,
            name=spec.name,
            nodes=self.course.membership.target,
            min_nodes=self.course.membership.min_nodes,
            max_nodes=self.course.membership.max_nodes,
            nproc_per_node=spec.nproc_per_node,
            max_restarts=spec.max_restarts,
            backend=self.spec.backend,
            gpus=len(self.nodes.gpus),
            notebook=spec.notebook,
        )
        # Announced after the job's first event is written and status.json counts it: a
        # launcher that sees this file (launch, resume) returns to a stream and a listing that
        # already say the job (re)started, never the outcome a resumed job continues from.
        self.sink.flush(timeout_s=10.0)
        self.outcome.write_status()
        write_json_atomic(
            self.folder.supervisor_file,
            {
                "pid": os.getpid(),
                "start_ticks": process_start_ticks(os.getpid()),
                "control": reachable(listener.address),
                "host": socket.gethostname(),
                "slurm_job": os.environ.get("SLURM_JOB_ID"),  # the supervisor's own allocation, if any
                "authkey": self.authkey.hex(),
                "rdzv_port": self.board.port,
                "started": time.time(),
            },
            mode=0o600,
        )
        if self.start_lock is not None:
            os.close(self.start_lock)  # announced: a stop from now on finds this supervisor
            self.start_lock = None
        elif unguarded and self._stops_recorded() > stops_before:
            _log.info("job %r was stopped while its supervisor started: it stops at once", spec.name)
            self.requests.put(({"command": "stop"}, queue.SimpleQueue()))
        threading.Thread(target=self.commands.serve, args=(listener,), daemon=True).start()
        self.nodes.converge()
        self.board.store = host_store(sock)
        self.course.phase = Phase.RUNNING
        self.board.publish_target(self.course.membership.target)
        if tensorboard_available():  # metrics come only through the store: none was missed
            self.tensorboard = TensorBoardWriter(self.folder.path / "tensorboard")
            self.emit(Kind.TRACKING, **tensorboard_link(str(self.folder.path)))
        self.trackers = [
            TRACKER_CLASSES[t](spec, self._tracker_failed, self._tracker_opened)
            for t in requested(spec.track, os.environ)
        ]
        status = self._loop()
        self.outcome.finish(status, self.trackers, self.tensorboard)
        self.board.store = None  # the store server goes with the last reference
        self.course.phase = Phase.ENDED
        listener.close()
        return 0

    def _loop(self) -> tuple[str, str | None]:
        last_status = last_folder_check = 0.0
        while True:
            try:
                request, reply = self.requests.get(timeout=0.05)
                if request is not WAKE[0]:
                    try:
                        reply.put({"ok": True, "result": self.commands.handle(request)})
                    except Exception as exc:
                        reply.put({"ok": False, "error": str(exc)})
            except queue.Empty:
                pass
            while not self.evictions.empty():
                self._evict(self.evictions.get())
            self.nodes.reap()
            self.notices.watch(self.state.step, self.state.step_time_s)
            now = time.monotonic()
            self.course.take_back(now)  # preempted capacity that came back
            self.nodes.converge()
            self.nodes.keep_a_spare()
            self.stalls.watch(now)
            if self.course.fatal and not self.course.stopping:
                # The failed node's agent stops its workers and ends by itself; the others are
                # stopped, as they would regroup and fail the same way.
                self.commands.do_stop(leave=self.course.fatal_node)
            if now - last_folder_check > 1.0:
                last_folder_check = now
                if self._folder_deleted():
                    # Its folder was deleted: no checkpoint or record can be written any more.
                    for agent in self.nodes.alive_agents():
                        self.nodes.signal_agent(agent, signal.SIGKILL, "stopped")
                    for agent in self.nodes.agents.values():
                        agent.proc.wait()
                    return "lost", LOST_FOLDER["reason"]
            if self.course.stopping and self.course.stop_deadline and now > self.course.stop_deadline:
                for agent in self.nodes.alive_agents():
                    self.nodes.signal_agent(agent, signal.SIGKILL, "stopped")
            # At most 4 writes a second for steps and metrics; a change of status at once, so
            # %elastic_jobs and the server never show "pending" beside a dashboard that trains.
            fresh = self.state.status != self.outcome.status_written
            if self.sink.changed.is_set() and (fresh or time.monotonic() - last_status > 0.25):
                self.sink.changed.clear()
                last_status = time.monotonic()
                self.outcome.write_status()
            if not self.nodes.alive_agents() and all(a.reaped for a in self.nodes.agents.values()):
                ended = ending(
                    self.course.phase,
                    (a.proc.returncode for a in self.nodes.agents.values()),
                    # its workers failed of it before the check above saw it
                    folder=DELETED if self._folder_deleted() else None,
                    files_changed=self.course.files_reason,
                    fatal=self.course.fatal,
                    waits_for_capacity=self.course.membership.waits_for_capacity,
                )
                if ended is None:
                    continue  # capacity comes back later: wait for it
                status, reason = ended
                if status == "succeeded":  # every node finished: no reason to give (the last
                    return status, reason  # node to go was told as "lost" or "scaled_down" before)
                return status, reason or (LOST_FOLDER["reason"] if status == "lost" else self.outcome.failure_reason())

    def _stops_recorded(self) -> int:
        """How many stops written without a supervisor (``record_stopped``) the events hold."""
        return sum(
            e.kind == Kind.JOB_FINISHED and e.node is None and e.fields(JobFinished).get("status") == "stopped"
            for e in read_all(self.folder.events_file)
        )

    def _folder_deleted(self) -> bool:
        """Whether the job folder was deleted (a worker's checkpoint mkdir may have made a new
        one at the same path since: it has no events file)."""
        return not self.folder.events_file.exists()


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
    log.for_process("supervisor")  # its lines go to supervisor.log: "notebook-elastic supervisor: ..."
    resume = args[:1] == ["--resume"]
    folder = JobFolder(args[1] if resume else args[0])
    # Held until supervisor.json is written (run()): a stop meanwhile waits, then asks this
    # supervisor to stop; a stop before it is seen here.
    start_lock = None if resume else folder.hold_start(SUPERVISOR_START_TIMEOUT_S)
    if not resume and folder.ended():
        # Stopped before it started (a stop while Slurm granted its allocation, before sbatch
        # answered): it must not start the job, nor clear the end the stop wrote.
        said = (folder.outcome() or folder.status() or {}).get("status")
        _log.info("job %r was %s before its supervisor started: nothing runs", folder.name, said)
        return 0
    os.chdir(folder.spec().get("backend_options", {}).get("cwd") or folder.path)
    return Supervisor(folder, resume=resume, start_lock=start_lock).run()


if __name__ == "__main__":
    sys.exit(main())

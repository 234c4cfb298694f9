"""How a job ends: the reason when every node is gone, ``status.json`` kept current, and at
the end ``job_finished`` written after every process of the job is gone (machinery ended,
orphans killed and counted). Held by the ``Supervisor``; handed the job's spec and folder, its
course (target and range for status.json), its nodes (how they ended), the sink and its fold."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil

from ..contract.event_types import Kind
from ..contract.job_state import JobState, budget_spent_reason
from ..contract.spec import JobSpec
from ..jobfolder.folder import JobFolder, write_json_atomic
from ..jobfolder.processes import kill_all, processes_of, signal_all
from .membership import Course
from .nodes import Nodes
from .sink import EventSink
from .tensorboard import TensorBoardWriter
from .trackers import Tracker

#: At the end, processes that are on their way out (a spare agent, zygotes) get this long to go
#: by themselves; what is left after it is an orphan, killed and counted.
EXIT_GRACE_S = 5.0


def _is_ours(pid: int, *marks: str) -> bool:
    """Whether the process's command line carries one of ``marks`` (a zygote, the guardian),
    its arguments joined by NULs as /proc shows them, so a mark may span two."""
    try:
        cmdline = "\0".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    return any(mark in cmdline for mark in marks)


class Outcome:
    """The job's status file and its last record."""

    def __init__(
        self,
        spec: JobSpec,
        folder: JobFolder,
        *,
        course: Course,
        nodes: Nodes,
        sink: EventSink,
        state: JobState,
        emit: Callable[..., None],
    ) -> None:
        self.spec = spec
        self.folder = folder
        self.course = course
        self.nodes = nodes
        self.sink = sink
        self.state = state  # read under the sink's lock: the sink's thread folds into it
        self.emit = emit
        self.status_written: str | None = None  # the status status.json last said

    def failure_reason(self) -> str:
        with self.sink.lock:
            state = self.state
            if state.failures:
                return budget_spent_reason(state.failures, state.restarts, state.max_restarts, "")
            reasons = sorted({a.exit_reason or f"exit code {a.proc.returncode}" for a in self.nodes.agents.values()})
            if all(a.exit_reason in ("preempted", "lost") for a in self.nodes.agents.values()):
                return f"no node left to run on (all {', '.join(reasons)})"
            return f"every node's agent exited ({', '.join(reasons)})"

    def _finish_trackers(self, status: str, trackers: list[Tracker]) -> None:
        """End the MLflow/W&B runs after the last metric, before the sweep for orphans below
        (W&B's service process carries the job folder in its environment, as the job's do)."""
        if not trackers:
            return
        # Every agent is reaped (its readers joined), so every line it left is queued: once the
        # sink has folded them, each tracker has been handed its last metric.
        self.sink.flush(timeout_s=10.0)
        for tracker in trackers:
            tracker.finish(status)

    def write_status(self) -> None:
        # Under the sink's lock, as the sink's own writes (_write_status_folded): one writer at
        # a time, each with the newest fold, so status.json never steps back.
        with self.sink.lock:
            self._write_status_folded()

    def status_folded(self) -> None:
        """The sink folded a change of status (its lock held), before writing the event that
        made it: status.json says it first, so a listing is never behind the stream (%elastic_jobs
        'pending' beside a dashboard that trains). Not the outcome: _finish writes that once
        the supervisor is done with the folder, so no one resumes or replaces the job before."""
        if not self.state.finished:
            self._write_status_folded()

    def _write_status_folded(self) -> None:
        """status.json from the folded state; the caller holds the sink's lock."""
        summary: dict[str, Any] = {**self.state.summary()}
        self.status_written = summary.get("status")
        summary.update(
            name=self.spec.name,
            backend=self.spec.backend,
            target=self.course.membership.target,
            min_nodes=self.course.membership.min_nodes,
            max_nodes=self.course.membership.max_nodes,
            supervisor_pid=os.getpid(),
            notebook=self.spec.notebook,
            updated=time.time(),
        )
        try:
            write_json_atomic(self.folder.status_file, summary)
        except OSError:
            self.sink.changed.set()  # a full disk: try again at the next round

    def finish(
        self, outcome: tuple[str, str | None], trackers: list[Tracker], tensorboard: TensorBoardWriter | None
    ) -> None:
        """Write the outcome once every process of the job is gone; ``trackers`` and
        ``tensorboard`` (what the supervisor opened, if anything) are closed on the way."""
        status, reason = outcome
        self._finish_trackers(status, trackers)
        spare_pid = self.nodes.dismiss_spare()

        # The spare agent and the zygotes (still importing torch under load, they read their
        # orders only afterwards) and the job's guardian are machinery, not orphans: ended here.
        def machinery_of(pid: int) -> bool:
            return pid == spare_pid or _is_ours(pid, "notebook_elastic.pool.warm\0serve", "local.guardian")

        deadline = time.monotonic() + EXIT_GRACE_S
        while [p for p in processes_of(self.folder.path) if not machinery_of(p)] and time.monotonic() < deadline:
            time.sleep(0.05)
        machinery = signal_all(self.folder.path, signal.SIGKILL, machinery_of)
        leftovers = [p for p in kill_all(self.folder.path, grace_s=2.0) if p not in machinery]
        data: dict[str, Any] = {"status": status}
        if reason:
            data["reason"] = reason
        if leftovers:
            data["orphans_killed"] = len(leftovers)
        # The outcome first, in the room taken at start (it needs no new room): whatever else a
        # full disk refuses below, every reader (describe, a follower, the guardian) learns it.
        self.sink.flush(timeout_s=10.0)
        with self.sink.lock:
            summary = self.state.summary()
        self.folder.write_outcome({**summary, **data, "reason": reason, "finished_at": time.time()})
        self.emit(Kind.JOB_FINISHED, **data)
        self.sink.close()
        if tensorboard is not None:
            tensorboard.close()
        if not self.folder.events_file.exists():
            return  # deleted under us: nothing left to record in
        self.write_status()
        info = self.folder.supervisor() or {}
        info["exited"] = True
        try:
            write_json_atomic(self.folder.supervisor_file, info, mode=0o600)
        except OSError:
            pass  # a full disk: the process is gone all the same, which is what readers check

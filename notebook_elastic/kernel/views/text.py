"""The text view: a job's story as lines, for terminals and wherever widgets cannot render.

Every event but metrics and worker output becomes a line as it arrives; metrics become a
progress line at most every ``progress_every_s`` seconds; the end prints the outcome and,
when a rank raised, that rank's traceback (not "exit code 1").
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from ...contract.event_types import Kind, WorkerFailed
from ...contract.events import Event, describe, format_duration, sig
from ...contract.job_state import JobState

if TYPE_CHECKING:
    from ..job import ElasticJob

QUIET_KINDS = {Kind.METRIC, Kind.LOG, Kind.CHECKPOINT, Kind.AGENT_STARTED, Kind.WORKER_FINISHED, Kind.GROUP_SUCCEEDED}


def progress_line(state: JobState) -> str:
    parts = []
    if state.step is not None:
        parts.append(f"step {state.steps_done}" + (f"/{state.total_steps}" if state.total_steps else ""))
    for name in state.metrics.names[:3]:
        value = state.metrics.last(name)
        if value is not None:
            parts.append(f"{name}={sig(value, 4)}")
    rate = state.steps_per_s
    if rate:
        parts.append(f"{rate:.1f} steps/s")
    if state.eta_s is not None:
        parts.append(f"ETA {format_duration(state.eta_s)}")
    parts.append(f"world size {state.world_size}")
    return ", ".join(parts)


def outcome_lines(job: ElasticJob) -> list[str]:
    state = job.state
    lines = [f"[{job.name}] {state.status}" + (f": {state.reason}" if state.reason else "")]
    failure = job.failure
    if failure is not None and state.status == "failed":
        failed = failure.fields(WorkerFailed)
        lines.append(f"[{job.name}] rank {failed.get('rank')} on {failure.node} raised:")
        lines.extend("    " + line for line in (failed.get("traceback") or "").rstrip().splitlines())
    return lines


class TextView:
    """Prints a job's events to a stream as they come."""

    def __init__(
        self, job: ElasticJob, out: IO[str] | None = None, progress_every_s: float = 2.0, show_logs: bool = False
    ) -> None:
        self.job = job
        self.out = out or sys.stdout
        self.progress_every_s = progress_every_s
        self.show_logs = show_logs
        self._last_progress = 0.0
        self._lock = threading.Lock()
        self._unsubscribe: Callable[[], None] | None = job.on_event(self._on_event)

    def _write(self, line: str) -> None:
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()

    def _on_event(self, event: Event, job: ElasticJob) -> None:
        if event.kind == Kind.METRIC:
            now = time.monotonic()
            if now - self._last_progress >= self.progress_every_s:
                self._last_progress = now
                self._write(f"[{job.name}] {progress_line(job.state)}")
            return
        if event.kind == Kind.LOG:
            if self.show_logs:
                self._write(f"[{job.name}] {describe(event)}")
            return
        if event.kind == Kind.JOB_FINISHED:
            for line in outcome_lines(job):
                self._write(line)
            self.close()
            return
        if event.kind in QUIET_KINDS:
            return
        self._write(f"[{job.name}] {describe(event)}")

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

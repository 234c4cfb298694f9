"""The job's history on disk as it happens: ``events.jsonl``, written by one thread.

Every event the supervisor hears (its own, the agents' and workers' lines) goes through the
sink: folded into the supervisor's ``JobState``, shown to its observers, and appended to the
file in batches, rotated into the compacted history (``history.py``) past its size.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from ..contract.event_types import DiskFull, Kind, Metric, OutputCapped
from ..contract.events import Event
from ..contract.job_state import JobState
from ..jobfolder.folder import FILE_MODE
from ..jobfolder.history import ROTATE_BYTES, rotate

#: Worker output kept in events.jsonl (the chart's history); the node logs keep all of it.
EVENTS_OUTPUT_CAP_BYTES = 8 * 1024 * 1024
#: While the disk is full, quiet kinds (metrics, output, checkpoints) are not even tried for this long.
DISK_RETRY_S = 5.0
#: Below the output floor (nodes.py), each rank's metric events are thinned to one per this many
#: seconds, plus the one at every change of world size or restarts, and each rank's latest at the end.
THIN_METRICS_S = 10.0


class EventSink:
    """The single writer of events.jsonl; folds every event into the supervisor's JobState.

    A full disk is a state, not a crash: every event is still folded (status, the chart, the
    control channel carry on); what cannot be written is dropped, quiet kinds first, and the
    job says so once. Below the output floor, metrics are thinned (``THIN_METRICS_S``) so the
    room left lasts. A write the disk cuts short is cut back to its last whole line: the file
    never holds a torn one. Worker output in the history is capped (the node logs keep it all).
    """

    FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT

    def __init__(
        self,
        path: Path,
        state: JobState,
        observe: Any,
        room_for_output: Any = lambda: True,
        rotate_bytes: int = ROTATE_BYTES,
        status_changed: Any = None,
    ) -> None:
        self.path = path
        self.fd = os.open(path, self.FLAGS, FILE_MODE)
        self.size = os.fstat(self.fd).st_size
        self.rotate_bytes = rotate_bytes
        self.room_for_output = room_for_output
        self.state = state
        self.observe = observe
        # Called with the lock held when a batch changed the folded status, before its lines
        # are written: the job's listing (status.json) is never behind the stream on status.
        self.status_changed = status_changed
        self.lock = threading.Lock()
        # Events; None to close; a threading.Event to set once everything before it is folded.
        self.queue: queue.SimpleQueue[Event | threading.Event | None] = queue.SimpleQueue()
        self.changed = threading.Event()
        self.torn = False  # the last write stopped mid-line (disk full): end that line first
        self.quiet_until = 0.0  # disk full: quiet kinds are not even tried before this time
        self.disk_told = False
        self.thinning = False  # below the floor: metric events thinned (said once)
        self.thin_last: dict[Any, float] = {}  # rank -> when its last metric was written
        self.thin_mark: tuple[Any, ...] = ()  # (world size, restarts) at the last written metric
        self.held: dict[Any, str] = {}  # rank -> its newest metric line not written (written at the end)
        self.notes: list[str] = []  # the sink's own events, written before the line that caused them
        self.log_bytes = 0
        self.log_capped = False
        self.closing = False
        self.thread = threading.Thread(target=self._run, name="event-sink", daemon=True)
        self.thread.start()

    def put(self, event: Event) -> None:
        self.queue.put(event)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every event put before this call is folded, handed to the observers and
        written (or dropped as a full disk drops it); False if that took over ``timeout_s``
        (or the sink is closed). Events put meanwhile by other threads may or may not be in."""
        drained = threading.Event()
        if self.closing or not self.thread.is_alive():
            return False
        self.queue.put(drained)
        return drained.wait(timeout_s)

    def _run(self) -> None:
        while True:
            event = self.queue.get()
            batch = [event]
            while True:  # drain what is waiting, then write once
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            done = False
            drained = []
            with self.lock:
                lines: list[str] = []
                status_before = self.state.status
                for item in batch:
                    if item is None:
                        done = True
                        continue
                    if isinstance(item, threading.Event):
                        drained.append(item)
                        continue
                    try:
                        line = item.to_line() + "\n"
                    except (TypeError, ValueError):  # not JSON (a worker sent something odd): dropped
                        continue
                    self.state.apply(item)  # never raises: a bad event is dropped there
                    try:
                        self.observe(item)
                    except Exception:  # an observer's bug must not stop the history
                        traceback.print_exc()
                    if item.kind == Kind.JOB_FINISHED:  # each rank's latest metric before the outcome
                        lines.extend(self.held.values())
                        self.held.clear()
                    keep = self._keep(item, line)
                    lines.extend(self.notes)  # what the sink itself had to say about it
                    self.notes.clear()
                    if keep:
                        lines.append(line)
                if self.status_changed is not None and self.state.status != status_before:
                    try:
                        self.status_changed()
                    except Exception:  # the history goes on; the main loop writes it again
                        traceback.print_exc()
                self._write(lines)
            self.changed.set()
            for marker in drained:  # everything queued before it is folded and written now
                marker.set()
            if done:
                os.close(self.fd)
                return

    def _keep(self, item: Event, line: str) -> bool:
        """Whether ``item`` goes to the file: output beyond the cap and, while the disk is
        full, metrics, output and checkpoints do not (they are still folded in memory)."""
        quiet = item.kind in (Kind.METRIC, Kind.LOG, Kind.CHECKPOINT, Kind.GPU)
        if quiet and time.monotonic() < self.quiet_until:
            if item.kind == Kind.METRIC:
                self.held[item.fields(Metric).get("rank")] = line
            return False
        if item.kind == Kind.METRIC and not self.room_for_output():
            return self._thinned(item, line)
        if item.kind == Kind.LOG:
            if not self.room_for_output():
                return False
            self.log_bytes += len(line)
            if self.log_bytes > EVENTS_OUTPUT_CAP_BYTES:
                if not self.log_capped:
                    self.log_capped = True
                    capped = OutputCapped(cap_bytes=EVENTS_OUTPUT_CAP_BYTES)
                    self.queue.put(Event(Kind.OUTPUT_CAPPED, time.time(), None, dict(capped)))
                return False
        return True

    def _thinned(self, item: Event, line: str) -> bool:
        """Below the floor: whether this metric event is one to write (the first of its rank in
        THIN_METRICS_S, or the first after the world size or the restarts changed); the others
        are held, each rank's newest written before the job's outcome."""
        now = time.monotonic()
        mark = (self.state.world_size, self.state.restarts)
        if not self.thinning:
            self.thinning = True
            told = self._disk_full(
                "the job folder's disk is nearly full: metrics are kept in its history once every "
                f"{THIN_METRICS_S:g} s per rank, at each change of world size or restarts, and the last of "
                "each rank (the job's own state keeps them all)"
            )
            self.notes.append(told.to_line() + "\n")
        rank = item.fields(Metric).get("rank")
        if mark != self.thin_mark or now - self.thin_last.get(rank, -1e9) >= THIN_METRICS_S:
            self.thin_mark = mark
            self.thin_last[rank] = now
            self.held.pop(rank, None)
            return True
        self.held[rank] = line
        return False

    def _write(self, lines: list[str]) -> None:
        if not lines:
            return
        data = (("\n" if self.torn else "") + "".join(lines)).encode()
        view = memoryview(data)
        start = self.size
        try:
            while view:
                written = os.write(self.fd, view)
                self.size += written
                view = view[written:]
            self.torn = False
            if self.size > self.rotate_bytes:
                self._rotate()
        except OSError as exc:
            done = len(data) - len(view)
            whole = data.rfind(b"\n", 0, done) + 1  # the bytes of the whole lines written
            if whole < done:  # the disk cut a line: cut it back out (readers skip to its start)
                try:
                    os.ftruncate(self.fd, start + whole)
                    self.size = start + whole
                except OSError:
                    self.torn = True  # the next write ends it first
            self.quiet_until = time.monotonic() + DISK_RETRY_S
            if not self.disk_told:
                self.disk_told = True
                self._disk_full(
                    f"the job folder's disk cannot be written ({exc.strerror}): training goes on; "
                    "its history and logs are incomplete until there is room"
                )

    def _disk_full(self, message: str) -> Event:
        """A ``disk_full`` event of the sink's own, folded into the job's state (the caller
        writes it, if there is room)."""
        told = Event(Kind.DISK_FULL, time.time(), None, dict(DiskFull(message=message)))
        self.state.apply(told)
        return told

    def _rotate(self) -> None:
        """Past rotate_bytes: the file joins the compacted history (history.py), a new one starts."""
        try:
            fd = rotate(self.path, self.FLAGS)
        except OSError:
            return  # no room to compact: the file grows on (a full disk is told elsewhere)
        os.close(self.fd)
        self.fd, self.size = fd, 0

    def close(self) -> None:
        self.closing = True
        self.queue.put(None)
        self.thread.join(timeout=10)

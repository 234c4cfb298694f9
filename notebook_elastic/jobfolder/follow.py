"""Following a local job from any kernel: its history (the compacted part, then the live
file, across rotations) as events, until its outcome; a supervisor that died without one, or
a job folder deleted under it, is told as the job's end, written down by whoever notices it
first so that every observer says the same. ``LocalBackend.history`` and ``follow`` read a
folder through ``history`` and ``follow`` here."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..contract.event_types import FINAL_STATUSES, JobFinished, Kind
from ..contract.events import Event
from ..errors import BackendError, JobNotFound
from .folder import JobFolder, open_file, write_json_atomic
from .history import history_file, parse, read_all

SUPERVISOR_START_TIMEOUT_S = 30.0


FOLDER_GONE_WAIT_S = 3.0


LOST_SUPERVISOR = {"status": "lost", "reason": "its supervisor process is gone (killed, or the machine restarted)"}


LOST_FOLDER = {"status": "lost", "reason": "its job folder was deleted while it ran"}


FOLLOW_POLL_S = 0.03


def _rotated(path: Path, f: Any) -> bool:
    """Whether ``path`` is now another file than the one ``f`` reads (the supervisor rotated it)."""
    try:
        return os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        return False


def _record_outcome(folder: JobFolder, event: Event) -> None:
    """Append an outcome the supervisor could not write (it is dead) and put it in status.json,
    unless another observer already did."""
    try:
        status = folder.status() or {}
        finished = event.fields(JobFinished)
        if status.get("status") == finished.get("status"):
            return
        _append_event(folder, event)
        status.update(status=finished.get("status"), reason=finished.get("reason"), updated=time.time())
        write_json_atomic(folder.status_file, status)
    except OSError:
        pass  # a full or vanished disk: the event still reaches this observer


def _append_event(folder: JobFolder, event: Event) -> None:
    with open(folder.events_file, "a") as f:
        f.write(event.to_line() + "\n")


class FollowedHistory:
    """A local job's event stream (iterate it once), and ``caught_up``: set once every event
    recorded before it began has been taken from it (the history, then the live file read to
    its end), or once it ended. ``ElasticJob`` waits for it so that a handle that attaches
    returns showing the job's present, not an early point of its replay."""

    def __init__(self, events: Iterator[Event], caught_up: threading.Event) -> None:
        self._events = events
        self.caught_up = caught_up

    def __iter__(self) -> Iterator[Event]:
        return self._events


def _require(folder: JobFolder) -> None:
    if not folder.exists():
        raise JobNotFound(f"no local job named {folder.path.name!r} (see %elastic_jobs)")


def history(folder: JobFolder) -> Iterator[Event]:
    """The job's events so far (the compacted part, then the live file)."""
    _require(folder)
    try:
        yield from read_all(folder.events_file)
    except ValueError as exc:
        raise _unreadable(folder, exc) from None


def _unreadable(folder: JobFolder, exc: ValueError) -> BackendError:
    return BackendError(f"job {folder.name!r} has no readable event history: {exc} (in {folder.path})")


def follow(folder: JobFolder, stop: threading.Event) -> FollowedHistory:
    """The job's events, live, until its outcome or ``stop``."""
    caught_up = threading.Event()
    return FollowedHistory(_follow(folder, stop, caught_up), caught_up)


def _follow(folder: JobFolder, stop: threading.Event, caught_up: threading.Event) -> Iterator[Event]:
    try:
        yield from _read_on(folder, stop, caught_up)
    finally:
        caught_up.set()  # ended (the job's end, a stop, an error): nothing more to wait for


def _read_on(folder: JobFolder, stop: threading.Event, caught_up: threading.Event) -> Iterator[Event]:
    _require(folder)
    finished = False  # a job_finished read; a job_resumed after it (resume()) goes on
    try:  # the compacted history first (it is replaced whole, never appended to)
        with open_file(history_file(folder.events_file)) as h:
            for line in h:
                event = parse(line)
                if event is not None:
                    yield event
                    finished = event.kind == Kind.JOB_FINISHED or (finished and event.kind != Kind.JOB_RESUMED)
    except FileNotFoundError:
        pass
    except ValueError as exc:  # a FIFO or a folder in its place would hold this follower forever
        raise _unreadable(folder, exc) from None
    buffer = b""
    idle_checks = 0
    gone_since: float | None = None
    try:
        f = open_file(folder.events_file)
    except ValueError as exc:
        raise _unreadable(folder, exc) from None
    try:
        while not stop.is_set():
            chunk = f.read(1 << 20)
            if chunk:
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = parse(line)
                    if event is None:
                        continue
                    yield event
                    finished = event.kind == Kind.JOB_FINISHED or (finished and event.kind != Kind.JOB_RESUMED)
                continue
            if buffer and os.fstat(f.fileno()).st_size < f.tell():
                # The supervisor cut a line a full disk tore (sink.py): what we hold of it is
                # gone from the file; read on from where it began.
                f.seek(f.tell() - len(buffer))
                buffer = b""
                continue
            if _rotated(folder.events_file, f):
                f.close()  # read to its end: the rest is in the new file
                try:
                    f, buffer = open_file(folder.events_file), b""
                except ValueError as exc:
                    raise _unreadable(folder, exc) from None
                continue
            # At the end of the live file: everything written before the follower came is
            # yielded, and (a generator runs on only when asked) taken by its consumer.
            caught_up.set()
            if finished and not folder.supervisor_alive():
                return  # the end of the file, the job's last word was its outcome, and no
                # supervisor (a resumed one) will write more
            idle_checks += 1
            if idle_checks % 50 == 0 and not folder.events_file.exists():
                # Deleted under the job: its supervisor says so in the (unlinked) file we
                # still read, as it stops; if it is gone too, say it here.
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > FOLDER_GONE_WAIT_S:
                    yield Event(Kind.JOB_FINISHED, time.time(), None, LOST_FOLDER)
                    return
            elif idle_checks % 50 == 0 and not folder.supervisor_alive() and not folder.guardian_alive():
                time.sleep(0.2)  # one last read: it may have just written its last line
                if f.read(1):
                    f.seek(-1, os.SEEK_CUR)
                    continue
                outcome = folder.outcome()
                if outcome is None and (folder.status() or {}).get("status") in FINAL_STATUSES:
                    outcome = folder.status()  # its end, where a listing reads it (a stop written from a kernel)
                if outcome is not None:  # its last event found no room; its outcome did
                    said = {k: outcome[k] for k in ("status", "reason", "orphans_killed") if outcome.get(k) is not None}
                    yield Event(Kind.JOB_FINISHED, outcome.get("finished_at") or time.time(), None, said)
                    return
                info = folder.supervisor()
                if info is not None or time.time() - folder.spec_file.stat().st_mtime > SUPERVISOR_START_TIMEOUT_S:
                    # Whoever notices writes it down, so every observer says the same.
                    event = Event(Kind.JOB_FINISHED, time.time(), None, LOST_SUPERVISOR)
                    _record_outcome(folder, event)
                    yield event
                    return
            stop.wait(FOLLOW_POLL_S)
    finally:
        f.close()

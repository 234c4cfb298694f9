"""What a job folder says its job is, and the few writes a kernel makes there itself.

Every listing (``%elastic_jobs``, the jobs panel, the CLI) and a resume's check read the job's
status here (``read_record``): from its records (spec, status, outcome) and from whether its
supervisor and guardian still run. The writes are those a kernel makes when the job's own
supervisor cannot: a resume up to its new supervisor's start (``resuming``: one at a time, its
record checked, the folder made ready), a stop written down (``record_stopped``). None of them
imports a backend: what a resume must end outside the folder is handed in by the backend.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..contract.event_types import FINAL_STATUSES, JobFinished, Kind
from ..contract.events import Event, status_phrase
from ..contract.job_state.records import JobSummary, summary_of
from ..errors import BackendError, JobNotFound
from .folder import FILE_MODE, SPEC_MISSING, JobFolder, Look, write_json_atomic
from .follow import LOST_SUPERVISOR, SUPERVISOR_START_TIMEOUT_S, _append_event
from .processes import kill_all


@dataclass(frozen=True)
class FolderRecord:
    """A job as its folder tells it: its status, the summary every listing shows, the backend it
    ran in (a Slurm job's folder is one of these too) and, where its records could not be read,
    why (``damaged``)."""

    status: str
    summary: JobSummary = field(default_factory=lambda: JobSummary())
    backend: str = "local"
    notebook: str | None = None
    created: float | None = None
    damaged: str | None = None


def read_record(folder: JobFolder) -> FolderRecord | None:
    """The job's status from its records and its processes (``JobFolder.look``, read at once);
    None when there is no folder. A job not ended on record whose supervisor is gone is
    ``recovering`` while its guardian runs, else ``lost``; a spec that is missing or unreadable
    makes it ``damaged``, with why."""
    return _look_and_record(folder)[1]


def _look_and_record(folder: JobFolder) -> tuple[Look | None, FolderRecord | None]:
    """What ``read_record`` reads (the folder's ``Look``, read at once) and the record it makes of it."""
    seen = folder.look()
    if seen is None:
        return None, None
    if seen.spec is None:
        if seen.spec_problem != SPEC_MISSING:
            return seen, FolderRecord("damaged", damaged=f"spec.json is unreadable: {seen.spec_problem}")
        if seen.outcome is not None:  # deleted while it ran; its supervisor wrote down how it ended
            summary = summary_of({k: v for k, v in seen.outcome.items() if v is not None})
            return seen, FolderRecord(seen.outcome["status"], summary=summary)
        return seen, FolderRecord("damaged", damaged="spec.json is missing (was the folder deleted while the job ran?)")
    spec = seen.spec
    status = seen.status
    state = status.get("status", "pending")
    if seen.outcome is not None:  # status.json could not be written at the end (a full disk)
        status, state = seen.outcome, seen.outcome["status"]
    elif state not in FINAL_STATUSES and not seen.supervisor_alive:
        if seen.guardian_alive:
            state = "recovering"  # its guardian is bringing it back
        else:
            started = (seen.supervisor or {}).get("started")
            if started is not None or time.time() - (seen.created or 0.0) > SUPERVISOR_START_TIMEOUT_S:
                state = "lost"
                status = {**status, "reason": LOST_SUPERVISOR["reason"]}
    # The record is built once, here, whichever way the status was decided above.
    return seen, FolderRecord(
        state,
        summary=summary_of(
            {
                # The launch spec's range until the job reports its own (set_range moves it).
                "min_nodes": spec["nnodes"][0],
                "max_nodes": spec["nnodes"][1],
                **{k: v for k, v in status.items() if v is not None},
                "nproc_per_node": spec.get("nproc_per_node"),
            }
        ),
        backend=spec.get("backend") or "local",
        notebook=spec.get("notebook"),
        created=seen.created,
    )


#: The statuses a job may be resumed from (a guarded resume, by the job's guardian: ``recovering`` too).
RESUMABLE_STATUSES = ("lost", "failed", "stopped")


@contextlib.contextmanager
def resuming(
    folder: JobFolder, name: str, leftovers: Callable[[dict[str, Any] | None], None], *, guarded: bool = False
) -> Iterator[None]:
    """A resume of the job in ``folder``, up to its new supervisor's start, which the caller
    makes inside the ``with``. In order: the folder's lock (one resume at a time: two kernels, a
    kernel and the guardian; the second is refused in one sentence, and finds the job running
    once the first is done, instead of starting a second supervisor for the same folder), the
    folder read once and its record checked (only a lost, failed or stopped job resumes; one
    its guardian resumes, ``guarded``, may be ``recovering``), what the earlier run holds outside
    the folder ended (``leftovers``, the backend's: given the spec as read, None when it could
    not be), then the folder made ready for a new supervisor: the stragglers of a lost one are
    ended (they must not meet the new group), its supervisor.json goes, and a line a supervisor
    killed mid-write left torn in the events is ended, so the new run's first event is a line of
    its own. The lock is held until the ``with`` ends."""
    try:
        fd = os.open(folder.path / ".resume.lock", os.O_WRONLY | os.O_CREAT, FILE_MODE)
    except FileNotFoundError:
        raise JobNotFound(f"no local job named {name!r} (see %elastic_jobs)") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackendError(
                f"job {name!r} is being resumed by another process right now; wait for it (%elastic_jobs)"
            ) from None
        seen, record = _look_and_record(folder)
        if seen is None or record is None:
            raise JobNotFound(f"no local job named {name!r} (see %elastic_jobs)")
        if record.status not in RESUMABLE_STATUSES and not (guarded and record.status == "recovering"):
            raise BackendError(
                f"job {name!r} {status_phrase(record.status)}; only a lost, failed or stopped job can be resumed"
                + (
                    " (a succeeded job is done: run the cell again to train anew)"
                    if record.status == "succeeded"
                    else ""
                )
            )
        leftovers(seen.spec)
        kill_all(folder.path)
        folder.supervisor_file.unlink(missing_ok=True)
        with open(folder.events_file, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")
        yield
    finally:
        os.close(fd)  # and with it the lock


def record_stopped(folder: JobFolder, reason: str) -> None:
    """Write a stop its supervisor could not write where it writes its own end: the outcome
    first, in the room taken at start (a full disk has room for it), then status.json, then
    the event, which is written only once one of the others is (an event alone would be read
    by a follower, not by the listing). Every view then reads the same end. A
    ``BackendError`` sentence when nothing could be written."""
    now = time.time()
    summary = {k: v for k, v in (folder.status() or {}).items() if k not in ("status", "reason")}
    recorded = folder.write_outcome({**summary, "status": "stopped", "reason": reason, "finished_at": now})
    try:
        write_json_atomic(folder.status_file, {**summary, "status": "stopped", "reason": reason, "updated": now})
        recorded = True
    except OSError as exc:
        if not recorded:
            raise BackendError(
                f"job {folder.name!r} is stopped (its processes are ended), but its end could not be written in "
                f"{folder.path} ({exc.strerror or exc}): free space there; until then it is listed as lost"
            ) from None
    try:
        _append_event(folder, Event(Kind.JOB_FINISHED, now, None, dict(JobFinished(status="stopped", reason=reason))))
    except OSError:
        pass  # the outcome or status.json says it: every reader takes it from there

"""``python -m notebook_elastic.backends.local.guardian JOB_DIR``: brings a dead supervisor back.

One small process per local job, in a session of its own, that watches the job's supervisor.
When the supervisor dies without having written the job's outcome (OOM-killed, a stray
``kill -9``) and the job has recoveries left, the guardian says ``recovering`` (event and
status.json, so every observer agrees) and resumes the job from its latest checkpoint, in the
same folder: at most the steps since that checkpoint are lost. It exits when the job ends,
when the job is stopped, or when its folder is deleted. It imports neither torch nor the
packager: it costs a few MB and no CPU. One runs per folder: each launch and resume starts one,
and one that finds another's lock taken (``LOCK_NAME``) exits at once (a guardian resuming its job
starts one too).
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

from ...contract.event_types import FINAL_STATUSES, Error, JobFinished, Kind, Recovering
from ...contract.events import Event
from ...errors import NotebookElasticError
from ...jobfolder.folder import JobFolder, write_json_atomic
from ...jobfolder.processes import process_start_ticks

POLL_S = 0.5
#: The folder's guardian lock, held while a guardian runs (the kernel lets it go with the process).
LOCK_NAME = ".guardian.lock"
#: Supervisor deaths a job recovers from by itself; past that it is lost (resume() by hand).
MAX_RECOVERIES = 3


def ended(folder: JobFolder) -> bool:
    """Whether the job wrote its outcome (or its folder is gone): nothing left to guard."""
    if not folder.path.is_dir():
        return True
    info = folder.supervisor()
    if info is None:
        return False  # a supervisor still starting (resume() removed the last one's file)
    status = (folder.status() or {}).get("status")
    if (folder.outcome() or {}).get("status") in FINAL_STATUSES:
        return True  # written in the room taken at start, even when nothing else could be
    return bool(info.get("exited")) or (status in FINAL_STATUSES and not folder.supervisor_alive())


def guard(folder: JobFolder) -> int:
    from .. import backend_of
    from . import LocalBackend

    try:
        lock = os.open(folder.path / LOCK_NAME, os.O_WRONLY | os.O_CREAT, 0o600)
    except FileNotFoundError:
        return 0  # the folder is gone: nothing to guard
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return 0  # another guardian runs for this folder (the one that resumed it, perhaps)
    me = {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid())}
    write_json_atomic(folder.guardian_file, me, mode=0o600)
    recoveries = 0
    try:
        while True:
            time.sleep(POLL_S)
            if ended(folder):
                return 0
            if folder.supervisor_alive() or folder.supervisor() is None:
                continue  # alive, or still starting
            if recoveries >= MAX_RECOVERIES:
                reason = f"its supervisor died {recoveries + 1} times; resume() to try again"
                lost = Event(Kind.JOB_FINISHED, time.time(), None, dict(JobFinished(status="lost", reason=reason)))
                _say(folder, lost)
                _write_status(folder, "lost", reason)
                return 1
            recoveries += 1
            reason = (
                f"its supervisor died; resuming from the latest checkpoint (recovery {recoveries}/{MAX_RECOVERIES})"
            )
            _say(
                folder, Event(Kind.RECOVERING, time.time(), None, dict(Recovering(reason=reason, recovery=recoveries)))
            )
            _write_status(folder, "recovering", reason)
            try:
                # The job's own backend (a Slurm job's first cancels what is left of it in Slurm).
                backend = backend_of(folder.name, root=folder.path.parent)
                assert isinstance(backend, LocalBackend)  # a folder's job: local or Slurm
                backend.resume(folder.name, guarded=True)
            except (NotebookElasticError, OSError) as exc:
                _say(folder, Event(Kind.ERROR, time.time(), None, dict(Error(message=f"recovery failed: {exc}"))))
    finally:
        folder.guardian_file.unlink(missing_ok=True)


def _say(folder: JobFolder, event: Event) -> None:
    from ...jobfolder.follow import _append_event

    try:
        _append_event(folder, event)
    except OSError:
        pass  # a full disk: the status file may still take it


def _write_status(folder: JobFolder, status: str, reason: str) -> None:
    try:
        current = folder.status() or {}
        current.update(status=status, reason=reason, updated=time.time())
        write_json_atomic(folder.status_file, current, mode=0o600)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--detach":
        args = args[1:]
        if os.fork() > 0:
            os._exit(0)
    from ..slurm.cluster import supervisor_runs

    return guard(JobFolder(Path(args[0]), supervisor_runs))


if __name__ == "__main__":
    sys.exit(main())

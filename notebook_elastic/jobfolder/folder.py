"""The local job folder: everything a job is, on disk, so any kernel can find and re-attach it.

Layout (``$NOTEBOOK_ELASTIC_HOME/jobs/NAME/``; every folder 0700, every file 0600, the
script 0700, whatever the umask, because a job folder holds code that runs as its owner):
    script.py, script.payload.pkl   the packaged cell (runs under plain torchrun too)
    spec.json, manifest.json        what was asked for (``--env`` names only) and what was shipped
    secret.json                     the ``--env`` values and the sha256 of the script and payload
                                    at launch: read by the supervisor (and a resumed one) only
    events.jsonl                    every event, in order (the job's history)
    status.json                     the latest summary, rewritten atomically
    outcome.json                    the job's outcome, written in place into room taken at start
    .reserve                        room kept for the last records, freed just before they are written
    .procs/PID-TICKS-MACHINE        the job's processes forked by the warm pool (and their forks),
                                    which their environment does not show (plumbing/owned.py)
    supervisor.json                 pid and control address of the supervisor (0600)
    supervisor.log, logs/NODE.log   raw output of the supervisor and of each agent
    logs/torchelastic/              torchrun's own per-worker files (error.json)
    checkpoints/                    default checkpoint folder
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from ..contract.event_types import FINAL_STATUSES
from ..errors import BackendError
from .processes import pid_alive

#: Modes of everything a job leaves on disk: private to its owner, whatever the umask.
DIR_MODE = 0o700
FILE_MODE = 0o600  # the script is 0700 (see Bundle.write(private=True))
#: The umask the supervisor (and so every agent and worker) runs with: logs, events and
#: checkpoints they create are private too.
JOB_UMASK = 0o077
#: Room a running job keeps for its last records (the outcome event, status.json,
#: supervisor.json): a file of this size written at start, deleted just before they are written,
#: so a job whose folder's disk filled up still ends with its outcome on record.
RESERVE_BYTES = 64 * 1024
#: outcome.json's fixed size: taken (written with spaces) at start, then overwritten in place,
#: so writing the outcome needs no new room at all (JSON allows the trailing spaces).
OUTCOME_BYTES = 16 * 1024


def _shared_sticky(st: os.stat_result) -> bool:
    """A folder like /tmp: anyone may create entries, only owners may remove theirs."""
    return bool(st.st_mode & stat.S_ISVTX) and bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def jobs_root(home: Path) -> Path:
    """Where job folders live under ``home``. Inside a shared sticky folder (``/tmp``) each
    user gets a private subfolder, so nobody shares a ``jobs/`` folder with anyone."""
    try:
        st = home.stat()
    except FileNotFoundError:
        return home / "jobs"
    if _shared_sticky(st):
        return home / f"notebook-elastic-{os.getuid()}" / "jobs"
    return home / "jobs"


def pool_log(root: Path) -> Path | None:
    """Where a warm pool started for this jobs folder writes its own messages: in the folder
    when it is ours and private (pool/__init__.py), else nowhere."""
    try:
        st = root.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return root / ".pool.log"


_HOME_HINT = "point NOTEBOOK_ELASTIC_HOME at a folder of your own"


def _check_private_dir(path: Path) -> None:
    """Refuse a folder another user controls: whoever can write it can replace a job's
    script and have their code run as us at the job's next restart."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        # A link of our own (a home moved to another disk) is judged by its target; one that
        # someone else made (in /tmp) could be pointed elsewhere under a running job.
        if st.st_uid != os.getuid():
            raise BackendError(
                f"the job home {path} is a link owned by another user (uid {st.st_uid}), who could point it "
                f"elsewhere; {_HOME_HINT}"
            )
        st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise BackendError(f"the job home {path} is not a folder; {_HOME_HINT}")
    if st.st_uid != os.getuid():
        raise BackendError(
            f"the job home {path} is owned by another user (uid {st.st_uid}), who could change the jobs in it; "
            f"{_HOME_HINT}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise BackendError(
            f"the job home {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}), who could "
            f"change the jobs in it; run `chmod 700 {path}` or {_HOME_HINT}"
        )


def _make_private(path: Path) -> None:
    """Create ``path`` 0700 (or check that it is ours and make it 0700)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass
    _check_private_dir(path)
    if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)  # ours: tighten what a loose umask or an older version left


def prepare_jobs_root(home: Path) -> Path:
    """Check ``home``, create it and its ``jobs/`` folder 0700, and return that folder; a
    ``BackendError`` naming the path and the fix when another user could change it. Called
    before anything is launched."""
    if home.exists():
        st = home.stat()
        if _shared_sticky(st):
            private = home / f"notebook-elastic-{os.getuid()}"
            _make_private(private)
            root = private / "jobs"
            _make_private(root)
            return root
        _check_private_dir(home)
    _make_private(home)
    root = home / "jobs"
    _make_private(root)
    return root


def make_private_dir(path: Path) -> None:
    """Create one folder 0700 whatever the umask (``mkdir(mode=)`` is filtered by it)."""
    path.mkdir(mode=DIR_MODE, exist_ok=True)
    os.chmod(path, DIR_MODE)


def write_json_atomic(path: Path, data: Any, mode: int = FILE_MODE) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # os.open's mode is filtered by the umask
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no empty temp file left by a full disk
        raise


def open_file(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; ValueError naming it when something
    else is in its place (a folder; a FIFO, which would hold its reader forever)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once this way
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path.name} is not a file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True)
class Look:
    """A job folder's records read at one moment (``JobFolder.look``) and, where they do not
    say the job ended, whether its supervisor and its guardian run (asked only then: a
    supervisor on another machine is asked of Slurm)."""

    spec: dict[str, Any] | None
    #: Why ``spec`` is None: ``"missing"``, or what was wrong with it.
    spec_problem: str | None
    created: float | None  # spec.json's time: when the job was written
    status: dict[str, Any]
    #: Read where status.json does not say the end (or spec.json is missing): a full disk's end.
    outcome: dict[str, Any] | None
    supervisor: dict[str, Any] | None
    supervisor_alive: bool
    guardian_alive: bool


SPEC_MISSING = "missing"


class JobFolder:
    """``runs_elsewhere``: whether a supervisor its record places on another machine runs (the
    folder sees this machine's processes only), or None where it cannot tell. Whoever opens the
    folder says how: the backends ask Slurm, where such a supervisor holds an allocation of its
    own (the server's routes read a cache a thread keeps, so no request waits on Slurm). The
    folder imports no backend."""

    def __init__(
        self, path: str | os.PathLike[str], runs_elsewhere: Callable[[dict[str, Any]], bool | None] | None = None
    ) -> None:
        self.path = Path(path)
        self.runs_elsewhere = runs_elsewhere

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def script(self) -> Path:
        return self.path / "script.py"

    @property
    def spec_file(self) -> Path:
        return self.path / "spec.json"

    @property
    def manifest_file(self) -> Path:
        return self.path / "manifest.json"

    @property
    def events_file(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    @property
    def secret_file(self) -> Path:
        return self.path / "secret.json"

    @property
    def supervisor_file(self) -> Path:
        return self.path / "supervisor.json"

    @property
    def supervisor_log(self) -> Path:
        return self.path / "supervisor.log"

    @property
    def guardian_file(self) -> Path:
        return self.path / "guardian.json"

    @property
    def outcome_file(self) -> Path:
        return self.path / "outcome.json"

    @property
    def reserve_file(self) -> Path:
        return self.path / ".reserve"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def torchelastic_logs(self) -> Path:
        return self.path / "logs" / "torchelastic"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def exists(self) -> bool:
        return self.spec_file.exists()

    def read_json(self, path: Path) -> dict[str, Any]:
        """One of the folder's records: a JSON object, as ``write_json_atomic`` wrote it;
        ValueError for anything else (a damaged or planted file: ``[]`` is JSON too, a FIFO
        in its place would hold its reader forever)."""
        with open_file(path) as f:
            record = json.load(f)
        if not isinstance(record, dict):
            raise ValueError(f"{path.name} holds a JSON {type(record).__name__}, not a record")
        return record

    def spec(self) -> dict[str, Any]:
        return self.read_json(self.spec_file)

    def status(self) -> dict[str, Any] | None:
        try:
            return self.read_json(self.status_file)
        except (FileNotFoundError, ValueError):
            return None

    def outcome(self) -> dict[str, Any] | None:
        """The outcome the supervisor wrote in place at its end (status, reason, the summary),
        or None while the job runs (the file holds only the spaces taken at start)."""
        try:
            with open_file(self.outcome_file) as f:
                data = json.loads(f.read() or b"null")
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("status"), str) else None

    def ended(self) -> bool:
        """Whether the job's end is on record: its outcome (written in the room taken at start, so
        even on a full disk) or a final status.json."""
        if (self.outcome() or {}).get("status") in FINAL_STATUSES:
            return True
        return (self.status() or {}).get("status") in FINAL_STATUSES

    def wait_for_supervisor(self, timeout_s: float, *, or_end: bool) -> Literal["started", "ended", "late"]:
        """Wait for a supervisor just started to announce itself (its supervisor.json):
        ``"started"``; with ``or_end``, ``"ended"`` as soon as the job's end is on record (it was
        stopped while its supervisor started: that supervisor starts nothing); ``"late"`` when
        ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while self.supervisor() is None:
            if or_end and self.ended():
                return "ended"
            if time.monotonic() > deadline:
                return "late"
            time.sleep(0.01)
        return "started"

    def keep_room(self) -> None:
        """Take the room for the job's last records now, while there is some: the reserve file
        and a blank outcome.json (a resumed job's earlier outcome is cleared). Best effort: on
        a disk already full the job runs without it."""
        for path, size in ((self.outcome_file, OUTCOME_BYTES), (self.reserve_file, RESERVE_BYTES)):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
                try:
                    view = memoryview(b" " * size)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
            except OSError:
                pass  # what was written of it still holds room

    def write_outcome(self, outcome: dict[str, Any]) -> bool:
        """Write the outcome into outcome.json's room, in place (then free the reserve for the
        records that follow). The summary is left out if it does not fit. True if written."""
        payload = json.dumps(outcome, default=str).encode()
        if len(payload) >= OUTCOME_BYTES:
            keep = ("status", "reason", "orphans_killed", "step", "total_steps", "world_size", "restarts")
            payload = json.dumps({k: outcome[k] for k in keep if k in outcome}, default=str).encode()[
                : OUTCOME_BYTES - 1
            ]
        written = False
        try:
            fd = os.open(self.outcome_file, os.O_WRONLY)
            try:
                written = os.pwrite(fd, payload.ljust(OUTCOME_BYTES), 0) == OUTCOME_BYTES
            finally:
                os.close(fd)
        except OSError:
            pass
        self.reserve_file.unlink(missing_ok=True)
        if not written:  # no room was taken at start: try the ordinary way, now the reserve is free
            try:
                write_json_atomic(self.outcome_file, outcome)
                written = True
            except OSError:
                pass
        return written

    def secret(self) -> dict[str, Any]:
        """What only the supervisor reads: ``env`` (the ``--env`` values) and ``files_sha256``."""
        try:
            return self.read_json(self.secret_file)
        except (FileNotFoundError, ValueError):
            return {}

    def supervisor(self) -> dict[str, Any] | None:
        try:
            return self.read_json(self.supervisor_file)
        except (FileNotFoundError, ValueError):
            return None

    def look(self) -> Look | None:
        """Everything a listing or a resume reads of the job here, at once; None without a folder."""
        if not self.path.is_dir():
            return None
        spec: dict[str, Any] | None = None
        problem: str | None = None
        created: float | None = None
        try:
            spec = self.spec()
            created = self.spec_file.stat().st_mtime
        except FileNotFoundError:
            problem = SPEC_MISSING
        except ValueError as exc:
            problem = str(exc)
        status = self.status() or {}
        ended_on_record = status.get("status") in FINAL_STATUSES
        outcome = self.outcome() if spec is None or not ended_on_record else None
        running = spec is not None and outcome is None and not ended_on_record
        supervisor = self.supervisor() if running else None
        alive = running and self._runs(supervisor)
        return Look(
            spec, problem, created, status, outcome, supervisor, alive, running and not alive and self.guardian_alive()
        )

    def hold_start(self, timeout_s: float) -> int | None:
        """The folder's start lock, held (an open descriptor: closing it lets go; so does the
        holder's death) by a new supervisor from its look at whether the job was stopped until
        its supervisor.json is written, and by a stop that finds no supervisor, while it decides.
        So a stop either comes first (the supervisor then starts nothing) or finds the supervisor
        announced (and asks it to stop). None when not had within ``timeout_s``: go on without."""
        try:
            fd = os.open(self.path / ".start.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError:
            return None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    return None
                time.sleep(0.02)
            except OSError:  # a file system without locks
                os.close(fd)
                return None

    def supervisor_alive(self) -> bool:
        return self._runs(self.supervisor())

    def _runs(self, info: dict[str, Any] | None) -> bool:
        """Whether the supervisor its record (supervisor.json) names runs."""
        if not info or info.get("exited"):
            return False
        if info.get("host") not in (None, socket.gethostname()) and self.runs_elsewhere is not None:
            said = self.runs_elsewhere(info)
            if said is not None:
                return said
        return _alive(info)

    def guardian_alive(self) -> bool:
        """Whether the job's guardian runs (it brings a dead supervisor back)."""
        try:
            info = self.read_json(self.guardian_file)
        except (FileNotFoundError, ValueError):
            return False
        return _alive(info)


def _alive(info: dict[str, Any]) -> bool:
    """Whether the process a record names (``pid``, ``start_ticks``) runs; a record without a
    usable pid names none."""
    try:
        pid = int(info["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    return pid > 0 and pid_alive(pid, info.get("start_ticks"))

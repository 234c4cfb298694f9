"""The local job folder: everything a job is, on disk, so any kernel can find and re-attach it.

Layout (``$NOTEBOOK_ELASTIC_HOME/jobs/NAME/``):
    script.py, script.payload.pkl   the packaged cell (runs under plain torchrun too)
    spec.json, manifest.json        what was asked for and what was shipped
    events.jsonl                    every event, in order (the job's history)
    status.json                     the latest summary, rewritten atomically
    supervisor.json                 pid and control address of the supervisor (0600)
    supervisor.log, logs/NODE.log   raw output of the supervisor and of each agent
    checkpoints/                    default checkpoint folder
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from ...runtime.protocol import ENV_JOB_DIR


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no empty temp file left by a full disk
        raise


class JobFolder:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    name = property(lambda self: self.path.name)
    script = property(lambda self: self.path / "script.py")
    spec_file = property(lambda self: self.path / "spec.json")
    manifest_file = property(lambda self: self.path / "manifest.json")
    events_file = property(lambda self: self.path / "events.jsonl")
    status_file = property(lambda self: self.path / "status.json")
    supervisor_file = property(lambda self: self.path / "supervisor.json")
    supervisor_log = property(lambda self: self.path / "supervisor.log")
    guardian_file = property(lambda self: self.path / "guardian.json")
    logs = property(lambda self: self.path / "logs")
    checkpoints = property(lambda self: self.path / "checkpoints")

    def exists(self) -> bool:
        return self.spec_file.exists()

    def read_json(self, path: Path) -> Any:
        with open(path) as f:
            return json.load(f)

    def spec(self) -> dict[str, Any]:
        return self.read_json(self.spec_file)

    def status(self) -> dict[str, Any] | None:
        try:
            return self.read_json(self.status_file)
        except (FileNotFoundError, ValueError):
            return None

    def supervisor(self) -> dict[str, Any] | None:
        try:
            return self.read_json(self.supervisor_file)
        except (FileNotFoundError, ValueError):
            return None

    def supervisor_alive(self) -> bool:
        info = self.supervisor()
        if not info or info.get("exited"):
            return False
        return pid_alive(int(info["pid"]), info.get("start_ticks"))

    def guardian_alive(self) -> bool:
        """Whether the job's guardian runs (it brings a dead supervisor back)."""
        try:
            info = self.read_json(self.guardian_file)
        except (FileNotFoundError, ValueError):
            return False
        return pid_alive(int(info["pid"]), info.get("start_ticks"))


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (tells a reused pid from the original)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
    except OSError:
        pass
    if start_ticks is not None:
        return process_start_ticks(pid) == start_ticks
    return True


def processes_of(job_dir: str | os.PathLike) -> list[int]:
    """Pids of every live process started for this job (they carry the job folder in their
    environment). The process table is the ground truth for "no orphan left"."""
    marker = f"{ENV_JOB_DIR}={os.fspath(job_dir)}".encode()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if marker + b"\0" in env or env.endswith(marker):
            if pid_alive(int(entry)):
                found.append(int(entry))
    return found


def kill_all(job_dir: str | os.PathLike, grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process of the job, then SIGKILL what is left after ``grace_s``."""
    victims = processes_of(job_dir)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in victims):
        time.sleep(0.05)
    for pid in processes_of(job_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return victims

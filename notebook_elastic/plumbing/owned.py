"""The processes a job owns that their environment does not show: forks.

A job's processes are found by ``NOTEBOOK_ELASTIC_JOB_DIR=<job folder>`` in their environment
(``jobfolder.processes.processes_of``): every process started by ``exec`` with the job's
environment carries it, whatever starts it. A fork does not: Linux shows a process's
environment from the memory it was exec'd with, so a child the warm pool forks shows the
pool's, and a fork of that child (a DataLoader worker, the user's ``os.fork()``) the same.
Rather than write over that memory, each such process puts its name in the job folder:
``.procs/PID-TICKS-MACHINE``, an empty file (``TICKS``: its start time in clock ticks since
boot, which tells it from a later process given the same pid; ``MACHINE``: the boot and pid
namespace it runs in, as jobs on Slurm share their folder between machines). The pool's
children register as they start and install ``os.register_at_fork`` so that every
Python-level fork of theirs registers too.

A process that cannot name itself (a full disk, a fork made in C) is found as a descendant of
one that did (``processes_of``) while its parent lives; the pool's own child dies with its
launcher, which carries the job's environment. If the job folder itself is deleted while the
job runs, the names go with it: the launchers still take their children down, but a fork of
a fork whose parent has ended is then no longer found. Readers drop the names of processes
that ended.
The standard library only: this runs in workers.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

from ..contract.protocol import ENV_JOB_DIR
from .procfs import read_stat, stat_fields

FOLDER = ".procs"
_hooked = False


@functools.cache
def machine() -> str:
    """Which machine, boot and pid namespace a pid is of: the boot id (a pid and start time
    recur after a reboot) and the pid namespace's inode (a container sees other pids under the
    same names), else the host name. Not the host name first: it may change while a job runs."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:16]
        return f"{boot}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return socket.gethostname().replace("/", "_")


def _ticks(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def _name(pid: int, ticks: int) -> str:
    return f"{pid}-{ticks}-{machine()}"


def register(job_dir: str | None = None) -> Path | None:
    """Name this process in its job's folder (``job_dir``, else the one its environment
    names); the file written, or None where there is no job folder or no room."""
    job = job_dir if job_dir is not None else os.environ.get(ENV_JOB_DIR)
    ticks = _ticks(os.getpid())
    if not job or ticks is None:
        return None
    folder = Path(job) / FOLDER
    path = folder / _name(os.getpid(), ticks)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
    except OSError:  # a full disk, a folder gone with its job: found by descent, or not at all
        return None
    return path


def register_forks() -> None:
    """Register this process, and from now on every fork of it (and of those) as it starts."""
    global _hooked
    register()
    if not _hooked:
        _hooked = True
        os.register_at_fork(after_in_child=register)


def registered(job_dir: str | os.PathLike[str]) -> list[int]:
    """The pids of this machine named in the job folder, still running as the process that
    registered (pid and start time). A name is removed only on a sure answer: its process
    ended (a zombie has) or its pid is a later process's; a process that cannot be read now
    (out of file descriptors) stays named and is listed, for the caller to check."""
    folder = Path(job_dir) / FOLDER
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    here = machine()
    found = []
    for name in names:
        parts = name.split("-", 2)
        if len(parts) != 3 or parts[2] != here or not (parts[0].isdigit() and parts[1].isdigit()):
            continue
        pid, ticks = int(parts[0]), int(parts[1])
        try:
            fields = read_stat(pid)
        except OSError:
            found.append(pid)  # unknown now: not dropped
            continue
        if fields is not None and int(fields[19]) == ticks and fields[0] != "Z":
            found.append(pid)
            continue
        try:  # it ended (a zombie has), or its pid was given to a later process
            (folder / name).unlink()
        except OSError:
            pass
    return found


def named_elsewhere(job_dir: str | os.PathLike[str]) -> dict[int, set[int]]:
    """The processes of this machine named in the other job folders beside ``job_dir`` (under
    the same jobs folder): pid -> the start times named. Read as they are, not checked: the
    caller checks the few it meets (a walk by descent stops at another job's process)."""
    job = Path(job_dir)
    here = machine()
    found: dict[int, set[int]] = {}
    try:
        entries = os.scandir(job.parent)
    except OSError:
        return found
    with entries:
        for entry in entries:
            if entry.name == job.name:
                continue
            try:
                names = os.listdir(os.path.join(entry.path, FOLDER))
            except OSError:  # not a job folder, or no process of it was ever named
                continue
            for name in names:
                parts = name.split("-", 2)
                if len(parts) == 3 and parts[2] == here and parts[0].isdigit() and parts[1].isdigit():
                    found.setdefault(int(parts[0]), set()).add(int(parts[1]))
    return found


def is_registered(job_dir: str | os.PathLike[str], pid: int) -> bool:
    """Whether process ``pid``, as it runs now, is named in the job folder."""
    ticks = _ticks(pid)
    return ticks is not None and (Path(job_dir) / FOLDER / _name(pid, ticks)).exists()

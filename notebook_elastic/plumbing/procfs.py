"""A process's line in ``/proc/PID/stat`` (Linux), read in one place: its fields after the
command name, which may itself hold spaces and parentheses (proc(5): index 0 is field 3, the
state; 1 the parent's pid; 19 the start time in clock ticks). The standard library only."""

from __future__ import annotations


def stat_fields(pid: int) -> list[str] | None:
    """The fields after ``(comm)``; None when the process is gone, or cannot be read now (or
    this is not Linux)."""
    try:
        return read_stat(pid)
    except OSError:
        return None


def read_stat(pid: int) -> list[str] | None:
    """The fields after ``(comm)``; None when the process is gone; OSError when it cannot be
    read now (out of file descriptors, another pid namespace's /proc): no answer either way."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, or held by a debugger: ``T`` or ``t``); False
    when it is gone or cannot be read."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")

"""A job's processes: found (``processes_of``: what its environment or its folder's names mark
as the job's, and their descendants, bounded at a pool and at another job's), held by a pidfd
before they are judged, and signalled through it (``signal_all``, ``kill_all``). Its own module,
out of the job folder's (#38 item 2): the one way the kernel and the supervisor own processes."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable

import psutil

from ..contract.protocol import ENV_JOB_DIR, own_launcher
from ..plumbing import owned
from ..plumbing.procfs import stat_fields
from ..pool import is_pool_command


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (proc(5) field 22), as the records
    hold it: it tells a reused pid from the original. Read from the stat line because psutil
    gives it only as seconds since the epoch, through a boot time that a clock step moves."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Whether process ``pid`` runs (a zombie has ended); with ``start_ticks``, whether it is
    still the process that started then, not a later one given the same pid."""
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # a /proc that hides other users' processes: it exists, which is all we learn
    return start_ticks is None or process_start_ticks(pid) == start_ticks


def processes_of(job_dir: str | os.PathLike[str]) -> list[int]:
    """Pids of every live process started for this job, less this process: those whose
    environment holds ``NOTEBOOK_ELASTIC_JOB_DIR=<job_dir>`` (whatever was exec'd for it),
    those named in its folder (the warm pool's forks and theirs: ``plumbing/owned.py``), and
    the descendants of both (a fork that could not name itself: a full disk, a fork made in C).
    The walk by descent stops at a warm pool and at another job's process (``_Bounds``): the
    pool forks every job, so what lies below it is each job's by its own marks, not by descent.
    The process table is the ground truth for "no orphan left". Another user's processes (their
    environment is not ours to read, their names not in our folder) are never the job's."""
    job = os.fspath(job_dir)
    me = {os.getpid(), own_launcher()}  # a supervisor forked by the warm pool: its launcher is itself
    found = set(owned.registered(job)) - me
    children: dict[int, list[psutil.Process]] = {}
    marks: dict[int, str | None] = {}  # each process's job folder, as its environment names it
    for proc in psutil.process_iter():  # environ() itself, not attrs=: as_dict() costs a quarter more
        if proc.pid in me:
            continue
        try:
            children.setdefault(proc.ppid(), []).append(proc)
            marks[proc.pid] = mark = proc.environ().get(ENV_JOB_DIR)
            if proc.pid not in found and mark == job and pid_alive(proc.pid):
                found.add(proc.pid)
        except psutil.Error:  # gone, or another user's
            continue
    bounds = _Bounds(job)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child.pid in found or child.pid in me or not pid_alive(child.pid):
                continue
            if bounds.stop_at(child, marks.get(child.pid)):
                continue
            found.add(child.pid)
            todo.append(child.pid)
    return sorted(found)


class _Bounds:
    """Where a walk by descent from a job's processes stops: at a warm pool (a pool a guardian
    started had the next job's processes below it: stopping one job killed the other, #37), and
    at another job's process, by its environment or a name in a job folder beside this one
    (read once per walk, when a process not marked as this job's is met)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._real: str | None = None
        self._named: dict[int, set[int]] | None = None

    def stop_at(self, proc: psutil.Process, mark: str | None) -> bool:
        return self.another_jobs(proc.pid, mark) or _is_pool(proc)

    def another_jobs(self, pid: int, mark: str | None) -> bool:
        if mark is not None and mark != self.job:
            if self._real is None:
                self._real = os.path.realpath(self.job)
            if os.path.realpath(mark) != self._real:  # the same folder spelt another way is this job's
                return True
        if self._named is None:
            self._named = owned.named_elsewhere(self.job)
        ticks = self._named.get(pid)
        return ticks is not None and process_start_ticks(pid) in ticks


def _is_pool(proc: psutil.Process) -> bool:
    """Whether ``proc`` is a warm pool (``python -m notebook_elastic.pool.warm pool NAME``). A
    fork of one shows the pool's command line until it retitles itself; its parent is then the
    pool, which tells it apart."""
    try:
        if not is_pool_command(proc.cmdline()):
            return False
        parent = proc.parent()
        return parent is None or not is_pool_command(parent.cmdline())
    except psutil.Error:
        return False


def _is_the_jobs(proc: psutil.Process, job: str) -> bool:
    """Whether ``proc`` is one of the job's: its environment says so, the job folder names it,
    or one of its ancestors is the job's by either with no pool nor another job's process
    between them (``processes_of``'s walk, upwards)."""
    bounds = _Bounds(job)

    def judged(p: psutil.Process) -> bool | None:
        """True: the job's; False: a bound; None: look at its parent."""
        try:
            env = p.environ().get(ENV_JOB_DIR)
        except psutil.Error:
            env = None
        if env == job or owned.is_registered(job, p.pid):
            return True
        return False if bounds.stop_at(p, env) else None

    try:
        for p in (proc, *proc.parents()):
            verdict = judged(p)
            if verdict is not None:
                return verdict
    except psutil.Error:
        pass
    return False


class _Held:
    """One process, held so that a signal reaches it and never a later process given its pid:
    by a pidfd (Linux 5.3+), else by psutil's handle, which checks the start time it saw first
    (a pid freed and reused between that check and the signal is then the one gap left)."""

    def __init__(self, proc: psutil.Process, pidfd: int | None) -> None:
        self.proc = proc
        self.pidfd = pidfd

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        """Whether it has not exited yet (a zombie has)."""
        if self.pidfd is not None:
            exited = select.poll()  # poll, not select: a kernel may hold fds past select's 1024
            exited.register(self.pidfd, select.POLLIN)  # a pidfd reads ready once its process exits
            return not exited.poll(0)
        try:
            return self.proc.is_running() and self.proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def signal(self, sig: int) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                self.proc.send_signal(sig)
        except (OSError, psutil.Error):
            pass  # it exited meanwhile

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _hold(pid: int, job: str, which: Callable[[int], bool] | None) -> _Held | None:
    """Process ``pid``, held, if it is one of the job's (and ``which`` accepts it). The handle
    is taken before the check: it names one process for good, and a check made while that
    process still runs read that process, not a newcomer with its pid."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError:  # no pidfds here (Linux < 5.3, a sandbox that forbids them): psutil's handle alone
        pidfd = None
    held = _Held(proc, pidfd)
    ours = _is_the_jobs(proc, job) and (which is None or which(pid))
    if ours and held.running():
        return held
    held.close()
    return None


def _held_of(job_dir: str | os.PathLike[str], which: Callable[[int], bool] | None = None) -> list[_Held]:
    """The job's processes (those ``which`` accepts, when given), each held (``_hold``)."""
    job = os.fspath(job_dir)
    return [held for pid in processes_of(job) if (held := _hold(pid, job, which)) is not None]


def signal_all(job_dir: str | os.PathLike[str], sig: int, which: Callable[[int], bool] | None = None) -> list[int]:
    """Send ``sig`` to every process of the job (those ``which`` accepts, when given); the pids
    signalled. Never to a process that got the pid of one of them meanwhile (``_hold``)."""
    signalled = []
    for held in _held_of(job_dir, which):
        held.signal(sig)
        held.close()
        signalled.append(held.pid)
    return signalled


def kill_together(job_dir: str | os.PathLike[str], pids: list[int]) -> list[int]:
    """SIGKILL these processes of the job together: each held and checked as the job's first
    (``_hold``), then all signalled with nothing between. A node lost on this machine: its agent
    and its workers are the warm pool's forks, each in a session of its own, and left to follow
    their launcher's end one by one they ran on for milliseconds, long enough for a change to end
    with them (no lost host's processes can). The pids signalled."""
    job = os.fspath(job_dir)
    held = [h for pid in dict.fromkeys(pids) if (h := _hold(pid, job, None)) is not None]
    try:
        for h in held:
            h.signal(signal.SIGKILL)
    finally:
        for h in held:
            h.close()
    return [h.pid for h in held]


KILLED_EXIT_WAIT_S = 10.0  # how long kill_all waits for a SIGKILLed process to have exited


def kill_all(job_dir: str | os.PathLike[str], grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process of the job, then SIGKILL what is left after ``grace_s`` (and what
    started meanwhile); the pids sent SIGTERM. Never signals a process that got the pid of one of
    them meanwhile (``_hold``)."""
    victims = _held_of(job_dir)
    try:
        for held in victims:
            held.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(held.running() for held in victims):
            time.sleep(0.05)
        # Those still running, through the handles taken: one found as a descendant may have
        # lost its parent meanwhile (reparented, it is no longer found by descent).
        killed = [held for held in victims if held.running()]
        for held in killed:
            held.signal(signal.SIGKILL)
        # A SIGKILL is delivered, not done: a process tearing down its memory (or woken from a
        # SIGSTOP to die) runs on a while. "Ended" is said once it has exited, within a bound.
        deadline = time.monotonic() + KILLED_EXIT_WAIT_S
        while time.monotonic() < deadline and any(held.running() for held in killed):
            time.sleep(0.02)
    finally:
        for held in victims:
            held.close()
    signal_all(job_dir, signal.SIGKILL)  # and what started meanwhile
    return [held.pid for held in victims]

"""Owning a job's processes on the kernel's and the supervisor's side (jobfolder/folder.py,
supervisor/outcome.py and stall.py, through psutil and pidfds), on real processes: which are
the job's, which still run, which are stopped, and that ``kill_all`` never signals a process
that was given a victim's pid after the victim was found."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from waiting import wait_for

from notebook_elastic.contract.protocol import ENV_JOB_DIR, ENV_POOL
from notebook_elastic.jobfolder.processes import kill_all, pid_alive, process_start_ticks, processes_of
from notebook_elastic.plumbing import owned
from notebook_elastic.plumbing.procfs import is_stopped
from notebook_elastic.supervisor.outcome import _is_ours

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture(params=["pidfd", "psutil"])
def handle(request, monkeypatch) -> str:
    """How kill_all holds its victims: by pidfds, or by psutil's handles where the kernel has
    no pidfds (Linux < 5.3)."""
    if request.param == "psutil":

        def no_pidfds(pid: int, flags: int = 0) -> int:
            raise OSError(errno.ENOSYS, "pidfd_open is not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    return request.param


@contextmanager
def started(*specs: tuple[list[str], dict[str, str]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started from (argv, extra environment) pairs, killed and reaped at the end."""
    procs = [subprocess.Popen(argv, env={**os.environ, **env}) for argv, env in specs]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_processes_of_are_those_whose_environment_names_exactly_this_job(tmp_path: Path):
    job = str(tmp_path / "job")
    with started(
        (SLEEP, {ENV_JOB_DIR: job}),
        (SLEEP, {ENV_JOB_DIR: job + "2"}),  # another job whose folder's name starts alike
        (SLEEP, {"X" + ENV_JOB_DIR: job}),  # another variable ending in the same name
        (SLEEP, {ENV_JOB_DIR: job}),  # ended below: a zombie until reaped is not the job's
    ) as (ours, other_job, other_var, zombie):
        zombie.kill()
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        assert processes_of(job) == [ours.pid]
        assert not pid_alive(zombie.pid)


REGISTERS = [
    sys.executable,
    "-c",
    "import ctypes, os, signal, sys, time; from notebook_elastic.plumbing import owned\n"
    # As in a fork of the warm pool: the job folder in os.environ, not in what /proc shows.
    "os.environ['NOTEBOOK_ELASTIC_JOB_DIR'] = sys.argv[1]; owned.register_forks();"
    " child = os.fork()\nif child == 0: time.sleep(60); os._exit(0)\n"
    # A fork made in C runs no at-fork hook: it names nothing, and is found as a descendant.
    # It also ignores SIGTERM: once its parent is gone it is no descendant, and only the handle
    # taken on it before reaches it with SIGKILL.
    "c_child = ctypes.CDLL(None).fork()\n"
    "if c_child == 0: signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600); os._exit(0)\n"
    "print(child, c_child, flush=True); time.sleep(60)",
]


def test_a_process_named_in_the_job_folder_is_the_jobs_and_so_are_its_forks(tmp_path: Path, handle: str):
    """The warm pool's forks read as the pool in /proc: each names itself in the job folder
    (plumbing/owned.py), and so does every fork of it. Named processes are the job's until they
    end, and a name is the process that wrote it, not a later one given its pid."""
    job = tmp_path / "job"
    job.mkdir()
    env = {k: v for k, v in os.environ.items() if k != ENV_JOB_DIR}
    proc = subprocess.Popen([*REGISTERS, str(job)], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        fork, c_fork = (int(pid) for pid in proc.stdout.readline().split())
        wait_for(lambda: len(owned.registered(job)) == 2, "the process and its fork named")
        assert set(owned.registered(job)) == {proc.pid, fork}
        # Their environment hides the job: a name is enough (this process's does not count).
        other = str(tmp_path / "other")
        assert sorted(processes_of(other)) == []
        ours = processes_of(job)
        assert sorted(ours) == sorted([proc.pid, fork, c_fork])
        # A name whose start time is not the process's (a pid given again) is dropped; one from
        # another machine (a Slurm job's folder is shared) is not this machine's to judge.
        stale = job / owned.FOLDER / f"{proc.pid}-{process_start_ticks(proc.pid) + 1}-{owned.machine()}"
        elsewhere = job / owned.FOLDER / f"{os.getpid()}-1-another-host"
        stale.touch()
        elsewhere.touch()
        assert sorted(owned.registered(job)) == sorted([proc.pid, fork])
        assert not stale.exists() and elsewhere.exists()
        assert sorted(kill_all(job, grace_s=2.0)) == sorted([proc.pid, fork, c_fork])
        assert proc.wait(timeout=10) == -signal.SIGTERM
        wait_for(lambda: not pid_alive(fork) and not pid_alive(c_fork), "the forks ended", timeout=30)  # reparented
        assert owned.registered(job) == [] and [p.name for p in (job / owned.FOLDER).iterdir()] == [elsewhere.name]
    finally:
        proc.kill()
        proc.wait()


def test_a_record_tells_its_process_from_a_later_one_by_its_start_ticks():
    with started((SLEEP, {})) as (proc,):
        ticks = process_start_ticks(proc.pid)
        assert ticks is not None
        assert pid_alive(proc.pid) and pid_alive(proc.pid, ticks)
        assert not pid_alive(proc.pid, ticks + 1)  # the pid, given to a process started later
    assert not pid_alive(proc.pid, ticks) and process_start_ticks(proc.pid) is None


def _ignores_sigterm(pid: int) -> bool:
    """Whether the process has set SIGTERM to be ignored (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_kill_all_terminates_then_kills_what_ignores_sigterm(tmp_path: Path, handle: str):
    job = str(tmp_path / "job")
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
    ]
    with started((SLEEP, {ENV_JOB_DIR: job}), (stubborn, {ENV_JOB_DIR: job})) as procs:
        wait_for(lambda: _ignores_sigterm(procs[1].pid), "the stubborn one ignores SIGTERM", timeout=30, poll_s=0.01)
        started_at = time.monotonic()
        assert sorted(kill_all(job, grace_s=1.0)) == sorted(p.pid for p in procs)
        assert [p.wait(timeout=5) for p in procs] == [-signal.SIGTERM, -signal.SIGKILL]
        assert time.monotonic() - started_at >= 1.0  # the grace was given
    assert processes_of(job) == []


FROZEN_BIG = [
    sys.executable,
    "-c",
    "import mmap, sys, time\n"
    "m = mmap.mmap(-1, 1 << 30)\n"
    "for i in range(0, 1 << 30, 4096): m[i] = 1\n"
    "print('ready', flush=True); time.sleep(60)",
]


def test_kill_all_returns_once_what_it_killed_has_exited(tmp_path: Path, handle: str):
    """CI, stop 44: a stop said "its processes are ended" while the frozen supervisor it had
    SIGKILLed still ran. A SIGKILL is delivered, not done: a process with a gigabyte to tear
    down (woken from a SIGSTOP to die) exits half a second later on this machine."""
    job = str(tmp_path / "job")
    proc = subprocess.Popen(FROZEN_BIG, env={**os.environ, ENV_JOB_DIR: job}, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        os.kill(proc.pid, signal.SIGSTOP)  # frozen: SIGTERM waits, only SIGKILL ends it
        # ... once it has stopped: a SIGTERM sent before it ran again is taken first (the lower
        # signal), and ends it by SIGTERM (fresh-clone run 8, under load).
        wait_for(lambda: is_stopped(proc.pid), "the process stopped", timeout=30, poll_s=0.01)
        assert kill_all(job, grace_s=0.2) == [proc.pid]
        assert not pid_alive(proc.pid)  # exited (a zombie until reaped here), not dying
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _give_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A new process (not the job's) given ``pid``, which must be free: the kernel hands out
    ns_last_pid + 1 next, unless another fork on the machine takes it first (tried again)."""
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(SLEEP)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.parametrize("replaced_after_read", [1, 2], ids=["after-listing", "after-the-check"])
def test_kill_all_never_signals_a_process_that_took_a_victims_pid(
    tmp_path: Path, monkeypatch, replaced_after_read, handle: str
):
    """The victim exits and a process that is not the job's is given its pid right after
    kill_all read the victim's environment: when it listed the job's processes (1), or when it
    checked the victim again before signalling it (2). Signalling by pid would hit the
    newcomer; kill_all signals through a handle on the victim itself: a pidfd, or psutil's
    where the kernel has no pidfds."""
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w"):
            pass
    except OSError:
        pytest.skip("choosing the next pid needs a writable /proc/sys/kernel/ns_last_pid (root)")
    job = str(tmp_path / "job")
    newcomer: list[subprocess.Popen[bytes]] = []
    with started((SLEEP, {ENV_JOB_DIR: job})) as (victim,):
        # psutil tells processes apart by their start time, in clock ticks (10 ms): a pid reused
        # within a tick of its first owner's start would pass for it. Real reuse comes a pid
        # space later; here the victim is made a few ticks old first.
        time.sleep(0.05)
        reads = 0
        environ = psutil.Process.environ

        def environ_then_replace(proc: psutil.Process) -> dict[str, str]:
            nonlocal reads
            env = environ(proc)
            if proc.pid == victim.pid:
                reads += 1
                if reads == replaced_after_read:
                    victim.kill()
                    victim.wait()
                    given = _give_pid(victim.pid)
                    if given is None:
                        pytest.skip("another process kept taking the freed pid")
                    newcomer.append(given)
            return env

        monkeypatch.setattr(psutil.Process, "environ", environ_then_replace)
        try:
            killed = kill_all(job, grace_s=0.5)
            assert newcomer, "the victim was never read"
            assert newcomer[0].pid == victim.pid
            assert newcomer[0].poll() is None, "kill_all signalled the process given the victim's pid"
            assert killed == []  # the victim had gone before it could be signalled
        finally:
            for proc in newcomer:
                proc.kill()
                proc.wait()


def test_a_stopped_process_is_told_and_a_gone_one_is_not():
    with started((SLEEP, {})) as (proc,):
        os.kill(proc.pid, signal.SIGSTOP)
        while not is_stopped(proc.pid):
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGCONT)
        while is_stopped(proc.pid):
            time.sleep(0.01)
    assert not is_stopped(proc.pid)


def test_machinery_is_told_by_marks_spanning_its_arguments():
    argv = [*SLEEP, "notebook_elastic.pool.warm", "serve"]
    with started((argv, {})) as (proc,):
        while psutil.Process(proc.pid).cmdline()[-1:] != ["serve"]:  # until it has exec'd
            time.sleep(0.01)
        assert _is_ours(proc.pid, "notebook_elastic.pool.warm\0serve")
        assert not _is_ours(proc.pid, "notebook_elastic.pool.warm serve", "local.guardian")
    assert not _is_ours(proc.pid, "notebook_elastic.pool.warm\0serve")


BESIDE_ANOTHER_JOB = """
import os, subprocess, sys, time
from notebook_elastic import pool
a, b, name = sys.argv[1:4]
clean = {k: v for k, v in os.environ.items() if k != "NOTEBOOK_ELASTIC_JOB_DIR"}
marked_b = subprocess.Popen(["sleep", "600"], env={**clean, "NOTEBOOK_ELASTIC_JOB_DIR": b})
named_b = subprocess.Popen(
    [sys.executable, "-c", "import sys, time; from notebook_elastic.plumbing import owned; "
     "owned.register(sys.argv[1]); time.sleep(600)", b], env=clean)
plain = subprocess.Popen(["sleep", "600"], env=clean)  # unmarked: this job's by descent
warm = pool.start(name, clean)  # attached: this process of job A is the pool's parent
print(marked_b.pid, named_b.pid, plain.pid, warm.pid, flush=True)
time.sleep(600)
"""

SLEEPER = "import time\ntime.sleep(600)\n"


@pytest.mark.slow
def test_the_walk_by_descent_stops_at_a_pool_and_at_another_jobs_processes(tmp_path: Path):
    """#37 item 4: ownership by descent ran from job A's process through a warm pool it had
    started to job B's processes forked from that pool, and stopping A killed B. Below one of
    A's processes: a process whose environment names job B, one named in B's folder, a real
    pool and a fork of it for B (a launcher's request, as B's supervisor is made), and a plain
    child. Only the plain child is A's; ending A leaves the others running."""
    from notebook_elastic import pool

    root = tmp_path / "jobs"
    a, b = root / "a", root / "b"
    a.mkdir(parents=True)
    b.mkdir()
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    name = f"@notebook-elastic-pool-test-{os.urandom(8).hex()}"
    parent = subprocess.Popen(
        [sys.executable, "-c", BESIDE_ANOTHER_JOB, str(a), str(b), name],
        env={**os.environ, ENV_JOB_DIR: str(a)},
        stdout=subprocess.PIPE,
    )
    everyone = [parent.pid]
    launcher = None
    try:
        assert parent.stdout is not None
        marked_b, named_b, plain, warm = (int(pid) for pid in parent.stdout.readline().split())
        everyone += [marked_b, named_b, plain, warm]
        assert pool.wait_for(name, 180) == warm and psutil.Process(warm).ppid() == parent.pid
        launcher = subprocess.Popen(
            [sys.executable, "-m", "notebook_elastic.pool.warm", "-m", "sleeper"],
            env={**os.environ, ENV_POOL: name, ENV_JOB_DIR: str(b), "PYTHONPATH": str(tmp_path)},
        )
        everyone.append(launcher.pid)
        wait_for(lambda: [p for p in owned.registered(b) if p != named_b], "the pool's fork for job B named")
        (fork,) = [p for p in owned.registered(b) if p != named_b]
        everyone.append(fork)
        assert psutil.Process(fork).ppid() == warm
        assert sorted(processes_of(a)) == sorted([parent.pid, plain])
        assert sorted(kill_all(a, grace_s=2.0)) == sorted([parent.pid, plain])
        assert parent.wait(timeout=10) == -signal.SIGTERM
        for pid in (marked_b, named_b, warm, fork):
            assert pid_alive(pid), f"{pid} was not job A's, yet it was ended with it"
        assert launcher.poll() is None and pool.ping(name) == warm
    finally:
        for pid in reversed(everyone):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in (parent, launcher):
            if proc is not None:
                proc.wait()
        wait_for(lambda: not any(pid_alive(p) for p in everyone), "every process of the test ended", timeout=30)


def test_a_worker_stopped_for_a_moment_at_a_change_is_kept_and_one_that_stays_stopped_is_not():
    """An agent restarts a worker that is stopped when the members change (agent/inplace.py
    ``why_not_kept``), only once it stayed stopped ``STOPPED_FOR_S``: a node thawed process by
    process, its agent first, saw its worker still stopped a moment and killed it (a fresh-clone
    CI run of ``test_in_place.py::test_a_node_thawed_after_the_others_regrouped_twice_rejoins_at_once``)."""
    import socket
    import threading

    from notebook_elastic.agent.inplace import Links, _Worker

    links = Links()
    proc = subprocess.Popen(SLEEP)
    ours, theirs = socket.socketpair()
    try:
        links._workers[0] = _Worker(0, proc.pid, ours, capable=True, said=True)  # it said it can stay
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: is_stopped(proc.pid), "stopped", timeout=30, poll_s=0.01)
        threading.Timer(0.2, os.kill, (proc.pid, signal.SIGCONT)).start()
        assert links.stopped([0]) == []  # it went on within the second
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: is_stopped(proc.pid), "stopped again", timeout=30, poll_s=0.01)
        assert links.stopped([0]) == [0]
        assert "is stopped" in (links.why_not_kept([0]) or "")
    finally:
        proc.kill()
        proc.wait()
        ours.close()
        theirs.close()

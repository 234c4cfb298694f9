"""The warm pool (pool/__init__.py): a local job's supervisor, agents and workers are forks of
one process per user that imported torch once and outlives jobs. Its children read as
themselves in ``ps`` and are named in their job folder (so the job's orphan scan and the
leftover check see them, and their forks), do
not die with it, and it is reaped when idle; it serves only its own user."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from test_warm import assert_another_user_is_refused
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic import pool
from notebook_elastic.backends.local import LocalBackend
from notebook_elastic.contract import protocol
from notebook_elastic.contract.event_types import Kind
from notebook_elastic.jobfolder.folder import prepare_jobs_root
from notebook_elastic.jobfolder.processes import pid_alive, processes_of
from notebook_elastic.plumbing import owned

pytestmark = pytest.mark.slow

GATED = """
import os
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(2, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), pid=os.getpid(), ppid=os.getppid(), all_ranks=True)
    while step >= HOLD_AT and not os.path.exists(GATE):  # a resumed run holds too
        time.sleep(0.05)
"""


def namespace(gate: str, total: int = 12, hold_at: int = 5) -> dict:
    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total, "HOLD_AT": hold_at, "GATE": gate}


def ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except OSError:
        return None


def proc_file(pid: int, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


def reports(job) -> list[dict]:
    """The values every rank reported, from the job's history (all of them, undecimated)."""
    events = LocalBackend().folder(job.name).events_file.read_text().splitlines()
    return [json.loads(line)["values"] for line in events if '"kind":"metric"' in line]


def start_private_pool(name: str, **env: str) -> subprocess.Popen:
    proc = pool.start(name, {**os.environ, **env})
    assert pool.wait_for(name, 180) == proc.pid, "the pool did not come up"
    return proc


def test_a_jobs_processes_are_forks_of_the_pool_which_outlives_it(home, tmp_path, warm_pool):
    pool_pid = pool.wait_for(warm_pool, 180)
    assert pool_pid is not None
    gate = str(tmp_path / "gate")
    job = ne.launch(GATED, nproc_per_node=2, name="pooled", user_ns=namespace(gate))
    wait_for(lambda: job.state.step is not None and job.state.step >= 5, "the held step")
    folder = home / "jobs" / "pooled"
    supervisor = json.loads((folder / "supervisor.json").read_text())["pid"]
    agents = [e.data["pid"] for e in job.events if e.kind == Kind.AGENT_STARTED]
    workers = {r["pid"] for r in reports(job)}
    assert agents and len(workers) == 2
    named = set(owned.registered(folder))
    for pid in [supervisor, *agents, *workers]:
        assert ppid(pid) == pool_pid, f"{pid} is not a child of the pool"
        # Its environment reads as the pool's (no job folder, no test marker there): its job
        # folder names it, and the job's own orphan scan finds it.
        environ = proc_file(pid, "environ").split(b"\0")
        assert not [e for e in environ if e.startswith(b"NOTEBOOK_ELASTIC_JOB_DIR=")]
        assert pid in named and pid in processes_of(folder)
    # Named as a cold start's would be (the agent's is torch's: pt_elastic, as when cold).
    for pid in [supervisor, *workers]:
        assert proc_file(pid, "comm").strip() == os.path.basename(sys.executable)[:15].encode()

    # ps shows each as the command a cold start would have run (setproctitle: one string,
    # its arguments joined by spaces, as ps shows any command line).
    def shown(pid: int) -> str:
        return " ".join(a for a in psutil.Process(pid).cmdline() if a)

    assert f"{sys.executable} -m notebook_elastic.supervisor.run " in shown(supervisor)
    assert all(f"{sys.executable} -m notebook_elastic.agent.run " in shown(pid) for pid in agents)
    assert all(shown(pid).startswith(f"{sys.executable} -u ") and "script.py" in shown(pid) for pid in workers)
    open(gate, "w").close()
    assert job.wait(timeout=180) == "succeeded"
    assert pool.ping(warm_pool) == pool_pid  # it outlives the job
    again = ne.launch(GATED, nproc_per_node=1, name="pooled-again", user_ns=namespace(gate, total=3))
    assert again.wait(timeout=180) == "succeeded"
    assert {r["ppid"] for r in reports(again)} == {pool_pid}  # the next job's workers: the same pool


FORKS = """
import os, signal
model = torch.nn.Linear(4, 1)
state = elastic.State(model=model)
for step in state.steps(TOTAL):
    if step == 1 and int(os.environ["RANK"]) == 0:
        child = os.fork()  # the user's own fork of a warm worker, left running in a session of its own
        if child == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
            os._exit(0)
        elastic.report(step=step, orphan=child)
    state.commit()
"""


def test_a_fork_of_a_forked_worker_is_the_jobs_and_ends_with_it(home, warm_pool):
    """A warm worker's environment reads as the pool's, and so does its own fork's: the fork
    names itself in the job folder as it starts (os.register_at_fork), so the supervisor finds
    it at the end, kills it (it ignores SIGTERM) and says so."""
    assert pool.wait_for(warm_pool, 180) is not None
    job = ne.launch(FORKS, nproc_per_node=1, name="forks", user_ns=namespace("", total=4))
    assert job.wait(timeout=180) == "succeeded", job.logs[-20:]
    orphan = next(r["orphan"] for r in reports(job) if "orphan" in r)
    finished = next(e for e in job.events if e.kind == Kind.JOB_FINISHED)
    assert finished.get("orphans_killed") == 1, finished.data
    wait_for(
        lambda: not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE,
        "the orphan killed",
    )


def test_a_killed_pool_takes_no_job_with_it(home, tmp_path, monkeypatch):
    """The pool is SIGKILLed while a job trains: its supervisor, agent and workers (forks of
    it) go on, their launchers learn their exit statuses from the children themselves, and
    the job succeeds without a restart."""
    name = f"@notebook-elastic-pool-test-{os.urandom(8).hex()}"
    proc = start_private_pool(name)
    monkeypatch.setenv(protocol.ENV_POOL, name)
    gate = str(tmp_path / "gate")
    try:
        job = ne.launch(GATED, nproc_per_node=2, name="orphaned-pool", user_ns=namespace(gate))
        wait_for(lambda: job.state.step is not None and job.state.step >= 5, "the held step")
        assert {r["ppid"] for r in reports(job)} == {proc.pid}
        supervisor = json.loads((home / "jobs" / "orphaned-pool" / "supervisor.json").read_text())["pid"]
        proc.kill()
        proc.wait()
        open(gate, "w").close()
        assert job.wait(timeout=180) == "succeeded", job.logs[-20:]
        assert job.state.restarts == 0
        assert job.state.step == 11
        # The same supervisor saw it through: it was not lost and brought back by its guardian.
        assert not [e for e in job.events if e.kind == Kind.JOB_RESUMED]
        assert json.loads((home / "jobs" / "orphaned-pool" / "supervisor.json").read_text())["pid"] == supervisor
    finally:
        proc.kill()
        proc.wait()


def test_a_frozen_pool_costs_a_launch_a_cold_start_not_the_job(home, tmp_path, monkeypatch):
    """A pool that does not answer (stopped) held every launcher waiting for its word: a launch
    failed after 32 s with "did not start: (empty log)" (an adversary's pass). Each launcher
    starts cold once the pool has not said it forked within its bound, and the forks the pool
    makes of those requests when it runs again end at once (their launchers gave up on them)."""
    name = f"@notebook-elastic-pool-test-{os.urandom(8).hex()}"
    proc = start_private_pool(name)
    monkeypatch.setenv(protocol.ENV_POOL, name)
    gate = tmp_path / "gate"
    gate.touch()
    try:
        proc.send_signal(signal.SIGSTOP)
        job = ne.launch(GATED, nproc_per_node=1, name="frozen-pool", user_ns=namespace(str(gate), total=3))
        assert job.wait(timeout=180) == "succeeded", job.summary()
        proc.send_signal(signal.SIGCONT)
        time.sleep(2)  # it forks what it was asked meanwhile: each such fork ends at once
        assert [c.pid for c in psutil.Process(proc.pid).children() if c.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_an_idle_pool_is_reaped_gives_way_to_none_and_serves_only_its_user():
    name = f"@notebook-elastic-pool-test-{os.urandom(8).hex()}"
    first = start_private_pool(name, **{protocol.ENV_POOL_IDLE_S: "2"})
    try:
        # A second pool started for the same name finds it taken and exits before importing.
        second = pool.start(name, dict(os.environ))
        assert second.wait(60) == 0
        assert pool.ping(name) == first.pid
        assert_another_user_is_refused(name)
        # Idle (no child, no request) for 2 s: it exits by itself.
        assert first.wait(180) == 0
        assert pool.ping(name) is None
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
            first.wait()


def test_a_pool_ends_with_its_owner_and_never_follows_a_planted_log_link(tmp_path):
    """``NOTEBOOK_ELASTIC_POOL_OWNER``: a test session's pool ends with it, even when the
    session is killed. The log is opened without following links: one planted at its path
    (by whoever could write there) is not written through."""
    owner = subprocess.Popen(["sleep", "600"])
    name = f"@notebook-elastic-pool-test-{os.urandom(8).hex()}"
    target = tmp_path / "someone-elses-file"
    target.write_text("theirs\n")
    (tmp_path / "pool.log").symlink_to(target)
    proc = pool.start(name, {**os.environ, protocol.ENV_POOL_OWNER: str(owner.pid)}, tmp_path / "pool.log")
    try:
        assert pool.wait_for(name, 180) == proc.pid, "the pool did not come up"
        assert target.read_text() == "theirs\n"
        owner.kill()
        owner.wait()
        assert proc.wait(180) == 0
        assert pool.ping(name) is None
        # An owner gone before the pool starts: it does not stay.
        late = pool.start(name, {**os.environ, protocol.ENV_POOL_OWNER: str(owner.pid)})
        assert late.wait(180) == 0 and pool.ping(name) is None
    finally:
        for p in (owner, proc):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_the_pool_is_off_with_its_switch(monkeypatch):
    monkeypatch.setenv(protocol.ENV_POOL_ON, "0")
    assert pool.ensure_pool() is None
    monkeypatch.setenv(protocol.ENV_POOL_ON, "1")
    monkeypatch.setenv("NOTEBOOK_ELASTIC_WARM_WORKERS", "0")
    assert pool.ensure_pool() is None


def test_the_pool_is_named_by_user_interpreter_torch_and_import_time_environment(monkeypatch):
    """Jobs whose processes would import torch the same way share a pool; a variable read when
    torch is imported, a torch upgraded in place, or another notebook-elastic, gets another one."""
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/a"}
    name = pool.pool_name(base)
    assert name.startswith(f"@notebook-elastic-pool-{os.getuid()}-")
    # Read only after the fork (a rank's GPUs, a job's folder): the same pool.
    assert pool.pool_name({**base, "CUDA_VISIBLE_DEVICES": "1", "NOTEBOOK_ELASTIC_HOME": "/x"}) == name
    assert pool.pool_name({**base, "PYTHONPATH": "/b"}) != name
    assert pool.pool_name({**base, "TORCH_LOGS": "dynamo"}) != name
    assert pool.pool_name({**base, "OMP_NUM_THREADS": "1"}) != name
    monkeypatch.setattr(pool, "_torch_install", lambda: "/site/torch/version.py:2:313")
    upgraded = pool.pool_name(base)
    assert upgraded != name
    # notebook-elastic upgraded, or another copy of it: another pool (old code: the same one)
    monkeypatch.setattr("notebook_elastic._version.__version__", "99.0")
    assert pool.pool_name(base) != upgraded


def test_load_ext_starts_the_pool_in_the_background_of_a_real_kernel(home, tmp_path, monkeypatch):
    """`%load_ext notebook_elastic` in an ipykernel starts this environment's pool without
    waiting for it; the first job's processes are then its forks."""
    from notebook_kernel import NotebookKernel

    name = f"@notebook-elastic-pool-test-{os.urandom(8).hex()}"
    monkeypatch.setenv(protocol.ENV_POOL, name)  # the kernel inherits it (the session's pool is not this one)
    assert pool.ping(name) is None
    prepare_jobs_root(home)  # a user who has run jobs before: the pool logs there
    pid = None
    try:
        with NotebookKernel(tmp_path / "nb") as nb:
            out = nb.run("%load_ext notebook_elastic")
            pid = pool.wait_for(name, 180)
            assert pid is not None, out
            nb.run("import os")
            nb.run(
                "%%elastic_train --name from-kernel --nproc-per-node 1 --wait\nelastic.report(step=0, ppid=os.getppid())"
            )
            reports_ = LocalBackend().folder("from-kernel").events_file.read_text()
            assert f'"ppid":{pid}' in reports_.replace(" ", "")
            # Its own messages go to the private jobs folder, readable by its user only.
            assert (LocalBackend().root / ".pool.log").stat().st_mode & 0o777 == 0o600
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: ppid(pid) is None, "the pool to exit")


def test_the_cli_tells_whether_the_pool_runs_and_stops_it(monkeypatch, capsys):
    from notebook_elastic import cli

    name = f"@notebook-elastic-pool-test-{os.urandom(8).hex()}"
    monkeypatch.setenv(protocol.ENV_POOL, name)
    assert cli.main(["pool"]) == 0
    assert "no warm pool runs" in capsys.readouterr().out
    proc = start_private_pool(name)
    try:
        assert cli.main(["pool"]) == 0
        assert f"pid {proc.pid}" in capsys.readouterr().out
        assert cli.main(["pool", "stop"]) == 0
        assert "running jobs go on" in capsys.readouterr().out
        assert proc.wait(180) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_pool_a_jobs_guardian_started_is_no_part_of_that_job(home, tmp_path, monkeypatch):
    """#37 item 4: with no pool running, a job's guardian bringing its job back started the pool
    as its own child; the next job was forked from that pool, so it read as a descendant of the
    first job's guardian, and stopping the first job killed the second. The pool is started
    detached (its parent is init), and the walk by descent stops at a pool."""
    name = f"@notebook-elastic-pool-test-{os.urandom(8).hex()}"
    monkeypatch.setenv(protocol.ENV_POOL, name)
    pools: list[int] = []
    try:
        first = ne.launch(GATED, nproc_per_node=1, name="first", user_ns=namespace(str(tmp_path / "never")))
        wait_for(lambda: first.state.step is not None and first.state.step >= 5, "the first job's held step")
        pools.append(pool.wait_for(name, 180))
        os.kill(pools[0], signal.SIGKILL)  # no pool runs now
        wait_for(lambda: pool.ping(name) is None, "the pool gone")
        first_dir = home / "jobs" / "first"
        os.kill(json.loads((first_dir / "supervisor.json").read_text())["pid"], signal.SIGKILL)
        # Its guardian brings it back, and starts the pool again on the way.
        wait_for(lambda: pool.ping(name) is not None, "the pool the guardian started", job=first)
        pools.append(pool.ping(name))
        wait_for(lambda: any(e.kind == Kind.JOB_RESUMED for e in first.events), "the recovery", job=first)
        guardian = json.loads((first_dir / "guardian.json").read_text())["pid"]
        assert ppid(pools[1]) != guardian
        assert pools[1] not in processes_of(first_dir) and ppid(pools[1]) not in processes_of(first_dir)

        gate = str(tmp_path / "gate")
        second = ne.launch(GATED, nproc_per_node=1, name="second", user_ns=namespace(gate))
        wait_for(lambda: second.state.step is not None and second.state.step >= 5, "the second job's held step")
        second_dir = home / "jobs" / "second"
        supervisor = json.loads((second_dir / "supervisor.json").read_text())["pid"]
        assert ppid(supervisor) == pools[1]  # forked from the pool the first job's guardian started
        assert not set(processes_of(second_dir)) & set(processes_of(first_dir))
        # Stopped from the kernel's side (its supervisor frozen: the kernel ends the job's
        # processes itself, its guardian among them, walking down from each).
        first_supervisor = json.loads((first_dir / "supervisor.json").read_text())["pid"]
        # (once in CI its pid was gone here, with every process of the first job: say how it ended)
        assert pid_alive(first_supervisor), f"the first job ended before its stop: {first.summary()}; " + "; ".join(
            f"{e.kind} {e.data}" for e in first.events[-12:]
        )
        os.kill(first_supervisor, signal.SIGSTOP)
        assert first.stop() == "stopped"
        assert pid_alive(supervisor) and pool.ping(name) == pools[1]
        open(gate, "w").close()
        assert second.wait(timeout=180) == "succeeded", second.summary()
        assert not [e for e in second.events if e.kind in (Kind.JOB_RESUMED, Kind.RECOVERING)]
    finally:
        for pid in pools[1:]:
            if pid is not None and pid_alive(pid):
                os.kill(pid, signal.SIGTERM)
        wait_for(lambda: pool.ping(name) is None, "the pool to exit")


def test_the_pool_is_one_whichever_spelling_of_the_interpreter_names_it(monkeypatch):
    """#37 item 17: the pool's name hashed the interpreter's path as spelt, so a pool started
    from .venv/bin/python3 was not the one `notebook-elastic pool stop` (.venv/bin/python) looked
    for. Every spelling of one interpreter in one environment names one pool; another
    environment over the same interpreter still gets its own."""
    bin_dir = os.path.dirname(sys.executable)
    spellings = sorted(
        {os.path.join(bin_dir, n) for n in os.listdir(bin_dir) if n.startswith("python3")} | {sys.executable}
    )
    spellings.append(os.path.join(bin_dir, ".", "..", os.path.basename(bin_dir), os.path.basename(sys.executable)))
    env = {k: v for k, v in os.environ.items() if k != protocol.ENV_POOL}
    env["TORCH_NE_TEST_POOL"] = os.urandom(8).hex()  # read as an import-time variable: a name of this test's own
    ask = "from notebook_elastic import pool; print(pool.pool_name())"
    names = {
        subprocess.run([s, "-c", ask], env=env, capture_output=True, text=True, check=True).stdout for s in spellings
    }
    assert len(names) == 1 and len(spellings) >= 3, (spellings, names)
    name = names.pop().strip()
    monkeypatch.setattr(sys, "prefix", "/another/venv")
    assert pool.pool_name({k: v for k, v in env.items()}) != name

    # Started from one spelling, seen and stopped by the command line from another.
    start = "from notebook_elastic import pool; print(pool.ensure_pool())"
    started = subprocess.run([spellings[-1], "-c", start], env=env, capture_output=True, text=True, check=True)
    assert started.stdout.strip() == name
    pid = pool.wait_for(name, 180)
    try:
        assert pid is not None and ppid(pid) != os.getpid()  # detached: not this process's child
        cli = os.path.join(bin_dir, "notebook-elastic")
        said = subprocess.run([cli, "pool", "stop"], env=env, capture_output=True, text=True, check=True).stdout
        assert f"stopped the warm pool (pid {pid})" in said, said
        wait_for(lambda: pool.ping(name) is None and ppid(pid) is None, "the pool to exit")
    finally:
        if pid is not None and ppid(pid) is not None:
            os.kill(pid, signal.SIGKILL)

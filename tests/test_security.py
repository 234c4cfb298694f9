"""What a local job leaves behind: private files, no secret at rest, a home nobody else
controls, and a script that cannot be swapped between restarts.

The end-to-end tests run real torchrun jobs (``slow``); the home checks launch nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import time
from pathlib import Path

import pytest
import torch

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.backends.local import LocalBackend
from notebook_elastic.contract.event_types import Kind

SECRET = "hf_" + "Zq8" * 12  # a made-up token, long enough to be found anywhere it leaks

READ_SECRET = """
import hashlib, os
token = os.environ["HF_TOKEN"]
state = elastic.State(model=torch.nn.Linear(2, 1))
for step in state.steps(2):
    state.commit()  # checkpoints, written by the workers
elastic.report(step=0, digest=int(hashlib.sha256(token.encode()).hexdigest()[:12], 16))
"""


def tree_modes(root: Path) -> dict[str, int]:
    """Every folder and file under root (root included) -> its permission bits."""
    modes = {".": stat.S_IMODE(root.stat().st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            modes[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return modes


def zygote_files(agent_pids: list[int]) -> list[str]:
    """Files in the system temp folder named after one of these agents' zygotes."""
    prefixes = tuple(f"ne-zygote-{pid}-" for pid in agent_pids)
    return [name for name in os.listdir(tempfile.gettempdir()) if name.startswith(prefixes)]


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_job_folder_is_private_and_holds_no_env_value(home, umask):
    old = os.umask(umask)
    try:
        for _ in range(2):  # the second launch archives the first into jobs/.history
            job = ne.launch(READ_SECRET, nnodes="1", name="private", env={"HF_TOKEN": SECRET}, user_ns=namespace())
            assert job.wait(120) == "succeeded", job.reason
    finally:
        os.umask(old)
    # The worker saw the value...
    assert job.metrics.last("digest") == int(hashlib.sha256(SECRET.encode()).hexdigest()[:12], 16)
    # ...and only the job's 0600 secret.json holds it (for the supervisor and a resume):
    # not spec.json (the name only), events, logs, status or anything else.
    folder = LocalBackend().folder("private")
    assert folder.spec()["env"] == ["HF_TOKEN"]
    holders = sorted(
        str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()
    )
    assert [h for h in holders if not h.endswith("/secret.json")] == [], holders
    assert "jobs/private/secret.json" in holders
    assert SECRET not in repr(job.dryrun.request) and SECRET not in job.dryrun.text
    # Every folder 0700, every file 0600, the script 0700: whatever the umask was.
    modes = tree_modes(home)
    loose = {p: f"{m:04o}" for p, m in modes.items() if m not in (0o700, 0o600)}
    assert not loose, loose
    assert modes["jobs/private/script.py"] == 0o700
    assert modes["jobs/private/spec.json"] == 0o600
    assert modes["jobs/private/secret.json"] == 0o600
    assert modes["jobs/private/events.jsonl"] == 0o600
    assert modes["jobs/private/logs"] == 0o700
    assert any(p.startswith("jobs/private/logs/") for p in modes)
    assert any(p.startswith("jobs/private/checkpoints/ckpt-") for p in modes), sorted(modes)
    assert any(p.startswith("jobs/private/tensorboard/events.out.tfevents.") for p in modes), sorted(modes)
    # torchrun's error files too, instead of a /tmp/torchelastic_* folder per agent.
    assert any(p.startswith("jobs/private/logs/torchelastic/") for p in modes), sorted(modes)
    assert "log directory set to: /tmp/torchelastic_" not in (folder.logs / "node-0.log").read_text()
    assert modes["jobs/.history"] == 0o700 and any(p.startswith("jobs/.history/private-") for p in modes)
    # The warm workers' sockets were never files in the system temp folder.
    agents = [e.get("pid") for e in job.events if e.kind == Kind.NODE_JOINED]
    assert agents and zygote_files(agents) == []


def test_a_world_writable_home_is_refused_before_anything_launches(home):
    home.mkdir()
    os.chmod(home, 0o777)
    with pytest.raises(ne.BackendError) as info:
        ne.launch("x = 1", nnodes="1", name="refused", user_ns={})
    message = str(info.value)
    assert str(home) in message and "writable by other users" in message and f"chmod 700 {home}" in message
    assert "NOTEBOOK_ELASTIC_HOME" in message
    assert not (home / "jobs").exists()


def test_a_home_owned_by_another_user_is_refused(home):
    if os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    home.mkdir(mode=0o700)
    os.chown(home, 65534, 65534)
    with pytest.raises(ne.BackendError) as info:
        ne.launch("x = 1", nnodes="1", name="refused", user_ns={})
    message = str(info.value)
    assert str(home) in message and "owned by another user (uid 65534)" in message
    assert "point NOTEBOOK_ELASTIC_HOME at a folder of your own" in message
    assert not (home / "jobs").exists()


def test_jobs_under_a_shared_sticky_folder_get_a_private_subfolder(home, monkeypatch):
    shared = home / "shared"
    shared.mkdir(parents=True)
    os.chmod(shared, 0o1777)  # like /tmp
    monkeypatch.setenv("NOTEBOOK_ELASTIC_HOME", str(shared))
    from notebook_elastic.jobfolder.folder import prepare_jobs_root

    root = prepare_jobs_root(shared)
    assert root == shared / f"notebook-elastic-{os.getuid()}" / "jobs"
    assert LocalBackend().root == root
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and stat.S_IMODE(root.parent.stat().st_mode) == 0o700
    # Someone else got there first: refused, not used.
    if os.getuid() == 0:
        os.chown(root.parent, 65534, 65534)
        with pytest.raises(ne.BackendError, match="owned by another user"):
            prepare_jobs_root(shared)


def test_a_home_of_our_own_with_loose_modes_is_tightened(home):
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    from notebook_elastic.jobfolder.folder import prepare_jobs_root

    root = prepare_jobs_root(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and stat.S_IMODE(root.stat().st_mode) == 0o700


def namespace() -> dict:
    return {"torch": torch, "elastic": runtime, "time": time}


LONG_TRAIN = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
for step in state.steps(100000):
    loss = model(torch.randn(2, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item())
    time.sleep(0.05)
"""


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["kill_worker", "scale"])
def test_a_script_replaced_while_running_is_never_run(home, restart):
    """Someone swaps script.py under a running job; at the next (re)start of workers (torchrun
    restarting them after a crash, or the supervisor starting a node) the job stops with the
    reason instead of running the new code."""
    job = ne.launch(LONG_TRAIN, nnodes="1:2", nproc_per_node=1, name="swapped", max_restarts=5, user_ns=namespace())
    deadline = time.monotonic() + 120
    while not (job.state.step is not None and job.state.step >= 3 and job.status == "running"):
        assert not job.finished and time.monotonic() < deadline, job.summary()
        time.sleep(0.05)
    folder = LocalBackend().folder("swapped")
    marker = home / "the-new-code-ran"
    folder.script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    if restart == "kill_worker":
        job.kill_worker()  # torchrun restarts the workers: from the changed script, unless refused
    else:
        job.scale(2)  # the supervisor starts a node: with the changed script, unless refused
    assert job.wait(120) == "failed", job.summary()
    assert "script.py changed after launch" in job.reason and "relaunch the cell" in job.reason
    changed = [e for e in job.events if e.kind == Kind.FILES_CHANGED]
    assert changed and changed[0].get("files") == [str(folder.script)]
    assert not marker.exists()
    deadline = time.monotonic() + 60
    while folder.supervisor_alive():  # it writes status.json once the job_finished event is out
        assert time.monotonic() < deadline, "the supervisor did not exit"
        time.sleep(0.05)
    assert (folder.status() or {}).get("status") == "failed"


def test_a_home_that_is_a_link_of_our_own_is_judged_by_its_target(home, tmp_path):
    from notebook_elastic.jobfolder.folder import prepare_jobs_root

    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    home.symlink_to(target)
    assert prepare_jobs_root(home) == home / "jobs" and (target / "jobs").is_dir()
    os.chmod(target, 0o777)
    with pytest.raises(ne.BackendError, match="writable by other users"):
        prepare_jobs_root(home)
    os.chmod(target, 0o700)
    if os.getuid() == 0:
        other = tmp_path / "planted"
        other.symlink_to(target)
        os.lchown(other, 65534, 65534)
        with pytest.raises(ne.BackendError, match="a link owned by another user"):
            prepare_jobs_root(other)


TOKEN_EVERY_STEP = """
import hashlib, os
state = elastic.State(model=torch.nn.Linear(2, 1))
digest = int(hashlib.sha256(os.environ["HF_TOKEN"].encode()).hexdigest()[:12], 16)
for step in state.steps(100000):
    state.commit()
    elastic.report(step=step, digest=digest)
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_resumed_job_gets_its_env_values_back_from_its_private_file(home):
    """resume() starts a new supervisor from the folder alone: the --env values come from the
    0600 secret.json, not from the kernel that launched the job."""
    expected = int(hashlib.sha256(SECRET.encode()).hexdigest()[:12], 16)
    job = ne.launch(TOKEN_EVERY_STEP, nnodes="1", name="again", env={"HF_TOKEN": SECRET}, user_ns=namespace())
    deadline = time.monotonic() + 120
    while not (job.state.step is not None and job.state.step >= 2):
        assert not job.finished and time.monotonic() < deadline, job.summary()
        time.sleep(0.05)
    assert job.stop() == "stopped"
    stopped_at = job.state.step
    job.resume()
    while not (job.state.step is not None and job.state.step > stopped_at + 2 and job.status == "running"):
        assert not job.finished and time.monotonic() < deadline + 120, job.summary()
        time.sleep(0.05)
    assert job.metrics.last("digest") == expected  # the resumed workers read the same value
    assert job.stop() == "stopped"
    assert LocalBackend().folder("again").spec()["env"] == ["HF_TOKEN"]

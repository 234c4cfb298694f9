"""The Slurm backend (#29, its first part) on a real Slurm cluster (tests/slurm_cluster.py:
Debian's munged, slurmctld and slurmd): each node of the job is an allocation running one
torchrun agent under srun; the options are checked against the cluster before anything is
submitted; scaling adds allocations, an allocation Slurm cancels is a departure (free), and the
job ends with no allocation left."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import torch
from slurm_cluster import CPUS, SlurmCluster, why_not
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.backends.slurm.options import minutes, parse_options
from notebook_elastic.contract.events import Kind
from notebook_elastic.errors import SpecError

TRAIN = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
batches = iter(state.batch_sampler(4096, 8, seed=0))
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    idx = next(batches)
    loss = ddp(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    elastic.report(step=step, loss=loss.item(), start=batches_start(state), gen=state.generation)
    state.commit()
    time.sleep(0.1)
"""


def user_ns(total: int) -> dict:
    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total, "batches_start": lambda s: 0}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = why_not()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def on_slurm(slurm, monkeypatch, home):
    for key, value in slurm.env.items():
        monkeypatch.setenv(key, value)  # the supervisor and its srun find the cluster through it
    yield slurm
    slurm.run("scancel", "--user", "root")


def test_slurm_times_and_bad_options_are_one_sentence():
    assert (minutes("90"), minutes("2:00:00"), minutes("1-12:00"), minutes("UNLIMITED")) == (90, 120, 2160, None)
    with pytest.raises(SpecError, match="is not a Slurm time limit"):
        parse_options(time="two hours")
    with pytest.raises(SpecError, match="is not an srun option"):
        parse_options(slurm_args=["mem=32G"])
    with pytest.raises(SpecError, match=r"partition only apply with backend='slurm'"):
        ne.launch("pass", partition="gpu", dry_run=True, user_ns={})


@pytest.mark.slow
def test_what_slurm_would_refuse_is_refused_before_anything_is_submitted(on_slurm, home):
    with pytest.raises(
        SpecError, match=r"--partition 'gpu' is not a partition of this cluster; choose one of: low, high, ctl"
    ):
        ne.launch(TRAIN, backend="slurm", partition="gpu", name="nope", user_ns=user_ns(10))
    with pytest.raises(SpecError, match=r"--time 2:00:00 is over partition 'low''s limit of 60 minutes"):
        ne.launch(TRAIN, backend="slurm", time="2:00:00", name="nope", user_ns=user_ns(10))
    assert not on_slurm.jobs()
    assert not (home / "jobs" / "nope").exists() and not list(home.glob("*/nope"))


STORY = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
sampler = state.batch_sampler(65536, 8, shuffle=True, seed=1)
batches = iter(sampler)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    idx = next(batches)
    loss = ddp(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    elastic.report(step=step, loss=loss.item(), start=sampler.last_start, gen=state.generation, all_ranks=True)
    state.commit()
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_the_slurm_story_scales_outlives_its_kernel_survives_preemption_and_scancel(on_slurm, home, tmp_path):
    """#29's stories on the real daemons, in real kernels: a 1:3 job scales 1 -> 3 -> 2 from
    the notebook; the kernel goes away and a new one re-attaches with the history; a job of
    the high partition preempts one node (Slurm's SIGTERM is a notice: rank 0 saves first), the
    job trains on at 1 while the node's new allocation waits (its reason told), and grows back
    to 2 when Slurm gives the node back; a node is scancelled (a departure it does not replace).
    The job succeeds with every step trained, each sample seen once, no restart charged, and
    no allocation left."""
    from notebook_kernel import NotebookKernel

    with NotebookKernel(tmp_path / "first", timeout_s=300) as nb:
        nb.run("%load_ext notebook_elastic\nimport time, torch\nTOTAL = 700")
        nb.run(
            "%%elastic_train --backend slurm --nnodes 1:3 --name story --time 30 --max-restarts 0 --supervisor-in ctl\n"
            + STORY
        )
        nb.run(
            'await story.until(lambda: story.world_size == 1 and (story.state.step or 0) >= 5, "one node", timeout=180)'
        )
        assert sorted(name for _, name, _ in on_slurm.jobs()) == ["ne-story-node-0", "ne-story-supervisor"]
        nb.run(
            'story.scale(3)\nawait story.until(lambda: story.world_size == 3 and story.status == "running", "3", timeout=180)'
        )
        running = sorted(name for _, name, state in on_slurm.jobs() if state == "RUNNING")
        assert running == ["ne-story-node-0", "ne-story-node-1", "ne-story-node-2", "ne-story-supervisor"], running
        nb.run(
            'story.scale(2)\nawait story.until(lambda: story.world_size == 2 and story.status == "running", "2", timeout=180)'
        )
    # The kernel is gone; the job is not. A new kernel attaches and sees it all.
    with NotebookKernel(tmp_path / "second", timeout_s=300) as nb:
        out = nb.run("%load_ext notebook_elastic\njob = %elastic_attach story slurm\nprint(job.summary())")
        assert "story" in out
        nb.run(
            'await job.until(lambda: any(e.kind == "job_submitted" for e in job.events) and job.world_size == 2, "replayed", timeout=60)'
        )
        # A higher-priority job needs 6 of the node's 8 CPUs (the supervisor and two nodes hold
        # one each): Slurm preempts one of our nodes (the supervisor's partition is never preempted).
        high = subprocess.Popen(
            [
                "srun",
                "--partition=high",
                "--ntasks=1",
                f"--cpus-per-task={CPUS - 2}",
                "--job-name=urgent",
                "sleep",
                "12",
            ],
            env={**os.environ, **on_slurm.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            nb.run(
                'await job.until(lambda: any(e.kind == "node_left" and e.get("reason") == "preempted by Slurm" for e in job.events), "the preemption", timeout=120)'
            )
            nb.run(
                'await job.until(lambda: any(e.kind == "pending" for e in job.events), "the new allocation waits", timeout=60)'
            )
            high.wait(timeout=120)
        finally:
            if high.poll() is None:
                high.kill()
        nb.run(
            'await job.until(lambda: job.world_size == 2 and job.status == "running" and sum(e.kind == "node_joined" for e in job.events) >= 4, "grown back", timeout=180)'
        )
        victim = sorted(
            jid for jid, name, state in on_slurm.jobs() if name.startswith("ne-story-node-") and state == "RUNNING"
        )[0]
        on_slurm.run("scancel", victim, check=True)
        out = nb.run(
            'await job.until(lambda: any(e.kind == "node_left" and e.get("reason") == "cancelled in Slurm" for e in job.events), "the scancel", timeout=120)\n'
            'print("outcome:", await job.ended(timeout=300))\n'
            "latest = {}\n"
            "for e in job.history():\n"
            "    v = e.data.get('values', {})\n"
            "    if e.kind == 'metric' and 'start' in v:\n"
            "        latest.setdefault(e.data['step'], {}).setdefault(v['gen'], []).append(v['start'])\n"
            "starts = sorted(s for by_gen in latest.values() for s in by_gen[max(by_gen)])\n"
            "print('steps:', len(latest), sorted(latest) == list(range(700)))\n"
            "print('exactly once:', starts == list(range(0, len(starts) * 8, 8)))\n"
            "print('restarts:', job.restarts)\n"
            "print('notices:', sum(e.kind == 'saved_on_notice' and bool(e.get('saved')) for e in job.events))\n"
            "print('sizes:', [e.get('world_size') for e in job.events if e.kind == 'worker_started' and e.get('rank') == 0])"
        )
    assert "outcome: succeeded" in out, out
    assert "steps: 700 True" in out and "exactly once: True" in out and "restarts: 0" in out, out
    assert "notices: 0" not in out, out  # rank 0 saved on Slurm's notice before the preempted node went
    sizes = eval(out.split("sizes:")[1].strip().splitlines()[0])
    assert (sizes[0], max(sizes), sizes[-1]) == (1, 3, 1), sizes
    supervised = json.loads((home / "jobs" / "story" / "supervisor.json").read_text())
    assert supervised["slurm_job"], supervised  # the supervisor ran in an allocation of its own
    [listed] = [info for info in ne.jobs("slurm") if info.name == "story"]
    assert listed.backend == "slurm" and listed.status == "succeeded"
    deadline = time.monotonic() + 30
    while [j for j in on_slurm.jobs() if j[1].startswith("ne-")] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [j for j in on_slurm.jobs() if j[1].startswith("ne-")], on_slurm.jobs()  # no allocation outlives the job


@pytest.mark.slow
def test_an_allocation_that_waits_says_why(on_slurm):
    job = ne.launch(
        TRAIN,
        backend="slurm",
        name="waits",
        slurm_args=["--begin=now+600"],  # Slurm holds it: squeue's reason is BeginTime
        user_ns=user_ns(10),
    )
    try:
        wait_for(
            lambda: any(e.kind == Kind.PENDING and e.node == "node-0" for e in job.events), "the wait told", job=job
        )
        [pending] = [e for e in job.events if e.kind == Kind.PENDING]
        assert pending.get("reason") == "BeginTime", pending.data
        assert "node-0 pending: BeginTime" in pending.describe()
        # Said where the job's wait shows: summary() (the dashboard's header, the CLI) and the
        # listing the jobs panel reads (GET /jobs).
        wait_for(lambda: "waiting: node-0 pending: BeginTime" in job.summary(), "the wait in the summary", job=job)
        wait_for(
            lambda: any(
                "node-0 pending: BeginTime" in (info.summary.get("waiting") or "")
                for info in ne.jobs("slurm")
                if info.name == "waits"
            ),
            "the wait in the listing",
            job=job,
        )
    finally:
        job.stop()
    deadline = time.monotonic() + 30
    while on_slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not on_slurm.jobs(), on_slurm.jobs()  # stopping cancels the waiting allocation too


@pytest.mark.slow
def test_drills_and_resume_on_slurm(on_slurm, home):
    """The dashboard's drills on Slurm nodes, and resume: a preempt drill with notice saves
    first; the kill-a-worker drill SIGKILLs a worker through its node's keeper; a lost node leaves no process or allocation behind, and gives no notice; the
    supervisor told its allocation's time is nearly up stops the job with a save first; resume
    starts a new supervisor allocation that goes on from that save; stopping leaves nothing."""
    job = ne.launch(
        TRAIN, backend="slurm", nnodes="1:2", nodes=2, supervisor_in="ctl", name="drills", user_ns=user_ns(100_000)
    )
    try:
        wait_for(lambda: job.world_size == 2 and (job.state.step or 0) >= 5, "two nodes training", job=job)
        job.preempt_node("node-1", grace_s=10)
        wait_for(
            lambda: any(e.kind == Kind.NODE_LEFT and e.node == "node-1" for e in job.events), "node-1 gone", job=job
        )
        assert any(e.kind == Kind.SAVED_ON_NOTICE and e.get("saved") for e in job.events), "no save on notice"
        job.scale(2)
        wait_for(lambda: job.world_size == 2 and job.status == "running", "two nodes again", job=job)
        # The kill-a-worker drill reaches a worker through its node's keeper (it may be on
        # another host than the supervisor): SIGKILLed, one restart, training again.
        before = len(job.events)
        killed = job.kill_worker()
        wait_for(
            lambda: any(
                e.kind == Kind.RESTART and e.get("reason") == "worker_failed" and e.node == killed["node"]
                for e in job.events[before:]
            ),
            "the killed worker's restart",
            job=job,
        )
        wait_for(
            lambda: job.world_size == 2 and job.status == "running" and job.restarts == 1, "training again", job=job
        )
        job.lose_node("node-2")
        wait_for(
            lambda: any(e.kind == Kind.NODE_LEFT and e.node == "node-2" for e in job.events), "node-2 lost", job=job
        )
        assert not any(e.kind == Kind.NOTICE and e.node == "node-2" for e in job.events)  # lost: no notice
        deadline = time.monotonic() + 20  # Slurm completes it: its processes were SIGKILLed in the step
        while [j for j in on_slurm.jobs() if j[1] == "ne-drills-node-2"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [j for j in on_slurm.jobs() if j[1] == "ne-drills-node-2"], on_slurm.jobs()
        wait_for(lambda: job.world_size == 1 and job.status == "running", "one node training", job=job)
        [supervisor] = [jid for jid, name, _ in on_slurm.jobs() if name == "ne-drills-supervisor"]
        # Its allocation's time is nearly up: sbatch --signal=B:TERM@60 tells the supervisor alone.
        on_slurm.run("scancel", "--batch", "--signal=TERM", supervisor, check=True)
        assert job.wait(timeout=120) == "stopped", job.summary()
        newest = max(home.glob("jobs/drills/checkpoints/ckpt-*.pt"), key=lambda p: int(p.stem.rsplit("-s", 1)[1]))
        saved = int(newest.stem.rsplit("-s", 1)[1])
        assert any(e.kind == Kind.SAVED_ON_NOTICE and e.get("step") == saved for e in job.events), saved
        before = len(job.events)
        job.resume()
        wait_for(lambda: any(e.kind == Kind.RESUMED for e in job.events[before:]), "the resumed run", job=job)
        resumed = next(e for e in job.events[before:] if e.kind == Kind.RESUMED)
        assert resumed.get("step") == saved, (resumed.data, saved)  # from the save on Slurm's notice
        assert sum(1 for _, name, _ in on_slurm.jobs() if name == "ne-drills-supervisor") == 1
    finally:
        job.stop()
    deadline = time.monotonic() + 30
    while on_slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not on_slurm.jobs(), on_slurm.jobs()

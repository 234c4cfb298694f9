"""The Slurm backend (#29, its first part) on a real Slurm cluster (tests/slurm_cluster.py:
Debian's munged, slurmctld and slurmd): each node of the job is an allocation running one
torchrun agent under srun; the options are checked against the cluster before anything is
submitted; scaling adds allocations, an allocation Slurm cancels is a departure (free), and the
job ends with no allocation left."""

from __future__ import annotations

import time

import pytest
import torch
from slurm_cluster import SlurmCluster, why_not
from test_kubernetes_backend import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.backends.slurm.options import minutes, parse_options
from notebook_elastic.errors import SpecError
from notebook_elastic.events import Kind

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
        SpecError, match=r"--partition 'gpu' is not a partition of this cluster; choose one of: low, high"
    ):
        ne.launch(TRAIN, backend="slurm", partition="gpu", name="nope", user_ns=user_ns(10))
    with pytest.raises(SpecError, match=r"--time 2:00:00 is over partition 'low''s limit of 60 minutes"):
        ne.launch(TRAIN, backend="slurm", time="2:00:00", name="nope", user_ns=user_ns(10))
    assert not on_slurm.jobs()
    assert not (home / "jobs" / "nope").exists() and not list(home.glob("*/nope"))


@pytest.mark.slow
def test_a_job_on_slurm_scales_loses_a_cancelled_allocation_for_free_and_succeeds(on_slurm):
    """Each node an allocation (squeue names them); 1 -> 2 by scale(); one allocation scancelled
    mid-run is a departure: the job regroups at 1, spends no restart, and ends with every step
    trained and no allocation left."""
    job = ne.launch(TRAIN, backend="slurm", nnodes="1:2", name="sl", time="30", max_restarts=0, user_ns=user_ns(250))
    try:
        wait_for(job, lambda: job.world_size == 1 and (job.state.step or 0) >= 5, "one node training")
        assert [name for _, name, _ in on_slurm.jobs()] == ["ne-sl-node-0"]
        job.scale(2)
        wait_for(job, lambda: job.world_size == 2 and job.status == "running", "two allocations training")
        names = sorted(name for _, name, state in on_slurm.jobs() if state == "RUNNING")
        assert names == ["ne-sl-node-0", "ne-sl-node-1"], on_slurm.jobs()
        [victim] = [jid for jid, name, _ in on_slurm.jobs() if name == "ne-sl-node-1"]
        on_slurm.run("scancel", victim, check=True)
        wait_for(job, lambda: any(e.kind == Kind.NODE_LEFT and e.node == "node-1" for e in job.events), "the departure")
        assert job.wait(timeout=300) == "succeeded", job.summary()
        assert job.restarts == 0  # a cancelled allocation is a departure, not a failure
        steps = sorted({e.get("step") for e in job.events if e.kind == Kind.METRIC} | set(job.metrics["loss"].steps))
        assert steps[-1] == 249
        [listed] = [info for info in ne.jobs("slurm") if info.name == "sl"]
        assert listed.backend == "slurm" and listed.status == "succeeded"
        deadline = time.monotonic() + 30
        while on_slurm.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not on_slurm.jobs(), on_slurm.jobs()  # no allocation outlives the job
    finally:
        job.stop()


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
        wait_for(job, lambda: any(e.kind == Kind.PENDING and e.node == "node-0" for e in job.events), "the wait told")
        [pending] = [e for e in job.events if e.kind == Kind.PENDING]
        assert pending.get("reason") == "BeginTime", pending.data
        assert "node-0 pending: BeginTime" in pending.describe()
    finally:
        job.stop()
    deadline = time.monotonic() + 30
    while on_slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not on_slurm.jobs(), on_slurm.jobs()  # stopping cancels the waiting allocation too

"""Sharded models through State: a real FSDP job (FSDP2 ``fully_shard``, and FSDP1) on the local backend (real torchrun, gloo on
CPU) is scaled 2 -> 1 -> 2 ranks; its checkpoints reshard on each load and its loss curve is
the unscaled run's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_local_backend import committed_reports, world_sizes
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime
from notebook_elastic.contract.event_types import Kind

pytestmark = pytest.mark.slow

fsdp = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("this torch has no FSDP2 (fully_shard)", allow_module_level=True)

# A fixed global batch (GLOBAL samples per step whatever the world size) and the mean loss over
# all ranks: the curve does not depend on how many ranks computed it.
FSDP_TRAIN = """
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
if FSDP == 2:
    mesh = init_device_mesh("cpu", (elastic.world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
else:
    model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
batches = iter(state.batch_sampler(len(X), GLOBAL // elastic.world_size(), seed=1))
for step in state.steps(TOTAL):
    while step in HOLD and not os.path.exists(HOLD[step]):  # the test opens it: states, not seconds
        time.sleep(0.05)
    idx = next(batches)
    loss = (model(X[idx]) - Y[idx]).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    mean = loss.detach().clone()
    torch.distributed.all_reduce(mean)
    elastic.report(step=step, loss=mean.item() / elastic.world_size(), ws=elastic.world_size(), gen=state.generation)
    time.sleep(STEP_S)
"""


def namespace(total: int, fsdp: int, hold: dict[int, Path] | None = None) -> dict:
    """What the cell's names are. ``hold``: the step each gate holds every rank before, until
    its file exists (a job that cannot run ahead of the test's scaling, however loaded the machine)."""
    import os
    import time

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 8, generator=g)
    y = (x * torch.linspace(-1, 1, 8)).sum(1, keepdim=True).sin()
    return {
        "torch": torch,
        "elastic": runtime,
        "time": time,
        "X": x,
        "Y": y,
        "TOTAL": total,
        "GLOBAL": 8,
        "STEP_S": 0.05,
        "FSDP": fsdp,
        "HOLD": {step: str(path) for step, path in (hold or {}).items()},
        "os": os,
    }


def losses(job) -> dict[int, float]:
    reports = committed_reports(job)
    return {step: rs[0]["values"]["loss"] for step, rs in reports.items()}


def at_step(job, step: int):
    return lambda: job.state.step is not None and job.state.step >= step and job.status == "running"


@pytest.mark.parametrize("fsdp", [2, 1], ids=["fsdp2-fully_shard", "fsdp1"])
def test_an_fsdp_job_scaled_2_1_2_reshards_and_keeps_the_unscaled_loss_curve(home, tmp_path, fsdp):
    total = 60
    plain = ne.launch(FSDP_TRAIN, nnodes="2", name="fsdp-plain", max_restarts=0, user_ns=namespace(total, fsdp))
    assert plain.wait(300) == "succeeded", plain.summary()
    expected = losses(plain)
    assert sorted(expected) == list(range(total))

    # Gates hold the job before steps 20 and 40 until the test has seen the state it waits for,
    # so it scales 2 -> 1 -> 2 where planned however fast or slow the machine runs.
    gates = {20: tmp_path / "after-one-rank", 40: tmp_path / "after-two-ranks"}
    job = ne.launch(
        FSDP_TRAIN, nnodes="1:2", nodes=2, name="fsdp-scaled", max_restarts=0, user_ns=namespace(total, fsdp, gates)
    )
    wait_for(
        lambda: job.world_size == 2 and at_step(job, 19)(), "step 19 on two ranks", job=job, give_up_when_finished=True
    )
    job.scale(1)
    wait_for(lambda: job.world_size == 1 and job.status == "running", "one rank", job=job, give_up_when_finished=True)
    gates[20].touch()
    wait_for(
        lambda: job.world_size == 1 and at_step(job, 39)(),
        "steps 20-39 on one rank",
        job=job,
        give_up_when_finished=True,
    )
    job.scale(2)
    wait_for(
        lambda: job.world_size == 2 and job.status == "running", "two ranks again", job=job, give_up_when_finished=True
    )
    gates[40].touch()
    assert job.wait(300) == "succeeded", job.summary()

    sizes = world_sizes(job)
    assert (sizes[0], min(sizes), sizes[-1]) == (2, 1, 2), sizes
    assert job.restarts == 0  # membership changes, never charged (max_restarts=0)
    # Each load resharded a checkpoint written by another world size: 2 -> 1, then 1 -> 2.
    resumed = [(e.get("from_world_size"), e.get("world_size")) for e in job.events if e.kind == Kind.RESUMED]
    assert (2, 1) in resumed and (1, 2) in resumed, resumed
    assert all(e.get("path", "").endswith(".dcp") for e in job.events if e.kind == Kind.RESUMED)
    # #41 item 6: a sharded model cannot stay in place (its shards are resharded from disk); each
    # change restarted its workers, and the events say why in one sentence.
    refused = [e.describe() for e in job.events if e.kind == Kind.IN_PLACE_REFUSED]
    assert refused and all("the model is sharded (FSDP/DTensor)" in r for r in refused), refused
    got = losses(job)
    assert sorted(got) == list(range(total))  # every step, none skipped
    for step in range(total):
        assert math.isclose(got[step], expected[step], rel_tol=1e-4, abs_tol=1e-6), (step, got[step], expected[step])
    # ... and it trained: the curve is not flat.
    assert expected[total - 1] < expected[0] / 2, (expected[0], expected[total - 1])


def test_a_sharded_state_that_cannot_be_saved_stops_every_node_without_a_retry(home):
    """Only rank 0 checks what State keeps before a sharded save; every rank must stop the way it
    does (StateNotSaveable, exit status EXIT_FATAL), or the other nodes' agents spend restarts
    on a failure that repeats at every one."""
    cell = FSDP_TRAIN.replace(
        "    state.commit()\n",
        "    if step == 3:\n        state.extra['odd'] = type('Odd', (), {})()  # a class made in the cell\n    state.commit()\n",
    )
    job = ne.launch(
        cell, nnodes="2", name="fsdp-odd", max_restarts=3, checkpoint_every=1, user_ns=namespace(40, fsdp=2)
    )
    assert job.wait(240) == "failed", job.summary()
    assert "State cannot save 'odd'" in job.state.reason, job.state.reason
    failed = {e.get("error") for e in job.events if e.kind == Kind.WORKER_FAILED}
    assert failed == {"StateNotSaveable"}, [e.describe() for e in job.events if e.kind == Kind.WORKER_FAILED]
    assert job.restarts == 0 and not [e for e in job.events if e.kind == Kind.RESTART], job.summary()

"""On real GPUs: nccl with one rank per GPU, a killed worker and a scale-up on GPU, the refusal
of a range that needs more GPUs than are visible, the eviction of a node that fails while
joining, and the GPU figures beside the loss. Run wherever CUDA is present; skipped elsewhere
(the CPU suite holds the same claims with gloo and a fake ``nvidia-smi``:
``test_local_backend.py``).

Written for any GPU count: on one GPU (an H100 box) every job runs on one node of one rank,
a scale-up to a second node is refused (there is no second GPU to give it), and the eviction
test, which needs a joiner with a GPU of its own, is skipped with that reason.
"""

from __future__ import annotations

import pytest
import torch
from test_local_backend import at_step, committed_reports, namespace, placements, world_sizes
from waiting import wait_for

import notebook_elastic as ne
from notebook_elastic.backends.local import LocalBackend
from notebook_elastic.contract.event_types import Kind
from notebook_elastic.jobfolder.place import visible_gpus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU and a CUDA build of torch)"),
]

GPU_CELL = """
import os
import torch.distributed as dist
dev = elastic.device()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
batches = iter(state.batch_sampler(1_000_000, BATCH, shuffle=False))
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
print(f"placed rank={elastic.rank()} gen={state.generation} cuda={os.environ.get('CUDA_VISIBLE_DEVICES')} "
      f"backend={dist.get_backend()} dev={dev}", flush=True)
for step in state.steps(TOTAL):
    idx = next(batches)
    x = torch.randn(BATCH, 256, device=dev)
    loss = ddp(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), start=idx[0], ws=elastic.world_size(), gen=state.generation, all_ranks=True)
    time.sleep(STEP_S)
"""


def gpus() -> int:
    return len(visible_gpus())


def placed(job) -> list[dict[str, str]]:
    """Every 'placed' line of the job's workers, as fields (rank, gen, cuda, backend, dev)."""
    logs = LocalBackend().folder(job.name).logs
    out = []
    for path in sorted(logs.glob("node-*.log")):
        for line in path.read_text().splitlines():
            if "placed rank=" in line:
                out.append(dict(part.split("=", 1) for part in line.split("placed ", 1)[1].split()))
    return out


def test_nccl_one_rank_per_gpu_through_a_killed_worker_and_a_scale_up(home):
    n = gpus()
    nodes_max = min(n, 2)
    job = ne.launch(
        GPU_CELL,
        nnodes=f"1:{nodes_max}",
        nproc_per_node=1,
        name="gpu-elastic",
        max_restarts=3,
        user_ns=namespace(total=100_000, step_s=0.02),
    )
    wait_for(at_step(job, 5), "the first steps on GPU", timeout=300, job=job, give_up_when_finished=True)
    first_step_s = job.state.first_step_at - job.state.started_at
    print(f"first step on GPU {first_step_s:.1f} s after submission")
    killed_at = job.state.step
    job.kill_worker(rank=0)
    wait_for(
        lambda: job.restarts >= 1 and at_step(job, killed_at + 5)(),
        "training again after the kill",
        job=job,
        give_up_when_finished=True,
    )
    if nodes_max >= 2:
        scaled_at = job.state.step
        job.scale(2)
        wait_for(
            lambda: job.world_size == 2 and at_step(job, scaled_at + 5)(),
            "two nodes on two GPUs",
            job=job,
            give_up_when_finished=True,
        )
    else:  # one GPU: a second node has no GPU of its own, so the range never allowed it
        with pytest.raises(ne.SpecError, match=r"cannot scale to 2 nodes: the job.s range is 1:1"):
            job.scale(2)
    # The GPU figures reached the job: rank 0's peak memory, and utilisation where NVML is.
    wait_for(lambda: bool(job.state.gpu_ranks), "the GPU figures", timeout=60, job=job, give_up_when_finished=True)
    rank0 = job.state.gpu_ranks[0]
    assert rank0["mem_peak_bytes"] > 0 and rank0["mem_peak_bytes"] <= rank0["mem_total_bytes"]
    try:
        import pynvml  # noqa: F401

        assert 0 <= rank0["util_percent"] <= 100
    except ImportError:
        assert "util_percent" not in rank0
    job.stop()

    lines = placed(job)
    assert lines and {line["backend"] for line in lines} == {"nccl"}
    by_gen: dict[str, set[str]] = {}
    for line in lines:  # within one worker group, no two ranks share a device
        assert line["cuda"] not in by_gen.setdefault(line["gen"], set()), lines
        by_gen[line["gen"]].add(line["cuda"])
    assert all(line["dev"] == "cuda:0" for line in lines)  # one GPU per rank: each sees only its own
    steps = sorted(committed_reports(job))
    assert steps == list(range(len(steps)))  # stopped mid-run: every step up to there, once


def test_a_range_needing_more_gpus_than_are_visible_is_refused(home):
    n = gpus()
    with pytest.raises(ne.SpecError, match=rf"need {n + 1} GPUs, one per rank; {n} (is|are) visible"):
        ne.launch(GPU_CELL, nnodes=f"1:{n + 1}", name="too-many", user_ns=namespace())
    assert not (home / "jobs" / "too-many").exists()
    job = ne.launch(GPU_CELL, nnodes="1", name="fits", user_ns=namespace(total=100_000, step_s=0.02))
    wait_for(at_step(job, 3), "training on GPU", timeout=300, job=job, give_up_when_finished=True)
    with pytest.raises(ne.BackendError, match=rf"need {n + 1} GPUs"):
        job.set_range(1, n + 1)
    assert job.status == "running" and job.world_size == 1  # refused before anything changed
    job.stop()
    assert placements(job)


def test_a_node_whose_nccl_fails_while_joining_is_evicted(home):
    if gpus() < 2:
        pytest.skip("the joiner needs a GPU of its own: 2 GPUs at least")
    # node-1 cannot bootstrap NCCL (no such socket interface): it fails while joining.
    broken = {"node_env": {"node-1": {"NCCL_SOCKET_IFNAME": "nosuch0"}}}
    job = ne.launch(
        GPU_CELL,
        nnodes="1:2",
        name="gpu-bad-joiner",
        max_restarts=3,
        backend_options=broken,
        user_ns=namespace(total=300, step_s=0.02),
    )
    wait_for(at_step(job, 5), "one node training", timeout=300, job=job, give_up_when_finished=True)
    job.scale(2)
    wait_for(
        lambda: any(e.kind == Kind.NODE_EVICTED for e in job.events),
        "node-1 evicted",
        timeout=300,
        job=job,
        give_up_when_finished=True,
    )
    assert job.wait(600) == "succeeded", job.summary()
    evicted = [e for e in job.events if e.kind == Kind.NODE_EVICTED]
    assert [e.node for e in evicted] == ["node-1"]
    assert job.restarts == 1
    assert sorted(committed_reports(job)) == list(range(300))
    assert world_sizes(job)[-1] == 1


def test_in_place_on_nccl_the_survivor_keeps_its_process_and_a_joiner_takes_the_live_values(home):
    """#41 item 4 on NCCL: a lost node's peers abort their communicator (a collective waiting on
    the lost peer returns), form a new one at the new size and go on from the step they were
    at, in the same processes; a node that joins takes the live values over NCCL. Needs a GPU
    for each of two nodes."""
    if gpus() < 2:
        pytest.skip(f"needs two GPUs (one per node); {gpus()} visible")
    job = ne.launch(
        GPU_CELL,
        nnodes="1:2",
        nodes=2,
        nproc_per_node=1,
        name="nccl-in-place",
        checkpoint_every=10**9,
        user_ns=namespace(total=100_000, step_s=0.02),
    )
    try:
        wait_for(lambda: job.world_size == 2 and at_step(job, 10)(), "two GPU nodes training", job=job)
        kept = {e.get("pid") for e in job.events if e.kind == Kind.WORKER_STARTED and e.node == "node-0"}
        job.lose_node("node-1")
        wait_for(lambda: any(e.kind == Kind.IN_PLACE for e in job.events), "in place after the loss", job=job)
        job.scale(2)
        wait_for(
            lambda: sum(e.kind == Kind.IN_PLACE for e in job.events) >= 2 and job.world_size == 2,
            "the joiner in place",
            timeout=300,
            job=job,
        )
        changes = [e.data for e in job.events if e.kind == Kind.IN_PLACE]
        assert changes[0]["redone"] <= 1 and changes[-1]["joined"] == 1 and changes[-1]["source"] >= 0, changes
        assert {e.get("pid") for e in job.events if e.kind == Kind.WORKER_STARTED and e.node == "node-0"} == kept
        assert all(p["backend"] == "nccl" for p in placed(job)), placed(job)
        assert not [e for e in job.events if e.kind == Kind.RESUMED]
    finally:
        job.stop()

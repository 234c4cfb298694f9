"""The worker runtime: report(), State (restore, atomic commits, fencing), the data cursor."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from contextlib import redirect_stdout

import pytest
import torch

from notebook_elastic.contract import protocol
from notebook_elastic.runtime import StaleGenerationError, State, report
from notebook_elastic.runtime.state import list_checkpoints


def events_of(text: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in text.splitlines() if line.startswith(protocol.EVENT_PREFIX)]


def test_report_writes_one_prefixed_json_line_per_call():
    out = io.StringIO()
    with redirect_stdout(out):
        report(step=3, loss=torch.tensor(0.25), acc=1, flag=True)
        report(lr=0.1)
    events = events_of(out.getvalue())
    assert [e["kind"] for e in events] == ["metric", "metric"]
    assert events[0]["step"] == 3 and events[0]["values"] == {"loss": 0.25, "acc": 1, "flag": 1}
    assert events[1]["values"] == {"lr": 0.1} and isinstance(events[1]["step"], int)
    with pytest.raises(TypeError, match=r"report\(\) takes numbers: name='x' is a str"):
        report(step=1, name="x")


def make_model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def train(state, model, opt, upto):
    for step in state.steps(upto):
        loss = model(torch.ones(1, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state.commit()
        if step == upto - 1:
            break


def test_state_restores_model_optimizer_step_and_extras(ckpt):
    out = io.StringIO()
    with redirect_stdout(out):
        model = make_model()
        opt = torch.optim.Adam(model.parameters())
        state = State(model=model, optimizer=opt, epoch=7)
        assert state.step == 0 and state.resumed_from is None
        train(state, model, opt, 5)
        state.extra["epoch"] = 8
        state.commit(step=5)
        state.flush()
        weights = model.weight.detach().clone()

        model2 = make_model()
        opt2 = torch.optim.Adam(model2.parameters())
        state2 = State(model=model2, optimizer=opt2, epoch=0)
    assert state2.step == 6 and state2.extra["epoch"] == 8
    assert torch.equal(model2.weight, weights)
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert len(list_checkpoints(ckpt)) == 3  # keep=3
    resumed = [e for e in events_of(out.getvalue()) if e["kind"] == "resumed"]
    assert resumed and resumed[0]["step"] == 6
    assert list(State(model=make_model()).steps(8)) == [6, 7]


def test_a_state_says_when_its_training_last_moved_the_step_in_flights_start_or_now(ckpt):
    """What a change in place is told from (``State.stood_since``): at a step boundary (the step
    committed), now; with a step in flight (a collective in it broke, or hung), that step's
    start, however long ago: a survivor that stood 70 s in the old group's last collective was
    told "training again after 0.02 s", the time it went without a group (an adversary's pass)."""
    with redirect_stdout(io.StringIO()):
        state = State(model=make_model(), async_commit=False)
        steps = state.steps(10)
        first = next(steps)
        began = time.monotonic()
        time.sleep(0.05)
        later = time.monotonic()
        assert state.stood_since(later) <= began < later  # step 0 in flight: since its start
        state.commit(step=first)
        assert state.stood_since(later) == later  # committed: a boundary, training stood no time
        next(steps)
        assert began < state.stood_since(time.monotonic() + 60) < began + 30  # step 1 in flight


def test_a_torn_newest_checkpoint_falls_back_to_the_previous(ckpt):
    with redirect_stdout(io.StringIO()):
        model = make_model()
        state = State(model=model, async_commit=False)
        state.commit(step=0)
        state.commit(step=1)
    newest = list_checkpoints(ckpt)[-1][2]
    newest.write_bytes(newest.read_bytes()[:100])  # as if the disk lost the end of it
    out = io.StringIO()
    with redirect_stdout(out):
        again = State(model=make_model())
    assert again.step == 1
    assert any(e["kind"] == "checkpoint_unreadable" for e in events_of(out.getvalue()))


def test_an_interrupted_write_leaves_the_previous_checkpoint_loadable(ckpt, tmp_path):
    """SIGKILL a process in the middle of writing a checkpoint: the folder still restores.

    The writer's torch.save writes the first half of the checkpoint, says so and blocks, so
    the kill lands mid-write, before the rename, every time (polling the folder for a temp
    file and then killing could land after the rename)."""
    script = tmp_path / "writer.py"
    script.write_text(
        textwrap.dedent(
            """
            import io, os, sys, time
            import torch
            from notebook_elastic.runtime import State
            real_save = torch.save
            def torn_save(obj, f, **kwargs):
                if obj["step"] < 5:  # the checkpoint of commit(step=4) says "next: 5"
                    return real_save(obj, f, **kwargs)
                buffer = io.BytesIO()
                real_save(obj, buffer, **kwargs)
                f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                f.flush()
                os.fsync(f.fileno())
                sys.stdout.write("mid-write\\n")
                sys.stdout.flush()
                time.sleep(600)
            torch.save = torn_save
            model = torch.nn.Linear(200, 400)
            state = State(model=model, async_commit=False, keep=2)
            for step in range(100):
                with torch.no_grad():
                    model.weight.fill_(step)
                state.commit(step=step)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ), text=True
    )
    line = ""
    try:
        for line in proc.stdout:  # until the writer is inside commit(step=4)'s write (or exits)
            if line == "mid-write\n":
                break
    finally:
        proc.kill()
        proc.wait()
    assert line == "mid-write\n", proc.stderr.read()[-2000:]
    assert [n for n in os.listdir(ckpt) if ".tmp-" in n]  # the torn write is there...
    assert [s for _, s, _ in list_checkpoints(ckpt)] == [3, 4]
    with redirect_stdout(io.StringIO()):
        model = torch.nn.Linear(200, 400)
        state = State(model=model)  # ...and ignored
    # commit(step=4) was torn: step 3's checkpoint is restored, and step 4 runs again.
    assert state.step == 4 and float(model.weight.detach()[0, 0]) == 3.0


def test_fencing_a_stale_group_cannot_write_over_a_newer_one(ckpt, monkeypatch):
    out = io.StringIO()
    with redirect_stdout(out):
        monkeypatch.setenv(protocol.ENV_ROUND, "5")
        old = State(model=make_model(), async_commit=False)
        old.commit(step=10)
        monkeypatch.setenv(protocol.ENV_ROUND, "6")  # a newer group forms (a split brain's other half)
        new = State(model=make_model(), async_commit=False)
        assert new.step == 11 and new.generation == 6
        with pytest.raises(StaleGenerationError, match="generation 5 was superseded by generation 6"):
            old.commit(step=11)  # the stale group keeps training...
        with pytest.raises(StaleGenerationError):
            old.commit(step=12)  # ...and is refused every time
        new.commit(step=11)
    files = [(g, s) for g, s, _ in list_checkpoints(ckpt)]
    assert files == [(5, 11), (6, 12)]
    assert [e["kind"] for e in events_of(out.getvalue())].count("fenced") == 1
    monkeypatch.setenv(protocol.ENV_ROUND, "7")
    with redirect_stdout(io.StringIO()):
        assert State(model=make_model()).step == 12


def test_fencing_catches_a_newer_group_during_a_background_write(ckpt, monkeypatch):
    """The newer group appears while the stale group's background write is under way: the
    last look before the rename refuses it, and the next commit raises."""
    import threading

    real_save = torch.save
    newer_claimed = threading.Event()

    def slow_save(obj, f, **kwargs):
        newer_claimed.wait(10)  # hold the write until the newer group has announced itself
        real_save(obj, f, **kwargs)

    out = io.StringIO()
    with redirect_stdout(out):
        monkeypatch.setenv(protocol.ENV_ROUND, "1")
        old = State(model=make_model(), async_commit=True)
        monkeypatch.setattr(torch, "save", slow_save)
        old.commit(step=3)  # passes the first check, then waits inside the writer thread
        monkeypatch.setenv(protocol.ENV_ROUND, "2")
        State(model=make_model())  # claims generation 2 on disk
        newer_claimed.set()
        with pytest.raises(StaleGenerationError):
            old.flush()
    assert list_checkpoints(ckpt) == []  # the stale write never landed
    assert not [n for n in os.listdir(ckpt) if ".tmp-" in n]
    assert [e["kind"] for e in events_of(out.getvalue())].count("fenced") == 1


def test_generations_are_claimed_on_disk_under_plain_torchrun(ckpt):
    with redirect_stdout(io.StringIO()):
        first = State(model=make_model())
        second = State(model=make_model())
    assert (first.generation, second.generation) == (0, 1)
    with redirect_stdout(io.StringIO()), pytest.raises(StaleGenerationError):
        first.commit(step=0)


def test_rendezvous_epochs_order_generations(monkeypatch, ckpt):
    monkeypatch.setenv(protocol.ENV_ROUND, "9")
    monkeypatch.setenv(protocol.ENV_RDZV_EPOCH, "0")
    with redirect_stdout(io.StringIO()):
        a = State(model=make_model())
        monkeypatch.setenv(protocol.ENV_ROUND, "0")
        monkeypatch.setenv(protocol.ENV_RDZV_EPOCH, "1")  # agents restarted with a new range
        b = State(model=make_model())
    assert b.generation > a.generation


def rank_env(monkeypatch, rank: int, world: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_RANK", str(rank))


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_data_cursor_survives_rescales_without_repeats_or_gaps(ckpt, monkeypatch, shuffle):
    """World sizes 2 -> 4 -> 1 -> 3 with restarts between: every sample index exactly once."""
    n, batch, seen = 1000, 5, []
    total = 0
    with redirect_stdout(io.StringIO()):
        for world, steps in ((2, 7), (4, 5), (1, 9), (3, 6)):
            states, iters = [], []
            for rank in range(world):
                rank_env(monkeypatch, rank, world)
                state = State(model=make_model(), async_commit=False)
                states.append(state)
                iters.append(iter(state.batch_sampler(n, batch, shuffle=shuffle, seed=3)))
            start = states[0].step
            for step in range(start, start + steps):
                for rank in range(world):
                    seen.extend(next(iters[rank]))
                for state in reversed(states):  # rank 0 last, like any rank
                    state.commit(step=step)
            total += steps * batch * world
            # A crashed, uncommitted step: drawn but never committed, so it is redone.
            for rank in range(world):
                next(iters[rank])
    assert len(seen) == total == 7 * 10 + 5 * 20 + 9 * 5 + 6 * 15
    assert len(set(seen)) == len(seen)
    if not shuffle:
        assert sorted(seen) == list(range(total))


def test_the_data_cursor_works_with_a_prefetching_dataloader(ckpt):
    from torch.utils.data import DataLoader

    with redirect_stdout(io.StringIO()):
        state = State(model=make_model(), async_commit=False)
        loader = DataLoader(
            list(range(100)), batch_sampler=state.batch_sampler(100, 4, shuffle=False), num_workers=2, prefetch_factor=4
        )
        got = []
        for _step, batch in zip(state.steps(5), loader):
            got.append(batch.tolist())
            state.commit()
        assert state.samples_seen == 20
        resumed = State(model=make_model())
        loader = DataLoader(list(range(100)), batch_sampler=resumed.batch_sampler(100, 4, shuffle=False))
        assert next(iter(loader)).tolist() == [20, 21, 22, 23]
    assert got[-1] == [16, 17, 18, 19]


USER_SETUP_LIB = """
from torch.distributed import init_process_group


def ddp_setup(backend="gloo"):
    init_process_group(backend=backend)
"""

USER_INIT_SCRIPT = """
import notebook_elastic.runtime as _elastic
import sys
import torch
import torch.distributed as dist
from torch.distributed import destroy_process_group
import setup_lib


def main():
    setup_lib.ddp_setup(sys.argv[1])  # a call the packager cannot see: the runtime set the group up
    dist.init_process_group("gloo")  # and a second one, attribute style
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} sum {t.item():.0f}")
    destroy_process_group()  # the user's own teardown; run() must not trip over it


if __name__ == "__main__":
    _elastic.run(main)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_the_codes_own_init_process_group_uses_the_group_the_runtime_made(tmp_path, backend):
    (tmp_path / "setup_lib.py").write_text(USER_SETUP_LIB)
    (tmp_path / "train.py").write_text(USER_INIT_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py", backend],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=180,
    )
    if backend == "gloo":
        assert done.returncode == 0, done.stderr[-3000:]
        assert sorted(line for line in done.stdout.splitlines() if line.startswith("rank")) == [
            "rank 0 sum 2",
            "rank 1 sum 2",
        ]
        assert "the training code's init_process_group() call uses it" in done.stderr
    else:  # another backend than the group's: one sentence naming the fix, not a hang or a torch internal
        assert done.returncode != 0
        assert "notebook-elastic already set up this worker's process group with 'gloo'" in done.stdout + done.stderr


def test_checkpoint_events_are_coalesced_not_one_per_commit(ckpt, monkeypatch):
    from notebook_elastic.runtime import state as state_module

    clock = [1000.0]
    monkeypatch.setattr(state_module.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with redirect_stdout(out):
        model = make_model()
        state = State(model=model, async_commit=False)
        for _step in state.steps(40):
            state.commit()
            clock[0] += 1.0  # one commit a second: 40 commits over 40 s
        state.flush()
    announced = [e for e in events_of(out.getvalue()) if e["kind"] == "checkpoint"]
    assert len(list_checkpoints(ckpt)) == 3  # every commit was written (keep=3)
    # The first of the generation, one per 10 s, and the last step: not 40.
    assert [e["step"] for e in announced] == [1, 11, 21, 31, 40]
    assert sum(e["commits"] for e in announced) == 40


def test_report_refuses_what_a_chart_cannot_hold_in_the_worker():
    with pytest.raises(TypeError, match=r"report\(step=\.\.\.\) takes a whole number, not 'seven' \(a str\)"):
        report(step="seven", loss=1.0)
    with pytest.raises(TypeError, match=r"big is an integer of about 401 digits, more than a float holds"):
        report(step=0, big=10**400)
    with pytest.raises(TypeError, match=r"takes a whole number, not 1.5"):
        report(step=1.5, loss=1.0)
    out = io.StringIO()
    with redirect_stdout(out):
        report(step=torch.tensor(4), loss=2.0)  # a 0-d integer tensor is a step
    assert events_of(out.getvalue())[0]["step"] == 4


def test_the_fold_drops_a_malformed_event_instead_of_dying():
    from notebook_elastic.contract.event_types import Kind
    from notebook_elastic.contract.events import Event
    from notebook_elastic.contract.job_state import JobState

    state = JobState(max_restarts=1, nnodes=(1, 1))
    bad = [
        Event(Kind.METRIC, 1.0, "node-0", {"step": "seven", "values": {"loss": 1.0}}),
        Event(Kind.METRIC, 1.0, "node-0", {"step": 0, "values": {"big": 10**400, "loss": 3.0}}),
        Event(Kind.METRIC, 1.0, "node-0", {"step": 10**400, "values": {"loss": 1.0}}),
        Event(Kind.METRIC, 1.0, "node-0", {"step": 1, "values": ["not", "a", "dict"]}),
        Event(Kind.WORKER_STARTED, 1.0, "node-0", {"rank": "x", "world_size": None}),
    ]
    state.apply_all(bad)
    state.apply(Event(Kind.METRIC, 2.0, "node-0", {"step": 2, "values": {"loss": 0.5}}))
    assert state.metrics["loss"].values.tolist() == [3.0, 0.5] and state.step == 2
    assert "big" not in state.metrics.names


def test_temp_files_of_dead_writers_go_when_the_next_state_starts(ckpt):
    from notebook_elastic.runtime import state as state_module

    ckpt.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    ours = ckpt / f".ckpt-g000000000001-s0000000010.pt.tmp-{state_module._HOST}-{dead.pid}"
    elsewhere = ckpt / f".ckpt-g000000000001-s0000000010.pt.tmp-otherhost-{dead.pid}"
    for path in (ours, elsewhere):
        path.write_bytes(b"x" * 1000)
    with redirect_stdout(io.StringIO()):
        State(model=make_model())
    assert not ours.exists()  # its writer is gone: removed at once
    assert elsewhere.exists()  # another host's pid means nothing here: left to the age limit


def test_a_new_run_reads_an_old_runs_checkpoints_instead_of_being_fenced(ckpt, monkeypatch):
    # A Kubernetes job whose --pvc holds another job's checkpoints (generation 5_000_003): its
    # own round 0 would be older, and every commit "superseded". With its run id, it numbers
    # its generations above what is there, reads the old checkpoint and writes on.
    from notebook_elastic.runtime.state import run_base

    with redirect_stdout(io.StringIO()):
        monkeypatch.setenv(protocol.ENV_RDZV_EPOCH, "5")
        monkeypatch.setenv(protocol.ENV_ROUND, "3")
        old = State(model=make_model())
        old.commit(step=9)
        old.flush()
        assert old.generation == 5_000_003
        monkeypatch.setenv(protocol.ENV_RDZV_EPOCH, "0")
        monkeypatch.setenv(protocol.ENV_ROUND, "0")
        monkeypatch.setenv(protocol.ENV_RUN, "newjob-abc-e0")
        new = State(model=make_model())
        assert new.step == 10 and new.generation == 6_000_000  # read, and above the old run
        new.commit(step=10)
        new.flush()
        monkeypatch.setenv(protocol.ENV_ROUND, "1")  # its next round: the same base, one more
        assert State(model=make_model()).generation == 6_000_001
    assert run_base(ckpt, "newjob-abc-e0") == 6_000_000  # fixed once written


def big_model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 1000))
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 1000)).sum().backward()
    opt.step()  # Adam's state exists: ~24 MB to snapshot at each save
    return model, opt


def quick_steps(state, model, total):
    """Steps much cheaper than a save of the model: a save at every one would block most of the loop."""
    for _step in state.steps(total):
        with torch.no_grad():
            model[0].bias.add_(1e-3)
        state.commit()


def saves(out: str) -> list[dict]:
    return [e for e in events_of(out) if e["kind"] == "checkpoint"]


def test_the_first_save_of_a_worker_counts_its_first_step_as_training(ckpt):
    """A restarted worker's first checkpoint event: the share of the loop commit() blocked
    counts the step before it as the loop's time (it read 100 % of the loop before: the step
    that trained was not counted)."""
    model = torch.nn.Linear(2, 1)
    out = io.StringIO()
    with redirect_stdout(out):
        state = State(model=model, keep=1)
        for _step in state.steps(1):
            time.sleep(0.2)  # the step: training, not commit()
            state.commit()
        state.flush()
    (first,) = saves(out.getvalue())
    assert first["blocked_pct"] < 100


def test_state_chooses_how_often_to_save_so_commits_block_little_and_the_last_step_is_saved(ckpt, monkeypatch):
    monkeypatch.delenv(protocol.ENV_CHECKPOINT_EVERY)  # State chooses
    model, opt = big_model_and_optimizer()
    out = io.StringIO()
    with redirect_stdout(out):
        state = State(model=model, optimizer=opt, keep=1)
        quick_steps(state, model, 60)
        state.flush()
    announced = saves(out.getvalue())
    written = sum(e["commits"] for e in announced)
    assert 1 <= written <= 20, written  # far fewer saves than the 60 commits
    assert announced[-1]["step"] == 60 and announced[-1]["chosen"] is True
    assert all(0 <= e["blocked_pct"] <= 100 for e in announced)  # the share the dashboard shows
    # The last step's state is what a restart finds.
    with redirect_stdout(io.StringIO()):
        again = State(model=big_model_and_optimizer()[0])
    assert again.step == 60
    assert torch.equal(again._objects["model"][0].bias, model[0].bias)


def test_a_resumed_group_saves_when_its_share_allows_not_at_its_first_step(ckpt, monkeypatch):
    """#39 item 2: every worker group saved at its first commit, whatever it cost: its first
    checkpoint event (one step of training, one save) said a third of the loop, and short groups
    (a restart, a rescale) spent well over a tenth. A group that resumes takes what a save cost
    the group before it (the checkpoint says) and waits for its share, like every later save;
    each event tells its window's seconds, which the notebook sums over the job."""
    monkeypatch.delenv(protocol.ENV_CHECKPOINT_EVERY)  # State chooses
    model, opt = big_model_and_optimizer()
    with redirect_stdout(io.StringIO()):
        first = State(model=model, optimizer=opt, keep=2)
        quick_steps(first, model, 5)  # its first save comes at its first commit: nothing to go by
        first.flush()
    out = io.StringIO()
    with redirect_stdout(out):
        again = State(model=model, optimizer=opt, keep=2)
        assert again.step == 5
        commits_before_a_save = 0
        for _step in again.steps(10_000):
            with torch.no_grad():
                model[0].bias.add_(1e-3)
            time.sleep(0.002)  # the step
            again.commit()
            commits_before_a_save += 1
            if again._interval.steps_since_save == 0:  # this commit saved
                break
        again.flush()
        blocked, loop = again._interval.seconds()
        report(step=again.step, loss=1.0)
    assert commits_before_a_save > 1, "the resumed group saved at its first commit"
    (metric,) = [e for e in events_of(out.getvalue()) if e["kind"] == "metric"]
    assert metric["blocked_s"] == round(blocked, 4) and metric["loop_s"] == round(loop, 3) and loop > blocked > 0


def test_checkpoint_every_saves_every_n_steps_and_the_last(ckpt, monkeypatch):
    monkeypatch.setenv(protocol.ENV_CHECKPOINT_EVERY, "4")  # what --checkpoint-every 4 sets
    model = make_model()
    out = io.StringIO()
    with redirect_stdout(out):
        state = State(model=model, async_commit=False, keep=100)
        for _step in state.steps(10):
            state.commit()
    assert [s for _, s, _ in list_checkpoints(ckpt)] == [4, 8, 10]
    assert saves(out.getvalue())[-1]["every"] == 2 and saves(out.getvalue())[-1]["chosen"] is False
    with pytest.raises(ValueError, match="checkpoint every 0 steps: give 1 or more steps"):
        State(model=model, checkpoint_every=0)


BROADCAST_TREE_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from notebook_elastic.runtime.restore import ALONE_BYTES, Collectives
from notebook_elastic.runtime.worker import WorkerInfo

dist.init_process_group("gloo")
info = WorkerInfo.from_env()
torch.manual_seed(0)  # both ranks make the same values: rank 1's to compare, rank 0's to send
big = torch.randn(ALONE_BYTES // 4 + 7, 3)  # over the bound: a broadcast of its own
tree = {
    "big": big,
    "moments": [big * 2, torch.arange(5)],  # a big one and a small one of another dtype
    "t": big.t(),  # not contiguous: sent as its values
    "small": torch.ones(3, dtype=torch.float16),
    "step": 7,
    "name": "adam",
}
got = Collectives(info).broadcast_tree(tree if info.rank == 0 else None, src=0)
assert got["step"] == 7 and got["name"] == "adam"
for key, want in (("big", big), ("t", big.t()), ("small", tree["small"])):
    assert got[key].dtype == want.dtype and torch.equal(got[key], want), key
assert torch.equal(got["moments"][0], big * 2) and torch.equal(got["moments"][1], torch.arange(5))
if info.rank == 0:
    assert got["big"].data_ptr() == big.data_ptr()  # the source keeps its own, not a copy
print(f"rank {info.rank} ok\\n", end="", flush=True)  # one write: the ranks share a pipe
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_state_tree_with_big_tensors_arrives_whole_on_every_rank(tmp_path):
    """``broadcast_tree`` sends a tensor of ALONE_BYTES or more in a collective of its own,
    received in place (a 100M-parameter joiner's transfer copied 1.2 GB twice on each side):
    every rank holds the source's values, dtypes and shapes, small and big, contiguous or not."""
    (tmp_path / "tree.py").write_text(BROADCAST_TREE_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "tree.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("rank")) == ["rank 0 ok", "rank 1 ok"]

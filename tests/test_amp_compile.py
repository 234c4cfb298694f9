"""Mixed precision and compiled models through ``State``, as a user writes them on CPU:
bfloat16 autocast with ``torch.amp.GradScaler("cpu")``, and ``torch.compile``d modules
(their state-dict keys carry ``_orig_mod.``)."""

from __future__ import annotations

import io
import time
from contextlib import redirect_stdout

import pytest
import torch

from notebook_elastic.contract import protocol
from notebook_elastic.runtime import State
from notebook_elastic.runtime import state as state_module


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def batch(step: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(step))


def amp_run(upto: int, *, stop_after: int | None = None, scaler_enabled: bool = True):
    """Train with bf16 autocast and a GradScaler whose scale grows every 2 steps, through
    State; ``stop_after``: the process 'dies' after that step's commit."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2, enabled=scaler_enabled)
    state = State(model=model, optimizer=opt, scaler=scaler, async_commit=False)
    for step in state.steps(upto):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(batch(step)).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        state.commit()
        if step == stop_after:
            break
    return model, scaler, state


def test_mixed_precision_resumes_exactly_with_its_grad_scaler(ckpt, tmp_path, monkeypatch):
    with redirect_stdout(io.StringIO()):
        straight, straight_scaler, _ = amp_run(8)
        monkeypatch.setenv(protocol.ENV_CHECKPOINT_DIR, str(tmp_path / "interrupted"))
        amp_run(8, stop_after=3)  # dies after step 3's commit
        resumed, resumed_scaler, state = amp_run(8)  # a new process: fresh model, optimizer, scaler
    assert state.resumed_from is not None
    # The scale went on growing from where it was (2^8 -> 2^12 over 8 steps), not from 2^8 again,
    # and the weights are bit for bit those of the run that never stopped.
    assert resumed_scaler.get_scale() == straight_scaler.get_scale() == 2.0**12
    assert resumed_scaler.state_dict() == straight_scaler.state_dict()
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)

    # A run where the scaler was off (GradScaler(enabled=torch.cuda.is_available()) on a CPU
    # machine) saved an empty scaler state: a run with it on resumes at its initial scale.
    monkeypatch.setenv(protocol.ENV_CHECKPOINT_DIR, str(tmp_path / "cpu-then-gpu"))
    with redirect_stdout(io.StringIO()):
        amp_run(8, stop_after=3, scaler_enabled=False)
        _, scaler, state = amp_run(4, scaler_enabled=True)
    assert state.step == 4 and scaler.get_scale() == 2.0**8


def train_steps(state: State, model: torch.nn.Module, opt, upto: int) -> None:
    for step in state.steps(upto):
        loss = model(batch(step)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state.commit()


def test_a_compiled_models_checkpoint_loads_into_an_uncompiled_one_and_back(ckpt, tmp_path, monkeypatch):
    # backend="eager": dynamo's graph capture and the wrapper are real, code generation is not
    # (the inductor path runs once, in the test below).
    with redirect_stdout(io.StringIO()):
        model = make_model()
        compiled = torch.compile(model, backend="eager")
        opt = torch.optim.Adam(compiled.parameters())
        train_steps(State(model=compiled, optimizer=opt, async_commit=False), compiled, opt, 3)

        plain = make_model()
        plain_opt = torch.optim.Adam(plain.parameters())
        state = State(model=plain, optimizer=plain_opt, async_commit=False)  # compiled -> uncompiled
        assert state.step == 3
        for a, b in zip(model.state_dict().values(), plain.state_dict().values()):
            assert torch.equal(a, b)
        assert plain_opt.state_dict()["state"][0]["step"] == 3
        train_steps(state, plain, plain_opt, 5)

        # uncompiled -> compiled, also under a wrapper of the compiled module
        again = make_model()
        wrapped = torch.nn.DataParallel(torch.compile(again, backend="eager"))
        again_opt = torch.optim.Adam(wrapped.parameters())
        state = State(model=wrapped, optimizer=again_opt, async_commit=False)
        assert state.step == 5
        for a, b in zip(plain.state_dict().values(), again.state_dict().values()):
            assert torch.equal(a, b)
        train_steps(state, wrapped, again_opt, 6)  # and it trains on, compiled

    # A checkpoint written with the compiled wrapper's own keys ("_orig_mod.0.weight", as
    # State wrote them before) still loads into an uncompiled model.
    monkeypatch.setenv(protocol.ENV_CHECKPOINT_DIR, str(tmp_path / "prefixed"))
    monkeypatch.setattr(state_module, "_state_dict_owner", lambda obj: obj)
    with redirect_stdout(io.StringIO()):
        State(model=torch.compile(make_model(), backend="eager"), async_commit=False).commit(step=0)
    monkeypatch.undo()
    monkeypatch.setenv(protocol.ENV_CHECKPOINT_DIR, str(tmp_path / "prefixed"))
    saved = torch.load(state_module.list_checkpoints(tmp_path / "prefixed")[-1][2], weights_only=False)
    assert all(k.startswith("_orig_mod.") for k in saved["objects"]["model"])
    with redirect_stdout(io.StringIO()):
        assert State(model=make_model(), async_commit=False).step == 1


@pytest.mark.slow
def test_an_inductor_compiled_model_round_trips_through_state(ckpt, tmp_path, monkeypatch):
    """The real path once: inductor generates and compiles C++ for the forward and backward
    (cold, in a cache of its own: about 30 s on a loaded 2-core machine)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    with redirect_stdout(io.StringIO()):
        model = make_model()
        compiled = torch.compile(model)
        opt = torch.optim.SGD(compiled.parameters(), lr=0.01)
        started = time.perf_counter()
        train_steps(State(model=compiled, optimizer=opt, async_commit=False), compiled, opt, 2)
        took_s = time.perf_counter() - started
        plain = make_model()
        state = State(model=plain, async_commit=False)
    print(f"inductor: 2 steps, compile included, {took_s:.1f} s")
    assert state.step == 2
    for a, b in zip(model.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)

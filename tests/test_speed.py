"""What GPU users read beside the loss, from the events alone: step time, samples/s and
tokens/s, per-rank peak GPU memory and utilisation (absent on CPU), in the dashboard's
header, the jobs panel's row and the job's summary. End to end (a real job, TensorBoard):
``test_local_backend.py::test_step_time_samples_and_tokens_per_s_are_read_beside_the_loss_and_in_tensorboard``;
on CUDA: ``test_gpu.py``."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from notebook_elastic.backends.base import JobInfo
from notebook_elastic.contract import protocol
from notebook_elastic.contract.events import LineParser
from notebook_elastic.contract.job_state import JobState
from notebook_elastic.kernel.ui.render import header_html
from notebook_elastic.runtime import report
from notebook_elastic.server.routes import job_json


def fold(lines: list[str]) -> JobState:
    state = JobState(nnodes=(1, 1))
    parser = LineParser("node-0", "stdout")
    for line in lines:
        event = parser.feed(line, t=0.0)
        if event is not None:
            state.apply(event)
    return state


def line(**event) -> str:
    return protocol.EVENT_PREFIX + json.dumps(event)


def test_gpu_figures_per_rank_reach_the_header_and_the_panel_row_and_are_absent_on_cpu():
    # The lines two CUDA ranks print (runtime/gpu.py through report()), then a step every 0.5 s.
    lines = [
        line(kind="worker_started", rank=r, local_rank=r, world_size=2, group_rank=0, generation=0, pid=10 + r)
        for r in (0, 1)
    ]
    lines += [
        line(
            kind="gpu", t=1.0, rank=0, device=0, mem_peak_bytes=3 * 2**30, mem_total_bytes=80 * 2**30, util_percent=80
        ),
        line(
            kind="gpu", t=1.0, rank=1, device=1, mem_peak_bytes=5 * 2**30, mem_total_bytes=80 * 2**30, util_percent=90
        ),
    ]
    lines += [line(kind="metric", t=10 + 0.5 * s, rank=0, step=s, values={"loss": 1.0 / (s + 1)}) for s in range(6)]
    state = fold(lines)
    assert state.step_time_s == pytest.approx(0.5)
    assert [g["mem_peak_bytes"] for g in state.gpu_ranks] == [3 * 2**30, 5 * 2**30]
    header = header_html("g", "local", state)
    assert "GPU peak 5.0 GiB (rank 1) · 85% busy" in header and "0.5 s/step" in header
    assert "samples/s" not in header  # no data cursor and no samples= reported: not made up
    row = job_json(JobInfo(name="g", backend="local", status="running", summary=state.summary()))
    assert row["gpu_mem_peak_bytes"] == 5 * 2**30 and row["gpu_util_percent"] == 85 and row["step_time_s"] == 0.5
    assert not any(e.kind == "gpu" for e in state.events)  # figures, not history: the timeline stays readable

    # A CPU worker's report() sends no GPU figure at all, even with torch imported.
    out = io.StringIO()
    with redirect_stdout(out):
        report(step=0, loss=1.0)
    assert '"kind":"gpu"' not in out.getvalue() and '"kind": "gpu"' not in out.getvalue()
    cpu = fold([line(kind="metric", t=float(s), rank=0, step=s, values={"loss": 1.0}) for s in range(3)])
    assert "GPU" not in header_html("c", "local", cpu) and "gpu" not in cpu.summary()


def test_reported_samples_and_tokens_are_per_step_counts_turned_into_rates():
    state = fold(
        [
            line(kind="metric", t=2.0 * s, rank=0, step=s, values={"loss": 1.0, "samples": 32, "tokens": 32 * 512})
            for s in range(4)
        ]
    )
    assert state.samples_per_s == pytest.approx(16) and state.tokens_per_s == pytest.approx(16 * 512)
    assert "2 s/step · 16 samples/s · 8.19k tokens/s" in header_html("t", "local", state)

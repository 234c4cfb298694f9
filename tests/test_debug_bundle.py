"""``notebook-elastic debug JOB`` (#27 item 6): one private file for a bug report, with the
job's events, logs, plan and versions, and no secret in it: not the --env values (not even where
the cell printed one), not the payload, not the checkpoints."""

from __future__ import annotations

import json
import stat
import tarfile
import time

import pytest
import torch
from test_cli import cli

import notebook_elastic as ne
import notebook_elastic.runtime as runtime

pytestmark = pytest.mark.slow

SECRET = "hf_" + "Zq8" * 11  # made up
CELL = """
import os
model = torch.nn.Linear(2, 1)
state = elastic.State(model=model)
print("the token is", os.environ["HF_TOKEN"], flush=True)  # a careless print: it must not leak
print("payload value", PAYLOAD_MARK, flush=True)
for step in state.steps(5):
    elastic.report(step=step, loss=1.0 / (step + 1))
    state.commit()
    time.sleep(0.05)
"""


def test_the_debug_bundle_holds_what_a_report_needs_and_no_secret(home, tmp_path):
    job = ne.launch(
        CELL,
        name="buggy",
        env={"HF_TOKEN": SECRET},
        user_ns={"torch": torch, "elastic": runtime, "time": time, "PAYLOAD_MARK": "pv-31337"},
    )
    assert job.wait(timeout=120) == "succeeded", job.summary()
    out = tmp_path / "report.tar.gz"
    done = cli("debug", "buggy", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and "never --env values, the payload or checkpoints" in done.stdout
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with tarfile.open(out) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
    for name in (
        "events.jsonl",
        "status.json",
        "spec.json",
        "script.py",
        "plan.txt",
        "versions.json",
        "logs/node-0.log",
    ):
        assert name in members, sorted(members)
    assert not [n for n in members if "secret" in n or "payload" in n or "checkpoint" in n], sorted(members)
    everything = b"".join(members.values())
    assert SECRET.encode() not in everything  # not even the line the cell printed
    assert b"the token is <--env HF_TOKEN hidden>" in members["logs/node-0.log"]
    versions = json.loads(members["versions.json"])
    assert versions["torch"] == torch.__version__.split("+")[0] or versions["torch"] == torch.__version__
    assert "torchrun" in members["plan.txt"].decode() or "agent" in members["plan.txt"].decode()
    assert cli("debug", "nope").returncode == 4

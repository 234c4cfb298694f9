"""The torch range pyproject declares is the range CI proves, and installing notebook-elastic
leaves the user's torch alone.

A GPU user's environment already holds a torch (a CUDA build, a vendor's build): an install that
replaced it would rule us out. pyproject declares the range; ``scripts/torch_range.py`` (called
by ``.ci/run``) runs the tests marked ``torch_contract`` on the oldest and the newest release
of it, each in an environment of its own, the whole suite runs on the set-up's 2.13.0. These
tests keep the three (the declared range, its two ends, the warning the agent gives from ``torch_adapter.TESTED_TORCH``)
in step, and ask pip's own resolver what an install would do to the torch at hand.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

import pytest
import torch

from notebook_elastic.agent import torch_adapter

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _declared() -> tuple[tuple[int, int], tuple[int, int]]:
    """``torch>=A.B,<C.D`` from pyproject's dependencies, as ((A, B), (C, D))."""
    (spec,) = [d for d in _pyproject()["project"]["dependencies"] if re.match(r"torch\b", d)]
    m = re.fullmatch(r"torch>=(\d+)\.(\d+),<(\d+)\.(\d+)", spec.replace(" ", ""))
    assert m, f"pyproject's torch requirement {spec!r} is not of the form torch>=A.B,<C.D"
    a, b, c, d = map(int, m.groups())
    return (a, b), (c, d)


def test_the_declared_range_is_the_one_ci_runs_at_both_ends():
    low, high = _declared()
    assert (low, high) == torch_adapter.TESTED_TORCH  # the warning for other torches reads this
    ends = _pyproject()["tool"]["notebook-elastic"]["torch-ends"]
    oldest, newest = (torch_adapter.torch_version(v) for v in ends)
    assert oldest == low, f"the range starts at {low}, its contract runs on {ends[0]}"
    assert (newest[0], newest[1] + 1) == high, f"the range ends before {high}, its contract runs on {ends[1]}"
    # The README's test command, which CI runs, runs both ends (and fails when either fails).
    ci = (ROOT / ".ci" / "run").read_text()
    command = (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/test.sh" in ci and "scripts/torch_range.py" in command
    assert "[[ ${PIPESTATUS[0]} -ne 0 ]] && rc=1" in command  # its failure fails the command
    # The set-up's own torch is in the range too.
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    (pinned,) = set(re.findall(r"torch==(\d+\.\d+\.\d+)", setup))
    assert torch_adapter.torch_is_tested(torch_adapter.torch_version(pinned))


@pytest.mark.torch_contract
def test_the_torch_running_this_is_in_the_declared_range():
    assert torch_adapter.torch_is_tested(torch_adapter.torch_version()), (
        f"torch {torch.__version__} runs the contract but pyproject declares torch{torch_adapter.tested_torch_text()}"
    )


@pytest.mark.torch_contract
@pytest.mark.parametrize("extras", ["", "[kubernetes]"])
def test_installing_the_package_leaves_the_installed_torch_as_it_is(tmp_path, extras):
    """pip's resolver, asked what ``pip install notebook-elastic`` would do in this environment
    (the oldest, the newest or the default torch of the range): nothing to torch."""
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's own pip settings (a cap on torch) play no part
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--no-build-isolation",  # the project's metadata from the build backend already here
            "--report",
            str(report),
            f"{ROOT}{extras}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    planned = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "notebook-elastic" in planned  # the report is of that install, not of nothing
    assert "torch" not in planned, (
        f"installing notebook-elastic would replace torch {torch.__version__} with {planned['torch']}"
    )
    assert not {name for name in planned if name.startswith("nvidia-")}, f"it would install CUDA libraries: {planned}"

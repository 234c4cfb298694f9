"""Notebooks executed with nbclient on a real ipykernel, as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def run_notebook(name: str, home, timeout: int = 600) -> str:
    env = dict(os.environ, NOTEBOOK_ELASTIC_HOME=str(home))
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "run_notebook.py"), str(REPO / "notebooks" / name)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO / "notebooks",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def test_quickstart_notebook_tells_the_seed_story(home):
    out = run_notebook("quickstart.ipynb", home)
    assert "epochs trained: 100 of 100 (0..99)" in out
    assert "world sizes: 2 -> 4 -> 2" in out
    assert "each exactly once: True" in out
    assert "QUICKSTART OK" in out


def test_over_quota_notebook_shrinks_and_grows_back(home):
    out = run_notebook("over-quota.ipynb", home, timeout=900)
    assert "world sizes: 4 -> 2 -> 4" in out
    assert "steps trained: 240 of 240" in out
    assert "each exactly once: True" in out
    assert "OVER-QUOTA OK" in out

"""Shared fixtures: a real IPython shell, a private job home, and the no-orphan check."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="session")
def _ipython():
    from IPython.testing.globalipapp import start_ipython

    return start_ipython()


@pytest.fixture
def shell(_ipython, tmp_path, monkeypatch):
    """A real InteractiveShell with an empty namespace and history, and our extension loaded."""
    monkeypatch.chdir(tmp_path)
    _ipython.reset(new_session=True)
    _ipython.execution_count = 1
    from notebook_elastic.magics import load_ipython_extension

    load_ipython_extension(_ipython)
    yield _ipython
    _ipython.reset(new_session=True)


def run_cells(shell, *cells: str) -> None:
    """Run cells the way a notebook does (stored in history, numbered)."""
    for cell in cells:
        result = shell.run_cell(cell, store_history=True)
        if result.error_before_exec or result.error_in_exec:
            raise AssertionError(f"cell failed: {cell!r}: {result.error_before_exec or result.error_in_exec!r}")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private NOTEBOOK_ELASTIC_HOME, checked for leftover processes afterwards."""
    path = tmp_path / "ne-home"
    monkeypatch.setenv("NOTEBOOK_ELASTIC_HOME", str(path))
    yield path
    leftovers = job_processes(path)
    for pid in leftovers:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not leftovers, f"processes left behind by the test: {leftovers}"


def job_processes(home: Path) -> list[int]:
    """Live processes whose environment points into ``home`` (job supervisors, agents, workers)."""
    marker = f"={home}".encode()
    found = []
    deadline = time.monotonic() + 10
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                continue
            if b"NOTEBOOK_ELASTIC_JOB_DIR" + marker in env and not zombie:
                found.append(int(entry))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def python(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def torchrun(*args: str, cwd: Path, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return python("-m", "torch.distributed.run", *args, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture
def small_disk():
    """``small_disk(path, size)``: a tmpfs of ``size`` mounted at ``path`` (a full disk on demand),
    unmounted afterwards; the test is skipped where mounting is not allowed."""
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)

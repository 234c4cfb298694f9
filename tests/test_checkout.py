"""A clean checkout stays clean: the set-up (which builds the labextension with npm inside the
pip install) rewrites no file git tracks. npm 11 rewrote ``labextension/package-lock.json``
(+234 lines of optional platform packages) on every fresh clone until the lock it writes was
the one checked in."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def checkout():
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: nothing to compare with")


def test_the_set_up_leaves_the_labextension_lock_as_checked_in(checkout):
    assert (ROOT / "notebook_elastic" / "labextension" / "package.json").exists(), "the set-up built no labextension"
    changed = _git("diff", "--stat", "HEAD", "--", "labextension/package-lock.json").stdout
    assert changed == "", f"the set-up's npm install rewrote the lock file:\n{changed}"


def test_in_ci_no_tracked_file_is_changed_by_the_set_up(checkout):
    """In CI (a fresh clone, ``CI=true``): no tracked file differs from the commit after the
    set-up, whatever it is. A developer's own edits are not this test's business."""
    if os.environ.get("CI", "").lower() not in ("1", "true"):
        pytest.skip("only on CI's fresh clone: a developer's checkout has edits of its own")
    changed = _git("diff", "--name-only", "HEAD").stdout.split()
    assert changed == [], f"tracked files changed on a fresh clone: {changed}"

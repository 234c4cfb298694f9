"""Notebooks executed with nbclient on a real ipykernel, as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def run_notebook(name: str, home, timeout: int = 600) -> str:
    """Run it as a user would; its kernel inherits the test's marker, so a kernel orphaned by
    a timeout is found and killed by the leftover check."""
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
    assert "world size: started on 2, reached 4, ended on 2" in out
    assert "each exactly once: True" in out
    assert "QUICKSTART OK" in out


def test_over_quota_notebook_shrinks_and_grows_back(home):
    out = run_notebook("over-quota.ipynb", home, timeout=900)
    assert "world size: 4 before the reclaim, shrank to 2, ended on 4" in out
    assert "steps trained: 240 of 240" in out
    assert "each exactly once: True" in out
    assert "OVER-QUOTA OK" in out


def test_kubernetes_notebook_on_the_fake_cluster(home, tmp_path, monkeypatch):
    """The seed 003 story, run for real against the loopback API server."""
    import json
    import urllib.request

    from k8s_apiserver import FakeCluster

    cluster = FakeCluster(gpu_slots=4)
    try:
        body = {
            "metadata": {"name": "efs-checkpoints"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        req = urllib.request.Request(
            cluster.url + "/api/v1/namespaces/default/persistentvolumeclaims",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": "Bearer fake-token"},
        )
        urllib.request.urlopen(req).read()
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig(tmp_path / "kubeconfig")))
        out = run_notebook("kubernetes.ipynb", home, timeout=900)
    finally:
        cluster.close()
    assert "kind: Job" in out and "completionMode: Indexed" in out and "node.kubernetes.io/lifecycle: on-demand" in out
    assert "left (preempted)" in out or "left (deleted)" in out or "left (evicted)" in out  # preempt_node evicts (#17)
    assert "KUBERNETES OK" in out

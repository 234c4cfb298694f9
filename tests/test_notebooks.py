"""Notebooks executed with nbclient on a real ipykernel, as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


#: A reader's pace (#39 item 1): a cell every 15-30 s, markdown cells read too. The slow end is
#: the one a job that ends too soon fails at (the quickstart's 100-step job ended in 23 s, before
#: a reader reached its preempt cell): the paced runs take it for every cell once a job runs.
READER_PACE_S = 30


def run_notebook(name: str, home, timeout: int = 600, pace_s: float = 0) -> str:
    """Run it as a user would (``pace_s``: as a person reads and runs it, that long before each
    cell once a job runs); its kernel inherits the test's marker, so a kernel orphaned by a
    timeout is found and killed by the leftover check."""
    env = dict(os.environ, NOTEBOOK_ELASTIC_HOME=str(home))
    pace = ["--pace", str(pace_s)] if pace_s else []
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "run_notebook.py"), str(REPO / "notebooks" / name), *pace],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO / "notebooks",
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-4000:]  # the jobs' events too
    return done.stdout


def test_quickstart_notebook_tells_the_seed_story(home):
    out = run_notebook("quickstart.ipynb", home)
    assert "epochs trained: 100 of 100 (0..99)" in out
    assert "world size: started on 2, reached 4, ended on 2" in out
    assert "each exactly once: True" in out
    assert "QUICKSTART OK" in out


@pytest.mark.paced
def test_quickstart_notebook_at_a_readers_pace(home):
    """#39 item 1: run cell by cell, 30 s before each, the quickstart failed: its job had ended
    before the preempt cell ("job 'quickstart' has succeeded; it cannot preempt a node") and the
    proof cell failed. Its job now waits for the reader (an epoch every 5 s while the story
    waits for the next cell)."""
    out = run_notebook("quickstart.ipynb", home, timeout=1200, pace_s=READER_PACE_S)
    assert out.count("a reader's 30 s before cell") == 6, out[-3000:]  # cells 6..11, markdown ones too
    assert "epochs trained: 100 of 100 (0..99)" in out
    assert "world size: started on 2, reached 4, ended on 2" in out
    assert "each exactly once: True" in out
    assert "QUICKSTART OK" in out


@pytest.mark.paced
def test_over_quota_notebook_at_a_readers_pace(home):
    """#39 item 1: the over-quota job (240 steps of 0.1 s) ended before a reader reached its
    reclaim cell; it now waits for the reader at each act."""
    out = run_notebook("over-quota.ipynb", home, timeout=1500, pace_s=READER_PACE_S)
    assert out.count("a reader's 30 s before cell") == 6, out[-3000:]
    assert "world size: 4 before the reclaim, shrank to 2, ended on 4" in out
    assert "steps trained: 240 of 240" in out
    assert "each exactly once: True" in out
    assert "OVER-QUOTA OK" in out


def test_a_drill_on_a_finished_job_is_one_sentence_in_a_notebook(home, tmp_path):
    """#39 item 1: a reader who comes to a drill cell after the job ended got a 30-line
    traceback of our code; an error we raise on purpose shows as its one sentence."""
    from notebook_kernel import NotebookKernel

    with NotebookKernel(tmp_path / "nb") as nb:
        nb.run("%load_ext notebook_elastic")
        nb.run("%%elastic_train --nnodes 1 --name short\nprint('trained')")
        nb.run("print(await short.ended(timeout=120))")
        said = nb.run('short.preempt_node("node-0")', may_fail=True)
    assert said.strip() == "BackendError: job 'short' has succeeded; it cannot preempt a node", said


def test_over_quota_notebook_shrinks_and_grows_back(home):
    out = run_notebook("over-quota.ipynb", home, timeout=900)
    assert "world size: 4 before the reclaim, shrank to 2, ended on 4" in out
    assert "steps trained: 240 of 240" in out
    assert "each exactly once: True" in out
    assert "OVER-QUOTA OK" in out


@pytest.mark.parametrize(
    "pace_s", [pytest.param(0, id="run-all"), pytest.param(READER_PACE_S, id="a-readers-pace", marks=pytest.mark.paced)]
)
def test_kubernetes_notebook_on_the_fake_cluster(home, tmp_path, monkeypatch, pace_s):
    """The seed 003 story, run for real against the loopback API server: all at once, and at a
    reader's pace (#39 item 1: its 150 steps of 0.1 s ended before a reader reached the reclaim)."""
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
        out = run_notebook("kubernetes.ipynb", home, timeout=1500, pace_s=pace_s)
    finally:
        cluster.close()
    assert "kind: Job" in out and "completionMode: Indexed" in out and "node.kubernetes.io/lifecycle: on-demand" in out
    assert "left (preempted)" in out or "left (deleted)" in out or "left (evicted)" in out  # preempt_node evicts (#17)
    assert "KUBERNETES OK" in out
    if pace_s:  # cells 7..11 after the launch, markdown ones too
        assert out.count(f"a reader's {pace_s} s before cell") == 5, out[-3000:]

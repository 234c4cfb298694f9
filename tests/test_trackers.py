"""MLflow: a local job's metrics in one run named after the job, read back through MLflow's own
client over a file store; nothing logged unless asked; a failing server said once.

Real jobs (torchrun, the supervisor) and the real ``mlflow`` package; skipped without it."""

from __future__ import annotations

import json

import pytest
from test_local_backend import TRAIN, metric_events, namespace, wait_for

import notebook_elastic as ne
from notebook_elastic.backends.local import LocalBackend
from notebook_elastic.errors import SpecError
from notebook_elastic.events import Kind
from notebook_elastic.launcher import build_spec

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI set where the job is launched: a file store in the test's folder."""
    monkeypatch.chdir(tmp_path)
    uri = (tmp_path / "store").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use a file store
    return mlflow.MlflowClient(uri)


def runs(client):
    return client.search_runs(["0"])


def test_with_mlflow_tracking_uri_set_every_step_is_logged_once_to_a_run_that_ends_with_the_job(
    home, tmp_path, tracking
):
    job = ne.launch(
        TRAIN, nnodes="1", nproc_per_node=2, name="tracked", env=["SECRET=hunter2"], user_ns=namespace(total=20)
    )
    assert job.wait(180) == "succeeded", job.summary()

    (run,) = runs(tracking)
    assert run.info.run_name == "tracked"
    assert run.info.status == "FINISHED"
    assert run.data.params == {"nnodes": "1:1", "nproc_per_node": "2", "max_restarts": "3"}
    reported = {m["step"]: m["values"]["loss"] for m in metric_events(job) if m.get("rank", 0) == 0}
    history = tracking.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(20))  # every step, once
    assert all(m.value == pytest.approx(reported[m.step], rel=1e-6) for m in history)
    sizes = tracking.get_metric_history(run.info.run_id, "job/world_size")
    assert sizes and all(m.value == 2 for m in sizes)
    assert tracking.get_metric_history(run.info.run_id, "speed/step_time_s")
    # --env values are the user's secrets: never in the run.
    stored = "".join(p.read_text(errors="replace") for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert "SECRET" in "".join(job.spec.env) and "hunter2" not in stored


def test_a_stopped_job_s_run_ends_killed(home, tracking):
    job = ne.launch(TRAIN, nnodes="1", name="stopped", track="mlflow", user_ns=namespace(total=100_000, step_s=0.05))
    wait_for(job, lambda: job.state.step is not None and job.state.step >= 3, "three steps")
    job.stop()
    assert job.wait(120) == "stopped"
    (run,) = runs(tracking)
    assert run.info.run_name == "stopped" and run.info.status == "KILLED"


def test_nothing_is_logged_to_mlflow_unless_asked(home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    job = ne.launch(TRAIN, nnodes="1", name="quiet", user_ns=namespace(total=5))
    assert job.wait(180) == "succeeded", job.summary()
    # --track none turns off what the environment asks for.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "store").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    job = ne.launch(TRAIN, nnodes="1", name="quiet-none", track="none", user_ns=namespace(total=5))
    assert job.wait(180) == "succeeded", job.summary()
    left = [p for pattern in ("mlruns", "mlflow.db", "store") for p in tmp_path.rglob(pattern)]
    assert not left, f"MLflow files written without being asked: {left}"


def test_a_tracking_server_that_fails_is_said_once_and_training_goes_on(home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # the discard port: nothing answers
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    job = ne.launch(TRAIN, nnodes="1", name="unreachable", user_ns=namespace(total=100_000))
    events = LocalBackend().folder("unreachable").events_file

    def told() -> list[dict]:
        lines = events.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["kind"] == Kind.ERROR and e.get("error") == "tracker"]

    wait_for(job, lambda: told(), "the tracker's failure")
    step = job.state.step or 0
    wait_for(job, lambda: (job.state.step or 0) >= step + 5, "five more steps")  # training goes on
    job.stop()
    assert job.wait(120) == "stopped"
    (message,) = told()  # once
    assert (
        message["message"].startswith("MLflow logging stopped: MlflowException")
        and "training goes on" in message["message"]
    )


def test_an_unknown_tracker_is_refused_in_one_sentence_before_anything_starts(home):
    with pytest.raises(SpecError, match=r"--track 'wandb' is unknown; choose mlflow"):
        ne.launch("print(1)\n", name="bad-track", track="wandb")
    assert not list(home.glob("*/*"))


def test_track_on_kubernetes_is_refused_in_one_sentence():
    with pytest.raises(SpecError, match=r"--track mlflow applies to the local backend only"):
        build_spec(name="k8s-track", backend="kubernetes", track="mlflow")

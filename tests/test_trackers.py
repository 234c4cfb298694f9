"""MLflow and W&B: a local job's metrics in one run named after the job, read back through
MLflow's own client over a file store and from W&B's offline run file with W&B's own record
schema; nothing logged unless asked; a failing server said once.

Real jobs (torchrun, the supervisor) and the real packages; each test skips without its own."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import job_processes
from test_local_backend import TRAIN, metric_events, namespace, wait_for

import notebook_elastic as ne
from notebook_elastic.backends.local import LocalBackend
from notebook_elastic.errors import SpecError
from notebook_elastic.events import Kind
from notebook_elastic.launcher import build_spec

try:
    import mlflow
except ImportError:
    mlflow = None
needs_mlflow = pytest.mark.skipif(mlflow is None, reason="mlflow is not installed")


@pytest.fixture
def no_tracking_variables(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "WANDB_PROJECT", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tracking(no_tracking_variables, tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI set where the job is launched: a file store in the test's folder."""
    monkeypatch.chdir(tmp_path)
    uri = (tmp_path / "store").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use a file store
    return mlflow.MlflowClient(uri)


def runs(client):
    return client.search_runs(["0"])


@needs_mlflow
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


@needs_mlflow
def test_a_stopped_job_s_run_ends_killed(home, tracking):
    job = ne.launch(TRAIN, nnodes="1", name="stopped", track="mlflow", user_ns=namespace(total=100_000, step_s=0.05))
    wait_for(job, lambda: job.state.step is not None and job.state.step >= 3, "three steps")
    job.stop()
    assert job.wait(120) == "stopped"
    (run,) = runs(tracking)
    assert run.info.run_name == "stopped" and run.info.status == "KILLED"


def test_nothing_is_logged_to_mlflow_or_wandb_unless_asked(home, tmp_path, monkeypatch, no_tracking_variables):
    monkeypatch.chdir(tmp_path)
    job = ne.launch(TRAIN, nnodes="1", name="quiet", user_ns=namespace(total=5))
    assert job.wait(180) == "succeeded", job.summary()
    # --track none turns off what the environment asks for.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "store").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("WANDB_PROJECT", "quiet")
    monkeypatch.setenv("WANDB_MODE", "offline")
    job = ne.launch(TRAIN, nnodes="1", name="quiet-none", track="none", user_ns=namespace(total=5))
    assert job.wait(180) == "succeeded", job.summary()
    left = [p for pattern in ("mlruns", "mlflow.db", "store", "wandb") for p in tmp_path.rglob(pattern)]
    assert not left, f"tracker files written without being asked: {left}"


@needs_mlflow
def test_a_tracking_server_that_fails_is_said_once_and_training_goes_on(
    home, tmp_path, monkeypatch, no_tracking_variables
):
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
    with pytest.raises(SpecError, match=r"--track 'tensorboard' is unknown; choose mlflow or wandb"):
        ne.launch("print(1)\n", name="bad-track", track="tensorboard")
    assert not list(home.glob("*/*"))


def test_track_on_kubernetes_is_refused_in_one_sentence():
    with pytest.raises(SpecError, match=r"--track mlflow applies to the local backend only"):
        build_spec(name="k8s-track", backend="kubernetes", track="mlflow")


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (``run-ID.wandb``), parsed with W&B's own protobuf schema.

    The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0),
    then LevelDB-log blocks of 32 KiB holding chunks (crc32, length, type: 1 full, 2 first,
    3 middle, 4 last), each record a serialized ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), "not a W&B run file"
    records, pending, at, block = [], b"", 7, 32768
    while at + 7 <= len(data):
        if block - at % block < 7:  # the block's tail is padding
            at += block - at % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at : at + 7])
        chunk, at = data[at + 7 : at + 7 + length], at + 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_with_wandb_project_set_every_step_is_logged_once_to_an_offline_run_that_ends_with_the_job(
    home, tmp_path, monkeypatch, no_tracking_variables
):
    pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_PROJECT", "notebook-elastic-tests")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: W&B writes the run under ./wandb
    monkeypatch.setenv("WANDB_SILENT", "true")
    job = ne.launch(
        TRAIN, nnodes="1", nproc_per_node=2, name="wandb-run", env=["SECRET=hunter2"], user_ns=namespace(total=20)
    )
    assert job.wait(180) == "succeeded", job.summary()

    assert not job_processes(home)  # the supervisor finishes the run after job_finished: wait for it
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"][:1]
    assert run.display_name == "wandb-run" and run.project == "notebook-elastic-tests"
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert {"nnodes": "1:1", "nproc_per_node": "2", "max_restarts": "3"}.items() <= config.items()
    history = [
        {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    reported = {m["step"]: m["values"]["loss"] for m in metric_events(job) if m.get("rank", 0) == 0}
    logged = [h for h in history if "loss" in h]
    assert sorted(h["_step"] for h in logged) == list(range(20))  # every step, once
    assert all(h["loss"] == pytest.approx(reported[h["_step"]], rel=1e-6) for h in logged)
    assert all(h["job/world_size"] == 2 for h in logged)
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0
    events = LocalBackend().folder("wandb-run").events_file.read_text().splitlines()
    (finished,) = [e for e in map(json.loads, events) if e["kind"] == Kind.JOB_FINISHED]
    assert "orphans_killed" not in finished  # W&B's service process ended with its run, not swept
    assert b"hunter2" not in b"".join(p.read_bytes() for p in (tmp_path / "wandb").rglob("*") if p.is_file())


def test_the_sinks_flush_returns_once_every_event_put_before_it_is_folded_and_seen(tmp_path):
    """What the trackers' end waits on (instead of polling the queue): a slow observer still
    has every event before it when flush returns; a closed sink's flush says False at once."""
    import threading
    import time as _time

    from notebook_elastic.backends.local.sink import EventSink
    from notebook_elastic.events import Event
    from notebook_elastic.job_state import JobState

    seen: list[int] = []
    gate = threading.Event()

    def observe(e: Event) -> None:
        gate.wait(30)  # the sink thread is busy with a batch while the events below are queued
        seen.append(e.get("step"))

    sink = EventSink(tmp_path / "events.jsonl", JobState(), observe)
    for step in range(50):
        sink.put(Event(Kind.METRIC, _time.time(), None, {"step": step, "values": {"loss": 1.0}}))
    threading.Timer(0.2, gate.set).start()
    assert sink.flush(timeout_s=60)
    assert seen == list(range(50))
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 50
    sink.close()
    assert sink.flush(timeout_s=60) is False

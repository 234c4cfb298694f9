"""MLflow and W&B: a local job's metrics in one run named after the job, read back through
MLflow's own client over a file store and from W&B's offline run file with W&B's own record
schema; nothing logged unless asked; a failing server said once; where the run is, in every
view, without credentials; on Kubernetes, rank 0's pod logging itself (the loopback cluster).

Real jobs (torchrun, the supervisor) and the real packages; each test skips without its own."""

from __future__ import annotations

import html
import json
import os
import re
import struct
import time
from pathlib import Path

import pytest
from conftest import job_processes
from test_local_backend import TRAIN, metric_events, namespace
from waiting import wait_for

import notebook_elastic as ne
from notebook_elastic.backends.local import LocalBackend
from notebook_elastic.contract.event_types import Kind
from notebook_elastic.errors import SpecError
from notebook_elastic.runtime.tracking import tensorboard_command

try:
    import mlflow
except ImportError:
    mlflow = None
needs_mlflow = pytest.mark.skipif(mlflow is None, reason="mlflow is not installed")


@pytest.fixture
def cluster(tmp_path, monkeypatch, home):
    """The loopback Kubernetes API server (tests/k8s_apiserver.py): its pods are local processes.
    With a PVC for checkpoints: a pod without one writes to the machine's own /checkpoints."""
    from k8s_apiserver import FakeCluster
    from test_kubernetes_backend import _post

    fake = FakeCluster()
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    claim = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
    status, _ = _post(
        fake, "/api/v1/namespaces/default/persistentvolumeclaims", {"metadata": {"name": "ckpt"}, "spec": claim}
    )
    assert status == 201
    yield fake
    fake.close()


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
    wait_for(
        lambda: job.state.step is not None and job.state.step >= 3, "three steps", job=job, give_up_when_finished=True
    )
    job.stop()
    assert job.wait(120) == "stopped"
    (run,) = runs(tracking)
    assert run.info.run_name == "stopped" and run.info.status == "KILLED"


def tracking_events(name: str) -> list[dict]:
    lines = LocalBackend().folder(name).events_file.read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == Kind.TRACKING]


def dashboard_html(job) -> str:
    """The live dashboard's header and its static twin, for a job that has ended."""
    from notebook_elastic.kernel.ui import Dashboard

    dash = Dashboard(job)
    try:
        wait_for(
            lambda: "ne-tracking" in dash.header.value, "the dashboard's header", job=job, give_up_when_finished=True
        )
        return dash.header.value + dash.snapshot()
    finally:
        dash.close()


@needs_mlflow
def test_where_the_run_is_tracked_is_an_event_every_view_reads_from_the_history(home, tmp_path, tracking):
    """A file store has no page to link to: its path and the `mlflow ui` command that serves it;
    the TensorBoard command for the job folder; in the events, the dashboard, summary(), the
    route's row and a re-attached handle."""
    pytest.importorskip("tensorboard")
    job = ne.launch(TRAIN, nnodes="1", name="linked", user_ns=namespace(total=5))
    assert job.wait(180) == "succeeded", job.summary()
    (run,) = runs(tracking)
    store = tmp_path / "store"

    told = {e["tracker"]: e for e in tracking_events("linked")}
    assert told["mlflow"]["run_id"] == run.info.run_id and told["mlflow"]["experiment_id"] == "0"
    assert told["mlflow"]["path"] == str(store)
    assert told["mlflow"]["command"] == f"mlflow ui --backend-store-uri {store.as_uri()}"
    folder = LocalBackend().folder("linked").path
    # The full path of the `tensorboard` beside this Python: any shell runs it, whatever its PATH.
    tensorboard = tensorboard_command()
    assert told["tensorboard"]["command"] == f"{tensorboard} --logdir {folder}"
    assert list((folder / "tensorboard").glob("events.out.tfevents.*"))  # what the command shows

    page = dashboard_html(job)
    # What a person reads (the commands are built of unbreakable names, with a break after each '/').
    shown = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert f"mlflow ui --backend-store-uri {store.as_uri()}" in shown and f"{tensorboard} --logdir {folder}" in shown
    assert run.info.run_id in page
    for handle in (job, ne.attach("linked")):  # the kernel that launched it, and a new one
        assert handle.wait(60) == "succeeded"
        assert f"MLflow run {run.info.run_id} in {store}: mlflow ui" in handle.summary()
        assert f"TensorBoard: {tensorboard} --logdir {folder}" in handle.summary()
    from notebook_elastic.server.routes import job_json

    (info,) = [i for i in LocalBackend().list() if i.name == "linked"]
    row = {t["tracker"]: t for t in job_json(info)["tracking"]}  # what the jobs panel shows
    assert row["mlflow"] == {
        "tracker": "mlflow",
        "label": f"MLflow run {run.info.run_id}",
        "url": None,
        "command": f"mlflow ui --backend-store-uri {store.as_uri()}",
        "path": str(store),
    }
    assert row["tensorboard"]["command"] == f"{tensorboard} --logdir {folder}"


class FakeMlflowServer:
    """The few routes of MLflow's REST API a run uses (create, get, log-batch, update), on loopback:
    the real MlflowClient talks to it over HTTP. MLflow's own server is not in mlflow-skinny,
    so this stands at that boundary; it records each request's Authorization header."""

    def __init__(self) -> None:
        import http.server
        import threading
        import uuid

        server = self
        self.authorization: list[str] = []
        self.runs: dict[str, dict] = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                from urllib.parse import parse_qs, urlsplit

                server.authorization.append(self.headers.get("Authorization") or "")
                run_id = parse_qs(urlsplit(self.path).query).get("run_id", [""])[0]
                if urlsplit(self.path).path.endswith("/runs/get") and run_id in server.runs:
                    self.reply({"run": {"info": server.runs[run_id], "data": {}}})
                else:
                    self.send_error(404)

            def reply(self, reply: dict) -> None:
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                server.authorization.append(self.headers.get("Authorization") or "")
                path = self.path.split("?")[0]
                if path.endswith("/runs/create"):
                    run_id = uuid.uuid4().hex
                    info = {
                        "run_id": run_id,
                        "run_uuid": run_id,
                        "run_name": body.get("run_name", ""),
                        "experiment_id": body.get("experiment_id", "0"),
                        "user_id": "test",
                        "status": "RUNNING",
                        "start_time": body.get("start_time", 0),
                        "artifact_uri": "",
                        "lifecycle_stage": "active",
                    }
                    server.runs[run_id] = info
                    reply = {"run": {"info": info, "data": {}}}
                elif path.endswith("/runs/update"):
                    info = server.runs[body["run_id"]]
                    info["status"] = body.get("status", info["status"])
                    reply = {"run_info": info}
                elif path.endswith("/runs/log-batch"):
                    reply = {}
                else:
                    self.send_error(404)
                    return
                self.reply(reply)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@needs_mlflow
def test_a_tracking_uri_with_a_password_links_the_run_without_it(home, tmp_path, monkeypatch, no_tracking_variables):
    import base64

    monkeypatch.chdir(tmp_path)
    server = FakeMlflowServer()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:hunter2@127.0.0.1:{server.port}/mlflow")
        job = ne.launch(TRAIN, nnodes="1", name="private", user_ns=namespace(total=5))
        assert job.wait(180) == "succeeded", job.summary()
        wait_for(lambda: not job_processes(home), "the supervisor to end the run", job=job)
    finally:
        server.close()
    (run_id,) = server.runs
    assert server.runs[run_id]["status"] == "FINISHED"
    # The run was logged with the credentials: they are MLflow's to use, never ours to show.
    assert f"Basic {base64.b64encode(b'alice:hunter2').decode()}" in server.authorization
    (told,) = [e for e in tracking_events("private") if e["tracker"] == "mlflow"]
    url = f"http://127.0.0.1:{server.port}/mlflow/#/experiments/0/runs/{run_id}"
    assert told["url"] == url and told["uri"] == f"http://127.0.0.1:{server.port}/mlflow"
    html = dashboard_html(job)
    assert f'href="{url}"' in html
    from notebook_elastic.server.routes import job_json

    (info,) = [i for i in LocalBackend().list() if i.name == "private"]
    (row,) = [t for t in job_json(info)["tracking"] if t["tracker"] == "mlflow"]  # the jobs panel's link
    assert row["url"] == url
    html += json.dumps(job_json(info))
    folder = LocalBackend().folder("private").path
    written = b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "secret.json")
    shown = html + job.summary() + json.dumps(told)
    for secret in ("hunter2", "alice"):
        assert secret not in shown and secret.encode() not in written


def test_credentials_in_a_tracking_uri_are_never_shown_and_links_are_escaped():
    from notebook_elastic.kernel.ui.render import tracking_html
    from notebook_elastic.runtime.tracking import mlflow_link, public_uri

    assert public_uri("https://u:p@mlflow.example.com/x?token=abc&workspace=2#/runs/1") == (
        "https://mlflow.example.com/x?workspace=2#/runs/1"
    )
    assert public_uri("https://h/cb#access_token=abc") == "https://h/cb"
    assert public_uri("postgresql://ml:pw@db/ml?sslmode=require") == "postgresql://db/ml?sslmode=require"
    assert public_uri("https://ghp_token@h/?access_token=z&X-Amz-Signature=s") == "https://h/"
    assert public_uri("sqlite:///mlflow.db") == "sqlite:///mlflow.db"
    link = mlflow_link("https://me:pw@host/?api_key=k", "1", "ab")
    assert link["url"] == "https://host/#/experiments/1/runs/ab" and "pw" not in json.dumps(link)
    # An event may come from a pod: a link that is not http(s) is not a link, text is escaped,
    # and a URI that kept its password in the event is stripped again when shown.
    html = tracking_html(
        [
            {"tracker": "wandb", "run_id": "<b>x</b>", "url": "javascript:alert(1)"},
            {"tracker": "mlflow", "run_id": "r", "uri": "sqlite:///m.db?token=t", "command": "mlflow ui ..."},
            {"tracker": "mlflow", "run_id": "s", "url": "https://u:secret@h/#/experiments/0/runs/s"},
        ]
    )
    assert "javascript:" not in html and "<b>x</b>" not in html and "&lt;b&gt;" not in html
    assert "token" not in html and "secret" not in html and 'href="https://h/#/experiments/0/runs/s"' in html


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

    wait_for(lambda: told(), "the tracker's failure", job=job, give_up_when_finished=True)
    step = job.state.step or 0
    wait_for(
        lambda: (job.state.step or 0) >= step + 5, "five more steps", job=job, give_up_when_finished=True
    )  # training goes on
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


def pod_tracked_job(cell: str, track: str, env: list[str], **options):
    """A one-pod CPU job on the fake cluster whose rank 0 logs to ``track``, configured as the
    user would (``--env``: the job's Secret)."""
    return ne.launch(cell, backend="kubernetes", nnodes="1", gpus=0, pvc="ckpt", track=track, env=env, **options)


def pod_mlflow_job(cell: str, store, **options):
    """... logging to an MLflow file store."""
    return pod_tracked_job(
        cell, "mlflow", [f"MLFLOW_TRACKING_URI={store.as_uri()}", "MLFLOW_ALLOW_FILE_STORE=true"], **options
    )


@needs_mlflow
@pytest.mark.slow
def test_on_kubernetes_rank_0s_pod_logs_every_step_to_one_mlflow_run_that_ends_with_training(
    cluster, tmp_path, monkeypatch
):
    """The job lives in the cluster, so does its run: rank 0's pod logs to MLflow itself, with
    the tracking URI given by --env (the job's Secret); a file store on the local disk here,
    since the fixture's pods are local processes, read back with MlflowClient. Its pod is
    preempted mid-run: the replacement's rank 0 logs on into the same run."""
    from test_kubernetes_backend import TRAIN as POD_TRAIN
    from test_kubernetes_backend import ns as pod_ns

    store = tmp_path / "store"
    job = pod_mlflow_job(POD_TRAIN, store, name="pod-tracked", checkpoint_every=1, user_ns=pod_ns(total=60))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this reader, as for the pod
    client = mlflow.MlflowClient(store.as_uri())

    def logged() -> set[int]:
        found = client.search_runs(["0"]) if store.exists() else []
        return {m.step for m in client.get_metric_history(found[0].info.run_id, "loss")} if found else set()

    wait_for(lambda: len(logged()) >= 3, "three steps in the run", job=job, give_up_when_finished=True)
    before = logged()
    job.preempt_node()
    assert job.wait(300) == "succeeded", job.summary()
    (run,) = client.search_runs(["0"])
    assert run.info.run_name == "pod-tracked" and run.info.status == "FINISHED"
    assert run.data.tags["notebook_elastic.backend"] == "kubernetes"
    history = client.get_metric_history(run.info.run_id, "loss")
    # What the first pod logged, and every step from the replacement's resume on (what the evicted
    # rank 0 still had queued when it was killed is lost; a step redone may be logged twice).
    resumed = [e.get("step") for e in job.events if e.kind == Kind.RESUMED][-1]
    assert before | set(range(resumed, 60)) <= {m.step for m in history} <= set(range(60))
    assert {m.value for m in client.get_metric_history(run.info.run_id, "job/world_size")} == {1}
    told = [e for e in job.events if e.kind == Kind.TRACKING]
    pods = {e.node for e in job.events if e.kind == Kind.NODE_JOINED}
    assert len(pods) == 2 and len(told) == 2, [e.describe() for e in job.events]  # each pod's rank 0 told it
    assert {e.get("run_id") for e in told} == {run.info.run_id}  # the same run
    assert told[-1].get("command") == f"mlflow ui --backend-store-uri {store.as_uri()}"
    assert f"MLflow run {run.info.run_id}" in job.summary()


@needs_mlflow
@pytest.mark.slow
def test_on_kubernetes_a_job_that_fails_for_good_ends_its_mlflow_run_failed(cluster, tmp_path, monkeypatch):
    """Nothing but rank 0's pod holds the run, and the notebook may be gone: a failure on the
    last attempt the restart budget allows ends it FAILED (old code: RUNNING forever). The
    first attempt's failure leaves it open, and the retry logs on into the same run."""
    from test_kubernetes_backend import TRAIN as POD_TRAIN
    from test_kubernetes_backend import ns as pod_ns

    store = tmp_path / "store"
    buggy = POD_TRAIN.replace("    time.sleep(0.05)", "    time.sleep(0.05)\n    if step >= 3: 1 / 0")
    job = pod_mlflow_job(buggy, store, name="pod-failing", max_restarts=1, user_ns=pod_ns(total=60))
    assert job.wait(300) == "failed", job.summary()
    assert "ZeroDivisionError" in (job.state.reason or ""), job.summary()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(store.as_uri())
    (run,) = client.search_runs(["0"])  # one run for both attempts
    assert run.info.status == "FAILED" and run.data.tags["notebook_elastic.run"]
    told = [e for e in job.events if e.kind == Kind.TRACKING]
    assert len(told) == 2 and {e.get("run_id") for e in told} == {run.info.run_id}  # each attempt's rank 0


@needs_mlflow
def test_a_rank_0_that_logs_on_into_an_ended_run_marks_it_running_again(tmp_path, monkeypatch):
    """A run ended FAILED by a rank 0 on its last attempt whose group then re-formed (a peer's
    departure, not charged) is running again when the new rank 0 logs on into it."""
    from notebook_elastic.contract import protocol
    from notebook_elastic.runtime import pod_tracking

    store = tmp_path / "store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv(protocol.ENV_JOB, "again")
    monkeypatch.setenv(protocol.ENV_RUN, "again-run-1")
    client = mlflow.MlflowClient(store.as_uri())
    ended = client.create_run("0", tags={"notebook_elastic.run": "again-run-1"}).info.run_id
    client.set_terminated(ended, "FAILED")
    pod = pod_tracking.PodRun("mlflow")
    pod.observe(7, {"loss": 0.5})
    deadline = time.monotonic() + 60
    while client.get_run(ended).info.status != "RUNNING":
        assert time.monotonic() < deadline and not pod.failed
        time.sleep(0.05)
    pod.end(finished=True)
    assert client.get_run(ended).info.status == "FINISHED" and len(client.search_runs(["0"])) == 1
    assert [(m.step, m.value) for m in client.get_metric_history(ended, "loss")] == [(7, 0.5)]


@needs_mlflow
@pytest.mark.slow
def test_on_kubernetes_an_image_without_the_tracker_is_one_event_and_training_goes_on(cluster, tmp_path):
    from test_kubernetes_backend import TRAIN as POD_TRAIN
    from test_kubernetes_backend import ns as pod_ns

    # The image lacks mlflow: a package that cannot be imported, first on the pods' path.
    missing = tmp_path / "image-site" / "mlflow"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'mlflow\'", name="mlflow")\n')
    path = os.pathsep.join([str(missing.parent), os.environ.get("PYTHONPATH", "")])
    job = pod_tracked_job(
        POD_TRAIN,
        "mlflow",
        [f"MLFLOW_TRACKING_URI={(tmp_path / 'store').as_uri()}", f"PYTHONPATH={path}"],
        name="pod-untracked",
        user_ns=pod_ns(total=10),
    )
    assert job.wait(300) == "succeeded", job.summary()
    told = [e for e in job.events if e.kind == Kind.ERROR and e.get("error") == "tracker"]
    assert len(told) == 1, [e.describe() for e in told]
    assert "the image has no mlflow (or mlflow-skinny) package" in told[0].get("message")
    assert job.state.step == 9 and not (tmp_path / "store").exists()


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
    # Offline there is no page: the run's folder and the command that uploads it.
    (told,) = [e for e in tracking_events("wandb-run") if e["tracker"] == "wandb"]
    assert told["offline"] and told["run_id"] == run.run_id and told["path"] == str(run_file.parent)
    assert told["command"] == f"wandb sync {run_file.parent}"
    assert f"W&B run {run.run_id} (offline) in {run_file.parent}: wandb sync" in job.summary()


@pytest.mark.slow
def test_on_kubernetes_rank_0s_pod_logs_every_step_to_an_offline_wandb_run_that_ends_with_training(cluster, tmp_path):
    """W&B in pods: the project and mode come through --env (the job's Secret); offline, the
    run is written under WANDB_DIR, read back from its records."""
    pytest.importorskip("wandb")
    from test_kubernetes_backend import TRAIN as POD_TRAIN
    from test_kubernetes_backend import ns as pod_ns

    folder = tmp_path / "wandb-dir"
    folder.mkdir()
    job = pod_tracked_job(
        POD_TRAIN,
        "wandb",
        ["WANDB_PROJECT=pods", "WANDB_MODE=offline", f"WANDB_DIR={folder}", "WANDB_SILENT=true"],
        name="pod-wandb",
        user_ns=pod_ns(total=20),
    )
    assert job.wait(300) == "succeeded", job.summary()
    (run_file,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"][:1]
    assert run.display_name == "pod-wandb" and run.project == "pods"
    logged = [
        {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert sorted(h["_step"] for h in logged if "loss" in h) == list(range(20))  # every step, once
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0
    (told,) = [e for e in job.events if e.kind == Kind.TRACKING and e.get("tracker") == "wandb"]
    assert told.get("offline") and told.get("run_id") == run.run_id


def test_the_sinks_flush_returns_once_every_event_put_before_it_is_folded_and_seen(tmp_path):
    """What the trackers' end waits on (instead of polling the queue): a slow observer still
    has every event before it when flush returns; a closed sink's flush says False at once."""
    import threading
    import time as _time

    from notebook_elastic.contract.events import Event
    from notebook_elastic.contract.job_state import JobState
    from notebook_elastic.supervisor.sink import EventSink

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

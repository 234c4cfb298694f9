"""The jobs panel's cost: GET /notebook-elastic/api/jobs with 50 jobs, and the bundle size.

Targets (issue 6): <= 20 ms server time for `GET jobs` with 50 jobs in the registry; the
extension's bundle adds <= 300 KB to the page. The 50 jobs are copies of a real finished
job's folder plus one real running job (so the liveness check of a supervisor is paid
too), served by a real `jupyter server` with the extension enabled; the server time is the
handler's own measurement, the round trip is measured by the client.
usage: python benchmarks/jobs_panel.py
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import browser_figures, median, p95, report, row, stop_all_jobs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TRAIN = """
import time
model = torch.nn.Linear(2, 1)
state = elastic.State(model=model)
for step in state.steps(TOTAL):
    elastic.report(step=step, loss=1.0 / (step + 1))
    state.commit()
    time.sleep(0.05)
"""


def make_registry(home: Path) -> None:
    import torch

    import notebook_elastic as ne
    import notebook_elastic.runtime as runtime

    job = ne.launch(TRAIN, nnodes="1", name="template", user_ns={"torch": torch, "elastic": runtime, "TOTAL": 30})
    assert job.wait(120) == "succeeded"
    jobs = home / "jobs"
    for i in range(49):
        target = jobs / f"copy-{i:02d}"
        shutil.copytree(jobs / "template", target)
        spec = json.loads((target / "spec.json").read_text())
        spec["name"] = target.name
        (target / "spec.json").write_text(json.dumps(spec))
    ne.launch(TRAIN, nnodes="1", name="live", user_ns={"torch": torch, "elastic": runtime, "TOTAL": 100_000})


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="ne-bench-panel-"))
    os.environ["NOTEBOOK_ELASTIC_HOME"] = str(home)
    try:
        run(home)
    finally:
        stop_all_jobs()
        shutil.rmtree(home, ignore_errors=True)


def run(home: Path) -> None:
    make_registry(home)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(8)
    log = open(home / "server.log", "wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={token}",
            "--no-browser",
            "--allow-root",
            f"--ServerApp.root_dir={home}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    url = f"http://127.0.0.1:{port}/notebook-elastic/api/jobs"
    headers = {"Authorization": f"token {token}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError((home / "server.log").read_text()[-2000:]) from None
                time.sleep(0.3)
        server_ms, round_trip_ms, count = [], [], 0
        for _ in range(60):
            started = time.perf_counter()
            body = json.loads(urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10).read())
            round_trip_ms.append((time.perf_counter() - started) * 1000)
            server_ms.append(body["server_ms"])
            count = len(body["jobs"])
    finally:
        server.terminate()
        server.wait(20)
    static = REPO / "notebook_elastic" / "labextension" / "static"
    files = [p for p in static.rglob("*") if p.is_file()]
    raw = sum(p.stat().st_size for p in files)
    zipped = sum(len(gzip.compress(p.read_bytes())) for p in files)
    rows = [
        row("jobs listed", count, "jobs"),
        row("GET jobs, server time, median of 60", median(server_ms), "ms", "<= 20 ms", median(server_ms) <= 20),
        row("GET jobs, server time, p95", p95(server_ms), "ms"),
        row("GET jobs, round trip on loopback, median", median(round_trip_ms), "ms"),
        row("labextension bundle (static/, as served)", raw / 1000, "KB", "<= 300 KB", raw <= 300_000),
        row("labextension bundle, gzipped", zipped / 1000, "KB"),
    ]
    b = browser_figures("panel_browser")
    if b:
        listed = b["listed_after_launch_s"]
        rows.append(
            row(f"job listed in the panel after launch (browser test, {b['when']})", listed, "s", "<= 2 s", listed <= 2)
        )
        rows.append(row("  preemption drill healed after (browser test)", b["preemption_healed_s"], "s"))
    report(
        "jobs_panel",
        rows,
        notes="49 copies of a real finished job folder + 1 running job; real jupyter_server with the extension",
    )


if __name__ == "__main__":
    main()

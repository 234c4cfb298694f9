"""A real JupyterLab on 127.0.0.1 and Debian's Chromium driven by Playwright, for UI tests."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        message = f"{CHROMIUM} is missing: apt-get install chromium chromium-driver (scripts/test.sh does it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def free_port() -> int:
    """A port free right now. Another process may take it before ours binds it: callers
    must tell their server not to move elsewhere and retry on conflict (jupyter_lab does)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, root: Path, url: str, token: str, log: Path) -> None:
        self.root, self.url, self.token, self.log = root, url, token, log

    def page_url(self, path: str) -> str:
        return f"{self.url}/{path}?token={self.token}"

    def api(self, path: str, method: str = "GET", body: dict | None = None) -> tuple[int, object]:
        request = urllib.request.Request(
            f"{self.url}/{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, raw.decode(errors="replace")


@contextmanager
def jupyter_lab(root: Path, env: dict[str, str]):
    """Start `jupyter lab` on 127.0.0.1 with a token; yield a ``Lab``; stop it.

    Jupyter is told its port and not to move to another one when it is taken
    (port_retries=0): a port lost to another process between free_port() and the bind ends
    the attempt at once, and the next attempt takes a new port. Ready means our own server
    answers with our token on that very port."""
    token = secrets.token_hex(16)
    settings = root / "lab-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True, exist_ok=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    log = root / "jupyter-lab.log"
    full_env = dict(os.environ, **env)
    full_env.update(
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
    )
    proc = None
    try:
        for _attempt in range(5):
            port = free_port()
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "jupyterlab",
                        "--no-browser",
                        f"--port={port}",
                        "--ServerApp.port_retries=0",
                        "--ServerApp.ip=127.0.0.1",
                        f"--IdentityProvider.token={token}",
                        f"--ServerApp.root_dir={root}",
                        "--LabApp.expose_app_in_browser=True",
                        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                        "--allow-root",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=full_env,
                    cwd=root,
                )
            lab = Lab(root, f"http://127.0.0.1:{port}", token, log)
            if _wait_until_serving(lab, proc):
                break
            if "already in use" not in log.read_text(errors="replace"):
                raise RuntimeError(f"jupyter lab did not start:\n{log.read_text()[-3000:]}")
        else:
            raise RuntimeError(f"jupyter lab found no free port in 5 attempts:\n{log.read_text()[-3000:]}")
        yield lab
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_until_serving(lab: Lab, proc: subprocess.Popen, timeout_s: float = 180) -> bool:
    """True once ``lab`` answers api/status with our token; False if the process exited
    (its port was taken); raises if neither happens within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if lab.api("api/status")[0] == 200:
                return True
        except OSError:
            pass
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"jupyter lab did not answer within {timeout_s:.0f} s:\n{lab.log.read_text()[-3000:]}")
        time.sleep(0.3)


@contextmanager
def chromium_page(artifacts: Path, width: int = 1400):
    """A Playwright page in Debian's Chromium with a fresh profile; console errors collected."""
    from playwright.sync_api import sync_playwright

    profile = artifacts / "chromium-profile"
    shutil.rmtree(profile, ignore_errors=True)
    with sync_playwright() as p:
        # A fresh --user-data-dir, the way Playwright takes it.
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=CHROMIUM_FLAGS, viewport={"width": width, "height": 1000}
        )
        page = context.new_page()
        page.console_errors = []  # type: ignore[attr-defined]
        page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
        page.on("pageerror", lambda e: page.console_errors.append(str(e)))
        try:
            yield page
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


def worktree_extension_env(root: Path) -> dict[str, str]:
    """Environment for ``jupyter_lab`` that serves this checkout's built extension
    (notebook_elastic/labextension, if built here) ahead of any installed copy: JupyterLab
    takes the first labextensions folder on JUPYTER_PATH that has the name."""
    from conftest import REPO

    built = REPO / "notebook_elastic" / "labextension"
    if not (built / "package.json").exists():
        return {}
    data = root / "jupyter-data" / "labextensions"
    data.mkdir(parents=True, exist_ok=True)
    (data / "notebook-elastic").symlink_to(built)
    return {"JUPYTER_PATH": str(root / "jupyter-data")}


def save_widget_state(root: Path) -> None:
    """JupyterLab's "Save Widget State Automatically", on: the notebook file keeps the
    widget models, as a user who wants dashboards to survive a reload sets it."""
    folder = root / "lab-settings" / "@jupyter-widgets" / "jupyterlab-manager"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plugin.jupyterlab-settings").write_text(json.dumps({"saveState": True}))


def record_figures(name: str, figures: dict) -> Path:
    """Write what a browser test measured to test-artifacts/NAME.json (ignored by git; the
    benchmarks show it beside their own rows). Measured, never asserted."""
    from conftest import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "when": time.strftime("%Y-%m-%d %H:%M:%S"), **figures}, indent=1))
    return path


def training_cells(flags: str) -> list[str]:
    """A notebook's cells that launch a long-running DDP job on the local backend:
    `%%elastic_train FLAGS` over a small model that reports its loss every step."""
    return [
        "%load_ext notebook_elastic",
        "import time\nimport torch",
        f"%%elastic_train {flags}\n"
        + """model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(100000):
    loss = ddp(torch.randn(8, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item())
    time.sleep(0.05)""",
    ]


def write_notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))

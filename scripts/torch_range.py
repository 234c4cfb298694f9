"""CI's proof of the torch range pyproject declares: the tests marked ``torch_contract`` run on
the oldest and the newest torch of it (``[tool.notebook-elastic].torch-ends``), each in a
virtual environment of its own, beside the whole suite on the set-up's torch.

    .venv/bin/python scripts/torch_range.py            # both ends (what .ci/run does)
    .venv/bin/python scripts/torch_range.py 2.4.1      # one of them
    .venv/bin/python scripts/torch_range.py -- -k joiner   # extra pytest arguments

The environments are kept under ``$NOTEBOOK_ELASTIC_TORCH_ENVS`` (default
``~/.cache/notebook-elastic``) and reused while pyproject's dependencies are unchanged; on a
fresh machine each is made from PyPI, whose torch for Linux is a CUDA build (3 to 5 GB with its
CUDA libraries, a few minutes each). The project itself is not installed there: the tests import
it from this checkout (``PYTHONPATH``), so a cached environment serves any clone.

The environments are made first, one after the other; then the ends run at once (each is mostly
jobs waiting on their processes: one after the other, they were the test command's longest lane).
Prints one line per step and a table at the end (torch, tests, wall time), writes it to
``build/torch_range.json``, and exits non-zero when a run fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def say(text: str) -> None:
    print(f"torch-range: {text}", flush=True)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements(project: dict) -> list[str]:
    """What the contract tests need beside torch: the package's dependencies and its test
    extra, with the extra's own ``notebook-elastic[...]`` expanded (the package is not installed)."""
    deps = project["project"]["dependencies"]
    extras = project["project"]["optional-dependencies"]
    wanted, out = ["test"], []
    while wanted:
        for req in extras[wanted.pop()]:
            m = re.fullmatch(r"notebook-elastic\[([^\]]+)\]", req.replace(" ", ""))
            if m:
                wanted.extend(m.group(1).split(","))
            else:
                out.append(req)
    return sorted({r for r in deps + out if not re.match(r"torch\b", r)})


def pip_env() -> dict[str, str]:
    """pip as on any machine: this machine's own pip settings (a cap on torch's version, local
    wheel folders) are not read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_PROGRESS_BAR="off")
    return env


def run_pip(python: Path, *args: str) -> None:
    """pip, its fetching and installing lines shown as they come (not block-buffered)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(python), "-m", "pip", *args],
        env=pip_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(("Collecting", "Downloading", "  Downloading", "Installing", "Successfully")):
            print(f"  pip: {line.rstrip()[:150]}", flush=True)
    if proc.wait() != 0:
        sys.stderr.write("".join(lines[-60:]))
        raise SystemExit(f"torch-range: pip {' '.join(args[:3])} ... failed in {python.parent.parent}")
    say(f"pip done in {time.monotonic() - started:.0f} s")


def environment(version: str, reqs: list[str], envs: Path) -> tuple[Path, bool]:
    """The virtual environment of torch ``version`` with ``reqs``: made, brought up to date, or
    reused as it is. Returns its python and whether anything was installed."""
    tag = f"py{sys.version_info.major}.{sys.version_info.minor}"
    venv = envs / f"torch-{version}-{tag}"
    python = venv / "bin" / "python"
    want = hashlib.sha256(json.dumps([version, reqs]).encode()).hexdigest()
    stamp = venv / ".notebook-elastic-installed"
    if python.exists() and stamp.exists() and stamp.read_text() == want:
        return python, False
    if not python.exists() or subprocess.run([str(python), "-c", "pass"], capture_output=True).returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        say(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    say(f"installing torch=={version} and the test dependencies into {venv} (a CUDA build from PyPI on Linux: large)")
    run_pip(python, "install", "--upgrade", "pip")
    run_pip(python, "install", f"torch=={version}", *reqs)
    got = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if got.returncode != 0 or not got.stdout.strip().startswith(version):
        raise SystemExit(
            f"torch-range: {venv} holds torch {got.stdout.strip() or '(none)'}, not {version}: {got.stderr[-500:]}"
        )
    stamp.write_text(want)
    return python, True


def newest_served() -> str | None:
    """The newest torch release the registry serves, or None when it cannot be asked."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", "torch"],
            env=pip_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^torch \(([^)]+)\)", done.stdout, re.M)
    return m.group(1) if m else None


def minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def run_contract(python: Path, version: str, pytest_args: list[str]) -> tuple[int, float, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # Two workers: the subset is mostly multi-node jobs, and three of them at once on 2 cores
    # starve their agents' heartbeats (split rounds; the whole suite mixes them with light tests).
    workers = os.environ.get("NOTEBOOK_ELASTIC_TORCH_WORKERS", "2")
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-m", "torch_contract", "-q", "-ra"]
    cmd += ["-n", workers, "--dist", "worksteal", *pytest_args]
    say(f"torch {version}: {' '.join(cmd[1:])}")
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    last = ""
    for line in proc.stdout:
        print(f"  [{version}] {line.rstrip()}", flush=True)
        if line.strip():
            last = line.strip()
    code = proc.wait()
    return code, time.monotonic() - started, last


def main(argv: list[str]) -> int:
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    picked = argv[: argv.index("--")] if "--" in argv else argv
    if any(a in ("-h", "--help") for a in picked):
        print(__doc__)
        return 0
    wrong = [a for a in picked if not re.fullmatch(r"\d+\.\d+(\.\d+)?", a)]
    if wrong:
        print(f"torch_range.py: {wrong[0]!r} is not a torch version like 2.4.1 (pytest's arguments go after --)")
        return 2
    project = pyproject()
    ends = project["tool"]["notebook-elastic"]["torch-ends"]
    versions = picked or ends
    envs = Path(os.environ.get("NOTEBOOK_ELASTIC_TORCH_ENVS") or Path.home() / ".cache" / "notebook-elastic")
    envs.mkdir(parents=True, exist_ok=True)
    newest = newest_served()
    if newest and minor(newest) > minor(ends[-1]):
        say(
            f"WARNING: the registry serves torch {newest}, newer than the range's newest end {ends[-1]}: "
            "run the contract on it and widen pyproject's range"
        )
    reqs = requirements(project)
    # The environments first, one after the other (on a fresh machine each is a download); then
    # the ends' runs at once: each is mostly jobs waiting on their processes, and one after the
    # other they were the longest lane of the test command.
    made = []
    for version in versions:
        started = time.monotonic()
        python, installed = environment(version, reqs, envs)
        made.append((version, python, installed, time.monotonic() - started))
    results: dict[str, tuple[int, float, str]] = {}

    def run(version: str, python: Path) -> None:
        results[version] = run_contract(python, version, pytest_args)

    threads = [threading.Thread(target=run, args=(version, python)) for version, python, _i, _s in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows, failed = [], False
    for version, _python, installed, setup_s in made:
        code, wall_s, last = results.get(version, (1, 0.0, "did not run"))
        failed |= code != 0
        rows.append(
            {
                "torch": version,
                "result": last,
                "exit": code,
                "tests_s": round(wall_s, 1),
                "setup_s": round(setup_s, 1),
                "env": "made" if installed else "reused",
            }
        )
    say("the contract subset on each end of the declared range:")
    print(f"  {'torch':<8} {'env':<7} {'set-up s':>8} {'tests s':>8}  result (the ends ran at once)", flush=True)
    for r in rows:
        print(f"  {r['torch']:<8} {r['env']:<7} {r['setup_s']:>8.0f} {r['tests_s']:>8.0f}  {r['result']}", flush=True)
    (ROOT / "build").mkdir(exist_ok=True)
    (ROOT / "build" / "torch_range.json").write_text(
        json.dumps({"ends": ends, "newest_served": newest, "runs": rows}, indent=2)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

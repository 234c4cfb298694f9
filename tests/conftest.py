"""Shared fixtures: a real IPython shell, a private job home, and the no-leftover check.

Every test runs with ``NOTEBOOK_ELASTIC_TEST_ID=<unique>`` and a private ``TMPDIR`` in its
environment. Every process the test causes inherits both: jobs (supervisor, agents, zygotes,
workers), the fake kubelet's pods (it passes them through), JupyterLab and its kernels,
nbclient kernels; the warm pool's forks (whose environment reads as the pool's) are named in
their job folders instead. After the test, the process table is scanned for the marker (and
the job folders under the test's folders for names): what is still
there after a grace period long enough for a correct but slow cleanup on a loaded 2-core
machine is printed, SIGKILLed (also when the test failed) and fails the test. Zygote sockets
left in the test's temp folder or fixture folders are listed and fail the test (see
STRICT_SOCKETS).

The same check holds the event contract: every event in the history of every local job the
test ran (``events.jsonl`` under its folders) must be of a known kind and match that kind's
schema in ``notebook_elastic/contract/event_types.py`` (``event_schemas()``).
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"

TEST_ID_ENV = "NOTEBOOK_ELASTIC_TEST_ID"  # tests/k8s_apiserver.py's kubelet passes it to pods
LEFTOVER_GRACE_S = 60.0  # a correct cleanup on 2 loaded cores can take this long; polled, not slept
SYSTEM_TMP = tempfile.gettempdir()
# A Unix socket file left in a test's folders fails the test. Zygote sockets are abstract (no
# file: tests/test_warm.py), so a socket file is a leak to find (issue #15), not a known one;
# NOTEBOOK_ELASTIC_STRICT_SOCKETS=0 only tells instead, for hunting several at once.
STRICT_SOCKETS = (
    os.environ.get("NOTEBOOK_ELASTIC_STRICT_SOCKETS", "1") != "0"
)  # read once: this process keeps the real temp folder
_test_numbers = itertools.count()


# --- the process table ---------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, waiting for its parent to reap it, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()) or "?"
    except psutil.Error:
        return "?"


def processes_with_env(entry: str, folders: tuple = ()) -> list[int]:
    """Live processes (not this one) whose environment holds exactly ``KEY=VALUE`` ``entry``,
    and those named in the job folders under ``folders`` (the warm pool's forks and theirs,
    whose environment reads as the pool's: notebook_elastic/plumbing/owned.py)."""
    key, _, value = entry.partition("=")
    return _processes(lambda env: env.get(key) == value, folders)


def _processes(matches, folders: tuple) -> list[int]:
    """Live processes (not this one) whose environment ``matches``, and those named in the
    job folders under ``folders``."""
    found = registered_under(*folders) - {os.getpid()}
    for proc in psutil.process_iter():
        if proc.pid == os.getpid() or proc.pid in found:
            continue
        try:
            if matches(proc.environ()) and pid_alive(proc.pid):
                found.add(proc.pid)
        except psutil.Error:  # gone, or another user's
            continue
    return sorted(found)


def registered_under(*folders: Path | str | None) -> set[int]:
    """Live processes named in the job folders under ``folders`` (``.procs/``)."""
    from notebook_elastic.plumbing import owned

    found: set[int] = set()
    for folder in {str(f) for f in folders if f and os.path.isdir(f)}:
        depth = folder.rstrip(os.sep).count(os.sep)
        for root, dirs, _files in os.walk(folder):
            if owned.FOLDER in dirs:
                found |= set(owned.registered(root))
            if root.count(os.sep) - depth >= 5:  # HOME/jobs/NAME (or HOME/USER/jobs/NAME) is shallow
                dirs.clear()
            else:
                dirs[:] = [d for d in dirs if d not in (owned.FOLDER, ".venv", "node_modules", "checkpoints")]
    return found


def wait_until_gone(find, grace_s: float = LEFTOVER_GRACE_S) -> list[int]:
    """Poll ``find()`` until it returns nothing (at once when clean) or ``grace_s`` passes;
    return what is left then."""
    deadline = time.monotonic() + grace_s
    while True:
        found = find()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def kill_all(find) -> None:
    """SIGSTOP everything ``find()`` returns (nothing can respawn a child any more), then
    SIGKILL it, until nothing is found."""
    for _ in range(20):
        pids = find()
        if not pids:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        time.sleep(0.1)


def job_processes(home: Path, grace_s: float = LEFTOVER_GRACE_S) -> list[int]:
    """Live processes of the jobs under ``home`` (supervisors, agents, zygotes, workers: they
    carry their job folder in their environment, or the folder names them), after waiting up
    to ``grace_s`` for them to exit; ``[]`` as soon as there are none."""
    prefix = f"{home}{os.sep}"

    def find() -> list[int]:
        return _processes(lambda env: env.get("NOTEBOOK_ELASTIC_JOB_DIR", "").startswith(prefix), (home,))

    return wait_until_gone(find, grace_s)


# --- leftover sockets --------------------------------------------------------------------


def stray_sockets(*folders: Path | str | None) -> list[str]:
    """Unix sockets under ``folders`` (zygote sockets live in the temp folder or, later, in
    the job folder): a socket whose server exited cleanly has been removed."""
    found = []
    for folder in folders:
        if folder is None or not os.path.isdir(folder):
            continue
        for root, _dirs, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        found.append(path)
                except OSError:
                    pass
    return sorted(set(found))


# --- fixtures ----------------------------------------------------------------------------


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "leaves_sockets(reason): the test knowingly leaves zygote sockets behind (the check tells, not fails)",
    )
    config.addinivalue_line(
        "markers",
        "breaks_contract(reason): the test sends malformed events on purpose (the contract check skips it)",
    )


#: The quick tier (``-m quick``; scripts/test.sh runs it first): these modules' tests that are not
#: slow launch no job, and the tier runs in under a minute on 2 cores, for the edit loop.
QUICK_MODULES = frozenset(
    {
        "test_claims.py",
        "test_composition.py",
        "test_contract.py",
        "test_control.py",
        "test_deadline.py",
        "test_docs.py",
        "test_docs_true.py",
        "test_types.py",
        "test_typed_seams.py",
        "test_events.py",
        "test_folder_records.py",
        "test_job_state.py",
        "test_membership.py",
        "test_kubernetes_manifests.py",
        "test_launch_api.py",
        "test_layers.py",
        "test_local_modules.py",
        "test_log.py",
        "test_module_size.py",
        "test_options.py",
        "test_packaging.py",
        "test_plan.py",
        "test_security.py",
        "test_store_server.py",
        "test_term.py",
        "test_torch_compat.py",
        "test_waits.py",
        "test_words.py",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in QUICK_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.quick)


class LongTests:
    """In the process that shows the run (xdist's controller, or the only one): a line for each
    test still running after ``LONG_TEST_S``, and again every minute, so a quiet stretch of the
    suite says which tests it is waiting for (#30 item 5)."""

    LONG_TEST_S = float(os.environ.get("NOTEBOOK_ELASTIC_LONG_TEST_S", "60"))

    def __init__(self, config) -> None:
        self.reporter = config.pluginmanager.get_plugin("terminalreporter")
        self.started: dict[str, float] = {}
        self.told: dict[str, float] = {}
        self.stop = False
        import threading

        threading.Thread(target=self._watch, name="long-tests", daemon=True).start()

    def pytest_runtest_logstart(self, nodeid, location):
        self.started[nodeid] = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid, location):
        self.started.pop(nodeid, None)
        self.told.pop(nodeid, None)

    def _watch(self) -> None:
        while not self.stop:
            time.sleep(5)
            now = time.monotonic()
            for nodeid, began in list(self.started.items()):
                ran = now - began
                if ran >= self.LONG_TEST_S and now - self.told.get(nodeid, 0) >= 60:
                    self.told[nodeid] = now
                    if self.reporter is not None:
                        self.reporter.write_line(f"  still running after {ran:.0f} s: {nodeid}")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    config = session.config
    # In the process that reports (not an xdist worker), under -q as well (CI runs -q -ra).
    if not hasattr(config, "workerinput") and config.getoption("verbose") > -2:
        config.pluginmanager.register(LongTests(config), "notebook-elastic-long-tests")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item._ne_failed = True  # the leftover check then kills at once instead of waiting
    return report


@pytest.fixture(autouse=True)
def no_leftovers(request):
    """The marker, a private TMPDIR, and after the test the check that nothing is left."""
    test_id = f"{os.getpid()}-{next(_test_numbers)}-{secrets.token_hex(4)}"
    tmp = tempfile.mkdtemp(prefix="ne-t-", dir=SYSTEM_TMP)  # short: Unix socket paths are <= 107 bytes
    saved = {key: os.environ.get(key) for key in (TEST_ID_ENV, "TMPDIR")}
    os.environ[TEST_ID_ENV] = test_id
    os.environ["TMPDIR"] = tmp
    try:
        yield test_id
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        problems = _check_and_clean(request, test_id, tmp)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _check_and_clean(request, test_id: str, tmp: str) -> list[str]:
    folders = [tmp] + [request.node.funcargs.get(name) for name in ("home", "tmp_path")]

    def find() -> list[int]:
        return processes_with_env(f"{TEST_ID_ENV}={test_id}", tuple(folders))

    failed = getattr(request.node, "_ne_failed", False)
    left = wait_until_gone(find, 0 if failed else LEFTOVER_GRACE_S)
    problems = []
    if left:
        listing = "\n".join(f"  {pid}: {cmdline(pid)[:300]}" for pid in left)
        # Printed also when the test failed anyway: a job it never stopped is killed, not kept.
        print(f"processes left behind by {request.node.nodeid} (killed):\n{listing}", file=sys.stderr)
        if not failed:
            problems.append(f"{len(left)} process(es) left behind {LEFTOVER_GRACE_S:.0f} s after the test:\n{listing}")
    kill_all(find)
    sockets = stray_sockets(*folders)
    known = request.node.get_closest_marker("leaves_sockets")
    if sockets and known:  # declared by the test, with the reason: told, not failed
        print(f"sockets left behind, as declared ({known.args[0]}):\n  " + "\n  ".join(sockets), file=sys.stderr)
    elif sockets and not left and not failed:  # a SIGKILLed zygote cannot clean up: told above
        message = "sockets left behind (a zygote that did not clean up?):\n  " + "\n  ".join(sockets)
        if STRICT_SOCKETS:
            problems.append(message)
        else:
            print(message, file=sys.stderr)
    if not failed and request.node.get_closest_marker("breaks_contract") is None:
        problems.extend(contract_problems(*folders))
    shutil.rmtree(tmp, ignore_errors=True)
    return problems


_VALIDATORS: dict = {}  # one validator per event kind, built once a run


def _validators() -> dict:
    import jsonschema

    from notebook_elastic.contract.event_types import event_schemas

    if not _VALIDATORS:
        _VALIDATORS.update({k.value: jsonschema.Draft202012Validator(s) for k, s in event_schemas().items()})
    return _VALIDATORS


def events_breaking_contract(events) -> list[str]:
    """What breaks the event contract in ``events`` (``Event`` objects: a job handle's, a
    cluster job's that no history on disk keeps), one sentence each."""
    validators = _validators()
    found = []
    for event in events:
        validator = validators.get(str(event.kind))
        if validator is None:
            found.append(f"kind {event.kind!r} has no class in contract/event_types.py")
            continue
        for error in validator.iter_errors(event.data):
            where = "/".join(str(p) for p in error.absolute_path) or "(event)"
            found.append(f"{event.kind} {where}: {error.message}")
    return found


def contract_problems(*folders: Path | str | None, limit: int = 5) -> list[str]:
    """Events in the job histories under ``folders`` that break the event contract."""
    import json

    validators = _validators()
    found: list[str] = []
    for folder in {str(f) for f in folders if f}:
        for history in Path(folder).rglob("events.jsonl"):
            try:
                lines = history.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for number, line in enumerate(lines, 1):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line torn by a full disk is the writer's to tell, not the contract's
                kind = event.get("kind")
                validator = validators.get(kind)
                if validator is None:
                    found.append(f"{history}:{number}: kind {kind!r} has no class in contract/event_types.py")
                    continue
                data = {k: v for k, v in event.items() if k not in ("kind", "t", "node")}
                for error in validator.iter_errors(data):
                    where = "/".join(str(p) for p in error.absolute_path) or "(event)"
                    found.append(f"{history}:{number}: {kind} {where}: {error.message}")
            if len(found) >= limit:
                break
    if found:
        return ["events break the contract (contract/event_types.py):\n  " + "\n  ".join(found[:limit])]
    return []


@pytest.fixture(scope="session", autouse=True)
def no_leftover_hosts():
    """At the end: no network namespace, link or /etc/hosts line the two-host fixture
    (tests/slurm_hosts.py) made is left (it removes them whatever happened; this says so if not)."""
    yield
    hosts = sys.modules.get("slurm_hosts")
    left = hosts.leftovers() if hosts is not None else []
    if left:
        pytest.fail(
            "left behind by the two-host fixture (tests/slurm_hosts.py):\n  " + "\n  ".join(left), pytrace=False
        )


@pytest.fixture(scope="session", autouse=True)
def warm_pool(tmp_path_factory):
    """One warm pool per test process (pool/__init__.py), started outside any test (it carries
    no test's marker, and stays up between tests), stopped at the end. Every job, kernel and
    JupyterLab the tests start inherits its name; the processes it forks are named in their job
    folders (``plumbing/owned.py``), so the leftover check sees them as it sees cold ones."""
    from notebook_elastic import pool
    from notebook_elastic.contract import protocol

    if not pool.enabled():
        yield None
        return
    name = f"@notebook-elastic-pool-test-{os.getpid()}-{secrets.token_hex(8)}"
    env = {k: v for k, v in os.environ.items() if k != TEST_ID_ENV}
    env[protocol.ENV_POOL_IDLE_S] = "0"
    env[protocol.ENV_POOL_OWNER] = str(os.getpid())  # a killed pytest takes its pool with it
    proc = pool.start(name, env, tmp_path_factory.mktemp("pool") / "pool.log")
    os.environ[protocol.ENV_POOL] = name
    try:
        yield name
    finally:
        os.environ.pop(protocol.ENV_POOL, None)
        proc.terminate()
        try:
            proc.wait(120)  # it may still be importing torch on loaded cores
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def _ipython():
    import gc

    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    # Each test's shell.reset() runs a full collection: over this process's heap (torch, the
    # suite's modules) 0.1 s a reset, 2 a test. What is here now lives to the end anyway.
    gc.freeze()
    return shell


@pytest.fixture
def shell(_ipython, tmp_path, monkeypatch):
    """A real InteractiveShell with an empty namespace and history, and our extension loaded."""
    monkeypatch.chdir(tmp_path)
    _ipython.reset(new_session=True)
    _ipython.execution_count = 1
    from notebook_elastic.kernel.magics import load_ipython_extension

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
def ckpt(tmp_path, monkeypatch):
    """A checkpoint folder for State used in this process, as rank 0 of a one-rank world that
    saves at every commit: these tests are about what each commit writes, not about how often
    State chooses to save (that has its own tests)."""
    from notebook_elastic.contract import protocol

    folder = tmp_path / "ckpt"
    monkeypatch.setenv(protocol.ENV_CHECKPOINT_DIR, str(folder))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", protocol.ENV_ROUND, protocol.ENV_RDZV_EPOCH):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(protocol.ENV_CHECKPOINT_EVERY, "1")
    return folder


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private NOTEBOOK_ELASTIC_HOME (the leftover check covers its jobs' processes)."""
    path = tmp_path / "ne-home"
    monkeypatch.setenv("NOTEBOOK_ELASTIC_HOME", str(path))
    return path


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

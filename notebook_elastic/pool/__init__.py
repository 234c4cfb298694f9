"""The warm pool: one process per user and Python environment that has imported torch (and
torchrun's agent, and the supervisor's store) once, outlives jobs, and forks every process a
local job needs: its supervisor, its agents and their workers.

Without it each job imports torch four times before its first step (the supervisor's store,
each agent, each agent's zygote, the spare agent): ~6 CPU-seconds, most of the time to the
first step on 2 cores. With it a job's processes start as forks of a process that has paid
for that already. The pool is ``warm.py``'s zygote in pool mode; this module names it,
starts it, and makes its children look like the processes they stand for.

- **Started** at ``%load_ext notebook_elastic`` (in the background) or by the first local
  job, as ``python -m notebook_elastic.pool.warm pool NAME``, in a session of its own and
  detached from whoever started it (``start_detached``: a double fork, so its parent is init):
  were a job's process its parent (a guardian bringing its job back starts it too), every job
  forked from it would read as that job's descendant, and be ended with it (#37).
- **Named** by the user and the environment: ``@notebook-elastic-pool-UID-KEY`` in Linux's
  abstract namespace, KEY a hash of the interpreter, its version, ``PYTHONPATH``, the
  variables read when torch is imported, torch's install and this package's (version and
  place); a kernel in another environment, or after an upgrade, gets a pool of its own. Both
  ends check the other runs as the same user (SO_PEERCRED) before a byte crosses.
- **Reaped** after ``NOTEBOOK_ELASTIC_POOL_IDLE_S`` (default 600) seconds with no child and
  no request; 0 keeps it until SIGTERM.
- **Never holds CUDA:** it imports torch and never touches a device; each child picks its own
  GPUs from its environment after the fork, as a cold process would.
- **Its children do not die with it:** each forked process is tied to its *launcher* (the
  light ``python -m notebook_elastic.pool.launch ...`` process its parent started, which
  forwards signals and exits with the child's status), not to the pool.
- **Its own messages** (an import that failed, a crash) go to ``.pool.log`` in the jobs
  folder of whoever started it; ``NOTEBOOK_ELASTIC_POOL_OWNER=PID`` ends it with that process.
- ``NOTEBOOK_ELASTIC_WARM_POOL=0`` turns it off (each agent keeps a zygote of its own, as
  before); ``NOTEBOOK_ELASTIC_WARM_WORKERS=0`` turns every warm start off.

A forked child would show the pool's command line and environment in ``/proc`` (the kernel
reads them from the memory the pool was started with). ``retitle`` gives it its own command
line (setproctitle); the job's orphan scan and the suite's leftover check, which find a job's
processes by the job folder in their environment, find its forks by the names they leave in
the job folder (``plumbing/owned.py``).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping

from ..contract.protocol import (
    ENV_FORKED,
    ENV_POOL,
    ENV_POOL_IDLE_S,
    ENV_POOL_ON,
    ENV_POOL_OWNER,
    ENV_WARM_WORKERS,
)

TYPE_CHECKING = False  # typing's costs a worker's launcher, which imports this module, 9 ms
if TYPE_CHECKING:
    import subprocess
    from typing import Any

IDLE_S = 600.0
#: Read when torch and the preloaded modules are imported: a pool imported under other values
#: would hand children the wrong ones. (CUDA_VISIBLE_DEVICES is read only when CUDA starts.)
_IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "LD_", "LOGLEVEL", "PYTHON")


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return (env.get(ENV_POOL_ON, "1") != "0" and env.get(ENV_WARM_WORKERS, "1") != "0") and sys.platform.startswith(
        "linux"
    )


def in_use(env: Mapping[str, str] | None = None) -> str | None:
    """The pool a job's processes are forked from: the one ``env`` names, when pools are on."""
    env = os.environ if env is None else env
    name = env.get(ENV_POOL)
    return name if name and enabled(env) else None


def through_pool(command: list[str], env: Mapping[str, str], *, detach: bool = False) -> list[str] | None:
    """``python -m MODULE ARGS`` started through the warm launcher (``pool.launch``),
    so the pool ``env`` names forks it; None when no pool is in use (start ``command`` as it
    is). ``detach``: the launcher leaves its starter's process tree first."""
    if in_use(env) is None or command[1:2] != ["-m"]:
        return None
    return [command[0], "-m", LAUNCHER_MODULE, *(["--detach"] if detach else []), *command[1:]]


def pool_name(env: Mapping[str, str] | None = None) -> str:
    """This user's pool for this interpreter and import-time environment."""
    env = os.environ if env is None else env
    import hashlib

    key = hashlib.sha256()
    # The interpreter and its environment, however their paths are spelt (.venv/bin/python3 and
    # .venv/bin/python are one interpreter: `pool stop` from either must find the pool).
    where = f"{os.path.realpath(sys.executable)}\0{os.path.realpath(sys.prefix)}"
    key.update(f"{where}\0{sys.version}\0{_torch_install()}\0{_our_install()}\0".encode())
    for name in sorted(env):
        if name.startswith(_IMPORT_TIME_PREFIXES) and not name.startswith("NOTEBOOK_ELASTIC"):
            key.update(f"{name}={env[name]}\0".encode())
    return f"@notebook-elastic-pool-{os.getuid()}-{key.hexdigest()[:20]}"


def _torch_install() -> str:
    """Where torch is installed and when it was: a torch upgraded in place gets a new pool
    (an old pool would fork children with the old torch in memory and the new one on disk)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
        version = os.path.join(os.path.dirname(spec.origin), "version.py")  # type: ignore[union-attr, arg-type]  # no torch, or no origin: raises, caught below
        info = os.stat(version)
        return f"{version}:{info.st_mtime_ns}:{info.st_size}"
    except (ImportError, AttributeError, TypeError, ValueError, OSError):
        return ""


def _our_install() -> str:
    """This package's version and where it is: an upgrade gets a new pool, as a torch's does (an
    old pool would fork jobs through its own old forking code, and trade requests with a newer
    launcher)."""
    from .._version import __version__

    return f"{__version__}:{os.path.dirname(os.path.dirname(os.path.realpath(__file__)))}"


def idle_seconds() -> float:
    try:
        return float(os.environ.get(ENV_POOL_IDLE_S, IDLE_S))
    except ValueError:
        return IDLE_S


def ping(name: str, timeout_s: float = 2.0) -> int | None:
    """The pid of the pool answering at ``name`` (run by our user), or None."""
    from .wire import _address, _recv_line, _send, same_user

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout_s)
    try:
        conn.connect(_address(name))
        if not same_user(conn):
            return None
        _send(conn, {"op": "ping"})
        reply = _recv_line(conn, bytearray())
        return int(reply["pool"]) if reply and "pool" in reply else None
    except (OSError, ValueError):
        return None
    finally:
        conn.close()


def ensure_pool(env: dict[str, str] | None = None, log: str | os.PathLike[str] | None = None) -> str | None:
    """The name of a pool for ``env`` (started now, in the background, when none answers, its
    output to ``log``), or None when pools are off. Returns at once: the pool imports torch on
    its own time, and launchers that come before it is ready wait for it (or start cold)."""
    env = dict(os.environ if env is None else env)
    if not enabled(env):
        return None
    name = env.get(ENV_POOL) or pool_name(env)
    if ping(name) is None:
        start_detached(name, env, log)
    return name


#: The pool's module: ``python -m POOL_MODULE pool NAME`` is a pool (jobfolder/folder.py's walk
#: by descent stops there).
POOL_MODULE = "notebook_elastic.pool.warm"
#: What a warm start runs (``launch.py``; ``warm.py`` takes its arguments too).
LAUNCHER_MODULE = "notebook_elastic.pool.launch"
#: The double fork of ``start_detached``: the first child forks the pool and exits at once, so
#: the pool is reparented to init (or the nearest subreaper), never its starter's child.
_DETACH = "import os, sys\nif os.fork():\n    os._exit(0)\nos.setsid()\nos.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
#: How long the starter waits for that first child to exit (it forks at once).
DETACH_WAIT_S = 30.0


def start(name: str, env: dict[str, str], log: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
    """Start the pool ``name`` as a child of this process (one that finds the name taken exits
    at once); its output goes to ``log`` (a file of ours, 0600, in a private folder), else
    nowhere. For a caller that is no job's and waits for it (a test session, a tool); a job's
    side starts it with ``start_detached``."""
    return _popen(_command(name), name, env, log)


def start_detached(name: str, env: dict[str, str], log: str | os.PathLike[str] | None = None) -> None:
    """Start the pool ``name`` detached from this process: its parent is init, so no process
    of a job (a guardian recovering its job starts one) is ever its ancestor, and the jobs
    forked from it are never found below that job's processes. Returns once the short-lived
    first child has forked it (a few milliseconds)."""
    first = _popen([sys.executable, "-c", _DETACH, *_command(name)[1:]], name, env, log)
    try:
        first.wait(DETACH_WAIT_S)
    except subprocess.TimeoutExpired:  # stopped before it forked: no pool this time, jobs start cold
        first.kill()
        first.wait()


def _command(name: str) -> list[str]:
    return [sys.executable, "-m", POOL_MODULE, "pool", name]


def _popen(
    command: list[str], name: str, env: dict[str, str], log: str | os.PathLike[str] | None
) -> subprocess.Popen[bytes]:
    import subprocess

    from ..contract.protocol import ENV_JOB_DIR

    env = {k: v for k, v in env.items() if k != ENV_JOB_DIR}  # it belongs to no job
    env[ENV_POOL] = name
    out = None
    if log is not None:
        try:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            out = None
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if out is None else out,
            stderr=subprocess.DEVNULL if out is None else subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,
        )
    finally:
        if out is not None:
            os.close(out)


def is_pool_command(argv: list[str]) -> bool:
    """Whether a command line is a pool's (``start``'s or ``start_detached``'s, once exec'd)."""
    return argv[1:4] == ["-m", POOL_MODULE, "pool"]


def owner_fd() -> int | None:
    """A pidfd of the process the pool ends with (``ENV_POOL_OWNER``): readable once it has
    exited; -1 when it is gone already; None when there is none."""
    try:
        pid = int(os.environ[ENV_POOL_OWNER])
    except (KeyError, ValueError):
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1
    except (OSError, AttributeError):  # no pidfds (Linux < 5.3): idle reaping only
        return None


def forked() -> bool:
    """Whether this process was forked by the pool (not a child of one that was)."""
    return os.environ.get(ENV_FORKED) == str(os.getpid())


# -- what a cold start inherits that a fork does not ----------------------------------------

_LIMITS = ("RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_MEMLOCK", "RLIMIT_NPROC")


def inheritance() -> dict[str, Any]:
    """The launcher's side: what its child would have inherited from it had it been exec'd:
    the umask (a job's files are private: its supervisor sets 077), CPU affinity (taskset),
    priority (nice) and resource limits (ulimit)."""
    import resource

    mask = os.umask(0)
    os.umask(mask)
    return {
        "umask": mask,
        "affinity": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "rlimits": {name: list(resource.getrlimit(getattr(resource, name))) for name in _LIMITS},
    }


def inherit(given: dict[str, Any]) -> None:
    """The forked child's side: take on what ``inheritance()`` sent (what cannot be taken on,
    a limit above the pool's hard one, stays the pool's)."""
    import resource

    if "umask" in given:
        os.umask(int(given["umask"]))
    try:
        if given.get("affinity"):
            os.sched_setaffinity(0, given["affinity"])
        if "nice" in given and given["nice"] != os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, int(given["nice"]))
    except OSError:
        pass
    for name, (soft, hard) in (given.get("rlimits") or {}).items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (AttributeError, OSError, ValueError):
            pass


# -- what ps shows of a forked child -------------------------------------------------------


def retitle(argv: list[str]) -> None:
    """Show this forked child as ``python ARGV...`` in ``ps`` (setproctitle; the name in
    ``comm`` stays the interpreter's). ``/proc/PID/cmdline`` then holds that one string, its
    arguments joined by spaces, not separated by NULs as a cold start's are. Its
    environment reads as the pool's: ``plumbing.owned`` says whose it is. Call it before
    ``os.environ`` changes: setproctitle finds the memory it writes by the environment's."""
    try:
        import setproctitle
    except ImportError:  # an environment without it (a pod's image): the pool's title, as the name
        return
    setproctitle.setproctitle(" ".join([sys.executable, *argv]))
    setproctitle.setthreadtitle(os.path.basename(sys.executable)[:15])


def wait_for(name: str, timeout_s: float) -> int | None:
    """Poll until the pool ``name`` answers (its pid) or ``timeout_s`` passes (None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid = ping(name)
        if pid is not None or time.monotonic() > deadline:
            return pid
        time.sleep(0.05)

"""Warm worker starts: each worker is forked from a Python that has already imported torch.

Every restart of a worker group (a crash, a scale-up, a scale-down, a preemption) starts
fresh worker processes, and each spends ~1 s importing torch and ~0.9 s importing
torch._dynamo (the first optimizer) before its first step: most of the time to resume.
Our agent wrapper starts one *zygote* per node that imports them once and waits. torchrun
starts each worker as ``python -u -m notebook_elastic.pool.warm SCRIPT [ARGS]``: a launcher
that imports nothing heavy, hands the zygote its standard streams, environment, working
directory and arguments over a Unix socket, and stays the process torchrun watches. The
socket lives in Linux's abstract namespace (no file anywhere, gone with the zygote); since
any local user could connect to such a name, both ends check that the other runs as the
same user (SO_PEERCRED) before a byte of environment crosses. The
zygote forks a child that runs SCRIPT as ``__main__`` with exactly those; the launcher
forwards signals to the child and exits with the child's status (a signal as a signal).
A pipe ties the child to the launcher: if the launcher dies, the child dies.

Without a zygote (disabled with NOTEBOOK_ELASTIC_WARM_WORKERS=0, or not answering) the
launcher runs SCRIPT itself: a cold start, as before. The launcher lives in ``pool/launch.py``.

The same server, started as ``... warm pool NAME``, is the user's warm pool (``pool``):
it outlives jobs, forks supervisors and agents too (``-m MODULE`` requests), puts each child in
a session of its own tied to its launcher rather than to the pool, and is reaped when idle.
Forked children import our package afresh, with their own environment.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from ..contract import protocol
from ..plumbing import log as _logging
from ..plumbing import owned
from .wire import _address, _send, enabled, same_user

_log = _logging.get("pool.warm")

#: A worker's imports. Ours among them are those of ``notebook_elastic.runtime`` outside it (which
#: a worker imports afresh: it reads the environment): the event vocabulary above all, 4 to 5 ms of
#: the 13 to 15 its import took in a fork.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn",
    "torch.optim",
    "torch._dynamo",
    "cloudpickle",
    "notebook_elastic.contract.event_types",
    "notebook_elastic.plumbing.store_client",
    "notebook_elastic.plumbing.parent",
)
#: The pool also forks agents (torchrun) and supervisors (the store, TensorBoard's writer).
POOL_PRELOAD = (
    "torch.distributed.run",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    "torch.utils.data",
    "tensorboard",
)


# -- the zygote ----------------------------------------------------------------------------


def serve(path: str, *, as_pool: bool = False) -> None:
    """Serve forks at ``path``: a node's zygote (dies with its agent) or, ``as_pool``, the
    user's warm pool (``pool``: outlives jobs, reaped when idle)."""
    abstract = path.startswith("@")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    owner = None
    if as_pool:
        from . import owner_fd

        owner = owner_fd()
        if owner == -1:
            return  # the process it was to end with has ended already
        os.environ.setdefault("LOGLEVEL", "INFO")  # torchelastic's loggers read it at import, as agents set it
        try:
            # The name first: a second pool started meanwhile finds it taken and exits at once,
            # before importing anything; launchers are refused until listen() and retry.
            listener.bind(_address(path))
        except OSError:
            return
    else:
        from ..plumbing.parent import set_parent_death_signal

        set_parent_death_signal(signal.SIGKILL, os.getppid())  # dies with its agent
    for name in PRELOAD + (POOL_PRELOAD if as_pool else ()):
        try:
            __import__(name)
        except Exception:
            _log.debug("a module to preload would not import: the worker imports it itself", exc_info=True)
    if as_pool:
        from . import idle_seconds

        idle_s = idle_seconds()
    else:
        idle_s = 0.0
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    if os.environ.get(protocol.ENV_TERM_TO_ALL) == "1" and not as_pool:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Slurm's, to the whole node: it dies with its agent
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if abstract and not as_pool:
        listener.bind(_address(path))  # launchers that come before listen() are refused and retry
    elif not abstract:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        listener.bind(path + ".tmp")
        os.rename(path + ".tmp", path)  # appears only once it is ready
    listener.listen(64)
    _say_ready()
    children: dict[int, socket.socket] = {}
    busy = time.monotonic()
    try:
        while True:
            timeout = None
            if idle_s > 0:
                if children:
                    busy = time.monotonic()
                elif time.monotonic() - busy >= idle_s:
                    return  # idle: reaped
                timeout = max(0.1, busy + idle_s - time.monotonic())
            watched: list[socket.socket | int] = [listener, wake_r, *([owner] if owner is not None else [])]
            ready, _, _ = select.select(watched, [], [], timeout)
            if owner is not None and owner in ready:
                return  # its owner ended
            if wake_r in ready:
                os.read(wake_r, 4096)
                _reap(children)
            if listener in ready:
                conn, _ = listener.accept()
                if not same_user(conn):  # another local user found the name: no worker for them
                    conn.close()
                    continue
                busy = time.monotonic()
                try:
                    _start(conn, listener, wake_r, wake_w, children, as_pool)
                except Exception:
                    conn.close()
    finally:
        listener.close()
        if not abstract:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _reap(children: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                _send(conn, {"exit": code})
            except OSError:
                pass
            conn.close()


def _start(
    conn: socket.socket,
    listener: socket.socket,
    wake_r: int,
    wake_w: int,
    children: dict[int, socket.socket],
    as_pool: bool = False,
) -> None:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 8)
    while not data.endswith(b"\n"):  # a large environment may come in several pieces
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("launcher went away")
        data += more
    request = json.loads(data)
    if request.get("op") == "ping":
        _send(conn, {"pool" if as_pool else "zygote": os.getpid()})
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            for other in children.values():
                other.close()
            conn.close()
            os.close(wake_r)
            os.close(wake_w)
            _child(request, fds, as_pool)
        finally:
            os._exit(70)  # not reached
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    _send(conn, {"pid": pid})


def _child(request: dict[str, Any], fds: list[int], as_pool: bool = False) -> None:
    """In the forked worker: become the process a cold start would have been, then run."""
    import atexit
    import random
    import runpy
    import threading
    import traceback

    from .. import pool

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stdin, stdout, stderr, life = fds[:4]
    status = fds[4] if len(fds) > 4 else None  # where its exit status goes if the pool is gone by then
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    for fd in fds[3:]:
        os.set_inheritable(fd, False)

    def die_with_launcher() -> None:
        while os.read(life, 1):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    if select.select([life], [], [], 0)[0] and not os.read(life, 1):
        os._exit(0)  # its launcher gave up on this fork (a forker frozen past its bound) or is gone
    threading.Thread(target=die_with_launcher, name="warm-launcher-watch", daemon=True).start()
    module = request.get("module")
    argv = request["argv"]
    if as_pool:  # before the environment changes: setproctitle finds its room from the environment's
        pool.retitle(["-m", module, *argv[1:]] if module else ["-u", *argv])
    os.chdir(request["cwd"])
    pool.inherit(request.get("inherit") or {})
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[protocol.ENV_LAUNCHER] = str(request.get("launcher", ""))  # protocol.own_launcher
    if as_pool:
        # Its own session, as a cold start in one would be; tied to its launcher, not the pool.
        os.setsid()
        os.environ[protocol.ENV_FORKED] = str(os.getpid())
        owned.register_forks()  # its environment reads as the pool's: the job folder names it
    else:
        os.environ[protocol.ENV_WARM_PARENT] = str(os.getppid())
    # Our package reads who it is (RANK, ...) from the environment when imported: the child
    # must import it afresh, with its own environment, not reuse the zygote's.
    fresh = "notebook_elastic" if as_pool else "notebook_elastic.runtime"
    for name in [m for m in sys.modules if m == fresh or m.startswith(fresh + ".")]:
        del sys.modules[name]
    sys.argv = list(argv)
    if request.get("path"):
        sys.path[:] = request["path"]
    if not module:
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    random.seed()  # a fresh process would not share the zygote's random state
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # the OpenMP runtime read its env in the zygote
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                _log.debug("could not flush a stream at exit", exc_info=True)
        if status is not None:
            try:
                os.write(status, str(code).encode())
            except OSError:
                pass
        os._exit(code)


def _say_ready() -> None:
    """Tell the agent that started this zygote that it forks now (``Zygote.wait_ready``)."""
    fd = os.environ.pop(protocol.ENV_ZYGOTE_READY, None)  # not handed on to the workers
    if fd is None:
        return
    try:
        os.write(int(fd), b"1")
        os.close(int(fd))
    except (OSError, ValueError):
        _log.debug("the agent no longer waits for this zygote", exc_info=True)


class Zygote:
    """A node's zygote as its agent sees it: the name its launchers connect to, and whether it
    forks yet (its imports done)."""

    def __init__(self, path: str, ready_fd: int) -> None:
        self.path = path
        self._ready_fd: int | None = ready_fd

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the zygote to say it forks; False when it did not (it
        died importing, or is slower): its workers start cold then. Asked once."""
        fd, self._ready_fd = self._ready_fd, None
        if fd is None:
            return True
        try:
            readable, _, _ = select.select([fd], [], [], timeout_s)
            return bool(readable) and os.read(fd, 1) == b"1"
        finally:
            os.close(fd)


def start_zygote() -> Zygote | None:
    """Called by the agent wrapper: start this node's zygote (it imports torch meanwhile)."""
    if not enabled():
        return None
    import subprocess

    # Abstract: nothing in the system temp folder, nothing to remove, gone with the zygote.
    path = f"@notebook-elastic-zygote-{os.getpid()}-{os.urandom(16).hex()}"
    ready_r, ready_w = os.pipe()
    env = {**os.environ, protocol.ENV_ZYGOTE_READY: str(ready_w)}
    try:
        command = [sys.executable, "-m", "notebook_elastic.pool.warm", "serve", path]
        subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=(ready_w,), env=env)
    except BaseException:
        os.close(ready_r)
        raise
    finally:
        os.close(ready_w)  # the zygote holds it: its end (or its word) is what is read
    os.environ[protocol.ENV_ZYGOTE] = path
    return Zygote(path, ready_r)


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "pool":
        serve(sys.argv[2], as_pool=True)
    elif len(sys.argv) >= 2:
        from .launch import launch

        launch(sys.argv[1:])
    else:
        sys.exit(
            "usage: python -m notebook_elastic.pool.warm [--detach] SCRIPT [ARGS] | [--detach] -m MODULE [ARGS]"
            " | serve SOCKET | pool SOCKET"
        )


if __name__ == "__main__":
    main()

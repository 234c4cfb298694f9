"""Warm worker starts: each worker is forked from a Python that has already imported torch.

Every restart of a worker group (a crash, a scale-up, a scale-down, a preemption) starts
fresh worker processes, and each spends ~1 s importing torch and ~0.9 s importing
torch._dynamo (the first optimizer) before its first step: most of the time to resume.
Our agent wrapper starts one *zygote* per node that imports them once and waits. torchrun
starts each worker as ``python -u -m notebook_elastic.runtime.warm SCRIPT [ARGS]``: a launcher
that imports nothing heavy, hands the zygote its standard streams, environment, working
directory and arguments over a Unix socket, and stays the process torchrun watches. The
socket lives in Linux's abstract namespace (no file anywhere, gone with the zygote); since
any local user could connect to such a name, both ends check that the other runs as the
same user (SO_PEERCRED) before a byte of environment crosses. The
zygote forks a child that runs SCRIPT as ``__main__`` with exactly those; the launcher
forwards signals to the child and exits with the child's status (a signal as a signal).
A pipe ties the child to the launcher: if the launcher dies, the child dies.

Without a zygote (disabled with NOTEBOOK_ELASTIC_WARM_WORKERS=0, or not answering) the
launcher runs SCRIPT itself: a cold start, as before. Lives outside notebook_elastic.runtime
so that forked workers import the runtime fresh, with their own environment.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import time

ENV_ZYGOTE = "NOTEBOOK_ELASTIC_ZYGOTE"  # the zygote's socket name ("@..." = abstract), for launchers
ENV_WARM_PARENT = "NOTEBOOK_ELASTIC_WARM_PARENT"  # a forked worker's parent: the zygote
ENV_WARM = "NOTEBOOK_ELASTIC_WARM_WORKERS"  # "0" turns warm starts off
PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.optim", "torch._dynamo", "cloudpickle")
CONNECT_WAIT_S = 15.0  # the zygote may still be importing torch on a node's first start


def enabled() -> bool:
    return os.environ.get(ENV_WARM, "1") != "0" and sys.platform.startswith("linux")


def _address(name: str) -> str:
    """``@name`` -> the abstract socket address (environment values cannot hold the NUL)."""
    return "\0" + name[1:] if name.startswith("@") else name


def same_user(conn: socket.socket) -> bool:
    """Whether the process at the other end of ``conn`` runs as our user (SO_PEERCRED)."""
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return False
    return uid == os.getuid()


def _send(conn: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        socket.send_fds(conn, [data], fds)
    else:
        conn.sendall(data)


def _recv_line(conn: socket.socket, buffer: bytearray) -> dict | None:
    while b"\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)


# -- the zygote ----------------------------------------------------------------------------


def serve(path: str) -> None:
    from .worker import set_parent_death_signal

    set_parent_death_signal(signal.SIGKILL, os.getppid())  # dies with its agent
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:
            pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    abstract = path.startswith("@")
    if not abstract:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if abstract:
        listener.bind(_address(path))  # launchers that come before listen() are refused and retry
    else:
        listener.bind(path + ".tmp")
        os.rename(path + ".tmp", path)  # appears only once it is ready
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    try:
        while True:
            ready, _, _ = select.select([listener, wake_r], [], [])
            if wake_r in ready:
                os.read(wake_r, 4096)
                _reap(children)
            if listener in ready:
                conn, _ = listener.accept()
                if not same_user(conn):  # another local user found the name: no worker for them
                    conn.close()
                    continue
                try:
                    _start(conn, listener, wake_r, wake_w, children)
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
    conn: socket.socket, listener: socket.socket, wake_r: int, wake_w: int, children: dict[int, socket.socket]
) -> None:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 8)
    while not data.endswith(b"\n"):  # a large environment may come in several pieces
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("launcher went away")
        data += more
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            for other in children.values():
                other.close()
            conn.close()
            os.close(wake_r)
            os.close(wake_w)
            _child(request, fds)
        finally:
            os._exit(70)  # not reached
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    _send(conn, {"pid": pid})


def _child(request: dict, fds: list[int]) -> None:
    """In the forked worker: become the process a cold start would have been, then run."""
    import atexit
    import random
    import runpy
    import threading
    import traceback

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stdin, stdout, stderr, life = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)

    def die_with_launcher() -> None:
        while os.read(life, 1):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=die_with_launcher, name="warm-launcher-watch", daemon=True).start()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[ENV_WARM_PARENT] = str(os.getppid())
    # Our runtime reads who it is (RANK, ...) from the environment when imported: the
    # worker must import it afresh, with its own environment, not reuse the zygote's.
    for name in [
        m for m in sys.modules if m == "notebook_elastic.runtime" or m.startswith("notebook_elastic.runtime.")
    ]:
        del sys.modules[name]
    argv = request["argv"]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    random.seed()  # a fresh process would not share the zygote's random state
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # the OpenMP runtime read its env in the zygote
    code = 0
    try:
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
                pass
        os._exit(code)


# -- the launcher (what torchrun starts) -----------------------------------------------------


def launch(argv: list[str]) -> None:
    from . import protocol
    from .worker import set_parent_death_signal

    agent = os.environ.get(protocol.ENV_AGENT_PID)
    if agent:
        set_parent_death_signal(signal.SIGKILL, int(agent))
    path = os.environ.get(ENV_ZYGOTE)
    conn = _connect(path) if path and enabled() else None
    if conn is None:
        _cold(argv)
        return
    life_r, life_w = os.pipe()
    try:
        _send(conn, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2, life_r])
    except OSError:
        os.close(life_r)
        os.close(life_w)
        _cold(argv)
        return
    os.close(life_r)
    buffer = bytearray()
    first = _recv_line(conn, buffer)
    if not first or "pid" not in first:
        _cold(argv)  # the zygote could not fork: nothing has run yet
        return
    child = int(first["pid"])

    def forward(sig: int, _frame: object) -> None:
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    while True:
        try:
            done = _recv_line(conn, buffer)
            break
        except InterruptedError:
            continue
    code = done["exit"] if done else 1
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
        os._exit(128 - code)
    os._exit(code)


def _connect(path: str) -> socket.socket | None:
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(_address(path))
            if not same_user(conn):  # someone else holds the name: our environment is not for them
                conn.close()
                return None
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        except OSError:
            return None


def _cold(argv: list[str]) -> None:
    import runpy

    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


def start_zygote() -> str | None:
    """Called by the agent wrapper: start this node's zygote; returns its socket path."""
    if not enabled():
        return None
    import subprocess

    # Abstract: nothing in the system temp folder, nothing to remove, gone with the zygote.
    path = f"@notebook-elastic-zygote-{os.getpid()}-{os.urandom(16).hex()}"
    subprocess.Popen([sys.executable, "-m", "notebook_elastic.runtime.warm", "serve", path], stdin=subprocess.DEVNULL)
    os.environ[ENV_ZYGOTE] = path
    return path


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 2:
        launch(sys.argv[1:])
    else:
        sys.exit("usage: python -m notebook_elastic.runtime.warm SCRIPT [ARGS] | serve SOCKET")


if __name__ == "__main__":
    main()

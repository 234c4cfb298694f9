"""The launcher of a warm start (``python -m notebook_elastic.pool.launch [--detach] SCRIPT
ARGS`` or ``... [--detach] -m MODULE ARGS``; ``pool.warm`` takes them too): what torchrun starts
for a worker, the supervisor for an agent and the kernel for a supervisor. It imports nothing
heavy (neither typing nor the zygote's modules: it is on every start's path), hands its standard
streams, environment, working directory, ``sys.path`` and arguments to the node's zygote or the
user's warm pool (``pool.warm``, ``pool``), and stays the process its starter
watches: it forwards signals to the forked child and exits with the child's status (a signal as
a signal). A pipe ties the child to it: if the launcher dies, the child dies. Without a zygote
or pool that answers, it runs the script or module itself: a cold start.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time

from ..contract.protocol import ENV_ZYGOTE
from .wire import CONNECT_WAIT_S, _address, _recv_line, _send, enabled, same_user

#: How long the pool or zygote may take to say it forked (milliseconds as a rule): one that does
#: not (frozen, stuck) has the launcher start cold instead of waiting on it for ever.
FORK_ANSWER_S = 10.0
#: After its child ended, how long the launcher waits for the pool's word of how before it
#: reads the child's own status pipe (a frozen pool's word never comes) ...
EXIT_ANSWER_S = 1.0
#: ... and, where the child wrote none there (it ended by os._exit: a worker leaving at a step
#: boundary), how much longer, before its end counts as a kill (a loaded machine's pool may be
#: late; a worker's clean exit told as SIGKILL is a departure told as a failure).
EXIT_UNSAID_S = 10.0


def launch(argv: list[str]) -> None:
    """``[--detach] SCRIPT ARGS`` (a worker, forked by its node's zygote or the pool) or
    ``[--detach] -m MODULE ARGS`` (a supervisor or an agent, forked by the pool)."""
    from .. import pool
    from ..contract import protocol
    from ..plumbing.parent import set_parent_death_signal

    detach = argv[:1] == ["--detach"]
    argv = argv[1:] if detach else argv
    module = argv[1] if argv[:1] == ["-m"] and len(argv) > 1 else None
    argv = [module, *argv[2:]] if module else argv
    if detach and os.fork() > 0:
        os._exit(0)  # the starter reaps this short-lived parent; the launcher lives on under init
    agent = os.environ.get(protocol.ENV_AGENT_PID)
    if module is None and agent:
        set_parent_death_signal(signal.SIGKILL, int(agent))
    elif module is not None and not detach:
        set_parent_death_signal(signal.SIGTERM, os.getppid())  # forwarded to the child, as it would get it
    path = pool.in_use() if module else (os.environ.get(ENV_ZYGOTE) if enabled() else None)
    conn = _connect(path) if path else None
    if conn is None:
        _cold(argv, module)
        return
    life_r, life_w = os.pipe()
    status_r, status_w = os.pipe()
    request = {
        "argv": argv,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "path": sys.path,
        "launcher": os.getpid(),
        "inherit": pool.inheritance(),
    }
    if module:
        request["module"] = module
    try:
        _send(conn, request, [0, 1, 2, life_r, status_w])
    except OSError:
        for fd in (life_r, life_w, status_r, status_w):
            os.close(fd)
        _cold(argv, module)
        return
    os.close(life_r)
    os.close(status_w)
    buffer = bytearray()
    try:
        first = _recv_line(conn, buffer) if _answers(conn, buffer, FORK_ANSWER_S) else None
    except OSError:
        first = None
    if not first or "pid" not in first:
        os.close(life_w)  # a fork it makes after all ends at once (its launcher's pipe closed)
        _cold(argv, module)  # the zygote could not fork, or did not say: nothing of ours has run yet
        return
    child = int(first["pid"])
    try:
        ended: int | None = os.pidfd_open(child)  # readable once the child ended (its forker's child)
    except (OSError, AttributeError):
        ended = None

    def forward(sig: int, _frame: object) -> None:
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    written: int | None = None
    while True:
        try:
            if ended is not None and b"\n" not in buffer:
                ready, _, _ = select.select([conn.fileno(), ended], [], [])
                if conn.fileno() not in ready and not _answers(conn, buffer, EXIT_ANSWER_S):
                    # It ended, and its forker does not say how (frozen, or late): its own pipe
                    # does, where it wrote there.
                    written = _status_written(status_r)
                    if written is not None or not _answers(conn, buffer, EXIT_UNSAID_S):
                        done = None
                        break
            done = _recv_line(conn, buffer)
            break
        except InterruptedError:
            continue
        except OSError:
            done = None
            break
    code = done["exit"] if done else (written if written is not None else _status_from(status_r))
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
        os._exit(128 - code)
    os._exit(code)


def _answers(conn: socket.socket, buffer: bytearray, timeout_s: float) -> bool:
    """Whether a line from the pool is there, or comes within ``timeout_s``."""
    return b"\n" in buffer or bool(select.select([conn], [], [], timeout_s)[0])


def _status_written(status_r: int) -> int | None:
    """The status the ended child wrote to its own pipe, without waiting: None where it wrote
    none (or a process it forked still holds the pipe open)."""
    os.set_blocking(status_r, False)
    try:
        data = os.read(status_r, 64)
    except (BlockingIOError, InterruptedError):
        data = b""
    finally:
        os.set_blocking(status_r, True)
    try:
        return int(data) if data else None
    except ValueError:
        return None


def _status_from(status_r: int) -> int:
    """The child's exit status from its own pipe (its forker is gone): what it wrote when it
    exited, or a kill when it wrote nothing."""
    data = b""
    while True:
        try:
            chunk = os.read(status_r, 64)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    try:
        return int(data)
    except ValueError:
        return -signal.SIGKILL


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


def _cold(argv: list[str], module: str | None = None) -> None:
    import runpy

    sys.argv = list(argv)
    if module:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":  # python -m notebook_elastic.pool.launch: the launcher alone, not the zygote's imports
    launch(sys.argv[1:])

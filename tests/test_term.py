"""Slurm's SIGTERM to every process of a node (runtime/term.py): a worker holds it for the
keeper, but the processes the worker starts itself act on SIGTERM as anywhere: a forked child
(it inherits the handler) and a spawned one (it imports the runtime again) end when their
parent terminates them, and a multiprocessing pool closes at once."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = r"""
import multiprocessing, os, signal, tempfile, time
os.environ.update(LOCAL_RANK="0", NOTEBOOK_ELASTIC_TERM_TO_ALL="1", NOTEBOOK_ELASTIC_NOTICE_DIR=tempfile.mkdtemp())
import notebook_elastic.runtime  # a worker torch started: it holds Slurm's SIGTERM for the keeper

def child():
    import notebook_elastic.runtime  # noqa: F401
    time.sleep(30)

if __name__ == "__main__":
    print("worker holds:", getattr(signal.getsignal(signal.SIGTERM), "_notebook_elastic_deferring", False))
    for method in ("fork", "spawn"):
        ctx = multiprocessing.get_context(method)
        with ctx.Pool(1) as pool:
            pool.apply(abs, (-1,))
        p = ctx.Process(target=child)
        p.start()
        time.sleep(0.3 if method == "fork" else 3)
        p.terminate()
        p.join(10)
        print(method, "child ended by SIGTERM:", p.exitcode == -15)
"""


def test_a_workers_own_children_act_on_sigterm_as_anywhere(tmp_path):
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "worker holds: True",
        "fork child ended by SIGTERM: True",
        "spawn child ended by SIGTERM: True",
    ], done.stdout + done.stderr

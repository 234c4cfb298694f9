"""Execute a notebook headless on a real kernel, printing each cell's output as it finishes.

usage: python scripts/run_notebook.py NOTEBOOK [--save OUT.ipynb] [--timeout SECONDS] [--pace SECONDS]
Exits non-zero when a cell fails. Each cell's line says how long the cell took and when it
finished ("cell 1.2 s, at 13.5 s"). ``--pace S``: as a person reads and runs it, S seconds before
each cell (markdown cells count: they are read) once a job is launched (before, nothing runs
that a pause could change): the shipped notebooks must work so as well as with Run All.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", [])) + "\n"
    data = output.get("data", {})
    return data.get("text/plain", "") + "\n" if "text/plain" in data else ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("notebook")
    parser.add_argument("--save", default=None)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--pace", type=float, default=0.0, help="seconds before each cell once a job runs")
    args = parser.parse_args()
    nb = nbformat.read(args.notebook, as_version=4)
    started = time.monotonic()
    cell_started = {"at": started}

    def on_cell_execute(cell, cell_index, **_):
        cell_started["at"] = time.monotonic()

    def on_cell_executed(cell, cell_index, execute_reply, **_):
        if cell.cell_type != "code" or cell.metadata.get("events"):
            return  # the events cell after a failure: its text comes with the failure
        first = cell.source.splitlines()[0] if cell.source else ""
        now = time.monotonic()
        # The cell's own time, and when it finished since the notebook started (#39 item 11: the
        # one figure there was read as the cell's).
        took = f"cell {now - cell_started['at']:.1f} s, at {now - started:.1f} s"
        # As the notebook numbers it (In [n]: its code cells only), not its place among all cells.
        print(f"--- [{cell.get('execution_count') or cell_index}] {first[:90]}  ({took})", flush=True)
        for output in cell.get("outputs", []):
            sys.stdout.write(_text(output))
        sys.stdout.flush()

    # The kernel talks over Unix sockets in a folder of our own (0700), not TCP: no port another
    # local user can reach, and no "running over TCP without encryption" warning in the story.
    sockets = tempfile.mkdtemp(prefix="notebook-elastic-kernel-")
    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = os.path.join(sockets, "kernel")
    client = NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name="python3",
        on_cell_execute=on_cell_execute,
        on_cell_executed=on_cell_executed,
        config=config,
    )
    try:
        run_at_a_pace(client, nb, args.pace)
    except _FailedWithEvents as failed:
        print(failed.events, flush=True)
        print(f"notebook failed: {str(failed.__cause__)[-3000:]}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
        if args.save:
            nbformat.write(nb, args.save)
    print(f"--- {args.notebook} ran in {time.monotonic() - started:.1f} s")
    _tell_the_warm_pool()
    return 0


def launches(cell) -> bool:
    """A cell that starts a job (a dry run starts nothing)."""
    source = cell.source.lstrip()
    return (
        cell.cell_type == "code" and source.startswith("%%elastic_train") and "--dry-run" not in source.split("\n")[0]
    )


def run_at_a_pace(client: NotebookClient, nb, pace_s: float) -> None:
    """Every cell in order on one kernel, ``pace_s`` seconds before each once a job runs (none:
    Run All)."""
    launched = False
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if launched and pace_s > 0:
                print(f"--- (a reader's {pace_s:g} s before cell [{index}], a {cell.cell_type} cell)", flush=True)
                time.sleep(pace_s)
            if cell.cell_type == "code":
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as exc:
                    raise _FailedWithEvents(_jobs_events(client)) from exc
            launched = launched or launches(cell)


class _FailedWithEvents(Exception):
    def __init__(self, events: str) -> None:
        super().__init__("a cell failed")
        self.events = events


#: Run in the kernel after a cell failed, before it is shut down: each job's events, the record a
#: failure far from here (a fresh-clone run) is read from. A Kubernetes job's events live only in
#: its kernel (they are followed from the cluster), so they are gone once the kernel is.
_EVENTS_CELL = """
from notebook_elastic.kernel.job import ElasticJob as _Job
_seen = set()
for _name, _job in list(globals().items()):
    if isinstance(_job, _Job) and not _name.startswith("_") and id(_job) not in _seen:
        _seen.add(id(_job))
        print(f"--- {_name}: its last 80 events")
        for _e in _job.events[-80:]:
            _data = {k: v for k, v in _e.data.items() if k not in ("node", "v")}
            print(f"{_e.time:.2f} {_e.kind} {_e.node or ''} {str(_data)[:200]}")
"""


def _jobs_events(client: NotebookClient) -> str:
    cell = nbformat.v4.new_code_cell(_EVENTS_CELL, metadata={"events": True})
    client.nb.cells.append(cell)
    try:
        client.execute_cell(cell, len(client.nb.cells) - 1)
    except Exception as exc:  # the kernel died with the cell: nothing more to read
        return f"--- no events: {type(exc).__name__}: {exc}"
    finally:
        client.nb.cells.remove(cell)  # not the user's: never in a notebook saved with --save
    return "".join(_text(output) for output in cell.get("outputs", []))


def _tell_the_warm_pool() -> None:
    """Say what stays running after the notebook: the warm pool its jobs were forked from."""
    try:
        from notebook_elastic import pool

        pid = pool.ping(pool.pool_name())
    except Exception:  # no pool to tell of (or none can be asked): nothing stays
        return
    if pid is not None:
        print(
            f"--- a warm pool (pid {pid}) stays up to start your next job fast; it exits after "
            f"{pool.idle_seconds():g} s idle, or now with: .venv/bin/notebook-elastic pool stop"
        )


if __name__ == "__main__":
    sys.exit(main())

"""The job's metrics as TensorBoard event files in its folder: ``tensorboard --logdir JOB_DIR``.

Written by the supervisor from the event stream, not by the workers: the workers stay light
(no tensorboard import, no file per rank, nothing to lose when a rank is killed mid-write),
one writer sees every generation in order, and a restart never races two writers over one
file. A resumed job appends new event files to the same folder, so TensorBoard shows one run.
Needs the ``tensorboard`` package (``pip install 'notebook-elastic[tensorboard]'``); without
it nothing is written. Writes happen on a thread of their own: a slow disk never holds up
the history.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from ..contract.event_types import Gpu, Kind, Metric
from ..contract.events import Event
from ..plumbing import log as _logging

_log = _logging.get("supervisor.tensorboard")

FLUSH_S = 2.0  # what TensorBoard shows is at most this old


def available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class TensorBoardWriter:
    """``observe(event, state)`` from the supervisor's event sink; ``close()`` at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.queue: queue.SimpleQueue[tuple[str, float, float, int] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="tensorboard", daemon=True)
        self.thread.start()

    def observe(self, e: Event, state: Any) -> None:
        """Scalars of one event; ``state`` is the job's state with the event already folded."""
        metric = e.fields(Metric)
        if e.kind == Kind.METRIC and metric.get("rank", 0) in (0, None):
            step = metric.get("step")
            if not isinstance(step, int):
                return
            for name, value in (metric.get("values") or {}).items():
                self._put(name, value, step, e.time)
            for name, value in (
                ("speed/step_time_s", state.step_time_s),
                ("speed/samples_per_s", state.samples_per_s),
                ("speed/tokens_per_s", state.tokens_per_s),
                ("job/world_size", state.world_size),
            ):
                self._put(name, value, step, e.time)
        elif e.kind == Kind.GPU and state.step is not None:
            gpu = e.fields(Gpu)
            rank, peak = gpu.get("rank"), gpu.get("mem_peak_bytes")
            if isinstance(peak, (int, float)):
                self._put(f"gpu/mem_peak_gib/rank{rank}", peak / 2**30, state.step, e.time)
            self._put(f"gpu/util_percent/rank{rank}", gpu.get("util_percent"), state.step, e.time)

    def _put(self, tag: str, value: Any, step: int, walltime: float) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.queue.put((tag, float(value), walltime, step))

    def _run(self) -> None:
        writer = None
        while True:
            item = self.queue.get()
            if item is None:
                break
            try:
                if writer is None:
                    # Imported at the first metric, when the supervisor's main thread has long
                    # imported torch (for the store): importing torch from two threads at once
                    # breaks it ("'torch._C' is not a package").
                    from torch.utils.tensorboard import SummaryWriter

                    writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=FLUSH_S)
                tag, value, walltime, step = item
                writer.add_scalar(tag, value, global_step=step, walltime=walltime)
            except Exception:
                _log.debug("a full disk, a folder deleted: the history goes on without it", exc_info=True)
                continue
        if writer is not None:
            try:
                writer.close()
            except Exception:
                _log.debug("could not close the TensorBoard writer", exc_info=True)

    def close(self, timeout_s: float = 10.0) -> None:
        self.queue.put(None)
        self.thread.join(timeout=timeout_s)

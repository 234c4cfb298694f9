"""The job's metrics in MLflow, when the user asks for it: one run per job, named after it.

Asked for means ``--track mlflow``, or ``MLFLOW_TRACKING_URI`` in the environment the job was
launched from (``--track none`` turns that off); nothing is logged anywhere else. The tracking
URI, experiment (``MLFLOW_EXPERIMENT_NAME``) and credentials are MLflow's own settings, read
by MLflow from that environment. Like ``tensorboard.py``, the supervisor feeds it from the
event stream: rank 0's metrics of each step, the speed figures and the world size, on a
thread of its own, in batches, so a slow or unreachable server never holds up the history.
A failure is said once (an ``error`` event) and tracking stops; training goes on. The run's
params are the job's elastic limits, never its ``--env`` values; it ends with the job's status.
Needs ``mlflow`` or ``mlflow-skinny`` (``pip install 'notebook-elastic[mlflow]'``).
"""

from __future__ import annotations

import importlib.util
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...events import Event, Kind
from ...spec import JobSpec

TRACKERS = ("mlflow",)
#: The job's final status -> MLflow's RunStatus.
RUN_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED", "lost": "FAILED"}
MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch


def available(tracker: str) -> bool:
    return importlib.util.find_spec(tracker) is not None


def requested(track: str | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """The trackers a job logs to: those ``--track`` names, else those its environment configures."""
    if track is not None:
        return () if track == "none" else (track,)
    return ("mlflow",) if env.get("MLFLOW_TRACKING_URI") and available("mlflow") else ()


def metrics_of(e: Event, state: Any) -> list[tuple[str, float, int]]:
    """``(name, value, step)`` of one metric event of rank 0; ``state`` has it folded already."""
    if e.kind != Kind.METRIC or e.get("rank", 0) not in (0, None) or not isinstance(e.get("step"), int):
        return []
    pairs = list((e.get("values") or {}).items()) + [
        ("speed/step_time_s", state.step_time_s),
        ("speed/samples_per_s", state.samples_per_s),
        ("speed/tokens_per_s", state.tokens_per_s),
        ("job/world_size", state.world_size),
    ]
    return [
        (str(k), float(v), e.get("step")) for k, v in pairs if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]


class MlflowTracker:
    """``observe(event, state)`` from the supervisor's event sink; ``close()`` at the end.

    Never blocks its caller and never raises: the first failure is told through ``say`` and
    everything after it is dropped."""

    def __init__(self, spec: JobSpec, say: Callable[[str], None]) -> None:
        self.spec = spec
        self.say = say
        self.queue: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self.failed = False
        self.thread = threading.Thread(target=self._run, name="mlflow", daemon=True)
        self.thread.start()

    def observe(self, e: Event, state: Any) -> None:
        if e.kind == Kind.JOB_FINISHED:
            self.queue.put(("end", e.get("status")))
            return
        for name, value, step in metrics_of(e, state):
            self.queue.put(("metric", name, value, int(e.time * 1000), step))

    def _run(self) -> None:
        try:  # at once, not at the first metric: a server that is not there is told while the job runs
            # Imported here, after the supervisor's main thread has imported torch.
            from mlflow import MlflowClient
            from mlflow.entities import Metric

            client, run_id = self._start(MlflowClient())
        except Exception as exc:
            self._fail(exc)
        while True:
            item = self.queue.get()
            batch = [item]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            if not self.failed:
                try:
                    metrics = [Metric(n, v, t, s) for _, n, v, t, s in (b for b in batch if b and b[0] == "metric")]
                    if metrics:
                        client.log_batch(run_id, metrics=metrics)
                    for b in batch:
                        if b and b[0] == "end":
                            client.set_terminated(run_id, RUN_STATUS.get(str(b[1]), "FAILED"))
                except Exception as exc:
                    self._fail(exc)
            if None in batch:
                return

    def _fail(self, exc: Exception) -> None:
        """An unreachable server, a refused store, a bad token: told once, and logging stops."""
        self.failed = True
        self.say(f"MLflow logging stopped: {type(exc).__name__}: {str(exc)[:300]} (training goes on)")

    def _start(self, client: Any) -> tuple[Any, str]:
        from mlflow.entities import Param

        spec = self.spec
        experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if experiment_id is None and name:
            found = client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found else client.create_experiment(name)
        run = client.create_run(
            experiment_id or "0",
            start_time=int(time.time() * 1000),
            run_name=spec.name,
            tags={"notebook_elastic.job": spec.name, "notebook_elastic.backend": "local"},
        )
        params = {
            "nnodes": f"{spec.nnodes[0]}:{spec.nnodes[1]}",
            "nproc_per_node": str(spec.nproc_per_node),
            "max_restarts": str(spec.max_restarts),
        }
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
        return client, run.info.run_id

    def close(self, timeout_s: float = 10.0) -> None:
        self.queue.put(None)
        self.thread.join(timeout=timeout_s)

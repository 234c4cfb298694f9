"""The job's metrics in MLflow and W&B, when the user asks for them: one run per job, named after it.

Asked for means ``--track mlflow|wandb``, or the tracker's own variables in the environment
the job was launched from: ``MLFLOW_TRACKING_URI``, ``WANDB_PROJECT`` (``--track none`` turns
them off); nothing is logged anywhere else. Where and how (URI, experiment, W&B's mode and
dir, credentials) are each library's own settings, read by it from that environment. Like
``tensorboard.py``, the supervisor feeds them from the event stream: rank 0's metrics of each
step, the speed figures and the world size, on a thread per tracker, in batches, so a slow or
unreachable server never holds up the history. Once a run is open, where it is (its link, or
the command that shows it; credentials stripped) is told as a ``tracking`` event. A failure is said once (an ``error`` event)
and that tracker stops; training goes on. A run's params are the job's elastic limits, never
its ``--env`` values; it ends with the job's status. Needs ``mlflow`` (or ``mlflow-skinny``)
or ``wandb``: ``pip install 'notebook-elastic[mlflow]'`` / ``[wandb]``.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..contract.event_types import Kind, Metric, Tracking
from ..contract.events import Event
from ..contract.spec import JobSpec
from ..runtime.tracking import mlflow_link, next_batch, scrub, wandb_link

TRACKERS = ("mlflow", "wandb")
#: The job's final status -> MLflow's RunStatus.
RUN_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED", "lost": "FAILED"}


def available(tracker: str) -> bool:
    return importlib.util.find_spec(tracker) is not None


def requested(track: str | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """The trackers a job logs to: the one ``--track`` names, else those its environment configures
    (``MLFLOW_TRACKING_URI``; ``WANDB_PROJECT`` unless ``WANDB_MODE=disabled``) and can import."""
    if track is not None:
        return () if track == "none" else (track,)
    asked = {
        "mlflow": bool(env.get("MLFLOW_TRACKING_URI")),
        "wandb": bool(env.get("WANDB_PROJECT")) and env.get("WANDB_MODE") != "disabled",
    }
    return tuple(t for t in TRACKERS if asked[t] and available(t))


def metrics_of(e: Event, state: Any) -> list[tuple[str, float, int]]:
    """``(name, value, step)`` of one metric event of rank 0; ``state`` has it folded already."""
    metric = e.fields(Metric)
    step = metric.get("step")
    if e.kind != Kind.METRIC or metric.get("rank", 0) not in (0, None) or not isinstance(step, int):
        return []
    pairs = list((metric.get("values") or {}).items()) + [
        ("speed/step_time_s", state.step_time_s),
        ("speed/samples_per_s", state.samples_per_s),
        ("speed/tokens_per_s", state.tokens_per_s),
        ("job/world_size", state.world_size),
    ]
    return [(str(k), float(v), step) for k, v in pairs if isinstance(v, (int, float)) and not isinstance(v, bool)]


def params_of(spec: JobSpec) -> dict[str, str]:
    """What a run records of the job: its elastic limits, never its ``--env`` values."""
    return {
        "nnodes": f"{spec.nnodes[0]}:{spec.nnodes[1]}",
        "nproc_per_node": str(spec.nproc_per_node),
        "max_restarts": str(spec.max_restarts),
    }


class Tracker:
    """``observe(event, state)`` from the supervisor's event sink; ``finish()`` at the end.

    Never blocks its caller and never raises: the run is opened at once on a thread of its
    own (a server that is not there is told while the job runs) and where it is goes to
    ``tell`` (the fields of a ``tracking`` event), metrics go in batches, the first failure is
    told through ``say`` and everything after it is dropped."""

    name = ""

    def __init__(
        self, spec: JobSpec, say: Callable[[str], None], tell: Callable[[Tracking], None] = lambda _: None
    ) -> None:
        self.spec = spec
        self.say = say
        self.tell = tell
        # ("metric", name, value, time, step) and ("end", status), then None: the thread ends
        self.queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.failed = False
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()

    def observe(self, e: Event, state: Any) -> None:
        for name, value, step in metrics_of(e, state):
            self.queue.put(("metric", name, value, e.time, step))

    def _run(self) -> None:
        try:  # imported here, after the supervisor's main thread has imported torch
            self._open()
            self.tell(self._where())
        except Exception as exc:
            self._fail(exc)
        while True:
            batch = next_batch(self.queue)
            if not self.failed:
                try:
                    metrics = [b[1:] for b in batch if b and b[0] == "metric"]
                    if metrics:
                        self._log(metrics)
                    for b in batch:
                        if b and b[0] == "end":
                            self._end(str(b[1]))
                except Exception as exc:
                    self._fail(exc)
            if None in batch:
                return

    def _fail(self, exc: Exception) -> None:
        """An unreachable server, a refused store, a bad key: told once, and logging stops."""
        self.failed = True
        # A client's error may quote the URL it called, credentials and all: they are left out.
        self.say(f"{self.name} logging stopped: {type(exc).__name__}: {scrub(str(exc))[:300]} (training goes on)")

    def _open(self) -> None:
        raise NotImplementedError

    def _where(self) -> Tracking:
        """The open run's ``tracking`` event (``runtime/tracking.py``)."""
        raise NotImplementedError

    def _log(self, metrics: list[tuple[str, float, float, int]]) -> None:
        """``(name, value, time, step)`` of one or more steps, in order."""
        raise NotImplementedError

    def _end(self, status: str) -> None:
        raise NotImplementedError

    def finish(self, status: str, timeout_s: float = 10.0) -> None:
        """End the run with the job's ``status`` (after its last metric), waiting at most ``timeout_s``."""
        self.queue.put(("end", status))
        self.queue.put(None)
        self.thread.join(timeout=timeout_s)


class MlflowTracker(Tracker):
    """One MLflow run (MLflow's client and settings: tracking URI, experiment, credentials)."""

    name = "MLflow"

    def __init__(
        self, spec: JobSpec, say: Callable[[str], None], tell: Callable[[Tracking], None] = lambda _: None
    ) -> None:
        # The open run, set by _open on the tracker's thread (started by the base's __init__: after these).
        self.client: Any = None
        self.run_id = ""
        self.experiment_id = ""
        super().__init__(spec, say, tell)

    def _open(self) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = client = MlflowClient()
        experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if experiment_id is None and experiment:
            found = client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        run = client.create_run(
            experiment_id or "0",
            start_time=int(time.time() * 1000),
            run_name=self.spec.name,
            tags={"notebook_elastic.job": self.spec.name, "notebook_elastic.backend": "local"},
        )
        self.run_id = run.info.run_id
        self.experiment_id = run.info.experiment_id
        client.log_batch(self.run_id, params=[Param(k, v) for k, v in params_of(self.spec).items()])

    def _where(self) -> Tracking:
        import mlflow

        return mlflow_link(mlflow.get_tracking_uri(), self.experiment_id, self.run_id)

    def _log(self, metrics: list[tuple[str, float, float, int]]) -> None:
        from mlflow.entities import Metric

        self.client.log_batch(self.run_id, metrics=[Metric(n, v, int(t * 1000), s) for n, v, t, s in metrics])

    def _end(self, status: str) -> None:
        # MLflow prints the run's link as it ends, with the URI's credentials: the job tells its
        # own, stripped (a tracking event), and keeps them out of supervisor.log.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.client.set_terminated(self.run_id, RUN_STATUS.get(status, "FAILED"))


class WandbTracker(Tracker):
    """One W&B run (wandb's settings: WANDB_PROJECT, WANDB_MODE=offline, WANDB_DIR, the API key)."""

    name = "W&B"

    def __init__(
        self, spec: JobSpec, say: Callable[[str], None], tell: Callable[[Tracking], None] = lambda _: None
    ) -> None:
        self.run: Any = None  # the open run, set by _open on the tracker's thread (started below)
        self.step = -1  # W&B's step only grows: the last one logged
        super().__init__(spec, say, tell)

    def _open(self) -> None:
        import wandb

        self.run = wandb.init(
            name=self.spec.name, config=params_of(self.spec), tags=["notebook-elastic"], reinit="create_new"
        )
        self.step = -1

    def _where(self) -> Tracking:
        return wandb_link(self.run)

    def _log(self, metrics: list[tuple[str, float, float, int]]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for name, value, _t, step in metrics:
            by_step.setdefault(step, {})[name] = value
        for step in sorted(by_step):
            if step > self.step:  # W&B's step only grows: a step redone after a restart is logged once
                self.run.log(by_step[step], step=step)
                self.step = step

    def _end(self, status: str) -> None:
        self.run.summary["job_status"] = status
        self.run.finish(exit_code=0 if status == "succeeded" else 1)
        import wandb

        wandb.teardown()  # its service process ends now, before the job's last sweep for orphans


TRACKER_CLASSES = {"mlflow": MlflowTracker, "wandb": WandbTracker}

"""MLflow / W&B from inside a cluster: rank 0's worker logs the job's metrics itself.

A Kubernetes job lives on without the notebook (the follower there only reads pod logs), so
its run is kept where the job runs: ``report()`` on global rank 0 hands each step's metrics to
this module, which logs them on a thread of its own, in batches. The pods carry
``NOTEBOOK_ELASTIC_TRACK`` (``--track``; ``auto``: as the tracker's own variables, passed with
``--env``, say); the credentials come through ``--env`` too (the job's Secret). One run per
job run: a worker that starts again (a restart, a new rank 0 pod after a scale) finds the run
by its ``notebook_elastic.run`` tag (W&B: resumes the run of that id) and logs on into it. The
run ends FINISHED when rank 0's training ends well; a failure leaves it open for the retry,
except one on the last attempt the restart budget allows, which ends it FAILED (nothing else in
the cluster would: the notebook may be gone). A rank 0 that logs on into an ended run (a group
that re-formed after such a failure, a departure) marks it running again.
A tracker the image lacks, or a server that fails, is one ``error`` event of that worker, and
training goes on. Worker-side module: the trackers are imported on the thread, never at import.
"""

from __future__ import annotations

import hashlib
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..contract import protocol
from ..contract.event_types import Error, Kind
from ._emit import emit
from .tracking import MAX_BATCH, mlflow_link, next_batch, scrub, wandb_link

PACKAGES = {"mlflow": "mlflow (or mlflow-skinny)", "wandb": "wandb"}


def which(env: Mapping[str, str] = os.environ) -> str | None:
    """The tracker this pod logs to, or None (not in a pod, ``none``, nothing configured)."""
    track = env.get(protocol.ENV_TRACK)
    if not track or track == "none":
        return None
    if track != "auto":
        return track
    if env.get("MLFLOW_TRACKING_URI"):
        return "mlflow"
    if env.get("WANDB_PROJECT") and env.get("WANDB_MODE") != "disabled":
        return "wandb"
    return None


class PodRun:
    """The job run's MLflow/W&B run, as seen by one rank-0 worker process."""

    def __init__(self, tracker: str) -> None:
        self.tracker = tracker
        self.job = os.environ.get(protocol.ENV_JOB, "job")
        self.run_key = os.environ.get(protocol.ENV_RUN) or self.job
        self.queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.failed = False
        # The open run, set by _open on the thread below: MLflow's client and run id, or W&B's run.
        self.client: Any = None
        self.run_id = ""
        self.run: Any = None
        self.logged_step = -1  # W&B's step only grows: the last one logged
        self.thread = threading.Thread(target=self._run, name=f"{tracker}-tracking", daemon=True)
        self.thread.start()

    def observe(self, step: int, values: dict[str, Any]) -> None:
        self.queue.put((step, time.time(), values))

    def end(self, finished: bool, last_attempt: bool = False, timeout_s: float = 20.0) -> None:
        """Log what is queued; end the run FINISHED when training ``finished``, FAILED when it
        failed on the ``last_attempt`` (else a retry logs on)."""
        self.queue.put(("end", finished, last_attempt))
        self.queue.put(None)
        self.thread.join(timeout=timeout_s)

    def _run(self) -> None:
        try:
            self._open()
        except ImportError as exc:
            self._fail(
                f"--track {self.tracker}: the image has no {PACKAGES.get(self.tracker, self.tracker)} package "
                f"({exc}); add it to the image (--image) to log this job's metrics; training goes on"
            )
        except Exception as exc:
            self._fail(
                f"{self.tracker} logging stopped: {type(exc).__name__}: {scrub(str(exc))[:300]} (training goes on)"
            )
        while True:
            batch = next_batch(self.queue)
            if not self.failed:
                try:
                    steps = [b for b in batch if b and b[0] != "end"]
                    if steps:
                        self._log(steps)
                    for b in batch:
                        if b and b[0] == "end" and (b[1] or b[2]):
                            self._finish(succeeded=b[1])
                except Exception as exc:
                    self._fail(
                        f"{self.tracker} logging stopped: {type(exc).__name__}: {scrub(str(exc))[:300]} (training goes on)"
                    )
            if None in batch:
                return

    def _fail(self, message: str) -> None:
        self.failed = True
        emit(Kind.ERROR, t=time.time(), **Error(error="tracker", message=message))

    def _open(self) -> None:
        if self.tracker == "mlflow":
            import mlflow
            from mlflow import MlflowClient

            self.client = client = MlflowClient()
            experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME")
            if experiment_id is None and experiment:
                found = client.get_experiment_by_name(experiment)
                experiment_id = found.experiment_id if found else client.create_experiment(experiment)
            experiment_id = experiment_id or "0"
            # The run this job run already has (an earlier rank 0, before a restart or a scale).
            same = client.search_runs([experiment_id], f"tags.`notebook_elastic.run` = '{self.run_key}'", max_results=1)
            if same:
                self.run_id = same[0].info.run_id
                if same[0].info.status != "RUNNING":  # ended FAILED by a rank 0 that gave up too soon
                    client.update_run(self.run_id, status="RUNNING")
            else:
                tags = {"notebook_elastic.job": self.job, "notebook_elastic.backend": "kubernetes"}
                run = client.create_run(
                    experiment_id,
                    start_time=int(time.time() * 1000),
                    run_name=self.job,
                    tags={**tags, "notebook_elastic.run": self.run_key},
                )
                self.run_id = run.info.run_id
            # MLflow prints the run's link as it ends, credentials and all: the event has it, stripped.
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
            emit(Kind.TRACKING, t=time.time(), **mlflow_link(mlflow.get_tracking_uri(), experiment_id, self.run_id))
        else:
            import wandb

            run_id = hashlib.sha256(self.run_key.encode()).hexdigest()[:16]  # one W&B run per job run
            self.run = wandb.init(
                id=run_id, resume="allow", name=self.job, tags=["notebook-elastic"], reinit="create_new"
            )
            self.logged_step = -1
            emit(Kind.TRACKING, t=time.time(), **wandb_link(self.run))

    def _log(self, steps: list[tuple[Any, ...]]) -> None:
        if self.tracker == "mlflow":
            from mlflow.entities import Metric

            metrics = [
                Metric(str(k), float(v), int(t * 1000), step)
                for step, t, values in steps
                for k, v in values.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            ]
            for i in range(0, len(metrics), MAX_BATCH):
                self.client.log_batch(self.run_id, metrics=metrics[i : i + MAX_BATCH])
        else:
            for step, _t, values in steps:
                if step > self.logged_step:  # W&B's step only grows: a step redone is logged once
                    self.run.log(dict(values), step=step)
                    self.logged_step = step

    def _finish(self, succeeded: bool) -> None:
        if self.tracker == "mlflow":
            self.client.set_terminated(self.run_id, "FINISHED" if succeeded else "FAILED")
        else:
            self.run.finish(exit_code=0 if succeeded else 1)


_run: PodRun | None = None
_lock = threading.Lock()


def observe(step: int, values: dict[str, Any]) -> None:
    """Called by ``report()`` on global rank 0 for each step: starts the run at the first."""
    global _run
    if _run is None:
        tracker = which()
        if tracker is None:
            return
        with _lock:
            if _run is None:
                from .worker import on_finish

                _run = PodRun(tracker)
                on_finish(_end)
    _run.observe(step, {**values, "job/world_size": int(os.environ.get("WORLD_SIZE", 1))})


def _end() -> None:
    """``run()``'s finish hook: inside its ``except`` while the cell's code is failing."""
    if _run is not None:
        exc = sys.exc_info()[1]
        finished = exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0))
        # Only a worker's own failure is charged to the budget (departures are not), so the
        # restart count is the attempts spent: on the last one a failure ends the job.
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        last = attempt >= int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0))
        _run.end(finished=finished, last_attempt=not finished and last)

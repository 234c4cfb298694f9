"""A worker's failure that will come back at every retry is not retried to the end of the
restart budget: a fatal one (said by the worker), or the same one twice at the same step. Held by
the ``Supervisor``; handed each ``worker_failed`` event, the workers it knows (rank -> pid, node,
generation) and the restarts the fold counted."""

from __future__ import annotations

from typing import Any

from ..contract.event_types import WorkerFailed
from ..contract.events import Event
from ..contract.job_state import describe_failure
from .nodes import Workers


class Repeats:
    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], int] = {}  # (rank, step, error, message) -> times
        self.failed_groups: set[Any] = set()  # the generations a worker failed in

    def verdict(self, e: Event, workers: Workers, restarts: int, max_restarts: int) -> tuple[str, bool] | None:
        """Why the job stops now, and whether the failure said itself fatal; None: retry it (or
        let the budget path end it, where the budget is spent)."""
        failed = e.fields(WorkerFailed)
        if failed.get("cause") == "peer":  # its collective broke because a peer left: a symptom
            return None
        key = (failed.get("rank"), failed.get("step"), failed.get("error"), failed.get("message"))
        self.seen[key] = self.seen.get(key, 0) + 1
        generation = failed.get("generation")
        if generation is None:  # its own line names its process: its group is the one it started in
            generation = next((gen for pid, _node, gen in workers.values() if pid == failed.get("pid")), None)
        if generation is not None:
            self.failed_groups.add(generation)
        what = describe_failure(e)
        if failed.get("fatal"):
            return what, True
        # The restarts used: as the agent told them, or at least one for each earlier group that
        # failed where its word is not folded yet (the agent's line and the worker's come through
        # different pipes: with the budget spent at this very failure, "fails the same way" and
        # "restart budget spent" raced, seen on torch 2.15). Spent: the budget path says it.
        used = max(restarts, len(self.failed_groups) - 1)
        if self.seen[key] >= 2 and failed.get("step") is not None and used < max_restarts:
            return f"fails the same way every time: {what} (twice at step {failed.get('step')})", False
        return None

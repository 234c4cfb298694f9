"""``ElasticJob``: the live handle on a job, the same for every backend.

It follows the backend's event stream in a background thread, folds events into a
``JobState`` and tells subscribers (``on_event``); views (the widget dashboard, the text
view) subscribe, the job never imports them. Operations (``scale``, ``stop``, drills) go
to the backend; their effects come back as events.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..contract.event_types import Error, Kind, Log, Status
from ..contract.events import Event, status_phrase
from ..contract.job_state import JobState, Metrics, summary_text
from ..contract.spec import JobSpec, check_scale
from ..errors import BackendError, SpecError
from . import waits

if TYPE_CHECKING:
    from ..backends.base import Backend, DrillAnswer, DryRun, JobInfo, RangeAnswer, ScaleAnswer

Callback = Callable[["Event", "ElasticJob"], None]
#: How long attach and resume() wait for the replay of the job's history (it reads a file).
REPLAY_TIMEOUT_S = 30.0
#: How often a handle of an ended job looks whether it was resumed elsewhere (the CLI, the jobs
#: panel, another kernel): a read of its listing (status.json for a local job).
RESUME_WATCH_S = 2.0
#: How long scale() and set_range() wait for the job's own word of the change before they answer
#: with what is still pending.
ANSWER_WAIT_S = 10.0


def _watch_for_a_resume(handle: weakref.ReferenceType[ElasticJob], stop: threading.Event, seen: int) -> None:
    """Until the handle is gone or told to stop following: once the backend lists more resumed
    runs than the handle folded (``seen``), the handle follows the resumed run (#39 item 3: a
    dashboard said "stopped 889/3000" after a resume from the CLI had run the job to its end)."""
    while not stop.wait(RESUME_WATCH_S):
        job = handle()
        if job is None:
            return
        try:
            info = job.backend.describe(job.name)
        except Exception:  # the backend cannot be asked now: ask again later
            continue
        recorded = int(((info.summary if info is not None else None) or {}).get("resumes") or 0)
        if recorded > seen:
            # resume() here holds the lock while it resumes and follows itself: nothing to do then.
            if job._refollowing.acquire(blocking=False):
                try:
                    if not stop.is_set():
                        job._refollow(info)
                finally:
                    job._refollowing.release()
            return
        del job  # no strong reference while waiting


class ElasticJob:
    """A running (or prepared, or finished) elastic training job."""

    def __init__(self, name: str, backend: Backend, spec: JobSpec | None = None, dryrun: DryRun | None = None) -> None:
        self.name = name
        self.backend = backend
        self.spec = spec
        self.dryrun = dryrun
        nnodes = spec.nnodes if spec else (1, 1)
        self._state = JobState(
            max_restarts=spec.max_restarts if spec else 0, nnodes=nnodes, target=spec.initial_nodes if spec else None
        )
        if spec is not None:
            self._state.nproc_per_node = spec.nproc_per_node
        self._lock = threading.RLock()
        # Told each time the follower folds an event in (or the stream ends): what waits on the
        # job's own word (scale, set_range) waits on this, not on a clock.
        self._folded = threading.Condition(self._lock)
        self._callbacks: list[Callback] = []
        self._finished = threading.Event()
        self._stop_following = threading.Event()
        self._follower: threading.Thread | None = None
        self._stream: Any = None  # what the backend's follow() gave (a cluster follower takes asks)
        self._output_of: str | None = None  # the node whose output was asked for live
        # The job_resumed events its backend has recorded (status.json's count, at attach or
        # resume()): until the replay has folded that many, the outcomes it passes are history.
        self._resumes_recorded = 0
        self._refollowing = threading.Lock()  # held while the handle turns to a resumed run
        self._prepared = dryrun is not None
        if dryrun is None:
            self._state.status = "pending"
        else:
            self._state.status = Status.PREPARED

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> ElasticJob:
        """Launch a job prepared with ``dry_run=True`` (no-op once started)."""
        with self._lock:
            if not self._prepared:
                return self
            if self.dryrun is None:
                raise BackendError(f"job {self.name!r} has nothing to start")
            self.backend.schedule(self.dryrun)
            self._prepared = False
            self._state.status = "pending"
        self._follow()
        return self

    def configure(
        self,
        *,
        nnodes: tuple[int, int] | str | None = None,
        nproc_per_node: int | None = None,
        max_restarts: int | None = None,
    ) -> None:
        """Change a prepared (``dry_run``) job's shape before ``start()``."""
        import dataclasses

        from ..contract.spec import parse_nnodes

        if not self._prepared or self.spec is None or self.dryrun is None:
            raise BackendError(
                f"job {self.name!r} has started; its shape can no longer be edited (use scale/set_range)"
            )
        changes: dict[str, Any] = {}
        if nnodes is not None:
            changes["nnodes"] = parse_nnodes(nnodes)
            if self.spec.nodes is not None and not changes["nnodes"][0] <= self.spec.nodes <= changes["nnodes"][1]:
                changes["nodes"] = None
        if nproc_per_node is not None:
            changes["nproc_per_node"] = nproc_per_node
        if max_restarts is not None:
            changes["max_restarts"] = max_restarts
        spec = dataclasses.replace(self.spec, **changes).validated()
        with self._lock:
            self.spec = spec
            self.dryrun = self.backend.submit_dryrun(spec, self.dryrun.bundle)
            self._state.nnodes = spec.nnodes
            self._state.target = spec.initial_nodes
            self._state.max_restarts = spec.max_restarts
            self._state.nproc_per_node = spec.nproc_per_node

    def _follow(self) -> None:
        if self._follower is not None:
            return
        self._follower = threading.Thread(target=self._run_follower, name=f"elastic-follow-{self.name}", daemon=True)
        self._follower.start()

    def _run_follower(self) -> None:
        # The state this follower folds into: resume() starts another follower on a new one,
        # and an old follower still busy (a slow callback outlasting resume()'s wait for it)
        # must neither fold into the new state nor end the resumed handle when it ends.
        state = self._state
        try:
            stream = self.backend.follow(self.name, self._stop_following)
            with self._lock:
                if self._state is not state:
                    return
                self._stream = stream
            if self._output_of is not None:
                self._ask_output(self._output_of, True)
            for event in stream:
                with self._lock:
                    if self._state is not state:
                        break  # resume() replaced it: the new follower replays from the first event
                    state.apply(event)
                    callbacks = list(self._callbacks)
                    self._folded.notify_all()
                for callback in callbacks:
                    try:
                        callback(event, self)
                    except Exception:
                        traceback.print_exc()
                # No _finished.set() on job_finished here: a resumed job's history goes on after
                # one. The stream ends after the job's last word; then it is finished.
        except Exception as exc:
            with self._lock:
                if self._state is state:
                    state.apply(
                        Event(Kind.ERROR, time.time(), None, dict(Error(message=f"lost the job's event stream: {exc}")))
                    )
        finally:
            with self._lock:
                self._folded.notify_all()
                if state.finished and self._state is state:
                    self._finished.set()
                    # Files say when a local or Slurm job is resumed elsewhere; a cluster is not polled.
                    if not self._stop_following.is_set() and getattr(self.backend, "name", "") in ("local", "slurm"):
                        threading.Thread(
                            target=_watch_for_a_resume,
                            args=(weakref.ref(self), self._stop_following, state.resumes),
                            name=f"elastic-resume-watch-{self.name}",
                            daemon=True,
                        ).start()

    def follow_output(self, node: str | None) -> None:
        """Stream ``node``'s output live (None: back to the default). A Kubernetes job's
        follower holds a few pods' logs open at once (rank 0's and failing pods' first, the
        others read in turns); the node asked for takes a slot before the ones nobody asked
        for. A local job's nodes are all streamed already."""
        if node is not None and node not in self._state.nodes:
            known = ", ".join(sorted(self._state.nodes)) or "none yet"
            raise BackendError(f"job {self.name!r} has no node named {node!r} (its nodes: {known})")
        before, self._output_of = self._output_of, node
        if before is not None and before != node:
            self._ask_output(before, False)
        if node is not None:
            self._ask_output(node, True)

    def _ask_output(self, node: str, live: bool) -> None:
        ask = getattr(self._stream, "follow_pod" if live else "unfollow_pod", None)
        if ask is not None:
            ask(node)

    def detach(self) -> None:
        """Stop following the job (it keeps running; ``attach`` finds it again)."""
        self._stop_following.set()

    # -- state ---------------------------------------------------------------------------

    @property
    def state(self) -> JobState:
        return self._state

    def reading(self) -> threading.RLock:
        """Hold the state still while reading several of its parts together (a view drawing
        a picture): ``with job.reading(): ...``. The follower's events wait meanwhile."""
        return self._lock

    @property
    def status(self) -> str:
        """prepared, pending, running, restarting, succeeded, failed or stopped."""
        return self._state.status

    @property
    def reason(self) -> str | None:
        return self._state.reason

    @property
    def world_size(self) -> int:
        return self._state.world_size

    @property
    def nodes(self) -> list[str]:
        with self._lock:
            return [n.name for n in self._state.running_nodes]

    @property
    def restarts(self) -> int:
        return self._state.restarts

    @property
    def restart_budget(self) -> int:
        return self._state.max_restarts

    @property
    def metrics(self) -> Metrics:
        return self._state.metrics

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._state.events)

    @property
    def logs(self) -> list[str]:
        with self._lock:
            return [f"[{e.node}] {e.fields(Log).get('text')}" for e in self._state.logs]

    @property
    def failure(self) -> Event | None:
        """The root-cause worker failure (its traceback: ``.fields(WorkerFailed).get('traceback')``)."""
        return self._state.first_failure

    @property
    def script(self) -> str | None:
        if self.dryrun is not None:
            return self.dryrun.bundle.script
        return self.backend.script(self.name)

    def history(self) -> Iterator[Event]:
        """Every event recorded so far (metrics and worker output included), oldest first."""
        return self.backend.history(self.name)

    @property
    def finished(self) -> bool:
        # A resumed job replaying its history is not finished at an old outcome it passes.
        return self._state.finished and self._replayed()

    def _replayed(self) -> bool:
        return self._state.resumes >= self._resumes_recorded

    def _await_history(self, timeout_s: float = REPLAY_TIMEOUT_S) -> None:
        """Wait until the follower has folded every event recorded before it began, where the
        backend's stream says when (``caught_up``), or has ended: a handle that attaches then
        shows the job's present (its status, step, finished) from the caller's next line."""
        deadline = time.monotonic() + timeout_s
        while self._follower is not None and self._follower.is_alive() and time.monotonic() < deadline:
            stream = self._stream
            if stream is not None:
                caught_up = getattr(stream, "caught_up", None)
                if caught_up is None:
                    return  # a stream that cannot say (a cluster's pod logs)
                if caught_up.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
                    return
            else:
                time.sleep(0.01)

    def _expect_resumes(self, info: JobInfo | None) -> None:
        """Take the count of runs resumed from the backend's listing (0 where it keeps none)."""
        self._resumes_recorded = int(((info.summary if info is not None else None) or {}).get("resumes") or 0)

    def on_event(self, callback: Callback) -> Callable[[], None]:
        """``callback(event, job)`` for every event from now on (a background thread); returns the unsubscribe."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def wait(self, timeout: float | None = None) -> str:
        """Block until the job ends (or ``timeout`` s pass): its status. In a cell: ``await job.ended()``."""
        if self._prepared:
            raise BackendError(f"job {self.name!r} was only prepared (dry run); call .start() first")
        self._finished.wait(timeout)
        return self.status

    def wait_until(self, condition: waits.Condition, what: str = "it", timeout: float | None = None) -> None:
        """Block until ``condition()`` (a script's wait; in a cell ``await job.until``); a
        ``TimeoutError`` after ``timeout`` s, a ``RuntimeError`` if the job ends first."""
        waits.Wait(self, condition, what, timeout).blocking()

    async def until(self, condition: waits.Condition, what: str = "it", timeout: float | None = None) -> None:
        """``await job.until(lambda: (job.state.step or 0) >= 35, "step 35")`` in a cell: the kernel
        answers the dashboard while it waits, Run All included (``kernel/waits.py``)."""
        await waits.Wait(self, condition, what, timeout).awaiting()

    async def ended(self, timeout: float | None = None) -> str:
        """``await job.ended()`` in a cell: the final status, the kernel free meanwhile."""
        return await waits.ended(self, timeout)

    # -- operations ----------------------------------------------------------------------

    def _require_running(self, what: str) -> None:
        if self._prepared:
            raise BackendError(f"job {self.name!r} is prepared but not started; call .start() before {what}")
        if self.finished:
            raise BackendError(f"job {self.name!r} {status_phrase(self.status)}; it cannot {what}")

    def scale(self, nodes: int) -> ScaleAnswer:
        """Run on ``nodes`` nodes (within the range); the survivors keep their processes (in
        place, docs/guide/in-place.md). Returns once the job itself has said its new target
        (``job.state.target``), or after ``ANSWER_WAIT_S`` with ``pending`` saying what it has
        not said yet."""
        self._require_running("scale")
        check_scale(self._state.nnodes, nodes)
        result = self.backend.scale(self.name, int(nodes))
        pending = self._await(lambda: self._state.target == int(nodes), f"its new target of {int(nodes)} node(s)")
        return dataclasses.replace(result, pending=pending) if pending else result

    def set_range(self, min_nodes: int, max_nodes: int) -> RangeAnswer:
        """Change the elastic range (``--nnodes MIN:MAX``). torchrun fixes the range per agent,
        so the agents restart with the new one and resume from the latest checkpoint."""
        self._require_running("change its range")
        if not (isinstance(min_nodes, int) and isinstance(max_nodes, int)) or not 1 <= min_nodes <= max_nodes:
            raise SpecError(f"range {min_nodes}:{max_nodes} is invalid: need whole numbers 1 <= MIN <= MAX")
        result = self.backend.set_range(self.name, min_nodes, max_nodes)
        pending = self._await(
            lambda: tuple(self._state.nnodes) == (min_nodes, max_nodes), f"its new range {min_nodes}:{max_nodes}"
        )
        return dataclasses.replace(result, pending=pending) if pending else result

    def _await(self, done: Callable[[], bool], what: str, timeout_s: float | None = None) -> str | None:
        """Wait until the job's own event about a change is folded in (woken by each event the
        follower folds, no polling), so the next call sees the state it caused. None once it
        is; else one sentence of what is still pending."""
        timeout_s = ANSWER_WAIT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        with self._folded:
            while not done():
                if self.finished:
                    return f"job {self.name!r} {status_phrase(self.status)} before it said {what}"
                left = deadline - time.monotonic()
                if left <= 0:
                    return (
                        f"asked, but job {self.name!r} has not said {what} within {timeout_s:g} s "
                        "(its supervisor may be busy); job.state shows it once it does"
                    )
                self._folded.wait(left)
        return None

    def kill_worker(self, rank: int | None = None) -> DrillAnswer:
        """Drill: SIGKILL one worker process (a random one by default)."""
        self._require_running("kill a worker")
        return self.backend.inject(self.name, "kill_worker", rank)

    def preempt_node(
        self, node: str | None = None, *, return_after_s: float | None = None, grace_s: float | None = 30.0
    ) -> DrillAnswer:
        """Drill: take a node away with notice, as a spot reclaim or another team's quota would.
        With ``grace_s`` (the kubelet's default 30 s) the job is told first: its ``State`` saves
        at the next step boundary and the node goes once that save is on disk (or when the
        grace is over), so a grace that covers a step and a save loses no step; ``grace_s=0``
        takes it at once (SIGTERM to its agent). With ``return_after_s`` the capacity comes back.
        On Kubernetes the pod is evicted (the notice there is the kubelet's SIGTERM)."""
        self._require_running("preempt a node")
        return self.backend.inject(self.name, "preempt_node", node, return_after_s=return_after_s, grace_s=grace_s)

    def lose_node(self, node: str | None = None) -> DrillAnswer:
        """Drill: a node dies without notice, as a host lost would (its agent and workers SIGKILLed
        together here; its pod deleted at once on Kubernetes; its step killed on Slurm)."""
        self._require_running("lose a node")
        return self.backend.inject(self.name, "lose_node", node)

    def stop(self, timeout: float = 60.0) -> str:
        """Stop the job and every process it started. Idempotent."""
        if self._prepared:
            self._state.status = "stopped"
            return self.status
        if not self.finished:
            self.backend.cancel(self.name)
            self._follow()
            self._finished.wait(timeout)
        return self.status

    def resume(self) -> ElasticJob:
        """Continue this lost, failed or stopped job from its latest checkpoint, in its folder,
        with the same spec: the step counter and the data cursor carry on, the history stays
        (a "resumed" marker on the chart), and the restart budget starts again. Returns once
        the job's state shows the resumed run (not the outcome it continues from)."""
        with self._refollowing:
            self.backend.resume(self.name)  # returns once job_resumed is written and counted
            self._prepared = False
            self._refollow(self.backend.describe(self.name))
        return self

    def _refollow(self, info: JobInfo | None) -> None:
        """Follow the job's resumed run (resumed here, or elsewhere: ``_watch_for_a_resume``):
        a new state replayed from the first event, the same callbacks (a dashboard follows)."""
        self._stop_following.set()
        if self._follower is not None and self._follower is not threading.current_thread():
            self._follower.join(timeout=5)
        with self._lock:
            # Replayed from the first event: the history, then the resumed run, live.
            self._state = JobState(
                max_restarts=self._state.max_restarts, nnodes=self._state.nnodes, target=self._state.target
            )
            if self.spec is not None:
                self._state.nproc_per_node = self.spec.nproc_per_node
            self._finished.clear()  # with the swap: an old follower ending sets it before, or not at all
        self._stop_following = threading.Event()
        self._follower = None
        self._stream = None  # the old stream's caught_up says nothing of the new one
        self._expect_resumes(info)
        self._follow()
        assert self._follower is not None  # _follow() just started one
        deadline = time.monotonic() + REPLAY_TIMEOUT_S  # the replay up to it reads a file
        while not self._replayed() and self._follower.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._await_history(max(0.0, deadline - time.monotonic()))

    # -- display -------------------------------------------------------------------------

    def summary(self) -> str:
        return summary_text(self.name, self._state)

    def __repr__(self) -> str:
        return f"<ElasticJob {self.summary()}>"

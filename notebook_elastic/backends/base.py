"""The interface every backend implements, in the spirit of TorchX's ``Scheduler``.

A backend turns a validated ``JobSpec`` plus a packaged ``Bundle`` into running processes
and reports what happens to them as ``Event``s. ``submit_dryrun`` returns the exact request
``schedule`` would carry out (files and commands locally, manifests on Kubernetes), so it
can be inspected and tested without running anything.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..contract.event_types import ATTENTION_ORDER
from ..contract.job_state.records import JobSummary
from ..errors import BackendError

if TYPE_CHECKING:
    from ..contract.events import Event
    from ..contract.spec import JobSpec
    from ..packaging import Bundle
    from .kubernetes.submit import ClusterRequest
    from .local import FolderRequest


@dataclass
class DryRun:
    """What ``schedule`` would do, without doing it."""

    backend: str
    spec: JobSpec
    bundle: Bundle
    request: FolderRequest | ClusterRequest  # a job folder's files and commands (local, Slurm); a cluster's objects
    text: str = ""  # the request, for people

    def __str__(self) -> str:
        return self.text


class Answer(Mapping[str, object]):
    """What a backend answers a change of a running job (``scale``, ``set_range``, ``inject``):
    a dataclass read by its fields (``answer.node``), and, as the plain dicts these answers
    were before, a read-only mapping of its fields that hold a value (``answer["node"]``,
    ``answer.get("grace_s")``, ``dict(answer)``): a notebook written against those still runs."""

    def __getitem__(self, key: str) -> object:
        if key in self._given():
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._given())

    def __len__(self) -> int:
        return len(self._given())

    def _given(self) -> list[str]:
        assert dataclasses.is_dataclass(self)  # every answer is one
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]


# eq=False: an answer equals another, or a dict, as a mapping does (by its given fields).
@dataclass(frozen=True, eq=False)
class ScaleAnswer(Answer):
    """``scale``: the number of nodes the job now aims at; ``pending``, from the job handle,
    what the job has not said yet when it answered (None: it said its new target)."""

    target: int
    pending: str | None = None


@dataclass(frozen=True, eq=False)
class RangeAnswer(Answer):
    """``set_range``: the nodes the job aims at within the new range; ``reconfigured`` when its
    nodes were started again with it (False: the range was already that); ``epoch``, on a
    cluster, the rendezvous epoch the new workers meet in."""

    target: int
    reconfigured: bool
    epoch: int | None = None
    pending: str | None = None  # as ScaleAnswer's


@dataclass(frozen=True, eq=False)
class DrillAnswer(Answer):
    """``inject``: what the drill hit, the node (a pod on a cluster) and, for ``kill_worker``, the
    rank and its process; for a node taken away, the nodes the job now aims at (it is not
    replaced) and the notice it was given (``grace_s``, when one was)."""

    node: str | None = None
    rank: int | None = None
    pid: int | None = None
    target: int | None = None
    grace_s: float | None = None


@dataclass
class JobInfo:
    """A job as listed by a backend (``jobs()``, ``%elastic_jobs``, the jobs panel)."""

    name: str
    backend: str
    status: str
    summary: JobSummary = field(default_factory=lambda: JobSummary())
    notebook: str | None = None
    created: float | None = None
    location: str | None = None  # a job folder, a namespace, ...
    damaged: str | None = None  # why the job's records could not be read, if so


def attention_order(jobs: list[JobInfo]) -> list[JobInfo]:
    """Jobs as every listing shows them (``jobs()``, ``%elastic_jobs``, ``GET /jobs``, the
    panel): those that need attention first (restarting, running, recovering, pending), then
    ended ones; newest first within each status."""

    def key(info: JobInfo) -> tuple[int, float, str]:
        status = info.status
        rank = ATTENTION_ORDER.index(status) if status in ATTENTION_ORDER else ATTENTION_ORDER.index("pending")
        started = info.summary.get("started_at") or info.created or 0.0
        if isinstance(started, bool) or not isinstance(started, (int, float)) or not math.isfinite(started):
            started = 0.0  # a damaged status.json's: sorted last of its status, never the whole list's end
        return rank, -float(started), str(info.name)

    return sorted(jobs, key=key)


class Backend(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def submit_dryrun(self, spec: JobSpec, bundle: Bundle) -> DryRun: ...

    @abc.abstractmethod
    def schedule(self, dryrun: DryRun) -> None:
        """Start the job; returns once it is submitted (does not wait for it to run)."""

    @abc.abstractmethod
    def describe(self, name: str) -> JobInfo | None: ...

    @abc.abstractmethod
    def list(self) -> list[JobInfo]: ...

    @abc.abstractmethod
    def cancel(self, name: str) -> None:
        """Stop the job and everything it started. Idempotent: stopping a stopped job is a no-op."""

    def resume(self, name: str) -> None:
        """Continue a lost, failed or stopped job from its latest checkpoint, history kept."""
        raise BackendError(f"the {self.name} backend cannot resume jobs yet; launch the cell again")

    @abc.abstractmethod
    def follow(self, name: str, stop: threading.Event) -> Iterable[Event]:
        """The job's events from the first one on, then live ones as they happen; ends after
        ``job_finished`` or when ``stop`` is set. A stream with ``follow_pod(node)`` /
        ``unfollow_pod(node)`` takes asks for a node's output (``ElasticJob.follow_output``)."""

    @abc.abstractmethod
    def scale(self, name: str, nodes: int) -> ScaleAnswer: ...

    @abc.abstractmethod
    def set_range(self, name: str, min_nodes: int, max_nodes: int) -> RangeAnswer: ...

    @abc.abstractmethod
    def inject(
        self,
        name: str,
        fault: str,
        target: int | str | None = None,
        *,
        return_after_s: float | None = None,
        grace_s: float | None = None,
    ) -> DrillAnswer:
        """Fault drills: ``kill_worker`` (``target``: a rank), ``preempt_node`` (with a notice of
        ``grace_s`` where the backend gives one) / ``lose_node`` (``target``: a node; its capacity
        back after ``return_after_s`` where the backend takes it away itself)."""

    def history(self, name: str) -> Iterator[Event]:
        """Every event recorded so far, metrics and output included; does not wait."""
        stop = threading.Event()
        stop.set()
        return iter(self.follow(name, stop))

    def script(self, name: str) -> str | None:
        return None

"""The interface every backend implements, in the spirit of TorchX's ``Scheduler``.

A backend turns a validated ``JobSpec`` plus a packaged ``Bundle`` into running processes
and reports what happens to them as ``Event``s. ``submit_dryrun`` returns the exact request
``schedule`` would carry out (files and commands locally, manifests on Kubernetes), so it
can be inspected and tested without running anything.
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import BackendError
from ..runtime.protocol import ATTENTION_ORDER

if TYPE_CHECKING:
    from ..contract.events import Event
    from ..contract.spec import JobSpec
    from ..packaging import Bundle


@dataclass
class DryRun:
    """What ``schedule`` would do, without doing it."""

    backend: str
    spec: JobSpec
    bundle: Bundle
    request: Any  # backend-specific: a dict of files and commands, a list of manifests, ...
    text: str = ""  # the request, for people

    def __str__(self) -> str:
        return self.text


@dataclass
class JobInfo:
    """A job as listed by a backend (``jobs()``, ``%elastic_jobs``, the jobs panel)."""

    name: str
    backend: str
    status: str
    summary: dict[str, Any] = field(default_factory=dict)
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
    def scale(self, name: str, nodes: int) -> dict[str, Any]: ...

    @abc.abstractmethod
    def set_range(self, name: str, min_nodes: int, max_nodes: int) -> dict[str, Any]: ...

    @abc.abstractmethod
    def inject(self, name: str, fault: str, target: Any = None, **options: Any) -> dict[str, Any]:
        """Fault drills: ``kill_worker`` (a rank), ``preempt_node`` / ``lose_node`` (a node)."""

    def history(self, name: str) -> Iterator[Event]:
        """Every event recorded so far, metrics and output included; does not wait."""
        stop = threading.Event()
        stop.set()
        return iter(self.follow(name, stop))

    def script(self, name: str) -> str | None:
        return None

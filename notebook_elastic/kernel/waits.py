"""Waiting on a job until something holds, in a script or in a cell.

A cell that blocks (``time.sleep`` in a loop, ``job.wait()``) keeps the kernel's main thread
busy, and the kernel then reads no message from the page: the dashboard's Scale button, its
slider and its chart controls do nothing until the cell ends, and under Run All until the job
ends. A cell that *awaits* (``await job.until(...)``, ``await job.ended()``) leaves the
kernel's event loop free: ipykernel (7.x) hands the page's widget messages to their widgets
while it waits, and the later cells of a Run All still run in order, after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import BackendError

POLL_S = 0.1  # how often a wait looks again
Condition = Callable[[], Any]


class Awaited(Protocol):
    """What a wait reads of the job it waits on (an ``ElasticJob``, the layer above)."""

    _prepared: bool
    name: str

    @property
    def finished(self) -> bool: ...

    @property
    def status(self) -> str: ...

    def summary(self) -> str: ...


class Wait:
    """One wait on ``job`` (an ElasticJob, the layer above): the condition, what to call it in
    an error, and its deadline."""

    def __init__(self, job: Awaited, condition: Callable[[], Any], what: str, timeout: float | None) -> None:
        if job._prepared:
            raise BackendError(f"job {job.name!r} was only prepared (dry run); call .start() first")
        self.job = job
        self.condition = condition
        self.what = what
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def done(self) -> bool:
        """True once the condition holds; an error once it never can, or time is up."""
        if self.condition():
            return True
        if self.job.finished and not self.condition():
            raise RuntimeError(f"job {self.job.name!r} ended before {self.what}: {self.job.summary()}")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TimeoutError(f"timed out after {self.timeout:g} s waiting for {self.what}: {self.job.summary()}")
        return False

    def blocking(self) -> None:
        while not self.done():
            time.sleep(POLL_S)

    async def awaiting(self) -> None:
        while not self.done():
            await asyncio.sleep(POLL_S)


async def ended(job: Awaited, timeout: float | None) -> str:
    """The job's final status, awaited; its status then if ``timeout`` seconds pass first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not job.finished and (deadline is None or time.monotonic() < deadline):
        await asyncio.sleep(POLL_S)
    return job.status

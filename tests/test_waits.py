"""Waiting on a job (``kernel/waits.py``): ``job.wait_until`` blocks, ``await job.until`` and ``await
job.ended`` leave the event loop free; each says where the job is when it gives up."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from notebook_elastic.errors import BackendError
from notebook_elastic.kernel import waits


class Job:
    """What a wait reads of an ElasticJob."""

    def __init__(self, prepared: bool = False) -> None:
        self.name, self._prepared, self.finished, self.status, self.step = "toy", prepared, False, "running", 0

    def summary(self) -> str:
        return f"toy: {self.status}, step {self.step}"


def test_a_blocking_wait_returns_once_the_condition_holds_and_says_where_the_job_is_when_it_gives_up():
    job = Job()
    threading.Timer(0.3, lambda: setattr(job, "step", 35)).start()
    waits.Wait(job, lambda: job.step >= 35, "step 35", timeout=10).blocking()
    with pytest.raises(TimeoutError, match=r"timed out after 0.2 s waiting for step 99: toy: running, step 35"):
        waits.Wait(job, lambda: job.step >= 99, "step 99", timeout=0.2).blocking()
    job.finished, job.status = True, "succeeded"
    with pytest.raises(RuntimeError, match=r"job 'toy' ended before step 99: toy: succeeded"):
        waits.Wait(job, lambda: job.step >= 99, "step 99", timeout=None).blocking()
    with pytest.raises(BackendError, match="only prepared"):
        waits.Wait(Job(prepared=True), lambda: True, "x", None)


def test_an_awaited_wait_leaves_the_event_loop_free():
    job = Job()
    ticks = []

    async def meanwhile() -> None:  # what the kernel does with the page's messages while a cell awaits
        for _ in range(5):
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)
        job.step = 35

    async def cell() -> str:
        task = asyncio.create_task(meanwhile())
        await waits.Wait(job, lambda: job.step >= 35, "step 35", timeout=10).awaiting()
        await task
        job.finished, job.status = True, "succeeded"
        return await waits.ended(job, timeout=5)

    assert asyncio.run(cell()) == "succeeded"
    assert len(ticks) == 5  # the loop ran the other task while the wait waited

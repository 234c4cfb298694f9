"""The one way the tests wait: for a state, never for a time.

``wait_for(lambda: job.world_size == 2, "two nodes", job=job)`` looks again every ``poll_s``
until the predicate holds; the timeout only bounds a broken run (on a loaded 2-core machine a
state can take minutes: wait for it, do not assume it). A failure names what was awaited and,
given the job, what it was doing (its summary, its latest events and the latest lines its
processes logged: an agent's traceback is often the one clue a run on CI leaves). ``give_up_when_finished``
fails at once when the job ended without the state, rather than at the timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: How many of the job's latest log lines a failure shows.
LOG_LINES = 40


def wait_for(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = 180.0,
    *,
    job: Any = None,
    give_up_when_finished: bool = False,
    poll_s: float = 0.1,
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        finished = job is not None and give_up_when_finished and job.finished
        if finished and not predicate():
            raise AssertionError(f"the job ended before {what}: {_said(job)}")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}" + (f": {_said(job)}" if job else "")
            )
        time.sleep(poll_s)


def _said(job: Any) -> str:
    lines = [job.summary()]
    try:
        lines += [e.describe() for e in job.events[-20:]]
    except Exception:  # a handle whose events cannot be read: its summary says enough
        pass
    try:
        logged = job.logs[-LOG_LINES:]
    except Exception:  # a handle without logs (a dry run, a closed folder)
        logged = []
    if logged:
        lines += [f"its latest {len(logged)} log line(s):", *(line[:300] for line in logged)]
    return "\n".join(lines)

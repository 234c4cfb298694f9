"""Worker failures in words, the same on every backend: which rank raised what (memory said
plainly), the root cause among a generation's failures, and why a job whose restart budget
is spent failed."""

from __future__ import annotations

from ..event_types import WorkerFailed
from ..events import Event

OUT_OF_MEMORY = ("MemoryError", "OutOfMemoryError")


def describe_failure(e: Event) -> str:
    """ "rank 0 on node-1 raised ZeroDivisionError: division by zero"; memory said plainly."""
    d = e.fields(WorkerFailed)
    node = e.sender
    where = f"rank {d.get('rank')}" + (f" on {node}" if node else "")
    if d.get("error") in OUT_OF_MEMORY:
        return f"{where} ran out of memory ({d.get('error')}: {d.get('message')})"
    return f"{where} raised {d.get('error')}: {d.get('message')}"


def first_failure(failures: list[Event]) -> Event | None:
    """The root cause: the earliest worker failure of the latest failed generation."""
    if not failures:
        return None
    latest_gen = failures[-1].fields(WorkerFailed).get("generation")
    return min((f for f in failures if f.fields(WorkerFailed).get("generation") == latest_gen), key=lambda f: f.time)


def budget_spent_reason(failures: list[Event], restarts: int, max_restarts: int | None, fallback: str) -> str:
    """Why a job whose restart budget is spent failed, the same words on every backend:
    "restart budget spent (1/1); rank 0 on node-0 raised ValueError: bad batch"."""
    budget = "restart budget spent" + (f" ({restarts}/{max_restarts})" if max_restarts is not None else "")
    first = first_failure(failures)
    if first is None:
        return f"{budget}; {fallback}" if fallback else budget
    return f"{budget}; {describe_failure(first)}"

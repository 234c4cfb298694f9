"""What the server extension's routes answer, typed: a row of ``GET /notebook-elastic/api/jobs``
(what the jobs panel reads of each job) and each route's reply around it.

``routes.job_json`` builds a row (mypy checks its keys and types against ``JobRow``), each
handler its reply (``JobsReply``, ``EventsReply``, ``StopReply``, ``ErrorReply``), and
``scripts/gen_contract.py`` turns these classes into the labextension's interfaces (``IJobRow``,
``IJobsReply``... in ``labextension/src/contract.ts``), so the panel and the server cannot
drift apart."""

from __future__ import annotations

import sys
import types
from typing import Any, NewType, TypedDict, Union, get_args, get_origin, get_type_hints, is_typeddict

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

from ..contract.job_state.records import Transition  # the fold's, sent as it is

__all__ = [
    "ErrorReply",
    "EventLine",
    "EventsReply",
    "JobRow",
    "JobsReply",
    "StopReply",
    "Tracking",
    "Transition",
    "a_type",
    "mismatch",
]


class Tracking(TypedDict):
    """Where a job's run is tracked (runtime/tracking.py ``shown``): credentials stripped."""

    tracker: str
    label: str
    url: str | None  # the run's page (http(s) only)
    command: str | None  # the command that shows it: mlflow ui ..., wandb sync ..., tensorboard --logdir ...
    path: str | None


class JobRow(TypedDict):
    name: str
    backend: str
    status: str
    damaged: str | None
    reason: str | None
    waiting: str | None  # why capacity the job asked for is not coming
    stall: str | None  # a stall in progress, in words
    warning: str | None  # a condition the job trains on through (a full checkpoint disk)
    world_size: int | None
    nodes_running: int | None
    target: int | None
    min_nodes: int | None
    max_nodes: int | None
    restarts: int | None
    max_restarts: int | None
    step: int | None  # steps done (the last step reported + 1), as every view counts them
    total_steps: int | None
    loss: float | None
    loss_tail: list[float]
    step_time_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    gpu_mem_peak_bytes: int | None
    gpu_util_percent: float | None
    tracking: list[Tracking]
    transitions: list[Transition]
    started_at: float | None
    finished_at: float | None
    ran_s: NotRequired[float | None]  # how long it ran, its stopped spells left out (JobState.ran_s)
    notebook: str | None  # relative to the server's root, or None outside it
    location: str | None  # a job folder, a namespace


class JobsReply(TypedDict):
    """``GET /jobs``: every job this server sees, and why a backend could not be listed."""

    jobs: list[JobRow]
    errors: dict[str, str]  # a backend's name: why its jobs are missing from the list
    server_ms: float  # how long the server took to answer


#: A line of a job's events.jsonl as ``GET /jobs/NAME/events`` serves it (``Event.to_json``): any
#: kind's event, its fields checked by its kind's class where it was made (contract.ts: IEvent).
EventLine = NewType("EventLine", dict[str, Any])


class EventsReply(TypedDict):
    """``GET /jobs/NAME/events``: a job's events after a cursor, and the next cursor."""

    events: list[EventLine]
    next: int  # the byte offset to ask from next time (``since``)
    note: NotRequired[str]  # lines of the file that were not events, skipped


class StopReply(TypedDict):
    """``POST /jobs/NAME/stop``: the job's status once it stopped ("gone" when nothing is left of it)."""

    name: str
    status: str


class ErrorReply(TypedDict):
    """Any route's answer to a request it refused (4xx) or could not serve (5xx)."""

    message: str  # one sentence: what is wrong, and how to fix it
    reason: str | None  # the HTTP reason phrase


def mismatch(row: Any, hint: Any = JobRow, where: str = "") -> str | None:
    """Where ``row`` is not of its type, in words (the first key that is not: "'world_size' is
    a str ('two'), not a whole number or null"); None when it is. What the panel would be
    sent is checked against this module's classes, so a job whose status holds a field of the
    wrong type is one damaged row, not a 500 for every job (#37)."""
    origin, args = get_origin(hint), get_args(hint)
    if getattr(origin, "_name", None) in ("NotRequired", "Required"):  # Python 3.10 keeps the wrapper
        return mismatch(row, args[0], where)
    if hint is Any:
        return None
    if origin in (Union, types.UnionType):
        return None if any(mismatch(row, arm, where) is None for arm in args) else _wrong(row, hint, where)
    if is_typeddict(hint):
        if not isinstance(row, dict):
            return _wrong(row, hint, where)
        # NotRequired read from the hints themselves: with postponed annotations (this module's)
        # the class's __required_keys__ counts every key as required.
        for key, key_hint in get_type_hints(hint, include_extras=True).items():
            if key not in row:
                optional = getattr(get_origin(key_hint), "_name", None) == "NotRequired"
                if not optional and key in hint.__required_keys__:
                    return f"{_at(where, key)!r} is missing"
                continue
            found = mismatch(row[key], key_hint, _at(where, key))
            if found:
                return found
        return None
    if origin is list:
        if not isinstance(row, list):
            return _wrong(row, hint, where)
        for i, item in enumerate(row):
            found = mismatch(item, args[0], f"{where}[{i}]")
            if found:
                return found
        return None
    ok = {
        type(None): row is None,
        str: isinstance(row, str),
        bool: isinstance(row, bool),
        int: isinstance(row, int) and not isinstance(row, bool),
        float: isinstance(row, (int, float)) and not isinstance(row, bool),
    }.get(hint)
    if ok is None:
        raise TypeError(f"mismatch() does not know {hint!r}")  # a new kind of field: teach it here
    return None if ok else _wrong(row, hint, where)


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _wrong(value: Any, hint: Any, where: str) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{where!r} is {a_type(value)} ({shown}), not {_expected(hint)}"


def a_type(value: Any) -> str:
    """'a str', 'an int': the type of ``value`` in words."""
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _expected(hint: Any) -> str:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(arm) for arm in args)
    if origin is list:
        return f"a list of {_expected(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if is_typeddict(hint):
        return f"a {hint.__name__.lower()} record"
    return {type(None): "null", str: "text", bool: "true or false", int: "a whole number", float: "a number"}.get(
        hint, repr(hint)
    )

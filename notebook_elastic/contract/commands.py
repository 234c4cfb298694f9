"""What the kernel may ask of a running job's supervisor, typed: one class per command, read from
the wire (``{"command": NAME, "args": {...}}``, jobfolder/control.py) once, in ``parse``, where a
request that is not one of them is refused in one sentence. The supervisor's ``Commands`` then
takes each by its type, not by a string."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Scale:
    nodes: int


@dataclass(frozen=True)
class SetRange:
    min_nodes: int
    max_nodes: int


@dataclass(frozen=True)
class KillWorker:
    rank: int | None = None


@dataclass(frozen=True)
class RemoveNode:
    """A drill that takes a node away: ``preempt`` (SIGTERM, after notice when ``grace_s``) or
    ``lose`` (SIGKILL, no notice); the capacity comes back after ``return_after_s``."""

    how: Literal["preempt", "lose"]
    node: str | None = None
    return_after_s: float | None = None
    grace_s: float | None = None


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Status:
    pass


Command = Scale | SetRange | KillWorker | RemoveNode | Stop | Status

#: The commands a stopping job still answers.
WHILE_STOPPING = (Stop, Status)

#: The wire name of every command, as the kernel sends it (``preempt_node`` and ``lose_node`` are
#: both a ``RemoveNode``).
NAMES = ("scale", "set_range", "kill_worker", "preempt_node", "lose_node", "stop", "status")


def _int(args: dict[str, Any], key: str, command: str) -> int:
    try:
        value = args[key]
        if isinstance(value, bool):
            raise TypeError(value)
        return int(value)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{command} needs a whole number {key}, not {args.get(key)!r}") from None


def _seconds(args: dict[str, Any], key: str, command: str) -> float | None:
    value = args.get(key)
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError(value)
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{command} needs {key} in seconds, not {value!r}") from None


def parse(request: Any) -> Command:
    """The command a request names, or a ``ValueError`` sentence saying what is wrong with it."""
    if not isinstance(request, dict):
        raise ValueError(f"a request is a JSON object with a command, not {type(request).__name__}")
    name = request.get("command")
    args = request.get("args") or {}
    if not isinstance(args, dict):
        raise ValueError(f"{name}: its args are a JSON object, not {type(args).__name__}")
    if name == "scale":
        return Scale(_int(args, "nodes", name))
    if name == "set_range":
        return SetRange(_int(args, "min_nodes", name), _int(args, "max_nodes", name))
    if name == "kill_worker":
        rank = args.get("rank")
        return KillWorker(None if rank is None else _int(args, "rank", name))
    if name in ("preempt_node", "lose_node"):
        node = args.get("node")
        if node is not None and not isinstance(node, str):
            raise ValueError(f"{name} names a node by its name, not {node!r}")
        return RemoveNode(
            "lose" if name == "lose_node" else "preempt",
            node,
            _seconds(args, "return_after_s", name),
            _seconds(args, "grace_s", name),
        )
    if name == "stop":
        return Stop()
    if name == "status":
        return Status()
    raise ValueError(f"unknown command {name!r}: a job's supervisor takes {', '.join(NAMES[:-1])} or {NAMES[-1]}")


def words(command: Command) -> str:
    """What the command does, in the words of a refusal ("the job is stopping, so it cannot ...")."""
    if isinstance(command, RemoveNode):
        return f"{command.how} a node"
    return {Scale: "scale", SetRange: "set its range", KillWorker: "kill a worker"}.get(type(command), "do that")

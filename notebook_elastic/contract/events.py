"""One parser for every backend: raw lines in, typed events out.

A backend produces lines (an agent's stdout/stderr locally, a pod's log on Kubernetes) and
events of its own (a node joined, a pod is pending). ``LineParser`` turns each line into at
most one ``Event``: our prefixed JSON lines (worker and agent instrumentation) and the few
torchelastic agent log lines that carry meaning (restarts, failed workers, signals). Other
lines become ``log`` events, so nothing a worker prints is lost. Pure: no I/O, no clock
unless the caller passes none. Each kind's sentence for people is in ``contract/words.py``.
"""

from __future__ import annotations

import datetime
import json
import re
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..contract.protocol import EVENT_PREFIX
from .event_types import AgentSignaled, Error, Kind, Log, Restart, WorkerExited, WorkerStarted

__all__ = [
    "FAULT_WORDS",
    "Event",
    "LineParser",
    "degraded_text",
    "describe",
    "format_duration",
    "gib",
    "rate",
    "sig",
    "status_phrase",
    "steps_done",
]

_KINDS = cast("dict[str, Kind]", Kind._value2member_map_)

_Fields = TypeVar("_Fields")


@dataclass(frozen=True)
class Event:
    kind: str
    time: float
    node: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    if not TYPE_CHECKING:
        # Tests, benchmarks and a REPL read a field loosely (``e.get("step")``). The type checker
        # does not see this method, so that in the package an untyped read is a type error: it
        # reads through the kind's class instead (``fields``, below).
        def get(self, key: str, default: Any = None) -> Any:
            return self.data.get(key, default)

    @property
    def sender(self) -> str | None:
        """The node it came from: the envelope's, else a ``node`` its data holds (an event made
        from a dict that kept it there)."""
        held = self.data.get("node")
        return self.node or (str(held) if held else None)

    def fields(self, kind_type: type[_Fields]) -> _Fields:
        """``data`` as its kind's class of the event contract (``contract/event_types.py``), so
        the type checker checks each key read against it: ``e.fields(JobFinished)["status"]``.
        The same dict, neither copied nor validated: a worker may have sent anything, which
        the schema tests (not this) hold the emitters to; read optional keys with ``.get``."""
        return cast("_Fields", self.data)

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, "t": self.time}
        if self.node is not None:
            out["node"] = self.node
        out.update(self.data)
        return out

    def to_line(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), default=str)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Event:
        obj = dict(obj)
        kind = str(obj.pop("kind", Kind.LOG))
        kind = _KINDS.get(kind, kind)  # a kind this version does not know stays a plain string
        t = obj.pop("t", None)
        node = obj.pop("node", None)
        return cls(kind=kind, time=float(t) if t is not None else time.time(), node=node, data=obj)

    @classmethod
    def from_line(cls, line: str) -> Event:
        """One line of an events file; ValueError for anything but a JSON object that is an
        event (a damaged file's line: a list, a number, a time that is not a number)."""
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError(f"an event line is a JSON object, not {type(obj).__name__}")
        try:
            return cls.from_json(obj)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not an event: {exc}") from None

    def describe(self) -> str:
        """One line for people (timeline, text view)."""
        return describe(self)


# torchelastic agent lines (glog format): "I1122 02:50:19.693000 3965 path.py:553] message"
#: torch's client says so each time a store wait ends at its bound (two lines, C++ warnings): the
#: agents' waits on a round's key end there by design (agent/regroup.py), so a change would put a
#: pair per waiting node in the notebook. They stay in the node's log; the wait's caller says
#: what matters.
_STORE_WAIT_TIMED_OUT = re.compile(
    r"^\[W\d{4} [\d:.]+ socket\.cpp:\d+\] \[c10d\] waitForInput: (poll for socket .* returned 0, likely a timeout"
    r"|socket .* timed out after \d+ms)$"
)
_GLOG = re.compile(r"^[IWEF](?P<month_day>\d{4}) (?P<clock>\d\d:\d\d:\d\d\.\d+)\s+\d+\s+\S+\]\s?(?P<msg>.*)$")
_AGENT_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"Worker group (?P<state>FAILED|UNHEALTHY)\. (?P<left>\d+)/(?P<max>\d+) attempts left; will restart worker group"
        ),
        "restart_failed",
    ),
    (
        re.compile(r"Detected (?P<n>\d+) new nodes from group_rank=(?P<gr>\d+); will restart worker group"),
        "restart_membership",
    ),
    (
        re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<lr>\d+) \(pid: (?P<pid>\d+)\) of binary"),
        "worker_exited",
    ),
    (re.compile(r"Received (?P<sig>\S+) death signal, shutting down workers"), "signaled"),
    (re.compile(r"worker group successfully finished"), "succeeded"),
    (re.compile(r"(?P<err>Rendezvous\w*Error|RendezvousTimeoutError|RendezvousClosedError)(?P<rest>.*)"), "error"),
]


def _signal_name(text: str) -> str:
    text = text.replace("Signals.", "")
    if text.isdigit():
        try:
            return signal.Signals(int(text)).name
        except ValueError:
            pass
    return text


def _glog_time(month_day: str, clock: str, now: float) -> float:
    """The Unix time of a glog stamp ("1124", "04:37:26.684000": local time, no year) read at
    ``now``: this year's, or last year's when that would be in the future; ``now`` if unreadable."""
    year = time.localtime(now).tm_year
    for y in (year, year - 1):
        try:
            stamp = datetime.datetime.strptime(f"{y}{month_day} {clock}", "%Y%m%d %H:%M:%S.%f")
        except ValueError:
            continue  # 29 February of a year without one
        written = stamp.timestamp()  # naive: local time, as the agent wrote it
        if written <= now + 60:  # a minute's slack for the clocks' rounding
            return min(written, now)
    return now


class LineParser:
    """Parses the lines of one source (one agent, one pod) into events."""

    def __init__(
        self,
        node: str | None,
        stream: str = "stdout",
        *,
        agent_clock: bool = False,
        launchers: dict[int, int] | None = None,
    ) -> None:
        self.node = node
        self.stream = stream
        # A warm start's launcher pid -> its worker's own, from each worker_started that says
        # both: torch's line of a worker's exit names the launcher, the event names the worker.
        # Shared by the parsers of one agent's two streams (the events come on one, torch's
        # lines on the other).
        self.launchers: dict[int, int] = {} if launchers is None else launchers
        # An agent on this machine: its restart and exit lines say when the agent wrote them
        # ("written", from the glog stamp: local time, this clock), besides when they were read.
        # The local supervisor reads an agent's lines and its workers' through two pipes, two
        # threads: by read time, a restart may come after the group it started.
        self.agent_clock = agent_clock

    def feed(self, line: str, t: float | None = None) -> Event | None:
        line = line.rstrip("\r\n")
        if not line:
            return None
        now = time.time() if t is None else t
        at = line.find(EVENT_PREFIX)
        if at >= 0:
            try:
                obj = json.loads(line[at + len(EVENT_PREFIX) :])
            except ValueError:
                obj = None
            if isinstance(obj, dict) and "kind" in obj:
                event = Event.from_json(obj)
                if event.node is None and self.node is not None:
                    event = Event(event.kind, event.time, self.node, event.data)
                if event.kind == Kind.WORKER_STARTED:
                    self._launched(event.fields(WorkerStarted))
                return event
        if _STORE_WAIT_TIMED_OUT.match(line):
            return None
        m = _GLOG.match(line)
        if m:
            agent_event = self._agent_line(m.group("msg"), now)
            if agent_event is not None and self.agent_clock and agent_event.kind in (Kind.RESTART, Kind.WORKER_EXITED):
                agent_event.data["written"] = _glog_time(m.group("month_day"), m.group("clock"), now)
            return agent_event
        return Event(Kind.LOG, now, self.node, dict(Log(stream=self.stream, text=line[:4000])))

    def _launched(self, started: WorkerStarted) -> None:
        launcher, pid = started.get("launcher"), started.get("pid")
        if isinstance(launcher, int) and isinstance(pid, int):
            if len(self.launchers) >= 4096:  # bounded: a long job's restarts
                self.launchers.pop(next(iter(self.launchers)))
            self.launchers[launcher] = pid

    def _agent_line(self, msg: str, t: float) -> Event | None:
        for pattern, what in _AGENT_PATTERNS:
            m = pattern.search(msg)
            if not m:
                continue
            g = m.groupdict()
            if what == "restart_failed":
                left, most = int(g["left"]), int(g["max"])
                restart = Restart(
                    reason="worker_failed", restarts_used=most - left + 1, max_restarts=most, state=g["state"]
                )
                return Event(Kind.RESTART, t, self.node, dict(restart))
            if what == "restart_membership":
                return Event(
                    Kind.RESTART, t, self.node, dict(Restart(reason="membership_change", new_nodes=int(g["n"])))
                )
            if what == "worker_exited":
                code = int(g["code"])
                exited = WorkerExited(exitcode=code, local_rank=int(g["lr"]), pid=int(g["pid"]))
                worker = self.launchers.get(int(g["pid"]))
                if worker is not None:  # torch named the launcher standing for it
                    exited["pid"], exited["launcher"] = worker, int(g["pid"])
                if code < 0:
                    exited["signal"] = -code
                return Event(Kind.WORKER_EXITED, t, self.node, dict(exited))
            if what == "signaled":
                return Event(Kind.AGENT_SIGNALED, t, self.node, dict(AgentSignaled(signal=_signal_name(g["sig"]))))
            if what == "succeeded":
                return Event(Kind.GROUP_SUCCEEDED, t, self.node, {})
            if what == "error":
                return Event(Kind.ERROR, t, self.node, dict(Error(error=g["err"], message=msg[:500])))
        return None


# The words of each kind, and the numbers views share: contract/words.py (re-exported here).
from .words import (  # noqa: E402
    FAULT_WORDS,
    degraded_text,
    describe,
    format_duration,
    gib,
    rate,
    sig,
    status_phrase,
    steps_done,
)

"""Where a pod's log was left, so that any mix of followed streams, one-shot reads and
reconnects delivers every line once (lines carry the kubelet's timestamps)."""

from __future__ import annotations

import time
from typing import Any

from .watch import parse_time


class LogCursor:
    """Where a pod's log was left: the last timestamp delivered (RFC 3339 with nanoseconds:
    sorts as text) and how many delivered lines carried exactly it."""

    def __init__(self) -> None:
        self.last_ts: str | None = None
        self.at_last_ts = 0

    def since_seconds(self) -> int | None:
        """The ``sinceSeconds`` that surely covers every line after the cursor."""
        if self.last_ts is None:
            return None
        return max(1, int(time.time() - parse_time(self.last_ts)) + 2)

    def reading(self) -> Any:
        """A filter for one read, in the log's order: ``keep(stamp)`` is True for a line not
        delivered yet (and moves the cursor past it). Reads of one pod may overlap (a catch-up
        beside a followed stream): each counts the lines it met at the cursor's timestamp, so
        a line is delivered by whichever read reaches it first, once."""
        met: list[Any] = ["", 0]  # this read: the timestamp of its last line, and how many lines carried it

        def keep(stamp: str) -> bool:
            met[1] = met[1] + 1 if met[0] == stamp else 1
            met[0] = stamp
            if self.last_ts is not None and stamp < self.last_ts:
                return False
            if stamp == self.last_ts:
                if met[1] <= self.at_last_ts:
                    return False
                self.at_last_ts = met[1]
                return True
            self.last_ts, self.at_last_ts = stamp, 1
            return True

        return keep

"""How often ``State`` saves: every ``--checkpoint-every`` steps, or chosen so that the time
``commit()`` blocks the training loop stays under ``BLOCKING_TARGET``. ``SaveInterval`` keeps
the commit bookkeeping that choice is made from (time trained, time blocked, the last save's
cost and write); ``State`` holds one and tells it when each commit starts and ends."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..contract import protocol

if TYPE_CHECKING:
    from .writer import CheckpointWriter

#: The share of the training loop's time that commit() may block, when State chooses how often
#: to save (no --checkpoint-every): a save waits until everything commit() blocked so far, plus
#: the last save's cost, is within this share of the loop's time; and until the writer has
#: rested as long as it last wrote. The last step is always saved.
BLOCKING_TARGET = 0.10


def is_final(step: int, total: int | None) -> bool:
    """Whether a commit of ``step`` is the loop's last (``total``: its last step + 1, once
    ``steps()`` started): its save is always tried (the README's promise)."""
    return total is not None and step >= total


def checkpoint_every_from_env(explicit: int | None = None) -> int | None:
    """Save every N steps (``State(checkpoint_every=N)``, ``--checkpoint-every N``), or None:
    State chooses, keeping the time commit() blocks under ``BLOCKING_TARGET``."""
    if explicit is None:
        text = os.environ.get(protocol.ENV_CHECKPOINT_EVERY, "").strip()
        explicit = int(text) if text else None
    if explicit is not None and int(explicit) < 1:
        raise ValueError(
            f"checkpoint every {explicit} steps: give 1 or more steps, or leave it out to let State choose"
        )
    return None if explicit is None else int(explicit)


class SaveInterval:
    """Whether a commit saves, and how much commit() blocks the loop: what the automatic
    interval is chosen from, and what the checkpoint events tell the notebook (blocked_pct).

    Not locked: the writer's background thread records its writes and takes the window while
    the loop adds to it; a commit's time lost to that race only shifts one event's share.
    """

    def __init__(self, checkpoint_every: int | None) -> None:
        self.checkpoint_every = checkpoint_every  # None: chosen
        self.steps_since_save = 0
        self._commit_ended: float | None = None  # perf_counter when the last commit() returned
        self._trained = 0.0  # loop time outside commit() since this State started
        self._blocked = 0.0  # time inside commit(), saving or not, over the same span
        self._save_cost: float | None = None  # how long the last saving commit() blocked
        self._last_write: tuple[float, float] | None = None  # perf_counter at its start and end
        self._window = [0.0, 0.0]  # [blocked, trained] seconds since the last checkpoint event

    @property
    def save_cost(self) -> float | None:
        """What the last save blocked the loop (seconds), or the estimate it started with."""
        return self._save_cost

    def expect_save_cost(self, seconds: float | None) -> None:
        """A restored checkpoint says what a save blocked the group that wrote it: this group's
        first save then waits for its share of the loop like every other, instead of coming at
        the first step (where it alone was a third of the loop's time so far, #39 item 2). A
        fresh job's first save still comes at its first commit, to measure the cost."""
        if seconds is not None and seconds >= 0 and self._save_cost is None:
            self._save_cost = float(seconds)

    @property
    def chosen(self) -> bool:
        """Whether State chooses how often to save (no ``checkpoint_every``)."""
        return self.checkpoint_every is None

    def loop_started(self) -> None:
        """The loop's time starts with its first step: without it the first save (every
        restarted worker's) counted no training, and the header read "blocks 100.0 %"."""
        if self._commit_ended is None:
            self._commit_ended = time.perf_counter()

    def commit_started(self) -> float:
        """A commit begins: the loop trained since the last one returned. Its start time."""
        started = time.perf_counter()
        if self._commit_ended is not None:
            trained = started - self._commit_ended
            self._trained += trained
            self._window[1] += trained
        self.steps_since_save += 1
        return started

    def commit_ended(self, started: float, saved: bool) -> None:
        """The commit that began at ``started`` returns (``saved``: it saved)."""
        self._commit_ended = ended = time.perf_counter()
        self._window[0] += ended - started
        self._blocked += ended - started
        if saved:
            self._save_cost = ended - started
            self.steps_since_save = 0

    def seconds(self) -> tuple[float, float]:
        """(blocked, loop) seconds since the loop started: what commit() blocked, and the
        loop's whole time (inside commit() and outside it), up to the last commit."""
        return self._blocked, self._blocked + self._trained

    def wrote(self, started: float, ended: float) -> None:
        """A checkpoint was written between these perf_counter times (any thread)."""
        self._last_write = (started, ended)

    def take_window(self) -> tuple[float, float]:
        """(blocked, trained) seconds since the last call: one checkpoint event's share."""
        blocked, trained = self._window
        self._window = [0.0, 0.0]
        return blocked, trained

    def due(self, writer: CheckpointWriter) -> bool:
        """Whether this commit saves, as far as the interval goes (the last step and a notice
        save regardless: ``State`` asks those first): every ``checkpoint_every`` steps, or
        (chosen) once the loop has trained long enough since the last save for its cost to
        stay under the target."""
        if self.checkpoint_every is not None:
            return self.steps_since_save >= self.checkpoint_every
        if self._save_cost is None:
            return True
        if writer.writing():
            return False  # the last save is still being written: saving now would wait for it
        if self._last_write is not None:
            # The writer is busy at most half the time: a background write still takes a core
            # and the disk from the loop, which on a few-core machine slows every step.
            began, ended = self._last_write
            if time.perf_counter() - ended < ended - began:
                return False
        # A budget over the whole run: everything commit() blocked (saves, and the cheap commits
        # that did not save) plus the next save's expected cost stays under the target share of
        # the loop's time. A save that cost more than expected is paid back by waiting longer.
        return self._blocked + self._save_cost <= BLOCKING_TARGET * self._trained

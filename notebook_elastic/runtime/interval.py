"""How often ``State`` saves: every ``--checkpoint-every`` steps, or chosen so that the time
``commit()`` blocks the training loop stays under ``BLOCKING_TARGET``. Mixed into ``State``,
whose commit bookkeeping (time trained, time blocked, the last save's cost) it reads."""

from __future__ import annotations

import os
import time

from . import protocol

#: The share of the training loop's time that commit() may block, when State chooses how often
#: to save (no --checkpoint-every): a save waits until everything commit() blocked so far, plus
#: the last save's cost, is within this share of the loop's time; and until the writer has
#: rested as long as it last wrote. The last step is always saved.
BLOCKING_TARGET = 0.10


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
    """Whether this commit saves."""

    def _due(self) -> bool:
        """Whether this commit saves: every ``checkpoint_every`` steps, or (chosen) once the loop
        has trained long enough since the last save for its cost to stay under the target."""
        if self.total is not None and self.step >= self.total:
            return True  # the last step is always saved
        if getattr(self, "_notice_now", None) is not None:
            return True  # the node is to go: save before it does (runtime/notice.py)
        if self.checkpoint_every is not None:
            return self._steps_since_save >= self.checkpoint_every
        if self._save_cost is None:
            return True
        if self._writer is not None and self._writer.is_alive():
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

"""The signal a process gets when its parent dies (Linux's PR_SET_PDEATHSIG)."""

from __future__ import annotations

import ctypes
import os
import sys

from ..contract import protocol


def set_parent_death_signal(sig: int, expected_parent: int | None = None) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere).

    A SIGKILLed torchrun agent cannot stop its workers (they run in their own sessions), and
    they would go on training beside the survivors; this closes that hole. If the parent
    died before the request was made, exit now.
    """
    if not sys.platform.startswith("linux"):
        return
    if os.environ.get(protocol.ENV_FORKED) == str(os.getpid()):
        # Forked by the warm pool (pool): its parent is the pool, which it must not die
        # with; its launcher, a child of the real parent, holds this signal and forwards it,
        # and the process dies with its launcher.
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(128 + int(sig))

"""A blocking call given a deadline: the rendezvous store client's calls.

torch's TCPStore client waits in C++ for its server's reply, and its own timeout does not
bound every call: against a server that is frozen without a connection reset (its process
stopped, its node cut off by a partition) ``get``, ``compare_set``, ``add``, ``check`` and the
constructor were still blocked after 60 s with a 5 s timeout (torch 2.13; only ``set``, which
waits for no reply, returned). The kernel would give up on the connection after ~15 minutes of
retransmissions. So the call runs on a helper thread (the client releases the GIL while it
waits) and the caller stops waiting at the deadline; the helper, still blocked, is a daemon
thread and is left to its fate with the client it holds, which the caller no longer uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class StoreSilent(TimeoutError):
    """A store call had no reply by its deadline: the store is frozen or cut off."""


def call_with_deadline(fn: Callable[..., Any], timeout_s: float, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or ``StoreSilent`` once ``timeout_s`` passed without its return.
    The caller's signals are handled while it waits (a SIGTERM is not held off in C++)."""
    done = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller, whatever it is
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="notebook-elastic-store-call", daemon=True).start()
    if not done.wait(timeout_s):
        raise StoreSilent(f"no reply in {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]

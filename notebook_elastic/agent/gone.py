"""Nodes the supervisor saw die (``GONE_KEY``), dropped from a round at once rather than when
their heartbeat expires: the state holder of our rendezvous (``rounds.py``) marks them expired
before torch's sanitize (``drop_gone_nodes`` turns it on)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..contract.protocol import GONE_KEY
from ..plumbing import log as _logging
from . import store_link
from .torch_adapter import holder_settings, holder_store

if TYPE_CHECKING:
    from ..plumbing.store_client import KeyStore

_log = _logging.get("agent.gone")


def pids(store: KeyStore | None, window_s: float) -> set[int]:
    """Pids of agents the supervisor saw die within ``window_s`` (a pid reused later is not
    one of them: by then torch's own heartbeat expiry has dropped the dead node anyway)."""
    try:
        value = None if store is None else store_link.read_key(store, GONE_KEY)
        if value is None:
            return set()
        import json

        now = time.time()
        return {int(pid) for pid, when in json.loads(value).items() if now - when <= window_s}
    except Exception:
        _log.debug("unreadable, or the store lost: heartbeats decide, as in torch", exc_info=True)
        return set()


def mark_expired(holder: Any) -> None:
    """Mark the nodes GONE_KEY names as expired in ``holder``'s state: torch's sanitize drops
    them next."""
    from datetime import datetime, timezone

    settings = holder_settings(holder)
    window_s = settings.keep_alive_interval.total_seconds() * settings.keep_alive_max_attempt
    gone = pids(holder_store(holder), window_s)
    beats = holder.state.last_heartbeats  # the holder's state, through torch's own interface
    for node, beat in list(beats.items()) if gone else ():
        if node.pid in gone:
            # The same kind of time as torch's own: aware (UTC) since 2.5, naive before (2.4's
            # utcnow(); comparing the two raised TypeError in every agent's next sync, and the
            # job failed on a node's loss).
            beats[node] = datetime.min if beat.tzinfo is None else datetime.min.replace(tzinfo=timezone.utc)

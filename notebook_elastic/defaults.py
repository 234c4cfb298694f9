"""Defaults with one home: rendezvous settings, limits, names, folders.

The rendezvous numbers were measured with torch 2.13.0 on a 2-core CPU machine (see
benchmarks/local_backend.py and benchmarks/results/local_backend.json): torchrun's defaults take 33.6 s to a first step with
``--nnodes 1:3`` and 47 s to resume after a scale-down; these take 4.1 s and 6 s.
``keep_alive_max_attempt=2`` declared live agents dead (split brain); 3 held every time.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Waited once participants >= min and < max; dominates start-up and scale-up on a cluster.
LAST_CALL_TIMEOUT_S = 1
#: Locally a round closes as soon as it holds the supervisor's target (agent/rounds.py), so the last
#: call only bounds a round that never gets there (a node that died joining). At 1 s, agents slowed
#: by three multi-node jobs at once on 2 cores missed it again and again: a round closed without
#: the node it restarted for, which then waited, restarted the group again, and so on.
LAST_CALL_TIMEOUT_S_LOCAL = 5
#: keep_alive_interval x keep_alive_max_attempt is how long a departed agent stays a member.
KEEP_ALIVE_INTERVAL_S = 1
KEEP_ALIVE_MAX_ATTEMPT = 3
#: How long agents wait for enough nodes; long on a cluster, where an autoscaler adds nodes.
JOIN_TIMEOUT_S_LOCAL = 600
JOIN_TIMEOUT_S_CLUSTER = 1800
#: torchrun's own default in 2.13; a crashed worker is noticed in ~0.1 s.
MONITOR_INTERVAL_S = 0.1
MAX_RESTARTS = 3
#: Collective operations time out after this long, so a hung peer is noticed.
COLLECTIVE_TIMEOUT_S = 120
#: No new step for max(this, 10 x the median step time) is a stall (a stopped or hung rank).
STALL_AFTER_S = 30.0

#: Payloads above this are refused before launch (configurable per job).
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024

BACKENDS = ("local", "kubernetes", "slurm")

#: What dry-runs show instead of an ``--env`` value (values are treated as secrets).
HIDDEN_VALUE = "<hidden>"


#: How often a node waiting in a local rendezvous round looks at it again (torch: 1 s). A round
#: takes several looks (each node leaves the old round, joins, one marks it complete): at 0.1 s a
#: change in place waited about 0.7 s for its round on 2 cores.
RDZV_POLL_S_LOCAL = 0.02


def rdzv_conf(*, join_timeout_s: int, is_host: bool | None = None) -> dict[str, str]:
    conf = {
        "join_timeout": str(join_timeout_s),
        "last_call_timeout": str(LAST_CALL_TIMEOUT_S),
        "keep_alive_interval": str(KEEP_ALIVE_INTERVAL_S),
        "keep_alive_max_attempt": str(KEEP_ALIVE_MAX_ATTEMPT),
    }
    if is_host is not None:
        conf["is_host"] = "true" if is_host else "false"
    return conf


def home() -> Path:
    """Where job folders live: $NOTEBOOK_ELASTIC_HOME, else ~/.local/share/notebook-elastic."""
    explicit = os.environ.get("NOTEBOOK_ELASTIC_HOME")
    if explicit:
        return Path(explicit)
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "notebook-elastic"

"""``python -m notebook_elastic.runtime.agent [torchrun args]``: torchrun's agent, instrumented.

A thin wrapper around ``torch.distributed.run.main()`` that
- exits with the process that launched it (the local supervisor), so no agent outlives it;
- tells its workers who their agent is, so they exit with it (a SIGKILLed agent otherwise
  leaves its workers training beside the survivors);
- turns off the rendezvous TCP store sharing that deadlocks scale-up in torch 2.13;
- after every completed rendezvous, writes a ``rendezvous`` event (round, group rank, world
  size, members) and passes the round to the workers it is about to start, as the job-wide
  generation that fences checkpoint writes.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from . import protocol
from ._emit import emit
from .worker import set_parent_death_signal


def _node_name() -> str:
    return os.environ.get(protocol.ENV_NODE) or socket.gethostname()


def _hook_rendezvous() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    original = dr.DynamicRendezvousHandler.next_rendezvous
    if getattr(original, "_notebook_elastic", False):
        return

    def next_rendezvous(self):  # type: ignore[no-untyped-def]
        info = original(self)
        state = getattr(getattr(self, "_state_holder", None), "state", None)
        round_ = getattr(state, "round", None)
        members = []
        for node, rank in sorted(getattr(state, "participants", {}).items(), key=lambda kv: kv[1]):
            members.append({"addr": node.addr, "pid": node.pid, "local_id": node.local_id, "group_rank": rank})
        if round_ is not None:
            os.environ[protocol.ENV_ROUND] = str(round_)
        emit(
            "rendezvous",
            node=_node_name(),
            round=round_,
            epoch=int(os.environ.get(protocol.ENV_RDZV_EPOCH, 0)),
            group_rank=info.rank,
            group_world_size=info.world_size,
            members=members,
            agent_pid=os.getpid(),
        )
        return info

    next_rendezvous._notebook_elastic = True  # type: ignore[attr-defined]
    dr.DynamicRendezvousHandler.next_rendezvous = next_rendezvous


def main(argv: list[str] | None = None) -> None:
    supervisor = os.environ.get(protocol.ENV_SUPERVISOR_PID)
    if supervisor:
        set_parent_death_signal(signal.SIGTERM, int(supervisor))
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ.setdefault("LOGLEVEL", "INFO")  # read by torchelastic's loggers at import
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # workers' prints reach us line by line
    os.environ[protocol.ENV_AGENT_PID] = str(os.getpid())
    _hook_rendezvous()
    from torch.distributed.run import main as torchrun_main

    emit("agent_started", node=_node_name(), pid=os.getpid(), host=socket.gethostname())
    torchrun_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()

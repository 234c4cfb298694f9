"""``python -m notebook_elastic.agent.run [torchrun args]``: torchrun's agent, instrumented.

A thin wrapper around ``torch.distributed.run.main()`` that
- exits with the process that launched it (the local supervisor), so no agent outlives it;
- tells its workers who their agent is, so they exit with it (a SIGKILLed agent otherwise
  leaves its workers training beside the survivors);
- turns off the rendezvous TCP store sharing that deadlocks scale-up in torch 2.13;
- before every (re)start of its workers, checks the script and payload against the sha256
  recorded at launch (``ENV_FILES_SHA256``) and exits with ``EXIT_FILES_CHANGED`` instead of
  running files someone changed since;
- after every completed rendezvous, writes a ``rendezvous`` event (round, group rank, world
  size, members) and passes the round to the workers it is about to start, as the job-wide
  generation that fences checkpoint writes;
- watches the members of its round: torchrun's agent notices new nodes but not departed
  ones, so when a peer vanishes while the workers sit in a store wait (``init_process_group``,
  a barrier) they hang until the collective timeout. When a member's heartbeat expires
  (keep_alive_interval x keep_alive_max_attempt), the watch ends the local workers, and the
  agent restarts them into a new round at once;
- survives the replacement of its rendezvous store (a Kubernetes store pod deleted, evicted or
  lost with its node, and started again by its Deployment): torch's store client never
  reconnects, so the agent did not either and failed; now it reconnects, and on a new, empty
  store it re-forms its round there (a membership change, not charged). A store that froze
  without closing its connection (its process stopped, its node cut off) is treated the same:
  every store call has a deadline (the rendezvous', and the agent's own: rank assignment, the
  exit barrier), and one without a reply by then is a lost connection;
- never charges a departure to the user's restart budget: when the local workers failed only
  because a peer went away (they exit with ``EXIT_PEER_LOST``, or the watch ended them) and
  the round has really lost a member, the agent regroups as it does for a new node, without
  spending one of ``--max-restarts``. Only a worker's own failure is charged;
- never restarts workers whose failure would repeat at every retry (a worker exits
  ``EXIT_FATAL``: its State holds what cannot be saved): it stops them and exits ``EXIT_FATAL``
  itself, so no retry is spent and a Job's podFailurePolicy fails the job at once;
- on a cluster, where no supervisor watches the nodes (``ENV_AGENTS_EVICT``), sends itself away
  when its workers fail while it joins a job that trains (``joiner.py``): it leaves the round
  without closing it, says why (``node_evicted``) and exits with ``EXIT_EVICTED``; the others
  regroup at their size, as for any departure.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..contract import protocol
from ..contract.event_types import (
    AgentStarted,
    Degraded,
    FilesChanged,
    Kind,
    LeftRendezvous,
    Rendezvous,
    Restart,
    RoundMember,
)
from ..plumbing import log
from ..plumbing.parent import set_parent_death_signal
from ..runtime import term
from ..runtime._emit import emit
from . import change_watch, notebook_agent, notice_keeper, rounds, store_link, torch_adapter
from .departures import DepartureWatch
from .departures import node_name as _node_name
from .fatal import FatalEnd, failure_message
from .inplace import LEFT_OUT, InPlace
from .joiner import Joining

_log = log.get("agent")

# This agent's policy objects, one each per agent process: what torch calls (our rendezvous
# factory, torchrun's agent class) is built over them when the agent installs its hooks.
_link = store_link.StoreLink()  # how a lost store is answered; whether this node is leaving
_rules = rounds.RoundRules()  # how our rounds differ from torch's
_rendezvous = rounds.RendezvousHooks()  # what our handler calls around each round
_agent = notebook_agent.AgentHooks()  # what our agent calls at torchrun's agent hooks
_watch = DepartureWatch()
_fatal = FatalEnd(lambda: _rendezvous_store(), _node_name)  # the job ends: neither restart nor regroup


def _round_lost_a_member() -> bool:
    """Whether the round this node is in lost a member (the departure watch's look, now): asked
    by the in-place policy, and by a wait while a round's ranks are assigned (store_link)."""
    return _watch.round_lost_a_member(0.0)


_inplace = InPlace(
    _node_name,
    member_gone=_round_lost_a_member,
    look_now=_watch.look_now,
    left_on_purpose=_watch.left_on_purpose,
    fatal=_fatal,
)
_watch.in_place = _inplace.departure_seen
_link.member_gone = _round_lost_a_member
_joining = Joining(_watch, _node_name, lambda: _leave_rendezvous())


class _StoreReplaced:
    """Set when this node's rendezvous backend found a new store (store_link); the agent
    then restarts its workers into a round on it, as for a new member."""

    def __init__(self) -> None:
        self.round: int | None = None  # the round seeded in the new store, until regrouped
        self.seeded: int | None = None  # the last seeded round a healthy group regrouped on

    def replaced(self, seeded_round: int) -> None:
        self.round = seeded_round

    def regroup_now(self) -> bool:
        """A round on the new store, formed while the agent forms its group: told as a restart."""
        seeded, self.round = self.round, None
        if seeded is None:
            return False
        emit(Kind.RESTART, node=_node_name(), **Restart(reason="store_replaced", round=seeded))
        return True

    def pending(self) -> int | None:
        """The round seeded in a new store, once: the healthy group regroups on it."""
        seeded, self.round = self.round, None
        return seeded


_store = _StoreReplaced()


def _departure_or_eviction(result: Any) -> list[Any]:
    """A departure's failures (regrouped uncharged); else, when this node failed while joining
    a job that trains, it goes (``joiner.Joining``: the process ends there); else none: charged,
    as torchrun does."""
    failures = _watch.failed_because_a_peer_left(result)
    if not failures:
        _joining.leave_if_it_failed_joining(result)
    return failures


def _gives_up(result: Any) -> bool:
    """A worker failed in a way no retry can mend, here or on another node: stop, not restart."""
    return _fatal.after_failures(list(getattr(result, "failures", {}).values()))


def _rendezvous_store() -> tuple[Any, str] | None:
    handler = _watch.handler
    store = torch_adapter.rendezvous_store(handler) if handler is not None else None
    return (store, handler.get_run_id()) if store is not None else None


def _root(exc: Any) -> str:
    """torchrun's root failure in one line ("rank 0 (exit code 1): ZeroDivisionError: ...")."""
    try:
        rank, failure = exc.get_first_failure()
        text = " ".join(failure_message(failure).split())
        return f"rank {rank} (exit code {failure.exitcode}): {text}"[:500]
    except Exception:  # another torch's ChildFailedError: its own first line that says something
        return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def _hook_agent() -> None:
    def before_start(agent: Any) -> None:
        _watch.agent = agent
        term.land_stop()  # told to stop meanwhile (and swallowed): it goes now, not with workers
        term.agent_starts_workers()  # the workers it stopped are gone; the next ones stay
        _refuse_changed_files()

    def on_departure(failures: list[Any]) -> None:
        # torchrun would charge this to --max-restarts (and give up at 0). Regroup as for a
        # new node instead: the loop then sees a healthy group and carries on.
        emit(
            Kind.RESTART,
            node=_node_name(),
            **Restart(reason="departure", round=_watch.latest[0], local_ranks=sorted(f.local_rank for f in failures)),
        )

    def after_start(agent: Any) -> None:
        # Its SIGTERM lands wherever it finds the agent, and where Slurm signals every process
        # of the node, waits for the keeper's word (term.py); torch set its own handler again.
        term.guard_agent()

    left_out_restart = threading.Event()  # the restart under way is one of a node left out

    def before_stop(agent: Any, restarting: bool) -> int | None:
        # These workers are stopped on purpose: they go at once. For good where it is the
        # node's end; within a restart of its workers (a failure), a stop it was told and that
        # was swallowed still lands, before it joins the next round.
        term.agent_stops_workers(for_good=not restarting)
        if restarting and left_out_restart.is_set():
            # Left out, its workers wait in the old group's collective, and a handler of theirs
            # (Slurm's SIGTERM deferred, term.defer_in_worker) runs only when that returns:
            # stopped with SIGTERM, they waited out torch's 30 s before its SIGKILL (a fresh-clone
            # run's two-host partition test: the job ended before the node was back). Nothing
            # they hold is needed (they take the live values from the others): killed at once.
            return signal.SIGKILL
        return None

    def leave(local_ranks: list[int]) -> None:
        # This node goes (a signal): its stop has landed; its workers leave at a step boundary
        # before anything says they are being stopped (term.agent_leaves).
        term.agent_leaves()
        store = torch_adapter.rendezvous_store(_watch.handler) if _watch.handler else None
        _inplace.leave(local_ranks, _leave_rendezvous, store)

    def regroup_now() -> str | None:
        """Why a healthy group regroups now: its store was replaced, or a member of its round
        went (seen by the watch, or sooner by a worker whose group broke)."""
        seeded = _store.pending()
        if seeded is not None:
            _store.seeded = seeded
            return "store"
        why = _inplace.regroup_now()
        if why is None and _watch.left_out():
            why = LEFT_OUT  # the others went on without this node: its workers restart to join again
        if why is not None and _fatal.peer_gave_up():
            return None  # the member that went ends the job: its workers fail here too, or it stops them
        return why

    def restarting(why: str) -> None:
        """The workers restart: why they could not stay (where they trained and said), and, for a
        healthy group, the restart as torchrun's would be told ("failed": told already)."""
        if why == LEFT_OUT:  # this restart's, derived anew at each (before_stop reads it)
            left_out_restart.set()
        else:
            left_out_restart.clear()
        _inplace.explain_restart(int(os.environ.get(protocol.ENV_ROUND, -1)))
        if why == "failed":
            return
        if why == "store":
            emit(Kind.RESTART, node=_node_name(), **Restart(reason="store_replaced", round=_store.seeded))
        elif why == LEFT_OUT:
            _inplace.left_out(_watch.latest[0])
            emit(Kind.RESTART, node=_node_name(), **Restart(reason="membership_change", round=_watch.latest[0]))
        elif why in ("lost", "left"):
            emit(Kind.RESTART, node=_node_name(), **Restart(reason="departure", round=_watch.latest[0]))
        else:
            emit(Kind.RESTART, node=_node_name(), **Restart(reason="membership_change"))

    notebook_agent.hook_agent(
        _agent,
        before_start,
        _departure_or_eviction,
        on_departure,
        regroup_now,
        _gives_up,
        after_start=after_start,
        before_stop=before_stop,
        at_look=term.land_stop,  # a stop swallowed while it monitors lands at its next look
        in_place=_inplace.restart,
        restarting=restarting,
        leave=leave,
        wait_for_change=_inplace.wait_for_change,
        ranking=_link.ranking,
        join_look_s=join_look_s(os.environ),
        watch=change_watch.ChangeWatch(_round_changed),
    )
    # Every store call has a deadline; one that passes it is a lost connection. A store that can
    # come back (the place says so: a cluster's store pod, under its Deployment) is waited for,
    # and a replacement taken. The local store lives in the supervisor: when that dies, its
    # agents go with it (its guardian starts new ones), not wait for a store that never returns;
    # when it is frozen (stopped), they wait for that same store to answer again, for the
    # store's timeout, then end with one sentence.
    # The agent's own store calls (rank assignment, the exit barrier) have the same deadline; a
    # store lost while it forms its group makes it rendezvous again (a replacement is told then).
    replaceable = os.environ.get(protocol.ENV_STORE_REPLACEABLE) == "1"
    notebook_agent.hook_store_reconnect(
        _link,
        _rendezvous,
        _agent,
        lambda: _watch.latest[0],
        _store.replaced,
        replaceable=replaceable,
        on_regroup=_store.regroup_now,
    )


class _NotRestartingYet(logging.Filter):
    """Drops torch's announcement of a membership restart (``regrouped`` or ``restart`` follows)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and "new nodes from group_rank" in record.msg)


def _refuse_changed_files() -> None:
    """torchrun restarts workers on its own (a crash, a new member): each time, run only the
    files that were launched. The old workers are stopped by now; exiting takes the zygote
    with us, so nothing of this node runs the changed code."""
    changed = protocol.changed_files(os.environ.get(protocol.ENV_FILES_SHA256))
    if not changed:
        return
    reason = protocol.files_changed_reason(changed)
    emit(Kind.FILES_CHANGED, node=_node_name(), **FilesChanged(files=changed, reason=reason))
    _log.error(reason)
    sys.stdout.flush()
    os._exit(protocol.EXIT_FILES_CHANGED)  # torchrun would catch SystemExit and retry


def _hook_rendezvous() -> None:
    def after(handler: Any, info: Any) -> None:
        round_, participants = torch_adapter.joined_round(handler)
        members: list[RoundMember] = []
        for node, rank in sorted(participants.items(), key=lambda kv: kv[1]):
            members.append(RoundMember(addr=node.addr, pid=node.pid, local_id=node.local_id, group_rank=rank))
        _watch.joined(handler, round_, frozenset(participants))
        _joining.joined(round_)
        _first_round.set()  # the trial round may run now, off the way of joining
        _store.round = None  # a round formed on the store there is now: nothing to re-form
        if round_ is not None:
            os.environ[protocol.ENV_ROUND] = str(round_)
        # Where this round's group forms (fresh workers, and kept ones told in place).
        store = torch_adapter.rendezvous_store(handler)
        os.environ.update(_inplace.group_env(handler.get_run_id(), round_, store))
        _inplace.formed(frozenset(participants), store)
        shown = rendezvous_members(members)
        said = Rendezvous(
            round=round_,
            epoch=int(os.environ.get(protocol.ENV_RDZV_EPOCH, 0)),
            group_rank=info.rank,
            group_world_size=info.world_size,
        )
        if shown is not None:
            said["members"] = shown
        if members and members[0]["group_rank"] == 0:
            # At any size: whoever reads one node's log learns which node holds rank 0 (a
            # cluster's follower streams that one's losses, #40: at 1,024 pods it read ~1,000
            # logs to find it when rounds that big told no members).
            said["lead"] = members[0]
        said["agent_pid"] = os.getpid()
        emit(Kind.RENDEZVOUS, node=_node_name(), **said)

    def before(handler: Any) -> None:
        term.land_stop()  # told to stop (and swallowed): it goes now, before it joins
        _watch.joining()
        _joining.before_joining(handler)

    rounds.hook_next_rendezvous(_rendezvous, after, before=before)


#: A round's members are told in each agent's rendezvous line up to this many; a bigger round
#: tells its size alone (``group_world_size``): every agent tells the round, so the members of
#: a round of N nodes were N x N entries in the job's events (at 1,024 nodes, a million, some
#: 60 MB of lines at every regroup, for the kernel and the supervisor to read and keep; #40).
MEMBERS_TOLD = 64


def rendezvous_members(members: list[RoundMember]) -> list[RoundMember] | None:
    """The members a rendezvous line tells: all of a round of up to ``MEMBERS_TOLD``, else none."""
    return members if len(members) <= MEMBERS_TOLD else None


def _report_degraded() -> None:
    """One event naming what this torch lacks and what the job loses for it; then, off the
    agent's start, a trial round of the rendezvous (``notebook_agent.probe``): an internal whose
    name stayed while what it does changed is said in a second event, with the first's."""
    lacking = torch_adapter.missing()
    if lacking:
        _degraded(lacking)

    def trial() -> None:
        # After this node's first round, and at the lowest priority: on a loaded machine its
        # CPU would otherwise delay the join, and a peer that misses a round costs a restart.
        _first_round.wait(FIRST_ROUND_WAIT_S)
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except OSError:
            pass
        changed = confirmed(lambda: notebook_agent.probe(_rules, _rendezvous, _link, _agent), set(lacking))
        if changed:
            _degraded({**lacking, **changed})

    threading.Thread(target=trial, name="notebook-elastic-probe", daemon=True).start()


def confirmed(probe: Callable[[], dict[str, str]], lacking: set[str]) -> dict[str, str]:
    """What ``probe`` finds changed (beyond what is ``lacking``) twice in a row: a torch that
    changed fails the same way again; a node paused through its trial round (a frozen pod, a
    machine stalled past the round's close) does not, and is not told its torch lacks internals
    (an adversary's pass: said so after a thaw)."""
    changed = {name: loss for name, loss in probe().items() if name not in lacking}
    if changed:
        again = probe()
        changed = {name: loss for name, loss in changed.items() if name in again}
    return changed


def _round_changed() -> None:
    """The store answered the change watch: the monitor looks now, and so does the departure watch."""
    _inplace.wake_monitor()
    _watch.look_now()


_first_round = threading.Event()  # set once this node joined its first round
#: A node that never forms a round (waiting for peers) still tries its torch after this long.
FIRST_ROUND_WAIT_S = 120.0


def join_look_s(env: Mapping[str, str]) -> float | None:
    """How often the monitor's wait looks for a node waiting to join (``notebook_agent``: at
    most every ``JOIN_LOOK_S``): as often as rounds are polled where the store is on this
    machine (a local job), else never (torch's own look alone): a Slurm job's store, in its
    supervisor, serves every node of the allocation, and the looks would grow with them."""
    poll_s = float(env.get(protocol.ENV_RDZV_POLL_S) or 0)
    host = env.get(protocol.ENV_NOTICE_STORE, "").rpartition(":")[0]  # the rendezvous's store
    return poll_s if poll_s > 0 and host in ("127.0.0.1", "localhost", "::1", "[::1]") else None


def _degraded(lost: dict[str, str]) -> None:
    import torch

    tested = f"torch{torch_adapter.tested_torch_text()}"
    emit(Kind.DEGRADED, node=_node_name(), **Degraded(torch=torch.__version__, missing=lost, tested=tested))


def _start_zygote() -> bool:
    """Where this node's workers are forked from: the user's warm pool when the job has one
    (``pool``), else a zygote of the node's own."""
    from .. import pool
    from ..pool.warm import start_zygote

    name = pool.in_use()
    if name:
        os.environ[protocol.ENV_ZYGOTE] = name
        return True  # warm already
    _joining.zygote = start_zygote()
    return _joining.zygote is not None


def _leave_rendezvous() -> None:
    """Take this node out of its round at once when it is stopped on purpose (SIGTERM:
    scale-down, preemption, pod deletion). Otherwise the survivors wait for its heartbeat
    to expire (keep_alive_interval x keep_alive_max_attempt) before they can regroup."""
    handler = _watch.handler
    try:
        if handler is None or not rounds.leave_round(handler, _link):
            return
    except Exception as exc:  # the store does not answer: peers drop this node at its heartbeat's expiry
        _log.warning("could not leave the rendezvous: %s", exc)
        return
    emit(Kind.LEFT_RENDEZVOUS, node=_node_name(), **LeftRendezvous(pid=os.getpid()))


def _local_addr_toward_the_store(args: list[str]) -> None:
    """Where the plan leaves the agent's address to the node (Slurm: each node its own host),
    the address this host reaches the store from, as torchrun's documented ``PET_LOCAL_ADDR``:
    torchrun's own default, the host's name, can resolve to a loopback address (Debian's
    127.0.1.1) that its peers on other hosts cannot reach."""
    if "--local-addr" in args or "--local_addr" in args or os.environ.get("PET_LOCAL_ADDR"):
        return
    host, _, port = (os.environ.get(protocol.ENV_NOTICE_STORE) or "").rpartition(":")
    if not host:
        return
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port or 29400)))  # no packet is sent: the route is chosen
            os.environ["PET_LOCAL_ADDR"] = probe.getsockname()[0]
    except (OSError, ValueError):
        pass


def _standby() -> list[str]:
    """``--standby``: import everything, then wait for the supervisor's go (one JSON line on
    stdin with the node's environment and torchrun arguments). A warm spare joins a scale-up
    without paying for Python and torch start-up."""
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)  # the supervisor closed our stdin: not needed after all
    order = json.loads(line)
    os.environ.update(order.get("env", {}))
    return list(order["argv"])


def unpack_workdir_files(cwd: str | None = None) -> list[str]:
    """Unpack the files the code reads by a relative name (shipped from the notebook's folder)
    into the working directory, so ``open("config.json")`` finds them in a pod. Files already
    there are the image's own and are left alone. Returns the paths written."""
    path = os.environ.get(protocol.ENV_WORKDIR_FILES)
    if not path or not os.path.isfile(path):
        return []
    import zipfile

    root = os.path.realpath(cwd or os.getcwd())
    written = []
    with zipfile.ZipFile(path) as zf:
        for member in zf.namelist():
            target = os.path.realpath(os.path.join(root, member))
            if not target.startswith(root + os.sep) or os.path.exists(target):
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(zf.read(member))
            written.append(member)
    return written


def main(argv: list[str] | None = None) -> None:
    # On a cluster the kubelet's SIGTERM is a notice: a keeper (the parent, from here on) turns
    # it into a save first, then passes it on (notice_keeper.py). Returns in the agent only.
    notice_keeper.keep()
    log.for_process("agent")  # its lines go to the node's log: "notebook-elastic agent: ..."
    term.guard_agent()  # a SIGTERM before the workers start (torch sets its handler then)
    supervisor = os.environ.get(protocol.ENV_SUPERVISOR_PID)
    if supervisor:
        set_parent_death_signal(signal.SIGTERM, int(supervisor))
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ.setdefault("LOGLEVEL", "INFO")  # read by torchelastic's loggers at import
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # workers' prints reach us line by line
    os.environ[protocol.ENV_AGENT_PID] = str(os.getpid())
    args = sys.argv[1:] if argv is None else argv
    try:
        unpack_workdir_files()
    except OSError as exc:  # a read-only working directory: the code will say what it misses
        _log.warning("could not unpack the notebook's files: %s", exc)
    if os.environ.get(protocol.ENV_AGENTS_EVICT) == "1":
        _joining.start()
    link_env = _inplace.start()  # the workers' link to this agent (in place)
    os.environ.update(link_env)
    if link_env:
        # torch says "Detected N new nodes ...; will restart worker group" before it calls the
        # restart that keeps the workers in place: the agent says what happened instead.
        logging.getLogger("torch.distributed.elastic.agent.server.api").addFilter(_NotRestartingYet())
    _hook_rendezvous()
    _hook_agent()
    # Under a supervisor (local, Slurm), a round closes once it holds the job's nodes (the
    # supervisor's target, in the store), and a node it saw die leaves its round at once. A
    # cluster's store pod has no supervisor: looking for those keys there was a call after every
    # read of the round, for nothing (#40).
    if os.environ.get(protocol.ENV_STORE_REPLACEABLE) != "1":
        rounds.close_rounds_at_target(_rules, float(os.environ.get(protocol.ENV_RDZV_POLL_S) or 0) or None)
        rounds.drop_gone_nodes(_rules)
    # Nodes join, leave and beat together: a round of hundreds of nodes in a few writes (#40).
    rounds.join_and_beat_together(_rules)
    # ... and change a round's members in one write of it, not two per node (#40 item 3).
    rounds.regroup_in_one_write(_rules)
    _report_degraded()
    from torch.distributed import run as torchrun_module
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import record

    from .. import pool

    warm = _start_zygote()
    if args[:1] == ["--standby"]:
        args = _standby()
    # Known once a spare is told who it is: a node that joins a job that trains.
    _rules.spread_first_join = os.environ.get(protocol.ENV_JOINER) != "1"
    if warm and args and args[-1].endswith(".py") and not {"-m", "--module", "--no-python", "--no_python"} & set(args):
        # Workers start as `python -u -m notebook_elastic.pool.launch SCRIPT`: forked by the zygote.
        args = [*args[:-1], "-m", pool.LAUNCHER_MODULE, args[-1]]
    # Stopped by a signal, it leaves its round, never closes it for the others (torch 2.4 closed
    # it); a joiner of a job that trains leaves it whatever ends it (the job goes on).
    rounds.leave_instead_of_closing(
        _rendezvous, always=os.environ.get(protocol.ENV_JOINER) == "1", told_to_stop=term.told_to_stop
    )
    emit(Kind.AGENT_STARTED, node=_node_name(), **AgentStarted(pid=os.getpid(), host=socket.gethostname()))
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    _local_addr_toward_the_store(args)
    torchrun: Any = torchrun_module  # parse_args and run: untyped in torch
    options = torchrun.parse_args(args)
    if options.rdzv_backend == "c10d":
        # The job's c10d rendezvous, joined through our handler (torch's public registry):
        # the same store, state and rounds as torch's own handler, with what a notebook job adds.
        options.rdzv_backend = rounds.register_rendezvous(_rules, _rendezvous, _link)
    try:
        record(torchrun.run)(options)  # torchrun's main: its arguments, then run, its errors recorded
    except SignalException as exc:
        # Stopped on purpose (scale-down, preemption, set_range, stop): one line in the
        # node's log, not torchrun's 30-line traceback, and the same exit status as before.
        _leave_rendezvous()
        _log.info("stopped by signal %s; left the rendezvous", exc.sigval)
        sys.exit(1)
    except ChildFailedError as exc:
        # torchrun has logged which rank failed how; say it plainly and exit with a status
        # of our own, so "the restart budget is spent" is told apart from "stopped".
        if _fatal.ends:
            _log.error("not restarted, it would fail the same way: %s", _root(exc))
            sys.exit(protocol.EXIT_FATAL)
        _log.error("restart budget spent: %s", _root(exc))
        sys.exit(protocol.EXIT_RESTARTS_SPENT)
    except RendezvousConnectionError as exc:
        # The store is gone or frozen and none answered in time (store_link): one sentence.
        _log.error("%s", exc)
        sys.exit(protocol.EXIT_STORE_LOST)


if __name__ == "__main__":
    main()

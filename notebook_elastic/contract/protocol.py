"""The wire contract between workers, agents and the notebook side.

Every name that crosses a process boundary is defined here once: the prefix of event lines,
the environment variables a backend sets for agents and workers, the keys of ours in the
rendezvous store, exit statuses and the checkpoint file names. The events themselves (their
kinds, a job's statuses, each kind's fields) are the event vocabulary, defined once in
``contract/event_types.py``. Worker-side module: imports only the standard library.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

#: Every structured line a worker or agent writes starts with this prefix, then compact JSON.
EVENT_PREFIX = "@@elastic "


# Event kinds, job statuses and the fields of each kind: contract/event_types.py (the typed,
# versioned event contract).

# Environment set by a backend (the supervisor or a pod spec) for agents and workers.
ENV_JOB = "NOTEBOOK_ELASTIC_JOB"  # the job's name
ENV_JOB_DIR = "NOTEBOOK_ELASTIC_JOB_DIR"  # local backend: the job folder (also marks our processes)
ENV_NODE = "NOTEBOOK_ELASTIC_NODE"  # the node (agent) name: node-0, a pod name, ...
ENV_CHECKPOINT_DIR = "NOTEBOOK_ELASTIC_CHECKPOINT_DIR"
ENV_PAYLOAD = "NOTEBOOK_ELASTIC_PAYLOAD"  # path of the payload file, when not beside the script
# A zip of the notebook-folder files the code reads by a relative name (pods): the agent unpacks
# it into its working directory before the workers start.
ENV_WORKDIR_FILES = "NOTEBOOK_ELASTIC_WORKDIR_FILES"
ENV_COLLECTIVE_TIMEOUT_S = "NOTEBOOK_ELASTIC_COLLECTIVE_TIMEOUT_S"
ENV_CHECKPOINT_EVERY = "NOTEBOOK_ELASTIC_CHECKPOINT_EVERY"  # State saves every N steps (unset: chosen)
ENV_SUPERVISOR_PID = "NOTEBOOK_ELASTIC_SUPERVISOR_PID"  # an agent exits when this process dies
# "1" where the rendezvous store can come back at the same endpoint when it is lost (a cluster's
# store pod, under its Deployment): the agents wait for it instead of failing.
ENV_STORE_REPLACEABLE = "NOTEBOOK_ELASTIC_STORE_REPLACEABLE"
# How often a node waiting in a rendezvous round looks at it again (seconds; unset: torch's 1 s).
ENV_RDZV_POLL_S = "NOTEBOOK_ELASTIC_RDZV_POLL_S"
ENV_RDZV_EPOCH = "NOTEBOOK_ELASTIC_RDZV_EPOCH"  # bumped each time a backend restarts all agents
ENV_FILES_SHA256 = "NOTEBOOK_ELASTIC_FILES_SHA256"  # JSON {path: sha256} of the script and payload at launch
# Set by our agent wrapper for its workers.
ENV_AGENT_PID = "NOTEBOOK_ELASTIC_AGENT_PID"  # a worker exits when its agent dies
ENV_JOINER = "NOTEBOOK_ELASTIC_JOINER"  # "1": this node joins a job that trains (it may be evicted)
ENV_NOTICE_STORE = "NOTEBOOK_ELASTIC_NOTICE_STORE"  # host:port of the store notices are posted in (notice.py)
# A cluster pod's grace period (terminationGracePeriodSeconds): its agent runs under a keeper
# that turns the kubelet's SIGTERM into a notice (notice_keeper.py). Unset locally.
ENV_NOTICE_GRACE_S = "NOTEBOOK_ELASTIC_NOTICE_GRACE_S"
# "1" where the cluster signals every process of a node at once (Slurm's job steps): only the
# keeper acts on that SIGTERM; the agent and workers wait for it (term.py).
ENV_TERM_TO_ALL = "NOTEBOOK_ELASTIC_TERM_TO_ALL"
# The node's notice folder, made by its keeper: the markers of term.py.
ENV_NOTICE_DIR = "NOTEBOOK_ELASTIC_NOTICE_DIR"
ENV_ROUND = "NOTEBOOK_ELASTIC_ROUND"  # the rendezvous round the worker group was formed in
# In place (runtime/inplace.py, agent/inplace.py): where a worker reaches its agent (an abstract
# Unix socket's name) and the token that proves it is the agent's; the rendezvous store
# (host:port) its group's keys live in, and the key prefix of the group it starts into.
ENV_AGENT_LINK = "NOTEBOOK_ELASTIC_AGENT_LINK"
ENV_AGENT_TOKEN = "NOTEBOOK_ELASTIC_AGENT_TOKEN"
ENV_GROUP_STORE = "NOTEBOOK_ELASTIC_GROUP_STORE"
ENV_GROUP_PREFIX = "NOTEBOOK_ELASTIC_GROUP_PREFIX"
#: "0" turns in-place changes off for a job: every change restarts the workers, as torchrun does.
ENV_IN_PLACE = "NOTEBOOK_ELASTIC_IN_PLACE"
#: Where a worker tells its agent that its group made a step (``mark_progress``): no
#: supervisor reads a cluster's event lines, so an agent learns it from its workers this way.
ENV_PROGRESS_DIR = "NOTEBOOK_ELASTIC_PROGRESS_DIR"
#: "1" where no supervisor watches the nodes (a cluster): each agent sends itself away when its
#: workers fail while it joins a job that trains (agent/run.py), instead of the supervisor.
ENV_AGENTS_EVICT = "NOTEBOOK_ELASTIC_AGENTS_EVICT"
#: A job run's rendezvous id, where the backend does not number its runs itself (Kubernetes):
#: the run's generations start above every one already in its checkpoint folder, so a new
#: job reads an old job's checkpoints instead of being fenced off by them.
ENV_RUN = "NOTEBOOK_ELASTIC_RUN"
#: Kubernetes pods: the tracker rank 0 logs to itself (runtime/pod_tracking.py): mlflow, wandb,
#: none, or auto (as MLFLOW_TRACKING_URI / WANDB_PROJECT say). Local jobs: unset (the supervisor logs).
ENV_TRACK = "NOTEBOOK_ELASTIC_TRACK"
# The warm pool and a node's zygote (pool/): where a process of a job is forked from.
ENV_POOL = "NOTEBOOK_ELASTIC_POOL"  # the pool's socket name ("@..."), passed to every process of a job
ENV_POOL_ON = "NOTEBOOK_ELASTIC_WARM_POOL"  # "0" turns the pool off
ENV_POOL_IDLE_S = "NOTEBOOK_ELASTIC_POOL_IDLE_S"  # how long an idle pool waits before it ends
ENV_POOL_OWNER = "NOTEBOOK_ELASTIC_POOL_OWNER"  # a pid: the pool ends with that process (a test session)
ENV_FORKED = "NOTEBOOK_ELASTIC_FORKED"  # in a forked child: its own pid (children inherit it, and differ)
ENV_LAUNCHER = "NOTEBOOK_ELASTIC_LAUNCHER"  # in a forked child: its launcher's pid
ENV_ZYGOTE = "NOTEBOOK_ELASTIC_ZYGOTE"  # a node's zygote's socket name ("@..." = abstract), for launchers
ENV_ZYGOTE_READY = "NOTEBOOK_ELASTIC_ZYGOTE_READY"  # the pipe a node's zygote says it is ready on (its agent's)
ENV_WARM_WORKERS = "NOTEBOOK_ELASTIC_WARM_WORKERS"  # "0" turns warm starts off (the pool's and the zygote's)
ENV_WARM_PARENT = "NOTEBOOK_ELASTIC_WARM_PARENT"  # a forked worker's parent: the zygote
#: "1" in a node's agent once its notice keeper forked it (agent/notice_keeper.py): the agent
#: does not keep itself again.
ENV_KEPT = "_NOTEBOOK_ELASTIC_KEPT"
#: How much our processes log on their standard error (debug, info, warning, error): read by
#: every process of a job, which inherits it from the kernel (plumbing/log.py); pods get it too.
ENV_LOG = "NOTEBOOK_ELASTIC_LOG"
#: A Slurm job's mark, as the launcher hands it to the supervisor's allocation
#: (backends/slurm/mark.py: its folder may be read through a file system cache on another host).
ENV_SLURM_MARK = "NOTEBOOK_ELASTIC_SLURM_MARK"

# Keys of ours in the job's rendezvous store, beside torch's rendezvous state.
#: The number of nodes the job runs now, set by the local supervisor: a round that holds that
#: many closes at once (agent/rendezvous.py).
TARGET_KEY = "notebook_elastic/target"
#: Agents that died on this machine, JSON ``{pid: when}``, set by the local supervisor: its
#: agents drop them from their round at once, not when their heartbeat expires.
GONE_KEY = "notebook_elastic/gone"
#: A random id our store server (store/run.py) sets: an agent tells a replacement store from
#: the one it lost by it.
STORE_ID_KEY = "notebook_elastic/store_id"
#: Set (with the time) by a node that goes on purpose, before it leaves its round
#: (``leaving_key``): its peers then regroup without aborting their step (it is not lost).
LEAVING_KEY = "notebook_elastic/leaving"
#: Where the supervisor asks a node's keeper to SIGKILL one of its workers (the kill-a-worker
#: drill, for a node on another host than the supervisor's: Slurm): ``{"pid", "rank"}``.
KILL_KEY = "notebook_elastic/kill/{node}"


#: The store key a notice is posted under (one at a time: a newer notice replaces it;
#: runtime/notice.py).
NOTICE_KEY = "notebook_elastic/notice"
#: Rank 0's newest answer, whichever notice it answered: ``{"id", "notice_at", "step", "saved"}``
#: (a notifier whose notice was replaced by a newer one learns from it that the save is done).
LATEST_ANSWER_KEY = f"{NOTICE_KEY}/saved/latest"
#: A counter of the notices posted: a poster adds one to it once its notice is up and sets
#: ``mark_key(NOTICE_POSTS_KEY, count)``; rank 0, while no notice stands, waits on the next
#: count's key (the store answers at once), instead of looking for a notice every few ms.
NOTICE_POSTS_KEY = f"{NOTICE_KEY}/posts"
#: Beside torch's rendezvous state key (``torch.rendezvous.<run id>``): what the nodes said
#: they do, one key per interval (agent/together.py).
ANNOUNCED_SUFFIX = "/announced"


def rendezvous_state_key(run_id: str) -> str:
    """torch's key for the state of the c10d rendezvous ``run_id`` (``C10dRendezvousBackend``,
    the same on every torch we support: tests/test_torch_compat.py), which the rounds' own keys
    below are named after."""
    return "torch.rendezvous." + run_id


# A round's keys beside torch's state (agent/together.py, agent/rounds.py): set by a write of ours
# that opened or completed round R, or changed its members; a node waiting for that waits on it
# (the store answers a WAIT when the key is set).
OPENED, COMPLETE = "opened", "complete"
#: A counter per round (``signal_key(..., CHANGED)``), added to by a write of ours that took a
#: member out of a complete round or put a node on its wait list, and by the supervisor when it
#: saw a member die (supervisor/board.py): a member whose copy of the round is fresher than
#: torch's one-second cache reads the counter (a few bytes) at most every ``CHANGE_LOOK_S``
#: (together.look_due) and the round itself only when it moved (together.looked_at).
CHANGED = "changed"


def signal_key(state_key: str, round_: int, what: str) -> str:
    """The key of round ``round_``'s ``what`` (``OPENED``, ``COMPLETE``, ``CHANGED``)."""
    return f"{state_key}/round/{round_}/{what}"


def mark_key(counter_key: str, count: int) -> str:
    """The key a writer sets once it moved a round's ``CHANGED`` counter (its key:
    ``signal_key(..., CHANGED)``) to ``count``: a member waits on the next count's
    (agent/change_watch.py), the store answers at once."""
    return f"{counter_key}/{count}"


def leaving_key(agent_pid: int) -> str:
    return f"{LEAVING_KEY}/{agent_pid}"


def answer_key(notice_id: int) -> str:
    """Where rank 0 answers a notice: ``{"step", "seconds", "saved"}``."""
    return f"{NOTICE_KEY}/saved/{notice_id}"


def announced_key(state_key: str, interval: int) -> str:
    """The key of what nodes said during ``interval`` (numbered from the epoch)."""
    return f"{state_key}{ANNOUNCED_SUFFIX}/{interval}"


def group_prefix(run_id: str, round_: int, epoch: int = 0) -> str:
    """The key prefix of the group formed in a rendezvous round: agents and fresh workers
    compute it alike, and no later group reads an earlier one's keys (runtime/inplace.py)."""
    return f"notebook_elastic/group/{run_id}/{epoch}/{round_}"


def fatal_key(run_id: str) -> str:
    """Set (to the node's name) when a node's worker failed in a way no retry can mend
    (``EXIT_FATAL``): the other agents see that node leave as the job's end, not a departure
    to restart for (agent/run.py)."""
    return f"notebook_elastic/fatal/{run_id}"


def ready_key(group_prefix_: str) -> str:
    """How many of a group's members are up and about to form it (runtime/group.py): each
    worker counts itself as it comes; whoever brings the count to the group's size sets
    ``all_ready_key``. Only then does a member start torch's forming, which is bounded
    (``FORMING_BOUND_S``): a member lost after this point cannot hold the others for the
    collective timeout in gloo's connect, where no abort reaches them."""
    return f"{group_prefix_}/ready"


def kept_key(group_prefix_: str) -> str:
    """How many of a group's members are kept workers, added to by their agents as they regroup
    (agent/inplace.py): with ``ready_key``'s count of fresh ones up, an agent that waits for the
    new members' workers knows when none is left to come, whatever its own last round held."""
    return f"{group_prefix_}/kept"


def saver_key(group_prefix_: str) -> str:
    """Claimed (``compare_set`` from empty, to the claimant's rank) by the first survivor of a
    group that broke as its nodes were told to go (a stop while they regrouped after a loss):
    that one saves the values every survivor holds, whether or not the group's writer (rank 0)
    survived (runtime/inplace.py ``chosen_to_save``)."""
    return f"{group_prefix_}/saver"


def all_ready_key(group_prefix_: str) -> str:
    """Set once every member of a group counted itself in ``ready_key``."""
    return f"{group_prefix_}/all_ready"


def joiner_key(run_id: str, name: str) -> str:
    """A key of the agents' eviction of a node that fails while joining (agent/joiner.py):
    ``progressed``, ``failed/ROUND``, ``evicted/INDEX``, ``charged/INDEX``."""
    return f"notebook_elastic/{run_id}/joiners/{name}"


#: Our agent's exit status when its workers failed more often than --max-restarts allows
#: (torchrun itself exits 1 then, as it does on SIGTERM). A Kubernetes Job fails at once on
#: it (podFailurePolicy FailJob) instead of replacing the pod to fail the same way again.
EXIT_RESTARTS_SPENT = 3
#: Our agent's exit status when the job's script or payload is no longer what was launched:
#: it refuses to start workers from files someone changed.
EXIT_FILES_CHANGED = 4
#: Our agent's exit status when its rendezvous store stopped answering, or went, and no store
#: answered again within the store's timeout (torchrun itself exits 1 after a traceback).
EXIT_STORE_LOST = 5
#: Our agent's exit status when its workers failed while it joined a job that trains (a module
#: missing on its node, a broken driver or NIC): it left the round and the job goes on without
#: it. Not the job's failure: a Job's podFailurePolicy ignores it.
EXIT_EVICTED = 6
#: A worker's exit status, then its agent's, when its failure would be the same at every retry
#: (its State holds what cannot be saved): the agent stops its workers instead of restarting
#: them, so no retry of --max-restarts is spent on it, and a Job fails at once on it
#: (podFailurePolicy FailJob) instead of replacing the pod to fail the same way again.
EXIT_FATAL = 7
#: Our agent's exit statuses when its job has failed for good: a Job fails at once on them
#: (podFailurePolicy FailJob), and bare pods that ended with them say which rank failed how.
EXITS_FAILED_FOR_GOOD = (EXIT_RESTARTS_SPENT, EXIT_FATAL)
#: The error a worker exiting EXIT_FATAL recorded in torchelastic's error file: a user's own
#: sys.exit(7) is an ordinary failure, retried as any other.
FATAL_ERROR = "StateNotSaveable"

#: A worker's exit status when its collective broke because a peer went away (gloo's
#: "connection closed by peer", a store that lost a member, a newer group fencing this one):
#: not its own failure. The agent restarts such a group without charging --max-restarts,
#: once it has seen the membership change (EX_TEMPFAIL: try again).
EXIT_PEER_LOST = 75

# What a broken collective says when a peer vanished, in torch's gloo/NCCL/store errors.
PEER_LOST_PATTERNS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connectfullmesh",
    "communicator was aborted",
    "remote process exited",
    "socket closed",
)


def exit_reason(code: int | None) -> str:
    """Why an agent (a local node, a worker pod's container) ended, from its exit status."""
    if code == 0:
        return "finished"
    if code == EXIT_RESTARTS_SPENT:
        return "restart budget spent"
    if code == EXIT_FILES_CHANGED:
        return "its script or payload changed"
    if code == EXIT_STORE_LOST:
        return "its rendezvous store stopped answering"
    if code == EXIT_EVICTED:
        return "evicted"  # the local supervisor's word for the same departure
    if code == EXIT_FATAL:
        return "its workers failed in a way no restart can mend"
    return f"exited with code {code}"


def own_launcher() -> int | None:
    """The launcher standing in for this process, where the warm pool or its node's zygote forked
    it (not a child of such a fork, nor a process that inherited the variables): the pid torchrun
    watches for a warm worker, which torch's lines name (worker_started says it too)."""
    env = os.environ
    if env.get(ENV_FORKED) != str(os.getpid()) and env.get(ENV_WARM_PARENT) != str(os.getppid()):
        return None
    try:
        return int(env[ENV_LAUNCHER])
    except (KeyError, ValueError):
        return None


def mark_progress(environ: Mapping[str, str] | None = None) -> None:
    """Called by a worker once its group has made a step: marks the round in its agent's
    progress folder (``ENV_PROGRESS_DIR``), where the agent looks when it must tell a node that
    joined a job that trains (and may be sent away) from one that trained with it."""
    env = os.environ if environ is None else environ
    folder, round_ = env.get(ENV_PROGRESS_DIR), env.get(ENV_ROUND)
    if not folder or round_ is None:
        return
    try:
        with open(os.path.join(folder, f"round-{int(round_)}"), "a"):
            pass
    except (OSError, ValueError):  # the folder is gone (the agent ended): nobody asks
        pass


def progress_marked(folder: str | None, round_: int) -> bool:
    """Whether a worker of this node marked ``round_`` as one in which its group made a step."""
    if not folder:
        return False
    return os.path.exists(os.path.join(folder, f"round-{round_}"))


def sha256_of(path: str | os.PathLike[str]) -> str | None:
    """The file's sha256 (hex), or None when it is gone."""
    import hashlib  # here: every process imports this module, a worker's launcher too

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def changed_files(expected: dict[str, str] | str | None) -> list[str]:
    """Which of the launched files (``{path: sha256}``, or its JSON) differ from what was launched."""
    if isinstance(expected, str):
        expected = json.loads(expected) if expected.strip() else {}
    return [path for path, digest in sorted((expected or {}).items()) if sha256_of(path) != digest]


def files_changed_reason(paths: list[str]) -> str:
    """The one sentence a job that refused to run changed files fails with."""
    names = ", ".join(os.path.basename(p) for p in paths)
    return (
        f"{names} changed after launch (sha256 differs from what was launched), so it was not run again; "
        "relaunch the cell to run new code"
    )


#: Rendezvous rounds restart at 0 with each rendezvous epoch; a generation orders both.
GENERATION_EPOCH_STRIDE = 1_000_000

# Checkpoint files: ordered by (generation, step); the name sorts the same way. A sharded
# model's checkpoint is a folder (``.dcp``: every rank's shards, torch.distributed.checkpoint).
CHECKPOINT_RE = re.compile(r"^ckpt-g(\d{12})-s(\d{10})\.(?:pt|dcp)$")
CLAIM_RE = re.compile(r"^gen-(\d{12})\.claim$")


def checkpoint_name(generation: int, step: int, sharded: bool = False) -> str:
    return f"ckpt-g{generation:012d}-s{step:010d}.{'dcp' if sharded else 'pt'}"


def claim_name(generation: int) -> str:
    return f"gen-{generation:012d}.claim"

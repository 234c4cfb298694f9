"""The event vocabulary, defined here once: the kinds of event (``Kind``), a job's status
(``Status``), what each kind of event carries, as a typed class per kind (a ``TypedDict``: an
event's data is a JSON object, read as one), versioned (``SCHEMA_VERSION``).

Everything else is derived from these classes: the JSON Schema of each kind (``event_schemas()``,
which the test suite checks every job history it produces against), the checked-in JSON Schema
document (``contract/events.schema.json``) and the labextension's TypeScript types
(``labextension/src/contract.ts``), both written by ``scripts/gen_contract.py`` and kept current
by ``tests/test_contract.py``. A field without ``NotRequired`` is in every event of its kind; an
event may carry fields a newer version added (readers ignore what they do not know), so a
kernel reads an older job's history, and an older kernel a newer one's.

Change a kind by adding ``NotRequired`` fields; renaming or retyping a field, or making one
required, is a new ``SCHEMA_VERSION`` (and a replay fixture of the old one in tests/data/events).
The module is a little over 600 lines, and one: the whole vocabulary, one short class per kind
(45 of them) after the kinds and statuses, read together (a kind's fields beside its name) and
defined in one place, which is the point (#38 item 4).

Worker-side module: the workers and agents (``runtime/``, ``agent/``) emit through these
classes, so it imports only the standard library (and typing_extensions on Python 3.10),
nothing of ours: tests/test_layers.py holds it to that.
"""

# No ``from __future__ import annotations`` here: a TypedDict's string annotations are each a
# ForwardRef, compiled when its class is made (232 compiles, 8 ms quiet and 25 ms in a worker
# forked beside its peers, at every process's start); these classes' annotations are plain values.
import functools
import sys
import types
import typing
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, TypedDict, Union

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired


class Kind(StrEnum):
    """Event kinds. A ``StrEnum``: each one is its own string, so events serialize as plain
    JSON and a kind read back from a line compares equal to the member."""

    JOB_SUBMITTED = "job_submitted"
    JOB_FINISHED = "job_finished"
    JOB_RESUMED = "job_resumed"
    RECOVERING = "recovering"  # its supervisor died; the guardian brings it back
    STALL = "stall"
    DISK_FULL = "disk_full"
    OUTPUT_CAPPED = "output_capped"
    DEGRADED = "degraded"  # the installed torch lacks internals we use: the job runs, heals slower
    STALL_CLEARED = "stall_cleared"
    SUPERVISOR_FROZEN = "supervisor_frozen"  # our own supervisor did not run for a while (SIGSTOP, a suspend)
    SCALED = "scaled"  # target nodes or range changed
    FAULT = "fault"  # a fault drill was injected
    NODE_JOINED = "node_joined"
    NODE_LEFT = "node_left"
    NODE_EVICTED = "node_evicted"  # a node whose workers failed while joining was sent away
    PENDING = "pending"  # a node waits for capacity (Kubernetes: Unschedulable, ImagePullBackOff...)
    QUEUE = "queue"  # what Kueue says of the job: waiting for quota, admitted, evicted (backends/kubernetes/kueue.py)
    AGENT_STARTED = "agent_started"
    STORE_READY = "store_ready"  # the c10d store serves (Kubernetes: the rendezvous pod)
    RENDEZVOUS = "rendezvous"
    RESTART = "restart"
    WORKER_STARTED = "worker_started"
    WORKER_FAILED = "worker_failed"
    WORKER_EXITED = "worker_exited"  # the agent saw a worker process die (exit code / signal)
    WORKER_FINISHED = "worker_finished"
    AGENT_SIGNALED = "agent_signaled"
    PEER_LOST = "peer_lost"  # an agent saw a member of its round vanish and ended its workers
    STORE_LOST = "store_lost"  # the rendezvous store's pod went (deleted, evicted); a new one replaces it
    LEFT_RENDEZVOUS = "left_rendezvous"  # a stopped agent took itself out of its round
    # In place (runtime/inplace.py, agent/inplace.py): the members changed and the workers kept
    # their processes.
    IN_PLACE = "in_place"  # rank 0 of the new group: sizes, the step it trains from, what it cost
    REGROUPED = "regrouped"  # an agent formed a new round and kept its workers
    IN_PLACE_REFUSED = "in_place_refused"  # an agent restarts its workers: they cannot stay (why)
    LEFT_AT_BOUNDARY = "left_at_boundary"  # a node that goes: its workers left at a step boundary
    GROUP_SUCCEEDED = "group_succeeded"
    METRIC = "metric"
    GPU = "gpu"  # a rank's peak GPU memory and its device's utilisation, every few seconds
    PLAN = "plan"
    RESUMED = "resumed"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_FAILED = "checkpoint_failed"
    NOTICE = "notice"  # a node is to go after a grace period: the job saves first (runtime/notice.py)
    SAVED_ON_NOTICE = "saved_on_notice"  # rank 0 saved at the step boundary after a notice
    NOTICE_EXPIRED = "notice_expired"  # the grace ended before a save on notice: what it cost
    CHECKPOINT_UNREADABLE = "checkpoint_unreadable"
    FENCED = "fenced"
    ERROR = "error"  # an agent-side error worth showing (rendezvous timeout, ...)
    FILES_CHANGED = "files_changed"  # the script or payload differs from what was launched: not run
    TRACKING = "tracking"  # where the run is tracked: MLflow/W&B run, TensorBoard (runtime/tracking.py)
    LOG = "log"


class Status(StrEnum):
    """A job's status: the one word every view (dashboard, panel, ``jobs()``, the CLI) shows."""

    PREPARED = "prepared"  # a dry run's handle (launch(..., dry_run=True)): start() launches it
    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    RECOVERING = "recovering"  # its supervisor died; its guardian brings it back
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    # Its supervisor is gone (killed, the machine restarted, its folder deleted). Final until
    # resume(); every view says "lost" for it, the notebook as much as jobs() and the panel.
    LOST = "lost"
    EXPIRED = "expired"  # Kubernetes: its workers and their Job are gone (deleted, the TTL)
    DAMAGED = "damaged"  # its records cannot be read (listed, never followed)


FINAL_STATUSES = (Status.SUCCEEDED, Status.FAILED, Status.STOPPED, Status.LOST)
#: Listing order (jobs(), %elastic_jobs, GET /jobs, the panel): what needs attention first.
ATTENTION_ORDER = (
    Status.RESTARTING,
    Status.RUNNING,
    Status.RECOVERING,
    Status.PENDING,
    Status.FAILED,
    Status.LOST,
    Status.STOPPED,
    Status.SUCCEEDED,
    Status.EXPIRED,
    Status.DAMAGED,
)


#: The version of the event contract this package writes (job_submitted and job_resumed carry it).
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Pattern:
    """A string field's pattern (JSON Schema ``pattern``): ``Annotated[str, Pattern("^https?://")]``."""

    regex: str


class JobSubmitted(TypedDict):
    nodes: int
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    max_restarts: int
    gpus: NotRequired[int]
    grace_s: NotRequired[float]
    schema: NotRequired[int]  # SCHEMA_VERSION of the history that follows (absent: written before versions)
    name: NotRequired[str]
    backend: NotRequired[str]
    notebook: NotRequired[str | None]
    namespace: NotRequired[str]


class JobResumed(TypedDict):
    nodes: int
    min_nodes: int
    max_nodes: int
    max_restarts: int
    after: NotRequired[str]
    nproc_per_node: NotRequired[int]
    gpus: NotRequired[int]
    schema: NotRequired[int]
    name: NotRequired[str]
    backend: NotRequired[str]
    notebook: NotRequired[str | None]


class JobFinished(TypedDict):
    status: Literal["succeeded", "failed", "stopped", "lost"]
    reason: NotRequired[str | None]


class Recovering(TypedDict):
    reason: str
    recovery: NotRequired[int]  # which of the guardian's tries (backends/local/guardian.py), from 1


class Stall(TypedDict):
    step: int | None
    for_s: float
    stopped: NotRequired[list[int]]
    waiting: NotRequired[list[int]]
    restart_after_s: NotRequired[float | None]


class StallCleared(TypedDict):
    for_s: float
    step: NotRequired[int | None]
    restarted: NotRequired[bool]


class SupervisorFrozen(TypedDict):
    for_s: float
    step: NotRequired[int | None]


class DiskFull(TypedDict):
    message: str


class OutputCapped(TypedDict):
    cap_bytes: int


class Degraded(TypedDict):
    missing: dict[str, str]
    torch: NotRequired[str]
    tested: NotRequired[str]


class Scaled(TypedDict):
    target: int
    min_nodes: NotRequired[int]
    max_nodes: NotRequired[int]
    reason: NotRequired[str]
    reconfigured: NotRequired[bool]
    returned: NotRequired[bool]  # a node taken away with return_after_s came back
    epoch: NotRequired[int]  # the membership epoch the new size starts


class Fault(TypedDict):
    fault: str
    target: NotRequired[str]
    rank: NotRequired[int]
    return_after_s: NotRequired[float | None]
    pid: NotRequired[int]  # the rank's process killed (kill_worker)
    grace_s: NotRequired[float]  # the notice the node was given first (preempt_node)


class NodeJoined(TypedDict):
    pid: NotRequired[int | None]
    epoch: NotRequired[int]  # the membership epoch it joined in (local and Slurm supervisors)
    warm: NotRequired[bool]  # a standby agent taken, not one started for it
    gpus: NotRequired[list[str]]  # the devices its ranks are placed on, its own alone
    ip: NotRequired[str | None]  # a pod's address
    index: NotRequired[str | None]  # a pod's completion index, as its label says it


class NodeLeft(TypedDict):
    reason: str
    exitcode: NotRequired[int | None]


class NodeEvicted(TypedDict):
    failure: str | None
    target: NotRequired[int]
    round: NotRequired[int | None]  # the round it was sent away from
    index: NotRequired[str]  # its place in the job (a pod's completion index, else its node's name)


class Pending(TypedDict):
    reason: str
    message: NotRequired[str]
    component: NotRequired[str]  # what waits: the rendezvous (a pod not yet joined)


class Queue(TypedDict):
    queue: str
    state: Literal["waiting", "admitted", "evicted"]
    reason: NotRequired[str]
    message: NotRequired[str]
    cluster_queue: NotRequired[str]
    workload: NotRequired[str]
    count: NotRequired[int]
    elastic: NotRequired[bool]
    slice: NotRequired[bool]


class AgentStarted(TypedDict):
    pid: int
    host: NotRequired[str]


class StoreReady(TypedDict):
    port: int
    host: NotRequired[str]
    pid: NotRequired[int]


class RoundMember(TypedDict):
    addr: str
    pid: int
    local_id: int
    group_rank: int


class Rendezvous(TypedDict):
    round: int | None
    group_rank: int
    group_world_size: NotRequired[int]
    epoch: NotRequired[int]
    members: NotRequired[list[RoundMember]]  # the nodes in the round, by group rank (up to 64)
    lead: NotRequired[RoundMember]  # group rank 0 (global rank 0's node), told at any size
    agent_pid: NotRequired[int]


class Restart(TypedDict):
    reason: Literal["worker_failed", "departure", "membership_change", "store_replaced"]
    restarts_used: NotRequired[int]
    max_restarts: NotRequired[int]
    new_nodes: NotRequired[int]
    written: NotRequired[float]
    round: NotRequired[int | None]  # the rendezvous round the restart leaves (agent side)
    local_ranks: NotRequired[list[int]]  # a departure: the local ranks that left
    state: NotRequired[str]  # torchrun's word for the group it restarts: FAILED or UNHEALTHY (its log line)


class WorkerStarted(TypedDict):
    rank: int
    local_rank: int
    world_size: int
    pid: int
    generation: NotRequired[int | None]
    restart_count: NotRequired[int]
    in_place: NotRequired[bool]  # the same process, now in a new group (runtime/inplace.py)
    # The rest of what torchrun told the worker (runtime/worker.py WorkerInfo): sent since the
    # first version, declared here so the worker's line goes through this class.
    local_world_size: NotRequired[int]
    group_rank: NotRequired[int]
    run_id: NotRequired[str]
    host: NotRequired[str]
    # The pid torchrun watches for it where that is not its own: a warm start's launcher, which
    # torch's lines name (worker_exited gives the worker's own pid, and this one as launcher).
    launcher: NotRequired[int]


class InPlace(TypedDict):
    """Rank 0 of a group formed in place: the members changed, the kept workers did not restart."""

    world_size: int
    from_world_size: int  # 0: no rank of the old group was kept here (every node restarted)
    step: int  # the step the new group trains from
    redone: int  # steps trained before the change that are trained again (the step in flight)
    kept: int  # ranks that kept their processes
    joined: int  # ranks that started fresh (a new node, a restarted one): they took the live values
    took_s: float  # the longest a kept rank stood still: from its last step's end to the new group
    round: NotRequired[int]
    source: NotRequired[int]  # the rank the values came from (-1: every rank held its own)
    reason: NotRequired[str]  # why: "joined", "left", "lost", "store"
    transfer_s: NotRequired[float]  # the values sent from the source to the ranks that lacked them
    transfer_bytes: NotRequired[int]
    from_nodes: NotRequired[int]  # the old group's nodes, as the ranks that trained on knew it (0: none did)
    nodes: NotRequired[int]  # the new group's


class Regrouped(TypedDict):
    round: int
    group_rank: int
    group_world_size: int
    kept: list[int]  # the workers' processes, kept
    reason: str
    took_s: float  # the rendezvous round it took
    trained_on_s: NotRequired[float]  # then trained on in the old group while joiners' workers started


class InPlaceRefused(TypedDict):
    reason: str  # why this node's workers restart instead


class LeftAtBoundary(TypedDict):
    local_ranks: list[int]


class WorkerFailed(TypedDict):
    rank: int
    error: str
    message: str
    traceback: NotRequired[str]
    step: NotRequired[int | None]
    cause: NotRequired[Literal["peer"]]
    fatal: NotRequired[bool]
    generation: NotRequired[int | None]
    pid: NotRequired[int]


class WorkerExited(TypedDict):
    local_rank: int
    pid: NotRequired[int | None]  # the worker's own (its worker_started's), where its line said it
    launcher: NotRequired[int]  # the pid torch named: the launcher standing for a warm start
    exitcode: NotRequired[int | None]
    signal: NotRequired[int | str]
    written: NotRequired[float]


class WorkerFinished(TypedDict):
    rank: int
    pid: NotRequired[int]


class AgentSignaled(TypedDict):
    signal: str


class PeerLost(TypedDict):
    round: int | None
    lost: list[Any]
    workers: NotRequired[list[int]]


class StoreLost(TypedDict):
    reason: str


class LeftRendezvous(TypedDict):
    pid: NotRequired[int]


class GroupSucceeded(TypedDict):
    pass


class Metric(TypedDict):
    values: dict[str, Any]
    step: NotRequired[float | None]
    rank: NotRequired[int]
    samples_per_step: NotRequired[int]  # the State's data cursor's global batch, when it knows it
    # Rank 0's State: seconds commit() blocked and the loop's seconds (inside and outside it) since
    # this worker group's loop started; the notebook sums them over the job's groups (#39 item 2).
    blocked_s: NotRequired[float]
    loop_s: NotRequired[float]


class Gpu(TypedDict):
    rank: int
    mem_peak_bytes: int
    device: NotRequired[int]
    mem_total_bytes: NotRequired[int]
    util_percent: NotRequired[int]


class Plan(TypedDict):
    total: int
    start: int
    generation: NotRequired[int | None]


class Resumed(TypedDict):
    step: int
    generation: NotRequired[int | None]
    from_world_size: NotRequired[int | None]
    world_size: NotRequired[int]
    samples_seen: NotRequired[int]
    from_generation: NotRequired[int]  # the checkpoint generation restored (-1: unknown)
    path: NotRequired[str]  # the checkpoint restored
    why: NotRequired[str]  # why a checkpoint, not the live values (in place's fallback)


class Checkpoint(TypedDict):
    step: int
    generation: NotRequired[int | None]
    bytes: NotRequired[int]
    ms: NotRequired[float]
    commits: NotRequired[int]
    blocked_pct: NotRequired[float]  # the share of the loop's time commit() blocked since the last one
    every: NotRequired[int]  # steps between saves
    chosen: NotRequired[bool]  # ``every`` chosen by State, not given


class CheckpointFailed(TypedDict):
    error: str
    step: NotRequired[int | None]
    disk_full: NotRequired[bool]
    retry_s: NotRequired[float]
    folder: NotRequired[str]
    final: NotRequired[bool]
    saved_step: NotRequired[int | None]


class CheckpointUnreadable(TypedDict):
    path: str
    error: str


class Notice(TypedDict):
    grace_s: float
    id: int


class SavedOnNotice(TypedDict):
    step: int
    seconds: float
    id: int
    grace_s: NotRequired[float]
    notice_node: NotRequired[str]
    saved: NotRequired[bool]
    error: NotRequired[str]
    in_place: NotRequired[bool]  # not saved: the node leaves in place and the others keep the values


class NoticeExpired(TypedDict):
    grace_s: float
    id: int
    lost_steps: NotRequired[int | None]
    needed_s: NotRequired[float]


class Fenced(TypedDict):
    generation: int
    newer_generation: int
    rank: NotRequired[int]
    step: NotRequired[int | None]


class Error(TypedDict):
    message: str
    error: NotRequired[str]


class FilesChanged(TypedDict):
    reason: str
    files: NotRequired[list[str]]


class Tracking(TypedDict):
    tracker: Literal["mlflow", "wandb", "tensorboard"]
    run_id: NotRequired[str]
    experiment_id: NotRequired[str]
    project: NotRequired[str]
    uri: NotRequired[str]
    url: NotRequired[Annotated[str, Pattern("^https?://")]]
    path: NotRequired[str]
    command: NotRequired[str]
    offline: NotRequired[bool]


class Log(TypedDict):
    text: str
    stream: NotRequired[str]


EVENT_TYPES: dict[Kind, type] = {
    Kind.JOB_SUBMITTED: JobSubmitted,
    Kind.JOB_RESUMED: JobResumed,
    Kind.JOB_FINISHED: JobFinished,
    Kind.RECOVERING: Recovering,
    Kind.STALL: Stall,
    Kind.STALL_CLEARED: StallCleared,
    Kind.SUPERVISOR_FROZEN: SupervisorFrozen,
    Kind.DISK_FULL: DiskFull,
    Kind.OUTPUT_CAPPED: OutputCapped,
    Kind.DEGRADED: Degraded,
    Kind.SCALED: Scaled,
    Kind.FAULT: Fault,
    Kind.NODE_JOINED: NodeJoined,
    Kind.NODE_LEFT: NodeLeft,
    Kind.NODE_EVICTED: NodeEvicted,
    Kind.PENDING: Pending,
    Kind.QUEUE: Queue,
    Kind.AGENT_STARTED: AgentStarted,
    Kind.STORE_READY: StoreReady,
    Kind.RENDEZVOUS: Rendezvous,
    Kind.RESTART: Restart,
    Kind.WORKER_STARTED: WorkerStarted,
    Kind.WORKER_FAILED: WorkerFailed,
    Kind.WORKER_EXITED: WorkerExited,
    Kind.WORKER_FINISHED: WorkerFinished,
    Kind.AGENT_SIGNALED: AgentSignaled,
    Kind.PEER_LOST: PeerLost,
    Kind.STORE_LOST: StoreLost,
    Kind.LEFT_RENDEZVOUS: LeftRendezvous,
    Kind.IN_PLACE: InPlace,
    Kind.REGROUPED: Regrouped,
    Kind.IN_PLACE_REFUSED: InPlaceRefused,
    Kind.LEFT_AT_BOUNDARY: LeftAtBoundary,
    Kind.GROUP_SUCCEEDED: GroupSucceeded,
    Kind.METRIC: Metric,
    Kind.GPU: Gpu,
    Kind.PLAN: Plan,
    Kind.RESUMED: Resumed,
    Kind.CHECKPOINT: Checkpoint,
    Kind.CHECKPOINT_FAILED: CheckpointFailed,
    Kind.CHECKPOINT_UNREADABLE: CheckpointUnreadable,
    Kind.NOTICE: Notice,
    Kind.SAVED_ON_NOTICE: SavedOnNotice,
    Kind.NOTICE_EXPIRED: NoticeExpired,
    Kind.FENCED: Fenced,
    Kind.ERROR: Error,
    Kind.FILES_CHANGED: FilesChanged,
    Kind.TRACKING: Tracking,
    Kind.LOG: Log,
}

_JSON_TYPES: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _schema_of_type(t: Any) -> dict[str, Any]:
    """The JSON Schema of one field's type."""
    origin = typing.get_origin(t)
    if origin is Annotated:
        base, *extras = typing.get_args(t)
        schema = _schema_of_type(base)
        for extra in extras:
            if isinstance(extra, Pattern):
                schema["pattern"] = extra.regex
        return schema
    if origin is Literal:
        values = list(typing.get_args(t))
        return {"const": values[0]} if len(values) == 1 else {"enum": values}
    if origin in (Union, types.UnionType):
        return {"type": [_JSON_TYPES[a] for a in typing.get_args(t)]}
    if origin is list:
        (item,) = typing.get_args(t)
        return {"type": "array"} if item is Any else {"type": "array", "items": _schema_of_type(item)}
    if isinstance(t, type) and typing.is_typeddict(t):
        return closed_schema_of(t)  # a record inside a record: exactly its keys
    if isinstance(t, typing.NewType):  # a value the document defines once (server/rows.py's EventLine)
        return {"$ref": f"#/$defs/{t.__name__}"}
    if origin is dict:
        _key, value = typing.get_args(t)
        return (
            {"type": "object"} if value is Any else {"type": "object", "additionalProperties": _schema_of_type(value)}
        )
    return {"type": _JSON_TYPES[t]}


def schema_of(kind_type: type) -> dict[str, Any]:
    """The JSON Schema of a ``TypedDict``: a kind's data (the event's fields but ``kind``, ``t``
    and ``node``), or any other JSON object described so (a row of GET /jobs)."""
    hints = typing.get_type_hints(kind_type, include_extras=True)
    properties = {}
    required = []
    for name, hint in hints.items():
        if typing.get_origin(hint) is NotRequired:
            (hint,) = typing.get_args(hint)
        else:  # (read from the hints: a postponed annotation hides NotRequired from TypedDict itself)
            required.append(name)
        properties[name] = _schema_of_type(hint)
    return {"type": "object", "properties": properties, "required": sorted(required)}


def closed_schema_of(record_type: type) -> dict[str, Any]:
    """``schema_of``, with no key beside the class's own (a record the server sends whole)."""
    return {**schema_of(record_type), "additionalProperties": False}


@functools.cache
def event_schemas() -> dict[Kind, dict[str, Any]]:
    """Each kind's JSON Schema, derived from its class above: on first use, not at import (its
    45 classes' hints, read with ``typing.get_type_hints``, are 240 compiles: 25 to 30 ms of every
    worker's start, the workers that never read a schema)."""
    return {kind: schema_of(t) for kind, t in EVENT_TYPES.items()}

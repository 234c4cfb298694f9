"""The words of the event contract: one sentence per event kind (``describe``), the one place
every view (timeline, text view, CLI, panel) takes them from, and the numbers they share
(steps done, durations, sizes, rates). Each kind's sentence reads its data as its kind's
class (``_DESCRIBE``), so the type checker and tests/test_contract.py check every key read.

The numbers are written one way in every view (#39 item 4): the jobs panel is TypeScript, so
``labextension/src/format.ts`` implements the same rules once more, and both test suites read
one table of cases (``tests/data/words.json``: test_words.py here, format.test.ts there)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..contract.protocol import EXIT_PEER_LOST
from ..runtime.tracking import tracking_text
from .event_types import (
    AgentSignaled,
    AgentStarted,
    Checkpoint,
    CheckpointFailed,
    CheckpointUnreadable,
    Degraded,
    DiskFull,
    Error,
    Fault,
    Fenced,
    FilesChanged,
    Gpu,
    GroupSucceeded,
    InPlace,
    InPlaceRefused,
    JobFinished,
    JobResumed,
    JobSubmitted,
    Kind,
    LeftAtBoundary,
    LeftRendezvous,
    Log,
    Metric,
    NodeEvicted,
    NodeJoined,
    NodeLeft,
    Notice,
    NoticeExpired,
    OutputCapped,
    PeerLost,
    Pending,
    Plan,
    Queue,
    Recovering,
    Regrouped,
    Rendezvous,
    Restart,
    Resumed,
    SavedOnNotice,
    Scaled,
    Stall,
    StallCleared,
    StoreLost,
    SupervisorFrozen,
    Tracking,
    WorkerExited,
    WorkerFailed,
    WorkerFinished,
    WorkerStarted,
)

if TYPE_CHECKING:
    from .events import Event


def steps_done(step: Any) -> int | None:
    """Every view counts steps done (#30): the ranks report the index of the step they just
    made (0 for the first), a checkpoint and a resume the number made. The last index reported,
    99 of a 100-step job, is 100 steps done: "step 100/100" in the dashboard, the summary, the
    jobs listing, the panel and the CLI alike."""
    return None if step is None else int(step) + 1


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    ranks = sorted(ranks)
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _half_up(x: float) -> int:
    """Rounded half away from zero, as JavaScript's Math.round rounds a positive number (Python's
    round() goes to the even neighbour): the panel's format.ts rounds the same way."""
    return math.floor(x + 0.5)


def format_duration(seconds: float | None) -> str:
    """Every duration every view writes (#39 item 4): "0.8s" under ten seconds, "42s", "3m 05s",
    "2h 10m"; a dash when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = max(0.0, float(seconds))
    tenths = _half_up(seconds * 10)
    if tenths < 100:
        return f"{tenths // 10}.{tenths % 10}s"
    whole = _half_up(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def sig(value: float, digits: int) -> str:
    """A number to ``digits`` significant digits, trailing zeros dropped (printf's %g): the loss
    "0.1313", a step time "0.204"."""
    return f"{value:.{digits}g}"


STATUS_PHRASES = {
    "succeeded": "has succeeded",
    "failed": "has failed",
    "stopped": "was stopped",
    "lost": "is lost",
    "damaged": "is damaged",
}


def status_phrase(status: str) -> str:
    """A status as a sentence says it: "job 'long' has succeeded", "was stopped", "is running"."""
    return STATUS_PHRASES.get(status, f"is {status}")


def gib(n: Any) -> str:
    """Bytes as people read GPU memory: 1.5 GiB, 300 MiB."""
    if not isinstance(n, (int, float)):
        return "–"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def rate(per_s: float | None, unit: str) -> str:
    """1.2k samples/s, 35 tokens/s."""
    if per_s is None or not math.isfinite(per_s):
        return "–"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_s >= scale:
            return f"{sig(per_s / scale, 3)}{suffix} {unit}/s"
    return f"{sig(per_s, 3)} {unit}/s"


def degraded_text(d: Degraded) -> str:
    lost = sorted(set((d.get("missing") or {}).values()))
    tested = f" (tested with {d['tested']})" if d.get("tested") else ""
    return f"torch {d.get('torch')} lacks internals notebook-elastic uses{tested}; the job runs, but " + "; ".join(lost)


FAULT_WORDS = {"kill_worker": "killed", "preempt_node": "preempted", "lose_node": "lost (SIGKILL)"}


def describe(e: Event) -> str:
    """One line for people (timeline, text view): the kind's own words (``_DESCRIBE``), from
    its data read as the kind's class."""
    node = e.sender or ""
    words = _DESCRIBE.get(Kind(e.kind)) if e.kind in Kind._value2member_map_ else None
    return words(node, e.data) if words is not None else f"{e.kind} {e.data}"


def _describe_queue(d: Queue) -> str:
    """Kueue's word on the job (backends/kubernetes/kueue.py), in ours."""
    queue, state = d.get("queue", ""), d.get("state")
    if state == "admitted":
        where = f", cluster queue {d['cluster_queue']}" if d.get("cluster_queue") else ""
        return f"admitted by Kueue at {d.get('count')} node(s) (queue {queue}{where})"
    if state == "evicted":
        return (
            f"preempted by Kueue ({d.get('reason') or 'evicted'}): {d.get('message', '')}; the pods save on notice "
            f"and go, and the job waits for quota in {queue} again"
        ).replace(":  ;", ";")
    what = f"a scale-up to {d.get('count')} node(s)" if d.get("slice") else f"{d.get('count')} node(s)"
    return f"waiting for quota in {queue} ({what}): {d.get('message', '')}".rstrip(": ")


# -- each kind's words -------------------------------------------------------------------------


def _job_submitted(node: str, d: JobSubmitted) -> str:
    return f"submitted: {d.get('nodes')} node(s) x {d.get('nproc_per_node')} process(es), range {d.get('min_nodes')}:{d.get('max_nodes')}"


def _output_capped(node: str, d: OutputCapped) -> str:
    return f"worker output beyond {d.get('cap_bytes', 0) // 2**20} MiB is kept only in the node logs (logs/)"


def _disk_full(_node: str, d: DiskFull) -> str:
    return str(d.get("message"))


def _notice(node: str, d: Notice) -> str:
    return (
        f"{node} is to go in {d.get('grace_s', 0):g} s (notice): it goes at a step boundary, saved first where need be"
    )


def _saved_on_notice(_node: str, d: SavedOnNotice) -> str:
    if d.get("in_place"):
        who = f"{d['notice_node']} goes" if d.get("notice_node") else "a node goes"
        return f"{who} at step {d.get('step')}: no save needed, the others keep training in place"
    if not d.get("saved", True):
        return f"could not save on notice at step {d.get('step')}: {d.get('error') or 'the write failed'}"
    who = f" ({d['notice_node']} goes)" if d.get("notice_node") else ""
    return f"saved on notice at step {d.get('step')} in {format_duration(d.get('seconds', 0))}{who}"


def _notice_expired(node: str, d: NoticeExpired) -> str:
    lost = d.get("lost_steps")
    cost = (
        f"about {lost} step(s) since the last checkpoint are redone"
        if lost is not None
        else "work since the last checkpoint is redone"
    )
    enough = (
        f"a grace of about {d['needed_s']:.0f} s would have been enough"  # a setting to give: whole seconds
        if isinstance(d.get("needed_s"), (int, float))
        else "give a grace longer than a save and a step (--grace)"
    )
    return f"{node}'s grace of {d.get('grace_s', 0):g} s ended before a save on notice: {cost}; {enough}"


def _degraded(_node: str, d: Degraded) -> str:
    return degraded_text(d)


def _stall(_node: str, d: Stall) -> str:
    stopped, waiting = d.get("stopped") or [], d.get("waiting") or []
    who = f"rank(s) {_ranks(stopped)} stopped" if stopped else "no rank is making progress"
    then = f"; restarting the group after {d.get('restart_after_s'):.0f} s" if d.get("restart_after_s") else ""
    return (
        f"stalled at step {steps_done(d.get('step'))} for {format_duration(d.get('for_s', 0))}: {who}"
        + (f", rank(s) {_ranks(waiting)} wait for them" if waiting else "")
        + then
    )


def _stall_cleared(_node: str, d: StallCleared) -> str:
    if d.get("restarted"):
        return (
            f"stalled {format_duration(d.get('for_s', 0))}: its stalled ranks were killed, so that the worker "
            "group restarts (one restart)"
        )
    return f"training again after a {format_duration(d.get('for_s', 0))} stall"


def _supervisor_frozen(_node: str, d: SupervisorFrozen) -> str:
    return (
        f"the job's supervisor did not run for {format_duration(d.get('for_s', 0))} (stopped, or the machine "
        "suspended): its processes trained on meanwhile, and progress is judged afresh from now"
    )


def _recovering(_node: str, d: Recovering) -> str:
    return f"recovering: {d.get('reason')}"


def _job_resumed(_node: str, d: JobResumed) -> str:
    return (
        f"resumed after it was {d.get('after')}: training continues from the latest checkpoint; "
        f"restart budget {d.get('max_restarts')} again"
    )


def _job_finished(_node: str, d: JobFinished) -> str:
    reason = d.get("reason")
    return f"job {d.get('status')}" + (f": {reason}" if reason else "")


def _scaled(node: str, d: Scaled) -> str:
    if d.get("reason"):  # the target followed a node taken away
        return f"{node} {d.get('reason')}: target {d.get('target')} node(s)"
    return f"target {d.get('target')} node(s), range {d.get('min_nodes')}:{d.get('max_nodes')}" + (
        " (agents restarted with the new range)" if d.get("reconfigured") else ""
    )


def _fault(_node: str, d: Fault) -> str:
    done = FAULT_WORDS.get(str(d.get("fault")), str(d.get("fault")))
    return f"drill: {d.get('target', '')} {done}".replace("  ", " ")


def _node_joined(node: str, d: NodeJoined) -> str:
    return f"{node} joined"


def _node_left(node: str, d: NodeLeft) -> str:
    return f"{node} left ({d.get('reason', 'unknown')})"


def _node_evicted(node: str, d: NodeEvicted) -> str:
    return (
        f"{node} evicted: it failed while joining ({d.get('failure')}); the other nodes train on at their size "
        f"(target {d.get('target')} node(s))"
    )


def _pending(node: str, d: Pending) -> str:
    if not node and d.get("reason") == "FailedCreate":
        return f"a worker pod could not be created: {d.get('message', '')}"
    return f"{node} pending: {d.get('reason', '')} {d.get('message', '')}".rstrip()


def _queue(_node: str, d: Queue) -> str:
    return _describe_queue(d)


def _rendezvous(node: str, d: Rendezvous) -> str:
    return f"{node}: rendezvous round {d.get('round')}, group rank {d.get('group_rank')} of {d.get('group_world_size')} node(s)"


def _restart(node: str, d: Restart) -> str:
    if d.get("reason") == "departure":
        return f"{node}: a node left its round; regrouping (not counted against the budget)"
    if d.get("reason") == "store_replaced":
        return (
            f"{node}: the rendezvous store was replaced; rejoining in round {d.get('round')} "
            "(not counted against the budget)"
        )
    if d.get("reason") == "membership_change":
        waiting = f"{d['new_nodes']} new node(s)" if d.get("new_nodes") else "a new node"
        return f"{node}: {waiting} waiting; restarting workers (not counted against the budget)"
    return f"{node}: worker group failed; restart {d.get('restarts_used')}/{d.get('max_restarts')}"


def _worker_started(node: str, d: WorkerStarted) -> str:
    if d.get("in_place"):
        return (
            f"rank {d.get('rank')} on {node} goes on in place (local rank {d.get('local_rank')}, world size "
            f"{d.get('world_size')}, the same process {d.get('pid')})"
        )
    return f"rank {d.get('rank')} started on {node} (local rank {d.get('local_rank')}, world size {d.get('world_size')}, pid {d.get('pid')})"


_IN_PLACE_WHY = {
    "left": "a node left",
    "lost": "a node was lost",
    "joined": "a node joined",
    "store": "the rendezvous store was replaced",
}


def _in_place(_node: str, d: InPlace) -> str:
    reason = str(d.get("reason") or "")
    why = _IN_PLACE_WHY.get(reason, "the members changed")
    # The reason is the one the change's first sign gave; one that comes during it (a loss
    # while a joiner took the values, a scale-down after a scale-up) can leave the sizes saying
    # otherwise: never "a node joined: 2 -> 1".
    before, after = d.get("from_world_size") or 0, d.get("world_size") or 0
    if reason != "store" and (
        (after > before and reason != "joined") or (after < before and reason == "joined") or after == before
    ):
        why = "the members changed"
    elif reason in _IN_PLACE_WHY and reason != "store":
        # More than one node at once (a loss during a scale-down: never "a node left: 3 -> 1").
        moved = (d.get("nodes") or 0) - (d.get("from_nodes") or 0) if d.get("from_nodes") else 0
        if reason == "joined" and moved > 1:
            why = f"{moved} nodes joined"
        elif reason != "joined" and moved < -1:
            why = f"{-moved} nodes went (the first {'was lost' if reason == 'lost' else 'left'})"
    redone = d.get("redone", 0)
    joined = d.get("joined", 0)
    took = d.get("took_s", 0.0)
    return (
        f"{why}: {d.get('from_world_size')} \u2192 {d.get('world_size')} ranks in place, training again from step "
        f"{d.get('step')} after {took:.2f} s, {redone} step{'' if redone == 1 else 's'} redone"
        + (f"; {joined} new rank{'' if joined == 1 else 's'} took the live values" if joined else "")
    )


def _regrouped(node: str, d: Regrouped) -> str:
    kept = len(d.get("kept") or [])
    return (
        f"{node}: new round {d.get('round')} formed in {d.get('took_s', 0.0):.2f} s; its {kept} worker"
        f"{'' if kept == 1 else 's'} kept their processes"
    )


def _in_place_refused(node: str, d: InPlaceRefused) -> str:
    return f"{node}: its workers restart instead of staying in place: {d.get('reason')}"


def _left_at_boundary(node: str, d: LeftAtBoundary) -> str:
    return f"{node}: its workers left at a step boundary the group agreed on (no step lost)"


def _worker_failed(node: str, d: WorkerFailed) -> str:
    if d.get("cause") == "peer":  # our words; torch's own text stays in the event (message)
        return (
            f"rank {d.get('rank')} on {node} stopped: a peer left the worker group mid-collective "
            f"({d.get('error')}); the group re-forms without it"
        )
    return f"rank {d.get('rank')} on {node} failed: {d.get('error')}: {d.get('message')}"


def _worker_exited(node: str, d: WorkerExited) -> str:
    if d.get("exitcode") == EXIT_PEER_LOST:
        return f"{node}: worker local rank {d.get('local_rank')} (pid {d.get('pid')}) stopped: a peer left"
    how = f"signal {d['signal']}" if "signal" in d else f"exit code {d.get('exitcode')}"
    return f"{node}: worker local rank {d.get('local_rank')} (pid {d.get('pid')}) died with {how}"


def _worker_finished(_node: str, d: WorkerFinished) -> str:
    return f"rank {d.get('rank')} finished"


def _agent_signaled(node: str, d: AgentSignaled) -> str:
    return f"{node}: agent received {d.get('signal')}; stopping its workers"


def _left_rendezvous(node: str, d: LeftRendezvous) -> str:
    return f"{node}: left the rendezvous"


def _store_lost(node: str, d: StoreLost) -> str:
    return f"rendezvous store {node} {d.get('reason', 'deleted')}: a new one replaces it; the agents re-form their round on it"


def _peer_lost(node: str, d: PeerLost) -> str:
    return f"{node}: {len(d.get('lost') or [])} node(s) of round {d.get('round')} vanished; restarting its workers"


def _group_succeeded(node: str, d: GroupSucceeded) -> str:
    return f"{node}: workers finished"


def _metric(_node: str, d: Metric) -> str:
    values = ", ".join(
        f"{n}={v:.4g}" if isinstance(v, float) else f"{n}={v}" for n, v in (d.get("values") or {}).items()
    )
    return f"step {d.get('step')}: {values}"


def _gpu(_node: str, d: Gpu) -> str:
    util = f", {d.get('util_percent')}% busy" if d.get("util_percent") is not None else ""
    return f"rank {d.get('rank')}: GPU {d.get('device')} peak {gib(d.get('mem_peak_bytes'))} allocated{util}"


def _plan(_node: str, d: Plan) -> str:
    return f"training steps {d.get('start')}..{d.get('total')}"


def _resumed(_node: str, d: Resumed) -> str:
    said = f"resumed from step {d.get('step')} (checkpoint of world size {d.get('from_world_size')}, now {d.get('world_size')})"
    return f"{said}: {d['why']}" if d.get("why") else said


def _checkpoint(_node: str, d: Checkpoint) -> str:
    text = f"checkpoint at step {d.get('step')} ({d.get('bytes', 0) / 1e6:.1f} MB, {d.get('ms')} ms"
    if d.get("blocked_pct") is not None:
        text += (
            f"; saving every {d.get('every')} step(s), commit() blocked {d.get('blocked_pct')} % of the loop "
            "since the last one"
        )
    return text + ")"


def _checkpoint_failed(_node: str, d: CheckpointFailed) -> str:
    if d.get("final"):
        saved = d.get("saved_step")
        held = f"the newest checkpoint holds step {saved}" if saved is not None else "no checkpoint was saved"
        why = f"{d.get('folder') or 'the checkpoint disk'} is full" if d.get("disk_full") else str(d.get("error"))
        return f"the last step's checkpoint (step {d.get('step')}) was not saved, {why}: {held}, a resume starts there"
    if d.get("disk_full"):
        return (
            f"checkpoint at step {d.get('step')} not saved: the disk is full ({d.get('error')}); "
            f"training goes on, saving is tried again every {d.get('retry_s', 30):.0f} s"
        )
    return f"checkpoint at step {d.get('step')} failed: {d.get('error')}"


def _checkpoint_unreadable(_node: str, d: CheckpointUnreadable) -> str:
    return f"checkpoint {d.get('path')} unreadable, using an older one: {d.get('error')}"


def _fenced(_node: str, d: Fenced) -> str:
    return f"stale worker group (generation {d.get('generation')}) refused to write: generation {d.get('newer_generation')} exists"


def _error(node: str, d: Error) -> str:
    return f"{node}: {d.get('message')}"


def _files_changed(node: str, d: FilesChanged) -> str:
    return f"{node}: {d.get('reason')}" if node else str(d.get("reason"))


def _tracking(_node: str, d: Tracking) -> str:
    return tracking_text(d)


def _agent_started(node: str, d: AgentStarted) -> str:
    return f"{node}: agent started (pid {d.get('pid')})"


def _log(node: str, d: Log) -> str:
    return f"{node}: {d.get('text')}"


_DESCRIBE: dict[Kind, Callable[[str, Any], str]] = {
    Kind.JOB_SUBMITTED: _job_submitted,
    Kind.OUTPUT_CAPPED: _output_capped,
    Kind.DISK_FULL: _disk_full,
    Kind.NOTICE: _notice,
    Kind.SAVED_ON_NOTICE: _saved_on_notice,
    Kind.NOTICE_EXPIRED: _notice_expired,
    Kind.DEGRADED: _degraded,
    Kind.STALL: _stall,
    Kind.STALL_CLEARED: _stall_cleared,
    Kind.SUPERVISOR_FROZEN: _supervisor_frozen,
    Kind.RECOVERING: _recovering,
    Kind.JOB_RESUMED: _job_resumed,
    Kind.JOB_FINISHED: _job_finished,
    Kind.SCALED: _scaled,
    Kind.FAULT: _fault,
    Kind.NODE_JOINED: _node_joined,
    Kind.NODE_LEFT: _node_left,
    Kind.NODE_EVICTED: _node_evicted,
    Kind.PENDING: _pending,
    Kind.QUEUE: _queue,
    Kind.RENDEZVOUS: _rendezvous,
    Kind.RESTART: _restart,
    Kind.WORKER_STARTED: _worker_started,
    Kind.WORKER_FAILED: _worker_failed,
    Kind.WORKER_EXITED: _worker_exited,
    Kind.WORKER_FINISHED: _worker_finished,
    Kind.AGENT_SIGNALED: _agent_signaled,
    Kind.LEFT_RENDEZVOUS: _left_rendezvous,
    Kind.IN_PLACE: _in_place,
    Kind.REGROUPED: _regrouped,
    Kind.IN_PLACE_REFUSED: _in_place_refused,
    Kind.LEFT_AT_BOUNDARY: _left_at_boundary,
    Kind.STORE_LOST: _store_lost,
    Kind.PEER_LOST: _peer_lost,
    Kind.GROUP_SUCCEEDED: _group_succeeded,
    Kind.METRIC: _metric,
    Kind.GPU: _gpu,
    Kind.PLAN: _plan,
    Kind.RESUMED: _resumed,
    Kind.CHECKPOINT: _checkpoint,
    Kind.CHECKPOINT_FAILED: _checkpoint_failed,
    Kind.CHECKPOINT_UNREADABLE: _checkpoint_unreadable,
    Kind.FENCED: _fenced,
    Kind.ERROR: _error,
    Kind.FILES_CHANGED: _files_changed,
    Kind.TRACKING: _tracking,
    Kind.AGENT_STARTED: _agent_started,
    Kind.LOG: _log,
}

"""The worker's view of itself, and the wrapper that runs the cell's ``main()``.

Runs inside training processes and container images: imports nothing from IPython,
ipywidgets or kubernetes, and imports torch only when it is needed.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..contract import protocol
from ..contract.event_types import Kind, WorkerFailed, WorkerFinished, WorkerStarted
from ..plumbing import log as _logging
from ..plumbing.parent import set_parent_death_signal
from ._emit import emit

_log = _logging.get("runtime.worker")


class StateNotSaveable(TypeError):
    """A value kept in ``State`` cannot be saved: every commit would fail the same way, so the
    job stops at the first one instead of retrying to the end of its budget."""


class StaleGenerationError(RuntimeError):
    """This worker group was superseded by a newer one; it must not write checkpoints."""


_step_source: Callable[[], int | None] | None = None  # the State of this worker: its step


def set_step_source(source: Callable[[], int | None]) -> None:
    """Where a failure report reads the step the worker was running (``State`` sets it)."""
    global _step_source
    _step_source = source


@dataclass(frozen=True)
class WorkerInfo:
    """Who this process is in the job, read from the environment torchrun sets."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    restart_count: int
    run_id: str
    node: str
    generation: int | None
    pid: int
    host: str

    def started(self, *, in_place: bool = False) -> WorkerStarted:
        """The ``worker_started`` event of this process (its node is the event's own)."""
        said = WorkerStarted(
            rank=self.rank,
            local_rank=self.local_rank,
            world_size=self.world_size,
            local_world_size=self.local_world_size,
            group_rank=self.group_rank,
            restart_count=self.restart_count,
            run_id=self.run_id,
            generation=self.generation,
            pid=self.pid,
            host=self.host,
        )
        if in_place:
            said["in_place"] = True
        launcher = protocol.own_launcher()
        if launcher is not None:
            said["launcher"] = launcher
        return said

    @property
    def distributed(self) -> bool:
        return "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerInfo:
        env = os.environ if env is None else env
        host = socket.gethostname()
        return cls(
            rank=int(env.get("RANK", 0)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            group_rank=int(env.get("GROUP_RANK", 0)),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
            run_id=env.get("TORCHELASTIC_RUN_ID", ""),
            node=env.get(protocol.ENV_NODE) or host,
            generation=generation_from_env(env),
            pid=os.getpid(),
            host=host,
        )


def generation_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """The job-wide generation of this worker group, when our agent told us its round."""
    env = os.environ if env is None else env
    round_ = env.get(protocol.ENV_ROUND)
    if round_ is None:
        return None
    epoch = int(env.get(protocol.ENV_RDZV_EPOCH, 0))
    return epoch * protocol.GENERATION_EPOCH_STRIDE + int(round_)


def guard_against_orphaning() -> None:
    """Called at import inside workers started by our agent wrapper."""
    # A warm-started worker is the zygote's child (the launcher watches its agent for it).
    parent = os.environ.get(protocol.ENV_WARM_PARENT) or os.environ.get(protocol.ENV_AGENT_PID)
    if parent and os.environ.get("LOCAL_RANK") is not None:
        set_parent_death_signal(signal.SIGKILL, int(parent))


_initialized_here = False


def init(backend: str | None = None, timeout_s: float | None = None) -> bool:
    """Initialize the default process group when running under torchrun.

    Returns True when a process group is (now) initialized. The timeout is short on purpose
    (gloo's default is 30 min): a peer that hangs rather than dies must be noticed so the
    agent can restart the group.
    """
    global _initialized_here
    if "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        return False
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return True
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if timeout_s is None:
        timeout_s = float(os.environ.get(protocol.ENV_COLLECTIVE_TIMEOUT_S, 120))
    from .inplace import machinery

    # Under an agent that keeps workers in place, over the rendezvous store (as every later
    # group of this process will be); under plain torchrun, env:// as torchrun set it up.
    if not machinery().init_group(backend, timeout_s):
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    _initialized_here = True
    return True


def device() -> Any:
    """The device this worker should use: its own GPU when there are GPUs, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


_finish_hooks: list[Callable[[], None]] = []


def on_finish(hook: Callable[[], None]) -> None:
    """Run ``hook`` when ``run()`` ends, success or failure (used to flush checkpoints)."""
    _finish_hooks.append(hook)


def _run_finish_hooks() -> None:
    while _finish_hooks:
        hook = _finish_hooks.pop()
        try:
            hook()
        except Exception:  # a failing hook must not hide the real outcome
            traceback.print_exc()


def run(main: Callable[[], Any], *, init_process_group: bool = True, backend: str | None = None) -> Any:
    """Run the packaged cell: start event, process group, ``main()``, outcome event.

    An uncaught exception becomes a ``worker_failed`` event carrying the traceback (and
    torchelastic's error file, so the agent's summary names the real error), then the
    process exits with status 1 for the agent to act on. ``backend``: the one the code's own
    ``init_process_group()`` names (it then uses this group); ``init_process_group=False``:
    the code makes its own group (packaging.own_group_setup).
    """
    info = WorkerInfo.from_env()
    _whole_lines()
    _preimport_in_background()
    emit(Kind.WORKER_STARTED, node=info.node, **info.started())
    handler = None
    if "TORCHELASTIC_ERROR_FILE" in os.environ:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        handler = get_error_handler()
        handler.initialize()
    from .inplace import OWN_DEFAULT_GROUP, MembershipChange, machinery

    inplace = machinery()
    inplace.start()  # under our agent: a change of members need not end this process
    if not init_process_group:  # the code sets its group up itself: it restarts at a change, said
        inplace.incapable = OWN_DEFAULT_GROUP
    try:
        if init_process_group and init(backend):
            _adopt_user_init_calls()
            if (formed := WorkerInfo.from_env()) != info:  # a newer round than it started in (init_group)
                info = formed
                emit(Kind.WORKER_STARTED, node=info.node, **info.started())
        while True:
            try:
                result = main()
                break
            except BaseException as exc:
                if not _stays_in_place(inplace, exc):
                    raise
                info = WorkerInfo.from_env()
                emit(Kind.WORKER_STARTED, node=info.node, **info.started(in_place=True))
        _run_finish_hooks()
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            _run_finish_hooks()
            raise
        _run_finish_hooks()
        if isinstance(exc, KeyboardInterrupt):
            raise
        if inplace.leaving and (isinstance(exc, MembershipChange) or caused_by_a_peer(exc)):
            # Its node goes (a scale-down, a preemption): it left the group at a step boundary
            # every rank agreed on (or, stuck past it, was told to abort); nothing is lost here.
            # Where the group broke on the way (a peer gone before the vote that has every rank
            # save as all go: a stop), its writer saves the step it committed last, alone (not
            # any rank: a node scaled away whose workers were told to abort, past the step
            # boundary, would save for survivors that go on in place). Where no next State took
            # the values the last one handed on, the rank that wrote for that group saves them
            # (the cell ran again), or, where the group broke and the survivors were between
            # groups (a stop as they regrouped after a loss), one survivor: the group's writer
            # may be the member lost (``InPlace.chosen_to_save``).
            if inplace.state is not None and not isinstance(exc, MembershipChange):
                inplace.state.save_leaving_between_groups(broken=True)
            elif inplace.handoff is not None and isinstance(exc, MembershipChange):
                inplace.handoff.save_if_writer()
            elif inplace.handoff is not None:
                inplace.handoff.save_if_chosen(inplace.chosen_to_save)
            _log.info("left the group: its node goes")
            sys.stdout.flush()
            os._exit(0)
        by_peer = caused_by_a_peer(exc) or isinstance(exc, MembershipChange)
        failed = WorkerFailed(
            rank=info.rank,
            pid=info.pid,
            error=type(exc).__name__,
            message=str(exc)[:500],
            traceback="".join(traceback.format_exception(exc))[-2800:],
            step=_step_source() if _step_source is not None else None,
        )
        if by_peer:
            failed["cause"] = "peer"
        if isinstance(exc, StateNotSaveable):
            failed["fatal"] = True  # the same at every retry: no point spending the budget
            # Told to the agent before the event: the supervisor stops the other nodes on it,
            # and they leave before this process has exited; their going is then no departure
            # for this node's agent to restart or regroup for.
            inplace.ends_fatally()
        emit(Kind.WORKER_FAILED, node=info.node, **failed)
        if by_peer:
            # Not this worker's failure: a distinct status lets the agent regroup without
            # charging the user's restart budget (it checks the membership change itself).
            raise SystemExit(protocol.EXIT_PEER_LOST) from exc
        if handler is not None and isinstance(exc, Exception):
            handler.record_exception(exc)
        if failed.get("fatal"):
            # A distinct status, so the agent itself stops instead of restarting: waiting for
            # whoever reads this event to stop it raced torchrun's restart (one retry spent).
            raise SystemExit(protocol.EXIT_FATAL) from exc
        raise
    _shutdown_process_group()
    emit(Kind.WORKER_FINISHED, node=info.node, **WorkerFinished(rank=info.rank, pid=info.pid))
    return result


def _stays_in_place(inplace: Any, exc: BaseException) -> bool:
    """Whether this worker goes on in a new group after the cell's body ended with ``exc``
    (a change of members at a step boundary, or a peer lost mid-step): the group is rebuilt and
    the body runs again, its State taking the live values (runtime/inplace.py)."""
    from .inplace import FENCED, MembershipChange

    boundary = isinstance(exc, MembershipChange)
    peer_lost = not boundary and caused_by_a_peer(exc)
    if not inplace.active or not (boundary or peer_lost) or inplace.leaving:
        return False  # not a change of members (or its node goes: run() ends it)
    if isinstance(exc, StaleGenerationError):
        inplace.link.say_capable(False, FENCED)  # its values are an older lineage's: never kept
        return False
    _run_finish_hooks()  # the ended State's background save lands; its hooks go with it
    try:
        assignment = inplace.continues_after(exc, peer_lost)
    except Exception:
        _log.warning("could not form the new group in place: restarting as torchrun would", exc_info=True)
        return False
    if assignment is None:
        return False
    exc.__traceback__ = None  # the ended body's frames (and the objects they hold) are let go
    return True


_USER_INIT_NOTE = (
    "notebook-elastic: this worker's process group is already set up ({backend}, world size {world}); "
    "the training code's init_process_group() call uses it"
)


def _adopt_user_init_calls() -> None:
    """Make the training code's own ``init_process_group()`` use the group ``run`` set up.

    The packager leaves the group to the code when it can see a call (the cell or a
    definition shipped by source); a call it cannot see (a function shipped by value, a
    local module) would otherwise fail with "trying to initialize the default process group
    twice". Re-creating the group is no answer: a second rendezvous on the same store is not
    reliable. So the call keeps the group when it asks for nothing else, and says what to
    change when it asks for another backend. ``destroy_process_group()`` needs no help:
    ``run`` only shuts down a group that is still there.
    """
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_notebook_elastic_adopts", False):
        return
    noted = False

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> None:
        nonlocal noted
        if not (_initialized_here and dist.is_initialized()):
            return original(backend, *args, **kwargs)
        current = str(dist.get_backend())
        requested = backend if backend is not None else kwargs.get("backend")
        if requested is not None and str(requested).lower() not in current.lower():
            raise RuntimeError(
                f"init_process_group(backend={requested!r}): notebook-elastic already set up this worker's "
                f"process group with {current!r}, and a second rendezvous cannot be made safely; call "
                f"init_process_group() without a backend (or with {current!r}), or call it in the training "
                "cell itself so that the group is left to your code"
            )
        if not noted:
            noted = True
            print(_USER_INIT_NOTE.format(backend=current, world=dist.get_world_size()), file=sys.stderr)
        return None

    vars(init_process_group)["_notebook_elastic_adopts"] = True  # vars(): the function type declares no such attributes
    vars(init_process_group)["__wrapped__"] = original
    init_process_group.__doc__ = original.__doc__
    dist.init_process_group = init_process_group
    # `from torch.distributed import init_process_group` ran before run(): rebind those
    # names too (the script, local modules), never torch's own.
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if (
            isinstance(namespace, dict)
            and namespace.get("init_process_group") is original
            and not getattr(module, "__name__", "").startswith("torch")
        ):
            namespace["init_process_group"] = init_process_group


def caused_by_a_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is what a collective or the store raises when a peer went away, or
    the fence telling this group a newer one exists: a membership change, not a bug."""
    if isinstance(exc, StaleGenerationError):
        return True
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    network_error = getattr(dist, "DistNetworkError", None)
    if network_error is not None and isinstance(exc, network_error):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(p in text for p in protocol.PEER_LOST_PATTERNS)


def _preimport_in_background() -> None:
    """Creating the first optimizer imports torch._dynamo (~0.9 s here), on the restart's
    critical path; start that import now, while the main thread waits for its peers in
    init_process_group and reads the checkpoint."""
    if "torch" in sys.modules and "torch._dynamo" not in sys.modules:
        import threading

        def work() -> None:
            try:
                import torch._dynamo  # noqa: F401
            except Exception:
                _log.debug(
                    "torch._dynamo would not import: compiled models are not reset between groups", exc_info=True
                )

        threading.Thread(target=work, name="preimport-dynamo", daemon=True).start()


def _whole_lines() -> None:
    """torchrun runs workers with ``python -u``: print() then writes the text and the newline
    separately, and lines of ranks sharing a pipe interleave mid-line. Line buffering makes
    each line one write."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(line_buffering=True, write_through=False)
            except (ValueError, OSError):
                pass


def _shutdown_process_group() -> None:
    if not _initialized_here:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        # No rank leaves while a peer is still connecting to it: a short cell on ranks started
        # a moment apart finished on rank 0 while rank 1 was still inside gloo's full-mesh
        # connect, which then failed ("Connection closed by peer") and charged the budget.
        try:
            dist.barrier()
        except Exception:
            _log.debug("a peer gone at the very end: this rank's own work is done all the same", exc_info=True)
        dist.destroy_process_group()

"""``State`` at a worker group's start: rank 0 claims the group's generation and chooses the
latest readable checkpoint, the other ranks are told (no process group: each chooses for
itself), and every rank loads it into its objects, resharding a sharded model's shards.
``Collectives`` is how rank 0 tells the others, here and at each sharded commit. ``State``
holds one of each."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import protocol
from ..contract.event_types import CheckpointUnreadable, InPlace, Kind
from ..contract.event_types import Resumed as ResumedEvent
from . import sharded
from ._emit import emit
from .checkpoints import _meta_path, claim_generation, list_checkpoints, run_base
from .state_dicts import _load_into, forget_gradients
from .worker import WorkerInfo, device


class Collectives:
    """Rank 0's values on every rank over the default process group; without one (a single
    worker, or no group set up yet) each rank keeps its own. Every rank must make the same
    calls in the same order: each is a collective."""

    def __init__(self, info: WorkerInfo) -> None:
        self._info = info

    def dist(self) -> Any:
        """``torch.distributed`` when a process group of more than one rank is up, else None."""
        if self._info.world_size <= 1:
            return None
        try:
            import torch.distributed as dist
        except ImportError:
            return None
        return dist if dist.is_available() and dist.is_initialized() else None

    def _on(self, dist: Any) -> Any:
        """Where this group's collectives take their tensors: the GPU for NCCL, else the CPU."""
        import torch

        return device() if dist.get_backend() == "nccl" else torch.device("cpu")

    def broadcast(self, value: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``value`` on every rank. Not ``broadcast_object_list``: it needs numpy
        on the receiving side, which torch does not depend on (nor do we)."""
        dist = self.dist()
        if dist is None:
            return value
        import pickle

        import torch

        on = self._on(dist)
        sending = self._info.rank == src
        data = pickle.dumps(value) if sending else b""
        size = torch.tensor([len(data)], dtype=torch.long, device=on)
        dist.broadcast(size, src=src)
        if sending:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(on)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=on)
        dist.broadcast(buf, src=src)
        return pickle.loads(bytes(buf.cpu().tolist()))

    def all_reduce(self, values: list[int], op: str) -> list[int]:
        """``values`` reduced over every rank (``op``: "max", "min" or "sum"); as they are alone."""
        dist = self.dist()
        if dist is None:
            return list(values)
        import torch

        t = torch.tensor(values, dtype=torch.long, device=self._on(dist))
        dist.all_reduce(t, op={"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}[op])
        return [int(v) for v in t.tolist()]

    def broadcast_tree(self, tree: Any, src: int) -> Any:
        """Rank ``src``'s state tree (dicts, lists, tensors, plain values) on every rank: its
        shape in one pickle, its small tensors in one flat buffer per dtype (a few collectives,
        not one per tensor), each tensor of ``ALONE_BYTES`` or more in a collective of its own,
        received in place (no flat buffer to fill and copy out of: at 100M parameters with Adam,
        two copies of 1.2 GB on each side). Tensors arrive on the CPU; ``src`` gets its own
        back (CPU tensors: the same objects, not copies)."""
        dist = self.dist()
        if dist is None:
            return tree
        import torch

        sending = self._info.rank == src
        tensors: list[Any] = []
        shape = _strip(tree, tensors) if sending else None
        specs = [(tuple(t.shape), t.dtype) for t in tensors] if sending else None
        shape, specs = self.broadcast((shape, specs), src=src)
        on = self._on(dist)
        received: list[Any] = [None] * len(specs)
        alone = [i for i, (dims, dtype) in enumerate(specs) if torch.Size(dims).numel() * dtype.itemsize >= ALONE_BYTES]
        batched = set(range(len(specs))) - set(alone)
        for dtype in sorted({specs[i][1] for i in batched}, key=str):
            picks = [i for i in sorted(batched) if specs[i][1] == dtype]
            sizes = [int(torch.Size(specs[i][0]).numel()) for i in picks]
            if sending:
                flat = torch.cat([tensors[i].detach().reshape(-1).to(on) for i in picks])
            else:
                flat = torch.empty(sum(sizes), dtype=dtype, device=on)
            dist.broadcast(flat, src=src)
            flat = flat.cpu()
            offset = 0
            for i, n in zip(picks, sizes, strict=True):
                received[i] = flat[offset : offset + n].view(specs[i][0]).clone()
                offset += n
        for i in alone:
            if sending:
                buf = tensors[i].detach().to(on).contiguous()
            else:
                buf = torch.empty(specs[i][0], dtype=specs[i][1], device=on)
            dist.broadcast(buf, src=src)
            received[i] = buf.cpu()
        return _fill(shape, received)

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank, in one small tensor (each sharded commit's verdict)."""
        dist = self.dist()
        if dist is None:
            return value
        import torch

        on = device() if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([value], dtype=torch.long, device=on)
        dist.broadcast(t, src=0)
        return int(t.item())

    def broadcast_text(self, text: str) -> str:
        """Rank 0's ``text`` on every rank (a collective, as ``broadcast_int``)."""
        dist = self.dist()
        if dist is None:
            return text
        box = [text]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])

    def group_for_saves(self, async_commit: bool) -> Any:
        """A gloo group for async sharded saves: their collectives run in a background thread
        and must not interleave with the training loop's on the default group. None (saves
        stay synchronous) without a process group or without ``async_commit``."""
        dist = self.dist()
        if dist is None or not async_commit:
            return None
        return dist.new_group(backend="gloo")


#: A tensor this big or bigger goes in a broadcast of its own (``broadcast_tree``): a collective
#: more is nothing against copying it twice.
ALONE_BYTES = 1 << 20


class _Slot:
    """Where a tensor was in a tree sent by ``broadcast_tree``."""

    def __init__(self, index: int) -> None:
        self.index = index


def _strip(tree: Any, tensors: list[Any]) -> Any:
    """``tree`` with each tensor replaced by a ``_Slot`` (the tensor appended to ``tensors``)."""
    import torch

    if isinstance(tree, torch.Tensor):
        tensors.append(tree)
        return _Slot(len(tensors) - 1)
    if isinstance(tree, dict):
        return type(tree)((k, _strip(v, tensors)) for k, v in tree.items())
    if isinstance(tree, list):
        return [_strip(v, tensors) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_strip(v, tensors) for v in tree)
    return tree


def _tree_bytes(tree: Any) -> int:
    """The bytes of the tensors in a state tree."""
    tensors: list[Any] = []
    _strip(tree, tensors)
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


def _fill(shape: Any, tensors: list[Any]) -> Any:
    if isinstance(shape, _Slot):
        return tensors[shape.index]
    if isinstance(shape, dict):
        return type(shape)((k, _fill(v, tensors)) for k, v in shape.items())
    if isinstance(shape, list):
        return [_fill(v, tensors) for v in shape]
    if isinstance(shape, tuple):
        return tuple(_fill(v, tensors) for v in shape)
    return shape


@dataclass(frozen=True)
class Resumed:
    """Where a restored checkpoint puts the loop: ``State`` takes these on."""

    step: int  # the next step to run
    samples_seen: int  # the data cursor
    path: Path | None  # None: taken from the live ranks (in place), not a file
    extra: dict[str, Any]  # the plain values saved beside the objects
    save_s: float | None = None  # what a save blocked the loop that wrote it (the next group's estimate)


#: Why a group changed in place, as a number every rank can reduce (the largest wins where kept
#: ranks heard different ones: a loss over a join, a join over a store replaced).
_REASONS = ("", "store", "joined", "failed", "left", "lost")


class Restore:
    """Agreeing on the generation and restoring the latest checkpoint."""

    def __init__(self, info: WorkerInfo, folder: Path, collectives: Collectives) -> None:
        self._info = info
        self._folder = folder
        self._collectives = collectives

    def agree_on_generation(self) -> int:
        """This group's generation on every rank: rank 0 claims it in the folder (a collective)."""
        generation = self._info.generation
        if self._info.rank == 0:
            run = os.environ.get(protocol.ENV_RUN)
            if run and generation is not None:
                generation += run_base(self._folder, run)
            generation = claim_generation(self._folder, generation)
        elif generation is None:
            generation = -1
        return int(self._collectives.broadcast(generation))

    def latest(
        self,
        objects: dict[str, Any],
        *,
        sharded_model: bool,
        generation: int,
        map_location: Any,
        why: str | None = None,
    ) -> Resumed | None:
        """Load the latest readable checkpoint into ``objects`` (in place, on every rank; a
        collective); where it puts the loop, or None when there is none. ``why``: why a
        checkpoint rather than the live values (said in the ``resumed`` event)."""
        import torch

        is_writer = self._info.rank == 0
        chosen: str | None = None
        # Rank 0 chooses and tells the others (a stale group could add a file between two
        # ranks' listings); without a process group each rank chooses for itself.
        if is_writer or self._collectives.dist() is None:
            for _gen, _step, path in reversed(list_checkpoints(self._folder)):
                try:
                    if sharded.is_sharded_checkpoint(path) and not sharded.complete(path):
                        raise FileNotFoundError(f"{sharded.DCP_METADATA} or {sharded.META_FILE} missing")
                    torch.load(_meta_path(path), map_location="cpu", weights_only=False)
                except Exception as exc:  # a torn or foreign file: fall back to the previous one
                    emit(
                        Kind.CHECKPOINT_UNREADABLE,
                        **CheckpointUnreadable(path=str(path), error=f"{type(exc).__name__}: {exc}"[:300]),
                    )
                    continue
                chosen = str(path)
                break
        chosen = self._collectives.broadcast(chosen)
        if chosen is None:
            return None
        if map_location is None:
            map_location = device()
        payload = torch.load(_meta_path(Path(chosen)), map_location=map_location, weights_only=False)
        in_shards = payload.get("sharded", [])
        if in_shards:  # every rank reads its part of the shards, however many ranks wrote them
            sharded.load_into(objects.get("model"), objects.get("optimizer"), Path(chosen))
        elif sharded_model:
            raise RuntimeError(
                f"{chosen} holds an unsharded model's checkpoint; State cannot load it into a sharded "
                "(FSDP/DTensor) model: start the job with --fresh, or load it before sharding the model"
            )
        for name, obj in objects.items():
            if name in payload.get("objects", {}) and name not in in_shards:
                _load_into(obj, payload["objects"][name])
        resumed = Resumed(
            step=int(payload["step"]),
            samples_seen=int(payload.get("samples_seen", 0)),
            path=Path(chosen),
            extra=payload.get("extra", {}),
            save_s=payload.get("save_s") if isinstance(payload.get("save_s"), (int, float)) else None,
        )
        if is_writer:
            said = ResumedEvent(
                step=resumed.step,
                generation=generation,
                from_generation=int(payload.get("generation", -1)),
                from_world_size=payload.get("world_size"),
                world_size=self._info.world_size,
                samples_seen=resumed.samples_seen,
                path=chosen,
            )
            if why:
                said["why"] = why
            emit(Kind.RESUMED, **said)
        return resumed

    def from_live(self, machinery: Any, objects: dict[str, Any]) -> Resumed | None:
        """The values the live ranks hold (a group formed in place), loaded into ``objects`` on
        every rank (a collective): each rank's own when all stand at the same step, else those
        of the rank furthest ahead (a joiner has none; a rank whose step in flight was applied
        is ahead of one where it broke). None when no rank holds any (the job's first group):
        then a checkpoint, as at any start. Rank 0 says what happened (``in_place``)."""
        import time

        from .handoff import set_rng_state

        handoff = machinery.handoff
        switch = machinery.switch
        mine = handoff.next_step if handoff is not None else -1
        reached = handoff.reached if handoff is not None else -1
        elapsed_ms = int((time.monotonic() - switch.started) * 1000) if switch is not None and handoff else 0
        from_world = switch.from_world_size if switch is not None and handoff is not None else 0
        from_nodes = switch.from_nodes if switch is not None and handoff is not None else 0
        # Why, as a kept rank heard it (rank 0 may be a joiner's, which knows none).
        why = _REASONS.index(switch.reason) if switch is not None and switch.reason in _REASONS else 0
        heard = [from_world, why, from_nodes]
        best, neg_worst, most_reached, from_world, elapsed_ms, why, from_nodes = self._collectives.all_reduce(
            [mine, -mine, reached, from_world, elapsed_ms, why, from_nodes], "max"
        )
        if best < 0:
            return None
        worst = -neg_worst
        world = self._info.world_size
        source = -1
        transfer_s, transfer_bytes = 0.0, 0
        if worst == best:
            chosen = handoff  # every rank holds the same step: its own values, no transfer
        else:
            source = self._collectives.all_reduce([self._info.rank if mine == best else world], "min")[0]
            # What the change was, as the group that trained on heard it (the ranks at the best
            # step): a rank behind it was not in that group. A node cut off that comes back
            # kept its process and its old group's size, and heard that group break ("lost"):
            # told as it, the survivors' 1 -> 2 read "a node was lost: 2 -> 2".
            from_world, why, from_nodes = self._collectives.all_reduce(heard if mine == best else [0, 0, 0], "max")
            sent = None
            if self._info.rank == source and handoff is not None:
                sent = {"states": handoff.states, "extra": handoff.extra, "samples_seen": handoff.samples_seen}
            transfer_started = time.monotonic()
            got = self._collectives.broadcast_tree(sent, src=source)
            transfer_s = time.monotonic() - transfer_started
            transfer_bytes = _tree_bytes(got)
            chosen = handoff if mine == best else None
            if chosen is None:
                from .handoff import Handoff

                chosen = Handoff(got["states"], got["extra"], best, best, got["samples_seen"], {})
        assert chosen is not None
        for name, obj in objects.items():
            if name in chosen.states:
                _load_into(obj, chosen.states[name])
        forget_gradients(objects.values())
        if handoff is not None and handoff.rng:
            set_rng_state(handoff.rng)  # this process's own generators, as they were
        kept = self._collectives.all_reduce([1 if handoff is not None else 0], "sum")[0]
        machinery.handoff = None
        if self._info.rank == 0:
            took_s = elapsed_ms / 1000  # the longest any kept rank stood still (Switch.started)
            said = InPlace(
                round=int(os.environ.get(protocol.ENV_ROUND, -1)),
                from_world_size=from_world,
                world_size=world,
                step=best,
                redone=max(0, most_reached - best),
                kept=kept,
                joined=world - kept,
                source=source,
                took_s=round(took_s, 4),
                reason=_REASONS[why],
                from_nodes=from_nodes,
                nodes=int(os.environ.get("GROUP_WORLD_SIZE", 1)),
            )
            if source >= 0:
                said["transfer_s"], said["transfer_bytes"] = round(transfer_s, 4), transfer_bytes
            emit(Kind.IN_PLACE, **said)
        machinery.switch = None
        return Resumed(step=best, samples_seen=chosen.samples_seen, path=None, extra=dict(chosen.extra))

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

from . import protocol, sharded
from ._emit import emit
from .checkpoints import _meta_path, claim_generation, list_checkpoints, run_base
from .state_dicts import _load_into
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

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank. Not ``broadcast_object_list``: it needs numpy on
        the receiving side, which torch does not depend on (nor do we)."""
        dist = self.dist()
        if dist is None:
            return value
        import pickle

        import torch

        on = device() if dist.get_backend() == "nccl" else torch.device("cpu")
        is_writer = self._info.rank == 0
        data = pickle.dumps(value) if is_writer else b""
        size = torch.tensor([len(data)], dtype=torch.long, device=on)
        dist.broadcast(size, src=0)
        if is_writer:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(on)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=on)
        dist.broadcast(buf, src=0)
        return pickle.loads(bytes(buf.cpu().tolist()))

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


@dataclass(frozen=True)
class Resumed:
    """Where a restored checkpoint puts the loop: ``State`` takes these on."""

    step: int  # the next step to run
    samples_seen: int  # the data cursor
    path: Path
    extra: dict[str, Any]  # the plain values saved beside the objects
    save_s: float | None = None  # what a save blocked the loop that wrote it (the next group's estimate)


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
        self, objects: dict[str, Any], *, sharded_model: bool, generation: int, map_location: Any
    ) -> Resumed | None:
        """Load the latest readable checkpoint into ``objects`` (in place, on every rank; a
        collective); where it puts the loop, or None when there is none."""
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
                    emit("checkpoint_unreadable", path=str(path), error=f"{type(exc).__name__}: {exc}"[:300])
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
            emit(
                "resumed",
                step=resumed.step,
                generation=generation,
                from_generation=int(payload.get("generation", -1)),
                from_world_size=payload.get("world_size"),
                world_size=self._info.world_size,
                samples_seen=resumed.samples_seen,
                path=chosen,
            )
        return resumed

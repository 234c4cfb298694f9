"""``State`` at a worker group's start: rank 0 claims the group's generation and chooses the
latest readable checkpoint, the other ranks are told (no process group: each chooses for
itself), and every rank loads it into its objects, resharding a sharded model's shards.
Mixed into ``State``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import protocol, sharded
from ._emit import emit
from .checkpoints import _meta_path, claim_generation, list_checkpoints, run_base
from .state_dicts import _load_into
from .worker import device


class Restore:
    """Agreeing on the generation and restoring the latest checkpoint."""

    def _dist(self) -> Any:
        if self.info.world_size <= 1:
            return None
        try:
            import torch.distributed as dist
        except ImportError:
            return None
        return dist if dist.is_available() and dist.is_initialized() else None

    def _broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank. Not ``broadcast_object_list``: it needs numpy on
        the receiving side, which torch does not depend on (nor do we)."""
        dist = self._dist()
        if dist is None:
            return value
        import pickle

        import torch

        on = device() if dist.get_backend() == "nccl" else torch.device("cpu")
        data = pickle.dumps(value) if self.is_writer else b""
        size = torch.tensor([len(data)], dtype=torch.long, device=on)
        dist.broadcast(size, src=0)
        if self.is_writer:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(on)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=on)
        dist.broadcast(buf, src=0)
        return pickle.loads(bytes(buf.cpu().tolist()))

    def _agree_on_generation(self) -> int:
        generation = self.info.generation
        if self.is_writer:
            run = os.environ.get(protocol.ENV_RUN)
            if run and generation is not None:
                generation += run_base(self.folder, run)
            generation = claim_generation(self.folder, generation)
        elif generation is None:
            generation = -1
        return self._broadcast(generation)

    def _restore(self, map_location: Any) -> None:
        import torch

        chosen: str | None = None
        # Rank 0 chooses and tells the others (a stale group could add a file between two
        # ranks' listings); without a process group each rank chooses for itself.
        if self.is_writer or self._dist() is None:
            for _gen, _step, path in reversed(list_checkpoints(self.folder)):
                try:
                    if sharded.is_sharded_checkpoint(path) and not sharded.complete(path):
                        raise FileNotFoundError(f"{sharded.DCP_METADATA} or {sharded.META_FILE} missing")
                    payload = torch.load(_meta_path(path), map_location="cpu", weights_only=False)
                except Exception as exc:  # a torn or foreign file: fall back to the previous one
                    emit("checkpoint_unreadable", path=str(path), error=f"{type(exc).__name__}: {exc}"[:300])
                    continue
                chosen = str(path)
                break
        chosen = self._broadcast(chosen)
        if chosen is None:
            return
        if map_location is None:
            map_location = device()
        payload = torch.load(_meta_path(Path(chosen)), map_location=map_location, weights_only=False)
        in_shards = payload.get("sharded", [])
        if in_shards:  # every rank reads its part of the shards, however many ranks wrote them
            sharded.load_into(self._objects.get("model"), self._objects.get("optimizer"), Path(chosen))
        elif self._sharded:
            raise RuntimeError(
                f"{chosen} holds an unsharded model's checkpoint; State cannot load it into a sharded "
                "(FSDP/DTensor) model: start the job with --fresh, or load it before sharding the model"
            )
        for name, obj in self._objects.items():
            if name in payload.get("objects", {}) and name not in in_shards:
                _load_into(obj, payload["objects"][name])
        self.extra.update(payload.get("extra", {}))
        self.step = self._restored_step = int(payload["step"])
        self.samples_seen = self._restored_samples = int(payload.get("samples_seen", 0))
        self.resumed_from = Path(chosen)
        if self.is_writer:
            emit(
                "resumed",
                step=self.step,
                generation=self.generation,
                from_generation=int(payload.get("generation", -1)),
                from_world_size=payload.get("world_size"),
                world_size=self.info.world_size,
                samples_seen=self.samples_seen,
                path=chosen,
            )

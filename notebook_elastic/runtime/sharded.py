"""Sharded models (FSDP1, FSDP2 ``fully_shard``, DTensor) in checkpoints: torch.distributed.checkpoint.

A sharded model has no full state dict on rank 0, so ``State`` cannot save it the plain way.
Instead every rank writes its own shards with ``torch.distributed.checkpoint`` (DCP) into one
folder, and on load DCP reads whichever pieces of the saved tensors this rank's shards now
cover: a checkpoint written by 2 ranks loads into 1 or 4 (resharding on load). The state dicts
go through ``get_state_dict``/``set_state_dict`` (torch.distributed.checkpoint.state_dict), which
give the optimizer state keyed by parameter name, sharded like the parameters.

Worker-side module: imports torch lazily, nothing of ours above the runtime.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The file of a sharded checkpoint folder that holds what is not sharded (step, cursor,
#: extra values, other objects' state dicts); rank 0 writes it.
META_FILE = "state.pt"
#: DCP writes this last, once every rank's shards are written: its presence means complete.
DCP_METADATA = ".metadata"


def is_sharded(model: Any) -> bool:
    """Whether ``model`` holds sharded parameters: FSDP2 (``fully_shard``) or tensor-parallel
    DTensors, or an FSDP1 ``FullyShardedDataParallel`` anywhere in it."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return False
    DTensor: type[Any] | None  # None where this torch has none
    FullyShardedDataParallel: type[Any] | None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor has no FSDP2 either
        DTensor = None
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        FullyShardedDataParallel = None
    if FullyShardedDataParallel is not None and any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return True
    return DTensor is not None and any(isinstance(p, DTensor) for p in model.parameters())


def why_not_in_place(model_sharded: bool, objects: Any) -> str | None:
    """Why a State over ``objects`` cannot hand its values on in place: a rank holds only its
    shard of them, and one that goes takes it. A sharded model (FSDP, DTensor), or an optimizer
    that shards its state over the ranks (``ZeroRedundancyOptimizer``: its state_dict() is
    rank 0's consolidated copy or fails; an adversary's pass found a scale-down told as a
    failure, charged a restart and said false words). None where it can."""
    if model_sharded:
        return "the model is sharded (FSDP/DTensor): its shards are resharded from a checkpoint at a change"
    zero = next((type(o).__name__ for o in objects if type(o).__name__ == "ZeroRedundancyOptimizer"), None)
    if zero is not None:
        return (
            f"the optimizer's state is sharded over the ranks ({zero}): a rank that goes takes its shard, so "
            "the workers restart from the latest checkpoint at a change"
        )
    return None


def is_sharded_checkpoint(path: Path) -> bool:
    return path.suffix == ".dcp"


def complete(path: Path) -> bool:
    """A sharded checkpoint folder whose every part was written (DCP's metadata comes last)."""
    return (path / DCP_METADATA).is_file() and (path / META_FILE).is_file()


def state_dicts(model: Any, optimizer: Any) -> dict[str, Any]:
    """The model's (and the optimizer's) sharded state dicts, as DCP saves and loads them."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def save(tree: dict[str, Any], folder: Path, process_group: Any = None) -> None:
    """Write every rank's shards of ``tree`` into ``folder`` (collective: all ranks call it)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(tree, storage_writer=dcp.FileSystemWriter(os.fspath(folder)), process_group=process_group)


def async_save(tree: dict[str, Any], folder: Path, process_group: Any) -> Any:
    """``save`` after a copy to CPU memory, written by a background thread; a Future. None when
    this torch has no ``async_save`` (the caller then saves synchronously)."""
    import torch.distributed.checkpoint as dcp

    if not hasattr(dcp, "async_save"):
        return None
    result = dcp.async_save(tree, storage_writer=dcp.FileSystemWriter(os.fspath(folder)), process_group=process_group)
    return getattr(result, "upload_completion", result)  # newer torch: an AsyncSaveResponse


def load_into(model: Any, optimizer: Any, path: Path) -> None:
    """Load the sharded checkpoint at ``path`` into ``model`` (and ``optimizer``), resharded to
    how they are sharded now (collective: all ranks call it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    tree = state_dicts(model, optimizer)
    # FSDP1's ShardedTensors, flattened the default way, lose a rank's optimizer keys in torch
    # 2.13 ("Missing key in checkpoint state_dict: optimizer.param_groups" on rank 1); left
    # whole, DCP reshards them itself. DTensors (FSDP2, tensor parallel) are not affected.
    planner = dcp.DefaultLoadPlanner(flatten_sharded_tensors=False)
    dcp.load(tree, storage_reader=dcp.FileSystemReader(os.fspath(path)), planner=planner)
    if optimizer is None:
        set_model_state_dict(model, tree["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=tree["model"], optim_state_dict=tree["optimizer"])


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind a DCP failure (it gathers every rank's exceptions into one), if any."""
    if isinstance(exc, OSError):
        return exc
    for failure in getattr(exc, "failures", {}).values():
        found = os_error_in(failure) if isinstance(failure, BaseException) else None
        if found is not None:
            return found
    cause = exc.__cause__ or exc.__context__
    return os_error_in(cause) if cause is not None else None

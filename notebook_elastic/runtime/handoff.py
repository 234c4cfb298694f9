"""What a ``State`` hands to the next one in the same process when the group changes in place
(runtime/inplace.py): its objects' states, its plain values, where its loop stands, and the
process's random generators.

Worker-side module: the standard library, and torch.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Handoff:
    """What a ``State`` leaves to the next one in the same process when the group changes in
    place: its objects' states (references to the live tensors; on a GPU, copies in host
    memory, so the cell's new objects find room), its plain values, where its loop stands, and
    this process's random generators."""

    states: dict[str, Any]
    extra: dict[str, Any]
    next_step: int  # the first step not applied here
    reached: int  # the step after the one in flight when the change came (next_step at a boundary)
    samples_seen: int
    rng: dict[str, Any]
    # Saves it (on the rank that writes for the group that ended): its node goes before any
    # next State took it (runtime/writer.py save_handed_on).
    save: Callable[[Handoff], None] | None = None

    def save_if_writer(self) -> None:
        """Save it, on the rank that writes for the group that ended (elsewhere nothing)."""
        if self.save is not None:
            self.save(self)


def to_host(value: Any) -> Any:
    """A state dict with every CUDA tensor copied to host memory (CPU tensors as they are)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu") if value.is_cuda else value.detach()
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_host(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_host(v) for v in value)
    return value


def rng_state() -> dict[str, Any]:
    """This process's random generators (torch, CUDA, Python's, NumPy's when imported)."""
    import sys

    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # torch's own, untyped
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import sys

    import torch

    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy = sys.modules.get("numpy")
    if "numpy" in state and numpy is not None:
        numpy.random.set_state(state["numpy"])

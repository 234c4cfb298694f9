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
    # Saves it (runtime/writer.py save_handed_on): its node goes before any next State took
    # it; on the rank that writes for the group that ended (``writes``), or, where the group broke
    # and its writer may be the one lost, on the survivor chosen (``save_if_chosen``). None where
    # the values are sharded (no rank holds them all).
    save: Callable[[Handoff], None] | None = None
    writes: bool = False  # this rank wrote for the group that ended
    # Why these values are no step's (``Updates.partly``): the group broke between two of a
    # step's optimizer updates. Neither kept nor saved: the workers restart from the last save.
    partly: str | None = None
    updates_per_step: int | None = None  # what the State learned (``Updates``), for the next

    def save_if_writer(self) -> None:
        """Save it, on the rank that writes for the group that ended (elsewhere nothing)."""
        if self.save is not None and self.partly is None and self.writes:
            self.save(self)

    def save_if_chosen(self, chosen: Callable[[], bool]) -> None:
        """Save it where ``chosen()`` picks this rank: one survivor of a group that broke as its
        nodes went, whether or not the group's writer was the member lost (every survivor holds
        the same values: the step in flight did not apply anywhere)."""
        if self.save is not None and self.partly is None and chosen():
            self.save(self)


class Updates:
    """The optimizer updates of a State's steps (its optimizers' post-step hooks): which step
    was updated last, and how many updates a step makes (a step may be several micro-batches,
    each with its optimizer step, or an epoch of batches). A group that broke between two of a
    step's updates leaves values that are no step's: redoing the step applies its first updates
    twice, skipping its rest drops them (an adversary's pass: a lost node skipped half of a
    step and said 0 steps redone). ``per_step`` goes on in the next State (``Handoff``)."""

    def __init__(self, handoff: Handoff | None = None) -> None:
        self.step: int | None = None  # the step whose update was applied here last
        self.count = 0  # ... and how many of its updates
        self.per_step = handoff.updates_per_step if handoff is not None else None  # in the last step that ended

    def applied(self, current: int | None) -> None:
        if self.step != current:
            self.step, self.count = current, 0
        self.count += 1

    def step_ended(self, step: int | None) -> None:
        """``step`` ran to its end (the loop goes on to the next one)."""
        if step is not None and self.step == step and self.count:
            self.per_step = self.count

    def partly(self, current: int | None) -> str | None:
        """Why the values are no step's, where step ``current`` (in flight) got some of its
        updates but not all those its steps make; else None."""
        most = self.per_step
        if current is None or self.step != current or not most or self.count >= most:
            return None
        return (
            f"step {current} was partly applied ({self.count} of its {most} optimizer updates) when the "
            "group broke: redoing it would apply those twice and skipping the rest would drop them, so "
            "the workers restart from the latest checkpoint"
        )


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

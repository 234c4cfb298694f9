"""What ``State`` saves of each object: the state dict of the module a wrapper trains
(DDP, ``torch.compile``), loaded back whatever wrapper saved it, and CPU copies of it for a
background write that reuse the previous copy's buffers."""

from __future__ import annotations

from typing import Any

#: Prefixes a wrapper adds to its module's state-dict keys: ``torch.compile``'s
#: OptimizedModule (``_orig_mod.``) and DDP (``module.``), as a checkpoint saved from the
#: wrapper itself (``compiled.state_dict()``) has them.
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def _state_dict_owner(obj: Any) -> Any:
    """The module a wrapper trains: DDP/DataParallel keep it in ``.module``, a
    ``torch.compile``d one in ``._orig_mod`` (in any nesting). Its state dict has the plain
    names, so a checkpoint of a compiled model loads into an uncompiled one and back."""
    while True:
        name = type(obj).__name__
        if name in {"DistributedDataParallel", "DataParallel"} and getattr(obj, "module", None) is not None:
            obj = obj.module
        elif name == "OptimizedModule" and getattr(obj, "_orig_mod", None) is not None:
            obj = obj._orig_mod
        else:
            return obj


def _load_into(obj: Any, saved: Any) -> None:
    """``load_state_dict`` on the unwrapped object, with what wrappers did to a saved state
    undone: keys saved from a compiled or DDP module lose their prefix, and a GradScaler's
    empty state (saved where it was disabled, e.g. a CPU run of ``GradScaler(enabled=cuda)``)
    leaves an enabled scaler at its initial scale instead of failing the restore."""
    owner = _state_dict_owner(obj)
    if isinstance(saved, dict) and saved and hasattr(owner, "named_parameters"):
        expected = set(owner.state_dict())
        plain = saved
        for prefix in _WRAPPER_PREFIXES:  # only when the keys do not fit as they are
            if set(plain) != expected and all(isinstance(k, str) and k.startswith(prefix) for k in plain):
                plain = type(plain)((k[len(prefix) :], v) for k, v in plain.items())
        if set(plain) == expected:
            saved = plain
    if isinstance(saved, dict) and not saved and type(owner).__name__ == "GradScaler":
        return
    owner.load_state_dict(saved)


class _Snapshotter:
    """Copies a state tree to CPU tensors, reusing the buffers of the previous copy."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], Any] = {}

    def copy(self, tree: Any, path: tuple[Any, ...] = ()) -> Any:
        import torch

        if isinstance(tree, torch.Tensor):
            buf = self._buffers.get(path)
            if buf is None or buf.shape != tree.shape or buf.dtype != tree.dtype:
                buf = torch.empty(tree.shape, dtype=tree.dtype, device="cpu")
                self._buffers[path] = buf
            buf.copy_(tree.detach())
            return buf
        if isinstance(tree, dict):
            return {k: self.copy(v, path + (k,)) for k, v in tree.items()}
        if isinstance(tree, (list, tuple)):
            copied = [self.copy(v, path + (i,)) for i, v in enumerate(tree)]
            return copied if isinstance(tree, list) else tuple(copied)
        return tree


def forget_gradients(objects: Any) -> None:
    """No parameter of ``objects`` keeps a gradient, as after a restart: a model or optimizer
    kept across a change in place (one the notebook holds, not made again by the cell) kept the
    gradients the broken step had accumulated, added into the step redone (an adversary's pass:
    a gradient-accumulation cell applied part of a step twice)."""
    for obj in objects:
        owner = _state_dict_owner(obj)
        if hasattr(owner, "parameters") and callable(owner.parameters):
            params = list(owner.parameters())
        else:
            params = [p for group in getattr(owner, "param_groups", ()) for p in group.get("params", ())]
        for param in params:
            if getattr(param, "grad", None) is not None:
                param.grad = None

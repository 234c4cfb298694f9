"""Data values a cell reads from the notebook, pickled for the payload.

Each value is pickled on its own (cloudpickle), with the notebook's own classes and
functions inside it travelling as references to the script's definitions; values that hold
the same objects are pickled together, so they still share them in the worker. What cannot
be copied into another process (an open file, a lock, a CUDA tensor) is refused with the
reason in the user's words. Held by ``collect.Collector``, which queues the values to pickle.
"""

from __future__ import annotations

import inspect
import io
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

from ..runtime.payload import main_attr
from .shipped import Shipped


class _Unshippable(Exception):
    pass


def type_name(value: Any) -> str:
    t = type(value)
    name = t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"
    try:
        import torch

        if isinstance(value, torch.Tensor):
            shape = "x".join(str(d) for d in value.shape) or "scalar"
            return f"Tensor[{str(value.dtype).replace('torch.', '')}, {shape}]"
    except ImportError:
        pass
    if isinstance(value, (list, tuple, dict, set)):
        return f"{t.__name__} of {len(value)}"
    return name


_LOCK_TYPES = tuple({type(threading.Lock()), type(threading.RLock())})


def unshippable_reason(value: Any) -> str | None:
    """Why a value cannot be copied into another process, in the user's words (or None)."""
    if isinstance(value, io.IOBase):
        return "an open file: its handle belongs to this kernel; open the file inside the training cell instead"
    if isinstance(value, socket.socket):
        return "a network socket: connections cannot be copied; connect inside the training cell instead"
    if isinstance(value, _LOCK_TYPES) or isinstance(value, (threading.Condition, threading.Semaphore, threading.Event)):
        return (
            "a lock: synchronization objects belong to this kernel's threads; make it inside the training cell instead"
        )
    if isinstance(value, threading.Thread):
        return "a thread of this kernel; start it inside the training cell instead"
    if inspect.isgenerator(value) or inspect.iscoroutine(value) or inspect.isasyncgen(value):
        return "a generator: its paused state cannot be copied; create it inside the training cell instead"
    if isinstance(value, subprocess.Popen):
        return "a running subprocess of this kernel; start it inside the training cell instead"
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return "a CUDA tensor: it lives in this kernel's GPU memory; move it to the CPU with .cpu() or create it in the cell"
        if isinstance(value, torch.nn.Module) and any(p.is_cuda for p in value.parameters()):
            return "a model on the GPU: its weights live in this kernel's GPU memory; move it with .cpu() or build it in the cell"
    return None


def cannot_ship(name: str, value: Any, origin: str | None, reason: str) -> str:
    place = f", defined in {origin}," if origin else ""
    return f"`{name}` ({type(value).__name__}){place} cannot be shipped to the workers: {reason}"


class _PayloadPickler(cloudpickle.Pickler):  # type: ignore[misc]  # Pickler is Any: cloudpickle is untyped
    def __init__(
        self, file: io.BytesIO, reference_for: Callable[[Any], str | None], refs: set[str], modules: set[str]
    ) -> None:
        super().__init__(file, protocol=5)
        self._reference_for = reference_for
        self._refs = refs
        self._modules = modules  # what unpickling will import: the notebook's own modules must ship
        self._torch = sys.modules.get("torch")

    def reducer_override(self, obj: Any) -> Any:
        owner = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
        if not isinstance(owner, str):
            owner = type(obj).__module__
        self._modules.add(owner)
        torch = self._torch
        if torch is not None and isinstance(obj, torch.Tensor) and obj.is_cuda:
            raise _Unshippable(
                "it holds a CUDA tensor, which lives in this kernel's GPU memory; move it to the CPU with .cpu() first"
            )
        if isinstance(obj, (type, types.FunctionType)):
            name = self._reference_for(obj)
            if name is not None:
                self._refs.add(name)
                return main_attr, (name,)
        reason = None
        if isinstance(obj, (io.IOBase, socket.socket, threading.Thread)) or inspect.isgenerator(obj):
            reason = unshippable_reason(obj)
        if reason:
            raise _Unshippable(f"it contains {reason.split(':')[0]}")
        return super().reducer_override(obj)


_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), tuple, frozenset, range, type, types.ModuleType)


def _mutable(obj: Any) -> bool:
    """Objects two values can share and mutate through each other (not strings, classes, functions)."""
    return not isinstance(
        obj, (*_IMMUTABLE, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)
    )


class ValueShipper:
    """The pickling half of ``collect.Collector``: the collector resolves names and queues
    values; this pickles them and groups those that share objects. The values' items are the
    collector's own (``items``, shared with the other shippers); a value that cannot be pickled
    is taken out of them and said in ``problems``. ``reference_for`` names the script's
    definition of a notebook class or function met inside a value (the definition shipper's)."""

    def __init__(
        self,
        namespace: Mapping[str, Any],
        *,
        items: dict[str, Shipped],
        problems: list[str],
        reference_for: Callable[[Any], str | None],
    ) -> None:
        self._ns = namespace
        self._items = items
        self._problems = problems
        self._reference_for = reference_for
        self._holds: dict[str, dict[int, Any]] = {}  # value name -> the mutable objects it pickled, by id
        self.shared: dict[str, bytes] = {}  # KEY -> values pickled together
        self.payload_modules: set[str] = set()  # what unpickling the payload will import

    def pickle(self, name: str) -> None:
        item = self._items[name]
        value = self._ns[name]
        buf = io.BytesIO()
        refs: set[str] = set()
        pickler = _PayloadPickler(buf, self._reference_for, refs, self.payload_modules)
        try:
            pickler.dump(value)
        except _Unshippable as exc:
            del self._items[name]
            self._problems.append(cannot_ship(name, value, item.origin, str(exc)))
            return
        except Exception as exc:
            del self._items[name]
            reason = f"it cannot be pickled ({type(exc).__name__}: {str(exc)[:200]})"
            self._problems.append(cannot_ship(name, value, item.origin, reason))
            return
        item.blob = buf.getvalue()
        item.size = len(item.blob)
        item.late = bool(refs - {name})
        # Kept alive until grouping, so that the ids of the pickler's temporaries stay unique.
        self._holds[name] = {key: obj for key, (_index, obj) in pickler.memo.copy().items() if _mutable(obj)}

    def ship_shared_together(self) -> None:
        """Values that hold the same objects are pickled together, so they still do in the
        worker: an optimizer built in the notebook over ``model.parameters()`` must step the
        shipped model's parameters, not copies of them (each pickled on its own, they part)."""
        names = [n for n in self._holds if n in self._items and self._items[n].blob is not None]
        parent = {n: n for n in names}

        def root(n: str) -> str:
            while parent[n] != n:
                parent[n] = parent[parent[n]]
                n = parent[n]
            return n

        owner: dict[int, str] = {}
        for name in names:
            for object_id in self._holds[name]:
                other = owner.setdefault(object_id, name)
                if other != name:
                    parent[root(name)] = root(other)
        groups: dict[str, list[str]] = {}
        for name in names:
            groups.setdefault(root(name), []).append(name)
        for members in groups.values():
            if len(members) < 2:
                continue
            members.sort(key=lambda n: self._items[n].order)
            key = "shared:" + ",".join(members)
            buf = io.BytesIO()
            refs: set[str] = set()
            try:
                _PayloadPickler(buf, self._reference_for, refs, self.payload_modules).dump(
                    {n: self._ns[n] for n in members}
                )
            except Exception as exc:  # each pickled alone just now; together is no different
                self._problems.append(f"{', '.join(members)} cannot be pickled together ({type(exc).__name__}: {exc})")
                return
            self.shared[key] = buf.getvalue()
            late = any(self._items[n].late for n in members) or bool(refs - set(members))
            for i, name in enumerate(members):
                item = self._items[name]
                item.blob = ("shared", key)
                item.size = len(self.shared[key]) if i == 0 else 0
                item.late = late  # one unpickling serves them all: after the definitions if any needs it
                others = ", ".join(f"`{m}`" for m in members if m != name)
                item.note = f"{item.type_name}, shipped with {others} (they share objects)"

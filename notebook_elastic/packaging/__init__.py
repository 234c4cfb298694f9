"""Packaging: a notebook cell becomes a readable, standalone torchrun script.

``package_cell(cell, ctx)`` returns a ``Bundle``: ``script`` (readable Python), ``payload``
(the data values, pickled) and ``manifest`` (what was shipped from where, how big, what was
withheld). Nothing is launched here; every refusal is a ``PackagingError`` raised before
anything starts.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from ..errors import PackagingError
from ..runtime.payload import payload_path_for
from .collect import Collection, Collector, Shipped, looks_like_credential
from .notebook import NotebookContext
from .render import human_bytes, payload_checksum, render_script

__all__ = [
    "Bundle",
    "Manifest",
    "NotebookContext",
    "PackagingError",
    "looks_like_credential",
    "package_cell",
    "package_function",
]


@dataclass
class Manifest:
    """What went into a bundle, for people (``format()``) and programs (``to_json()``)."""

    name: str
    created: str
    notebook: str | None
    items: list[Shipped]
    warnings: list[str] = field(default_factory=list)
    script_bytes: int = 0

    @property
    def payload_bytes(self) -> int:
        return sum(i.size for i in self.items if i.kind in ("value", "function-by-value"))

    @property
    def withheld(self) -> list[str]:
        return [i.name for i in self.items if i.kind == "withheld"]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "created": self.created,
            "notebook": self.notebook,
            "items": [i.to_json() for i in self.items],
            "withheld": self.withheld,
            "warnings": self.warnings,
            "payload_bytes": self.payload_bytes,
            "script_bytes": self.script_bytes,
            "environment_variables": "never shipped",
        }

    def format(self) -> str:
        rows = [("name", "shipped as", "from", "size", "what")]
        order = {"import": 0, "class": 1, "function": 2, "alias": 3, "value": 4, "function-by-value": 5, "withheld": 6}
        for item in sorted(self.items, key=lambda i: (order.get(i.kind, 9), i.order, i.name)):
            size = human_bytes(item.size) if item.kind in ("value", "function-by-value") else ""
            what = item.note or (item.code if item.kind == "import" else item.type_name)
            rows.append((item.name, item.kind, item.origin or "", size, what or ""))
        widths = [max(len(r[c]) for r in rows) for c in range(4)]
        lines = [f"Manifest of job {self.name!r}" + (f" (from {self.notebook})" if self.notebook else "")]
        for row in rows:
            lines.append("  " + "  ".join(row[c].ljust(widths[c]) for c in range(4)) + "  " + row[4])
        counts = {k: sum(1 for i in self.items if i.kind == k) for k in order}
        lines.append(
            f"  = {counts['import']} imports, {counts['function'] + counts['class']} definitions, "
            f"{counts['value'] + counts['function-by-value']} values in the payload "
            f"({human_bytes(self.payload_bytes)}), script {human_bytes(self.script_bytes)}"
        )
        if self.withheld:
            lines.append(f"  withheld (look like credentials): {', '.join(self.withheld)}")
        lines.append("  environment variables: never shipped")
        lines.extend(f"  warning: {w}" for w in self.warnings)
        return "\n".join(lines)


@dataclass
class Bundle:
    name: str
    script: str
    payload: bytes
    manifest: Manifest

    @property
    def withheld(self) -> list[str]:
        return self.manifest.withheld

    def write(self, script_path: str | os.PathLike, private: bool = False) -> tuple[Path, Path | None]:
        """Write the script (and its payload beside it, if any) atomically; ``private``: readable
        by their owner only (a job folder), else like any exported file."""
        script_path = Path(script_path)
        script_path.parent.mkdir(parents=True, exist_ok=True)
        payload_path = payload_path_for(script_path) if self.payload else None
        if payload_path is not None:
            _atomic_write(payload_path, self.payload, mode=0o600 if private else 0o644)
        _atomic_write(script_path, self.script.encode(), mode=0o700 if private else 0o755)
        return script_path, payload_path


def _atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _check_size(collection: Collection, limit: int) -> None:
    values = [i for i in collection.items.values() if i.kind in ("value", "function-by-value")]
    total = sum(i.size for i in values)
    if total <= limit:
        return
    biggest = sorted(values, key=lambda i: -i.size)[:3]
    named = ", ".join(f"`{i.name}` ({human_bytes(i.size)}{', ' + i.origin if i.origin else ''})" for i in biggest)
    raise PackagingError(
        f"the payload is {human_bytes(total)}, over the {human_bytes(limit)} limit; the biggest values are "
        f"{named}: load large data inside the training cell (from a file or dataset) or raise the limit "
        "with --max-payload"
    )


def package_cell(
    cell: str,
    ctx: NotebookContext,
    *,
    name: str = "job",
    ship: Iterable[str] = (),
    max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES,
    nproc_per_node: int = 1,
    extra_import_paths: Iterable[str] = (),
    check_imports: bool = True,
    script_name: str = "script.py",
) -> Bundle:
    """Package ``cell`` with what it needs from the notebook ``ctx``. Launches nothing."""
    collector = Collector(ctx, ship=ship, extra_import_paths=extra_import_paths, check_imports=check_imports)
    collection = collector.collect(cell)
    _check_size(collection, max_payload_bytes)
    shipped = [i for i in collection.items.values() if i.kind in ("value", "function-by-value")]
    payload = pickle.dumps({i.name: i.blob for i in shipped}, protocol=5) if shipped else b""
    created = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    script = render_script(
        collection,
        payload_sha256=payload_checksum(payload) if payload else None,
        title=name,
        run_hint=f"torchrun --nproc-per-node {nproc_per_node} {script_name}",
        created=created,
        notebook=ctx.notebook,
        init_process_group="init_process_group" not in cell,
    )
    for unused in sorted(set(ship) - set(collection.items)):
        collection.warnings.append(f"--ship {unused}: the cell does not use `{unused}`; nothing to ship")
    manifest = Manifest(
        name=name,
        created=created,
        notebook=ctx.notebook,
        items=list(collection.items.values()),
        warnings=collection.warnings,
        script_bytes=len(script.encode()),
    )
    return Bundle(name=name, script=script, payload=payload, manifest=manifest)


def package_function(fn: Callable[[], Any], ctx: NotebookContext | None = None, **kwargs: Any) -> Bundle:
    """Package a zero-argument function as the training code (``launch(train)``)."""
    if not callable(fn):
        raise PackagingError(f"launch() takes a cell's code (str) or a function, not {type(fn).__name__}")
    namespace = dict(getattr(fn, "__globals__", {}))
    if ctx is not None:
        namespace = dict(ctx.namespace)
    name = getattr(fn, "__name__", "")
    if not name.isidentifier() or namespace.get(name) is not fn:
        name = "_training_function"
    namespace[name] = fn
    base = ctx or NotebookContext.from_globals(getattr(fn, "__globals__", {}))
    ctx = NotebookContext(
        namespace=namespace,
        cells=base.cells,
        cell_of_file=base.cell_of_file,
        hidden=base.hidden,
        notebook=base.notebook,
        cwd=base.cwd,
    )
    return package_cell(f"{name}()", ctx, **kwargs)

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
from .analysis import imported_modules
from .collect import Collection, Collector, Shipped
from .credentials import looks_like_credential
from .files import relative_reads, relative_writes
from .modules import check_size, local_files, local_modules
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
        order = {
            "import": 0,
            "module": 1,
            "class": 2,
            "function": 3,
            "alias": 4,
            "value": 5,
            "function-by-value": 6,
            "file": 7,
            "withheld": 8,
        }
        for item in sorted(self.items, key=lambda i: (order.get(i.kind, 9), i.order, i.name)):
            size = human_bytes(item.size) if item.kind in ("value", "function-by-value", "module", "file") else ""
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
            + (
                f", {counts['module']} of the notebook's own modules "
                f"({human_bytes(sum(i.size for i in self.items if i.kind == 'module'))})"
                if counts["module"]
                else ""
            )
            + (f", {counts['file']} files it reads by a relative name" if counts["file"] else "")
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
    modules: dict[str, bytes] = field(default_factory=dict)  # the notebook's own .py files, by relative path
    workdir_files: dict[str, bytes] = field(default_factory=dict)  # files the code reads by a relative name
    launch_warnings: list[str] = field(default_factory=list)  # said when the job starts, not only in a dry run

    @property
    def withheld(self) -> list[str]:
        return self.manifest.withheld

    def write(self, script_path: str | os.PathLike[str], private: bool = False) -> tuple[Path, Path | None]:
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


#: Arguments of init_process_group() that ask for another group than torchrun's (env://): a
#: call with one is left to make its own.
_OWN_RENDEZVOUS = frozenset({"init_method", "store"})


def own_group_setup(collection: Collection) -> str | None:
    """How ``run`` treats the training code's own ``init_process_group()`` calls (the PyTorch
    tutorials' ``ddp_setup()``) that the cell or a definition shipped by source makes: ``""``
    where there is none, or each can use the group ``run`` sets up (its backend unnamed, or
    ``"gloo"``/``"nccl"``... named: ``run`` sets the group up with it), so a change keeps the
    workers in place; None where the code must make its own (a backend from a variable, its
    own ``init_method`` or ``store``; a source that does not parse): ``run`` leaves it to the
    code, and its workers restart at a change (said in the timeline)."""
    import ast

    shipped = [i.code or "" for i in collection.items.values() if i.kind in ("function", "class")]
    named: set[str] = set()
    for code in (collection.cell, *shipped):
        if "init_process_group" not in code:
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called != "init_process_group":
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            backend = node.args[0] if node.args else keywords.get("backend")
            if None in keywords or _OWN_RENDEZVOUS & set(keywords) or len(node.args) > 1:
                return None
            if backend is not None:
                if not (isinstance(backend, ast.Constant) and isinstance(backend.value, str)):
                    return None
                named.add(backend.value)
    if len(named) > 1:
        return None
    return named.pop() if named else ""


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
    ship_local_modules: bool = False,
    pod_workdir: str | None = None,
    first_line: int = 1,
) -> Bundle:
    """Package ``cell`` with what it needs from the notebook ``ctx``. Launches nothing.

    ``ship_local_modules``: carry the notebook folder's own modules the code imports (for
    workers that never saw the folder). ``pod_workdir``: where relative paths land on such
    workers; each relative write the code makes is named in a warning. ``first_line``: the
    line the editor numbers the code's first line (2 in a cell under ``%%elastic_train``): the
    lines messages name are the editor's."""
    collector = Collector(
        ctx, ship=ship, extra_import_paths=extra_import_paths, check_imports=check_imports, first_line=first_line
    )
    collection = collector.collect(cell)
    _check_size(collection, max_payload_bytes)
    shipped = [i for i in collection.items.values() if i.kind in ("value", "function-by-value")]
    entries: dict[str, Any] = {i.name: i.blob for i in shipped}
    entries.update(collection.shared)
    payload = pickle.dumps(entries, protocol=5) if shipped else b""
    created = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    script = render_script(
        collection,
        payload_sha256=payload_checksum(payload) if payload else None,
        title=name,
        run_hint=f"torchrun --nproc-per-node {nproc_per_node} {script_name}",
        created=created,
        notebook=ctx.notebook,
        own_group=own_group_setup(collection),
    )
    for unused in sorted(set(ship) - set(collection.items)):
        collection.warnings.append(f"--ship {unused}: the cell does not use `{unused}`; nothing to ship")
    modules: dict[str, bytes] = {}
    workdir_files: dict[str, bytes] = {}
    if ship_local_modules:
        found = local_modules(_modules_used(collection), ctx.cwd)
        modules = found.files
        for top, files in found.modules.items():
            paths = sorted(files)
            collection.items[top] = Shipped(
                top,
                "module",
                origin="notebook folder",
                size=sum(len(d) for d in files.values()),
                order=(-1, 0),
                note=paths[0] if len(paths) == 1 else f"{top}/ ({len(paths)} files)",
            )
        reads = set(relative_reads(collection.cell))
        for item in collection.items.values():
            if item.kind in ("function", "class") and item.code:
                reads.update(relative_reads(item.code))
        workdir_files = local_files(reads, ctx.cwd)
        check_size(
            {**modules, **workdir_files}, "the notebook's own files the job carries (modules and files it reads)"
        )
        for path, data in sorted(workdir_files.items()):
            collection.items[f"file:{path}"] = Shipped(
                path, "file", origin="notebook folder", size=len(data), order=(-1, 1), note="read by a relative name"
            )
    launch_warnings = _relative_write_warnings(collection, pod_workdir, first_line) if pod_workdir else []
    collection.warnings.extend(launch_warnings)
    manifest = Manifest(
        name=name,
        created=created,
        notebook=ctx.notebook,
        items=list(collection.items.values()),
        warnings=collection.warnings,
        script_bytes=len(script.encode()),
    )
    return Bundle(
        name=name,
        script=script,
        payload=payload,
        manifest=manifest,
        modules=modules,
        workdir_files=workdir_files,
        launch_warnings=launch_warnings,
    )


def _modules_used(collection: Collection) -> set[str]:
    """Every module the worker will import for this code: the script's import statements, the
    imports inside the cell and the shipped definitions, and what the payload refers to."""
    names = set(collection.payload_modules)
    for item in collection.items.values():
        if item.kind in ("import", "function", "class") and item.code:
            names |= imported_modules(item.code)
    return names | imported_modules(collection.cell)


def _relative_write_warnings(collection: Collection, workdir: str, first_line: int = 1) -> list[str]:
    # (where, source, the line of its first line in its cell): lines are told as the notebook shows them
    sources = [("the cell", collection.cell, first_line)] + [
        (f"{i.kind} `{i.name}`" + (f" ({i.origin})" if i.origin else ""), i.code or "", i.order[1] or 1)
        for i in sorted(collection.items.values(), key=lambda i: i.order)
        if i.kind in ("function", "class")
    ]
    warnings = []
    for where, source, first in sources:
        for line, what in relative_writes(source):
            line += first - 1
            warnings.append(
                f"{where}, line {line}: {what} writes to a relative path, in the pod's working directory "
                f"({workdir}), which vanishes with the pod: write it under the checkpoint volume "
                "(--pvc; its path is $NOTEBOOK_ELASTIC_CHECKPOINT_DIR) or use an absolute path on a mounted volume"
            )
    return warnings


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

"""The notebook's own files: modules and packages beside the notebook that the code imports,
and files it reads by a relative name.

Locally the workers start in the notebook's folder with it on their path, so nothing needs
shipping. A Kubernetes pod never saw that folder: the modules the training code imports
(the cell, the definitions shipped with it, the values in the payload), and the local
modules those import in turn, travel with the job as files, within a size limit, leaving
out what the folder's ``.gitignore`` ignores.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PackagingError
from .analysis import imported_modules
from .render import human_bytes

MAX_MODULES_BYTES = 512 * 1024  # half a ConfigMap: the script, payload and runtime need the rest


@dataclass
class LocalModules:
    """Top-level module names -> their files (path relative to the folder -> bytes)."""

    folder: str
    modules: dict[str, dict[str, bytes]] = field(default_factory=dict)

    @property
    def files(self) -> dict[str, bytes]:
        return {path: data for files in self.modules.values() for path, data in files.items()}

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.files.values())


def _source_of(folder: Path, top: str) -> list[Path] | None:
    """The files of module ``top`` if it lives in ``folder`` (None if it does not)."""
    single = folder / f"{top}.py"
    if single.is_file():
        return [single]
    package = folder / top
    if package.is_dir() and ((package / "__init__.py").is_file() or any(package.glob("*.py"))):
        return sorted(
            p
            for p in package.rglob("*.py")
            if "__pycache__" not in p.parts and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        )
    return None


def _gitignored(folder: Path, paths: list[Path]) -> set[Path]:
    """The paths the folder's git ignores (none when it is not in a git work tree)."""
    if not paths:
        return set()
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "check-ignore", "--stdin", "-z"],
            input="\0".join(str(p) for p in paths),
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if done.returncode not in (0, 1):  # 128: not a git work tree
        return _plain_gitignore(folder, paths)
    return {Path(p) for p in done.stdout.split("\0") if p}


def _plain_gitignore(folder: Path, paths: list[Path]) -> set[Path]:
    """A folder that is no git work tree may still have a .gitignore: its plain patterns."""
    ignore = folder / ".gitignore"
    if not ignore.is_file():
        return set()
    import fnmatch

    patterns = [
        line.strip().rstrip("/")
        for line in ignore.read_text(errors="replace").splitlines()
        if line.strip() and not line.startswith(("#", "!"))
    ]
    out = set()
    for path in paths:
        rel = path.relative_to(folder).as_posix()
        parts = rel.split("/")
        for pattern in patterns:
            anchored = pattern.lstrip("/")
            if fnmatch.fnmatch(rel, anchored) or any(fnmatch.fnmatch(p, anchored) for p in parts):
                out.add(path)
                break
    return out


def local_files(paths: Iterable[str], folder: str | os.PathLike[str]) -> dict[str, bytes]:
    """The files among relative ``paths`` that exist inside ``folder`` (not ignored by its
    .gitignore), by their relative path: what the code reads by name, for pods."""
    root = Path(folder).resolve()
    candidates = []
    for path in paths:
        full = (root / path).resolve()
        if full.is_file() and root in full.parents:
            candidates.append(full)
    ignored = _gitignored(root, candidates)
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in candidates if f not in ignored}


def check_size(files: dict[str, bytes], what: str, limit_bytes: int = MAX_MODULES_BYTES) -> None:
    """PackagingError naming the biggest files when ``files`` exceed ``limit_bytes``."""
    total = sum(len(d) for d in files.values())
    if total <= limit_bytes:
        return
    biggest = sorted(files.items(), key=lambda kv: -len(kv[1]))[:3]
    named = ", ".join(f"{path} ({human_bytes(len(data))})" for path, data in biggest)
    raise PackagingError(
        f"{what} are {human_bytes(total)}, over the {human_bytes(limit_bytes)} that ship with a job; the biggest "
        f"files are {named}: keep data out of .py files and load large files from a volume (--pvc) inside "
        "the cell, list generated files in the folder's .gitignore, or bake them into the image (--image)"
    )


def local_modules(
    names: Iterable[str], folder: str | os.PathLike[str], *, limit_bytes: int = MAX_MODULES_BYTES
) -> LocalModules:
    """The notebook-folder modules among ``names`` (dotted names are fine), with the local
    modules they import, transitively. PackagingError when they exceed ``limit_bytes``."""
    root = Path(folder).resolve()
    found = LocalModules(str(root))
    pending = sorted({n.split(".")[0] for n in names if n and not n.startswith(".")})
    # Our own package ships apart (the runtime zip, first on the pods' path), even when the
    # notebook sits in a checkout of it.
    seen: set[str] = {"notebook_elastic"}
    while pending:
        top = pending.pop(0)
        if top in seen:
            continue
        seen.add(top)
        files = _source_of(root, top)
        if files is None:
            continue
        ignored = _gitignored(root, files)
        kept = [f for f in files if f not in ignored]
        if not kept:
            continue
        found.modules[top] = {f.relative_to(root).as_posix(): f.read_bytes() for f in kept}
        for data in found.modules[top].values():
            pending.extend(sorted({n.split(".")[0] for n in imported_modules(data.decode(errors="replace"))} - seen))
    check_size(
        found.files, f"the notebook's own modules the code imports ({', '.join(sorted(found.modules))})", limit_bytes
    )
    return found

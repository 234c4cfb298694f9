"""The checkpoint folder: finished checkpoints listed by (generation, step), generations
claimed and compared (the fence), what killed writers left behind, and durable writes
(fsynced files and folder). Plain functions of a folder; ``State`` uses them."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from ..contract import protocol
from . import sharded

DEFAULT_CHECKPOINT_DIR = "checkpoints"
TMP_MAX_AGE_S = 600


def checkpoint_dir_from_env(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    return Path(os.environ.get(protocol.ENV_CHECKPOINT_DIR, DEFAULT_CHECKPOINT_DIR))


def list_checkpoints(folder: Path) -> list[tuple[int, int, Path]]:
    """Finished checkpoint files as (generation, step, path), oldest first."""
    found = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in names:
        m = protocol.CHECKPOINT_RE.match(name)
        if m:
            found.append((int(m.group(1)), int(m.group(2)), folder / name))
    found.sort()
    return found


_HOST = socket.gethostname().replace("-", "_")


def dead_writers_files(folder: Path, names: list[str] | None = None) -> list[str]:
    """Temporary files of writers killed mid-write: at once when the writer was a process of
    this host that is gone, after TMP_MAX_AGE_S otherwise (another host's pids mean nothing here)."""
    if names is None:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
    cutoff = time.time() - TMP_MAX_AGE_S
    doomed = []
    for name in names:
        if not (name.startswith(".ckpt-") and ".tmp-" in name):
            continue
        host, _, pid = name.rsplit(".tmp-", 1)[1].rpartition("-")
        if host == _HOST and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            doomed.append(name)
            continue
        try:
            if (folder / name).stat().st_mtime < cutoff:
                doomed.append(name)
        except FileNotFoundError:
            pass
    return doomed


def _remove(path: Path) -> None:
    """Delete a checkpoint file, or a sharded checkpoint's folder."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")  # workers run on Linux (PR_SET_PDEATHSIG too)


def newest_generation(folder: Path) -> int:
    """The highest generation announced in ``folder`` by a claim or a checkpoint (-1: none)."""
    newest = -1
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return -1
    for name in names:
        m = protocol.CHECKPOINT_RE.match(name) or protocol.CLAIM_RE.match(name)
        if m:
            newest = max(newest, int(m.group(1)))
    return newest


def run_base(folder: Path, run: str) -> int:
    """The generation this run's numbering starts at: above every generation in ``folder`` when
    the run first writes there, fixed from then on (the first writer's answer is kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"run-{''.join(c if c.isalnum() or c in '-_' else '_' for c in run)}.base"
    for _attempt in range(50):
        try:
            return int(path.read_text())
        except (FileNotFoundError, ValueError):
            pass
        newest = newest_generation(folder)
        base = (newest // protocol.GENERATION_EPOCH_STRIDE + 1) * protocol.GENERATION_EPOCH_STRIDE if newest >= 0 else 0
        tmp = folder / f".{path.name}.{os.getpid()}.tmp"
        tmp.write_text(str(base))
        try:
            os.link(tmp, path)  # atomic, and only the first writer's base counts
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    raise RuntimeError(f"cannot agree on the generation base in {folder}")


def claim_generation(folder: Path, generation: int | None) -> int:
    """Announce this group's generation in ``folder``; claim the next free one if None."""
    folder.mkdir(parents=True, exist_ok=True)
    if generation is not None:
        (folder / protocol.claim_name(generation)).touch()
        return generation
    while True:
        candidate = newest_generation(folder) + 1
        try:
            fd = os.open(folder / protocol.claim_name(candidate), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        return candidate


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _meta_path(checkpoint: Path) -> Path:
    """The file holding a checkpoint's step, cursor and unsharded state."""
    return checkpoint / sharded.META_FILE if sharded.is_sharded_checkpoint(checkpoint) else checkpoint


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir())
    return path.stat().st_size


def torch_save(obj: Any, f: Any) -> None:
    """``torch.save`` in the legacy format (see ``CheckpointWriter._write``), durable once it returns."""
    import torch

    torch.save(obj, f, _use_new_zipfile_serialization=False)
    f.flush()
    os.fsync(f.fileno())

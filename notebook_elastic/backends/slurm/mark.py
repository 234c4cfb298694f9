"""Which Slurm allocations are a job's own: those that carry its folder's mark.

A job's allocations are named ``ne-JOB-supervisor`` and ``ne-JOB-node-N`` for people to read
(``squeue``), but a name is not the job: another home, another machine or another user's shell
may run a job of the same name on the same cluster. So each job folder holds a mark of its own
(``slurm.json``: a random token, and the folder it was made for), every allocation of the job
carries it (``--comment``, ``squeue``'s ``%k``), and every action on Slurm (cancel, signal, why
it ended) takes an allocation only when both its name and its mark are the job's, among this
user's allocations alone (``cluster.py``).

A resumed job is the same folder, so the same mark: it finds what is left of its earlier run. A
job launched anew under the same name gets a new folder, so a new mark. A folder copied by hand
is not the job it was copied from: the mark records the folder's inode, and a copy (another
inode) is given a mark of its own before it runs, so it never acts on the original's
allocations; a folder moved (``mv``, the history's archive) keeps its inode and its mark.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Mapping
from typing import Any

from ...contract.protocol import ENV_SLURM_MARK
from ...errors import BackendError
from ...jobfolder.folder import JobFolder, write_json_atomic
from . import cluster

#: The file in the job folder that holds its mark.
MARK_FILE = "slurm.json"


def _read(folder: JobFolder) -> dict[str, Any]:
    """The folder's mark file, read here (the Slurm side reads its own file, and nothing else of
    the folder): a regular file holding a JSON object, else nothing. Opened without blocking, as
    the folder's own records are (``jobfolder/folder.py``'s ``open_file``): a FIFO planted in its
    place would hold its reader forever."""
    try:
        fd = os.open(folder.path / MARK_FILE, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else {}


def _inode(folder: JobFolder) -> int | None:
    try:
        return os.stat(folder.path).st_ino
    except OSError:
        return None


def own_mark(folder: JobFolder) -> str | None:
    """The mark of the job this folder holds, where its allocations carry it; None when it has
    none yet, or when the folder is a copy of another job's (its mark is the original's)."""
    data = _read(folder)
    mark = data.get("mark")
    if not isinstance(mark, str) or not mark.isalnum():
        return None
    if data.get("inode") is not None and data.get("inode") != _inode(folder):
        return None
    return mark


def mark_for_run(folder: JobFolder) -> str:
    """The mark a run of this folder's job gives its allocations: its own, or a new one (a new
    folder, or a copy of another job's), written to the folder before anything is submitted."""
    mark = own_mark(folder)
    if mark is None:
        mark = secrets.token_hex(8)
        write_json_atomic(folder.path / MARK_FILE, {"mark": mark, "inode": _inode(folder)})
    return mark


def supervisor_mark(folder: JobFolder) -> str:
    """The mark as the supervisor takes it (it may run on another host, where the folder's
    inode is not to be compared): the one its launcher handed it (``ENV_SLURM_MARK``), else the one
    the folder holds, else a new one, written to the folder (a supervisor started by hand)."""
    # Taken out of the environment: its nodes and their workers (a job launched from a cell
    # of theirs) must not carry it on.
    for mark in (os.environ.pop(ENV_SLURM_MARK, None), _read(folder).get("mark")):
        if isinstance(mark, str) and mark.isalnum():
            return mark
    mark = secrets.token_hex(8)
    write_json_atomic(folder.path / MARK_FILE, {"mark": mark, "inode": _inode(folder)})
    return mark


def job_name(folder: JobFolder) -> str:
    """The name the job's allocations are named after: its spec's (a folder renamed by hand
    keeps it), else the folder's."""
    try:
        spec = folder.spec()
    except (OSError, ValueError):
        spec = {}
    return name_in(spec, folder)


def name_in(spec: Mapping[str, Any], folder: JobFolder) -> str:
    """``job_name`` where the caller has read the folder's spec already."""
    name = spec.get("name")
    return name if isinstance(name, str) and name else folder.name


def cancel_marked(job: str, mark: str, wait_s: float = 0.0) -> None:
    """Cancel every allocation of job ``job`` (named after it) that carries ``mark``; wait up
    to ``wait_s`` for them to end. BackendError when Slurm does not answer (nothing may have
    been cancelled)."""
    ids = cluster.cancel(job, mark)
    if ids is None:
        raise BackendError(
            f"Slurm did not answer, so what job {job!r} may still hold there (allocations with the comment "
            f"{cluster.comment(mark)}) was not cancelled; try again once squeue answers"
        )
    if ids and wait_s:
        cluster.wait_ended(ids, wait_s)


def clear_leftovers(folder: JobFolder, spec: Mapping[str, Any], wait_s: float = 0.0) -> None:
    """What Slurm still holds of the job in ``folder`` (by its own mark), cancelled; nothing
    for a folder with no mark of its own (never run with one, or a copy). ``spec``: the
    folder's spec, as its caller read it."""
    mark = own_mark(folder)
    if mark is not None:
        cancel_marked(name_in(spec, folder), mark, wait_s)

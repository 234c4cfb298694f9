"""Backends: where a job runs. ``get_backend("local")``, ``get_backend("kubernetes", ...)``;
``backend_of(name)``: the backend that runs a job of that name, the one way a name is resolved."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, overload

from ..errors import SpecError
from .base import Backend, DryRun, JobInfo

if TYPE_CHECKING:
    from .local import LocalBackend

__all__ = ["Backend", "DryRun", "JobInfo", "backend_of", "get_backend"]


@overload
def get_backend(name: Literal["local"], **options: Any) -> LocalBackend: ...
@overload
def get_backend(name: str, **options: Any) -> Backend: ...
def get_backend(name: str, **options: Any) -> Backend:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(**options)
    if name == "kubernetes":
        from .kubernetes import KubernetesBackend

        return KubernetesBackend(**options)
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend(**options)
    raise SpecError(f"--backend {name!r} is unknown; choose one of: local, kubernetes, slurm")


#: The backends whose jobs live in a job folder (a Slurm job's folder sits among the local ones).
FOLDER_BACKENDS = ("local", "slurm")


def backend_of(
    name: str,
    backend: str | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
    slurm_state: Any = None,
    **options: Any,
) -> Backend:
    """The backend that runs job ``name``: the one way every surface that takes a job's name
    (the CLI, the magics, ``attach()``, the jobs panel's routes, the guardian) finds it.

    Kubernetes when asked (``options``: its namespace and context; the cluster holds the job's
    record). Otherwise the backend the job's folder names (its spec.json, under ``root``, the
    jobs folder, by default the user's): a Slurm job's folder sits among the local ones, and
    acted on with the local backend its allocations would be left to run. ``backend`` (or
    local) only where the folder says nothing: no such job yet, or a spec that cannot be read."""
    from ..contract.spec import validate_name

    validate_name(name, what="the job name")  # a name, never a path to another folder
    if backend == "kubernetes":
        return get_backend("kubernetes", **options)
    # ``slurm_state``: how a remote supervisor's allocation is looked up (the server's cache:
    # a route never asks Slurm inline).
    home: dict[str, Any] = {"home": root} if root is not None else {}
    if slurm_state is not None:
        home["slurm_state"] = slurm_state
    local = get_backend("local", **home)
    try:
        named = local.folder(name).spec().get("backend")
    except (OSError, ValueError):
        named = None
    chosen = named if named in FOLDER_BACKENDS else backend or "local"
    return local if chosen == "local" else get_backend(chosen, **home)

"""Backends: where a job runs. ``get_backend("local")``, ``get_backend("kubernetes", ...)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from ..errors import SpecError
from .base import Backend, DryRun, JobInfo

if TYPE_CHECKING:
    from .local import LocalBackend

__all__ = ["Backend", "DryRun", "JobInfo", "get_backend"]


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

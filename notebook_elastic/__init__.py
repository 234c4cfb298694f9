"""notebook-elastic: elastic torchrun jobs from a notebook cell.

``%load_ext notebook_elastic`` registers ``%%elastic_train`` and friends. The Python API:
``launch(fn_or_code, ...)``, ``jobs()``, ``attach(name)``. Workers import only
``notebook_elastic.runtime``; this module keeps its imports lazy so that stays light.
"""

from __future__ import annotations

from ._version import __version__

# Not typing's: every process of a job imports this package first, a worker's launcher too,
# which imports nothing else that needs typing (9 ms of its start). Type checkers read the name.
TYPE_CHECKING = False
if TYPE_CHECKING:  # what type checkers and editors see of the lazy names below, each as it is
    from typing import Any

    from IPython.core.interactiveshell import InteractiveShell

    from .contract.spec import JobSpec as JobSpec
    from .errors import BackendError as BackendError
    from .errors import NotebookElasticError as NotebookElasticError
    from .errors import PackagingError as PackagingError
    from .errors import SpecError as SpecError
    from .kernel.job import ElasticJob as ElasticJob
    from .kernel.launcher import attach as attach
    from .kernel.launcher import jobs as jobs
    from .kernel.launcher import launch as launch
    from .packaging import package_cell as package_cell

_LAZY = {
    "launch": ("notebook_elastic.kernel.launcher", "launch"),
    "jobs": ("notebook_elastic.kernel.launcher", "jobs"),
    "attach": ("notebook_elastic.kernel.launcher", "attach"),
    "ElasticJob": ("notebook_elastic.kernel.job", "ElasticJob"),
    "JobSpec": ("notebook_elastic.contract.spec", "JobSpec"),
    "package_cell": ("notebook_elastic.packaging", "package_cell"),
    "NotebookElasticError": ("notebook_elastic.errors", "NotebookElasticError"),
    "SpecError": ("notebook_elastic.errors", "SpecError"),
    "PackagingError": ("notebook_elastic.errors", "PackagingError"),
    "BackendError": ("notebook_elastic.errors", "BackendError"),
}

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        if module in ("notebook_elastic.kernel.launcher", "notebook_elastic.kernel.job"):
            from .kernel.views import register_display

            register_display()  # jobs show as dashboards in a notebook, %load_ext or not
        return value
    raise AttributeError(f"module 'notebook_elastic' has no attribute {name!r}")


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "notebook_elastic.server"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "notebook-elastic"}]


def load_ipython_extension(ipython: InteractiveShell) -> None:
    from .kernel.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    from .kernel.magics import unload_ipython_extension as unload

    unload(ipython)

"""What the packager reads from a notebook: its namespace, its cells, where code came from.

``NotebookContext.from_shell(shell)`` reads a live IPython shell (the kernel);
``NotebookContext.from_globals(globals())`` serves ``launch()`` from plain Python.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .analysis import ImportBinding, import_bindings

# Names the interactive shell provides that have no counterpart in a plain Python worker, each
# with what to write instead. (Its own `open`, `exit`, `quit`, `input`, `print`, `help` shadow
# Python's builtins of the same name: those resolve to the worker's builtins, never a refusal.)
IPYTHON_ONLY = {
    "get_ipython": "there is no IPython shell in a worker; remove the call from the training code",
    "display": "workers have no notebook to display in; use print() (shown in the job's logs) "
    "or elastic.report(...) for values to chart",
    "In": "the notebook's input history does not exist in a worker; copy what you need into a "
    "variable of your own in an earlier cell",
    "Out": "the notebook's output history does not exist in a worker; assign the value to a "
    "variable of your own in an earlier cell",
    "__IPYTHON__": "a worker is plain Python; remove the check",
    "dreload": "a worker imports modules fresh; remove the call",
}


@dataclass
class NotebookContext:
    namespace: Mapping[str, Any]
    cells: list[tuple[int, str]] = field(default_factory=list)  # (execution count, source)
    cell_of_file: dict[str, int] = field(default_factory=dict)  # code filename -> execution count
    hidden: frozenset[str] = frozenset()  # names IPython itself put in the namespace
    notebook: str | None = None
    cwd: str = field(default_factory=os.getcwd)

    @classmethod
    def from_shell(cls, shell: Any) -> NotebookContext:
        history = shell.history_manager.input_hist_parsed if shell.history_manager else []
        cells = [(i, src) for i, src in enumerate(history) if i > 0 and src]
        filename_map = dict(getattr(shell.compile, "_filename_map", {}) or {})
        ns = shell.user_ns
        hidden = frozenset(getattr(shell, "user_ns_hidden", {}) or {})
        notebook = ns.get("__session__") or os.environ.get("JPY_SESSION_NAME") or ns.get("__vsc_ipynb_file__")
        return cls(
            namespace=ns,
            cells=cells,
            cell_of_file=filename_map,
            hidden=hidden,
            notebook=str(notebook) if notebook else None,
        )

    @classmethod
    def from_globals(cls, namespace: Mapping[str, Any], notebook: str | None = None) -> NotebookContext:
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:
            shell = None
        if shell is not None and shell.user_ns is namespace:
            return cls.from_shell(shell)
        return cls(namespace=namespace, notebook=notebook or namespace.get("__file__"))

    # -- queries -----------------------------------------------------------------------------

    def cell_label(self, filename: str | None) -> str | None:
        if filename is None:
            return None
        number = self.cell_of_file.get(filename)
        if number is not None:
            return f"cell [{number}]"
        if filename.startswith("<"):
            return None
        return os.path.basename(filename)

    def imports(self) -> dict[str, tuple[int, ImportBinding]]:
        """The latest import statement binding each name, with its cell number."""
        latest: dict[str, tuple[int, ImportBinding]] = {}
        for number, source in self.cells:
            for binding in import_bindings(source):
                if not binding.star:
                    latest[binding.name] = (number, binding)
        return latest

    def star_imports(self) -> list[tuple[int, ImportBinding]]:
        return [(n, b) for n, src in self.cells for b in import_bindings(src) if b.star]

    def cell_assigning(self, name: str) -> int | None:
        """The last cell whose top level binds ``name`` (for messages), if any."""
        from .analysis import assigned_at_top

        for number, source in reversed(self.cells):
            if name in source and name in assigned_at_top(source):
                return number
        return None

    def cells_defining(self, kind: str, name: str) -> list[tuple[int, str]]:
        """Cells (newest first) containing ``class name`` / ``def name``, for fallbacks."""
        needle = f"{kind} {name}"
        return [(n, src) for n, src in reversed(self.cells) if needle in src]

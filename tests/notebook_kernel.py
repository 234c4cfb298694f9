"""A real ipykernel driven cell by cell through nbclient, the way Jupyter runs a notebook.

Tests add cells one at a time and read each cell's output, so they can act between cells
(scale a running job, check a file) as a person at the notebook would. The kernel starts
in the notebook's folder and inherits this process's environment (PYTHONPATH,
NOTEBOOK_ELASTIC_HOME), and is shut down on exit; the notebook is saved beside its folder
for reading after a failure.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient


def output_text(cell: Any) -> str:
    """Everything a cell showed: streams, results, errors (with their tracebacks)."""
    parts = []
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "stream":
            parts.append(output.get("text", ""))
        elif kind == "error":
            parts.append("\n".join(output.get("traceback", [])) + "\n")
        else:
            data = output.get("data", {})
            if "text/plain" in data:
                parts.append(data["text/plain"] + "\n")
    return "".join(parts)


class NotebookKernel:
    """``with NotebookKernel(folder) as nb: nb.run("x = 1")`` -> the cell's output text.

    A cell that raises fails the test with the cell's source and output."""

    def __init__(self, folder: Path, name: str = "notebook.ipynb", timeout_s: int = 300) -> None:
        self.folder = Path(folder)
        self.path = self.folder / name
        self.nb = nbformat.v4.new_notebook()
        self.nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        self.client = NotebookClient(
            self.nb,
            timeout=timeout_s,
            kernel_name="python3",
            allow_errors=True,
            resources={"metadata": {"path": str(self.folder)}},
        )
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> NotebookKernel:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._stack.enter_context(self.client.setup_kernel())
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._stack.close()  # shuts the kernel down
        finally:
            nbformat.write(self.nb, self.path)

    def run(self, source: str, *, may_fail: bool = False) -> str:
        """Execute one new cell; its output text. Raises AssertionError if the cell raised
        (unless ``may_fail``)."""
        cell = nbformat.v4.new_code_cell(source.strip("\n"))
        self.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        text = output_text(cell)
        failed = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
        if failed and not may_fail:
            raise AssertionError(f"cell failed:\n{source}\n--- output ---\n{text[-6000:]}")
        return text

    def markdown(self, text: str) -> None:
        self.nb.cells.append(nbformat.v4.new_markdown_cell(text))

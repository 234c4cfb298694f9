"""Export a notebook's training cell as a standalone script, without a notebook server.

The packager reads a live namespace, so the cells before the training cell run first, in an
IPython shell inside this process, in the notebook's folder (as a kernel would run them);
then the training cell is packaged exactly as ``%%elastic_train --export`` does.
Shell escapes (``!pip``), ``%pip``/``%conda`` and ``%matplotlib`` lines are skipped: an
export must not install packages or need a display. Other ``%%elastic_train`` cells are
skipped too: exporting launches nothing.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import PackagingError

_SKIPPED_LINE = re.compile(r"^\s*(!|%(pip|conda|matplotlib)\b)")
_TRAIN_MAGIC = "%%elastic_train"


def _runnable(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if not _SKIPPED_LINE.match(line))


def export_notebook_cell(notebook: str | os.PathLike[str], cell: int, output: str | os.PathLike[str]) -> None:
    """Run code cells 1..cell-1 of ``notebook``, then write code cell ``cell`` (counted from 1
    among code cells) to ``output`` (+ its payload beside it); prints the manifest."""
    import nbformat
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    read: Callable[..., Any] = nbformat.read  # nbformat leaves it unannotated
    path = Path(notebook).resolve()
    if not path.is_file():
        raise PackagingError(f"{notebook}: no such notebook")
    try:
        nb = read(path, as_version=4)
    except Exception as exc:
        raise PackagingError(f"{notebook} is not a readable notebook: {exc}") from None
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    if not 1 <= cell <= len(code):
        raise PackagingError(f"--cell {cell}: {path.name} has {len(code)} code cells; pick one of 1..{len(code)}")
    target = Path(output).resolve()
    shell: Any = InteractiveShell.instance()  # its run_cell and run_cell_magic are unannotated
    from .kernel.magics import load_ipython_extension

    load_ipython_extension(shell)
    here = os.getcwd()
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    try:
        for number, source in enumerate(code[: cell - 1], start=1):
            if source.lstrip().startswith(_TRAIN_MAGIC):
                continue
            result = shell.run_cell(_runnable(source), store_history=True, silent=False)
            error = result.error_before_exec or result.error_in_exec
            if error is not None:
                raise PackagingError(
                    f"code cell {number} of {path.name} failed while preparing the export "
                    f"({type(error).__name__}: {error}); fix it so the notebook runs top to bottom"
                )
        source = code[cell - 1]
        first, _, body = source.lstrip().partition("\n")
        line, body = (first[len(_TRAIN_MAGIC) :], body) if first.startswith(_TRAIN_MAGIC) else ("", source)
        line = re.sub(r"--(dry-run|wait|fresh)\b", "", line)
        try:
            shell.run_cell_magic("elastic_train", f"{line} --export {target}", body)
        except UsageError as exc:
            raise PackagingError(str(exc)) from None
    finally:
        os.chdir(here)
        sys.path.remove(str(path.parent))

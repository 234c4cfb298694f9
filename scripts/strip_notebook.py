"""A notebook as git stores it: no outputs, no execution counts, none of what a run or the front
end adds (widget state, the kernel's language_info, cell timing), in nbformat's own layout.

usage: python scripts/strip_notebook.py < IN.ipynb > OUT.ipynb

It is the clean filter ``scripts/setup.sh`` installs for ``notebooks/*.ipynb`` (.gitattributes):
a person who runs the shipped notebooks in JupyterLab keeps the outputs on disk, and nothing of
the run reaches git: ``git diff`` shows no change and a commit stores none (#39 item 11: autosave
wrote outputs and the kernel's language_info into the tracked notebooks, even on merely opening
one). ``git status`` may still list such a notebook until it is ``git add``-ed (which stores
nothing new): git trusts a changed file size without asking the filter. tests/test_docs.py
checks the stored notebooks are already in this form.
"""

from __future__ import annotations

import sys

import nbformat

#: What JupyterLab and the kernel write into a notebook as it runs: never part of what ships.
RUN_METADATA = ("language_info", "widgets", "toc", "varInspector")
CELL_RUN_METADATA = ("collapsed", "scrolled", "execution", "trusted", "jupyter")
#: The kernelspec the shipped notebooks name, as ipykernel's own kernelspec names itself (what
#: JupyterLab writes back on opening a notebook).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    for key in RUN_METADATA:
        nb.metadata.pop(key, None)
    if nb.metadata.get("kernelspec", {}).get("name") == KERNELSPEC["name"]:
        nb.metadata["kernelspec"] = dict(KERNELSPEC)
    for cell in nb.cells:
        for key in CELL_RUN_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def main() -> int:
    text = sys.stdin.read()
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception:  # not a notebook we can read: git keeps what it was given
        sys.stdout.write(text)
        return 0
    sys.stdout.write(nbformat.writes(strip(nb)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

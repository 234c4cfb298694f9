#!/usr/bin/env python3
"""Count the uses of ``typing.Any`` in the package (issue 38 item 6: the closing note gives the
count before and after).

What is counted: every ``Any`` in the code as a type (a name or ``typing.Any`` in an annotation,
a ``cast``, an alias, a subscript), and in a quoted type (``cast("dict[str, Any]", ...)``). Not
counted: the import lines, comments, docstrings and other prose. ``grep -c`` counts lines, so a
line with two ``Any`` is one there; this counts each.

    .venv/bin/python scripts/count_any.py            # the total
    .venv/bin/python scripts/count_any.py --files    # and each file's count, most first
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_elastic"
_WORD = re.compile(r"\bAny\b")


def _quoted_types(tree: ast.AST) -> list[str]:
    """String constants that are types: quoted annotations and the first argument of ``cast``."""
    out: list[str] = []
    for node in ast.walk(tree):
        annotations: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            annotations += [a.annotation for a in every if a is not None]
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "cast":
            annotations += node.args[:1]
        for annotation in annotations:
            if annotation is None:
                continue
            out += [n.value for n in ast.walk(annotation) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return out


def count(path: Path) -> int:
    tree = ast.parse(path.read_text())
    names = sum(
        1
        for n in ast.walk(tree)
        if (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
    )
    return names + sum(len(_WORD.findall(text)) for text in _quoted_types(tree))


def main(argv: list[str]) -> int:
    counts = {
        str(p.relative_to(PACKAGE.parent)): count(p)
        for p in sorted(PACKAGE.rglob("*.py"))
        if "labextension" not in p.parts
    }
    if "--files" in argv:
        for name, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            if n:
                print(f"{n:5d}  {name}")
    print(f"{sum(counts.values())} uses of Any in {sum(1 for n in counts.values() if n)} of {len(counts)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

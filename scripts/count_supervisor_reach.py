#!/usr/bin/env python3
"""Count what the supervisor's parts reach (issue 38 item 1: the closing note gives the counts
before and after).

Three figures, read from the code's syntax tree (``notebook_elastic/supervisor/``, or the folder
given):

1. the supervisor reached through a part: every ``self.sup.X`` and ``sup.X`` in the part modules
   (every module of the folder but ``run.py``), as distinct attributes and uses;
2. each part class (one that takes collaborators in ``__init__``): what it is handed (its
   ``__init__`` parameters) and every ``self.P.X`` with P one of them, as distinct P.X and uses
   (a part handed ``sup`` counts ``sup.X`` here too);
3. the ``Supervisor``'s own attributes (assigned on ``self`` in its ``__init__`` in ``run.py``).

    .venv/bin/python scripts/count_supervisor_reach.py
    git archive COMMIT notebook_elastic/supervisor | tar -x -C /tmp/old
    .venv/bin/python scripts/count_supervisor_reach.py /tmp/old/notebook_elastic/supervisor
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

SUPERVISOR = Path(__file__).resolve().parents[1] / "notebook_elastic" / "supervisor"


def _is_sup(node: ast.expr) -> bool:
    """``self.sup`` or a name ``sup``."""
    if isinstance(node, ast.Name):
        return node.id == "sup"
    return isinstance(node, ast.Attribute) and node.attr == "sup" and _is_self(node.value)


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else SUPERVISOR
    trees = {path.name: ast.parse(path.read_text()) for path in sorted(folder.glob("*.py"))}
    sup: Counter[str] = Counter()
    for name, tree in trees.items():
        if name != "run.py":
            sup.update(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and _is_sup(n.value))
    print(f"1. the supervisor reached by its parts: {len(sup)} attributes, {sum(sup.values())} uses")
    print("2. each part: what it is handed -> distinct collaborator.attribute reached, uses")
    for name, tree in trees.items():
        for cls in ast.walk(tree):
            init = _init(cls) if isinstance(cls, ast.ClassDef) and name != "run.py" else None
            if init is None or not (params := [a.arg for a in [*init.args.args[1:], *init.args.kwonlyargs]]):
                continue
            reached: Counter[str] = Counter(
                f"{n.value.attr}.{n.attr}"
                for n in ast.walk(cls)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Attribute)
                and _is_self(n.value.value)
                and n.value.attr in params
            )
            assert isinstance(cls, ast.ClassDef)
            print(f"   {name} {cls.name}({', '.join(params)}): {len(reached)}, {sum(reached.values())}")
    for cls in ast.walk(trees["run.py"]):
        if isinstance(cls, ast.ClassDef) and cls.name == "Supervisor" and (init := _init(cls)) is not None:
            own = sorted(
                {
                    n.attr
                    for n in ast.walk(init)
                    if isinstance(n, ast.Attribute) and _is_self(n.value) and isinstance(n.ctx, ast.Store)
                }
            )
            print(f"3. the Supervisor's own attributes: {len(own)} ({', '.join(own)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

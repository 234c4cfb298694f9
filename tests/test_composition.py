"""Composition, not mixins (#27 item 2): a class that outgrew one job holds collaborators that
declare their own state. Every attribute a class of the package assigns on ``self`` is first
assigned in its ``__init__`` (or declared in its body); and no class of ours inherits from
another class of ours unless it is a kind of it (the bases named below)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_elastic"

#: Bases of ours a class may inherit from: an interface it implements, or a kind it is (and
#: every exception family: ``...Error``).
KINDS = {"Backend", "LocalBackend", "Tracker", "Handler", "Placement"}


def classes():
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(PACKAGE.parent), node


def assigned_on_self(function: ast.AST) -> set[str]:
    return {
        n.attr
        for n in ast.walk(function)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and isinstance(n.ctx, ast.Store)
    }


def test_every_attribute_is_first_assigned_in_init():
    outside = []
    for path, cls in classes():
        methods = [f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        declared = {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
        declared |= {t.id for s in cls.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
        declared |= {f.name for f in methods}  # a property's setter assigns through it
        in_init = set().union(*(assigned_on_self(f) for f in methods if f.name == "__init__"))
        for f in methods:
            if f.name != "__init__":
                outside += [
                    f"{path}: {cls.name}.{f.name} sets self.{a}"
                    for a in sorted(assigned_on_self(f) - in_init - declared)
                ]
    assert not outside, "assigned outside __init__ (declare it there):\n" + "\n".join(outside)


def test_no_class_of_ours_is_a_mixin_of_another():
    ours = {cls.name for _path, cls in classes()}
    mixed = [
        f"{path}: {cls.name}({', '.join(ast.unparse(b) for b in cls.bases)})"
        for path, cls in classes()
        if any(
            isinstance(b, ast.Name) and b.id in ours and b.id not in KINDS and not b.id.endswith("Error")
            for b in cls.bases
        )
    ]
    assert not mixed, "classes that inherit from another class of ours (hold it instead):\n" + "\n".join(mixed)

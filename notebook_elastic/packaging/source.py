"""Finding things in source text: the names import statements bind (each with its own
statement), a function or class by name and line, a node's exact source (decorators
included), lines that are IPython syntax, and the modules a source imports. Pure functions,
no notebook state."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ImportBinding:
    """One name bound by an import statement, with that statement rewritten for it alone."""

    name: str  # the name bound in the namespace ('*' for a star import)
    statement: str  # e.g. "import torch.nn as nn", "from math import sqrt"
    module: str  # the module imported from
    lineno: int
    star: bool = False


def _statements_outside_functions(
    body: list[ast.stmt] | list[ast.stmt | ast.excepthandler],
) -> Iterator[ast.stmt | ast.excepthandler]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list):
                yield from _statements_outside_functions(
                    [s for s in inner if isinstance(s, (ast.stmt, ast.excepthandler))]
                )
        if isinstance(stmt, ast.ExceptHandler):
            continue


def import_bindings(source: str) -> list[ImportBinding]:
    """Every name an import statement binds in a cell, wherever the import sits among
    other code (inside if/try/with blocks too, but not inside functions)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[ImportBinding] = []
    for stmt in _statements_outside_functions(tree.body):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    out.append(
                        ImportBinding(alias.asname, f"import {alias.name} as {alias.asname}", alias.name, stmt.lineno)
                    )
                else:
                    top = alias.name.split(".")[0]
                    out.append(ImportBinding(top, f"import {alias.name}", alias.name, stmt.lineno))
        elif isinstance(stmt, ast.ImportFrom):
            module = "." * stmt.level + (stmt.module or "")
            for alias in stmt.names:
                if alias.name == "*":
                    out.append(ImportBinding("*", f"from {module} import *", module, stmt.lineno, star=True))
                elif alias.asname and alias.asname != alias.name:
                    out.append(
                        ImportBinding(
                            alias.asname, f"from {module} import {alias.name} as {alias.asname}", module, stmt.lineno
                        )
                    )
                else:
                    out.append(ImportBinding(alias.name, f"from {module} import {alias.name}", module, stmt.lineno))
    return out


def find_definition(source: str, lineno: int, name: str) -> tuple[ast.AST, bool] | None:
    """The def/class node named ``name`` starting at ``lineno`` (its def line or its first
    decorator's), and whether it sits at the top level (not inside another function)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None

    def search(body: list[ast.stmt], nested: bool) -> tuple[ast.AST, bool] | None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([stmt.lineno] + [d.lineno for d in stmt.decorator_list])
                if stmt.name == name and lineno in (stmt.lineno, first):
                    return stmt, not nested
                inner_nested = nested or not isinstance(stmt, ast.ClassDef)
                found = search(stmt.body, inner_nested)
                if found:
                    return found
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list):
                    found = search([s for s in inner if isinstance(s, ast.stmt)], nested)
                    if found:
                        return found
            for handler in getattr(stmt, "handlers", []) or []:
                found = search(handler.body, nested)
                if found:
                    return found
        return None

    return search(tree.body, False)


def find_class(source: str, name: str, containing_line: int | None = None) -> ast.ClassDef | None:
    """The last top-level-ish ``class name`` in ``source`` (containing a line, if given)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            if containing_line is None or node.lineno <= containing_line <= (node.end_lineno or node.lineno):
                found = node
    return found


def node_source(source: str, node: ast.stmt) -> str:
    """The exact text of a def/class node, decorators included, dedented to column 0."""
    lines = source.splitlines()
    decorators = getattr(node, "decorator_list", [])
    start = min([node.lineno] + [d.lineno for d in decorators]) - 1
    end = node.end_lineno or node.lineno
    chunk = lines[start:end]
    indent = len(chunk[0]) - len(chunk[0].lstrip())
    return "\n".join(line[indent:] if line[:indent].strip() == "" else line for line in chunk)


def magic_lines(raw_source: str) -> list[tuple[int, str]]:
    """Lines of a cell that are IPython syntax (``%magic``, ``!shell``, ``x = !cmd``, ``obj?``).

    They cannot run in a plain Python worker. Found by letting IPython transform the cell
    and looking for the ``get_ipython()`` calls it introduces.
    """
    from IPython.core.inputtransformer2 import TransformerManager as _TransformerManager

    TransformerManager: Callable[[], Any] = _TransformerManager  # IPython leaves it unannotated

    try:
        transformed = TransformerManager().transform_cell(raw_source)
        tree = ast.parse(transformed)
    except SyntaxError:
        return []
    raw_lines = raw_source.splitlines()
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "get_ipython"
        ):
            found.add(node.lineno)
    return [(n, raw_lines[n - 1].strip() if n - 1 < len(raw_lines) else "") for n in sorted(found)]


def imported_modules(source: str) -> set[str]:
    """Absolute module names any import statement in ``source`` names, inside functions too."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            # `from pkg import sub` may import the submodule pkg.sub
            names.update(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    return names

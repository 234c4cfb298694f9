"""Name analysis of Python source: what a cell or a definition needs from outside itself.

Pure functions over source text, no notebook state. ``symtable`` gives exact scoping for
nested functions, lambdas and classes (``global``/``nonlocal``, class-scope rules); an
ordered AST walk of the cell's top level decides whether a name is read before the cell
assigns it (``lr = lr * 2`` needs the notebook's ``lr``; ``model = Net()`` does not need the
notebook's ``model``). Lookups in source text (imports, definitions, IPython lines) are in
``source.py``.
"""

from __future__ import annotations

import ast
import symtable
from dataclasses import dataclass

from .source import (
    ImportBinding,
    find_class,
    find_definition,
    import_bindings,
    imported_modules,
    magic_lines,
    node_source,
)

# The name analysis, and the source lookups that were defined here before they moved to
# source.py (still imported from here).
__all__ = [
    "CellNames",
    "ImportBinding",
    "assigned_at_top",
    "cell_names",
    "definition_names",
    "find_class",
    "find_definition",
    "import_bindings",
    "imported_modules",
    "magic_lines",
    "node_source",
]

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_TABLE_NAMES = {ast.Lambda: "lambda"}


def _descendants(table: symtable.SymbolTable) -> list[symtable.SymbolTable]:
    out = []
    for child in table.get_children():
        out.append(child)
        out.extend(_descendants(child))
    return out


def _global_refs(table: symtable.SymbolTable, *, recursive: bool = True) -> set[str]:
    """Names a scope (and, if asked, its nested scopes) reads from the module's globals."""
    refs = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    if recursive:
        for child in table.get_children():
            refs |= _global_refs(child)
    return refs


def _table_key(node: ast.AST) -> tuple[str, int] | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name, node.lineno
    if isinstance(node, ast.Lambda):
        return "lambda", node.lineno
    return None


class _OrderedReads(ast.NodeVisitor):
    """Walks the top level in evaluation order, collecting names read before being bound."""

    def __init__(self, tables: dict[tuple[str, int], list[symtable.SymbolTable]]) -> None:
        self.tables = tables
        self.bound: set[str] = set()
        self.free: dict[str, int] = {}
        self.deferred: dict[str, int] = {}  # read when a function defined here is called
        self.stars: list[int] = []

    def _table(self, node: ast.AST) -> symtable.SymbolTable | None:
        key = _table_key(node)
        if key is None:
            return None
        candidates = self.tables.get(key)
        if not candidates:
            # Decorated definitions: the table may carry the first decorator's line.
            name = key[0]
            decorators = getattr(node, "decorator_list", [])
            for deco in decorators:
                candidates = self.tables.get((name, deco.lineno))
                if candidates:
                    break
        return candidates.pop(0) if candidates else None

    def load(self, name: str, lineno: int) -> None:
        if name not in self.bound:
            self.free.setdefault(name, lineno)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.load(node.id, node.lineno)
        else:
            self.bound.add(node.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self.load(node.target.id, node.lineno)
        else:
            self.visit(node.target)
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.bound.add(node.target.id)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.annotation)
        if node.value is not None:
            self.visit(node.value)
            self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self.visit(item.optional_vars)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncWith = visit_With

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.bound.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.stars.append(node.lineno)
            else:
                self.bound.add(alias.asname or alias.name)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bound.add(node.name)
        for stmt in node.body:
            self.visit(stmt)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.pattern is not None:
            self.visit(node.pattern)
        if node.name:
            self.bound.add(node.name)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.bound.add(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self.generic_visit(node)
        if node.rest:
            self.bound.add(node.rest)

    def visit_Global(self, node: ast.Global) -> None:
        pass

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        pass

    def _arguments(self, args: ast.arguments, annotations: bool) -> None:
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)
        if annotations:
            for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None:
                    self.visit(arg.annotation)

    def _defer(self, node: ast.stmt | ast.expr) -> None:
        table = self._table(node)
        if table is not None:
            for name in _global_refs(table):
                self.deferred.setdefault(name, node.lineno)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        self._arguments(node.args, annotations=True)
        if node.returns is not None:
            self.visit(node.returns)
        self._defer(node)
        self.bound.add(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._arguments(node.args, annotations=False)
        self._defer(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        for base in node.bases:
            self.visit(base)
        for kw in node.keywords:
            self.visit(kw.value)
        table = self._table(node)
        if table is not None:
            for name in _global_refs(table, recursive=False):
                self.load(name, node.lineno)  # the class body runs now
            for child in table.get_children():
                for name in _global_refs(child):
                    self.deferred.setdefault(name, node.lineno)
        self.bound.add(node.name)

    def _comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, parts: list[ast.expr]
    ) -> None:
        outer = set(self.bound)
        for gen in node.generators:
            self.visit(gen.iter)
            self.visit(gen.target)
            for cond in gen.ifs:
                self.visit(cond)
        for part in parts:
            self.visit(part)
        self.bound = outer  # comprehension variables do not leak

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node, [node.elt])

    def visit_SetComp(self, node: ast.SetComp) -> None:
        self._comprehension(node, [node.elt])

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> None:
        self._comprehension(node, [node.elt])

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node, [node.key, node.value])


def _index_tables(
    source: str, filename: str
) -> tuple[symtable.SymbolTable, dict[tuple[str, int], list[symtable.SymbolTable]]]:
    top = symtable.symtable(source, filename, "exec")
    index: dict[tuple[str, int], list[symtable.SymbolTable]] = {}
    for table in _descendants(top):
        index.setdefault((table.get_name(), table.get_lineno()), []).append(table)
    return top, index


@dataclass
class CellNames:
    """What a cell reads from outside itself and what it binds at its top level."""

    free: dict[str, int]  # name -> line of first use
    assigned: set[str]
    star_import_lines: list[int]


def _read_in_order(source: str, filename: str) -> tuple[dict[str, int], _OrderedReads]:
    """The free names of ``source`` with a line of use, in evaluation order (a name read in a
    function defined there counts unless the top level binds it), and the walk that found them."""
    tree = ast.parse(source, filename)
    _top, index = _index_tables(source, filename)
    walker = _OrderedReads(index)
    for stmt in tree.body:
        walker.visit(stmt)
    free = dict(walker.free)
    for name, line in walker.deferred.items():
        if name not in walker.bound:
            free.setdefault(name, line)
    return free, walker


def cell_names(source: str, filename: str = "<cell>") -> CellNames:
    """Free names of a cell in evaluation order (raises SyntaxError on bad source)."""
    free, walker = _read_in_order(source, filename)
    return CellNames(free=free, assigned=set(walker.bound), star_import_lines=walker.stars)


def definition_names(source: str, filename: str = "<definition>") -> dict[str, int]:
    """Global names a def/class snippet (with its decorators) needs, with a line of use."""
    return _read_in_order(source, filename)[0]


def assigned_at_top(source: str) -> set[str]:
    """Names a cell binds at its top level (assignments, defs, imports, loops, ...)."""
    try:
        return cell_names(source).assigned
    except SyntaxError:
        return set()

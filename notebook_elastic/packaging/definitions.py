"""Shipping a notebook function or class by its source: found where IPython keeps cell
sources (decorators included), its own free names needed in turn; a lambda, a closure or a
function whose source is gone goes by value instead. Held by ``collect.Collector``, which
hands it the notebook's functions and classes; the value shipper asks it for references to
them (``reference_for``)."""

from __future__ import annotations

import ast
import inspect
import linecache
import types
from collections.abc import Callable, Mapping
from typing import Any

from .analysis import definition_names, find_class, find_definition, node_source
from .credentials import looks_like_credential
from .notebook import NotebookContext
from .shipped import _MISSING, Shipped


def _code_globals(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_globals(const)
    return names


class DefinitionShipper:
    """Names the script defines from the notebook's own source. What it ships goes into
    ``items`` and what stops it into ``problems`` (the collector's own, shared with the other
    shippers); the names a definition needs go back to the collector through ``need``, and a
    function that must go by value through ``ship_by_value``, to be pickled in turn."""

    def __init__(
        self,
        ctx: NotebookContext,
        *,
        ship: set[str],
        items: dict[str, Shipped],
        problems: list[str],
        need: Callable[[str, str], None],
        ship_by_value: Callable[[str], None],
        origin_of_value: Callable[[str], str | None],
    ) -> None:
        self._ctx = ctx
        self._ns: Mapping[str, Any] = ctx.namespace
        self._ship = ship
        self._items = items
        self._problems = problems
        self._need = need
        self._ship_by_value = ship_by_value
        self._origin_of_value = origin_of_value
        self._by_source_ids: dict[int, str] = {}  # id of a definition shipped by source -> its name
        # Every global a shipped definition reads: those the cell assigns stay globals of the
        # script's main, so the definitions still see them.
        self.reads: set[str] = set()
        # The globals the training cell itself assigns, set by the collector once it has read
        # the cell: a definition reading one gets it from the cell, as in the notebook.
        self.cell_assigned: set[str] = set()

    def reference_for(self, obj: Any) -> str | None:
        """Notebook classes and functions inside values travel as references to the script's
        own definitions (so isinstance() still holds there), never as copies. One met here for
        the first time is shipped by source now; one without source goes by value."""
        name = self._by_source_ids.get(id(obj))
        if name is not None or getattr(obj, "__module__", None) != "__main__":
            return name
        name = obj.__name__
        if self._ns.get(name) is not obj or name in self._items:
            return None
        if isinstance(obj, type):
            self.resolve_class(name, obj)
        else:
            found = self._function_source(name, obj)
            if not isinstance(found, str):
                snippet, filename, lineno = found
                self._add_definition(name, obj, "function", snippet, *self._place(filename, lineno))
        return self._by_source_ids.get(id(obj))

    def _function_source(self, name: str, func: Any) -> tuple[str, str, int] | str:
        """(source, filename, line) of a notebook function, or why it must go by value."""
        target = inspect.unwrap(func) if hasattr(func, "__wrapped__") else func
        if target.__name__ == "<lambda>":
            return "a lambda"
        if target.__closure__:
            return "a closure (it keeps values of the function that made it)"
        if "<locals>" in target.__qualname__:
            return "defined inside another function"
        code = target.__code__
        lines = linecache.getlines(code.co_filename)
        if not lines:
            return "its source is gone (defined by exec or in a deleted cell)"
        source = "".join(lines)
        found = find_definition(source, code.co_firstlineno, target.__name__)
        if found is None or not found[1]:
            return "its source could not be located"
        node = found[0]
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return "its source could not be located"  # never: find_definition finds only these
        if target is not func and not getattr(node, "decorator_list", None):
            return "it was wrapped without decorator syntax"
        if target.__name__ != name and self._ns.get(target.__name__) is not func:
            return f"it was defined as `{target.__name__}` and that name now means something else"
        return node_source(source, node), code.co_filename, node.lineno

    def resolve_function(self, name: str, func: Any) -> bool:
        target = inspect.unwrap(func) if hasattr(func, "__wrapped__") else func
        if not isinstance(target, types.FunctionType):
            return False
        found = self._function_source(name, func)
        if isinstance(found, str):
            self._add_function_by_value(name, func, found)
            return True
        snippet, filename, lineno = found
        self._add_definition(target.__name__, func, "function", snippet, *self._place(filename, lineno))
        if target.__name__ != name:
            self._add_alias(name, target.__name__)
        return True

    def resolve_class(self, name: str, cls: type) -> bool:
        if cls.__name__ != name or "<locals>" in cls.__qualname__:
            return False
        snippet = None
        filename = ""
        lineno = 0
        for attr in vars(cls).values():
            fn = getattr(attr, "__func__", None) or getattr(attr, "fget", None) or attr
            fn = inspect.unwrap(fn) if hasattr(fn, "__wrapped__") else fn
            code = getattr(fn, "__code__", None)
            if code is None:
                continue
            lines = linecache.getlines(code.co_filename)
            if not lines:
                continue
            source = "".join(lines)
            node = find_class(source, name, containing_line=code.co_firstlineno)
            if node is not None:
                snippet, filename, lineno = node_source(source, node), code.co_filename, node.lineno
                break
        if snippet is None:
            for number, source in self._ctx.cells_defining("class", name):
                node = find_class(source, name)
                if node is not None:
                    self._add_definition(
                        name, cls, "class", node_source(source, node), f"cell [{number}]", (number, node.lineno)
                    )
                    return True
        if snippet is None:
            return False
        self._add_definition(name, cls, "class", snippet, *self._place(filename, lineno))
        return True

    def _place(self, filename: str, lineno: int) -> tuple[str | None, tuple[int, int]]:
        return self._ctx.cell_label(filename), (self._ctx.cell_of_file.get(filename, 10**8), lineno)

    def _add_definition(
        self, name: str, value: Any, kind: str, snippet: str, origin: str | None, order: tuple[int, int]
    ) -> None:
        header = next(
            (line for line in snippet.splitlines() if line.lstrip().startswith(("def ", "async def ", "class "))), kind
        )
        self._items[name] = Shipped(
            name,
            kind,
            origin=origin,
            code=snippet,
            size=len(snippet),
            order=order,
            type_name=header.strip().rstrip(":"),
        )
        self._by_source_ids[id(value)] = name
        try:
            needs = definition_names(snippet)
        except SyntaxError:
            needs = {}
        for dep, _line in sorted(needs.items(), key=lambda kv: kv[1]):
            self.reads.add(dep)
            # A global the cell itself assigns is the cell's to provide, as in the notebook.
            if dep != name and dep not in self.cell_assigned:
                self._need(dep, f"{kind} `{name}`")

    def _add_alias(self, name: str, target: str) -> None:
        self._items[name] = Shipped(name, "alias", code=f"{name} = {target}", order=(10**9, 0), type_name="alias")

    def _add_function_by_value(self, name: str, func: Any, reason: str) -> None:
        self._items[name] = Shipped(
            name, "function-by-value", origin=self._origin_of_value(name), note=f"by value: {reason}"
        )
        code = getattr(inspect.unwrap(func) if hasattr(func, "__wrapped__") else func, "__code__", None)
        for dep in sorted(_code_globals(code)) if code else []:
            value = self._ns.get(dep, _MISSING)
            if value is not _MISSING and looks_like_credential(dep, value) and dep not in self._ship:
                self._problems.append(
                    f"`{name}` is shipped by value ({reason}) and refers to `{dep}`, which looks like a "
                    f"credential; pass --ship {dep} to send it, or read it from the environment inside the function"
                )
        self._ship_by_value(name)

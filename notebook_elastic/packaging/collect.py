"""Finding what a cell needs from the notebook, transitively, and deciding how to ship it.

Every free name of the cell is resolved against the notebook's namespace:
- a module, or an object importable from a module -> an import statement (the one the
  notebook wrote, when it still binds the same object);
- a function or class defined in the notebook -> its current source, whose own free names
  are resolved in turn;
- a lambda, a closure, a function whose source is gone -> by value (cloudpickle);
- anything else -> a data value in the payload (each value pickled on its own);
- a string whose name looks like a credential -> withheld unless named in ``ship``;
- a value holding a credential (by shape, or under a credential's name, at any depth, see
  ``credentials.py``) -> refused unless named in ``ship``.
Problems are collected and raised together as one ``PackagingError``, one sentence each.
"""

from __future__ import annotations

import builtins
import inspect
import linecache
import os
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import PackagingError
from .analysis import CellNames, cell_names, definition_names, find_class, find_definition, magic_lines, node_source
from .credentials import find_credential, looks_like_credential
from .notebook import IPYTHON_ONLY, NotebookContext
from .paths import fresh_sys_path, module_location
from .values import ValueShipping, cannot_ship, type_name, unshippable_reason


@dataclass
class Shipped:
    """One thing the script gets from the notebook."""

    name: str
    kind: str  # import | function | class | value | function-by-value | alias | withheld
    origin: str | None = None  # "cell [3]"
    code: str | None = None  # import statement, definition source or alias line
    size: int = 0  # bytes pickled (values) or characters (code)
    type_name: str = ""
    note: str = ""
    order: tuple = (0, 0)
    late: bool = False  # a value that refers to notebook definitions: load after them
    blob: bytes | tuple[str, str] | None = None  # or ("shared", KEY): pickled with others under KEY

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "from": self.origin,
            "bytes": self.size,
            "type": self.type_name,
            "note": self.note,
        }


@dataclass
class Collection:
    cell: str
    cell_names: CellNames
    items: dict[str, Shipped] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    main_globals: set[str] = field(default_factory=set)
    shared: dict[str, bytes] = field(default_factory=dict)  # KEY -> values pickled together
    payload_modules: set[str] = field(default_factory=set)  # modules the payload's pickles refer to


class Collector(ValueShipping):
    """Resolves a cell's names against a notebook and produces what to ship."""

    def __init__(
        self,
        ctx: NotebookContext,
        *,
        ship: Iterable[str] = (),
        extra_import_paths: Iterable[str] = (),
        check_imports: bool = True,
    ) -> None:
        self.ctx = ctx
        self.ns = ctx.namespace
        self.ship = set(ship)
        self.extra_import_paths = tuple(extra_import_paths)
        self.check_imports = check_imports
        self._imports = ctx.imports()
        self._stars = ctx.star_imports()
        self.items: dict[str, Shipped] = {}
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self._queue: list[tuple[str, str]] = []
        self._by_source_ids: dict[int, str] = {}
        self._values_pending: list[str] = []
        self._definition_reads: set[str] = set()
        self._cell_assigned: set[str] = set()
        self._holds: dict[str, dict[int, Any]] = {}  # value name -> the mutable objects it pickled, by id
        self._shared: dict[str, bytes] = {}
        self._payload_modules: set[str] = set()

    # -- entry -------------------------------------------------------------------------------

    def collect(self, cell: str) -> Collection:
        if not cell.strip():
            raise PackagingError("the cell is empty: write the training code below the %%elastic_train line")
        magics = magic_lines(cell)
        if magics:
            line, text = magics[0]
            raise PackagingError(
                f"line {line} of the cell ({text!r}) is IPython syntax, which a plain Python worker "
                "cannot run; move it to another cell or write it in Python"
            )
        try:
            names = cell_names(cell)
        except SyntaxError as exc:
            raise PackagingError(f"the cell does not parse: line {exc.lineno}: {exc.msg}") from None
        self._cell_assigned = names.assigned
        for name, line in sorted(names.free.items(), key=lambda kv: kv[1]):
            self._need(name, f"the cell (line {line})")
        self._drain()
        if not self.problems:
            self._ship_shared_values_together()
        if self.problems:
            raise PackagingError(_join_problems(self.problems))
        script_names = set(self.items)
        main_globals = names.assigned & (script_names | self._definition_reads)
        return Collection(
            cell=cell,
            cell_names=names,
            items=self.items,
            warnings=self.warnings,
            main_globals=main_globals,
            shared=self._shared,
            payload_modules=self._payload_modules,
        )

    def _need(self, name: str, needed_by: str) -> None:
        self._queue.append((name, needed_by))

    def _drain(self) -> None:
        while self._queue or self._values_pending:
            while self._queue:
                name, needed_by = self._queue.pop(0)
                if name not in self.items:
                    self._resolve(name, needed_by)
            if self._values_pending:
                # Pickling can discover notebook classes the values are instances of.
                self._pickle_value(self._values_pending.pop(0))

    # -- resolution --------------------------------------------------------------------------

    def _origin_of_value(self, name: str) -> str | None:
        number = self.ctx.cell_assigning(name)
        return f"cell [{number}]" if number is not None else None

    def _resolve(self, name: str, needed_by: str) -> None:
        in_ns = name in self.ns
        builtin = getattr(builtins, name, _MISSING)
        if name in IPYTHON_ONLY and (not in_ns or name in self.ctx.hidden or self.ns[name] is builtin):
            self.problems.append(
                f"`{name}` (used by {needed_by}) is provided by IPython and does not exist in a worker: "
                f"{IPYTHON_ONLY[name]}"
            )
            return
        if not in_ns or (builtin is not _MISSING and (self.ns[name] is builtin or name in self.ctx.hidden)):
            # A builtin, or the shell's own stand-in for one (ipykernel's `open`, `exit`, `quit`):
            # the worker's builtin of the same name serves.
            if builtin is _MISSING:
                self.problems.append(
                    f"name `{name}` is used by {needed_by} but is not defined in the notebook; define "
                    "it in an earlier cell (and run that cell) or in the training cell itself"
                )
            return
        if name in self.ctx.hidden:
            self.problems.append(
                f"`{name}` (used by {needed_by}) is IPython's own variable and does not exist in a worker; "
                "use a variable of your own"
            )
            return
        value = self.ns[name]
        if looks_like_credential(name, value) and name not in self.ship:
            self.items[name] = Shipped(
                name,
                "withheld",
                origin=self._origin_of_value(name),
                code=f'{name} = _elastic.secret("{name}")',
                type_name=type(value).__name__,
                note=f"looks like a credential: not shipped; workers read ${name} (--env {name}=...) or pass --ship {name}",
            )
            return
        if isinstance(value, types.ModuleType):
            self._resolve_module(name, value)
            return
        if getattr(value, "__module__", None) == "__main__" and (
            isinstance(value, (types.FunctionType, type)) or callable(getattr(value, "__wrapped__", None))
        ):
            if isinstance(value, type):
                if self._resolve_class(name, value):
                    return
            elif self._resolve_function(name, value):
                return
        elif self._resolve_importable(name, value):
            return
        self._add_value(name, value)

    def _check_importable(self, module_name: str, bound_as: str, origin: str | None) -> None:
        if not self.check_imports or module_name.startswith("."):
            if module_name.startswith("."):
                self.problems.append(
                    f"`{bound_as}` comes from a relative import (`{module_name}`), which a standalone "
                    "script cannot resolve; import it by its absolute name"
                )
            return
        top = module_name.split(".")[0]
        if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
            return
        module = sys.modules.get(top)
        if module is None:
            return
        where = module_location(module)
        if not where:
            return
        fresh = fresh_sys_path(self.extra_import_paths)
        if not any(os.path.realpath(w) in fresh for w in where):
            place = f" in {origin}" if origin else ""
            self.problems.append(
                f"module `{top}` (imported as `{bound_as}`{place}) cannot be imported by a fresh Python: it "
                f"was found in {where[0]}, which is not on the workers' path; install it "
                "(pip install -e <its folder>) or move the code into the notebook"
            )

    def _binding_statement(self, name: str, value: Any) -> tuple[str, str, tuple[int, int]] | None:
        """The notebook's own import of ``name``, if it still binds this very object."""
        found = self._imports.get(name)
        if found is None:
            return None
        number, binding = found
        if _statement_binds(binding.statement, name, value):
            return binding.statement, f"cell [{number}]", (number, binding.lineno)
        return None

    def _resolve_module(self, name: str, module: types.ModuleType) -> None:
        found = self._binding_statement(name, module)
        if found:
            statement, origin, order = found
        else:
            modname = module.__name__
            statement = f"import {modname}" if modname == name else f"import {modname} as {name}"
            origin, order = None, (10**9, 0)
            if not _statement_binds(statement, name, module):
                self.problems.append(
                    f"module `{name}` ({modname}) cannot be imported by that name; import it in a cell with a plain import statement"
                )
                return
        self._check_importable(module.__name__, name, origin)
        self.items[name] = Shipped(name, "import", origin=origin, code=statement, order=order, type_name="module")

    def _resolve_importable(self, name: str, value: Any) -> bool:
        """Functions, classes and other objects that live in a module: import, don't pickle."""
        if not (isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)) or callable(value)):
            return False
        found = self._binding_statement(name, value)
        origin, order = (found[1], found[2]) if found else (None, (10**9, 0))
        statement = found[0] if found else None
        module_name = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", None)
        if statement is None:
            if not isinstance(module_name, str) or not isinstance(qualname, str) or "." in qualname or "<" in qualname:
                return False
            statement = f"from {module_name} import {qualname}" + (f" as {name}" if qualname != name else "")
            if not _statement_binds(statement, name, value):
                return False
            star = next((f"cell [{n}]" for n, b in self._stars if module_name.startswith(b.module)), None)
            if star:
                self.warnings.append(
                    f"`{name}` came from a star import in {star}; the script imports it explicitly: {statement}"
                )
        target_module = statement.split()[1]
        self._check_importable(target_module, name, origin)
        self.items[name] = Shipped(
            name, "import", origin=origin, code=statement, order=order, type_name=type_name(value)
        )
        return True

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
        if target is not func and not getattr(node, "decorator_list", None):
            return "it was wrapped without decorator syntax"
        if target.__name__ != name and self.ns.get(target.__name__) is not func:
            return f"it was defined as `{target.__name__}` and that name now means something else"
        return node_source(source, node), code.co_filename, node.lineno

    def _resolve_function(self, name: str, func: Any) -> bool:
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

    def _resolve_class(self, name: str, cls: type) -> bool:
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
            for number, source in self.ctx.cells_defining("class", name):
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
        return self.ctx.cell_label(filename), (self.ctx.cell_of_file.get(filename, 10**8), lineno)

    def _add_definition(self, name: str, value: Any, kind: str, snippet: str, origin: str | None, order: tuple) -> None:
        header = next(
            (line for line in snippet.splitlines() if line.lstrip().startswith(("def ", "async def ", "class "))), kind
        )
        self.items[name] = Shipped(
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
            self._definition_reads.add(dep)
            # A global the cell itself assigns is the cell's to provide, as in the notebook.
            if dep != name and dep not in self._cell_assigned:
                self._need(dep, f"{kind} `{name}`")

    def _add_alias(self, name: str, target: str) -> None:
        self.items[name] = Shipped(name, "alias", code=f"{name} = {target}", order=(10**9, 0), type_name="alias")

    def _add_function_by_value(self, name: str, func: Any, reason: str) -> None:
        self.items[name] = Shipped(
            name, "function-by-value", origin=self._origin_of_value(name), note=f"by value: {reason}"
        )
        code = getattr(inspect.unwrap(func) if hasattr(func, "__wrapped__") else func, "__code__", None)
        for dep in sorted(_code_globals(code)) if code else []:
            value = self.ns.get(dep, _MISSING)
            if value is not _MISSING and looks_like_credential(dep, value) and dep not in self.ship:
                self.problems.append(
                    f"`{name}` is shipped by value ({reason}) and refers to `{dep}`, which looks like a "
                    f"credential; pass --ship {dep} to send it, or read it from the environment inside the function"
                )
        self._values_pending.append(name)

    def _add_value(self, name: str, value: Any) -> None:
        origin = self._origin_of_value(name)
        reason = unshippable_reason(value)
        if reason:
            self.problems.append(cannot_ship(name, value, origin, reason))
            return
        found = find_credential(name, value) if name not in self.ship else None
        if found is not None:
            place = f" (defined in {origin})" if origin else ""
            self.problems.append(
                f"`{found.path}`{place} looks like a credential ({found.why}) and would be copied into the "
                f"payload every worker loads; pass --ship {name} to send it anyway, or take it out of `{name}` "
                "and give it to the workers with --env NAME=VALUE (read with os.environ)"
            )
            return
        self.items[name] = Shipped(name, "value", origin=origin, type_name=type_name(value))
        self._values_pending.append(name)

    def _reference_for(self, obj: Any) -> str | None:
        """Notebook classes and functions inside values travel as references to the script's
        own definitions (so isinstance() still holds there), never as copies. One met here for
        the first time is shipped by source now; one without source goes by value."""
        name = self._by_source_ids.get(id(obj))
        if name is not None or getattr(obj, "__module__", None) != "__main__":
            return name
        name = obj.__name__
        if self.ns.get(name) is not obj or name in self.items:
            return None
        if isinstance(obj, type):
            self._resolve_class(name, obj)
        else:
            found = self._function_source(name, obj)
            if not isinstance(found, str):
                snippet, filename, lineno = found
                self._add_definition(name, obj, "function", snippet, *self._place(filename, lineno))
        return self._by_source_ids.get(id(obj))


_MISSING = object()


def _statement_binds(statement: str, name: str, value: Any) -> bool:
    scratch: dict[str, Any] = {}
    try:
        exec(compile(statement, "<import check>", "exec"), scratch)
    except Exception:
        return False
    return scratch.get(name, _MISSING) is value


def _code_globals(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_globals(const)
    return names


def _join_problems(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} things stop this cell from being packaged:\n" + "\n".join(f"- {p}" for p in problems)

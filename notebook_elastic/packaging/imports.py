"""Shipping a name as an import: a module, or an object that lives in a module, travels as
the import statement the notebook wrote (when it still binds the same object) or one made
from the object's module and name; refused when a fresh Python could not import it. Held by
``collect.Collector``, which hands it the names to resolve as imports."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from ..plumbing import log as _logging
from .analysis import ImportBinding
from .notebook import NotebookContext
from .paths import fresh_sys_path, module_location
from .shipped import _MISSING, Shipped
from .values import type_name

_log = _logging.get("packaging.imports")


def _statement_binds(statement: str, name: str, value: Any) -> bool:
    scratch: dict[str, Any] = {}
    try:
        exec(compile(statement, "<import check>", "exec"), scratch)
    except Exception:
        _log.debug("the import statement does not rebuild the value: shipped in the payload instead", exc_info=True)
        return False
    return scratch.get(name, _MISSING) is value


class ImportShipper:
    """Names the script imports instead of copying. What it ships goes into ``items``, what
    stops it into ``problems``, what the user should know into ``warnings``: the collector's
    own, shared with the other shippers."""

    def __init__(
        self,
        ctx: NotebookContext,
        *,
        items: dict[str, Shipped],
        problems: list[str],
        warnings: list[str],
        extra_import_paths: tuple[str, ...],
        check_imports: bool,
    ) -> None:
        self._items = items
        self._problems = problems
        self._warnings = warnings
        self._extra_import_paths = extra_import_paths
        self._check_imports = check_imports
        # Read once: each reads every cell of the notebook.
        self._imports: dict[str, tuple[int, ImportBinding]] = ctx.imports()
        self._stars: list[tuple[int, ImportBinding]] = ctx.star_imports()

    def _check_importable(self, module_name: str, bound_as: str, origin: str | None) -> None:
        if not self._check_imports or module_name.startswith("."):
            if module_name.startswith("."):
                self._problems.append(
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
        fresh = fresh_sys_path(self._extra_import_paths)
        if not any(os.path.realpath(w) in fresh for w in where):
            place = f" in {origin}" if origin else ""
            self._problems.append(
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

    def resolve_module(self, name: str, module: types.ModuleType) -> None:
        found = self._binding_statement(name, module)
        if found:
            statement, origin, order = found
        else:
            modname = module.__name__
            statement = f"import {modname}" if modname == name else f"import {modname} as {name}"
            origin, order = None, (10**9, 0)
            if not _statement_binds(statement, name, module):
                self._problems.append(
                    f"module `{name}` ({modname}) cannot be imported by that name; import it in a cell with a plain import statement"
                )
                return
        self._check_importable(module.__name__, name, origin)
        self._items[name] = Shipped(name, "import", origin=origin, code=statement, order=order, type_name="module")

    def resolve_importable(self, name: str, value: Any) -> bool:
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
                self._warnings.append(
                    f"`{name}` came from a star import in {star}; the script imports it explicitly: {statement}"
                )
        target_module = statement.split()[1]
        self._check_importable(target_module, name, origin)
        self._items[name] = Shipped(
            name, "import", origin=origin, code=statement, order=order, type_name=type_name(value)
        )
        return True

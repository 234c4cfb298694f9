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
The collector holds a shipper for each way a name travels: imports (``imports.py``),
definitions (``definitions.py``), values (``values.py``); what is shipped is described in
``shipped.py``.
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Iterable
from typing import Any

from ..errors import PackagingError
from .analysis import cell_names, magic_lines
from .credentials import find_credential, looks_like_credential
from .definitions import DefinitionShipper
from .imports import ImportShipper
from .notebook import IPYTHON_ONLY, NotebookContext
from .shipped import _MISSING, Collection, Shipped
from .values import ValueShipper, cannot_ship, type_name, unshippable_reason


class Collector:
    """Resolves a cell's names against a notebook and produces what to ship.

    It holds one shipper per way a name can travel (imports, definitions, values) and the
    results they share: ``items`` (what the script gets, in the order met), ``problems``
    (what stops the packaging) and ``warnings``. Single use: one ``collect`` per collector."""

    def __init__(
        self,
        ctx: NotebookContext,
        *,
        ship: Iterable[str] = (),
        extra_import_paths: Iterable[str] = (),
        check_imports: bool = True,
        first_line: int = 1,
    ) -> None:
        self.ctx = ctx
        # The line number the editor shows for the code's first line: 2 under a %%elastic_train
        # line (#39 item 6: lines were counted from below it), 1 for launch("...").
        self.first_line = first_line
        self.ns = ctx.namespace
        self.ship = set(ship)
        self.items: dict[str, Shipped] = {}
        self.problems: list[str] = []
        self.warnings: list[str] = []
        # The work queue: names to resolve, with what needs them; then values to pickle, which
        # can need more names (a notebook class an instance belongs to).
        self._queue: list[tuple[str, str]] = []
        self._values_pending: list[str] = []
        self._imports = ImportShipper(
            ctx,
            items=self.items,
            problems=self.problems,
            warnings=self.warnings,
            extra_import_paths=tuple(extra_import_paths),
            check_imports=check_imports,
        )
        self._definitions = DefinitionShipper(
            ctx,
            ship=self.ship,
            items=self.items,
            problems=self.problems,
            need=self._need,
            ship_by_value=self._values_pending.append,
            origin_of_value=self._origin_of_value,
        )
        self._values = ValueShipper(
            self.ns, items=self.items, problems=self.problems, reference_for=self._definitions.reference_for
        )

    # -- entry -------------------------------------------------------------------------------

    def collect(self, cell: str) -> Collection:
        if not cell.strip():
            raise PackagingError("the cell is empty: write the training code below the %%elastic_train line")
        shift = self.first_line - 1
        magics = magic_lines(cell)
        if magics:
            line, text = magics[0]
            raise PackagingError(
                f"line {line + shift} of the cell ({text!r}) is IPython syntax, which a plain Python worker "
                "cannot run; move it to another cell or write it in Python"
            )
        try:
            names = cell_names(cell)
        except SyntaxError as exc:
            raise PackagingError(f"the cell does not parse: line {(exc.lineno or 1) + shift}: {exc.msg}") from None
        self._definitions.cell_assigned = names.assigned
        for name, line in sorted(names.free.items(), key=lambda kv: kv[1]):
            self._need(name, f"the cell (line {line + shift})")
        self._drain()
        if not self.problems:
            self._values.ship_shared_together()
        if self.problems:
            raise PackagingError(_join_problems(self.problems))
        script_names = set(self.items)
        main_globals = names.assigned & (script_names | self._definitions.reads)
        return Collection(
            cell=cell,
            cell_names=names,
            items=self.items,
            warnings=self.warnings,
            main_globals=main_globals,
            shared=self._values.shared,
            payload_modules=self._values.payload_modules,
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
                self._values.pickle(self._values_pending.pop(0))

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
            self._imports.resolve_module(name, value)
            return
        if getattr(value, "__module__", None) == "__main__" and (
            isinstance(value, (types.FunctionType, type)) or callable(getattr(value, "__wrapped__", None))
        ):
            if isinstance(value, type):
                if self._definitions.resolve_class(name, value):
                    return
            elif self._definitions.resolve_function(name, value):
                return
        elif self._imports.resolve_importable(name, value):
            return
        self._add_value(name, value)

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


def _join_problems(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} things stop this cell from being packaged:\n" + "\n".join(f"- {p}" for p in problems)


# The collector, and the records that were defined here before they moved to shipped.py.
__all__ = ["Collection", "Collector", "Shipped"]

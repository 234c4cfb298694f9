"""What the collector produces: one ``Shipped`` per thing the script gets from the notebook,
and the ``Collection`` of them for a cell."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .analysis import CellNames


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
    order: tuple[int, ...] = (0, 0)
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


_MISSING = object()  # a name the namespace does not have (None is a value)

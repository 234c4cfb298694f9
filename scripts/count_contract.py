#!/usr/bin/env python3
"""Measure how typed the event contract is on each side (issue 38 item 4: the closing note
gives the figures before and after). Four counts:

- emits: every event made in the package, by how its kind and fields are given. An emit is a
  call of a function named ``emit`` or ``_emit`` (``runtime/_emit.py``, the supervisor's, the
  cluster follower's...) or a construction ``Event(kind, t, node, data)``. Its kind is a string
  literal ("string kind") or a ``Kind`` member; its fields are given through the kind's class
  (``**Restart(...)``, a variable, a call's result) or spelled out as keywords or a dict
  literal beside the kind ("fields untyped").
- untyped reads: every call of ``Event.get`` (its value is ``Any``: the checker checks neither
  the key nor the type), found by mypy itself: the method is hidden from it (``if not
  TYPE_CHECKING``), or else mypy reads a copy of ``contract/events.py`` without that method
  (``--shadow-file``), by folder; and every use of an event's ``data`` dict itself
  (``e.data``, ``event.data``: a ``dict[str, Any]``).
- ``Any``: scripts/count_any.py's total.
- the labextension: ``any`` as a type in labextension/src (not comments), and which of its
  modules import the generated interfaces of contract.ts.

    .venv/bin/python scripts/count_contract.py            # all four (mypy takes a minute or two)
    .venv/bin/python scripts/count_contract.py --no-mypy  # without the untyped Event.get reads
    .venv/bin/python scripts/count_contract.py --list     # and each site
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "notebook_elastic"
EVENTS = PACKAGE / "contract" / "events.py"
TS_SOURCE = REPO / "labextension" / "src"


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_literal_fields(node: ast.expr) -> bool:
    return isinstance(node, ast.Dict) and any(k is not None for k in node.keys)


def emits() -> list[tuple[str, str, str]]:
    """(place, kind as written, "string kind" | "fields untyped" | "typed") of each emit."""
    out: list[tuple[str, str, str]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = _name(node.func)
            if name not in ("emit", "_emit", "Event"):
                continue
            kind = node.args[0]
            place = f"{path.relative_to(REPO)}:{node.lineno}"
            if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
                out.append((place, kind.value, "string kind"))
                continue
            if not (isinstance(kind, ast.Attribute) and isinstance(kind.value, ast.Name) and kind.value.id == "Kind"):
                continue  # a kind passed on (a helper's argument): counted where it is written
            if name == "Event":
                data = node.args[3] if len(node.args) > 3 else None
                untyped = data is not None and _is_literal_fields(data)
            else:
                named = [k for k in node.keywords if k.arg is not None and k.arg not in ("node", "t")]
                untyped = bool(named) or any(_is_literal_fields(k.value) for k in node.keywords if k.arg is None)
            out.append((place, kind.attr.lower(), "fields untyped" if untyped else "typed"))
    return out


def data_reads() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(e|ev|event|agent_event)\.data\b", line):
                out.append(f"{path.relative_to(REPO)}:{i}")
    return out


def untyped_gets() -> list[str]:
    """Each call of Event.get, as mypy finds them once the method is gone."""
    source = EVENTS.read_text()
    without = re.sub(
        r"\n    def get\(self, key: str, default: Any = None\) -> Any:\n        return [^\n]*\n", "\n", source
    )
    hidden = re.search(r"\n    if not TYPE_CHECKING:\n(        #[^\n]*\n)*        def get\(self", source)
    if without == source and not hidden:
        raise SystemExit("Event.get not found in contract/events.py: teach this script its new shape")
    with tempfile.TemporaryDirectory() as tmp:
        shadow = Path(tmp) / "events.py"
        shadow.write_text(without)
        # Hidden from the type checker (``if not TYPE_CHECKING``): mypy itself reports each read.
        run = subprocess.run(
            [sys.executable, "-m", "mypy", *([] if hidden else ["--shadow-file", str(EVENTS), str(shadow)])],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
    return [
        line.split(": error")[0]
        for line in run.stdout.splitlines()
        if '"Event" has no attribute "get"' in line or 'Item "Event" of' in line and '"get"' in line
    ]


def ts_any() -> tuple[list[str], list[str]]:
    anys, users = [], []
    for path in sorted(TS_SOURCE.glob("*.ts")):
        text = path.read_text()
        code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        for i, line in enumerate(code.splitlines(), 1):
            line = line.split("//")[0]
            if re.search(r"(:|<|\bas|\|)\s*any\b|\bany\[\]|<any>", line):
                anys.append(f"{path.relative_to(REPO)}:{i}")
        if path.name != "contract.ts" and re.search(r"from '\./contract'", text):
            users.append(path.name)
    return anys, users


def main(argv: list[str]) -> int:
    listing = "--list" in argv
    found = emits()
    by = Counter(how for _, _, how in found)
    print(
        f"emits: {len(found)} — typed {by['typed']}, string kind {by['string kind']}, fields untyped {by['fields untyped']}"
    )
    if listing:
        for place, kind, how in found:
            if how != "typed":
                print(f"  {how:15s} {kind:22s} {place}")
    reads = data_reads()
    print(f"uses of an event's untyped .data: {len(reads)}")
    if listing:
        for place in reads:
            print(f"  {place}")
    if "--no-mypy" not in argv:
        gets = untyped_gets()
        folders = Counter(p.split("/")[1] if p.count("/") > 1 else p.split(":")[0] for p in gets)
        print(f"untyped Event.get reads: {len(gets)} ({', '.join(f'{f} {n}' for f, n in folders.most_common())})")
        if listing:
            for place in gets:
                print(f"  {place}")
    any_count = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "count_any.py")], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"Any: {any_count}")
    anys, users = ts_any()
    print(f"labextension: {len(anys)} 'any' as a type; modules importing contract.ts: {', '.join(users) or 'none'}")
    if listing:
        for place in anys:
            print(f"  {place}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

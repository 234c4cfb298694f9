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
- the labextension (src/ and test/, comments left out): ``any`` as a type; untyped reads of the
  server's JSON (in src/: a cast to a shape spelled on the spot, a double cast, a cast to a
  type parameter, a reply's shape spelled in a signature; in test/: a double cast, a cast to
  never, or a row with fields missing cast to a contract type); the interfaces it declares outside
  contract.ts; which modules import the generated types of contract.ts and which do not.

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


TS_TEST = REPO / "labextension" / "test"


def _ts_code(path: Path) -> list[str]:
    """A module's lines without comments (a block comment keeps its lines: numbers stay true)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), path.read_text(), flags=re.S)
    return [line.split("//")[0] for line in text.splitlines()]


def contract_names() -> set[str]:
    """Every interface and type contract.ts declares."""
    return set(re.findall(r"^export (?:interface|type) (\w+)", (TS_SOURCE / "contract.ts").read_text(), flags=re.M))


#: How the sources (src/) give the server's JSON a type the contract does not, each a pattern
#: and its label: a cast to a shape spelled on the spot, a double cast (the checker told to look
#: away), a cast to a type parameter (whatever the caller says), a reply's shape spelled in a
#: signature. (``JSON.parse``'s ``any`` put in a typed place is refused by eslint's no-unsafe
#: rules, eslint.config.mjs.)
_UNTYPED_READS = [
    (r"\bas \{", "cast to a shape spelled on the spot"),
    (r"\bas unknown as\b", "double cast"),
    (r"\bas [A-Z]\b", "cast to a type parameter"),
    (r"Promise<\{", "a reply's shape spelled in a signature"),
]
#: In the unit tests (test/), what makes a row the server never sends: a double cast, a cast to never,
#: or a cast to a contract type (a row with fields missing passed as a whole one).
_TEST_READS = [
    (r"\bas unknown as\b", "double cast"),
    (r"\bas never\b", "cast to never"),
    (r"\bas (I\w+)\b", "cast to a contract type"),
]


def ts_counts() -> dict[str, list[str]]:
    """The labextension's side: ``any`` as a type; untyped reads of the server's JSON (each
    site with its way, ``_UNTYPED_READS``); the interfaces declared outside contract.ts (each a
    shape the generated contract does not give: a duplicate of the server's JSON, or the
    module's own); which modules use contract.ts's types (import them from it) and which do not.
    Sources (src/) and their unit tests (test/)."""
    names = contract_names()
    out: dict[str, list[str]] = {"any": [], "untyped reads": [], "own interfaces": [], "users": [], "non-users": []}
    for path in sorted(TS_SOURCE.glob("*.ts")) + sorted(TS_TEST.glob("*.ts")):
        if path.name == "contract.ts":
            continue
        where = str(path.relative_to(REPO / "labextension"))
        lines = _ts_code(path)
        for i, line in enumerate(lines, 1):
            if re.search(r"(:|<|\bas|\|)\s*any\b|\bany\[\]|<any>", line):
                out["any"].append(f"{where}:{i}")
            for pattern, how in _UNTYPED_READS if path.parent == TS_SOURCE else _TEST_READS:
                found = re.search(pattern, line)
                if found and (how != "cast to a contract type" or found.group(1) in names | {"IJob"}):
                    out["untyped reads"].append(f"{where}:{i} ({how})")
            declared = re.search(r"\binterface (\w+)", line)
            if declared:
                out["own interfaces"].append(f"{where}:{i} {declared.group(1)}")
        code = "\n".join(lines)
        imported = {
            name.strip().split(" as ")[0].removeprefix("type ").strip()
            for group in re.findall(r"import (?:type )?\{([^}]*)\} from '(?:\.\./src|\.)/contract'", code)
            for name in group.split(",")
        }
        if imported & names:
            out["users"].append(where)
        elif path.parent == TS_SOURCE:
            out["non-users"].append(where)
    return out


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
    ts = ts_counts()
    sources = [m for m in ts["users"] if m.startswith("src/")]
    print(
        f"labextension: {len(ts['any'])} 'any' as a type; {len(ts['untyped reads'])} untyped reads of the "
        f"server's JSON; {len(ts['own interfaces'])} interfaces outside contract.ts; modules using contract.ts's "
        f"types: {len(sources)} of {len(sources) + len(ts['non-users'])} in src ({', '.join(sources) or 'none'}; "
        f"not: {', '.join(ts['non-users']) or 'none'}), tests: "
        f"{', '.join(m for m in ts['users'] if not m.startswith('src/')) or 'none'}"
    )
    if listing:
        for label in ("any", "untyped reads", "own interfaces"):
            for place in ts[label]:
                print(f"  {label:15s} {place}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

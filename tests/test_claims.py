"""The claims table (tests/README.md) names tests that exist: a test renamed or deleted leaves
its README claim unchecked, and this goes red instead of the table quietly pointing nowhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ABBREVIATIONS = {"lb": "test_local_backend.py"}
#: `file.py::name`, `lb::name`, or `::name` (the file named before it in the same row).
REFERENCE = re.compile(r"`(test_\w+\.py|lb)?::(\w+)(?:\[[^\]`]*\])?`")


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def references(table: str) -> list[tuple[int, str, str]]:
    """(line, file, test) for every test the table's rows name."""
    found = []
    for number, line in enumerate(table.splitlines(), 1):
        if not line.startswith("|"):
            continue
        current = None
        for file, name in REFERENCE.findall(line):
            current = ABBREVIATIONS.get(file, file) or current
            assert current, f"tests/README.md:{number}: `::{name}` names no file before it in its row"
            found.append((number, current, name))
    return found


def test_every_test_the_claims_table_names_exists():
    refs = references((TESTS / "README.md").read_text())
    assert len(refs) > 50, "the claims table lost its references"
    defined: dict[str, set[str]] = {}
    missing = []
    for number, file, name in refs:
        path = TESTS / file
        if file not in defined:
            defined[file] = _defined(path) if path.exists() else set()
        if name not in defined[file]:
            missing.append(f"tests/README.md:{number}: {file}::{name}")
    assert not missing, "the claims table names tests that do not exist:\n" + "\n".join(missing)


def test_a_reference_without_a_file_takes_the_one_before_it_in_its_row():
    row = "| claim | `test_cli.py::test_a`, `::test_b` (words), `lb::test_c[x-1]` |\n| other | `::test_d` |"
    try:
        references(row)
    except AssertionError as exc:
        assert "tests/README.md:2: `::test_d` names no file" in str(exc)
    else:
        raise AssertionError("a `::name` with no file before it in its row was accepted")
    assert references(row.splitlines()[0]) == [
        (1, "test_cli.py", "test_a"),
        (1, "test_cli.py", "test_b"),
        (1, "test_local_backend.py", "test_c"),
    ]

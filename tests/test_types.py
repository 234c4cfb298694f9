"""The strict type checker (#27 item 3): ``scripts/test.sh`` runs ``mypy`` ([tool.mypy] in
pyproject.toml: strict, over the package) and fails on any error. What is left unchecked is
said where it is: each ``# type: ignore`` names its error code and, after it, why; ten at most."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_elastic"
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")
MOST = 10


def test_every_ignore_names_its_code_and_why_and_there_are_few():
    ignores, unexplained = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = IGNORE.search(line)
            if found is None:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{number}"
            ignores.append(where)
            if not found.group("codes") or not re.match(r"\s*#\s*\S", found.group("rest")):
                unexplained.append(where)
    assert not unexplained, "a type: ignore without [code] and '# why':\n" + "\n".join(unexplained)
    assert len(ignores) <= MOST, f"{len(ignores)} type: ignore comments (at most {MOST}):\n" + "\n".join(ignores)


def test_the_test_command_runs_the_strict_checker():
    script = (PACKAGE.parent / "scripts" / "test.sh").read_text()
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    # Run over the package beside the quick tier, its verdict read (and failing the command) before the rest.
    assert re.search(r"^\.venv/bin/mypy\b", script, re.M) and "mypy failed" in script and "\ntypes\n" in script
    assert "[tool.mypy]" in pyproject and "strict = true" in pyproject and 'files = ["notebook_elastic"]' in pyproject

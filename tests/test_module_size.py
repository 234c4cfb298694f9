"""No module of the package is over ~600 lines without a reason: a longer one says why in its
module docstring, naming the size ("... well over 600 lines: ..."). A prompt to look, not a
reason to cut a class in pieces (#27 item 2): a class that outgrew one job becomes collaborators
it holds, each in the module its job needs (tests/test_composition.py)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_elastic"
MAX_LINES = 600


def test_no_module_is_over_600_lines_without_a_reason_in_its_docstring():
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        text = path.read_text()
        lines = len(text.splitlines())
        if lines <= MAX_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if f"{MAX_LINES} lines" not in docstring:
            unexplained.append(f"{path.relative_to(PACKAGE.parent)} ({lines} lines)")
    assert not unexplained, (
        f"over {MAX_LINES} lines with no reason in the module docstring: {', '.join(unexplained)}; give a part of "
        f"its job to a collaborator of its own, or say in its docstring why it is one module of over {MAX_LINES} lines"
    )

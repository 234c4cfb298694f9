"""No module of the package is over ~400 lines without a reason (#12 item 8): a longer one says
why in its module docstring, naming the size ("... a little over 400 lines: ...")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "notebook_elastic"
MAX_LINES = 400


def test_no_module_is_over_400_lines_without_a_reason_in_its_docstring():
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
        f"over {MAX_LINES} lines with no reason in the module docstring: {', '.join(unexplained)}; split it along "
        f"a seam (see the splits of #12 item 8) or say in its docstring why it is one module of over {MAX_LINES} lines"
    )

"""Writing the script: a readable Python file a person can run with plain torchrun.

Layout: docstring (notebook, time, how to run), imports, plain data values, the notebook's
functions and classes (current source, in the order the notebook defined them), values that
refer to those definitions, then the cell body inside ``main()`` run by ``_elastic.run``.
"""

from __future__ import annotations

import hashlib
import io
import re
import tokenize
from collections.abc import Iterable

from .collect import Collection, Shipped

RUNTIME_IMPORT = "import notebook_elastic.runtime as _elastic"
_RULE = 92


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _section(title: str) -> str:
    head = f"# --- {title} "
    return head + "-" * max(3, _RULE - len(head))


def _with_comment(code: str, comment: str, width: int = 44) -> str:
    if not comment:
        return code
    return f"{code.ljust(width)}  # {comment}"


def _value_lines(items: Iterable[Shipped]) -> list[str]:
    lines = []
    for item in items:
        if item.kind == "withheld":
            lines.append(_with_comment(item.code or "", "withheld: looks like a credential"))
            continue
        detail = ", ".join(p for p in (item.type_name, human_bytes(item.size), item.origin) if p)
        if item.kind == "function-by-value":
            detail = f"function {item.note}" + (f", {item.origin}" if item.origin else "")
        lines.append(_with_comment(f'{item.name} = _payload["{item.name}"]', detail))
    return lines


def render_script(
    collection: Collection,
    *,
    payload_sha256: str | None,
    title: str,
    run_hint: str,
    created: str,
    notebook: str | None,
    own_group: str | None = "",
) -> str:
    """``own_group``: ``packaging.own_group_setup``'s word on the code's own process group."""
    items = collection.items.values()
    imports = sorted((i for i in items if i.kind == "import"), key=lambda i: i.order)
    definitions = sorted((i for i in items if i.kind in ("function", "class")), key=lambda i: i.order)
    aliases = [i for i in items if i.kind == "alias"]
    values = [i for i in items if i.kind in ("value", "function-by-value", "withheld")]
    early = [i for i in values if not i.late]
    late = [i for i in values if i.late]
    payload_count = sum(1 for i in values if i.kind != "withheld")
    payload_bytes = sum(i.size for i in values)

    out: list[str] = ["#!/usr/bin/env python3"]
    # (same_training_code() knows this line: keep the two together.)
    source = f"notebook {notebook}" if notebook else "a notebook"
    out.append(f'"""{title}: training cell packaged from {source} by notebook-elastic on {created}.')
    out.append("")
    out.append("Run it outside the notebook with:")
    out.append(f"    {run_hint}")
    if payload_count:
        out.append("It loads its data values from the payload file beside it (same name, .payload.pkl).")
    out.append('"""')
    out.append("")
    futures = [i for i in imports if i.code and i.code.startswith("from __future__")]
    for item in futures:
        out.append(item.code or "")
    out.append(RUNTIME_IMPORT)
    rest = [i for i in imports if i not in futures]
    if rest:
        out.append("")
        out.append(_section("imports from the notebook"))
        width = max(len(i.code or "") for i in rest)
        for item in rest:
            out.append(_with_comment(item.code or "", item.origin or "", min(width, 60)))
    if payload_count or early:
        out.append("")
        out.append(_section(f"data from the notebook ({payload_count} values, {human_bytes(payload_bytes)})"))
        if payload_count:
            checksum = f', sha256="{payload_sha256}"' if payload_sha256 else ""
            out.append(f"_payload = _elastic.load_payload(__file__{checksum})")
        out.extend(_value_lines(early))
    if definitions:
        out.append("")
        out.append(_section("definitions from the notebook"))
        for item in definitions:
            out.append("")
            if item.origin:
                out.append(f"# {item.origin}")
            out.append((item.code or "").rstrip())
    if aliases:
        out.append("")
        out.extend(i.code or "" for i in aliases)
    if late:
        out.append("")
        out.append(_section("data that refers to the definitions above"))
        out.extend(_value_lines(late))
    out.append("")
    out.append("")
    out.append(_section("the training cell"))
    wrapper = wrapper_name(collection)
    out.append(f"def {wrapper}():")
    if collection.main_globals:
        out.append(f"    global {', '.join(sorted(collection.main_globals))}  # module-level names, as in the notebook")
    out.append(indent_code(collection.cell.rstrip()))
    out.append("")
    out.append("")
    out.append('if __name__ == "__main__":')
    if own_group is None:  # the code makes its own group
        out.append(f"    _elastic.run({wrapper}, init_process_group=False)")
    elif own_group:  # the code's own call names this backend: the group is set up with it
        out.append(f"    _elastic.run({wrapper}, backend={own_group!r})")
    else:
        out.append(f"    _elastic.run({wrapper})")
    return "\n".join(out) + "\n"


def wrapper_name(collection: Collection) -> str:
    """The function the cell body becomes: ``main``, unless the notebook or the cell has a
    ``main`` of its own (the tutorials' ``def main(rank, world_size)``), which it would hide."""
    taken = set(collection.items) | collection.cell_names.assigned | set(collection.cell_names.free)
    return next((n for n in ("main", "training_cell", "_training_cell") if n not in taken), "_notebook_elastic_cell")


def indent_code(source: str, prefix: str = "    ") -> str:
    """Indent code by ``prefix``, leaving the inside of multi-line strings untouched."""
    keep: set[int] = set()  # 1-based lines that continue a multi-line string
    fstring_starts: list[int] = []  # Python 3.12+ splits f-strings into several tokens
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            name = tokenize.tok_name.get(tok.type, "")
            if name == "FSTRING_START":
                fstring_starts.append(tok.start[0])
            elif name == "FSTRING_END" and fstring_starts:
                keep.update(range(fstring_starts.pop() + 1, tok.end[0] + 1))
            elif tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                keep.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        pass
    lines = source.splitlines()
    return "\n".join(line if n in keep or not line.strip() else prefix + line for n, line in enumerate(lines, 1))


def payload_checksum(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


_CREATED = re.compile(r" by notebook-elastic on [^\n]*")


def same_training_code(script_a: str, script_b: str) -> bool:
    """Whether two packaged scripts run the same code on the same data (the payload's hash
    is in the script); only the packaging time in the header may differ."""
    return _CREATED.sub("", script_a, count=1) == _CREATED.sub("", script_b, count=1)

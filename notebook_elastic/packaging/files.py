"""Which files a cell reads and writes by a relative name (pure functions over source text).

A notebook's ``open("log.csv", "a")``, ``torch.save(obj, "model.pt")`` or a tutorial's
``snapshot_path="snapshot.pt"`` mean the notebook's folder: reads ship those files to pods,
and writes are warned about on pods, whose working directory vanishes with the pod.
"""

from __future__ import annotations

import ast
import re

_WRITE_MODES = set("wax+")
# Calls that write to the path given as their argument 0 (open) or 1 (torch.save and friends).
_SAVERS_PATH_ARG = {"save": 1, "savez": 0, "savetxt": 0, "to_csv": 0, "to_parquet": 0, "savefig": 0, "dump": 1}
_PATH_WORDS = ("path", "file", "dir", "snapshot", "checkpoint", "ckpt", "log")


def _relative_literal(node: ast.AST | None) -> str | None:
    """The text of a string literal (or an f-string's leading text) that is a relative path."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        text = str(node.values[0].value) + "..."
    else:
        return None
    if not text or text.startswith(("/", "~", "$")) or "://" in text or "\n" in text:
        return None
    return text


def _looks_like_file(text: str) -> bool:
    return "/" in text or bool(re.search(r"\.[A-Za-z0-9]{1,8}$", text))


def relative_writes(source: str) -> list[tuple[int, str]]:
    """Where ``source`` writes to a relative path: ``open("log.csv", "a")``,
    ``torch.save(obj, "model.pt")``, or a path-like default such as ``snapshot_path="snapshot.pt"``
    (the PyTorch tutorials' Trainer). Returns (line, what) pairs, in line order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == "open":
                mode = (
                    node.args[1]
                    if len(node.args) > 1
                    else next((k.value for k in node.keywords if k.arg == "mode"), None)
                )
                path = _relative_literal(node.args[0] if node.args else None)
                if (
                    path
                    and isinstance(mode, ast.Constant)
                    and isinstance(mode.value, str)
                    and set(mode.value) & _WRITE_MODES
                ):
                    found.append((node.lineno, f"open({path!r}, {mode.value!r})"))
            elif name in _SAVERS_PATH_ARG:
                index = _SAVERS_PATH_ARG[name]
                arg = node.args[index] if len(node.args) > index else None
                if arg is None:
                    arg = next((k.value for k in node.keywords if k.arg in ("f", "path", "fname", "file")), None)
                path = _relative_literal(arg)
                if path and _looks_like_file(path):
                    found.append((node.lineno, f"{ast.unparse(func)}(..., {path!r})"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args
            defaults = [None] * (len(args) - len(node.args.defaults)) + list(node.args.defaults)
            pairs = list(zip(args, defaults)) + list(zip(node.args.kwonlyargs, node.args.kw_defaults))
            for parameter, default in pairs:
                path = _relative_literal(default)
                if path and _looks_like_file(path) and any(w in parameter.arg.lower() for w in _PATH_WORDS):
                    found.append((node.lineno, f"{node.name}({parameter.arg}={path!r})"))
    return sorted(set(found))


# Calls that read the file named by their first argument.
_READERS = {"load", "loadtxt", "read_csv", "read_json", "read_parquet", "read_table", "imread", "safe_load"}


def relative_reads(source: str) -> list[str]:
    """Relative file paths ``source`` reads by literal name: ``open("config.json")``,
    ``torch.load("init.pt")``, ``pd.read_csv("data/train.csv")``. Sorted, no duplicates."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name == "open":
            mode = (
                node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            )
            if mode is not None and not (
                isinstance(mode, ast.Constant) and isinstance(mode.value, str) and not set(mode.value) & _WRITE_MODES
            ):
                continue
        elif name not in _READERS:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            path = _relative_literal(arg)
            if path and _looks_like_file(path):
                found.add(path)
    return sorted(found)

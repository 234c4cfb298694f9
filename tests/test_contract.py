"""One typed, versioned event contract (#27 item 4): each event kind's class in
contract/event_types.py is the source of its JSON Schema (which conftest checks every job
history of the suite against), of the checked-in schema document and of the labextension's
TypeScript types (scripts/gen_contract.py); a row of GET /jobs is typed once (server/rows.py)
for the server and the panel; and histories written by an earlier schema version are replayed
from fixtures (tests/data/events/vN/), so a newer kernel reads an older job's history."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema

from notebook_elastic.backends.base import JobInfo
from notebook_elastic.contract.event_types import EVENT_TYPES, SCHEMA_VERSION, Kind, event_schemas
from notebook_elastic.contract.job_state import JobState
from notebook_elastic.jobfolder.history import parse
from notebook_elastic.server.routes import job_json

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "data" / "events"
DOCUMENT = REPO / "notebook_elastic" / "contract" / "events.schema.json"


def test_what_is_generated_from_the_contract_is_current():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_contract.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_kind_has_its_class_and_the_document_is_a_valid_schema():
    assert set(EVENT_TYPES) == set(Kind) == set(event_schemas())
    document = json.loads(DOCUMENT.read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    assert f"schema version {SCHEMA_VERSION}" in document["title"]
    kinds = {d["properties"]["kind"]["const"] for name, d in document["$defs"].items() if name.endswith("Event")}
    assert kinds == {k.value for k in Kind}


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def test_a_v1_history_replays_into_the_same_job():
    """A local job of schema version 1: scaled 1 -> 2, a worker killed, a node preempted with
    notice, succeeded. Every line is an event of the contract, and the fold reads it as it was."""
    path = FIXTURES / "v1" / "local-scale-kill-preempt.jsonl"
    validator = jsonschema.Draft202012Validator(json.loads(DOCUMENT.read_text()))
    for number, line in enumerate(_lines(path), 1):
        errors = [e.message for e in validator.iter_errors(json.loads(line))]
        assert not errors, f"line {number}: {errors[:2]}"
    state = JobState()
    for line in _lines(path):
        event = parse(line)
        assert event is not None
        state.apply(event)
    summary = state.summary()
    assert state.dropped_events == 0
    assert (summary["status"], summary["step"], summary["total_steps"]) == ("succeeded", 39, 40)
    assert (summary["restarts"], summary["max_restarts"], summary["min_nodes"], summary["max_nodes"]) == (1, 3, 1, 2)
    assert [e.get("world_size") for e in state.events if e.kind == Kind.RESUMED] == [2, 2, 1]
    labels = [m.label for m in state.markers]
    assert "world size 1 → 2" in labels and "restart 1/3" in labels and "node-1 left (preempted)" in labels
    assert [str(t["status"]) for t in state.transitions][-1] == "succeeded"

    # And the jobs panel's row of it is a JobRow (the labextension's IJobRow).
    row = job_json(JobInfo("replay", "local", summary["status"], summary, location="/jobs/replay"))
    jsonschema.validate(row, json.loads(DOCUMENT.read_text())["$defs"]["JobRow"])
    assert (row["step"], row["total_steps"], row["restarts"]) == (40, 40, 1)  # steps done, as every view says


def _typed_reads(tree: ast.AST, classes: dict[str, type]) -> Iterator[tuple[int, list[str], str]]:
    """Each key read (``.get("k")``, ``["k"]``) from an event's data seen as its kind's class:
    ``e.fields(Stall).get("step")``, a name bound to ``e.fields(Stall)``, or a parameter
    annotated with contract classes (``d: JobSubmitted | JobResumed``); with the classes."""

    def named(node: ast.AST | None) -> list[str] | None:
        if isinstance(node, ast.Name) and node.id in classes:
            return [node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            left, right = named(node.left), named(node.right)
            return left + right if left and right else None
        return None

    def viewed(node: ast.AST, bound: dict[str, list[str]]) -> list[str] | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fields":
            return named(node.args[0]) if node.args else None
        return None

    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        bound = {a.arg: found for a in function.args.args if (found := named(a.annotation))}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if (found := viewed(node.value, {})) is not None:
                    bound[node.targets[0].id] = found
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                target, key = node.func.value, node.args[0] if node.args else None
            elif isinstance(node, ast.Subscript):
                target, key = node.value, node.slice
            else:
                continue
            found = viewed(target, bound)
            if found and isinstance(key, ast.Constant) and isinstance(key.value, str):
                yield node.lineno, found, key.value


def test_every_field_read_through_a_kind_class_is_that_class_s():
    """mypy checks ``d["k"]`` against a TypedDict but not ``d.get("k")`` (an unknown key reads
    as ``object``, which an f-string or a ``None`` test takes): the fold reads with ``.get``,
    so a misspelt or renamed field of a kind is caught here instead."""
    classes = {t.__name__: t for t in EVENT_TYPES.values()}
    wrong, reads = [], 0
    for path in sorted((REPO / "notebook_elastic").rglob("*.py")):
        for line, names, key in _typed_reads(ast.parse(path.read_text()), classes):
            reads += 1
            lacking = [n for n in names if key not in classes[n].__required_keys__ | classes[n].__optional_keys__]
            if lacking:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {key!r} is no field of {', '.join(lacking)}")
    assert not wrong, "\n".join(wrong)
    assert reads > 50  # the fold's reads are seen (not a check that found nothing to check)


def test_in_the_package_an_untyped_read_of_an_event_is_a_type_error(tmp_path):
    """The package reads an event's fields through its kind's class (``e.fields(Metric)``):
    ``Event.get`` (its value ``Any``: neither key nor type checked) is there for tests and a REPL
    alone, and mypy, which checks the package, does not see it."""
    from notebook_elastic.contract.events import Event

    assert Event(Kind.METRIC, 0.0, None, {"step": 3}).get("step") == 3  # at run time, as ever
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from notebook_elastic.contract.event_types import Kind, Metric\n"
        "from notebook_elastic.contract.events import Event\n"
        "e = Event(Kind.METRIC, 0.0)\n"
        "step = e.get('step')\n"
        "typed = e.fields(Metric).get('step')\n"
    )
    # Strict, as the package's check; past the contract the package is not followed (Any to the
    # checker): Event is the contract's own, and following all of it took a core 30 s.
    config = tmp_path / "mypy.ini"
    config.write_text(
        "[mypy]\nstrict = True\n\n[mypy-notebook_elastic.*]\nfollow_imports = skip\n\n"
        "[mypy-notebook_elastic.contract.*]\nfollow_imports = normal\n"
    )
    done = subprocess.run(
        # (its own cache: a shared one may answer for a probe of the same text at another path)
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            str(probe),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert errors == [f'{probe}:4: error: "Event" has no attribute "get"  [attr-defined]'], done.stdout


def _emitted_fields(tree: ast.AST) -> Iterator[tuple[int, str, list[str]]]:
    """Each event written with its fields named at the call: ``emit("restart", node=..,
    reason=..)``, ``self.emit(Kind.RESTART, name, reason=..)``; the kind and the field names."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if not (
            (isinstance(func, ast.Name) and func.id == "emit")
            or (isinstance(func, ast.Attribute) and func.attr == "emit")
        ):
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            kind = first.value
        elif isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name) and first.value.id == "Kind":
            kind = Kind[first.attr].value
        else:
            continue
        names = [k.arg for k in node.keywords if k.arg is not None and k.arg not in ("node", "t")]
        yield node.lineno, kind, names


def test_every_field_an_event_is_written_with_is_its_kind_s():
    """What each process writes, read against the classes as the fold's reads are: a field the
    class lacks passes the schema (extra properties are allowed, so an old reader takes a new
    event) but no reader knows of it."""
    wrong, calls = [], 0
    for path in sorted((REPO / "notebook_elastic").rglob("*.py")):
        for line, kind, names in _emitted_fields(ast.parse(path.read_text())):
            calls += 1
            cls = EVENT_TYPES.get(Kind(kind))
            if cls is None:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {kind!r} is no kind")
                continue
            fields = cls.__required_keys__ | cls.__optional_keys__
            if lacking := [n for n in names if n not in fields]:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {kind} has no field {', '.join(lacking)}")
    assert not wrong, "\n".join(wrong)
    assert calls > 20


#: The event vocabulary's names: defined in contract/event_types.py and nowhere else.
VOCABULARY = ("Kind", "Status", "SCHEMA_VERSION", "FINAL_STATUSES", "ATTENTION_ORDER", "EVENT_TYPES", "event_schemas")


def _defined(tree: ast.Module) -> set[str]:
    """The names a module defines at its top (classes, assignments) or lists in ``__all__``."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Name):
                names.add(target.id)
                if target.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                    names |= {
                        e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    }
    return names


def test_the_event_vocabulary_is_defined_in_one_place():
    """Kind, Status, SCHEMA_VERSION and the kinds' tables are defined (or re-exported through
    ``__all__``) by contract/event_types.py alone (#38 item 4: they were in runtime/protocol.py,
    runtime/event_types.py and contract/events.py)."""
    package = REPO / "notebook_elastic"
    home = package / "contract" / "event_types.py"
    elsewhere = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted(package.rglob("*.py"))
        if path != home and "labextension" not in path.parts
        for name in sorted(_defined(ast.parse(path.read_text())) & set(VOCABULARY))
        if (str(path.relative_to(package)), name) != ("contract/commands.py", "Status")  # a command: "your status?"
    ]
    assert not elsewhere, "the event vocabulary is defined outside contract/event_types.py:\n" + "\n".join(elsewhere)
    assert set(VOCABULARY) <= _defined(ast.parse(home.read_text()))


#: Strings that look like our cross-process names but are not one: (module, string, why).
NOT_CROSS_PROCESS = {
    ("defaults.py", "NOTEBOOK_ELASTIC_HOME"),  # the user's setting, read by the kernel's side alone
    ("backends/kubernetes/code.py", "notebook_elastic/"),  # file names in the pod's runtime zip
}


def test_every_cross_process_name_is_defined_in_the_protocol_module():
    """Every environment name (``NOTEBOOK_ELASTIC_...``) and every store key of ours
    (``notebook_elastic/...``) the package spells is spelled in contract/protocol.py alone, once
    (#38 item 5: store keys and environment names lived in agent/, runtime/ and backends/ too)."""
    package = REPO / "notebook_elastic"
    protocol = package / "contract" / "protocol.py"
    elsewhere, spelled = [], []
    for path in sorted(package.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
                continue
            text = node.value
            if not (text.lstrip("_").startswith("NOTEBOOK_ELASTIC_") and text.isidentifier()) and not text.startswith(
                "notebook_elastic/"
            ):
                continue
            if path == protocol:
                spelled.append(text)
            elif (str(path.relative_to(package)), text) not in NOT_CROSS_PROCESS:
                elsewhere.append(f"{path.relative_to(REPO)}:{node.lineno}: {text!r}")
    assert not elsewhere, "cross-process names spelled outside contract/protocol.py:\n" + "\n".join(elsewhere)
    twice = sorted({name for name in spelled if spelled.count(name) > 1})
    assert not twice, f"spelled more than once in contract/protocol.py: {twice}"

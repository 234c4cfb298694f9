"""One typed, versioned event contract (#27 item 4): each event kind's class in
runtime/event_types.py is the source of its JSON Schema (which conftest checks every job
history of the suite against), of the checked-in schema document and of the labextension's
TypeScript types (scripts/gen_contract.py); a row of GET /jobs is typed once (server/rows.py)
for the server and the panel; and histories written by an earlier schema version are replayed
from fixtures (tests/data/events/vN/), so a newer kernel reads an older job's history."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from notebook_elastic.backends.base import JobInfo
from notebook_elastic.contract.job_state import JobState
from notebook_elastic.jobfolder.history import parse
from notebook_elastic.runtime.event_types import EVENT_SCHEMAS, EVENT_TYPES, SCHEMA_VERSION
from notebook_elastic.runtime.protocol import Kind
from notebook_elastic.server.routes import job_json

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "data" / "events"
DOCUMENT = REPO / "notebook_elastic" / "runtime" / "events.schema.json"


def test_what_is_generated_from_the_contract_is_current():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_contract.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_kind_has_its_class_and_the_document_is_a_valid_schema():
    assert set(EVENT_TYPES) == set(Kind) == set(EVENT_SCHEMAS)
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

"""A job folder's records planted or damaged as JSON that is not a record (``[]``, a number, a
record without a pid): every reader says "none" or "damaged", never an AttributeError or a
KeyError in whoever lists the jobs (the panel, %elastic_jobs, the CLI)."""

from __future__ import annotations

import json

from notebook_elastic.backends.local import LocalBackend


def test_records_that_are_json_but_not_records_read_as_none_or_damaged(tmp_path):
    backend = LocalBackend(tmp_path / "jobs")
    backend.root.mkdir()
    good = backend.folder("good")
    good.path.mkdir()
    good.spec_file.write_text(json.dumps({"name": "good", "backend": "local", "nnodes": [1, 2]}))
    good.events_file.write_text("")
    for record, planted in (
        (good.status_file, "[]"),
        (good.supervisor_file, "[1, 2]"),
        (good.guardian_file, '{"start_ticks": 5}'),  # a record, but no pid
        (good.secret_file, "3"),
    ):
        record.write_text(planted)
    assert good.status() is None and good.supervisor() is None and good.secret() == {}
    assert not good.supervisor_alive() and not good.guardian_alive()
    bad = backend.folder("bad")
    bad.path.mkdir()
    bad.spec_file.write_text('"a string"')

    listed = {info.name: info for info in backend.list()}
    assert listed["good"].status in ("pending", "lost"), listed["good"]
    assert listed["bad"].status == "damaged"
    assert listed["bad"].damaged == "spec.json is unreadable: spec.json holds a JSON str, not a record"

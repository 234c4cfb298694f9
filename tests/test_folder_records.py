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


def test_one_guardian_per_folder_a_second_exits_at_once_and_leaves_the_firsts_record(tmp_path):
    """Every launch and resume starts a guardian (backends/local/__init__.py); where one runs
    already (it is the one resuming its job, or a kernel's resume met it), the new one finds the
    folder's guardian lock taken and exits without writing guardian.json, which still names the
    first. Once the folder goes, the first ends too."""
    import subprocess
    import sys
    import time

    from notebook_elastic.backends.local import GUARDIAN_MODULE

    folder = LocalBackend(tmp_path / "jobs").folder("guarded")
    folder.path.mkdir(parents=True)  # no supervisor.json: "still starting", the guardian waits
    first = subprocess.Popen([sys.executable, "-m", GUARDIAN_MODULE, str(folder.path)])
    try:
        deadline = time.monotonic() + 60
        while not folder.guardian_file.exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first guardian never said it runs"
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", GUARDIAN_MODULE, str(folder.path)], timeout=60)
        assert second.returncode == 0
        assert folder.read_json(folder.guardian_file)["pid"] == first.pid and folder.guardian_alive()
        assert first.poll() is None
        import shutil

        shutil.rmtree(folder.path)  # the folder deleted: nothing left to guard
        assert first.wait(30) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()

"""The server extension's routes, on a real jupyter_server (pytest-jupyter), against job
folders made by real local jobs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import jsonschema
import pytest
import torch
from conftest import job_processes
from slurm_cluster import CPUS
from test_slurm import launch_queued, on_slurm, slurm, stopped_while_queued  # noqa: F401 (the fixtures)
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from waiting import wait_for

import notebook_elastic as ne
import notebook_elastic.runtime as runtime

# jupyter_server's own pytest plugin (jp_fetch, jp_serverapp), for this module only: its
# autouse fixtures create a ServerApp and an event loop around every test they apply to.
pytest_plugins = ["pytest_jupyter.jupyter_server"]

TRAIN = """
model = torch.nn.Linear(2, 1)
state = elastic.State(model=model)
for step in state.steps(TOTAL):
    elastic.report(step=step, loss=1.0 / (step + 1))
    state.commit()
    time.sleep(0.05)
"""


@pytest.fixture
def jp_server_config(home):
    return {"ServerApp": {"jpserver_extensions": {"notebook_elastic": True}}}


def ns(total):
    return {"torch": torch, "elastic": runtime, "time": time, "TOTAL": total}


#: The generated document (scripts/gen_contract.py): each route's reply, as contract.ts types it.
DOCUMENT = json.loads((Path(ne.__file__).parent / "contract" / "events.schema.json").read_text())


def conforms(reply, name):
    """``reply`` is what the labextension reads it as: its class in server/rows.py (I+name in
    contract.ts), every event in it of its kind's class."""
    jsonschema.validate(reply, {"$ref": f"#/$defs/{name}", "$defs": DOCUMENT["$defs"]})
    return reply


async def get_json(jp_fetch, *path, **params):
    response = await jp_fetch("notebook-elastic", "api", *path, params=params)
    assert response.code == 200
    return json.loads(response.body)


async def poll_json(jp_fetch, predicate, what, *path, timeout=120, **params):
    """GET until ``predicate(reply)`` holds; fail only when it never does."""
    deadline = time.monotonic() + timeout
    while True:
        reply = await get_json(jp_fetch, *path, **params)
        if predicate(reply):
            return reply
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {reply}"
        await asyncio.sleep(0.1)


@pytest.mark.slow  # two real jobs
async def test_jobs_events_and_stop_over_real_job_folders(jp_fetch, home):
    assert (await get_json(jp_fetch, "jobs"))["jobs"] == []

    done = ne.launch(TRAIN, nnodes="1", name="finished-one", user_ns=ns(8))
    live = ne.launch(TRAIN, nnodes="1:2", name="live-one", user_ns=ns(100_000))
    assert done.wait(120) == "succeeded"
    damaged = home / "jobs" / "broken-one"
    damaged.mkdir()
    (damaged / "spec.json").write_text("{not json")

    def settled(reply):  # status.json is rewritten at most 4 times a second: wait for it
        jobs = {j["name"]: j for j in reply["jobs"]}
        live_one = jobs.get("live-one") or {}
        return live_one.get("status") == "running" and (live_one.get("step") or 0) >= 3

    reply = conforms(await poll_json(jp_fetch, settled, "live-one running at step 3", "jobs"), "JobsReply")
    jobs = {j["name"]: j for j in reply["jobs"]}
    assert set(jobs) == {"finished-one", "live-one", "broken-one"}
    assert jobs["finished-one"]["status"] == "succeeded" and jobs["finished-one"]["step"] == 8  # steps done: 8 of 8
    assert jobs["finished-one"]["loss"] == pytest.approx(1 / 8)
    assert len(jobs["finished-one"]["loss_tail"]) >= 2
    assert jobs["live-one"]["status"] == "running" and jobs["live-one"]["world_size"] == 1
    assert (jobs["live-one"]["nodes_running"], jobs["live-one"]["min_nodes"], jobs["live-one"]["max_nodes"]) == (
        1,
        1,
        2,
    )
    assert jobs["live-one"]["waiting"] is None
    assert [t["status"] for t in jobs["finished-one"]["transitions"]][-2:] == ["running", "succeeded"]
    assert jobs["broken-one"]["status"] == "damaged" and "spec.json is unreadable" in jobs["broken-one"]["damaged"]
    assert isinstance(reply["server_ms"], (int, float))  # its speed: benchmarks/jobs_panel.py
    # What needs attention first, ended jobs after (#11: the listing was alphabetical), the
    # same order in GET /jobs, jobs() and %elastic_jobs (which returns jobs()).
    order = ["live-one", "finished-one", "broken-one"]
    assert [j["name"] for j in reply["jobs"]] == order
    assert [j.name for j in ne.jobs()] == order

    first = conforms(await get_json(jp_fetch, "jobs", "live-one", "events", since="0"), "EventsReply")
    kinds = [e["kind"] for e in first["events"]]
    assert kinds[0] == "job_submitted" and "worker_started" in kinds and "metric" not in kinds
    upto = conforms(await get_json(jp_fetch, "jobs", "live-one", "events", since="0", all="1"), "EventsReply")
    again = await poll_json(
        jp_fetch,
        lambda r: r["events"],
        "events after the cursor",
        "jobs",
        "live-one",
        "events",
        since=str(upto["next"]),
        all="1",
    )
    seen = {json.dumps(e, sort_keys=True) for e in upto["events"]}
    assert not [e for e in again["events"] if json.dumps(e, sort_keys=True) in seen]  # only what came after
    assert "job_submitted" not in [e["kind"] for e in again["events"]]

    stopped = json.loads(
        (await jp_fetch("notebook-elastic", "api", "jobs", "live-one", "stop", method="POST", body="{}")).body
    )
    assert conforms(stopped, "StopReply") == {"name": "live-one", "status": "stopped"}
    assert live.wait(60) == "stopped"  # the notebook's handle sees the panel's stop
    assert job_processes(home) == []
    again = json.loads(
        (await jp_fetch("notebook-elastic", "api", "jobs", "live-one", "stop", method="POST", body="{}")).body
    )
    assert again["status"] == "stopped"  # idempotent


async def test_errors_are_clear_and_routes_need_auth(jp_fetch, jp_base_url, jp_serverapp, home):
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("notebook-elastic", "api", "jobs", "no-such-job", "stop", method="POST", body="{}")
    assert info.value.code == 404
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("notebook-elastic", "api", "jobs", "Bad..Name", "events")
    assert info.value.code == 404  # not a job name: the route does not match
    url = f"http://127.0.0.1:{jp_serverapp.port}{jp_base_url}notebook-elastic/api/jobs"
    with pytest.raises(HTTPClientError) as info:
        await AsyncHTTPClient().fetch(url)  # no token
    assert info.value.code == 403


BAD_QUERIES = [
    ({"since": "abc"}, r"since='abc' must be a whole number"),
    ({"since": "-5"}, r"since='-5' must be a whole number"),
    ({"since": "1" * 20}, r"since='1{20}' must be a whole number from 0 to 10\^15"),
    ({"since": "1.5"}, r"since='1.5' must be a whole number"),
    ({"since": "١٢"}, r"must be a whole number"),  # Arabic-Indic digits: str.isdigit() alone says yes
    ({"limit": "abc"}, r"limit='abc' must be a whole number"),
    ({"limit": "-1"}, r"limit='-1' must be a whole number"),
    ({"all": "yes"}, r"all='yes' must be 1, 0, true or false"),
    ({"backend": "lsf"}, r"backend='lsf' is unknown; use one of: local, kubernetes, slurm"),
    ({"backend": "kubernetes"}, r"events are served for local jobs; follow a Kubernetes job with %elastic_attach"),
]


async def test_every_route_refuses_bad_input_with_400_and_a_sentence(jp_fetch, home):
    job = ne.launch(TRAIN, nnodes="1", name="table-job", user_ns=ns(3))
    assert job.wait(120) == "succeeded"
    for params, message in BAD_QUERIES:
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("notebook-elastic", "api", "jobs", "table-job", "events", params=params)
        assert info.value.code == 400, (params, info.value)
        reply = conforms(json.loads(info.value.response.body), "ErrorReply")
        assert re.search(message, reply["message"]), (params, reply)

    everything = conforms(await get_json(jp_fetch, "jobs", "table-job", "events", all="1", limit="5000"), "EventsReply")
    assert len(everything["events"]) > 3
    nothing = await get_json(jp_fetch, "jobs", "table-job", "events", limit="0", since="0")
    assert nothing == {"events": [], "next": 0}
    one = await get_json(jp_fetch, "jobs", "table-job", "events", limit="1", all="1")
    assert one["events"] == everything["events"][:1] and 0 < one["next"] < everything["next"]
    past_the_end = await get_json(jp_fetch, "jobs", "table-job", "events", since=str(10**12), all="1")
    assert past_the_end["events"] == everything["events"][:500]  # a stale cursor starts over
    long_name = "a" * 60
    for path, method, body in [
        (("jobs", long_name, "events"), "GET", None),
        (("jobs", long_name, "stop"), "POST", "{}"),
        (("jobs", "table-job", "stop"), "POST", "[1]"),
        (("jobs", "table-job", "stop"), "POST", '{"backend": "lsf"}'),
        (("jobs", "table-job", "stop"), "POST", "{not json"),
    ]:
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("notebook-elastic", "api", *path, method=method, body=body)
        assert info.value.code == 400, (path, body, info.value)
        assert conforms(json.loads(info.value.response.body), "ErrorReply")["message"], (path, body)


@pytest.mark.slow
async def test_the_panels_stop_on_a_slurm_row_cancels_its_queued_allocation(jp_fetch, on_slurm, home):  # noqa: F811
    """#37 item 2, the panel: its Stop posts the row's backend ("slurm", which the route refused
    as unknown) and the route stopped any job not on Kubernetes as a local one, leaving a
    queued supervisor's allocation to start later and train. The job's folder says where it
    runs: the route stops it as a Slurm job, whatever the body names, and its events are
    served as a local job's are."""
    blocker = subprocess.Popen(
        ["srun", "--partition=ctl", f"--cpus-per-task={CPUS}", "--job-name=blocker", "sleep", "600"],
        env={**os.environ, **on_slurm.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: ("blocker", "RUNNING") in [(n, s) for _, n, s in on_slurm.jobs()], "the ctl partition full")
        for name, body in (("q-panel", None), ("q-named-local", '{"backend": "local"}')):
            thread, result = launch_queued(on_slurm, name)
            [row] = [j for j in (await get_json(jp_fetch, "jobs"))["jobs"] if j["name"] == name]
            assert row["backend"] == "slurm", row
            body = body or json.dumps({"backend": row["backend"]})  # what the panel's Stop sends
            reply = await jp_fetch("notebook-elastic", "api", "jobs", name, "stop", method="POST", body=body)
            assert json.loads(reply.body) == {"name": name, "status": "stopped"}
            stopped_while_queued(on_slurm, home, name, thread, result)
            events = await get_json(jp_fetch, "jobs", name, "events", backend="slurm", all="1")
            assert "job_finished" in [e["kind"] for e in events["events"]], events
    finally:
        blocker.kill()
        blocker.wait(timeout=30)


async def test_a_damaged_job_folder_gets_a_404_or_its_readable_events_with_a_note_never_a_500(jp_fetch, home):
    """No events.jsonl, a folder in its place, lines that are JSON but not events: the route
    answered 500 for each."""
    job = ne.launch(TRAIN, nnodes="1", name="damaged", user_ns=ns(3))
    assert job.wait(120) == "succeeded"
    events = job.backend.folder("damaged").events_file
    whole = await get_json(jp_fetch, "jobs", "damaged", "events", all="1", limit="5000")
    with open(events, "a") as f:
        f.write('[1, 2]\n"text"\n{"kind": "metric", "t": "noon"}\n')
    read = await get_json(jp_fetch, "jobs", "damaged", "events", all="1", limit="5000")
    assert (
        read["events"] == whole["events"]
        and read["note"] == "3 line(s) of events.jsonl are not events and were skipped"
    )
    for damage in ("missing", "a folder"):
        events.unlink() if events.is_file() else None
        if damage == "a folder":
            events.mkdir()
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("notebook-elastic", "api", "jobs", "damaged", "events")
        assert info.value.code == 404, damage
        message = json.loads(info.value.response.body)["message"]
        assert message.startswith("job 'damaged' has no readable event history:"), message


def test_the_panel_row_says_a_stall_and_a_warning_in_words():
    from notebook_elastic.backends.base import JobInfo
    from notebook_elastic.server.routes import job_json

    summary = {
        "stall": {"step": 119, "for_s": 31.0, "stopped": [1], "waiting": [0, 2]},  # 120 steps done
        "warning": "checkpoints are not being saved: /ckpt is full",
    }
    row = job_json(JobInfo("stuck", "local", "running", summary=summary))
    assert row["stall"] == "stalled at step 120 for 31s: rank(s) 1 stopped, rank(s) 0,2 wait for them"
    assert row["warning"] == "checkpoints are not being saved: /ckpt is full"
    assert job_json(JobInfo("fine", "local", "running", summary={}))["stall"] is None


SLOW_SCONTROL = """#!/bin/sh
# A slurmctld that does not answer until the test opens the gate (its own cap: 300 s).
echo $$ >> "{calls}"
n=0
while [ ! -e "{gate}" ] && [ $n -lt 3000 ]; do sleep 0.1; n=$((n + 1)); done
echo "JobId=$4 JobName=ne-remote-supervisor JobState=COMPLETED Reason=None"
"""


def _pids(path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except FileNotFoundError:
        return []


@pytest.mark.slow  # a real job
async def test_a_slurm_that_does_not_answer_never_holds_a_route(jp_fetch, home, tmp_path, monkeypatch):
    """#37 item 5: GET /jobs asked scontrol inline for each job whose supervisor runs in a Slurm
    allocation on another machine; with slurmctld unresponsive, one poll and any other request
    the server had took ~120 s. Slurm is asked by a thread of its own: both routes answer while
    scontrol still has not, and the row follows Slurm once it does."""
    from conftest import pid_alive

    done = ne.launch(TRAIN, nnodes="1", name="here", user_ns=ns(3))
    assert done.wait(120) == "succeeded"
    # A job whose supervisor runs in allocation 4242 on another machine (what run.py writes there).
    remote = home / "jobs" / "remote"
    remote.mkdir(mode=0o700)
    (remote / "spec.json").write_text(json.dumps({"name": "remote", "backend": "slurm", "nnodes": [1, 2]}))
    (remote / "status.json").write_text(json.dumps({"status": "running", "step": 7, "world_size": 1}))
    (remote / "events.jsonl").write_text("")
    supervisor = {"pid": 4321, "host": "node-elsewhere", "slurm_job": "4242", "control": ["node-elsewhere", 1]}
    (remote / "supervisor.json").write_text(json.dumps({**supervisor, "authkey": "00", "started": time.time()}))
    bin_dir, calls, gate = tmp_path / "bin", tmp_path / "scontrol-calls", tmp_path / "gate"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SLOW_SCONTROL.format(calls=calls, gate=gate))
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    try:
        rows = {j["name"]: j for j in (await get_json(jp_fetch, "jobs"))["jobs"]}
        assert rows["remote"]["status"] == "running" and rows["here"]["status"] == "succeeded"
        # Slurm is being asked, in the background, and has not answered.
        deadline = time.monotonic() + 60
        while not [p for p in _pids(calls) if pid_alive(p)]:
            assert time.monotonic() < deadline, "Slurm was never asked while it hung (or asked inline)"
            await asyncio.sleep(0.1)
        asking = [p for p in _pids(calls) if pid_alive(p)]
        again = await get_json(jp_fetch, "jobs")
        events = await get_json(jp_fetch, "jobs", "here", "events", since="0")
        assert [p for p in asking if pid_alive(p)] == asking, "a route answered only once Slurm had"
        assert {j["name"]: j["status"] for j in again["jobs"]} == {"remote": "running", "here": "succeeded"}
        assert events["events"][0]["kind"] == "job_submitted"
        gate.touch()  # Slurm answers: the allocation is over, so the supervisor is gone
        await poll_json(
            jp_fetch,
            lambda r: {j["name"]: j["status"] for j in r["jobs"]}.get("remote") == "lost",
            "the row to follow Slurm's answer",
            "jobs",
        )
    finally:
        gate.touch()
        deadline = time.monotonic() + 30
        while [p for p in _pids(calls) if pid_alive(p)] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)


async def test_a_fifo_in_place_of_a_jobs_file_never_holds_a_route(jp_fetch, home):
    """A FIFO where a job's status.json or events.jsonl belongs blocked its reader, the server's
    event loop, until someone wrote to it. The row is damaged, the events a 404 sentence, and a
    kernel's reader of the history says so in one sentence."""
    job = ne.launch(TRAIN, nnodes="1", name="piped", user_ns=ns(3))
    assert job.wait(120) == "succeeded"
    folder = job.backend.folder("piped")
    for record in ("outcome.json", "status.json", "spec.json"):
        (folder.path / record).unlink()
        os.mkfifo(folder.path / record, 0o600)
    folder.events_file.unlink()
    os.mkfifo(folder.events_file, 0o600)
    try:
        rows = (await asyncio.wait_for(get_json(jp_fetch, "jobs"), 60))["jobs"]
        assert [(r["name"], r["status"], r["damaged"]) for r in rows] == [
            ("piped", "damaged", "spec.json is unreadable: spec.json is not a file")
        ]
        with pytest.raises(HTTPClientError) as info:
            await asyncio.wait_for(jp_fetch("notebook-elastic", "api", "jobs", "piped", "events"), 60)
        assert info.value.code == 404
        message = json.loads(info.value.response.body)["message"]
        assert message.startswith("job 'piped' has no readable event history:"), message
        # Nor a kernel's reader of its history (the CLI's events, attach's follower).
        with pytest.raises(ne.BackendError, match="job 'piped' has no readable event history: events.jsonl is not"):
            list(job.backend.history("piped"))
        with pytest.raises(ne.BackendError, match="job 'piped' has no readable event history: events.jsonl is not"):
            list(job.backend.follow("piped", threading.Event()))
    finally:
        for fifo in ("outcome.json", "status.json", "spec.json", "events.jsonl"):
            (folder.path / fifo).unlink()  # the suite's own checks read histories with open()


WRONG_TYPES = {
    "stall": ("stuck", "'stall' is a str ('stuck'), which a job's status never holds"),
    "gpu": (["a100"], "'gpu' is a list (['a100']), which a job's status never holds"),
    "tracking": (7, "'tracking' is an int (7), which a job's status never holds"),
    "step": ("seven", "'step' is a str ('seven'), which a job's status never holds"),
    # Any other field of the row, read as it is: checked against rows.JobRow, not one by one.
    "world_size": ("two", "'world_size' is a str ('two'), not a whole number or null"),
    "transitions": ([{"status": "running", "at": "noon", "cause": "x"}], "'transitions[0].at' is a str ('noon')"),
    "started_at": ("noon", "'started_at' is a str ('noon'), not a number or null"),  # the list's order reads it
    "loss": ("low", "'loss' is a str ('low'), not a number or null"),
}


@pytest.mark.slow  # a real job
async def test_a_status_with_a_field_of_the_wrong_type_is_one_damaged_row_not_a_500(jp_fetch, home):
    """#37 item 10: one status.json with a stall string, a gpu list, a tracking number or a step
    that is not a number made GET /jobs a 500 for every job. That job is listed as damaged,
    saying which field; the others as they are."""
    import shutil

    job = ne.launch(TRAIN, nnodes="1", name="sound", user_ns=ns(3))
    assert job.wait(120) == "succeeded"
    sound = job.backend.folder("sound").path
    for key, (value, _said) in WRONG_TYPES.items():
        bad = sound.parent / f"bad-{key.replace('_', '-')}"
        shutil.copytree(sound, bad, ignore=shutil.ignore_patterns(".procs"))
        status = json.loads((bad / "status.json").read_text())
        (bad / "status.json").write_text(json.dumps({**status, key: value}))
        (bad / "outcome.json").write_text("")  # the outcome would be read instead of status.json
    bad_spec = sound.parent / "bad-spec"  # the row's backend comes from spec.json
    shutil.copytree(sound, bad_spec, ignore=shutil.ignore_patterns(".procs"))
    (bad_spec / "spec.json").write_text(json.dumps({**json.loads((sound / "spec.json").read_text()), "backend": 5}))
    rows = {r["name"]: r for r in (await get_json(jp_fetch, "jobs"))["jobs"]}
    assert (rows["bad-spec"]["status"], rows["bad-spec"]["backend"]) == ("damaged", "5")
    assert rows["bad-spec"]["damaged"].startswith("'backend' is an int (5), not text in its records")
    assert rows["sound"]["status"] == "succeeded" and rows["sound"]["step"] == 3 and rows["sound"]["damaged"] is None
    for key, (_value, said) in WRONG_TYPES.items():
        row = rows[f"bad-{key.replace('_', '-')}"]
        assert row["status"] == "damaged" and row["step"] is None, row
        assert row["damaged"].startswith(said) and row["damaged"].endswith(
            f"in its records ({row['location']}); the row cannot show it until that is fixed"
        ), row["damaged"]
    assert {j.name for j in ne.jobs()} == set(rows)  # the listing's order reads started_at: it lists them all


async def test_a_listing_past_its_deadline_answers_with_the_last_one_and_says_so(jp_fetch, home, monkeypatch):
    """GET /jobs reads the job folders in a thread of its own and waits for it at most LIST_S:
    a listing that takes longer (a slow disk, a reader that waits on a cluster) is answered with
    the last listing, said beside it, and never holds the server. LIST_S = 0: every listing is
    late."""
    from notebook_elastic.server import routes

    monkeypatch.setattr(routes, "LIST_S", 0.0)
    damaged = home / "jobs" / "broken"
    damaged.mkdir(parents=True)
    (damaged / "spec.json").write_text("{not json")
    first = await get_json(jp_fetch, "jobs")  # late: no rows yet, or those of a listing that just finished
    assert first["errors"]["local"].startswith(f"reading the job folders in {home / 'jobs'} took over 0 s")
    later = await poll_json(jp_fetch, lambda r: r["jobs"], "the late listing's rows", "jobs")
    assert [j["name"] for j in later["jobs"]] == ["broken"]
    assert re.fullmatch(
        r"reading the job folders in .* took over 0 s; these rows are from \d\d:\d\d:\d\d", later["errors"]["local"]
    )

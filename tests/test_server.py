"""The server extension's routes, on a real jupyter_server (pytest-jupyter), against job
folders made by real local jobs."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
import torch
from conftest import job_processes
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

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

    reply = await poll_json(jp_fetch, settled, "live-one running at step 3", "jobs")
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

    first = await get_json(jp_fetch, "jobs", "live-one", "events", since="0")
    kinds = [e["kind"] for e in first["events"]]
    assert kinds[0] == "job_submitted" and "worker_started" in kinds and "metric" not in kinds
    upto = await get_json(jp_fetch, "jobs", "live-one", "events", since="0", all="1")
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
    assert stopped == {"name": "live-one", "status": "stopped"}
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
    ({"backend": "slurm"}, r"backend='slurm' is unknown; use one of: local, kubernetes"),
    ({"backend": "kubernetes"}, r"events are served for local jobs; follow a Kubernetes job with %elastic_attach"),
]


async def test_every_route_refuses_bad_input_with_400_and_a_sentence(jp_fetch, home):
    job = ne.launch(TRAIN, nnodes="1", name="table-job", user_ns=ns(3))
    assert job.wait(120) == "succeeded"
    for params, message in BAD_QUERIES:
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("notebook-elastic", "api", "jobs", "table-job", "events", params=params)
        assert info.value.code == 400, (params, info.value)
        reply = json.loads(info.value.response.body)
        assert re.search(message, reply["message"]), (params, reply)

    everything = await get_json(jp_fetch, "jobs", "table-job", "events", all="1", limit="5000")
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
        (("jobs", "table-job", "stop"), "POST", '{"backend": "slurm"}'),
        (("jobs", "table-job", "stop"), "POST", "{not json"),
    ]:
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("notebook-elastic", "api", *path, method=method, body=body)
        assert info.value.code == 400, (path, body, info.value)
        assert json.loads(info.value.response.body)["message"], (path, body)


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

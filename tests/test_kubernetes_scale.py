"""Following a big job on a bounded number of log streams (#16 item 6).

A job of 24 light pods (tests/k8s_light.py: pods print the lines an agent and its worker
print, without torch) on the fixture cluster, followed by the real follower through the real
client. The fixture counts the log requests it answers at once: the follower may hold at most
``LOG_STREAMS_MAX`` followed streams and ``CATCH_UP_READERS`` one-shot reads, however many
pods there are (before: one followed stream per pod), and still every line users saw before
arrives: rank 0's losses (rank 0 lives on the last pod, so the follower must find it), a
failing pod's traceback, every rank's start (the rank map), each once.
"""

from __future__ import annotations

import os
import re
import threading

import k8s_light
import pytest
from k8s_apiserver import FakeCluster
from waiting import wait_for

from notebook_elastic.backends.kubernetes.client import connect
from notebook_elastic.backends.kubernetes.cursor import LogCursor
from notebook_elastic.backends.kubernetes.follow import ClusterFollower
from notebook_elastic.backends.kubernetes.logs import CATCH_UP_READERS, LOG_STREAMS_MAX
from notebook_elastic.contract.event_types import Kind

NODES = 24
FAILING = 5


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    fake = FakeCluster(gpu_slots=0)
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    yield fake
    fake.close()


@pytest.fixture
def followed(cluster):
    """The light job, and its follower running in a thread: (follower, events seen)."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    k8s_light.create(api, k8s_light.light_job("big", NODES, failing_index=FAILING))
    stop = threading.Event()
    follower = ClusterFollower(connect(), "big", stop)
    seen: list = []
    thread = threading.Thread(target=lambda: seen.extend(follower), daemon=True)
    thread.start()
    yield follower, seen
    stop.set()
    thread.join(10)


def pod_of(cluster, index):
    return next(
        p["metadata"]["name"]
        for p in cluster.pods()
        if p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == str(index)
        and p["status"].get("phase") == "Running"
    )


@pytest.mark.slow
def test_a_big_job_is_followed_on_a_bounded_number_of_streams_and_loses_nothing(cluster, followed):
    follower, seen = followed

    def metrics():
        return [e for e in list(seen) if e.kind == Kind.METRIC]

    wait_for(lambda: len(metrics()) >= 20, "rank 0's losses")
    started = lambda: {e.node for e in list(seen) if e.kind == Kind.WORKER_STARTED}  # noqa: E731
    wait_for(lambda: len(started()) == NODES, f"every rank's start (seen {len(started())})")
    failed = lambda: [e for e in list(seen) if e.kind == Kind.WORKER_FAILED]  # noqa: E731
    wait_for(lambda: failed(), "the failing pod's failure")
    assert "ZeroDivisionError" in failed()[0].get("traceback"), failed()[0]
    assert failed()[0].node == pod_of(cluster, FAILING)
    count = len(metrics())
    wait_for(lambda: len(metrics()) >= count + 10, "rank 0's losses, still")

    # Old code: one followed stream per pod (24 at once).
    assert cluster.log_follows_peak <= LOG_STREAMS_MAX, (cluster.log_follows_peak, LOG_STREAMS_MAX)
    assert cluster.log_reads_peak <= CATCH_UP_READERS, (cluster.log_reads_peak, CATCH_UP_READERS)
    steps = [e.get("step") for e in metrics()]
    assert len(steps) == len(set(steps)), "a line was told twice"
    assert {e.node for e in metrics()} == {pod_of(cluster, NODES - 1)}

    # On demand: a pod someone opens is followed live, within the bound.
    asked = pod_of(cluster, 10)
    follower.follow_pod(asked)
    wait_for(lambda: asked in follower.logs.held, "the asked-for pod followed")
    assert cluster.log_follows_peak <= LOG_STREAMS_MAX, cluster.log_follows_peak


def test_overlapping_reads_of_one_log_deliver_each_line_once():
    """A catch-up may read a pod beside its followed stream, or a reconnect re-read the last
    second: lines with equal timestamps included, whichever read reaches a line first tells it."""
    log = [("t1", "a"), ("t2", "b"), ("t2", "c"), ("t3", "d"), ("t3", "e"), ("t3", "f"), ("t4", "g")]
    cursor, told = LogCursor(), []
    first, second = cursor.reading(), cursor.reading()
    # The second read passes the first; the first then meets the second's last timestamp
    # (the follower's old per-read count told "e" twice here).
    reads = [(first, log[:2]), (second, log[:5]), (first, log[2:]), (cursor.reading(), log)]
    for keep, lines in reads:
        told += [text for stamp, text in lines if keep(stamp)]
    assert told == list("abcdefg")


@pytest.mark.slow
def test_a_node_picked_in_the_dashboard_is_followed_live_within_the_bound(cluster):
    """The other half of "the rest on demand": the dashboard's "output of" menu lists the
    job's pods; the one picked is followed live through the job (ElasticJob.follow_output),
    taking a slot before pods nobody asked for, and the pane shows its lines only."""
    from kubernetes import config

    from notebook_elastic.backends.kubernetes import KubernetesBackend
    from notebook_elastic.errors import BackendError
    from notebook_elastic.kernel.job import ElasticJob
    from notebook_elastic.kernel.ui import Dashboard

    api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    k8s_light.create(api, k8s_light.light_job("picked", 8, quiet_every_s=0.5))
    job = ElasticJob("picked", KubernetesBackend())
    job._follow()
    dash = Dashboard(job)
    try:
        wait_for(lambda: len(job.state.nodes) == 8, "every pod among the job's nodes")
        wait_for(lambda: len(job._stream.logs.held) == LOG_STREAMS_MAX, "the follower's streams")
        # Not followed by default: the lead (rank 0, index 7) and the first indexes are.
        running = lambda: [p for p in cluster.pods() if p["status"].get("phase") == "Running"]  # noqa: E731
        wait_for(lambda: len(running()) == 8, "every pod running")
        picked = next(p for p in (pod_of(cluster, i) for i in range(8)) if p not in job._stream.logs.held)
        wait_for(lambda: picked in [value for _label, value in dash.output_of.options], "the pod in the menu")
        dash.output_of.value = picked
        wait_for(lambda: picked in job._stream.logs.held, "the picked pod followed live")
        assert len(job._stream.logs.held) <= LOG_STREAMS_MAX
        wait_for(lambda: f"[{picked}] rank" in dash.logs.value, "its lines in the pane")
        assert not [line for line in re.findall(r"\[([^\]]+)\] rank", dash.logs.value) if line != picked]
        # Back to every node: its slot is given back.
        dash.output_of.value = ""
        wait_for(lambda: picked not in job._stream.logs.asked, "the ask withdrawn")
        with pytest.raises(BackendError, match=r"has no node named 'nope' \(its nodes: "):
            job.follow_output("nope")
    finally:
        dash.close()
        job.detach()


def test_rank_0s_pod_is_known_from_any_pods_first_line_at_any_size(cluster):
    """#40: a round of more than 64 nodes tells no members in its lines (a million entries at
    1,024 nodes), so the follower found rank 0's pod only by reading that pod's own log: at 1,024
    light pods it read ~1,000 logs first, and losses arrived ~55 s after the pods started. Every
    agent's rendezvous line now names group rank 0 (``lead``), at any size: the first line of
    any followed pod tells whose losses to stream."""
    from notebook_elastic.backends.kubernetes.logs import LogFollower
    from notebook_elastic.backends.kubernetes.pods import PodView
    from notebook_elastic.backends.kubernetes.watch import Followed
    from notebook_elastic.contract.events import Event

    stop = threading.Event()
    pods = {
        f"big-workers-{i}": PodView(f"big-workers-{i}", running_seen=True, ip=f"10.0.0.{i}", index=i) for i in range(3)
    }
    logs = LogFollower(
        Followed(connect(), "big", stop, lambda *a, **k: None),
        pods,
        threading.Lock(),
        lambda e: None,
        lambda e, what: None,
    )
    lead = {"addr": "10.0.0.2", "pid": 7, "local_id": 0, "group_rank": 0}
    first = {"round": 0, "group_rank": 1999, "group_world_size": 2048, "lead": lead}  # no members: too many
    logs._told(pods["big-workers-0"], Event(kind=Kind.RENDEZVOUS, time=1.0, node="big-workers-0", data=first))
    assert logs.lead == "big-workers-2"
    assert logs._wanted()[0] == "big-workers-2"  # followed first

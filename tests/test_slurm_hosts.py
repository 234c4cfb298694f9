"""The Slurm backend across real hosts (tests/slurm_hosts.py: two network namespaces on a
bridge, one slurmd each, slurmctld in the root namespace): the job's supervisor, its nodes and
the kernel (this process) are on three machines as far as the network and the host names go.
A host partitioned away is a lost node the job trains on without (in place), and it joins
again when the host comes back; a supervisor on another host is read running or lost from its
Slurm allocation, never from a pid of that host."""

from __future__ import annotations

import time

import pytest
from slurm_hosts import SlurmHosts, why_not
from test_slurm import STORY, user_ns
from waiting import wait_for

import notebook_elastic as ne
from notebook_elastic.agent.store_link import STORE_CALL_TIMEOUT_S
from notebook_elastic.contract.event_types import Kind
from notebook_elastic.jobfolder.folder import JobFolder

pytestmark = pytest.mark.slow

TRAIN = STORY  # test_slurm.py's cell: it reports each sample's start, for the exactly-once check


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = why_not()
    if reason:
        pytest.skip(reason)
    cluster = SlurmHosts(tmp_path_factory.mktemp("slurm-hosts")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def on_hosts(hosts, monkeypatch, home):
    for key, value in hosts.env.items():
        monkeypatch.setenv(key, value)
    yield hosts
    hosts.run("scancel", "--user", "root")


def _hosts_of(job) -> dict[str, str]:
    """node -> the host its newest agent runs on (its agent_started event)."""
    return {e.node: e.get("host") for e in job.events if e.kind == Kind.AGENT_STARTED}


def _rank0_sizes(job) -> list[int]:
    return [e.get("world_size") for e in job.events if e.kind == Kind.WORKER_STARTED and e.get("rank") == 0]


def test_a_job_across_two_hosts_trains_on_through_a_partition_and_grows_back(on_hosts, home):
    """A 1:2 job, its supervisor in a ``ctl`` allocation on host A, a node on each host; host B
    is partitioned (its link down: nothing is reset, packets are lost). The job notices the lost
    node and trains on at 1 in place (host A's worker keeps its process), and its listing says
    running (its supervisor runs on another host: Slurm says so). The link comes back: the job
    grows back to 2 and finishes every step with each sample once. Then its supervisor's
    allocation is scancelled (by id): the job reads lost."""
    a, b = on_hosts.names
    total = 450
    job = ne.launch(
        TRAIN,
        backend="slurm",
        nnodes="1:2",
        nodes=2,
        supervisor_in="ctl",
        max_restarts=0,
        name="apart",
        user_ns=user_ns(total),
    )
    folder = JobFolder(home / "jobs" / "apart")
    try:
        wait_for(lambda: job.world_size == 2 and (job.state.step or 0) >= 10, "two hosts training", job=job)
        supervised = folder.supervisor() or {}
        assert supervised.get("host") == a and supervised.get("slurm_job"), supervised
        placed = _hosts_of(job)
        assert sorted(placed.values()) == [a, b], placed  # a node on each host
        [on_a] = [node for node, host in placed.items() if host == a]
        [on_b] = [node for node, host in placed.items() if host == b]
        pids_on_a = {e.get("pid") for e in job.events if e.kind == Kind.WORKER_STARTED and e.node == on_a}
        assert len(pids_on_a) == 1, pids_on_a

        on_hosts.partition(b)
        partitioned_at, cut = len(job.events), time.monotonic()
        wait_for(
            lambda: any(e.kind == Kind.IN_PLACE and e.get("world_size") == 1 for e in job.events[partitioned_at:]),
            "the job on at 1, in place",
            job=job,
        )
        [lost] = [e for e in job.events[partitioned_at:] if e.kind == Kind.IN_PLACE and e.get("world_size") == 1]
        assert lost.get("reason") == "lost" and lost.get("kept") == 1, lost.data
        at_one = job.state.step or 0
        # Cut off past the agents' store-call deadline (agent/store_link.py: 15 s): host B's
        # agent has found the store silent, as after a real partition, not a blip.
        wait_for(
            lambda: (job.state.step or 0) >= at_one + 10 and time.monotonic() - cut > STORE_CALL_TIMEOUT_S + 5,
            "training at 1 for a while",
            job=job,
        )
        assert job.world_size == 1 and job.status == "running", job.summary()
        # Host A's worker kept its process: every start of it (the first, and in place) one pid.
        assert {e.get("pid") for e in job.events if e.kind == Kind.WORKER_STARTED and e.node == on_a} == pids_on_a
        # The listing reads the job's supervisor running, on another host (Slurm says so).
        assert job.backend.describe("apart").status == "running"
        [listed] = [info for info in ne.jobs("slurm") if info.name == "apart"]
        assert listed.status == "running", listed

        # Slurm never took host B down (cut off for less than SlurmdTimeout): no admin's
        # `scontrol update nodename=... state=resume` is needed for its node to come back.
        assert "down" not in on_hosts.node_states()[b], on_hosts.node_states()
        on_hosts.heal(b)
        healed_at = len(job.events)
        wait_for(
            lambda: any(
                e.kind == Kind.WORKER_STARTED and e.get("rank") == 0 and e.get("world_size") == 2
                for e in job.events[healed_at:]
            ),
            "grown back to 2",
            job=job,
        )
        # Told as the group that trained on saw it: host B's node joined it (1 -> 2). Host B's
        # worker kept its process, heard its old group of 2 break and said "lost"; taken as the
        # change, it read "a node was lost: 2 -> 2 ranks in place".
        wait_for(lambda: any(e.kind == Kind.IN_PLACE for e in job.events[healed_at:]), "told in place", job=job)
        [back] = [e for e in job.events[healed_at:] if e.kind == Kind.IN_PLACE]
        said = (back.get("reason"), back.get("from_world_size"), back.get("world_size"), back.get("kept"))
        assert said == ("joined", 1, 2, 2), back.data  # both kept their processes; B took the live values
        assert back.get("source") == 0, back.data
        assert job.wait(timeout=300) == "succeeded", job.summary()
        latest: dict[int, dict[int, list[int]]] = {}
        for e in job.history():
            values = e.data.get("values", {})
            if e.kind == Kind.METRIC and "start" in values:
                latest.setdefault(e.data["step"], {}).setdefault(values["gen"], []).append(values["start"])
        starts = sorted(s for by_gen in latest.values() for s in by_gen[max(by_gen)])
        assert sorted(latest) == list(range(total)), sorted(set(range(total)) - set(latest))
        assert starts == list(range(0, len(starts) * 8, 8)), "a sample was trained twice or skipped"
        assert job.restarts == 0, job.summary()
        sizes = _rank0_sizes(job)
        assert (sizes[0], min(sizes), sizes[-1]) == (2, 1, 2), sizes
        assert {e.get("pid") for e in job.events if e.kind == Kind.WORKER_STARTED and e.node == on_a} == pids_on_a
    finally:
        job.stop()


def test_a_supervisor_on_another_host_is_steered_and_read_running_then_lost_from_its_allocation(on_hosts, home):
    """The job's supervisor runs on host A, with pids of its own: a pid there means nothing
    here. From this process (another host) the job is scaled onto host B over its control
    channel, and the kill-a-worker drill reaches a worker of host B (its pid is host B's: its
    node's keeper kills it there). The listing reads the supervisor running while its allocation
    runs, and lost once that allocation's batch step is SIGKILLed (``scancel --batch
    --signal=KILL`` by its id: the supervisor writes nothing; a plain scancel is a SIGTERM, on
    which it stops the job), from Slurm; stopping the lost job cancels what it left in Slurm."""
    a, b = on_hosts.names
    job = ne.launch(
        TRAIN,
        backend="slurm",
        nnodes="1:2",
        nodes=1,
        supervisor_in="ctl",
        name="far",
        user_ns=user_ns(100_000),
    )
    folder = JobFolder(home / "jobs" / "far")
    try:
        wait_for(lambda: job.world_size == 1 and (job.state.step or 0) >= 3, "training", job=job)
        supervised = folder.supervisor() or {}
        assert supervised.get("host") == a and supervised.get("slurm_job"), supervised
        assert job.backend.describe("far").status == "running"
        [listed] = [info for info in ne.jobs("slurm") if info.name == "far"]
        assert listed.status == "running", listed

        job.scale(2)  # host A is full (the supervisor and node-0): node-1 goes to host B
        wait_for(lambda: job.world_size == 2 and job.status == "running", "two hosts training", job=job)
        assert _hosts_of(job) == {"node-0": a, "node-1": b}, _hosts_of(job)
        before = len(job.events)
        [rank_on_b] = [e.get("rank") for e in job.events if e.kind == Kind.WORKER_STARTED and e.node == "node-1"]
        killed = job.kill_worker(rank_on_b)
        assert killed["node"] == "node-1", killed
        wait_for(
            lambda: any(
                e.kind == Kind.RESTART and e.get("reason") == "worker_failed" and e.node == "node-1"
                for e in job.events[before:]
            ),
            "host B's killed worker restarted",
            job=job,
        )
        wait_for(
            lambda: (
                any(
                    e.kind == Kind.WORKER_STARTED and e.node == "node-1" and e.get("pid") != killed["pid"]
                    for e in job.events[before:]
                )
                and job.world_size == 2
                and job.status == "running"
            ),
            "a new worker on host B, two hosts training again",
            job=job,
        )

        on_hosts.run("scancel", "--batch", "--signal=KILL", str(supervised["slurm_job"]), check=True)
        wait_for(lambda: job.backend.describe("far").status == "lost", "the job read lost", timeout=60)
        [listed] = [info for info in ne.jobs("slurm") if info.name == "far"]
        assert listed.status == "lost", listed
    finally:
        job.stop()
    deadline = time.monotonic() + 30
    while on_hosts.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not on_hosts.jobs(), on_hosts.jobs()  # the lost job's stop cancelled what it left

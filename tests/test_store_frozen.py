"""A rendezvous store that freezes without resetting its connections (#17): its process
stopped (SIGSTOP), or its node cut off by a partition that drops packets. torch's store client
then waits for a reply far past its own timeout (torch 2.13: ``get``, ``compare_set``, ``add``,
``check`` and the constructor still blocked after 60 s with a 5 s timeout), and torchrun's
agents hung with it. Now every rendezvous store call has a deadline (store_link), and one
that passes it is a lost connection.

Real processes throughout: the store is ``python -m notebook_elastic.store.run``, the
client is our rendezvous backend (torch's C10dRendezvousBackend, subclassed) in a Python process of its own
(store_link.rendezvous_backend), and the cluster test freezes the store pod's real process through the fixture."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from test_kubernetes_backend import TRAIN, cluster, ns  # noqa: F401 (cluster: the fixture)
from waiting import wait_for

import notebook_elastic as ne
from notebook_elastic.backends.kubernetes import manifests as m
from notebook_elastic.backends.kubernetes.pods import STORE_CUT_OFF
from notebook_elastic.contract import protocol
from notebook_elastic.contract.event_types import Kind

# What must hold on every torch of the declared range (scripts/torch_range.py).
pytestmark = pytest.mark.torch_contract

# Long enough for a loaded 2-core machine; old code never answers at all.
ANSWER_BOUND_S = 120

CLIENT = textwrap.dedent(
    """
    import json, signal, sys
    from datetime import timedelta
    import torch.distributed as dist
    from notebook_elastic.agent import notebook_agent, rounds, store_link

    port, replaceable = int(sys.argv[1]), sys.argv[2] == "1"
    store_link.STORE_CALL_TIMEOUT_S = 2.0
    replaced = []
    link = store_link.StoreLink()  # this client's, as an agent's
    rendezvous, agent = rounds.RendezvousHooks(), notebook_agent.AgentHooks()
    notebook_agent.hook_store_reconnect(link, rendezvous, agent, lambda: 7, replaced.append, replaceable=replaceable)
    original = store_link._reconnect  # say when the client gives up on the silent store and waits for it

    def _reconnect(*args, **kwargs):
        print(json.dumps({"reconnecting": True}), flush=True)
        return original(*args, **kwargs)

    store_link._reconnect = _reconnect
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=6))
    # Our handler's backend (torch's, with the deadline and the reconnection).
    backend = store_link.rendezvous_backend(store, "frozen", link)
    backend.set_state(b"round 3")
    print(json.dumps({"ready": True}), flush=True)
    # As torchrun's agent does: SIGTERM (the kubelet's, a scale-down's) raises in the main thread.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for line in sys.stdin:
        print(json.dumps({"calling": True}), flush=True)
        try:
            state = backend.get_state()
            print(json.dumps({"state": state[0].decode(), "replaced": replaced}), flush=True)
        except Exception as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Lines:
    """A child's JSON lines on stdout, read on a thread, each awaited with a bound."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def next(self, what: str, calling: bool = False) -> dict:
        """The next line (a ``calling`` line, said before each call, only when asked for)."""
        while True:
            try:
                line = self.lines.get(timeout=ANSWER_BOUND_S)
            except queue.Empty:
                raise AssertionError(f"no answer in {ANSWER_BOUND_S} s: {what}") from None
            if calling or not line.get("calling"):
                return line


@pytest.fixture
def frozen_store(tmp_path):
    """``start(replaceable) -> (store, client, lines)``: a real store process and a rendezvous
    client of it; the store is thawed and both are killed afterwards."""
    procs: list[subprocess.Popen] = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))

    def start(replaceable: bool):
        port = _free_port()
        store = _serve_store(port, env, procs)
        script = tmp_path / "client.py"
        script.write_text(CLIENT)
        client = subprocess.Popen(
            [sys.executable, str(script), str(port), "1" if replaceable else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        procs.append(client)
        lines = _Lines(client)
        assert lines.next("the client connected").get("ready")
        return store, client, lines

    yield start
    _thaw_and_kill(procs)


def _serve_store(port: int, env: dict, procs: list) -> subprocess.Popen:
    """A real store process serving on ``port``, once it says it is ready."""
    store = subprocess.Popen(
        [sys.executable, "-m", "notebook_elastic.store.run", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    procs.append(store)
    assert "store_ready" in store.stdout.readline()  # type: ignore[union-attr]
    return store


def _thaw_and_kill(procs: list) -> None:
    for proc in procs:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(proc.pid, sig)
            except OSError:
                pass
        proc.wait()


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until every thread of it is stopped: the signal is not
    synchronous, and on a loaded machine the store's server thread, woken by a request before
    the stop reached it, answered one more call."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + ANSWER_BOUND_S
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
                    states.append(f.read().rsplit(b")", 1)[1].split()[0])
            except OSError:
                pass
        if states and all(state in (b"T", b"t") for state in states):
            return
        assert time.monotonic() < deadline, f"the store never stopped: {states}"
        time.sleep(0.01)


def _ask(client: subprocess.Popen) -> None:
    client.stdin.write("get_state\n")  # type: ignore[union-attr]
    client.stdin.flush()  # type: ignore[union-attr]


def test_a_frozen_store_that_never_answers_ends_the_call_with_one_sentence(frozen_store):
    """Locally the store is the supervisor's own: a frozen one is waited for (the store's
    timeout), then the call fails with a sentence naming the store and what happened to it,
    which the agent prints as it exits. Old code: the call never returned."""
    store, client, lines = frozen_store(replaceable=False)
    _ask(client)
    assert lines.next("the store answered")["state"] == "round 3"
    freeze(store.pid)
    _ask(client)
    answer = lines.next("the call on the frozen store")
    while answer.get("reconnecting"):
        answer = lines.next("the call on the frozen store, after waiting for it")
    assert answer.get("error") == "RendezvousConnectionError", answer
    assert "stopped answering" in answer["message"] and f":{store.args[-1]}" in answer["message"], answer
    assert "\n" not in answer["message"]


@pytest.mark.parametrize("replaceable", [False, True])
def test_a_store_that_answers_again_is_the_same_store(frozen_store, replaceable):
    """A store frozen for longer than a call's deadline and then thawed (a stopped supervisor
    continued, a long pause of its node): the client waits for it and carries on with the same
    state, no replacement taken, no round re-formed. Old code: no waiting for a store at all
    (the call just hung in C++, past its deadline, until the thaw)."""
    store, client, lines = frozen_store(replaceable=replaceable)
    freeze(store.pid)
    _ask(client)
    assert lines.next("the client gave up on the frozen store's reply").get("reconnecting")
    os.kill(store.pid, signal.SIGCONT)
    answer = lines.next("the call once the store answers again")
    assert answer == {"state": "round 3", "replaced": []}, answer


def test_a_node_told_to_stop_while_its_store_is_frozen_stops(frozen_store):
    """SIGTERM (the kubelet deleting the worker pod, a scale-down) reaches an agent whose store
    call waits on a frozen store: its handler (torchrun's raises in the main thread) runs at
    once. Old code: the main thread sat in C++ waiting for the reply, so the Python handler
    never ran and only the kubelet's SIGKILL, a grace period later, ended it."""
    store, client, lines = frozen_store(replaceable=True)
    freeze(store.pid)
    _ask(client)
    assert lines.next("the client began its call", calling=True).get("calling")
    _in_a_blocking_wait(client.pid)
    client.send_signal(signal.SIGTERM)
    assert client.wait(ANSWER_BOUND_S) == 143


def _in_a_blocking_wait(pid: int) -> None:
    """Until every thread of ``pid`` sleeps (the call under way, not the print before it)."""
    for _ in range(ANSWER_BOUND_S * 10):
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        if states and all(s == "S" for s in states):
            return
        time.sleep(0.1)
    raise AssertionError(f"the client never waited: {states}")


# -- the store pod's node cut off ---------------------------------------------------------------


@pytest.mark.slow
def test_a_job_survives_its_store_pod_cut_off_by_a_partition(cluster):  # noqa: F811 (the fixture)
    """The store pod's node drops out of the network: its store process freezes, holding the
    agents' connections open without a reply or a reset, and the node controller evicts the
    pod, which its Deployment replaces: the notebook says so once ("its node stopped
    answering"). The agents give up on the silent store at their calls'
    deadline, find the new one and re-form their round on it: training resumes from the latest
    checkpoint, a membership change, nothing charged. Old code: the agents' store calls hung
    (for the kernel's ~15 minutes of retransmissions on a real network, forever here); then, no
    ``store_lost`` for a pod that stays Terminating."""
    name = "store-cut"
    job = ne.launch(
        TRAIN,
        backend="kubernetes",
        nnodes="1:2",
        nodes=2,
        nproc_per_node=1,
        gpus=0,
        pvc="ckpt",
        name=name,
        max_restarts=1,
        checkpoint_every=1,
        user_ns=ns(),
    )
    wait_for(lambda: job.world_size == 2 and (job.state.step or 0) >= 5, "two pods training", job=job)
    (store,) = cluster.pods(selector=m.selector(name, "rendezvous"))
    workers_before = set(job.nodes)
    round_before = max(e.get("round") for e in job.events if e.kind == Kind.RENDEZVOUS)
    cluster.cut_off(store["metadata"]["name"])
    step = job.state.step or 0

    def regrouped() -> bool:
        assert job.status not in ("failed", "succeeded", "stopped"), job.summary()
        replaced = [e for e in job.events if e.kind == Kind.RESTART and e.get("reason") == "store_replaced"]
        replaced += [e for e in job.events if e.kind == Kind.IN_PLACE and e.get("reason") == "store"]
        latest = {e.node: e.get("round") for e in job.events if e.kind == Kind.RENDEZVOUS}
        return (
            bool(replaced)
            and all(latest.get(n, -1) > round_before for n in workers_before)
            and job.world_size == 2
            and job.status == "running"
            and (job.state.step or 0) > step + 5
            and any(e.kind in (Kind.RESUMED, Kind.IN_PLACE) and e.get("step", -1) >= step for e in job.events)
        )

    wait_for(regrouped, "both agents re-formed their round on the replacement store", timeout=300, job=job)
    # The notebook said why the agents regroup, once: the pod is never confirmed deleted (no
    # kubelet), so its eviction for an unreachable node is the news. Old code: only a DELETED
    # store pod was told, and this one stays Terminating: nothing was said.
    lost = [e for e in job.events if e.kind == Kind.STORE_LOST]
    assert [(e.node, e.get("reason")) for e in lost] == [(store["metadata"]["name"], STORE_CUT_OFF)], lost
    assert "its node stopped answering" in lost[0].describe()
    serving = [
        p for p in cluster.pods(selector=m.selector(name, "rendezvous")) if not p["metadata"].get("deletionTimestamp")
    ]
    assert [p["metadata"]["uid"] for p in serving] != [store["metadata"]["uid"]]
    assert job.restarts == 0 and not [
        e for e in job.events if e.kind == Kind.RESTART and e.get("reason") == "worker_failed"
    ]
    assert set(job.nodes) == workers_before and not [e for e in job.events if e.kind == Kind.NODE_LEFT]
    assert job.state.membership_changes >= 1
    job.stop()


# -- torchrun's agent's own store calls: rank assignment, the exit barrier ----------------------

# The real agent (``agent.run``, torchrun inside) with one test seam: it says where it is
# (before assigning ranks, or before the exit barrier) and waits for the test's go, so the store
# is frozen exactly there. The seam speaks once; the store calls after it are torch's own.
AGENT = textwrap.dedent(
    """
    import json, sys
    from notebook_elastic.agent import run as agent
    from notebook_elastic.agent import store_link

    store_link.STORE_CALL_TIMEOUT_S = 2.0
    where, argv = sys.argv[1], sys.argv[2:]
    said = []

    def seam(original):
        def wrapped(*args, **kwargs):
            if not said:
                said.append(where)
                print(json.dumps({"at": where}), flush=True)
                sys.stdin.readline()
            return original(*args, **kwargs)

        return wrapped

    if where == "assign":
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

        SimpleElasticAgent._assign_worker_ranks = seam(SimpleElasticAgent._assign_worker_ranks)
    else:
        import torch.distributed.elastic.utils.store as store_util

        store_util.barrier = seam(store_util.barrier)
    reconnect = store_link._reconnect

    def _reconnect(*args, **kwargs):  # say when the agent gives up on the silent store's reply
        print(json.dumps({"reconnecting": True}), flush=True)
        return reconnect(*args, **kwargs)

    store_link._reconnect = _reconnect
    agent.main(argv)
    """
)

CELL = 'print("@@cell trained", flush=True)\n'


@pytest.fixture
def agent_on_a_store(tmp_path):
    """``start(where, replaceable) -> (store, agent, lines)``: a real store process and a real
    one-node agent of it, stopped at the seam ``where``; everything is thawed and killed after."""
    procs: list[subprocess.Popen] = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("TORCH_ELASTIC_WORKER_IDENTICAL", None)  # ranks are assigned through the store

    def start(where: str, replaceable: bool):
        port = _free_port()
        store = _serve_store(port, env, procs)
        (tmp_path / "agent.py").write_text(AGENT)
        (tmp_path / "cell.py").write_text(CELL)
        agent_env = dict(env, **{protocol.ENV_NODE: "node-0"})
        if replaceable:
            agent_env[protocol.ENV_STORE_REPLACEABLE] = "1"
        torchrun = ["--nnodes", "1", "--nproc-per-node", "1", "--max-restarts", "0", "--rdzv-backend", "c10d"]
        torchrun += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "frozen-agent", "--monitor-interval", "0.1"]
        torchrun += ["--rdzv-conf", "is_host=false,read_timeout=8,join_timeout=60,last_call_timeout=1"]
        agent = subprocess.Popen(
            [sys.executable, str(tmp_path / "agent.py"), where, *torchrun, str(tmp_path / "cell.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(tmp_path / "agent.err", "w"),  # noqa: SIM115 (the child holds it)
            text=True,
            env=agent_env,
            cwd=tmp_path,
        )
        procs.append(agent)
        lines = _AgentLines(agent)
        assert lines.next(f"the agent reached the seam ({where})") == {"at": where}
        return store, agent, lines

    start.serve = lambda port: _serve_store(port, env, procs)  # type: ignore[attr-defined]
    yield start
    _thaw_and_kill(procs)


class _AgentLines(_Lines):
    """The agent's JSON lines (the seam's), and every line it wrote, events included."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.all: list[str] = []
        super().__init__(proc)

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            self.all.append(line)
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def events(self, kind: str) -> list[dict]:
        prefix = protocol.EVENT_PREFIX
        found = [json.loads(line[len(prefix) :]) for line in list(self.all) if line.startswith(prefix)]
        return [e for e in found if e.get("kind") == kind]


def _go(agent: subprocess.Popen) -> None:
    agent.stdin.write("go\n")  # type: ignore[union-attr]
    agent.stdin.flush()  # type: ignore[union-attr]


def test_a_store_frozen_while_the_agent_assigns_ranks_ends_it_with_one_sentence(agent_on_a_store, tmp_path):
    """Rank assignment (``_assign_worker_ranks``: set, multi_get, get on the round's PrefixStore)
    calls the store outside the rendezvous backend. Locally (the supervisor's store), frozen
    there: the agent waits for that same store for its timeout, then ends as a frozen rendezvous
    call does, with exit status 5 and one sentence. Old code: it waited in multi_get forever."""
    store, agent, lines = agent_on_a_store("assign", replaceable=False)
    freeze(store.pid)
    _go(agent)
    assert agent.wait(ANSWER_BOUND_S) == protocol.EXIT_STORE_LOST
    said = [line for line in (tmp_path / "agent.err").read_text().splitlines() if "notebook-elastic agent:" in line]
    assert said and "stopped answering" in said[-1] and f":{store.args[-1]}" in said[-1], said
    assert not lines.events("rendezvous")[1:] and not [line for line in lines.all if "@@cell" in line]


def test_a_store_replaced_while_the_agent_assigns_ranks_is_a_new_round(agent_on_a_store):
    """On a cluster the store pod is replaced: frozen while the agent assigns ranks, then gone
    and served again by a new store at the same address. The agent gives up on the silent call,
    takes the new store, rendezvouses again there (a replaced store, told; nothing charged) and
    its worker runs. Old code: the agent failed (exit status 1): its rank assignment's call raised
    once the frozen store went, with no reconnection and no new round."""
    store, agent, lines = agent_on_a_store("assign", replaceable=True)
    freeze(store.pid)
    _go(agent)
    assert lines.next("the agent gave up on the frozen store's reply").get("reconnecting")
    store.kill()
    store.wait()
    agent_on_a_store.serve(int(store.args[-1]))
    assert agent.wait(ANSWER_BOUND_S) == 0
    assert [e.get("reason") for e in lines.events("restart")] == ["store_replaced"]
    rounds = [e["round"] for e in lines.events("rendezvous")]
    assert len(rounds) == 2 and rounds[1] > rounds[0], rounds
    assert [line for line in lines.all if "@@cell trained" in line]


def test_a_store_frozen_at_the_exit_barrier_lets_the_agent_end(agent_on_a_store, tmp_path):
    """The exit barrier (``store_util.barrier``: add, set, then a wait for the slowest node of up
    to ``exit_barrier_timeout``) has a deadline per call, not per barrier: its worker done, an
    agent whose store froze at the barrier stops waiting for the others and ends with its
    workers' result. Old code: it waited in the barrier's add forever."""
    store, agent, lines = agent_on_a_store("barrier", replaceable=False)
    assert [line for line in lines.all if "@@cell trained" in line]
    freeze(store.pid)
    _go(agent)
    assert agent.wait(ANSWER_BOUND_S) == 0
    assert "stopped answering torchrun's agent (no reply to add" in (tmp_path / "agent.err").read_text()


def test_an_agent_store_wait_outlasts_the_call_deadline_while_the_store_answers(monkeypatch):
    """A key a peer is slow to write (rank 0's assigned ranks, the slowest node at the exit
    barrier) is waited for past the per-call deadline, up to the store's own timeout: the wait
    is a series of checks, each a round trip under the deadline, so only a store's silence ends
    it early. Old code: no deadline at all (a frozen store hung the agent)."""
    from datetime import timedelta

    import torch.distributed as dist

    from notebook_elastic.agent import store_link

    monkeypatch.setattr(store_link, "STORE_CALL_TIMEOUT_S", 0.2)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60))
    store = store_link.BoundedStore(dist.PrefixStore("round.3", client), client, store_link.StoreLink())
    got: list = []
    reader = threading.Thread(target=lambda: got.append(store.get("torchelastic/assigned_ranks/1")), daemon=True)
    reader.start()
    waited_past = time.monotonic() + 5 * store_link.STORE_CALL_TIMEOUT_S
    while time.monotonic() < waited_past:  # the reader waits on, many deadlines long
        assert reader.is_alive(), got
        time.sleep(0.05)
    dist.PrefixStore("round.3", server).set("torchelastic/assigned_ranks/1", "[2, 4, 2, 4]")
    reader.join(ANSWER_BOUND_S)
    assert got == [b"[2, 4, 2, 4]"]
    # The exit barrier's timeout is the agent's own: the client the rendezvous shares keeps its.
    store.set_timeout(timedelta(seconds=300))
    assert store.timeout == timedelta(seconds=300) and client.timeout == timedelta(seconds=60)
    with pytest.raises(dist.DistStoreError):
        store.wait(["never"], timedelta(seconds=0.3))


def test_a_wait_while_ranks_are_assigned_ends_when_a_member_left_the_round():
    """A member stopped right after its round formed, before it wrote its role (an evicted
    joiner's agent, SIGTERMed then): the others waited for its key until the wait's bound (60 s)
    and their agent failed (fresh-clone run 9, torch 2.4.1). While ranks are assigned, the wait
    looks at the round every MEMBER_LOOK_S and ends once a member is gone; outside it, never."""
    from datetime import timedelta

    import torch.distributed as dist

    from notebook_elastic.agent import store_link

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60))
    link = store_link.StoreLink()
    gone = threading.Event()
    link.member_gone = gone.is_set
    store = store_link.BoundedStore(dist.PrefixStore("round.2", client), client, link)
    outcome: list = []

    def wait_for_its_role() -> None:
        try:
            store.multi_get(["torchelastic/role_info/0", "torchelastic/role_info/1"])
            outcome.append("got it")
        except Exception as exc:
            outcome.append(exc)

    gone.set()  # not while ranking: the wait goes on (its key comes)
    waiter = threading.Thread(target=wait_for_its_role, daemon=True)
    waiter.start()
    time.sleep(2 * store_link.MEMBER_LOOK_S + 0.5)
    assert waiter.is_alive() and not outcome
    dist.PrefixStore("round.2", server).multi_set(["torchelastic/role_info/0", "torchelastic/role_info/1"], ["a", "b"])
    waiter.join(ANSWER_BOUND_S)
    assert outcome == ["got it"]
    outcome.clear()
    link.ranking.set()  # assigning ranks, and a member left
    waiter = threading.Thread(
        target=lambda: outcome.append(_raised(store.wait, ["torchelastic/role_info/2"])), daemon=True
    )
    waiter.start()
    waiter.join(ANSWER_BOUND_S)
    assert not waiter.is_alive() and isinstance(outcome[0], store_link.RoundLostMember), outcome


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as exc:
        return exc
    return None


def test_a_regroups_wait_for_a_rounds_key_ends_on_a_frozen_store(tmp_path, monkeypatch):
    """A node regrouping waits for the next round's key (agent/regroup.py), a server-side wait:
    on a store frozen meanwhile it ends by its deadline (the key did not come; the state read
    next finds the store lost), and a key set on a store that answers is seen. Old code: torch's
    client, past the wait's bound, waited for the reply to its cancel without a bound, and the
    agent's main thread sat in C++ for good."""
    from datetime import timedelta

    import torch.distributed as dist

    from notebook_elastic.agent import regroup, store_link

    monkeypatch.setattr(store_link, "STORE_CALL_TIMEOUT_S", 2.0)
    procs: list[subprocess.Popen] = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        port = _free_port()
        store = _serve_store(port, env, procs)
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        client.set("run/round/4/opened", "1")
        assert regroup.wait_for_key(client, "run/round/4/opened", 0.5)
        assert not regroup.wait_for_key(client, "run/round/5/opened", 0.2)  # the store answers: its bound
        freeze(store.pid)
        ended: list[bool] = []
        waiter = threading.Thread(target=lambda: ended.append(regroup.wait_for_key(client, "run/round/5/opened", 0.5)))
        waiter.daemon = True
        waiter.start()
        waiter.join(ANSWER_BOUND_S)
        assert ended == [False], "the wait on the frozen store never ended"
    finally:
        _thaw_and_kill(procs)

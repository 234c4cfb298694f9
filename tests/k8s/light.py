"""A job of many *light* worker pods on the fixture cluster (tests/k8s/), for
measuring and testing what following a big job costs the notebook (#16 item 6).

The job's objects are the ones the follower reads (the code ConfigMap with its spec
annotation, an Indexed Job of worker pods with our labels), but each pod runs a small
Python process instead of a torchrun agent: it prints the event lines an agent and its
worker print (``rendezvous`` with the round's members by pod IP, ``worker_started``), then
rank 0 reports a loss every ``metric_every_s`` (its ``t`` is when the line was printed, so a
follower's delay can be read off it) and the other ranks say a plain line now and then.

Group ranks are given in reverse index order, so global rank 0 lives on the pod of the
highest index: a follower cannot find rank 0's pod by guessing the first one. The pod of
``failing_index`` fails once: its rank raises (a ``worker_failed`` event with a traceback)
and its container exits 1; the kubelet restarts it (restartPolicy OnFailure) and it trains
on, as a node whose agent restarted its workers.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from typing import Any

from notebook_elastic.backends.kubernetes import manifests as m

WORKER = r"""
import json, os, sys, time
PREFIX = "@@elastic "
def say(kind, **fields):
    sys.stdout.write(PREFIX + json.dumps({"kind": kind, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()
n, index, pod, ip = int(sys.argv[1]), int(os.environ["JOB_COMPLETION_INDEX"]), os.environ["POD"], os.environ["POD_IP"]
failing, every, quiet = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
rank = n - 1 - index
again = os.path.exists("failed-once")
me = {"addr": ip, "pid": os.getpid(), "local_id": 0, "group_rank": rank}
# The round: every agent's line comes once it closed, and names group rank 0 (its address, as
# the rendezvous store tells it); here rank 0's pod leaves its address in a shared folder.
round_dir, lead = sys.argv[5], None
if rank == 0:
    with open(os.path.join(round_dir, f".lead-{os.getpid()}"), "w") as f:
        json.dump(me, f)
    os.replace(os.path.join(round_dir, f".lead-{os.getpid()}"), os.path.join(round_dir, "lead"))
deadline = time.monotonic() + 120
while lead is None and time.monotonic() < deadline:
    try:
        with open(os.path.join(round_dir, "lead")) as f:
            lead = json.load(f)
    except (OSError, ValueError):
        time.sleep(0.5)  # a thousand pods wait here: a light poll (the real ones wait on the store)
told = {"members": [me]} if n <= 64 else {}  # as our agents: the members of a round of up to 64
say("rendezvous", node=pod, round=1 if again else 0, epoch=0, group_rank=rank, group_world_size=n,
    **told, **({"lead": lead} if lead else {}), agent_pid=os.getpid())
say("worker_started", node=pod, rank=rank, local_rank=0, world_size=n, group_rank=rank, pid=os.getpid(),
    restart_count=int(again), generation=int(again))
if index == failing and not again:
    time.sleep(2.0)
    open("failed-once", "w").close()
    say("worker_failed", node=pod, rank=rank, local_rank=0, generation=0, error="ZeroDivisionError",
        message="division by zero", traceback="Traceback (most recent call last):\n  light worker\nZeroDivisionError: division by zero")
    sys.exit(1)
step = 0
while True:
    if rank == 0:
        say("metric", rank=0, step=step, values={"loss": 1.0 / (step + 1)})
        step += 1
        time.sleep(every)
    else:
        print(f"rank {rank} still training", flush=True)
        time.sleep(quiet)
"""


def light_job(
    name: str,
    nodes: int,
    *,
    failing_index: int = -1,
    metric_every_s: float = 0.2,
    quiet_every_s: float = 5.0,
) -> list[dict[str, Any]]:
    """The code ConfigMap and the workers' Indexed Job of a light job of ``nodes`` pods. Their
    round (who holds rank 0) meets in a fresh folder of this machine's (the pods are its
    processes); it goes with the process."""
    round_dir = tempfile.mkdtemp(prefix=f"k8s-light-{name}-")
    atexit.register(shutil.rmtree, round_dir, True)
    spec = {"nnodes": [nodes, nodes], "nproc_per_node": 1, "max_restarts": 3, "nodes": nodes}
    code = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": m.code_name(name),
            "labels": m.labels(name, "code"),
            "annotations": {m.ANNOTATION_SPEC: json.dumps(spec), "notebook-elastic.io/workload": "job"},
        },
        "data": {"worker.py": WORKER},
    }
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": m.workers_name(name),
            "labels": m.labels(name, "worker"),
            "annotations": {"notebook-elastic.io/nnodes": f"{nodes}:{nodes}"},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 10 * nodes,
            "template": {
                "metadata": {"labels": m.labels(name, "worker")},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "containers": [
                        {
                            "name": "worker",
                            "image": "python:3.11-slim",
                            "command": ["python", "-S", "/code/worker.py"],
                            "args": [
                                str(nodes),
                                str(failing_index),
                                str(metric_every_s),
                                str(quiet_every_s),
                                round_dir,
                            ],
                            "env": env,
                            "volumeMounts": [{"name": "code", "mountPath": "/code"}],
                        }
                    ],
                    "volumes": [{"name": "code", "configMap": {"name": m.code_name(name)}}],
                },
            },
        },
    }
    return [code, job]


def create(api: Any, objects: list[dict[str, Any]], namespace: str = "default") -> None:
    """Create the objects with the real client (an ``ApiClient``)."""
    from kubernetes import utils

    for obj in objects:
        utils.create_from_dict(api, obj, namespace=namespace)

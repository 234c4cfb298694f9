"""What in place needs of NCCL (#41 item 4), measured on one GPU with our own Group
(runtime/group.py), each case in a fresh process with a hard time limit:

- a group whose peer never comes (lost before the group formed): its first collective hangs in
  NCCL's bootstrap; Group.abort from another thread must end it. With blocking communicators
  (torch's default) and non-blocking ones (TORCH_NCCL_USE_COMM_NONBLOCKING=1);
- after the abort, a new group formed in the same process (the survivor's next round) and a
  collective on it, correct: the time that takes, against a fresh process's start to its first
  collective (what a restart pays: the interpreter, torch, CUDA, NCCL), in the same run;
- two ranks on one GPU: whether this NCCL lets a formed group be tried with one GPU (a hung
  collective of a formed group, aborted), said either way.

Without CUDA the same cases run on gloo (CPU), which checks the script, not NCCL.
usage: python benchmarks/nccl_in_place.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import report, row  # noqa: E402

CHILD = r"""
import json, os, sys, threading, time
t_spawned = float(sys.argv[2])
import torch, torch.distributed as dist
from notebook_elastic.runtime.group import Group
from notebook_elastic.runtime.inplace import Assignment
case, backend = sys.argv[1], sys.argv[3]
cuda = backend == "nccl"
out = {"case": case}

def assign(rnd, rank, ws, port):
    return Assignment(round=rnd, epoch=rnd, rank=rank, world_size=ws, local_rank=0, local_world_size=1,
                      group_rank=rank, group_world_size=ws, role_rank=rank, role_world_size=ws,
                      store=f"127.0.0.1:{port}", prefix=f"round/{rnd}/")

def tensor(v):
    return torch.full((4,), float(v), device="cuda" if cuda else "cpu")

def done(t):
    if cuda:
        torch.cuda.synchronize()
    return t

def hung_then_aborted(g, body):
    # body in a thread; after 3 s, whether it still waits; then g.abort(), and how long until
    # it returned, and how
    result = {}
    def run():
        try:
            body()
            result["returned"] = "completed"
        except BaseException as e:
            text = str(e).splitlines()[0] if str(e) else ""
            result["returned"] = (type(e).__name__ + (": " + text if text else ""))[:160]
    th = threading.Thread(target=run, daemon=True)
    th.start()
    time.sleep(3)
    out["hung"] = th.is_alive()
    t0 = time.monotonic()
    g.abort()
    th.join(30)
    out["abort_ended_it"] = not th.is_alive()
    out["abort_to_return_s"] = time.monotonic() - t0
    out["returned"] = result.get("returned", "still waiting")

def collective(v):
    t = tensor(v); dist.all_reduce(t); done(t)
    return t

if cuda:
    torch.cuda.set_device(0)
if case == "fresh":  # what a restart pays: from the spawn to a first collective
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    g = Group()
    g.open(assign(1, 0, 1, store.port), backend, 60)
    t = collective(3)
    out["first_collective_s"] = time.time() - t_spawned
    out["value"] = t[0].item()
elif case == "bootstrap":  # a peer that never comes, then the same process in a new group
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    g = Group()
    def first():
        g.open(assign(1, 0, 2, store.port), backend, 300)
        collective(1)
    hung_then_aborted(g, first)
    out["unabortable"] = g.unabortable
    print(json.dumps(out), flush=True)
    t1 = time.monotonic()
    g.close()
    out["close_s"] = time.monotonic() - t1
    print(json.dumps(out), flush=True)
    t1 = time.monotonic()
    g.open(assign(2, 0, 1, store.port), backend, 60)
    t = collective(5)
    out["reform_s"] = time.monotonic() - t1
    out["value"] = t[0].item()
elif case == "formed":  # two ranks on one device: a formed group, then one rank stops calling
    rank, port = int(sys.argv[4]), int(sys.argv[5])
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    g = Group()
    try:
        g.open(assign(1, rank, 2, port), backend, 300)
        out["formed"] = collective(1)[0].item() == 2.0
    except BaseException as e:
        out["formed"] = False
        out["refused"] = (type(e).__name__ + ": " + str(e))[:300]
        print(json.dumps(out), flush=True)
        os._exit(0)
    if rank == 1:
        print(json.dumps(out), flush=True)
        time.sleep(600)  # the lost peer: alive, never calls again
    hung_then_aborted(g, lambda: collective(1))
print(json.dumps(out), flush=True)
os._exit(0)
"""


def child(case: str, backend: str, *extra: str, env: dict | None = None, limit: float = 60) -> dict:
    """Run one case in a fresh process; its last JSON line, or what stopped it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, case, repr(time.time()), backend, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        got = {**(lines[-1] if lines else {}), "killed_after_s": limit, "stderr": err[-600:]}
        print(json.dumps(got), flush=True)
        return got
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    got = {**(lines[-1] if lines else {"error": err[-600:]}), "rc": proc.returncode}
    print(json.dumps(got), flush=True)  # as it comes: a run cut short still says what it found
    return got


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def formed(backend: str) -> dict:
    port = free_port()
    other = subprocess.Popen(
        [sys.executable, "-c", CHILD, "formed", repr(time.time()), backend, "1", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        return child("formed", backend, "0", str(port), limit=50)
    finally:
        other.kill()
        other.wait()


def main() -> None:
    import torch

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    rows: list[dict] = []
    cases: dict[str, dict] = {}
    fresh = [child("fresh", backend) for _ in range(2)]
    cases["fresh"] = fresh[-1]
    restart_s = min(f.get("first_collective_s", float("nan")) for f in fresh)
    rows.append(row(f"a fresh process to its first collective ({backend}): a restart's floor", restart_s, "s"))
    modes = {
        "blocking": {"TORCH_NCCL_USE_COMM_NONBLOCKING": "0"},
        "non-blocking": {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"},
    }
    for mode, env in modes.items() if backend == "nccl" else [("gloo", {})]:
        got = child("bootstrap", backend, env=env, limit=75)
        cases[f"bootstrap {mode}"] = got
        ended = bool(got.get("abort_ended_it"))
        rows.append(row(f"{mode}: a peer never came, the first collective hung", str(got.get("hung")), ""))
        rows.append(
            row(
                f"{mode}: abort to its return ({got.get('returned', got.get('error', '?'))[:70]})",
                got.get("abort_to_return_s", float("nan")),
                "s",
                "ends",
                ended,
            )
        )
        reform = got.get("reform_s")
        rows.append(
            row(
                f"{mode}: a new group in the same process, to a correct collective",
                reform
                if reform is not None
                else f"not reached ({'killed' if 'killed_after_s' in got else got.get('rc')})",
                "s" if reform is not None else "",
                "",
                None if reform is None else got.get("value") == 5.0,
            )
        )
        if reform:
            rows.append(row(f"{mode}:   ratio to a fresh process", reform / restart_s, "x"))
    got = formed(backend)
    cases["formed"] = got
    if got.get("formed"):
        rows.append(
            row(
                "two ranks on one device: a formed group's hung collective, abort to return",
                got.get("abort_to_return_s", float("nan")),
                "s",
                "ends",
                bool(got.get("abort_ended_it")),
            )
        )
    else:
        rows.append(
            row(
                "two ranks on one device: refused here, so a formed group's abort needs 2 GPUs",
                (got.get("refused") or got.get("error") or "?")[:90],
                "",
            )
        )
    print(json.dumps(cases, indent=1))
    report(
        "nccl_in_place",
        rows,
        notes=f"{os.cpu_count()} CPUs, {torch.cuda.device_count()} GPU(s) "
        f"({torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none: gloo on CPU, a check of the script only'}), "
        f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}.",
    )


if __name__ == "__main__":
    main()

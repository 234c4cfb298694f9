"""In place against restart, in the same run (#41).

The same job (a DDP cell that never saves on its own, 3 local nodes of 1 process) goes through
the same changes twice: once as notebook-elastic takes them (the survivors keep their
processes), once with ``--torchrun-restarts`` (every change restarts every worker, as torchrun
does). For each change: the time from the change (the drill, or the scale) to the first step
at the new size, how long training stood still (rank 0's last step at the old size to its first
at the new: in place the old size trains on while the new round forms), the steps redone, and
the share of the survivors' processes kept. Then a
joiner's state transfer from a live peer at 10M and 100M parameters (Adam: the weights and two
moments each).

Goal on this machine (2 cores, CPU): in place <= 0.2 s and <= 0.25x of the restart, 0 steps
redone with notice.
usage: python benchmarks/in_place.py [--quick] [--repeat N] [--params 10M,100M] [--cold]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from _common import median, report, row, stop_all_jobs, wait  # noqa: E402

import notebook_elastic as ne  # noqa: E402
import notebook_elastic.runtime as runtime  # noqa: E402
from notebook_elastic.contract.event_types import Kind  # noqa: E402

TRAIN = """
model = torch.nn.Linear(32, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), ws=elastic.world_size(), gen=state.generation, pid=os.getpid())
    time.sleep(STEP_S)
"""

BIG = """
model = torch.nn.Linear(FEATURES, FEATURES, bias=False)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
state = elastic.State(model=model, optimizer=opt)
ddp = torch.nn.parallel.DistributedDataParallel(model)
for step in state.steps(TOTAL):
    loss = ddp(torch.randn(2, FEATURES)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    state.commit()
    elastic.report(step=step, loss=loss.item(), ws=elastic.world_size())
"""

NEVER = 10**9
#: The changes each job goes through: (what, the call, the world size after).
CHANGES = (
    ("node lost (3 -> 2)", lambda job: job.lose_node("node-2"), 2),
    ("scale down (2 -> 1)", lambda job: job.scale(1), 1),
    ("scale up (1 -> 2)", lambda job: job.scale(2), 2),
    ("preempted with notice (2 -> 1)", lambda job: job.preempt_node(grace_s=30), 1),
)


def namespace(**values: object) -> dict:
    return {"torch": torch, "elastic": runtime, "time": time, "os": os, **values}


def reports(job) -> list[dict]:  # noqa: ANN001
    import json

    from notebook_elastic.backends.local import LocalBackend

    folder = LocalBackend().folder(job.name)
    lines = folder.events_file.read_text().splitlines()
    return [json.loads(line) for line in lines if '"kind":"metric"' in line]


def events_since(job, since: float) -> list[dict]:  # noqa: ANN001
    """Every event of the job's folder after ``since``, as written (each with its time ``t``)."""
    import json

    from notebook_elastic.backends.local import LocalBackend

    lines = LocalBackend().folder(job.name).events_file.read_text().splitlines()
    return [e for e in (json.loads(line) for line in lines) if e["t"] > since]


#: The supervisor's own act that starts a change: the departure or the join itself (a kill, a
#: notice, a SIGTERM, a new agent spawned), after the kernel's command reached it.
DEPARTURE_KINDS = ("fault", "notice", "agent_signaled", "node_joined")


def breakdown(events: list[dict], first_step_t: float) -> dict:
    """Where a change's time went, from its departure (or join): the first survivor's agent
    starting its regroup (detection), the last survivor's round formed, the group formed in
    place (``in_place``), and rank 0's first step at the new size."""
    departed = min((e["t"] for e in events if e["kind"] in DEPARTURE_KINDS), default=float("nan"))
    regrouped = [e for e in events if e["kind"] == "regrouped"]
    # A regroup's event comes once the kept workers are told: after the round (took_s) and after
    # training on while joiners' workers started (trained_on_s).
    regroups = [e["t"] - e.get("trained_on_s", 0.0) - e.get("took_s", 0.0) for e in regrouped]
    rounds = [e["t"] - e.get("trained_on_s", 0.0) for e in regrouped]
    told = [e["t"] for e in regrouped]
    in_place = [e["t"] for e in events if e["kind"] == "in_place"]
    ready = [e["t"] for e in events if e["kind"] == "agent_started"]  # a joiner's agent up
    nan = float("nan")
    marks = {
        "departed_t": departed,
        "detect_s": min(regroups, default=nan) - departed,
        "round_s": max(rounds, default=nan) - min(regroups, default=nan),
        "trained_on_s": max(told, default=nan) - max(rounds, default=nan),
        "group_s": min(in_place, default=nan) - max(told, default=nan),
        "step_s": first_step_t - min(in_place, default=nan),
        "joiner_agent_s": min(ready, default=nan) - departed,
        "from_round_s": first_step_t - max(rounds, default=nan),
    }
    return marks


def first_step_at(job, world: int, since: float) -> tuple[float, int]:  # noqa: ANN001
    """When rank 0 first reported at ``world`` ranks after ``since`` (and that step)."""
    for e in reports(job):
        if e["t"] > since and e["values"].get("ws") == world:
            return e["t"], e["step"]
    raise LookupError


def run_changes(name: str, torchrun_restarts: bool) -> list[dict]:
    job = ne.launch(
        TRAIN,
        nnodes="1:3",
        nodes=3,
        name=name,
        max_restarts=10,
        checkpoint_every=NEVER,
        torchrun_restarts=torchrun_restarts,
        user_ns=namespace(TOTAL=100_000, STEP_S=0.02),
    )
    results = []
    try:
        wait(lambda: job.world_size == 3 and (job.state.step or 0) >= 20, "three nodes training")
        for what, change, world in CHANGES:
            time.sleep(1.0)  # steady at the old size
            before = {e.node: e.get("pid") for e in job.events if e.kind == Kind.WORKER_STARTED}
            last = job.state.step or 0
            started = time.time()
            change(job)
            wait(
                lambda world=world, started=started: (
                    job.world_size == world
                    and any(e["t"] > started and e["values"].get("ws") == world for e in reports(job))
                ),
                f"{what}: training at {world}",
                timeout=120,
            )
            at, step = first_step_at(job, world, started)
            # Training stood still from rank 0's last step at the old size to its first at the new.
            before_change = [e["t"] for e in reports(job) if e["t"] < at and e["values"].get("ws") != world]
            paused = at - max(before_change) if before_change else float("nan")
            time.sleep(0.5)
            parts = breakdown(events_since(job, started), at)
            after = {e.node: e.get("pid") for e in job.events if e.kind == Kind.WORKER_STARTED}
            survivors = [
                n for n in after if n in before and job.state.nodes.get(n) and job.state.nodes[n].status != "left"
            ]
            kept = sum(1 for n in survivors if after[n] == before[n])
            results.append(
                {
                    "change": what,
                    "resume_s": at - started,
                    "from_departure_s": at - parts["departed_t"],
                    **{k: v for k, v in parts.items() if k != "departed_t"},
                    "paused_s": paused,
                    "redone": max(0, last + 1 - step) if step <= last else 0,
                    "kept": kept / max(1, len(survivors)),
                }
            )
    finally:
        job.stop()
    return results


def transfer(features: int, repeat: int) -> dict:
    """A joiner taking the live values (weights + Adam's two moments) from a survivor."""
    figures = []
    for i in range(repeat):
        job = ne.launch(
            BIG,
            nnodes="1:2",
            nodes=1,
            name=f"transfer-{features}-{i}",
            checkpoint_every=NEVER,
            user_ns=namespace(TOTAL=100_000, FEATURES=features),
        )
        try:
            wait(lambda job=job: (job.state.step or 0) >= 3, "one node training", timeout=300)
            job.scale(2)
            wait(lambda job=job: any(e.kind == Kind.IN_PLACE for e in job.events), "the joiner in place", timeout=300)
            [change] = [e.data for e in job.events if e.kind == Kind.IN_PLACE][:1]
            figures.append(change)
        finally:
            job.stop()
    return {
        "params": features * features,
        "bytes": median([f.get("transfer_bytes", 0) for f in figures]),
        "transfer_s": median([f.get("transfer_s", float("nan")) for f in figures]),
        "took_s": median([f.get("took_s", float("nan")) for f in figures]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, the 10M transfer only")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--params", default="10M,100M", help="joiner transfer sizes")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="each node's workers forked from a zygote of its own, started with the node (as on a "
        "cluster node's first start), not from the user's warm pool; results in in_place_cold.json",
    )
    args = parser.parse_args()
    if args.cold:
        os.environ["NOTEBOOK_ELASTIC_WARM_POOL"] = "0"
    repeat = 1 if args.quick else args.repeat
    sizes = {"10M": 3162, "100M": 10_000}
    wanted = ["10M"] if args.quick else [s.strip() for s in args.params.split(",") if s.strip()]
    os.environ.setdefault("NOTEBOOK_ELASTIC_HOME", tempfile.mkdtemp(prefix="ne-bench-inplace-"))
    rows = []
    runs: dict[str, list[list[dict]]] = {"in place": [], "restart": []}
    try:
        for i in range(repeat):
            runs["in place"].append(run_changes(f"inplace-{i}", torchrun_restarts=False))
            runs["restart"].append(run_changes(f"restart-{i}", torchrun_restarts=True))
        for j, (what, _change, _world) in enumerate(CHANGES):

            def figure(key: str, mode: str = "in place", j: int = j) -> tuple[float, str]:
                values = [r[j][key] for r in runs[mode]]
                return median(values), f"{min(values):.3f}-{max(values):.3f}"

            ours, ours_spread = figure("from_departure_s")
            theirs, theirs_spread = figure("from_departure_s", "restart")
            called, called_spread = figure("resume_s")
            called_restart, _ = figure("resume_s", "restart")
            redone = max(r[j]["redone"] for r in runs["in place"])
            redone_restart = max(r[j]["redone"] for r in runs["restart"])
            kept = min(r[j]["kept"] for r in runs["in place"])
            rows.append(
                row(
                    f"{what}: in place, departure to the first step (spread {ours_spread})",
                    ours,
                    "s",
                    "<= 0.2",
                    ours <= 0.2,
                )
            )
            rows.append(row(f"{what}: restart (torchrun's way), the same (spread {theirs_spread})", theirs, "s"))
            rows.append(row(f"{what}: ratio in place / restart", ours / theirs, "x", "<= 0.25", ours / theirs <= 0.25))
            rows.append(
                row(
                    f"{what}: in place, from the kernel's call (spread {called_spread}; restart {called_restart:.3f} s)",
                    called,
                    "s",
                )
            )
            parts = {k: figure(k)[0] for k in ("detect_s", "round_s", "trained_on_s", "group_s", "step_s")}
            said = ", ".join(f"{k[:-2].replace('_', ' ')} {v:.3f}" for k, v in parts.items())
            rows.append(row(f"{what}: in place, where it went (medians, s): {said}", sum(parts.values()), "s"))
            if "up" in what:
                agent_up, agent_spread = figure("joiner_agent_s")
                rows.append(row(f"{what}: the joiner's agent started, of that (spread {agent_spread})", agent_up, "s"))
                on, on_spread = figure("trained_on_s")
                rows.append(
                    row(
                        f"{what}: the others trained on while the joiner's workers started (spread {on_spread})",
                        on,
                        "s",
                    )
                )
                joined, joined_spread = figure("from_round_s")
                rows.append(
                    row(
                        f"{what}: from the round that took the joiner in to the first step (spread {joined_spread})",
                        joined,
                        "s",
                    )
                )
            stood = median([r[j]["paused_s"] for r in runs["in place"]])
            stood_restart = median([r[j]["paused_s"] for r in runs["restart"]])
            rows.append(row(f"{what}: training stood still, in place (restart: {stood_restart:.2f} s)", stood, "s"))
            target = "0" if "notice" in what or "down" in what or "up" in what else "<= 1"
            rows.append(row(f"{what}: steps redone in place (restart: {redone_restart})", redone, "steps", target))
            rows.append(row(f"{what}: survivors' processes kept in place", kept, "share", "1", kept == 1))
        for size in wanted:
            got = transfer(sizes[size], repeat)
            mb = got["bytes"] / 1e6
            rows.append(row(f"joiner's state from a live peer, {size} params ({mb:.0f} MB)", got["transfer_s"], "s"))
            rows.append(row(f"joiner at {size}: the longest a kept rank stood still", got["took_s"], "s"))
    finally:
        stop_all_jobs()
    report(
        "in_place_cold" if args.cold else "in_place",
        rows,
        notes=f"{repeat} run(s) of each, medians; 3 local nodes of 1 process, a 20 ms step, no checkpoint "
        "before the end (restart goes back to step 0)"
        + ("; --cold: no warm pool, each node's own zygote imports torch as the node starts." if args.cold else "."),
    )


if __name__ == "__main__":
    main()

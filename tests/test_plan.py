"""The launch plan alone: no processes. torchrun's own argument parser reads every command
line the plan builds (a reader nobody here wrote), so a flag it would refuse or misread fails
here; the backends are checked to embed the same plan."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from notebook_elastic import defaults
from notebook_elastic.backends.kubernetes import manifests as m
from notebook_elastic.backends.kubernetes.options import KubernetesOptions
from notebook_elastic.backends.local import LocalBackend
from notebook_elastic.contract import protocol
from notebook_elastic.contract.plan import AGENT_MODULE, Place, launch_plan, rdzv_id
from notebook_elastic.contract.spec import JobSpec
from notebook_elastic.errors import SpecError
from notebook_elastic.jobfolder.folder import JobFolder
from notebook_elastic.jobfolder.place import local_place


def place(**overrides) -> Place:
    fields = dict(
        rdzv_endpoint="127.0.0.1:29500", local_addr="127.0.0.1", script="/jobs/toy/script.py", join_timeout_s=600
    )
    return Place(**{**fields, **overrides})


def torchrun_reads(plan):
    """What torchrun itself makes of the plan's arguments."""
    return get_args_parser().parse_args(list(plan.torchrun_args))


def test_every_option_reaches_torchrun_as_torchrun_reads_it():
    spec = JobSpec(
        name="toy",
        nnodes=(2, 5),
        nodes=3,
        nproc_per_node=4,
        max_restarts=7,
        monitor_interval_s=0.5,
        rdzv_conf={"last_call_timeout": "3", "custom": "x"},
    )
    plan = launch_plan(spec, place(log_dir="/jobs/toy/logs/torchelastic"), rdzv_id="toy-abc-e2", epoch=2)
    args = torchrun_reads(plan)
    assert (args.nnodes, args.nproc_per_node, args.max_restarts) == ("2:5", "4", 7)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", "127.0.0.1:29500", "toy-abc-e2")
    assert args.monitor_interval == 0.5 and args.local_addr == "127.0.0.1"
    assert args.log_dir == "/jobs/toy/logs/torchelastic"
    assert args.training_script == "/jobs/toy/script.py" and args.training_script_args == []
    conf = dict(kv.split("=", 1) for kv in args.rdzv_conf.split(","))
    # Our measured settings, then the job's own: the job's win, unknown keys pass through.
    assert conf["last_call_timeout"] == "3" and conf["custom"] == "x"
    assert conf["keep_alive_interval"] == str(defaults.KEEP_ALIVE_INTERVAL_S)
    assert conf["join_timeout"] == "600" and conf["is_host"] == "false"
    assert plan.argv[:3] == ("python", "-m", AGENT_MODULE)
    assert plan.env[protocol.ENV_RDZV_EPOCH] == "2" and plan.epoch == 2
    assert [n.name for n in plan.nodes] == ["node-0", "node-1", "node-2"]


def test_checkpoint_every_reaches_the_workers_and_a_bad_one_is_one_sentence():
    spec = JobSpec(name="toy", checkpoint_every="25").validated()
    assert launch_plan(spec, place(), rdzv_id="toy-1").env[protocol.ENV_CHECKPOINT_EVERY] == "25"
    chosen = launch_plan(JobSpec(name="toy").validated(), place(), rdzv_id="toy-1")
    assert protocol.ENV_CHECKPOINT_EVERY not in chosen.env  # State chooses
    with pytest.raises(SpecError, match=r"^--checkpoint-every 0: give 1 or more steps, or leave it out"):
        JobSpec(name="toy", checkpoint_every=0).validated()
    with pytest.raises(SpecError, match=r"^--checkpoint-every must be a whole number, not 'often'"):
        JobSpec(name="toy", checkpoint_every="often").validated()


def test_a_range_change_is_a_new_plan_with_the_new_range_and_nothing_else():
    spec = JobSpec(name="toy", nnodes=(1, 2))
    before = launch_plan(spec, place(), rdzv_id="toy-r-e0")
    after = launch_plan(spec, place(), rdzv_id="toy-r-e1", epoch=1, nnodes=(2, 3), nodes=0)
    assert torchrun_reads(before).nnodes == "1:2" and torchrun_reads(after).nnodes == "2:3"
    assert after.nodes == () and len(before.nodes) == 1
    changed = {a for a, b in zip(before.torchrun_args, after.torchrun_args, strict=True) if a != b}
    assert changed == {"1:2", "toy-r-e0"}, changed


def test_secrets_are_named_never_carried():
    spec = JobSpec(name="toy", env={"HF_TOKEN": "hf_" + "x" * 30, "OMP_NUM_THREADS": "2"})
    plan = launch_plan(spec, place(), rdzv_id="toy-r-e0")
    assert plan.secret_env == ("HF_TOKEN", "OMP_NUM_THREADS")
    for shown in (plan.text(), repr(plan.as_dict()), repr(plan.env), repr(plan.nodes)):
        assert "hf_xxx" not in shown
    assert f"HF_TOKEN={defaults.HIDDEN_VALUE}" in plan.text()


@pytest.mark.parametrize(
    ("gpus", "nnodes", "nproc", "expected"),
    [
        (("0", "1", "2", "3"), (1, 2), 2, [("0", "1"), ("2", "3")]),
        (("4", "7"), (2, 2), 1, [("4",), ("7",)]),
        ((), (1, 3), 2, [(), (), ()]),  # CPU: nothing assigned, nothing limited
    ],
)
def test_each_local_rank_gets_a_gpu_of_its_own(gpus, nnodes, nproc, expected):
    spec = JobSpec(name="toy", nnodes=nnodes, nodes=len(expected), nproc_per_node=nproc)
    plan = launch_plan(spec, place(gpus=gpus), rdzv_id="toy-r-e0")
    assert [n.gpus for n in plan.nodes] == expected
    used = [g for n in plan.nodes for g in n.gpus]
    assert len(used) == len(set(used))
    for node in plan.nodes:
        assert node.env.get("CUDA_VISIBLE_DEVICES") == (",".join(node.gpus) or None)
        assert node.env[protocol.ENV_NODE] == node.name


def test_a_range_the_gpus_cannot_hold_is_refused_in_one_sentence():
    spec = JobSpec(name="toy", nnodes=(1, 2), nproc_per_node=1)
    with pytest.raises(SpecError) as e:
        launch_plan(spec, place(gpus=("0",), gpus_seen_by="CUDA_VISIBLE_DEVICES=0"), rdzv_id="toy-r-e0")
    assert str(e.value) == (
        "--nnodes 1:2: 2 node(s) x 1 process(es) need 2 GPUs, one per rank; 1 is visible "
        "(CUDA_VISIBLE_DEVICES=0): use at most 1 node(s) with --nproc-per-node 1 (--nnodes 1:1)"
    )
    with pytest.raises(SpecError, match="use --nproc-per-node 2 or fewer"):
        launch_plan(JobSpec(name="toy", nproc_per_node=4), place(gpus=("0", "1")), rdzv_id="toy-r-e0")


def test_a_node_started_later_gets_exactly_the_gpus_it_is_given():
    plan = launch_plan(JobSpec(name="toy", nnodes=(1, 4), nproc_per_node=2), place(), rdzv_id="toy-r-e0")
    node = plan.node(5, ["6", "7"])
    assert (node.name, node.gpus, node.env["CUDA_VISIBLE_DEVICES"]) == ("node-5", ("6", "7"), "6,7")
    with pytest.raises(ValueError, match="1 GPUs for 2 local ranks"):
        plan.node(6, ["0"])


def test_the_local_place_and_its_dry_run_print_the_plan_the_supervisor_runs(tmp_path):
    spec = JobSpec(name="toy", nnodes=(1, 3), nodes=2, checkpoint_dir=None, backend_options={"cwd": "/nb"})
    folder = JobFolder(tmp_path / "toy")
    running = launch_plan(
        spec,
        local_place(spec, folder, gpus=[], store_port=4321, supervisor_pid=99, files_sha256={"a": "b"}),
        rdzv_id=rdzv_id("toy", "run1", 0),
    )
    args = torchrun_reads(running)
    assert args.rdzv_endpoint == "127.0.0.1:4321" and args.local_addr == "127.0.0.1"
    assert args.training_script == str(folder.script) and args.log_dir == str(folder.torchelastic_logs)
    assert running.env[protocol.ENV_SUPERVISOR_PID] == "99" and running.env[protocol.ENV_JOB_DIR] == str(folder.path)
    assert running.env[protocol.ENV_CHECKPOINT_DIR] == str(folder.checkpoints)
    # The local store lives in the supervisor: agents never wait for one to come back.
    assert protocol.ENV_STORE_REPLACEABLE not in running.env
    assert running.env["PYTHONPATH"].split(os.pathsep)[0] == "/nb"

    class Bundle:
        script, payload = "print()", b"x"

    dry = LocalBackend(tmp_path).submit_dryrun(spec, Bundle())
    # The dry-run's command is the running one but for what only a running supervisor knows.
    shown = dry.request.plan["argv"]
    assert len(shown) == len(running.argv)
    differ = [(a, b) for a, b in zip(shown, running.argv, strict=True) if a != b]
    assert differ == [("127.0.0.1:<supervisor store port>", "127.0.0.1:4321"), ("toy-<run>-e0", "toy-run1-e0")]
    assert "--local-addr 127.0.0.1" in dry.text  # the old dry-run had drifted and left it out


def test_the_kubernetes_manifests_embed_the_plan():
    spec = JobSpec(name="toy", nnodes=(1, 4), nodes=2, nproc_per_node=2, env={"HF_TOKEN": "secret-value"})
    options = KubernetesOptions(pvc="shared")

    class Bundle:
        script, payload, modules, workdir_files = "print()", b"x", {}, {}

    objects = m.build(spec, Bundle(), options, run_id="r1")
    job = next(o for o in objects if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    plan = m.plan_for(spec, options, rdzv_id=rdzv_id("toy", "r1", 0), epoch=0)
    assert container["command"] == list(plan.agent_prefix) and container["args"] == list(plan.torchrun_args)
    args = torchrun_reads(plan)
    assert args.rdzv_endpoint == f"{m.rdzv_name('toy')}:{options.rdzv_port}" and args.local_addr == "$(POD_IP)"
    assert dict(kv.split("=", 1) for kv in args.rdzv_conf.split(","))["join_timeout"] == str(
        defaults.JOIN_TIMEOUT_S_CLUSTER
    )
    env = {e["name"]: e for e in container["env"]}
    for key, value in plan.env.items():
        assert env[key]["value"] == value
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "HF_TOKEN"
    # The store pod comes back under its Deployment: the agents are told to wait for it.
    assert env[protocol.ENV_STORE_REPLACEABLE]["value"] == "1"
    assert "secret-value" not in repr(container)
    # POD_IP is defined, so $(POD_IP) in the arguments expands.
    assert "POD_IP" in env and env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_nothing_else_builds_a_torchrun_command_line():
    package = Path(__file__).resolve().parents[1] / "notebook_elastic"
    builders = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if '"--rdzv-endpoint"' in p.read_text() or "'--rdzv-endpoint'" in p.read_text()
    ]
    assert builders == ["contract/plan.py"], builders

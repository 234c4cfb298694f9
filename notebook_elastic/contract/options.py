"""Every launch option, declared once (TorchX's ``runopts`` is the model).

The magic's flags and ``--help``, ``launch()``'s keywords and their check, the split into the
job spec and the Kubernetes options, and the documentation's option table (docs/reference/options.md) are all derived from
``OPTIONS``. Validation stays where the values are understood (``JobSpec.validated``,
``backends.kubernetes.options.parse_options``); this table says what exists.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import defaults
from ..errors import SpecError

ALL = ("local", "kubernetes", "slurm")
K8S = ("kubernetes",)
SLURM = ("slurm",)
#: Where each backend's own options go (``goes_to``), apart from the job spec.
BACKEND_PARTS = ("kubernetes", "slurm")


@dataclass(frozen=True)
class Option:
    keyword: str  # launch()'s keyword, and the field it fills
    help: str
    default: Any = None  # None: not given (the field's own default applies)
    flag_name: str | None = None  # the magic's flag when it is not --KEYWORD-WITH-DASHES
    backends: tuple[str, ...] = ALL
    repeatable: bool = False  # a flag given several times; a list in launch()
    switch: bool = False  # a flag without a value; True/False in launch()
    metavar: str | None = None
    goes_to: str = "spec"  # "spec" | "kubernetes" | "slurm" | "launch" (how to launch, not what)
    magic: bool = True  # a flag of %%elastic_train
    keyword_arg: bool = True  # a keyword of launch()

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.keyword.replace("_", "-")

    @property
    def help_text(self) -> str:
        scope = f"{self.backends[0]}: " if len(self.backends) == 1 else ""
        default = f" Default {self.default}." if self.default not in (None, False) and not self.repeatable else ""
        return f"{scope}{self.help}{default}"


OPTIONS: tuple[Option, ...] = (
    # What to run and its elastic limits (torchrun's own flags first).
    Option("nnodes", "nodes as N or MIN:MAX (an elastic range), like torchrun.", "1:1"),
    Option("nodes", "nodes to start with (default: MIN).", metavar="N"),
    Option("nproc_per_node", "worker processes per node.", 1),
    Option(
        "max_restarts",
        "restart budget for failures of the code (departures are free), like torchrun.",
        defaults.MAX_RESTARTS,
    ),
    Option("name", "job name (lowercase letters, digits, '-'); also the variable holding the job."),
    Option("backend", "where to run: local, kubernetes or slurm.", "local"),
    Option("checkpoint_dir", "where State() keeps checkpoints (default: the job folder)."),
    Option(
        "checkpoint_every",
        "State() saves every N steps (and the last); default: chosen so that saving blocks "
        "at most a tenth of the training loop's time over the run.",
        metavar="N",
    ),
    Option(
        "env", "environment variable for the workers; values are kept private.", repeatable=True, metavar="KEY=VALUE"
    ),
    Option("ship", "ship this notebook variable even if it looks like a credential.", repeatable=True, metavar="NAME"),
    Option(
        "monitor_interval_s",
        "seconds between the agent's worker checks.",
        defaults.MONITOR_INTERVAL_S,
        flag_name="--monitor-interval",
    ),
    Option("rdzv_conf", "extra rendezvous settings, k=v,k=v (torchrun syntax)."),
    Option(
        "collective_timeout_s",
        "seconds before a collective operation times out.",
        defaults.COLLECTIVE_TIMEOUT_S,
        flag_name="--collective-timeout",
    ),
    Option(
        "stall_timeout_s",
        "restart the worker group when no step came for this many seconds; a stall is "
        f"always told after {defaults.STALL_AFTER_S:g} s.",
        flag_name="--stall-timeout",
    ),
    Option(
        "torchrun_restarts",
        "restart every worker at every change of members, as torchrun does (default: when a node leaves "
        "or joins, the surviving workers keep their processes and the group is rebuilt in place at a step "
        "boundary).",
        switch=True,
    ),
    Option("max_payload_bytes", "refuse payloads above this size, like 64MiB.", "64MiB", flag_name="--max-payload"),
    Option(
        "track",
        "log the metrics to one run named after the job: mlflow, wandb, or none (default: MLflow when "
        "MLFLOW_TRACKING_URI is set, W&B when WANDB_PROJECT is; on Kubernetes rank 0's pod logs, with "
        "the variables and credentials given by --env).",
        metavar="TRACKER",
    ),
    # Kubernetes: where the pods run.
    Option("namespace", "the namespace (default: the context's).", backends=K8S, goes_to="kubernetes"),
    Option("context", "the kubeconfig context (default: the current one).", backends=K8S, goes_to="kubernetes"),
    Option(
        "image", "the container image (needs torch; default a PyTorch CUDA image).", backends=K8S, goes_to="kubernetes"
    ),
    Option(
        "gpus",
        "nvidia.com/gpu per pod (default: --nproc-per-node; 0 for CPU pods).",
        backends=K8S,
        goes_to="kubernetes",
    ),
    Option("cpu", "CPU request per pod, like 8 or 500m.", backends=K8S, goes_to="kubernetes"),
    Option("memory", "memory per pod, like 32Gi.", backends=K8S, goes_to="kubernetes"),
    Option(
        "tolerations",
        "worker toleration.",
        flag_name="--toleration",
        backends=K8S,
        repeatable=True,
        metavar="KEY=VALUE:EFFECT",
        goes_to="kubernetes",
    ),
    Option(
        "node_selector",
        "worker node selector.",
        backends=K8S,
        repeatable=True,
        metavar="LABEL=VALUE",
        goes_to="kubernetes",
    ),
    Option(
        "rdzv_tolerations",
        "toleration of the rendezvous pod.",
        flag_name="--rdzv-toleration",
        backends=K8S,
        repeatable=True,
        metavar="KEY=VALUE:EFFECT",
        goes_to="kubernetes",
    ),
    Option(
        "rdzv_node_selector",
        "node selector of the rendezvous pod (e.g. on-demand nodes; without one it is kept off spot nodes "
        "when the workers tolerate spot).",
        backends=K8S,
        repeatable=True,
        metavar="LABEL=VALUE",
        goes_to="kubernetes",
    ),
    Option("priority_class", "priorityClassName of the pods.", backends=K8S, goes_to="kubernetes"),
    Option(
        "rdzv_image",
        "image of the rendezvous store (any image with Python 3: the store needs no torch; default: python:3.12-slim beside Docker Hub's pytorch/pytorch images, else --image, or its -runtime twin for an official -devel image).",
        backends=K8S,
        goes_to="kubernetes",
    ),
    Option(
        "rdzv_priority_class",
        "priorityClassName of the rendezvous pod (never the workers').",
        backends=K8S,
        goes_to="kubernetes",
    ),
    Option("service_account", "serviceAccountName of the pods.", backends=K8S, goes_to="kubernetes"),
    Option(
        "image_pull_secrets",
        "image pull secret.",
        flag_name="--image-pull-secret",
        backends=K8S,
        repeatable=True,
        metavar="NAME",
        goes_to="kubernetes",
    ),
    Option(
        "pvc", "PersistentVolumeClaim for checkpoints (needed when MAX nodes > 1).", backends=K8S, goes_to="kubernetes"
    ),
    Option("shm_size", "size of /dev/shm in the workers.", "2Gi", backends=K8S, goes_to="kubernetes"),
    Option(
        "grace",
        "seconds a worker pod is given between the kubelet's SIGTERM and its SIGKILL "
        "(terminationGracePeriodSeconds): the job saves on that notice first, within it less 3 s for the "
        "agent to leave. Default: derived from the longest save the last run of this job name measured "
        "(1.5 x it + 5 s), at least 30; 30 before any was measured. The dry-run says which.",
        backends=K8S,
        metavar="SECONDS",
        goes_to="kubernetes",
    ),
    Option(
        "queue",
        "Kueue LocalQueue to queue the workers in: they are created suspended and start when Kueue admits "
        "them; the views say what quota they wait for, and a Kueue preemption is a notice (the job saves first).",
        backends=K8S,
        metavar="NAME",
        goes_to="kubernetes",
    ),
    Option(
        "workload",
        "job (an elastic Indexed Job), pods, or pytorchjob (Kubeflow).",
        "job",
        backends=K8S,
        goes_to="kubernetes",
    ),
    Option(
        "pod_security",
        "baseline, or restricted: non-root, no privilege escalation, capabilities dropped, RuntimeDefault seccomp "
        "(for namespaces that enforce that Pod Security level).",
        backends=K8S,
        goes_to="kubernetes",
    ),
    # Slurm: each node is an allocation of its own (backends/slurm).
    Option(
        "partition",
        "the partition each node's allocation runs in (default: the cluster's).",
        backends=SLURM,
        goes_to="slurm",
    ),
    Option("account", "the account the allocations are charged to.", backends=SLURM, goes_to="slurm"),
    Option("qos", "the quality of service of the allocations.", backends=SLURM, goes_to="slurm"),
    Option(
        "time",
        "each node's time limit, as Slurm writes it (MINUTES, HH:MM:SS, D-HH:MM); checked against the partition's.",
        backends=SLURM,
        goes_to="slurm",
    ),
    Option(
        "gpus_per_node",
        "GPUs of each node's allocation (default: --nproc-per-node where the partition has GPUs, else none).",
        backends=SLURM,
        metavar="N",
        goes_to="slurm",
    ),
    Option(
        "constraint", "the node features the allocations need (Slurm's --constraint).", backends=SLURM, goes_to="slurm"
    ),
    Option(
        "slurm_args",
        "another option for each node's srun, passed as is (like --slurm-arg=--mem=32G).",
        flag_name="--slurm-arg",
        backends=SLURM,
        repeatable=True,
        metavar="ARG",
        goes_to="slurm",
    ),
    Option(
        "supervisor_in",
        "where the job's supervisor runs: a small allocation of its own in this partition (default: the "
        "nodes'), so the job outlives the kernel's machine; or 'here', on the machine the job is launched from.",
        backends=SLURM,
        metavar="PARTITION",
        goes_to="slurm",
    ),
    # How to launch.
    Option(
        "dry_run",
        "print what would be launched (manifest, plan, script); launch nothing.",
        switch=True,
        goes_to="launch",
    ),
    Option(
        "fresh",
        "start over even if a stopped, failed or lost job of this name could be resumed "
        "(its run moves to the history).",
        switch=True,
        goes_to="launch",
    ),
    Option(
        "resume",
        "True: insist on resuming the job of this name; None: resume when the code is the same.",
        goes_to="launch",
        magic=False,
    ),
    Option(
        "export",
        "write the script to PATH and its payload beside it; launch nothing.",
        metavar="PATH",
        goes_to="launch",
        keyword_arg=False,
    ),
    Option("wait", "block until the job finishes.", switch=True, goes_to="launch", keyword_arg=False),
)

BY_KEYWORD = {o.keyword: o for o in OPTIONS}
KUBERNETES_KEYWORDS = tuple(o.keyword for o in OPTIONS if o.goes_to == "kubernetes")
SLURM_KEYWORDS = tuple(o.keyword for o in OPTIONS if o.goes_to == "slurm")


def spec_defaults() -> dict[str, Any]:
    """The job spec's defaults, from the table."""
    return {o.keyword: o.default for o in OPTIONS if o.goes_to == "spec" and o.default is not None}


def signature(function: Any) -> inspect.Signature:
    """``function``'s signature with its ``**options`` spelled out from the table, so that
    help(), Shift-Tab and IDEs list every keyword of ``launch()``."""
    params = [p for p in inspect.signature(function).parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in params}
    params += [
        inspect.Parameter(o.keyword, inspect.Parameter.KEYWORD_ONLY, default=False if o.switch else o.default)
        for o in OPTIONS
        if o.keyword_arg and o.keyword not in taken
    ]
    return inspect.signature(function).replace(parameters=params)


def argparse_arguments() -> list[tuple[Option, tuple[str, ...], dict[str, Any]]]:
    """``(option, args, kwargs)`` for each flag of ``%%elastic_train``, in table order. Every value
    defaults to None (or [] / False): what was not given is not passed on, so the table's
    and the spec's defaults apply once, in one place."""
    out: list[tuple[Option, tuple[str, ...], dict[str, Any]]] = []
    for o in OPTIONS:
        if not o.magic:
            continue
        kwargs: dict[str, Any] = {"dest": o.keyword, "help": o.help_text}
        if o.switch:
            kwargs["action"] = "store_true"
        elif o.repeatable:
            kwargs.update(action="append", default=[], help=o.help_text + " Repeatable.")
        else:
            kwargs["default"] = None
        if o.metavar and not o.switch:
            kwargs["metavar"] = o.metavar
        out.append((o, (o.flag,), kwargs))
    return out


def given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The options actually given (not None, not an empty list, not a False switch)."""
    return {k: v for k, v in values.items() if v is not None and v != [] and v is not False}


def split(
    options: Mapping[str, Any], *, surface: str = "launch()"
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """``(spec keywords, {backend: its keywords}, launch keywords)`` of the given options, or a
    ``SpecError`` naming an unknown one and the nearest known."""
    parts: dict[str, dict[str, Any]] = {"spec": {}, "launch": {}, **{b: {} for b in BACKEND_PARTS}}
    for key, value in options.items():
        option = BY_KEYWORD.get(key)
        if option is None or (surface == "launch()" and not option.keyword_arg):
            near = difflib.get_close_matches(key, [o.keyword for o in OPTIONS if o.keyword_arg], n=1)
            hint = f"; did you mean {near[0]}=?" if near else f" (known: {', '.join(BY_KEYWORD)})"
            raise SpecError(f"{surface} got an unknown option {key}={value!r}{hint}")
        parts[option.goes_to][key] = value
    return parts["spec"], {b: parts[b] for b in BACKEND_PARTS}, parts["launch"]


def markdown_table() -> str:
    """The documentation's option table (put into docs/reference/options.md as the site is built)."""
    rows = ["| flag | `launch()` keyword | backends | what it does |", "|---|---|---|---|"]
    for o in OPTIONS:
        flag = f"`{o.flag}{' ' + o.metavar if o.metavar and not o.switch else ''}`" if o.magic else "—"
        keyword = f"`{o.keyword}=`" if o.keyword_arg else "—"
        backends = "all" if o.backends == ALL else ", ".join(o.backends)
        rows.append(f"| {flag} | {keyword} | {backends} | {o.help_text} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m notebook_elastic.contract.options: the table, as the docs show it
    print(markdown_table())

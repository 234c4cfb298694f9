"""What to run, separate from where: the job spec, its parsing and its validation.

Pure functions; every error is a ``SpecError`` whose message names the bad value and says
what would be accepted. Flag names follow torchrun's (``--nnodes MIN:MAX``,
``--nproc-per-node``, ``--max-restarts``, ``--rdzv-conf``, ``--monitor-interval``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..errors import SpecError
from .options import checked, declared, option

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_NODES_LIMIT = 1024


def whole_number(value: Any, what: str, example: str) -> int:
    if isinstance(value, bool):
        raise SpecError(f"{what} must be a whole number, not {value!r} (for example {example})")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise SpecError(f"{what} must be a whole number, not {value!r} (for example {example})")
    return int(text)


def parse_nnodes(value: str | int | tuple[int, int]) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4); checks 1 <= MIN <= MAX."""
    if isinstance(value, tuple):
        if len(value) != 2:
            raise SpecError(f"--nnodes must be MIN:MAX, not {value!r}")
        lo, hi = (whole_number(v, "--nnodes", "1:4") for v in value)
    else:
        text = str(value).strip()
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 2 or not all(p.strip() for p in parts):
                raise SpecError(f"--nnodes must be N or MIN:MAX (for example 1:4), not {text!r}")
            lo = whole_number(parts[0], f"--nnodes {text!r}: MIN", "1:4")
            hi = whole_number(parts[1], f"--nnodes {text!r}: MAX", "1:4")
        else:
            lo = hi = whole_number(text, "--nnodes", "2 or 1:4")
    if lo < 1:
        raise SpecError(f"--nnodes {lo}:{hi}: the minimum number of nodes must be at least 1")
    if hi < lo:
        raise SpecError(f"--nnodes {lo}:{hi}: MIN is larger than MAX; write it as {hi}:{lo}")
    if hi > MAX_NODES_LIMIT:
        raise SpecError(f"--nnodes {lo}:{hi}: at most {MAX_NODES_LIMIT} nodes are supported")
    return lo, hi


def validate_name(name: str, what: str = "--name") -> str:
    """Job names are DNS-1123 labels, because they become Kubernetes object names (and local
    job folders: a name is never a path). ``what`` names the input in the sentence."""
    if not isinstance(name, str) or not name:
        raise SpecError(f"{what} must not be empty; use lowercase letters, digits and '-', like 'toy-1'")
    if len(name) > 52:
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise SpecError(
            f"{what} {shown!r} is {len(name)} characters; at most 52 are allowed (room for suffixes "
            "of the Kubernetes objects made from it)"
        )
    if not _DNS1123_LABEL.match(name):
        hint = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "toy-1"
        raise SpecError(
            f"{what} {name!r} is not a valid name: use lowercase letters, digits and '-', starting "
            f"and ending with a letter or digit (for example {hint!r})"
        )
    return name


def new_name() -> str:
    return f"job-{secrets.token_hex(3)}"


def parse_env(items: Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` (or a mapping) -> dict, with clear errors."""
    if not items:
        return {}
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            if "=" not in item:
                raise SpecError(f"--env {item!r} must be KEY=VALUE (for example --env OMP_NUM_THREADS=2)")
            key, value = item.split("=", 1)
            pairs.append((key, value))
    env = {}
    for key, value in pairs:
        if not _ENV_KEY.match(str(key)):
            raise SpecError(
                f"--env {key!r}: an environment variable name is letters, digits and '_', not starting with a digit"
            )
        env[str(key)] = str(value)
    return env


def parse_rdzv_conf(text: str | Mapping[str, str] | None) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` -> dict (torchrun's ``--rdzv-conf`` syntax)."""
    if not text:
        return {}
    if isinstance(text, Mapping):
        return {str(k): str(v) for k, v in text.items()}
    conf = {}
    for part in str(text).split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise SpecError(f"--rdzv-conf {text!r}: each entry must be key=value, like last_call_timeout=1")
        key, value = part.split("=", 1)
        conf[key.strip()] = value.strip()
    for key in ("join_timeout", "last_call_timeout", "keep_alive_interval", "keep_alive_max_attempt"):
        if key in conf:
            if whole_number(conf[key], f"--rdzv-conf {key}", f"{key}=1") < 1:
                raise SpecError(f"--rdzv-conf {key}={conf[key]} must be at least 1")
    if "is_host" in conf:
        raise SpecError("--rdzv-conf is_host is chosen by the backend (the store is hosted apart from the agents)")
    return conf


def _nnodes(value: str | int | tuple[int, int], flag: str) -> tuple[int, int]:
    return parse_nnodes(value)


def _nproc(value: int | str, flag: str) -> int:
    nproc = whole_number(value, flag, "2")
    if nproc < 1:
        raise SpecError(f"{flag} {nproc}: each node needs at least 1 process")
    if nproc > 256:
        raise SpecError(f"{flag} {nproc}: at most 256 processes per node are supported")
    return nproc


def _restarts(value: int | str, flag: str) -> int:
    restarts = whole_number(value, flag, "3")
    if restarts < 0:
        raise SpecError(f"{flag} {restarts} must be 0 or more")
    return restarts


def _nodes(value: int | str, flag: str) -> int:
    return whole_number(value, flag, "2")  # within --nnodes: JobSpec.validated


def _backend(value: str, flag: str) -> str:
    if value not in defaults.BACKENDS:
        raise SpecError(f"{flag} {value!r} is unknown; choose one of: {', '.join(defaults.BACKENDS)}")
    return value


def _checkpoint_dir(value: str, flag: str) -> str:
    if not str(value).strip():
        raise SpecError(f"{flag} must not be empty")
    return os.path.abspath(os.path.expanduser(value))  # where the kernel is: its meaning when typed


def _every(value: int | str, flag: str) -> int:
    every = whole_number(value, flag, "50")
    if every < 1:
        raise SpecError(
            f"{flag} {every}: give 1 or more steps, or leave it out to let State "
            "choose (saving then blocks at most 10 % of the loop)"
        )
    return every


def _env(items: Iterable[str] | Mapping[str, str], flag: str) -> dict[str, str]:
    return parse_env(items)


def _ship(names: Iterable[str], flag: str) -> tuple[str, ...]:
    for name in names:
        if not str(name).isidentifier():
            raise SpecError(f"{flag} {name!r} must name a notebook variable")
    return tuple(names)


def _monitor(value: float | str, flag: str) -> float:
    try:
        monitor = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{flag} must be a number of seconds, not {value!r}") from None
    if not 0 < monitor <= 60:
        raise SpecError(f"{flag} {monitor} must be between 0 and 60 seconds (torchrun's default is 0.1)")
    return monitor


def _rdzv_conf(text: str | Mapping[str, str], flag: str) -> dict[str, str]:
    return parse_rdzv_conf(text)


def _timeout(value: float | str, flag: str) -> float:
    return _seconds(value, flag)


def _stall(value: float | str, flag: str) -> float:
    return _seconds(value, flag, f" (a stall is told after {defaults.STALL_AFTER_S:g} s)")


def _switch(value: bool, flag: str) -> bool:
    return bool(value)


def _max_payload(value: int | str, flag: str) -> int:
    size = parse_size(value, flag)
    if size < 1:
        raise SpecError(f"{flag} {value!r}: the payload size limit must be positive")
    return size


def _track(value: str, flag: str) -> str:
    if value not in TRACKERS:
        raise SpecError(f"{flag} {value!r} is unknown; choose mlflow or wandb (or none to log nowhere)")
    return value  # whether its package is here: JobSpec.validated, which knows the backend


TRACKERS = ("mlflow", "wandb", "none")


@dataclass
class JobSpec:
    """Everything about *what* a job runs and its elastic limits; backends decide *where*.

    Each field declared with ``option()`` is a launch option (a flag of the magic, a keyword of
    ``launch()``, a row of the documentation's table), checked by its declaration in
    ``validated``; ``backend_options`` and ``notebook`` are set by the launcher."""

    # What to run and its elastic limits (torchrun's own flags first).
    nnodes: tuple[int, int] = option(
        "nodes as N or MIN:MAX (an elastic range), like torchrun.", default=(1, 1), check=_nnodes, shown="1:1"
    )
    nodes: int | None = option("nodes to start with (default: MIN).", default=None, check=_nodes, metavar="N")
    nproc_per_node: int = option("worker processes per node.", default=1, check=_nproc)
    max_restarts: int = option(
        "restart budget for failures of the code (departures are free), like torchrun.",
        default=defaults.MAX_RESTARTS,
        check=_restarts,
    )
    name: str = option(
        "job name (lowercase letters, digits, '-'); also the variable holding the job (its '-' as '_').",
        default_factory=new_name,
        check=validate_name,
        empty_is_default=True,
    )
    backend: str = option("where to run: local, kubernetes or slurm.", default="local", check=_backend)
    checkpoint_dir: str | None = option(
        "where State() keeps checkpoints (default: the job folder).",
        default=None,
        check=_checkpoint_dir,
        empty_is_default=True,
    )
    checkpoint_every: int | None = option(
        "State() saves every N steps (and the last); default: chosen so that saving blocks "
        "at most a tenth of the training loop's time over the run.",
        default=None,
        check=_every,
        metavar="N",
    )
    env: dict[str, str] = option(
        "environment variable for the workers; values are kept private.",
        default_factory=dict,
        check=_env,
        repeatable=True,
        metavar="KEY=VALUE",
    )
    ship: tuple[str, ...] = option(
        "ship this notebook variable even if it looks like a credential.",
        default=(),
        check=_ship,
        repeatable=True,
        metavar="NAME",
    )
    monitor_interval_s: float = option(
        "seconds between the agent's worker checks.",
        default=defaults.MONITOR_INTERVAL_S,
        check=_monitor,
        flag="--monitor-interval",
    )
    rdzv_conf: dict[str, str] = option(
        "extra rendezvous settings, k=v,k=v (torchrun syntax).", default_factory=dict, check=_rdzv_conf
    )
    collective_timeout_s: float = option(
        "seconds before a collective operation times out.",
        default=defaults.COLLECTIVE_TIMEOUT_S,
        check=_timeout,
        flag="--collective-timeout",
    )
    # None: a stall is only told
    stall_timeout_s: float | None = option(
        "restart the worker group when no step came for this many seconds; a stall is "
        f"always told after {defaults.STALL_AFTER_S:g} s.",
        default=None,
        check=_stall,
        flag="--stall-timeout",
    )
    torchrun_restarts: bool = option(
        "restart every worker at every change of members, as torchrun does (default: when a node leaves "
        "or joins, the surviving workers keep their processes and the group is rebuilt in place at a step "
        "boundary).",
        default=False,
        check=_switch,
        switch=True,
    )
    max_payload_bytes: int = option(
        "refuse payloads above this size, like 64MiB.",
        default=defaults.MAX_PAYLOAD_BYTES,
        check=_max_payload,
        flag="--max-payload",
        shown="64MiB",
    )
    # None: as the trackers' variables say (supervisor/trackers.py)
    track: str | None = option(
        "log the metrics to one run named after the job: mlflow, wandb, or none (default: MLflow when "
        "MLFLOW_TRACKING_URI is set, W&B when WANDB_PROJECT is; on Kubernetes rank 0's pod logs, with "
        "the variables and credentials given by --env).",
        default=None,
        check=_track,
        metavar="TRACKER",
    )
    backend_options: dict[str, Any] = field(default_factory=dict)
    notebook: str | None = None  # the notebook that launched it, for the jobs panel

    @property
    def min_nodes(self) -> int:
        return self.nnodes[0]

    @property
    def max_nodes(self) -> int:
        return self.nnodes[1]

    @property
    def initial_nodes(self) -> int:
        return self.nodes if self.nodes is not None else self.min_nodes

    def validated(self) -> JobSpec:
        """A normalized copy, or a ``SpecError`` naming the first bad option: each option by its
        declaration's check, then what one option says of another."""
        spec = dataclasses.replace(
            self,
            **{
                o.keyword: checked(o, getattr(self, o.keyword))
                for o in SPEC_OPTIONS
                if getattr(self, o.keyword) is not None
            },
        )
        lo, hi = spec.nnodes
        if spec.nodes is not None and not lo <= spec.nodes <= hi:
            raise SpecError(
                f"--nodes {spec.nodes} is outside --nnodes {lo}:{hi}; start with a number of nodes inside the range"
            )
        if spec.track is not None:
            _check_track(spec.track, spec.backend)
        return spec

    def to_json(self) -> dict[str, Any]:
        """The spec as it is stored (job folder, Kubernetes annotation): ``env`` as names only,
        because its values may be credentials; each backend carries the values apart."""
        data = dataclasses.asdict(self)
        data["env"] = sorted(self.env)
        data["nnodes"] = list(self.nnodes)
        data["ship"] = list(self.ship)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["nnodes"] = tuple(kwargs.get("nnodes", (1, 1)))
        kwargs["ship"] = tuple(kwargs.get("ship", ()))
        env = kwargs.get("env") or {}
        # Names only (see to_json): the values are filled in by whoever holds them.
        kwargs["env"] = {str(k): "" for k in env} if not isinstance(env, Mapping) else dict(env)
        return cls(**kwargs)


#: The job's own launch options, as declared on its fields.
SPEC_OPTIONS = declared(JobSpec, "spec")


def _check_track(track: str, backend: str) -> None:
    # On a cluster, rank 0's pod logs (runtime/pod_tracking.py): the package is the image's to have.
    if backend == "local" and track != "none" and importlib.util.find_spec(track) is None:
        raise SpecError(
            f"--track {track} needs the {track} package: pip install 'notebook-elastic[{track}]', or leave --track out"
        )


def parse_size(value: Any, what: str = "--max-payload") -> int:
    """``64MiB``, ``100MB``, ``1048576`` (or an int) -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower().replace(" ", "")
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "b": 1}
    number = text
    factor = 1
    for unit, size in units.items():
        if text.endswith(unit):
            number, factor = text[: -len(unit)], size
            break
    try:
        return int(float(number) * factor)
    except (ValueError, OverflowError):
        raise SpecError(f"{what} {value!r} must be a size like 64MiB or 100MB") from None


def _seconds(value: Any, flag: str, why: str = "") -> float:
    """A timeout of at least 1 second, or a ``SpecError`` naming the flag."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{flag} must be a number of seconds, not {value!r}") from None
    if seconds < 1:
        raise SpecError(f"{flag} {seconds} must be at least 1 second{why}")
    return seconds


def check_scale(spec_range: tuple[int, int], nodes: Any) -> int:
    n = whole_number(nodes, "scale(nodes)", "2")
    lo, hi = spec_range
    if not lo <= n <= hi:
        raise SpecError(out_of_range(n, lo, hi))
    return n


def out_of_range(n: int, lo: int, hi: int) -> str:
    """Why a scale to ``n`` nodes is refused in the range ``lo:hi``, and what to do instead."""
    if n < 1:
        return f"cannot scale to {n} nodes: a job runs on at least 1 node (stop() ends it)"
    wider = f"set_range({n}, {hi})" if n < lo else f"set_range({lo}, {n})"
    return f"cannot scale to {n} nodes: the job's range is {lo}:{hi}; widen it with {wider} first"

"""What to run, separate from where: the job spec, its parsing and its validation.

Pure functions; every error is a ``SpecError`` whose message names the bad value and says
what would be accepted. Flag names follow torchrun's (``--nnodes MIN:MAX``,
``--nproc-per-node``, ``--max-restarts``, ``--rdzv-conf``, ``--monitor-interval``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..errors import SpecError

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


@dataclass
class JobSpec:
    """Everything about *what* a job runs and its elastic limits; backends decide *where*."""

    name: str = field(default_factory=new_name)
    nnodes: tuple[int, int] = (1, 1)
    nodes: int | None = None  # nodes to start with; default: the minimum
    nproc_per_node: int = 1
    max_restarts: int = defaults.MAX_RESTARTS
    backend: str = "local"
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None  # State saves every N steps (None: State chooses)
    env: dict[str, str] = field(default_factory=dict)
    monitor_interval_s: float = defaults.MONITOR_INTERVAL_S
    rdzv_conf: dict[str, str] = field(default_factory=dict)
    collective_timeout_s: float = defaults.COLLECTIVE_TIMEOUT_S
    stall_timeout_s: float | None = None  # restart the group after a stall this long (None: only say so)
    torchrun_restarts: bool = False  # every change of members restarts every worker (no in place)
    max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES
    track: str | None = None  # "mlflow", "wandb" or "none"; None: as their variables say (trackers.py)
    ship: tuple[str, ...] = ()
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
        """A normalized copy, or a ``SpecError`` naming the first bad option."""
        validate_name(self.name)
        nnodes = parse_nnodes(self.nnodes)
        nproc = whole_number(self.nproc_per_node, "--nproc-per-node", "2")
        if nproc < 1:
            raise SpecError(f"--nproc-per-node {nproc}: each node needs at least 1 process")
        if nproc > 256:
            raise SpecError(f"--nproc-per-node {nproc}: at most 256 processes per node are supported")
        restarts = whole_number(self.max_restarts, "--max-restarts", "3")
        if restarts < 0:
            raise SpecError(f"--max-restarts {restarts} must be 0 or more")
        if self.backend not in defaults.BACKENDS:
            raise SpecError(f"--backend {self.backend!r} is unknown; choose one of: {', '.join(defaults.BACKENDS)}")
        nodes = self.nodes
        if nodes is not None:
            nodes = whole_number(nodes, "--nodes", "2")
            if not nnodes[0] <= nodes <= nnodes[1]:
                raise SpecError(
                    f"--nodes {nodes} is outside --nnodes {nnodes[0]}:{nnodes[1]}; start with a "
                    "number of nodes inside the range"
                )
        try:
            monitor = float(self.monitor_interval_s)
        except (TypeError, ValueError):
            raise SpecError(
                f"--monitor-interval must be a number of seconds, not {self.monitor_interval_s!r}"
            ) from None
        if not 0 < monitor <= 60:
            raise SpecError(
                f"--monitor-interval {monitor} must be between 0 and 60 seconds (torchrun's default is 0.1)"
            )
        collective = _seconds(self.collective_timeout_s, "--collective-timeout")
        stall = self.stall_timeout_s
        if stall is not None:
            stall = _seconds(stall, "--stall-timeout", " (a stall is told after 30 s)")
        max_payload = parse_size(self.max_payload_bytes)
        if max_payload < 1:
            raise SpecError(f"--max-payload {self.max_payload_bytes!r}: the payload size limit must be positive")
        for name in self.ship:
            if not str(name).isidentifier():
                raise SpecError(f"--ship {name!r} must name a notebook variable")
        if self.checkpoint_dir is not None and not str(self.checkpoint_dir).strip():
            raise SpecError("--checkpoint-dir must not be empty")
        if self.track is not None:
            _check_track(self.track, self.backend)
        every = self.checkpoint_every
        if every is not None:
            every = whole_number(every, "--checkpoint-every", "50")
            if every < 1:
                raise SpecError(
                    f"--checkpoint-every {every}: give 1 or more steps, or leave it out to let State "
                    "choose (saving then blocks at most 10 % of the loop)"
                )
        return dataclasses.replace(
            self,
            nnodes=nnodes,
            nodes=nodes,
            nproc_per_node=nproc,
            max_restarts=restarts,
            env=parse_env(self.env),
            monitor_interval_s=monitor,
            rdzv_conf=parse_rdzv_conf(self.rdzv_conf),
            collective_timeout_s=collective,
            stall_timeout_s=stall,
            max_payload_bytes=max_payload,
            ship=tuple(self.ship),
            checkpoint_every=every,
            torchrun_restarts=bool(self.torchrun_restarts),
        )

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


def _check_track(track: Any, backend: str) -> None:
    if track not in ("mlflow", "wandb", "none"):
        raise SpecError(f"--track {track!r} is unknown; choose mlflow or wandb (or none to log nowhere)")
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
        raise SpecError(f"cannot scale to {n} nodes: the job's range is {lo}:{hi}; widen it with set_range() first")
    return n

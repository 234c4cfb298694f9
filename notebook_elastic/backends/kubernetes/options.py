"""Kubernetes options of a job (image, GPUs, placement, storage), parsed and validated.

Pure: flag strings in, a ``KubernetesOptions`` out, or a ``SpecError`` naming the bad flag
and the fix.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...agent.notice_keeper import LEAVE_S
from ...contract.options import declared, option, parse
from ...contract.spec import whole_number
from ...errors import SpecError

# The official PyTorch image of the torch the project is tested with (torch_adapter.TESTED_TORCH;
# tests/test_kubernetes_manifests.py keeps them in step).
DEFAULT_IMAGE = "pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime"
# The store's image beside workers on Docker Hub's official PyTorch images: its server is the
# standard library alone (store/server.py), so a Docker Official Python image of ~45 MB
# from the same registry, instead of a CUDA image of several GB on the node that hosts it.
STORE_IMAGE = "python:3.12-slim"
_DOCKER_HUB_PYTORCH = re.compile(r"^(?:docker\.io/)?pytorch/pytorch(?::|@|$)")
# Official PyTorch images name their torch in the tag: pytorch/pytorch:2.13.0-cuda12.8-...
_OFFICIAL_IMAGE = re.compile(r"^(?:(?:docker\.io|ghcr\.io)/)?pytorch/pytorch:(\d+)\.(\d+)(?:\.\d+)?(?:-|$)")
WORKLOADS = ("job", "pods", "pytorchjob")
POD_SECURITY_LEVELS = ("baseline", "restricted")  # the Pod Security Standards a namespace may enforce
# Requests per torchrun process when --cpu/--memory are not given: without any, CPU workers
# run BestEffort and are the first a node evicts under pressure.
# --grace: the notice's keeper passes the SIGTERM on this long before the end (agent/notice_keeper.py);
# the least grace leaves a second beside it for a save.
MIN_GRACE_S = int(LEAVE_S) + 2
DEFAULT_GRACE_S = 30  # before any save of the job was measured (grace.py derives it after)
MAX_GRACE_S = 86_400  # a day: the most --grace takes, and the most grace.py derives
DEFAULT_CPU_PER_PROCESS = 1
DEFAULT_MEMORY_PER_PROCESS_GI = 2
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_LABEL_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def image_torch(image: str) -> tuple[int, int] | None:
    """The (major, minor) torch an official PyTorch image carries, read from its tag; None
    for any other image (its torch is known only inside the pod)."""
    m = _OFFICIAL_IMAGE.match(image.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def runtime_twin(image: str) -> str:
    """An official PyTorch ``-devel`` image's ``-runtime`` twin (the same tag but the last
    word: the same torch build, without the CUDA compilers and headers the devel one adds);
    any other image as it is. Official tags come in such pairs
    (``pytorch/pytorch:2.13.0-cuda12.8-cudnn9-devel`` / ``...-runtime``)."""
    text = image.strip()
    if image_torch(text) is not None and text.endswith("-devel"):
        return text[: -len("-devel")] + "-runtime"
    return image


def untested_torch_warning(image: str, flag: str = "--image") -> str | None:
    """One sentence when ``image`` is an official PyTorch image whose torch is outside the
    range notebook-elastic is tested with (its agent reaches into torch internals)."""
    from ...agent.torch_adapter import tested_torch_text, torch_is_tested

    version = image_torch(image)
    if version is None or torch_is_tested(version):
        return None
    return (
        f"{flag} {image} carries torch {version[0]}.{version[1]}, outside the torch notebook-elastic is tested "
        f"with ({tested_torch_text()}): the job may run degraded or fail; use an image with a tested torch, "
        f"like {DEFAULT_IMAGE}"
    )


def parse_toleration(text: str, flag: str = "--toleration") -> dict[str, str]:
    """``key=value:Effect``, ``key:Effect``, ``key=value`` or ``key`` -> a toleration."""
    body, _, effect = text.partition(":")
    if effect and effect not in _EFFECTS:
        raise SpecError(f"{flag} {text!r}: the effect must be one of {', '.join(_EFFECTS)}")
    key, eq, value = body.partition("=")
    if not key or not _LABEL_NAME.match(key):
        raise SpecError(f"{flag} {text!r} must look like key=value:NoSchedule (for example nvidia.com/gpu:NoSchedule)")
    tol: dict[str, str] = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        tol["value"] = value
    if effect:
        tol["effect"] = effect
    return tol


def parse_selector(items: Iterable[str] | Mapping[str, str] | None, flag: str = "--node-selector") -> dict[str, str]:
    if not items:
        return {}
    pairs = (
        items.items()
        if isinstance(items, Mapping)
        else [tuple(i.split("=", 1)) if "=" in i else (i, None) for i in items]
    )
    out = {}
    for key, value in pairs:
        if value is None or not _LABEL_NAME.match(str(key)) or not _LABEL_VALUE.match(str(value)):
            raise SpecError(
                f"{flag} {key}{'=' + value if value else ''!s}: write it as label=value (for example node.kubernetes.io/lifecycle=spot)"
            )
        out[str(key)] = str(value)
    return out


def _quantity(value: str, flag: str) -> str:
    value = str(value).strip()
    if not _QUANTITY.match(value):
        raise SpecError(f"{flag} {value!r} is not a Kubernetes quantity (for example 4, 500m, 16Gi)")
    return value


def _name(value: str, flag: str) -> str:
    if not _DNS1123.match(value) or len(value) > 253:
        raise SpecError(f"{flag} {value!r} is not a valid Kubernetes name (lowercase letters, digits, '-' and '.')")
    return value


def _names(values: Iterable[str], flag: str) -> list[str]:
    return [_name(v, flag) for v in values]


def _image(value: str, flag: str) -> str:
    if not value.strip() or any(c.isspace() for c in value):
        raise SpecError(f"{flag} {value!r} is not an image reference (for example {DEFAULT_IMAGE})")
    return value


def _gpus(value: int | str, flag: str) -> int:
    gpus = whole_number(value, f"{flag} (GPUs per pod)", "1, or 0 for CPU pods")
    if gpus < 0:
        raise SpecError(f"{flag} {gpus} must be 0 or more")
    return gpus


def _tolerations(values: Iterable[str], flag: str) -> list[dict[str, str]]:
    return [parse_toleration(t, flag) for t in values]


def _selector(items: Iterable[str] | Mapping[str, str], flag: str) -> dict[str, str]:
    return parse_selector(items, flag)


def _grace(value: int | str, flag: str) -> int:
    grace = whole_number(value, f"{flag} (seconds between the kubelet's SIGTERM and its SIGKILL)", "30")
    if not MIN_GRACE_S <= grace <= MAX_GRACE_S:
        raise SpecError(
            f"{flag} {grace} is outside {MIN_GRACE_S}..{MAX_GRACE_S} seconds: the job saves on notice within the grace "
            f"less {LEAVE_S:g} s for its agent to leave, so give at least {MIN_GRACE_S} (the save's time plus a step "
            "and 4 s is enough)"
        )
    return grace


def _queue(value: str, flag: str) -> str:
    if len(value) > 63:
        raise SpecError(f"{flag} {value!r} is longer than 63 characters, more than a label value may hold")
    return _name(value, flag)


def _workload(value: str, flag: str) -> str:
    if value not in WORKLOADS:
        raise SpecError(f"{flag} {value!r} is unknown; choose one of: {', '.join(WORKLOADS)}")
    return value


def _pod_security(value: str, flag: str) -> str:
    if value not in POD_SECURITY_LEVELS:
        raise SpecError(
            f"{flag} {value!r} is unknown; choose one of: {', '.join(POD_SECURITY_LEVELS)} "
            "(the level your namespace enforces: kubectl get ns NAME --show-labels)"
        )
    return value


@dataclass
class KubernetesOptions:
    """Where a job's pods run. Each field declared with ``option()`` is a launch option (a flag
    of the magic, a keyword of ``launch()``, checked by its declaration as ``parse`` makes one);
    the others are set by the backend."""

    # None: the kubeconfig context's namespace, else "default"
    namespace: str | None = option("the namespace (default: the context's).", default=None, check=_name)
    context: str | None = option("the kubeconfig context (default: the current one).", default=None)
    image: str = option(
        "the container image (needs torch; default a PyTorch CUDA image).",
        default=DEFAULT_IMAGE,
        check=_image,
        shown=None,
    )
    # Per pod; None: --nproc-per-node; 0: CPU pods.
    gpus: int | None = option(
        "nvidia.com/gpu per pod (default: --nproc-per-node; 0 for CPU pods).", default=None, check=_gpus
    )
    cpu: str | None = option("CPU request per pod, like 8 or 500m.", default=None, check=_quantity)
    memory: str | None = option("memory per pod, like 32Gi.", default=None, check=_quantity)
    tolerations: list[dict[str, str]] = option(
        "worker toleration.",
        default_factory=list,
        check=_tolerations,
        flag="--toleration",
        repeatable=True,
        metavar="KEY=VALUE:EFFECT",
    )
    node_selector: dict[str, str] = option(
        "worker node selector.", default_factory=dict, check=_selector, repeatable=True, metavar="LABEL=VALUE"
    )
    rdzv_tolerations: list[dict[str, str]] = option(
        "toleration of the rendezvous pod.",
        default_factory=list,
        check=_tolerations,
        flag="--rdzv-toleration",
        repeatable=True,
        metavar="KEY=VALUE:EFFECT",
    )
    rdzv_node_selector: dict[str, str] = option(
        "node selector of the rendezvous pod (e.g. on-demand nodes; without one it is kept off spot nodes "
        "when the workers tolerate spot).",
        default_factory=dict,
        check=_selector,
        repeatable=True,
        metavar="LABEL=VALUE",
    )
    # The workers' (often a low, preemptible one for spot).
    priority_class: str | None = option("priorityClassName of the pods.", default=None, check=_name)
    # The store's image. None: a small Python image when the workers' is Docker Hub's official
    # PyTorch image (the store needs Python alone), else the workers' own (a registry the
    # cluster can pull from; its -runtime twin for an official -devel image).
    rdzv_image: str | None = option(
        "image of the rendezvous store (any image with Python 3: the store needs no torch; default: "
        "python:3.12-slim beside Docker Hub's pytorch/pytorch images, else --image, or its -runtime twin for an "
        "official -devel image).",
        default=None,
        check=_image,
    )
    # The store's own; never the workers'.
    rdzv_priority_class: str | None = option(
        "priorityClassName of the rendezvous pod (never the workers').", default=None, check=_name
    )
    service_account: str | None = option("serviceAccountName of the pods.", default=None, check=_name)
    image_pull_secrets: list[str] = option(
        "image pull secret.",
        default_factory=list,
        check=_names,
        flag="--image-pull-secret",
        repeatable=True,
        metavar="NAME",
    )
    pvc: str | None = option(
        "PersistentVolumeClaim for checkpoints (needed when MAX nodes > 1).", default=None, check=_name
    )
    shm_size: str | None = option("size of /dev/shm in the workers.", default="2Gi", check=_quantity)
    # The worker pods' terminationGracePeriodSeconds: a save on notice fits in it. None until the
    # backend derives it from the job's last measured save (grace.py); given, it is the user's.
    grace: int | None = option(
        "seconds a worker pod is given between the kubelet's SIGTERM and its SIGKILL "
        "(terminationGracePeriodSeconds): the job saves on that notice first, within it less 3 s for the "
        "agent to leave. Default: derived from the longest save the last run of this job name measured "
        "(1.5 x it + 5 s), at least 30; 30 before any was measured. The dry-run says which.",
        default=None,
        check=_grace,
        metavar="SECONDS",
    )
    # A Kueue LocalQueue (kueue.py).
    queue: str | None = option(
        "Kueue LocalQueue to queue the workers in: they are created suspended and start when Kueue admits "
        "them; the views say what quota they wait for, and a Kueue preemption is a notice (the job saves first).",
        default=None,
        check=_queue,
        metavar="NAME",
    )
    workload: str = option(
        "job (an elastic Indexed Job), pods, or pytorchjob (Kubeflow).", default="job", check=_workload
    )
    # "restricted": pods pass a namespace enforcing that level.
    pod_security: str = option(
        "baseline, or restricted: non-root, no privilege escalation, capabilities dropped, RuntimeDefault seccomp "
        "(for namespaces that enforce that Pod Security level).",
        default="baseline",
        check=_pod_security,
        shown=None,
    )
    grace_given: bool = False
    ttl_seconds_after_finished: int = 3600
    rdzv_port: int = 29400

    @classmethod
    def parse(cls, given: Mapping[str, Any]) -> KubernetesOptions:
        """Validated options from the values given (``SpecError`` on the first bad one): each by
        its declaration, then what one says of another."""
        options = parse(cls, given, what="the Kubernetes options")
        if options.queue is not None and options.workload == "pods":
            raise SpecError(
                "--queue needs a workload Kueue admits as one: the default --workload job (or pytorchjob), not pods"
            )
        options.grace_given = options.grace is not None
        return options

    @property
    def pod_grace(self) -> int:
        """The pods' grace: as resolved by the backend, else (a pure build) the default."""
        return self.grace if self.grace is not None else DEFAULT_GRACE_S

    @property
    def store_image(self) -> str:
        """--rdzv-image; else, beside Docker Hub's official PyTorch images, a small Python
        image from the same registry (the store server is the standard library alone); else
        the workers' image, which the cluster can pull (an official -devel one's -runtime
        twin: the store needs no compiler)."""
        if self.rdzv_image:
            return self.rdzv_image
        if _DOCKER_HUB_PYTORCH.match(self.image.strip()):
            return STORE_IMAGE
        return runtime_twin(self.image)

    def gpus_per_pod(self, nproc_per_node: int) -> int:
        return nproc_per_node if self.gpus is None else self.gpus

    def requests(self, nproc_per_node: int) -> dict[str, str]:
        """The worker's cpu/memory requests: the flags, else a default per process."""
        return {
            "cpu": self.cpu or str(DEFAULT_CPU_PER_PROCESS * nproc_per_node),
            "memory": self.memory or f"{DEFAULT_MEMORY_PER_PROCESS_GI * nproc_per_node}Gi",
        }

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> KubernetesOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


def parse_options(**given: Any) -> KubernetesOptions:
    """Validated options from flag values (``KubernetesOptions.parse``)."""
    return KubernetesOptions.parse(given)


#: The Kubernetes launch options, as declared on ``KubernetesOptions``' fields.
OPTIONS = declared(KubernetesOptions, "kubernetes", backends=("kubernetes",))

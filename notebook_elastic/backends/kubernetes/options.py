"""Kubernetes options of a job (image, GPUs, placement, storage), parsed and validated.

Pure: flag strings in, a ``KubernetesOptions`` out, or a ``SpecError`` naming the bad flag
and the fix.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...agent.notice_keeper import LEAVE_S
from ...contract.spec import whole_number
from ...errors import SpecError

# The official PyTorch image of the torch the project is tested with (torch_compat.TESTED_TORCH;
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
    from ...agent.torch_compat import tested_torch_text, torch_is_tested

    version = image_torch(image)
    if version is None or torch_is_tested(version):
        return None
    return (
        f"{flag} {image} carries torch {version[0]}.{version[1]}, outside the torch notebook-elastic is tested "
        f"with ({tested_torch_text()}): the job may run degraded or fail; use an image with a tested torch, "
        f"like {DEFAULT_IMAGE}"
    )


def parse_toleration(text: str, flag: str = "--toleration") -> dict[str, Any]:
    """``key=value:Effect``, ``key:Effect``, ``key=value`` or ``key`` -> a toleration."""
    body, _, effect = text.partition(":")
    if effect and effect not in _EFFECTS:
        raise SpecError(f"{flag} {text!r}: the effect must be one of {', '.join(_EFFECTS)}")
    key, eq, value = body.partition("=")
    if not key or not _LABEL_NAME.match(key):
        raise SpecError(f"{flag} {text!r} must look like key=value:NoSchedule (for example nvidia.com/gpu:NoSchedule)")
    tol: dict[str, Any] = {"key": key, "operator": "Equal" if eq else "Exists"}
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


def _quantity(value: str | None, flag: str) -> str | None:
    if value is None:
        return None
    value = str(value).strip()
    if not _QUANTITY.match(value):
        raise SpecError(f"{flag} {value!r} is not a Kubernetes quantity (for example 4, 500m, 16Gi)")
    return value


def _name(value: str | None, flag: str) -> str | None:
    if value is None:
        return None
    if not _DNS1123.match(value) or len(value) > 253:
        raise SpecError(f"{flag} {value!r} is not a valid Kubernetes name (lowercase letters, digits, '-' and '.')")
    return value


@dataclass
class KubernetesOptions:
    namespace: str | None = None  # None: the kubeconfig context's namespace, else "default"
    context: str | None = None
    image: str = DEFAULT_IMAGE
    # The store's image. None: a small Python image when the workers' is Docker Hub's official
    # PyTorch image (the store needs Python alone), else the workers' own (a registry the
    # cluster can pull from; its -runtime twin for an official -devel image).
    rdzv_image: str | None = None
    gpus: int | None = None  # per pod; None: --nproc-per-node; 0: CPU pods
    cpu: str | None = None
    memory: str | None = None
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    rdzv_tolerations: list[dict[str, Any]] = field(default_factory=list)
    rdzv_node_selector: dict[str, str] = field(default_factory=dict)
    priority_class: str | None = None  # the workers' (often a low, preemptible one for spot)
    rdzv_priority_class: str | None = None  # the store's own; never the workers'
    service_account: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    pvc: str | None = None
    shm_size: str | None = "2Gi"
    # The worker pods' terminationGracePeriodSeconds: a save on notice fits in it. None until the
    # backend derives it from the job's last measured save (grace.py); given, it is the user's.
    grace: int | None = None
    grace_given: bool = False
    workload: str = "job"
    queue: str | None = None  # a Kueue LocalQueue (kueue.py)
    pod_security: str = "baseline"  # "restricted": pods pass a namespace enforcing that level
    ttl_seconds_after_finished: int = 3600
    rdzv_port: int = 29400

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


def parse_options(
    *,
    namespace: str | None = None,
    context: str | None = None,
    image: str | None = None,
    rdzv_image: str | None = None,
    gpus: int | str | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    tolerations: Iterable[str] = (),
    node_selector: Iterable[str] | Mapping[str, str] = (),
    rdzv_tolerations: Iterable[str] = (),
    rdzv_node_selector: Iterable[str] | Mapping[str, str] = (),
    priority_class: str | None = None,
    rdzv_priority_class: str | None = None,
    service_account: str | None = None,
    image_pull_secrets: Iterable[str] = (),
    pvc: str | None = None,
    shm_size: str | None = "2Gi",
    grace: int | str | None = None,
    workload: str = "job",
    queue: str | None = None,
    pod_security: str | None = None,
) -> KubernetesOptions:
    """Validated options from flag values (``SpecError`` on the first bad one)."""
    if gpus is not None:
        gpus = whole_number(gpus, "--gpus (GPUs per pod)", "1, or 0 for CPU pods")
        if gpus < 0:
            raise SpecError(f"--gpus {gpus} must be 0 or more")
    if pod_security is not None and pod_security not in POD_SECURITY_LEVELS:
        raise SpecError(
            f"--pod-security {pod_security!r} is unknown; choose one of: {', '.join(POD_SECURITY_LEVELS)} "
            "(the level your namespace enforces: kubectl get ns NAME --show-labels)"
        )
    if grace is not None:
        grace = whole_number(grace, "--grace (seconds between the kubelet's SIGTERM and its SIGKILL)", "30")
    if grace is not None and not MIN_GRACE_S <= grace <= MAX_GRACE_S:
        raise SpecError(
            f"--grace {grace} is outside {MIN_GRACE_S}..{MAX_GRACE_S} seconds: the job saves on notice within the grace "
            f"less {LEAVE_S:g} s for its agent to leave, so give at least {MIN_GRACE_S} (the save's time plus a step "
            "and 4 s is enough)"
        )
    if workload not in WORKLOADS:
        raise SpecError(f"--workload {workload!r} is unknown; choose one of: {', '.join(WORKLOADS)}")
    if queue is not None and workload == "pods":
        raise SpecError(
            "--queue needs a workload Kueue admits as one: the default --workload job (or pytorchjob), not pods"
        )
    if queue is not None and len(queue) > 63:
        raise SpecError(f"--queue {queue!r} is longer than 63 characters, more than a label value may hold")
    for flag, value in (("--image", image), ("--rdzv-image", rdzv_image)):
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise SpecError(f"{flag} {value!r} is not an image reference (for example {DEFAULT_IMAGE})")
    return KubernetesOptions(
        namespace=_name(namespace, "--namespace"),
        context=context,
        image=image or DEFAULT_IMAGE,
        rdzv_image=rdzv_image or None,
        gpus=gpus,
        cpu=_quantity(cpu, "--cpu"),
        memory=_quantity(memory, "--memory"),
        tolerations=[parse_toleration(t) for t in tolerations],
        node_selector=parse_selector(node_selector),
        rdzv_tolerations=[parse_toleration(t, "--rdzv-toleration") for t in rdzv_tolerations],
        rdzv_node_selector=parse_selector(rdzv_node_selector, "--rdzv-node-selector"),
        priority_class=_name(priority_class, "--priority-class"),
        rdzv_priority_class=_name(rdzv_priority_class, "--rdzv-priority-class"),
        service_account=_name(service_account, "--service-account"),
        image_pull_secrets=[_name(s, "--image-pull-secret") or "" for s in image_pull_secrets],
        pvc=_name(pvc, "--pvc"),
        shm_size=_quantity(shm_size, "--shm-size"),
        grace=grace,
        grace_given=grace is not None,
        workload=workload,
        queue=_name(queue, "--queue"),
        pod_security=pod_security or "baseline",
    )

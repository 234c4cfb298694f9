"""How a job's Kubernetes objects are named and found: the ``app.kubernetes.io`` labels,
selectors, annotations, object names, and the paths and limits every object shares."""

from __future__ import annotations

from ..._version import __version__
from ...runtime.payload import PAYLOAD_SUFFIX

NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "app.kubernetes.io/managed-by"
VERSION = "app.kubernetes.io/version"
APP = "notebook-elastic"
ANNOTATION_SPEC = "notebook-elastic.io/spec"
ANNOTATION_NOTEBOOK = "notebook-elastic.io/notebook"
ANNOTATION_EPOCH = "notebook-elastic.io/rdzv-epoch"
ANNOTATION_RUN = "notebook-elastic.io/run-id"
CODE_MOUNT = "/opt/notebook-elastic"
SCRIPT = "script.py"
PAYLOAD = "script" + PAYLOAD_SUFFIX
RUNTIME_ZIP = "runtime.zip"
MODULES_ZIP = "modules.zip"  # the notebook's own modules the code imports, when there are any
FILES_ZIP = "files.zip"  # files the code reads by a relative name, unpacked into the working directory
CHECKPOINT_MOUNT = "/checkpoints"
PYTORCHJOB_CONTAINER = "pytorch"  # the name Kubeflow's PyTorchJob webhook requires
MAX_HOSTNAME = 63  # a pod's hostname (an Indexed Job's pods: <job>-<index>) is a DNS-1123 label
MAX_CONFIGMAP_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's data


def labels(job: str, component: str) -> dict[str, str]:
    return {NAME: APP, INSTANCE: job, COMPONENT: component, MANAGED_BY: APP, VERSION: __version__}


def selector(job: str, component: str | None = None) -> str:
    parts = [f"{NAME}={APP}", f"{INSTANCE}={job}"]
    if component:
        parts.append(f"{COMPONENT}={component}")
    return ",".join(parts)


def code_name(job: str) -> str:
    return f"{job}-code"


def rdzv_name(job: str) -> str:
    return f"{job}-rdzv"


def workers_name(job: str) -> str:
    return f"{job}-workers"


def env_name(job: str) -> str:
    return f"{job}-env"

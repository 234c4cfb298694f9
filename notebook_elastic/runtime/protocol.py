"""The wire contract between workers, agents and the notebook side.

Everything that crosses a process boundary is named here once: the prefix of event lines,
the environment variables a backend sets for agents and workers, and the checkpoint file
names. Worker-side module: imports only the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

#: Every structured line a worker or agent writes starts with this prefix, then compact JSON.
EVENT_PREFIX = "@@elastic "

# Environment set by a backend (the supervisor or a pod spec) for agents and workers.
ENV_JOB = "NOTEBOOK_ELASTIC_JOB"  # the job's name
ENV_JOB_DIR = "NOTEBOOK_ELASTIC_JOB_DIR"  # local backend: the job folder (also marks our processes)
ENV_NODE = "NOTEBOOK_ELASTIC_NODE"  # the node (agent) name: node-0, a pod name, ...
ENV_CHECKPOINT_DIR = "NOTEBOOK_ELASTIC_CHECKPOINT_DIR"
ENV_PAYLOAD = "NOTEBOOK_ELASTIC_PAYLOAD"  # path of the payload file, when not beside the script
# A zip of the notebook-folder files the code reads by a relative name (pods): the agent unpacks
# it into its working directory before the workers start.
ENV_WORKDIR_FILES = "NOTEBOOK_ELASTIC_WORKDIR_FILES"
ENV_COLLECTIVE_TIMEOUT_S = "NOTEBOOK_ELASTIC_COLLECTIVE_TIMEOUT_S"
ENV_CHECKPOINT_EVERY = "NOTEBOOK_ELASTIC_CHECKPOINT_EVERY"  # State saves every N steps (unset: chosen)
ENV_SUPERVISOR_PID = "NOTEBOOK_ELASTIC_SUPERVISOR_PID"  # an agent exits when this process dies
ENV_RDZV_EPOCH = "NOTEBOOK_ELASTIC_RDZV_EPOCH"  # bumped each time a backend restarts all agents
ENV_FILES_SHA256 = "NOTEBOOK_ELASTIC_FILES_SHA256"  # JSON {path: sha256} of the script and payload at launch
# Set by our agent wrapper for its workers.
ENV_AGENT_PID = "NOTEBOOK_ELASTIC_AGENT_PID"  # a worker exits when its agent dies
ENV_ROUND = "NOTEBOOK_ELASTIC_ROUND"  # the rendezvous round the worker group was formed in
#: A job run's rendezvous id, where the backend does not number its runs itself (Kubernetes):
#: the run's generations start above every one already in its checkpoint folder, so a new
#: job reads an old job's checkpoints instead of being fenced off by them.
ENV_RUN = "NOTEBOOK_ELASTIC_RUN"

#: Our agent's exit status when its workers failed more often than --max-restarts allows
#: (torchrun itself exits 1 then, as it does on SIGTERM). A Kubernetes Job fails at once on
#: it (podFailurePolicy FailJob) instead of replacing the pod to fail the same way again.
EXIT_RESTARTS_SPENT = 3
#: Our agent's exit status when the job's script or payload is no longer what was launched:
#: it refuses to start workers from files someone changed.
EXIT_FILES_CHANGED = 4

#: A worker's exit status when its collective broke because a peer went away (gloo's
#: "connection closed by peer", a store that lost a member, a newer group fencing this one):
#: not its own failure. The agent restarts such a group without charging --max-restarts,
#: once it has seen the membership change (EX_TEMPFAIL: try again).
EXIT_PEER_LOST = 75

# What a broken collective says when a peer vanished, in torch's gloo/NCCL/store errors.
PEER_LOST_PATTERNS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connectfullmesh",
    "communicator was aborted",
    "remote process exited",
    "socket closed",
)


def exit_reason(code: int | None) -> str:
    """Why an agent (a local node, a worker pod's container) ended, from its exit status."""
    if code == 0:
        return "finished"
    if code == EXIT_RESTARTS_SPENT:
        return "restart budget spent"
    if code == EXIT_FILES_CHANGED:
        return "its script or payload changed"
    return f"exited with code {code}"


def sha256_of(path: str | os.PathLike) -> str | None:
    """The file's sha256 (hex), or None when it is gone."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def changed_files(expected: dict[str, str] | str | None) -> list[str]:
    """Which of the launched files (``{path: sha256}``, or its JSON) differ from what was launched."""
    if isinstance(expected, str):
        expected = json.loads(expected) if expected.strip() else {}
    return [path for path, digest in sorted((expected or {}).items()) if sha256_of(path) != digest]


def files_changed_reason(paths: list[str]) -> str:
    """The one sentence a job that refused to run changed files fails with."""
    names = ", ".join(os.path.basename(p) for p in paths)
    return (
        f"{names} changed after launch (sha256 differs from what was launched), so it was not run again; "
        "relaunch the cell to run new code"
    )


#: Rendezvous rounds restart at 0 with each rendezvous epoch; a generation orders both.
GENERATION_EPOCH_STRIDE = 1_000_000

# Checkpoint files: ordered by (generation, step); the name sorts the same way. A sharded
# model's checkpoint is a folder (``.dcp``: every rank's shards, torch.distributed.checkpoint).
CHECKPOINT_RE = re.compile(r"^ckpt-g(\d{12})-s(\d{10})\.(?:pt|dcp)$")
CLAIM_RE = re.compile(r"^gen-(\d{12})\.claim$")


def checkpoint_name(generation: int, step: int, sharded: bool = False) -> str:
    return f"ckpt-g{generation:012d}-s{step:010d}.{'dcp' if sharded else 'pt'}"


def claim_name(generation: int) -> str:
    return f"gen-{generation:012d}.claim"

"""Where a job's run is tracked, as the ``tracking`` event says it: a link to the MLflow or W&B
run, or the command that shows it (``mlflow ui``, ``wandb sync``, ``tensorboard``).

Whoever opens a run (the local supervisor; rank 0 in a pod) tells it once, in the job's event
stream, so every view (dashboard, jobs panel, ``job.summary()``, a re-attached kernel) reads it
from the history. A tracking URI may carry what grants access (``user:password@host``, a
``?token=`` query): it is stripped here, before anything is shown or written. Worker-side
module: imports only the standard library.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..contract.event_types import Tracking

#: Query parameters that may grant access (a token, a key, a signature): never shown.
_SECRET_PARAM = re.compile(r"token|key|secret|pass|pwd|auth|credential|sig|session|cookie", re.I)


MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch


def next_batch(q: queue.SimpleQueue[Any] | queue.Queue[Any]) -> list[Any]:
    """What a tracker's thread logs at once: the next item (waited for) and those behind it,
    up to ``MAX_BATCH``."""
    batch = [q.get()]
    while len(batch) < MAX_BATCH:
        try:
            batch.append(q.get_nowait())
        except queue.Empty:
            break
    return batch


def public_uri(uri: str) -> str:
    """``uri`` with nothing that grants access: no ``user:password@`` (nor a bare user, which
    may be a token), no query parameter named like a credential, no fragment that names one
    (a page's route, ``#/experiments/1/runs/ab``, stays)."""
    try:
        parts = urlsplit(uri)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return ""
    netloc = parts.netloc.rpartition("@")[2]
    kept = [(k, v) for k, v in pairs if not _SECRET_PARAM.search(k)]
    query = parts.query if len(kept) == len(pairs) else urlencode(kept)
    fragment = "" if _SECRET_PARAM.search(parts.fragment) else parts.fragment
    if netloc == parts.netloc and query == parts.query and fragment == parts.fragment:
        return uri
    slashes = "//" if parts.netloc or uri.startswith(f"{parts.scheme}://") else ""
    rest = (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")
    return (f"{parts.scheme}:" if parts.scheme else "") + slashes + netloc + parts.path + rest


_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def scrub(text: str) -> str:
    """``text`` (an error message, a log line) with every URL in it made ``public_uri``."""
    return _URL.sub(lambda m: public_uri(m.group(0)), text)


def _local_path(uri: str) -> str | None:
    """The folder or file of a store on this machine's disk (``file:``, a plain path, ``sqlite:``)."""
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return os.path.abspath(parts.path or uri)
    if parts.scheme == "sqlite" and uri.startswith("sqlite:///"):
        return os.path.abspath(uri[len("sqlite:///") :])
    return None


def mlflow_link(tracking_uri: str, experiment_id: str, run_id: str) -> Tracking:
    """The ``tracking`` event of an MLflow run: the run's page on a tracking server, or, for a
    store on disk (no server to link to), its path and the ``mlflow ui`` command that serves it."""
    uri = public_uri(tracking_uri)
    parts = urlsplit(uri)
    if parts.scheme == "" and uri:  # a plain path, as MLflow reads it: a file store
        uri = "file://" + os.path.abspath(uri)
    elif parts.scheme == "sqlite" and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + os.path.abspath(uri[len("sqlite:///") :])  # the command works from any folder
    parts = urlsplit(uri)
    info = Tracking(tracker="mlflow", run_id=run_id, experiment_id=experiment_id, uri=uri)
    if parts.scheme in ("http", "https"):
        base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        info["url"] = f"{base}/#/experiments/{experiment_id}/runs/{run_id}"
        return info
    path = _local_path(uri)
    if path is not None:
        info["path"] = path
    if not parts.scheme.startswith("databricks"):
        info["command"] = f"mlflow ui --backend-store-uri {shlex.quote(uri)}"
    return info


def wandb_link(run: Any) -> Tracking:
    """The ``tracking`` event of a W&B run: its page when online; offline, its folder and the
    ``wandb sync`` command that uploads it."""
    info = Tracking(tracker="wandb", run_id=str(run.id), project=str(run.project or ""))
    if getattr(run, "offline", False) or not run.url:
        path = str(run.settings.sync_dir)
        info["offline"], info["path"], info["command"] = True, path, f"wandb sync {shlex.quote(path)}"
    else:
        info["url"] = public_uri(str(run.url))
    return info


def tensorboard_command() -> str:
    """How to run TensorBoard from any terminal: the full path of the ``tensorboard`` installed
    beside this Python (the hint said ``tensorboard``, which a shell whose PATH lacks the
    quickstart's ``.venv`` did not have; whose PATH counts is the user's, not ours), else
    ``tensorboard``."""
    import os
    import sys

    beside = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    return shell_path(beside) if os.access(beside, os.X_OK) else "tensorboard"


def shell_path(path: str) -> str:
    """A path as a person types it in a shell: under their home, ``~/...`` (a job folder read
    ``/tmp/pytest-of-root/.../jobs/quickstart`` in the README's picture, and reads
    ``~/.notebook-elastic/jobs/quickstart`` for a person); quoted where it needs to be."""
    import os

    home = os.path.expanduser("~").rstrip("/")
    if home and path.startswith(home + "/"):
        return "~/" + shlex.quote(path[len(home) + 1 :])
    return shlex.quote(path)


def tensorboard_link(logdir: str) -> Tracking:
    """The ``tracking`` event of a job's TensorBoard files."""
    return Tracking(
        tracker="tensorboard",
        path=logdir,
        command=f"{tensorboard_command()} --logdir {shell_path(logdir)}",
    )


TRACKER_NAMES = {"mlflow": "MLflow", "wandb": "W&B", "tensorboard": "TensorBoard"}


def shown(d: Mapping[str, Any]) -> dict[str, Any]:
    """What a view shows of a ``tracking`` event (which a pod's rank 0 may have written):
    ``{"tracker", "label", "url" (http(s) only) or None, "command" or None, "path" or None}``,
    stripped of credentials once more."""
    tracker = str(d.get("tracker") or "")
    label = TRACKER_NAMES.get(tracker, tracker) + (f" run {d.get('run_id')}" if d.get("run_id") else "")
    if d.get("offline"):
        label += " (offline)"
    url = public_uri(str(d.get("url") or ""))
    command = str(d["command"]) if d.get("command") else None
    if tracker == "mlflow" and d.get("uri") and command:  # the store's URI is the command's
        command = f"mlflow ui --backend-store-uri {shlex.quote(public_uri(str(d.get('uri'))))}"
    return {
        "tracker": tracker,
        "label": label,
        "url": url if url.startswith(("http://", "https://")) else None,
        "command": None if command is None else scrub(command),
        "path": str(d["path"]) if d.get("path") else None,
    }


def tracking_text(d: Mapping[str, Any]) -> str:
    """One line: "MLflow run 3f2a...: http://...", "W&B run x1 (offline) in DIR: wandb sync DIR"."""
    name = TRACKER_NAMES.get(str(d.get("tracker")), str(d.get("tracker")))
    what = f"{name} run {d.get('run_id')}" if d.get("run_id") else name
    if d.get("offline"):
        what += " (offline)"
    if d.get("url"):
        return f"{what}: {d.get('url')}"
    where = f" in {d.get('path')}" if d.get("path") and d.get("tracker") != "tensorboard" else ""
    return f"{what}{where}: {d.get('command')}" if d.get("command") else what + where

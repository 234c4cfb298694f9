"""Route handlers of the server extension (cheap enough to poll every 2 s).

No route waits on a cluster, a subprocess or a file that may never answer on the server's
event loop. Local jobs come from their folders (spec, status, supervisor liveness: a few small
files each), read in a worker thread with a deadline (``LIST_S``); a Slurm supervisor on
another machine is alive by what Slurm last said of its allocation, kept by a thread
(``SlurmStates``), never asked inline (#37: with slurmctld unresponsive a poll took 120 s, and
held every other request). Kubernetes jobs come from a cache a background thread refreshes;
its error is reported beside the list. A stop runs in a worker thread, within ``STOP_S``.
Job names are checked against the DNS-1123 pattern in the route itself and never reach a
shell; stopping only touches this server user's job folders and kubeconfig.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import tornado
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from ..backends import backend_of
from ..backends.base import JobInfo, attention_order
from ..backends.local import LocalBackend
from ..backends.slurm import cluster as slurm_cluster
from ..contract.event_types import Kind, Status
from ..contract.events import Event, steps_done
from ..contract.job_state import JobState, with_fold
from ..contract.spec import validate_name
from ..errors import JobNotFound, NotebookElasticError, SpecError
from ..jobfolder.folder import open_file
from ..plumbing import log as _logging
from ..runtime.tracking import shown
from .rows import ErrorReply, EventLine, EventsReply, JobRow, JobsReply, StopReply, a_type, mismatch

_log = _logging.get("server.routes")

NAME = r"(?P<name>[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)"
K8S_REFRESH_S = 5.0
#: How often Slurm is asked again about a remote supervisor's allocation.
SLURM_REFRESH_S = 5.0
#: How long GET /jobs waits for the local listing before it answers with the last one.
LIST_S = 10.0
#: How long POST .../stop waits for the stop before it answers that the job is still stopping.
STOP_S = 120.0
QUIET = {Kind.METRIC, Kind.LOG, Kind.CHECKPOINT}
MAX_EVENTS = 5000
BACKENDS = ("local", "kubernetes", "slurm")


def bad_request(message: str) -> tornado.web.HTTPError:
    """A 400 whose sentence reaches the client as is (passed as an argument: a '%' in it is text)."""
    return tornado.web.HTTPError(400, "%s", message)


def whole_number(handler: APIHandler, name: str, default: int, *, maximum: int | None = None) -> int:
    """A query argument that must be a whole number >= 0; anything else is a 400 naming it."""
    raw = handler.get_argument(name, None)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 15:
        raise bad_request(f"{name}={raw!r} must be a whole number from 0 to 10^15, like {name}={default}")
    value = int(raw)
    return value if maximum is None else min(value, maximum)


def flag(handler: APIHandler, name: str) -> bool:
    raw = handler.get_argument(name, "0").lower()
    if raw not in ("0", "1", "true", "false", ""):
        raise bad_request(f"{name}={raw!r} must be 1, 0, true or false")
    return raw in ("1", "true")


def job_name(name: str) -> str:
    try:
        return validate_name(name)
    except SpecError as exc:
        raise bad_request(str(exc)) from None


def backend_argument(value: Any) -> str:
    if value not in BACKENDS:
        raise bad_request(f"backend={value!r} is unknown; use one of: {', '.join(BACKENDS)}")
    backend: str = value  # one of BACKENDS
    return backend


def _finite(value: Any) -> Any:
    """JSON for browsers: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class DamagedRow(ValueError):
    """A job's summary holds a field the row cannot show (a planted or corrupted status.json):
    the sentence says which; ``row_of`` lists the job as damaged instead."""


#: The summary's key each derived row field is read from (for the sentence naming it).
_SOURCE = {"gpu_mem_peak_bytes": "gpu", "gpu_util_percent": "gpu"}


def _read(s: Mapping[str, Any], key: str, read: Callable[[Any], Any]) -> Any:
    """``read(s[key])``, or a ``DamagedRow`` naming the key when its value is not what a job's
    summary holds there (a string for a stall, a list of strings for the GPUs...)."""
    value = s.get(key)
    try:
        return read(value)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise DamagedRow(f"{key!r} is {a_type(value)} ({shown}), which a job's status never holds") from None


def job_json(info: JobInfo, root_dir: str | None = None) -> JobRow:
    """The panel's row of a job (``rows.JobRow``); ``DamagedRow`` when its summary holds a
    field of the wrong type (each derived field read by ``_read``, the whole row then checked
    against ``JobRow``, whatever field it is)."""
    s = info.summary
    notebook = info.notebook if isinstance(info.notebook, str) else None
    if notebook and root_dir and os.path.isabs(notebook):
        try:
            relative = os.path.relpath(notebook, root_dir)
            notebook = None if relative.startswith("..") else relative
        except ValueError:
            notebook = None
    row: JobRow = {
        "name": info.name,
        "backend": info.backend,
        "status": info.status,
        "damaged": info.damaged,
        "reason": s.get("reason"),
        "waiting": s.get("waiting"),
        "stall": _read(s, "stall", lambda v: Event(Kind.STALL, 0, None, v).describe() if v else None),
        "warning": s.get("warning"),
        "world_size": s.get("world_size"),
        "nodes_running": s.get("nodes_running"),
        "target": s.get("target"),
        "min_nodes": s.get("min_nodes"),
        "max_nodes": s.get("max_nodes"),
        "restarts": s.get("restarts"),
        "max_restarts": s.get("max_restarts"),
        "step": _read(s, "step", steps_done),  # steps done, as every view counts them
        "total_steps": s.get("total_steps"),
        "loss": s.get("loss"),
        "loss_tail": s.get("loss_tail") or [],
        # What GPU users read beside the loss; absent figures (a CPU job's GPU) are null.
        "step_time_s": s.get("step_time_s"),
        "samples_per_s": s.get("samples_per_s"),
        "tokens_per_s": s.get("tokens_per_s"),
        "gpu_mem_peak_bytes": _read(
            s, "gpu", lambda v: max((g.get("mem_peak_bytes") or 0 for g in v or []), default=None)
        ),
        "gpu_util_percent": _read(
            s, "gpu", lambda v: _mean([g["util_percent"] for g in v or [] if "util_percent" in g])
        ),
        # Where the run is tracked (MLflow/W&B link or command, TensorBoard), as the events told it.
        "tracking": _read(s, "tracking", lambda v: [shown(t) for t in v or []]),
        "transitions": s.get("transitions") or [],
        "started_at": s.get("started_at") or info.created,
        "finished_at": s.get("finished_at"),
        "ran_s": s.get("ran_s"),
        "notebook": notebook,
        "location": info.location if isinstance(info.location, str) else None,
    }
    row = _finite(row)  # (a float that is not finite: null)
    problem = mismatch(row)
    if problem is not None:
        raise DamagedRow(problem + next((f" (read from {_SOURCE[k]!r})" for k in _SOURCE if f"'{k}'" in problem), ""))
    return row


def row_of(info: JobInfo, root_dir: str | None = None) -> JobRow:
    """``job_json``, or the job as a damaged row saying which field of its status is wrong: one
    job's bad file never keeps the others from the list."""
    try:
        return job_json(info, root_dir)
    except DamagedRow as exc:
        where = f" in its records ({info.location})" if isinstance(info.location, str) else ""
        damaged = dataclasses.replace(
            info,
            backend=str(info.backend),  # a spec.json's, which may be damaged too
            status="damaged",
            summary={},
            damaged=f"{exc}{where}; the row cannot show it until that is fixed",
        )
        return job_json(damaged, root_dir)


class ClusterFold:
    """A Kubernetes job's events, followed and folded in a thread while the job is listed: a
    cluster keeps pods, not a history, so this is where its row's restarts, step and loss
    come from (a local job's supervisor keeps that fold itself, in status.json)."""

    def __init__(self, backend: Any, info: JobInfo) -> None:
        s = info.summary
        self.state = JobState(
            max_restarts=s.get("max_restarts") or 0, nnodes=(s.get("min_nodes") or 1, s.get("max_nodes") or 1)
        )
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(backend, info.name), name=f"notebook-elastic-fold-{info.name}", daemon=True
        )
        self.thread.start()

    def _run(self, backend: Any, name: str) -> None:
        try:
            for event in backend.follow(name, self.stop):
                with self.lock:
                    self.state.apply(event)
        except Exception:
            _log.debug("the row keeps what the cluster says; the list reports cluster errors", exc_info=True)

    def row(self, info: JobInfo) -> JobInfo:
        with self.lock:
            status, summary = with_fold(info.status, info.summary, self.state)
        return dataclasses.replace(info, status=status, summary=summary)


class SlurmStates:
    """What Slurm last said of each remote supervisor's allocation, asked by one thread of its
    own: ``state`` answers at once ("" until Slurm has answered: "does not answer", which
    reads as alive, as a slow Slurm always did) and asks again when the answer is older than
    ``SLURM_REFRESH_S``."""

    def __init__(self, ask: Callable[[str], str]) -> None:
        self._ask = ask
        self._known: dict[str, tuple[str, float]] = {}
        self._wanted: set[str] = set()
        self._lock = threading.Lock()
        self._asking = False

    def state(self, job_id: str) -> str:
        with self._lock:
            known = self._known.get(job_id)
            if known is None or time.monotonic() - known[1] > SLURM_REFRESH_S:
                self._wanted.add(job_id)
                if not self._asking:
                    self._asking = True
                    threading.Thread(target=self._run, name="notebook-elastic-slurm-states", daemon=True).start()
        return known[0] if known is not None else ""

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._wanted:
                    self._asking = False
                    return
                job_id = self._wanted.pop()
            try:
                state = self._ask(job_id)  # bounded by the Slurm client's own timeout
            except Exception:
                _log.debug("Slurm did not say; the row keeps what it said last", exc_info=True)
                state = ""
            with self._lock:
                self._known[job_id] = (state, time.monotonic())


class Registry:
    """Where jobs are found: the local job folders, and (cached) the current kubeconfig context."""

    def __init__(self) -> None:
        self.slurm = SlurmStates(lambda job_id: slurm_cluster.job_state(job_id)[0])
        self.local = LocalBackend(slurm_state=self.slurm.state)
        self._listing: asyncio.Future[list[JobInfo]] | None = None  # the local listing under way
        self._listed: tuple[list[JobInfo], float] = ([], 0.0)  # the last one, and when
        self.k8s_folds: dict[str, ClusterFold] = {}
        self.k8s_jobs: list[JobInfo] = []
        self.k8s_error: str | None = None
        self.k8s_checked = 0.0
        self._k8s_backend: Any = None
        self._lock = threading.Lock()
        self._refreshing = False

    def kubernetes_configured(self) -> bool:
        path = os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0])
        return os.path.exists(path) or bool(os.environ.get("KUBERNETES_SERVICE_HOST"))

    def refresh_kubernetes(self) -> None:
        if not self.kubernetes_configured():
            return
        with self._lock:
            if self._refreshing or time.monotonic() - self.k8s_checked < K8S_REFRESH_S:
                return
            self._refreshing = True
        threading.Thread(target=self._refresh, daemon=True).start()

    def _refresh(self) -> None:
        try:
            if self._k8s_backend is None:
                from ..backends.kubernetes import KubernetesBackend

                self._k8s_backend = KubernetesBackend()
            jobs = self._k8s_backend.list()
            with self._lock:
                self.k8s_jobs, self.k8s_error = jobs, None
                self._fold(jobs)
        except Exception as exc:  # reported to the panel, never raised into a request
            with self._lock:
                self.k8s_jobs, self.k8s_error = [], str(exc)
        finally:
            with self._lock:
                self.k8s_checked = time.monotonic()
                self._refreshing = False

    def _fold(self, jobs: list[JobInfo]) -> None:
        """Follow each listed job that can still change (one fold each); forget jobs gone."""
        listed = {info.name: info for info in jobs}
        for name in list(self.k8s_folds):
            if name not in listed:
                self.k8s_folds.pop(name).stop.set()
        for name, info in listed.items():
            if name not in self.k8s_folds and info.status in (Status.PENDING, Status.RUNNING, Status.RESTARTING):
                self.k8s_folds[name] = ClusterFold(self._k8s_backend, info)

    def close(self) -> None:
        with self._lock:
            for fold in self.k8s_folds.values():
                fold.stop.set()
            self.k8s_folds.clear()

    def jobs(self) -> tuple[list[JobInfo], dict[str, str]]:
        """Every job, the local ones read now (a tool's or a test's call; the route awaits
        ``listing``, which never waits on the folders past ``LIST_S``)."""
        return self._with_cluster(self.local.list(), {})

    async def listing(self) -> tuple[list[JobInfo], dict[str, str]]:
        errors: dict[str, str] = {}
        local = await self._local_jobs(errors)
        return self._with_cluster(local, errors)

    def _with_cluster(self, local: list[JobInfo], errors: dict[str, str]) -> tuple[list[JobInfo], dict[str, str]]:
        self.refresh_kubernetes()
        with self._lock:
            k8s = [self.k8s_folds[i.name].row(i) if i.name in self.k8s_folds else i for i in self.k8s_jobs]
            if self.k8s_error:
                errors["kubernetes"] = self.k8s_error
        return attention_order([*local, *k8s]), errors

    async def _local_jobs(self, errors: dict[str, str]) -> list[JobInfo]:
        """The local listing, read in a worker thread (one at a time); past ``LIST_S`` the last
        one, said beside the list. A listing that finishes late is the next poll's."""
        if self._listing is None or self._listing.done():
            self._listing = self._start_listing(asyncio.get_running_loop())
        try:
            return await asyncio.wait_for(asyncio.shield(self._listing), LIST_S)
        except asyncio.TimeoutError:
            jobs, at = self._listed
            errors["local"] = f"reading the job folders in {self.local.root} took over {LIST_S:g} s" + (
                f"; these rows are from {time.strftime('%H:%M:%S', time.localtime(at))}" if at else ""
            )
            return jobs

    def _start_listing(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[list[JobInfo]]:
        """The local listing in a daemon thread of its own: never queued behind stops that wait
        on a cluster (the shared executor), never waited for at the server's exit."""
        listing: asyncio.Future[list[JobInfo]] = loop.create_future()

        def settle(jobs: list[JobInfo] | None, error: BaseException | None) -> None:
            if listing.done():
                return
            if error is not None:
                listing.set_exception(error)
            else:
                listing.set_result(jobs or [])

        def run() -> None:
            try:
                jobs, error = self._list_local(), None
            except Exception as exc:
                jobs, error = None, exc
            try:
                loop.call_soon_threadsafe(settle, jobs, error)
            except RuntimeError:
                pass  # the server's loop closed meanwhile

        threading.Thread(target=run, name="notebook-elastic-jobs", daemon=True).start()
        return listing

    def _list_local(self) -> list[JobInfo]:
        jobs = self.local.list()
        self._listed = (jobs, time.time())
        return jobs

    def backend(self, name: str, backend: str) -> Any:
        """The backend that runs job ``name``: a local or Slurm job's folder says which
        (``backends.backend_of``, the one way a name is resolved)."""
        if backend == "kubernetes":
            if self._k8s_backend is None:
                from ..backends.kubernetes import KubernetesBackend

                self._k8s_backend = KubernetesBackend()
            return self._k8s_backend
        return backend_of(name, backend, root=self.local.root, slurm_state=self.slurm.state)


class Handler(APIHandler):
    """Errors as JSON ``{"message": sentence}``, the sentence formatted as tornado logs it."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None))[1]
        if isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            self.set_header("Content-Type", "application/json")
            error: ErrorReply = {"message": exc.log_message % exc.args, "reason": exc.reason}
            self.finish(json.dumps(error))
            return
        super().write_error(status_code, **kwargs)


class JobsHandler(Handler):
    @tornado.web.authenticated
    async def get(self) -> None:
        started = time.perf_counter()
        registry: Registry = self.settings["notebook_elastic_registry"]
        infos, errors = await registry.listing()
        root = self.settings.get("server_root_dir")
        reply: JobsReply = {
            "jobs": [row_of(i, root) for i in infos],
            "errors": errors,
            "server_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        self.finish(json.dumps(reply))


class EventsHandler(Handler):
    @tornado.web.authenticated
    def get(self, name: str, _tail: str | None = None) -> None:
        registry: Registry = self.settings["notebook_elastic_registry"]
        name = job_name(name)
        backend = backend_argument(self.get_argument("backend", "local"))
        since = whole_number(self, "since", 0)
        limit = whole_number(self, "limit", 500, maximum=MAX_EVENTS)
        include_all = flag(self, "all")
        if backend == "kubernetes":
            raise bad_request("events are served for local jobs; follow a Kubernetes job with %elastic_attach")
        folder = registry.local.folder(name)
        if not folder.exists():
            raise tornado.web.HTTPError(404, "%s", f"no local job named {name!r}")
        events: list[EventLine] = []
        offset, skipped = since, 0
        try:
            f = open_file(folder.events_file)  # noqa: SIM115 (closed below)
        except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError):
            # A damaged folder (deleted by hand, a folder or a FIFO in the file's place): a
            # sentence, not a 500, nor a route that never answers.
            raise tornado.web.HTTPError(
                404, "%s", f"job {name!r} has no readable event history: {folder.events_file} is missing or not a file"
            ) from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if since > size:  # a cursor from a longer log (another run of this name): start over
                since = offset = 0
            f.seek(since)
            for line in f if limit else ():
                if not line.endswith(b"\n"):
                    break  # a line being written: next time
                offset += len(line)
                try:
                    event = Event.from_line(line.decode("utf-8", "replace"))
                except ValueError:
                    skipped += 1  # a damaged line: the readable ones are served, and how many were not
                    continue
                if include_all or event.kind not in QUIET:
                    events.append(EventLine(_finite(event.to_json())))
                    if len(events) >= limit:
                        break
        reply: EventsReply = {"events": events, "next": offset}
        if skipped:
            reply["note"] = f"{skipped} line(s) of {folder.events_file.name} are not events and were skipped"
        self.finish(json.dumps(reply))


class StopHandler(Handler):
    @tornado.web.authenticated
    async def post(self, name: str, _tail: str | None = None) -> None:
        registry: Registry = self.settings["notebook_elastic_registry"]
        name = job_name(name)
        body = self.get_json_body() or {}
        if not isinstance(body, dict):
            raise bad_request('the body must be a JSON object, like {"backend": "local"}')
        backend_name = backend_argument(body.get("backend") or self.get_argument("backend", "local"))

        def stop() -> JobInfo | None:  # in a worker thread: making a cluster client may run a credential plugin
            backend = registry.backend(name, backend_name)
            backend.cancel(name)  # waits for the processes to go (each wait has its own deadline)
            info: JobInfo | None = backend.describe(name)
            return info

        try:
            info = await asyncio.wait_for(
                asyncio.shield(asyncio.get_running_loop().run_in_executor(None, stop)), STOP_S
            )
        except asyncio.TimeoutError:
            raise tornado.web.HTTPError(
                504, "%s", f"job {name!r} is still stopping after {STOP_S:g} s; the jobs list shows when it has"
            ) from None
        except JobNotFound as exc:
            raise tornado.web.HTTPError(404, "%s", str(exc)) from None
        except NotebookElasticError as exc:
            raise tornado.web.HTTPError(409, "%s", str(exc)) from None
        reply: StopReply = {"name": name, "status": info.status if info else "gone"}
        self.finish(json.dumps(reply))


def setup_handlers(server_app: Any) -> None:
    web_app = server_app.web_app
    web_app.settings["notebook_elastic_registry"] = Registry()
    web_app.settings.setdefault("server_root_dir", getattr(server_app, "root_dir", None))
    base = url_path_join(web_app.settings["base_url"], "notebook-elastic", "api")
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "jobs"), JobsHandler),
            (url_path_join(base, "jobs", NAME, "events"), EventsHandler),
            (url_path_join(base, "jobs", NAME, "stop"), StopHandler),
        ],
    )
